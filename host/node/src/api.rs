//! The HTTP API: routes, the bearer-token guard, and thin handlers that parse a request
//! (bounded in size and time, every field checked), call the node's state and the library,
//! and answer JSON. Every failure is an [`ApiError`], so it has a status and names the
//! field at fault.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::auth::{self, Caller};
use super::body::{Media, field_path, parse_json, read_body};
use super::error::ApiError;
use super::modules::TooLarge;
use super::params::{hex_param, is_approval_id, normalise_hex, parse_wait};
use super::tasks::{Refused, Scope};
use super::{NodeState, admin, authorize, guard, streams, web};
use crate::config::Role;
use crate::defaults;
use quiver::Metrics;
use quiver::TaskError;
use quiver::TaskSpec;
use quiver::{ApprovalDecision, ApprovalQueue};

pub(crate) fn router(state: Arc<NodeState>) -> Router {
    let require =
        |role: Option<Role>| middleware::from_fn_with_state((state.clone(), role), auth::require);
    let submit = Router::new()
        .route("/v1/modules/{sha256}", put(put_module))
        .route("/v1/tasks", axum::routing::post(submit_task))
        .route("/v1/tasks/{id}", get(get_task).delete(cancel_task))
        .route("/v1/tasks/{id}/streams", get(streams::attach))
        .route_layer(require(Some(Role::Submit)));
    let approve = Router::new()
        .route("/v1/approvals", get(list_approvals))
        .route("/v1/approvals/{id}", axum::routing::post(decide_approval))
        .route_layer(require(Some(Role::Approve)));
    let observe = Router::new()
        .route("/v1/mcp/servers", get(mcp_servers))
        .route("/v1/registry", get(registry_health))
        .route("/metrics", get(metrics))
        .route_layer(require(Some(Role::Observe)));
    let authorize = Router::new()
        .route(
            "/v1/authorizations/{server_id}/{principal}",
            get(authorize::status)
                .post(authorize::start)
                .delete(authorize::revoke),
        )
        .route_layer(require(Some(Role::Authorize)));
    let any_client = Router::new()
        .route("/v1/whoami", get(whoami))
        .route_layer(require(None));
    let admin = Router::new()
        .route(
            "/admin/api/mcp/servers",
            get(admin::list_servers).post(admin::create_server),
        )
        .route(
            "/admin/api/mcp/servers/import",
            axum::routing::post(admin::import),
        )
        .route(
            "/admin/api/mcp/servers/{id}",
            get(admin::get_server)
                .put(admin::replace_server)
                .delete(admin::delete_server),
        )
        .route(
            "/admin/api/mcp/servers/{id}/test",
            axum::routing::post(admin::test),
        )
        .route("/admin/api/mcp/servers/{id}/tools", get(admin::tools))
        .route(
            "/admin/api/mcp/servers/{id}/pin",
            axum::routing::post(admin::pin),
        )
        .route(
            "/admin/api/mcp/profiles",
            get(admin::list_profiles).post(admin::create_profile),
        )
        .route(
            "/admin/api/mcp/profiles/{id}",
            get(admin::get_profile)
                .put(admin::replace_profile)
                .delete(admin::delete_profile),
        )
        .route_layer(require(Some(Role::Registry)));
    // The page holds no data, so it is outside the role layers; it calls the APIs.
    let page = Router::new()
        .route("/admin", get(web::redirect))
        .route("/admin/", get(web::index))
        .route("/admin/assets/{file}", get(web::asset));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(page)
        .merge(admin)
        .route("/readyz", get(readyz))
        .merge(submit)
        .merge(approve)
        .merge(observe)
        .merge(authorize)
        // A browser sent back by an authorization server: no token, its `state` instead.
        .route(authorize::CALLBACK_PATH, get(authorize::callback))
        // The person's browser: a handle in the path instead of a token.
        .route(
            &format!("{}/{{handle}}", authorize::START_PATH),
            get(authorize::consent).post(authorize::proceed),
        )
        .merge(any_client)
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint").with_field("path")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
            .with_field("method")
        })
        // Outermost: a request a web page forged is refused before anything else.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::browsers,
        ))
        .with_state(state)
}

