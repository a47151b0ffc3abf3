//! CRUD of registry documents: `servers[/{id}]` and `profiles[/{name}]` share one code
//! path, told apart only by their [`DocKind`]. A document's name is its `server_id` (a
//! server) or its `name` (a profile); a `PUT` may carry `If-Match: <revision>` so a write
//! made on a stale read fails (`412`) instead of undoing another.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::{NodeState, RecordBody, name_field, no_query, noun, read_record, store, store_error};
use crate::error::ApiError;
use quiver::ServerStatus;
use quiver::registry::{
    DocFormat, DocKind, Listing, RegistryStore, StoreError, StoredDoc, Write, check_changes_under,
};

/// A document's text parsed into a JSON object, values as written; `None` if it does not
/// parse as its format or is not a table.
fn parse_fields(format: DocFormat, body: &[u8]) -> Option<Map<String, Value>> {
    let text = std::str::from_utf8(body).ok()?;
    let value = match format {
        DocFormat::Toml => quiver::json::from_toml(text).ok()?,
        DocFormat::Json => quiver::json::from_str(text).ok()?,
    };
    match value {
        Value::Object(fields) => Some(fields),
        _ => None,
    }
}

/// A server record's transport as the API names it: `stdio` or `http` (either HTTP
/// transport), `null` when the record does not say one it knows.
fn transport(fields: Option<&Map<String, Value>>) -> Value {
    match fields
        .and_then(|f| f.get("transport"))
        .and_then(Value::as_str)
    {
        Some("stdio") => json!("stdio"),
        Some("streamable_http" | "http_sse_legacy") => json!("http"),
        _ => Value::Null,
    }
}

/// A document as the API shows it; `live` is the host's view of the servers, and
/// `with_fields` adds the parsed document (for edit forms).
fn doc_json(doc: &StoredDoc, live: &[ServerStatus], with_fields: bool) -> Value {
    let fields = parse_fields(doc.format, &doc.body);
    let mut shown = json!({
        name_field(doc.kind): doc.name,
        "format": doc.format,
        "body": String::from_utf8_lossy(&doc.body),
        "revision": doc.revision,
        "updated_at": doc.updated_at,
    });
    if doc.kind == DocKind::Server {
        let live = live.iter().find(|s| s.server_id == doc.name);
        shown["transport"] = transport(fields.as_ref());
        shown["state"] = json!(live.map(|s| s.state));
        shown["last_error"] = json!(live.and_then(|s| s.last_error.clone()));
        shown["tool_count"] = json!(live.and_then(|s| s.tool_count));
        // The page offers user authorization for servers with a credential.
        shown["auth_ref"] = fields
            .as_ref()
            .and_then(|f| f.get("http"))
            .and_then(|h| h.get("auth_ref"))
            .and_then(Value::as_str)
            .map_or(Value::Null, |a| json!(a));
    }
    if with_fields {
        shown["fields"] = fields.map_or(Value::Null, Value::Object);
    }
    shown
}

async fn list(state: &NodeState, kind: DocKind, query: Option<&str>) -> Result<Response, ApiError> {
    no_query(query)?;
    let listing = store(state)?.list().await.map_err(store_error)?;
    let mut docs: Vec<&StoredDoc> = listing.docs.iter().filter(|d| d.kind == kind).collect();
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    let live = state.host.mcp_servers();
    let shown: Vec<Value> = docs
        .into_iter()
        .map(|d| doc_json(d, &live, false))
        .collect();
    let plural = match kind {
        DocKind::Server => "servers",
        DocKind::Profile => "profiles",
    };
    Ok(axum::Json(json!({"revision": listing.revision, plural: shown})).into_response())
}

async fn get(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    no_query(query)?;
    let id = super::id_param(kind, id)?;
    let doc = store(state)?
        .get(kind, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found(noun(kind), "id"))?;
    Ok(axum::Json(doc_json(&doc, &state.host.mcp_servers(), true)).into_response())
}

