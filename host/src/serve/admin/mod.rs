//! The admin API for MCP server records (`/admin/api/mcp/servers`), guarded by the admin
//! token (see [`api`](super::api)). Records are read and written as documents in the
//! node's registry store (or its registry directory): the text as written, with
//! `${ENV:..}` references unresolved, so no answer ever carries a secret. The store checks
//! every write with the directory loader's rules; after a write the node lists the store
//! again at once, so the next request or task sees it.

mod probe;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

pub(super) use probe::{test, tools};

use super::NodeState;
use super::api::{parse_json, read_body};
use super::error::ApiError;
use crate::registry::{DocFormat, DocKind, RegistryStore, StoreError, StoredDoc};

/// A record as a client sends it: the document text and how it is written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordBody {
    format: Format,
    body: String,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Format {
    Toml,
    Json,
}

impl From<Format> for DocFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Toml => Self::Toml,
            Format::Json => Self::Json,
        }
    }
}

fn store(state: &NodeState) -> Result<&Arc<dyn RegistryStore>, ApiError> {
    state.admin_store.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_registry_store",
            "this node has no registry directory or store to write; start it with --registry",
        )
        .with_field("path")
    })
}

fn store_error(error: StoreError) -> ApiError {
    match error {
        StoreError::Invalid(message) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_record", message)
                .with_field("body")
        }
        StoreError::Conflict { .. } => {
            ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string()).with_field("id")
        }
        StoreError::Unreachable { .. } | StoreError::Compacted { .. } => ApiError::busy(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            error.to_string(),
        ),
        StoreError::Other { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, "store_error", error.to_string())
        }
    }
}

/// A server's document and how the host sees it now.
fn server_json(state: &NodeState, doc: &StoredDoc) -> Value {
    let live = state
        .host
        .mcp_servers()
        .into_iter()
        .find(|s| s.server_id == doc.name);
    json!({
        "server_id": doc.name,
        "format": doc.format,
        "body": String::from_utf8_lossy(&doc.body),
        "revision": doc.revision,
        "state": live.as_ref().map(|s| s.state),
        "last_error": live.as_ref().and_then(|s| s.last_error.clone()),
        "tool_count": live.as_ref().and_then(|s| s.tool_count),
    })
}

fn id_param(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad("id", e.body_text()))?;
    if !crate::registry::is_valid_server_id(&id) {
        return Err(ApiError::not_found("server", "id"));
    }
    Ok(id)
}

/// Refuses any query parameter: these endpoints take none.
fn no_query(query: Option<&str>) -> Result<(), ApiError> {
    match query.and_then(|q| q.split('&').find(|p| !p.is_empty())) {
        Some(pair) => {
            let key = pair.split_once('=').map_or(pair, |(key, _)| key);
            Err(ApiError::bad(
                key.chars().take(64).collect::<String>(),
                "unknown query parameter; this endpoint takes none",
            ))
        }
        None => Ok(()),
    }
}

/// The id in the path, when the store holds a document of `kind` under it (404 if not).
async fn existing_id(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let id = id_param(id)?;
    store(state)?
        .get(kind, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("server", "id"))?;
    Ok(id)
}

/// `GET /admin/api/mcp/servers`: every server record, in id order.
pub(super) async fn list(State(state): State<Arc<NodeState>>) -> Result<Response, ApiError> {
    let listing = store(&state)?.list().await.map_err(store_error)?;
    let mut docs: Vec<&StoredDoc> = listing
        .docs
        .iter()
        .filter(|d| d.kind == DocKind::Server)
        .collect();
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    let servers: Vec<Value> = docs.into_iter().map(|d| server_json(&state, d)).collect();
    Ok(axum::Json(json!({"revision": listing.revision, "servers": servers})).into_response())
}

/// `GET /admin/api/mcp/servers/{id}`.
pub(super) async fn get(
    State(state): State<Arc<NodeState>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = id_param(id)?;
    let doc = store(&state)?
        .get(DocKind::Server, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("server", "id"))?;
    Ok(axum::Json(server_json(&state, &doc)).into_response())
}

/// `POST /admin/api/mcp/servers`: creates a record; its id is the document's `server_id`.
pub(super) async fn create(
    State(state): State<Arc<NodeState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let record = read_record(&state, &headers, body).await?;
    let id = document_id(&record)?;
    let store = store(&state)?;
    if store
        .get(DocKind::Server, &id)
        .await
        .map_err(store_error)?
        .is_some()
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_exists",
            format!("server `{id}` exists; change it with PUT /admin/api/mcp/servers/{id}"),
        )
        .with_field("server_id"));
    }
    write(&state, store, &id, record, StatusCode::CREATED).await
}

/// `PUT /admin/api/mcp/servers/{id}`: replaces an existing record.
pub(super) async fn replace(
    State(state): State<Arc<NodeState>>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = id_param(id)?;
    let record = read_record(&state, &headers, body).await?;
    let named = document_id(&record)?;
    if named != id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "id_mismatch",
            format!(
                "the document's server_id is `{named}`, not the `{id}` in the path; make them equal"
            ),
        )
        .with_field("server_id"));
    }
    let store = store(&state)?;
    if store
        .get(DocKind::Server, &id)
        .await
        .map_err(store_error)?
        .is_none()
    {
        return Err(ApiError::not_found("server", "id"));
    }
    write(&state, store, &id, record, StatusCode::OK).await
}

/// `DELETE /admin/api/mcp/servers/{id}`.
pub(super) async fn remove(
    State(state): State<Arc<NodeState>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = id_param(id)?;
    let store = store(&state)?;
    let revision = store
        .delete(DocKind::Server, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("server", "id"))?;
    state.host.sync_after_write(&**store).await;
    Ok(axum::Json(json!({"server_id": id, "revision": revision})).into_response())
}

async fn read_record(
    state: &NodeState,
    headers: &HeaderMap,
    body: Body,
) -> Result<RecordBody, ApiError> {
    let bytes = read_body(
        headers,
        body,
        state.config.max_request_bytes,
        state.config.body_timeout,
    )
    .await?;
    parse_json(&bytes, "")
}

/// The document's top-level `server_id`.
fn document_id(record: &RecordBody) -> Result<String, ApiError> {
    let invalid = |message: String| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_record", message)
    };
    let id = match record.format {
        Format::Toml => toml::from_str::<toml::Table>(&record.body)
            .map_err(|e| {
                invalid(format!("the body is not TOML: {}", e.message())).with_field("body")
            })?
            .get("server_id")
            .and_then(|v| v.as_str().map(str::to_owned)),
        Format::Json => serde_json::from_str::<Value>(&record.body)
            .map_err(|e| invalid(format!("the body is not JSON: {e}")).with_field("body"))?
            .get("server_id")
            .and_then(|v| v.as_str().map(str::to_owned)),
    };
    id.ok_or_else(|| {
        invalid("the record has no `server_id` string; add one, e.g. server_id = \"fs\"".into())
            .with_field("server_id")
    })
}

async fn write(
    state: &NodeState,
    store: &Arc<dyn RegistryStore>,
    id: &str,
    record: RecordBody,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let revision = store
        .upsert(
            DocKind::Server,
            id,
            record.format.into(),
            record.body.into_bytes(),
        )
        .await
        .map_err(store_error)?;
    state.host.sync_after_write(&**store).await;
    Ok((
        status,
        axum::Json(json!({"server_id": id, "revision": revision})),
    )
        .into_response())
}