/// `GET /v1/whoami`: the caller's client name and roles (what the admin page shows).
async fn whoami(Extension(caller): Extension<Caller>) -> Response {
    axum::Json(caller).into_response()
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

#[derive(Serialize)]
struct Readiness {
    ready: bool,
    /// Why not, when not ready.
    reasons: Vec<&'static str>,
    registry_revision: String,
    /// A degraded registry keeps the node ready: the last good snapshot still serves.
    registry: quiver::RegistryHealth,
    tasks_active: usize,
    host: quiver::TaskStatus,
    modules: super::ModulesStatus,
    uploads: super::modules::UploadsStatus,
}

/// `GET /readyz`: ready or not (`200` or `503`) for anyone, as orchestrators probe it
/// without a token; the detail (why not, the registry's revision and health with its
/// store's address and errors, counts) only for a client that may also read
/// `/v1/registry`.
async fn readyz(State(state): State<Arc<NodeState>>, request: Request) -> Response {
    let host = state.host.status().tasks;
    let mut reasons = Vec::new();
    if state.is_draining() {
        reasons.push("draining");
    }
    if !state.tasks.has_room() {
        reasons.push("task table full");
    }
    if host_full(&host) {
        reasons.push("every running slot and queue place is taken");
    }
    let body = Readiness {
        ready: reasons.is_empty(),
        reasons,
        registry_revision: state.host.registry().revision().to_owned(),
        registry: state.host.registry_health(),
        tasks_active: state.tasks.active(),
        host,
        modules: state.modules_status(),
        uploads: state.uploads.status(),
    };
    let status = if body.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if !sees_detail(&state, &request) {
        return (status, axum::Json(json!({"ready": body.ready}))).into_response();
    }
    (status, axum::Json(body)).into_response()
}

/// The caller may read `/v1/registry` (the `observe` role) or edit the registry (the
/// `registry` role); on a node where nobody needs a token for `observe`, anyone who passes
/// the browser guard may.
fn sees_detail(state: &NodeState, request: &Request) -> bool {
    auth::authenticate(&state.config, request).is_ok_and(|caller| {
        caller
            .roles
            .iter()
            .any(|role| matches!(role, Role::Observe | Role::Registry))
    })
}

fn host_full(status: &quiver::TaskStatus) -> bool {
    status.running.saturating_add(status.queued)
        >= status.capacity.saturating_add(status.queue_capacity)
}

fn refuse_if_draining(state: &NodeState) -> Result<(), ApiError> {
    if state.is_draining() {
        return Err(draining());
    }
    Ok(())
}

fn draining() -> ApiError {
    ApiError::busy(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining",
        "the node is shutting down and takes no new work; send it to another node",
    )
}

/// `PUT /v1/modules/{sha256}`: stores a module (wasm or WAT bytes) under the SHA-256 of
/// its bytes, compiled.
async fn put_module(
    State(state): State<Arc<NodeState>>,
    sha256: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    refuse_if_draining(&state)?;
    let sha256 = hex_param(sha256, "sha256", 64)?;
    if state.modules.contains(&sha256) {
        return Ok((StatusCode::OK, axum::Json(json!({"module": sha256}))).into_response());
    }
    let Some(upload) = state.uploads.try_start() else {
        return Err(ApiError::busy(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_uploads",
            "other module uploads are being compiled; retry shortly",
        ));
    };
    let bytes = read_body(
        &headers,
        body,
        Media::Module,
        state.config.max_module_bytes,
        state.config.body_timeout,
    )
    .await?;
    let actual: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != sha256 {
        return Err(ApiError::bad(
            "sha256",
            format!("the body's SHA-256 is {actual}, not the {sha256} in the path"),
        )
        .with_code("hash_mismatch"));
    }
    let name = format!("{sha256}.wasm");
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    // Stored even if the client has gone by then: its compile was paid for.
    let compiling = state.clone();
    let key = sha256.clone();
    let stored = upload
        .compile(move || -> Result<_, quiver::HostError> {
            let compiled = compiling.host.load_module_uncached(&name, &bytes)?;
            Ok(compiling.modules.insert(&key, compiled, size))
        })
        .await
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "compiling the module failed unexpectedly",
            )
        })?
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_module",
                e.to_string(),
            )
            .with_field("body")
        })?;
    let status = match stored {
        Ok(true) => {
            tracing::info!(module = %sha256, bytes = size, "module stored");
            StatusCode::CREATED
        }
        Ok(false) => StatusCode::OK,
        Err(TooLarge(counted)) => {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "module_too_large",
                format!("compiled, this module takes {counted} bytes, more than the node's module store holds ([serve] max_module_store_bytes)"),
            )
            .with_field("body"));
        }
    };
    Ok((status, axum::Json(json!({"module": sha256}))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    module: String,
    task: Value,
    /// The end user the task acts for, where the client's `act_for` allows it.
    #[serde(default)]
    principal: Option<String>,
}

/// `POST /v1/tasks`: `{"module": "<sha256>", "task": {…task.json…}, "principal": "…"}`,
/// queued at once. The task acts for `principal` (an end user the client's `act_for`
/// matches) or, without it, for the client; either way its events name the client too.
async fn submit_task(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    refuse_if_draining(&state)?;
    let bytes = read_body(
        &headers,
        body,
        Media::Json,
        state.config.max_request_bytes,
        state.config.body_timeout,
    )
    .await?;
    let request: SubmitRequest = parse_json(&bytes, "")?;
    let sha256 = normalise_hex(&request.module, 64)
        .ok_or_else(|| ApiError::bad("module", "expected the module's SHA-256, 64 hex digits"))?;
    let principal = caller.principal_for(request.principal.as_deref(), &state.config.clients)?;
    let mut task = parse_task(request.task)?;
    task.principal = principal;
    task.client = caller.client.as_deref().map(str::to_owned);
    task.subject_token = subject_token(&headers)?;
    task.trace_parent = trace_parent(&headers);
    let module = state.modules.get(&sha256).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_module",
            "no module with this SHA-256 is stored; upload it with PUT /v1/modules/{sha256} first",
        )
        .with_field("module")
    })?;
    if host_full(&state.host.status().tasks) {
        return Err(ApiError::busy(
            StatusCode::TOO_MANY_REQUESTS,
            "host_busy",
            "every running slot and queue place of the host is taken; retry later",
        ));
    }
    let task_id = task.task_id.clone();
    let principal = task.principal.clone();
    let id = state
        .tasks
        .submit(&state.host, &sha256, module, task, caller.client.clone())
        .map_err(|refused| match refused {
            Refused::Full { max } => ApiError::busy(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_tasks",
                format!(
                    "the node holds {max} tasks still queued or running ([serve] max_tasks); retry later"
                ),
            ),
            // The drain began while the body was read.
            Refused::Closed => draining(),
        })?;
    tracing::info!(id, task_id, module = %sha256, client = caller.name(), principal = principal.as_deref(), "task accepted");
    let mut response = (
        StatusCode::ACCEPTED,
        axum::Json(json!({"id": id, "status": "queued"})),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/tasks/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// The header carrying a task's subject token for token exchange (`oauth_token_exchange`
/// credentials): the platform's token for the user or workload the task acts for. Never
/// logged, echoed or stored with the task's record.
pub(crate) const SUBJECT_TOKEN_HEADER: &str = "quiver-subject-token";

/// The subject token of a submission, if its header is there; a bad one is refused naming
/// the header and the rule, never the value.
fn subject_token(headers: &HeaderMap) -> Result<Option<quiver::SubjectToken>, ApiError> {
    let mut values = headers.get_all(SUBJECT_TOKEN_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let field = "Quiver-Subject-Token";
    if values.next().is_some() {
        return Err(ApiError::bad(field, "send the subject token header once"));
    }
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad(field, quiver::SubjectTokenError::BadCharacter.to_string()))?;
    quiver::SubjectToken::new(text)
        .map(Some)
        .map_err(|e| ApiError::bad(field, e.to_string()))
}

/// The caller's W3C trace context (`traceparent`, `tracestate`), which the task's trace
/// continues. One that is malformed, repeated or not text is ignored (W3C: the trace
/// starts anew), never refused: it only links traces and grants nothing.
fn trace_parent(headers: &HeaderMap) -> Option<quiver::TraceContext> {
    let mut parents = headers.get_all("traceparent").iter();
    let parent = parents.next()?.to_str().ok()?;
    if parents.next().is_some() {
        return None;
    }
    let mut states = headers.get_all("tracestate").iter();
    let state = match (states.next(), states.next()) {
        (Some(state), None) => state.to_str().ok(),
        _ => None,
    };
    quiver::TraceContext::parse(parent, state).ok()
}

/// The task of a submission: task.json's fields, checked as `TaskSpec::from_json` does,
/// minus what a remote client must not have (host directories, the node's stdin).
fn parse_task(value: Value) -> Result<TaskSpec, ApiError> {
    let task: TaskSpec = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = field_path("task", &e.path().to_string(), &e.inner().to_string());
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_task",
            e.inner().to_string(),
        )
        .with_field(field)
    })?;
    if !task.preopens.is_empty() {
        return Err(invalid_task(
            "task.preopens",
            "a node does not grant host directories to remote tasks",
        ));
    }
    if task.inherit_stdin {
        return Err(invalid_task(
            "task.inherit_stdin",
            "a node's tasks have no stdin",
        ));
    }
    task.validate().map_err(|e| match e {
        TaskError::Field { field, message } => invalid_task(&format!("task.{field}"), &message),
        TaskError::Config { key, message, .. } => {
            invalid_task(&format!("task.config.{key}"), &message)
        }
        other => invalid_task("task", &other.to_string()),
    })?;
    Ok(task.with_captured_output())
}