async fn create(
    state: &NodeState,
    kind: DocKind,
    headers: &HeaderMap,
    body: Body,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    no_query(query)?;
    let record = read_record(state, headers, body).await?;
    let name = document_name(kind, &record)?;
    refuse_reserved(kind, &name)?;
    let store = store(state)?;
    let listing = store.list().await.map_err(store_error)?;
    if find(&listing, kind, &name).is_some() {
        return Err(already_exists(kind, &name));
    }
    let (put, listed_at) = check(state, store, listing, put_of(kind, &name, record)).await?;
    let revision = match store.apply(vec![put], listed_at).await {
        Ok(revision) => revision,
        // A create that lost a race to another create of the same name is told so.
        Err(StoreError::Changed { .. }) if matches!(store.get(kind, &name).await, Ok(Some(_))) => {
            return Err(already_exists(kind, &name));
        }
        Err(error) => return Err(store_error(error)),
    };
    answer(state, store, kind, &name, revision, StatusCode::CREATED).await
}

fn already_exists(kind: DocKind, name: &str) -> ApiError {
    let plural = format!("{}s", noun(kind));
    ApiError::new(
        StatusCode::CONFLICT,
        "already_exists",
        format!(
            "{} `{name}` exists; change it with PUT /admin/api/mcp/{plural}/{name}",
            noun(kind)
        ),
    )
    .with_field(name_field(kind))
}

async fn replace(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    no_query(query)?;
    let id = super::id_param(kind, id)?;
    let expected = if_match(headers)?;
    let record = read_record(state, headers, body).await?;
    let named = document_name(kind, &record)?;
    if named != id {
        let field = name_field(kind);
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "id_mismatch",
            format!(
                "the document's {field} is `{named}`, not the `{id}` in the path; make them equal"
            ),
        )
        .with_field(field));
    }
    let store = store(state)?;
    let listing = store.list().await.map_err(store_error)?;
    // The write is made only while the store is as listed, so checking the record's
    // existence and revision here holds for the write too (a PUT cannot bring back a
    // record a racing DELETE removed).
    let current = find(&listing, kind, &id).ok_or_else(|| ApiError::not_found(noun(kind), "id"))?;
    if let Some(expected) = expected
        && current.revision != expected
    {
        return Err(store_error(StoreError::Conflict {
            kind,
            name: id,
            current: current.revision,
        }));
    }
    let (put, listed_at) = check(state, store, listing, put_of(kind, &id, record)).await?;
    let revision = store
        .apply(vec![put], listed_at)
        .await
        .map_err(store_error)?;
    answer(state, store, kind, &id, revision, StatusCode::OK).await
}

async fn remove(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    no_query(query)?;
    let id = super::id_param(kind, id)?;
    let store = store(state)?;
    let listing = store.list().await.map_err(store_error)?;
    if find(&listing, kind, &id).is_none() {
        return Err(ApiError::not_found(noun(kind), "id"));
    }
    let delete = Write::Delete {
        kind,
        name: id.clone(),
    };
    let (delete, listed_at) = check(state, store, listing, delete)
        .await
        .map_err(|e| e.with_field("id"))?;
    let revision = store
        .apply(vec![delete], listed_at)
        .await
        .map_err(store_error)?;
    state.host.sync_after_write(&**store).await;
    Ok(axum::Json(json!({name_field(kind): id, "revision": revision})).into_response())
}

pub(super) fn find<'l>(listing: &'l Listing, kind: DocKind, name: &str) -> Option<&'l StoredDoc> {
    listing
        .docs
        .iter()
        .find(|d| d.kind == kind && d.name == name)
}

fn put_of(kind: DocKind, name: &str, record: RecordBody) -> Write {
    Write::Put(StoredDoc {
        kind,
        name: name.to_owned(),
        format: record.format,
        body: record.body.into_bytes(),
        revision: 0,
        updated_at: None,
    })
}

/// `If-Match: <revision>` (quotes allowed, as for an ETag); `None` without the header.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .map(|v| v.trim().trim_matches('"'))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad(
                "If-Match",
                "expected the record's revision as read, e.g. If-Match: 42",
            )
        })
}