fn invalid_task(field: &str, message: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_task", message).with_field(field)
}

/// Whose tasks `caller` may see and cancel: every task with the `observe` role, else only
/// those it submitted (others are "not found", so their ids tell nothing).
fn scope(caller: &Caller) -> Scope<'_> {
    if caller.roles.contains(&Role::Observe) {
        return Scope::All;
    }
    Scope::SubmittedBy(caller.client.as_deref())
}

/// `GET /v1/tasks/{id}[?wait=SECONDS]`: the task, after waiting up to `wait` (at most
/// `[serve] max_wait_ms`) for it to end.
async fn get_task(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let id = hex_param(id, "id", 24)?;
    let wait = parse_wait(query.as_deref())?.min(state.config.max_wait);
    let (mut view, mut phase) = state
        .tasks
        .watch(&id, scope(&caller))
        .ok_or_else(|| ApiError::not_found("task", "id"))?;
    if !wait.is_zero() && !view.status.is_done() {
        let _ = tokio::time::timeout(wait, phase.wait_for(|p| p.is_done())).await;
        if let Some(latest) = state.tasks.view(&id, scope(&caller)) {
            view = latest;
        }
    }
    Ok(axum::Json(view).into_response())
}

/// `DELETE /v1/tasks/{id}`: cancels a queued or running task; one already done stays as
/// it ended.
async fn cancel_task(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = hex_param(id, "id", 24)?;
    let view = state
        .tasks
        .cancel(&id, scope(&caller), "cancelled by DELETE /v1/tasks/{id}")
        .ok_or_else(|| ApiError::not_found("task", "id"))?;
    Ok(axum::Json(view).into_response())
}

/// `GET /metrics`: the host's metrics as OpenMetrics text.
async fn metrics(State(state): State<Arc<NodeState>>) -> Response {
    (
        [(header::CONTENT_TYPE, Metrics::CONTENT_TYPE)],
        with_telemetry_metrics(state.host.metrics().encode()),
    )
        .into_response()
}

/// The host's OpenMetrics text with the trace exporter's counters before its `# EOF`.
fn with_telemetry_metrics(mut text: String) -> String {
    if text.ends_with("# EOF\n") {
        text.truncate(text.len() - "# EOF\n".len());
    }
    text.push_str(&crate::telemetry::metrics_text());
    text.push_str("# EOF\n");
    text
}

/// `GET /v1/mcp/servers`: every registry server's health, without process ids (a remote
/// client has no use for the node's pids).
async fn mcp_servers(State(state): State<Arc<NodeState>>) -> Response {
    let servers: Vec<Value> = state
        .host
        .mcp_servers()
        .iter()
        .filter_map(|status| {
            let mut value = serde_json::to_value(status).ok()?;
            if let Some(fields) = value.as_object_mut() {
                fields.remove("pid");
            }
            Some(value)
        })
        .collect();
    axum::Json(json!({"servers": servers})).into_response()
}

/// `GET /v1/registry`: the registry's revision, reload counts and whether the last
/// reload was refused.
async fn registry_health(State(state): State<Arc<NodeState>>) -> Response {
    axum::Json(state.host.registry_health()).into_response()
}