/// Checks `write` against `listing` (the rules of a load; building registries is CPU work,
/// so off the async workers). The write and the listing's revision, for a checked write
/// ([`RegistryStore::apply`]) made only while the store is still as listed.
pub(super) async fn check(
    state: &NodeState,
    store: &Arc<dyn RegistryStore>,
    listing: Listing,
    write: Write,
) -> Result<(Write, u64), ApiError> {
    let describe = store.describe();
    let listed_at = listing.revision;
    // The operator's rules (launch, egress, credential bindings), as every load applies them.
    let rules = state.host.record_rules();
    let write = tokio::task::spawn_blocking(move || {
        check_changes_under(
            &listing.docs,
            &describe,
            std::slice::from_ref(&write),
            &*rules,
        )
        .map(|()| write)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("checking the record failed: {e}"),
        )
    })?
    .map_err(store_error)?;
    Ok((write, listed_at))
}

/// Refuses a server id the admin routes could not address: `servers/import` is the import
/// endpoint, so a server named `import` could be created but never read or deleted there.
pub(super) fn refuse_reserved(kind: DocKind, name: &str) -> Result<(), ApiError> {
    if kind == DocKind::Server && name == "import" {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reserved_name",
            "`import` is reserved (POST /admin/api/mcp/servers/import); pick another server_id",
        )
        .with_field("server_id"));
    }
    Ok(())
}

/// The document's name field (`server_id` or `name`).
fn document_name(kind: DocKind, record: &RecordBody) -> Result<String, ApiError> {
    let invalid = |message: String| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_record", message)
    };
    let format = record.format;
    let fields = parse_fields(format, record.body.as_bytes()).ok_or_else(|| {
        let written = match format {
            DocFormat::Toml => "a TOML table",
            DocFormat::Json => "a JSON object",
        };
        invalid(format!("the body is not {written}; check its syntax")).with_field("body")
    })?;
    let field = name_field(kind);
    fields
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            invalid(format!(
                "the record has no `{field}` string; add one, e.g. {field} = \"fs\""
            ))
            .with_field(field)
        })
}

/// After a write: the node follows it at once, and the client learns the new revision.
async fn answer(
    state: &NodeState,
    store: &Arc<dyn RegistryStore>,
    kind: DocKind,
    name: &str,
    revision: u64,
    status: StatusCode,
) -> Result<Response, ApiError> {
    state.host.sync_after_write(&**store).await;
    Ok((
        status,
        axum::Json(json!({name_field(kind): name, "revision": revision})),
    )
        .into_response())
}

/// Axum handlers, one per route and kind, over the shared functions above.
macro_rules! handlers {
    ($kind:expr, $list:ident, $get:ident, $create:ident, $replace:ident, $delete:ident) => {
        pub(crate) async fn $list(
            State(state): State<Arc<NodeState>>,
            RawQuery(query): RawQuery,
        ) -> Result<Response, ApiError> {
            list(&state, $kind, query.as_deref()).await
        }

        pub(crate) async fn $get(
            State(state): State<Arc<NodeState>>,
            id: Result<Path<String>, PathRejection>,
            RawQuery(query): RawQuery,
        ) -> Result<Response, ApiError> {
            get(&state, $kind, id, query.as_deref()).await
        }

        pub(crate) async fn $create(
            State(state): State<Arc<NodeState>>,
            RawQuery(query): RawQuery,
            headers: HeaderMap,
            body: Body,
        ) -> Result<Response, ApiError> {
            create(&state, $kind, &headers, body, query.as_deref()).await
        }

        pub(crate) async fn $replace(
            State(state): State<Arc<NodeState>>,
            id: Result<Path<String>, PathRejection>,
            RawQuery(query): RawQuery,
            headers: HeaderMap,
            body: Body,
        ) -> Result<Response, ApiError> {
            replace(&state, $kind, id, &headers, body, query.as_deref()).await
        }

        pub(crate) async fn $delete(
            State(state): State<Arc<NodeState>>,
            id: Result<Path<String>, PathRejection>,
            RawQuery(query): RawQuery,
        ) -> Result<Response, ApiError> {
            remove(&state, $kind, id, query.as_deref()).await
        }
    };
}

handlers!(
    DocKind::Server,
    list_servers,
    get_server,
    create_server,
    replace_server,
    delete_server
);
handlers!(
    DocKind::Profile,
    list_profiles,
    get_profile,
    create_profile,
    replace_profile,
    delete_profile
);