fn approval_queue(state: &NodeState) -> Result<&ApprovalQueue, ApiError> {
    state.config.approvals.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "approvals_disabled",
            "this node has no approval queue (NodeConfig::with_approval_queue)",
        )
        .with_field("path")
    })
}

/// `GET /v1/approvals`: the tool calls waiting for a decision and the servers' questions
/// waiting for an answer (each with its form), oldest first.
async fn list_approvals(State(state): State<Arc<NodeState>>) -> Result<Response, ApiError> {
    let queue = approval_queue(&state)?;
    let (pending, questions) = (queue.pending(), queue.pending_questions());
    Ok(axum::Json(json!({"approvals": pending, "questions": questions})).into_response())
}

/// `POST /v1/approvals/{id}` with `{"approve": bool, "reason": "..."}`: decides a waiting
/// call; for a server's question, `{"action": "accept", "content": {...}}` (or `decline`,
/// `cancel`) answers it, the content checked against its form. Taken while draining too:
/// running tasks may wait on it.
async fn decide_approval(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let queue = approval_queue(&state)?;
    let id = match id {
        Ok(Path(id)) if is_approval_id(&id) => id,
        _ => {
            return Err(ApiError::bad(
                "id",
                "expected an approval id as GET /v1/approvals lists it",
            ));
        }
    };
    let bytes = read_body(
        &headers,
        body,
        Media::Json,
        defaults::SERVE_MAX_DECISION_BYTES,
        state.config.body_timeout,
    )
    .await?;
    // serde would take `[true]` for the struct too.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::bad(
            "body",
            "expected a JSON object: {\"approve\": true|false, \"reason\": \"...\"}, or for a question {\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {...}}",
        ));
    }
    // A question, or an answer's shape for an id no longer waiting (told apart below).
    let answers = queue.is_question(&id)
        || quiver::json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
            .is_ok_and(|body| body.contains_key("action"));
    if answers {
        let answer: quiver::ElicitationAnswer = parse_json(&bytes, "")?;
        let action = match &answer {
            quiver::ElicitationAnswer::Accept { .. } => "accept",
            quiver::ElicitationAnswer::Decline => "decline",
            quiver::ElicitationAnswer::Cancel => "cancel",
        };
        queue.answer(&id, answer)?;
        tracing::info!(question = %id, action, client = caller.name(), "server's question answered");
        return Ok(axum::Json(json!({"id": id, "action": action})).into_response());
    }
    let decision: ApprovalDecision = parse_json(&bytes, "")?;
    let approved = decision.approve;
    queue.decide(&id, decision.by(caller.name()))?;
    tracing::info!(approval = %id, approved, client = caller.name(), "approval decided");
    Ok(axum::Json(json!({"id": id, "approved": approved})).into_response())
}
