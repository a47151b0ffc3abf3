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

use super::{
    NodeState, RecordBody, existing_id, name_field, no_query, noun, read_record, store, store_error,
};
use crate::mcp::ServerStatus;
use crate::registry::{DocFormat, DocKind, RegistryStore, StoredDoc, Write, check_changes};
use crate::serve::error::ApiError;

/// A document's text parsed into a JSON object, values as written; `None` if it does not
/// parse as its format or is not a table.
fn parse_fields(format: DocFormat, body: &[u8]) -> Option<Map<String, Value>> {
    let text = std::str::from_utf8(body).ok()?;
    let value = match format {
        DocFormat::Toml => serde_json::to_value(toml::from_str::<toml::Table>(text).ok()?).ok()?,
        DocFormat::Json => serde_json::from_str(text).ok()?,
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
    let store = store(state)?;
    if store.get(kind, &name).await.map_err(store_error)?.is_some() {
        let plural = format!("{}s", noun(kind));
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_exists",
            format!(
                "{} `{name}` exists; change it with PUT /admin/api/mcp/{plural}/{name}",
                noun(kind)
            ),
        )
        .with_field(name_field(kind)));
    }
    write(state, store, kind, &name, record, None, StatusCode::CREATED).await
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
    if store.get(kind, &id).await.map_err(store_error)?.is_none() {
        return Err(ApiError::not_found(noun(kind), "id"));
    }
    write(state, store, kind, &id, record, expected, StatusCode::OK).await
}

async fn remove(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    no_query(query)?;
    let id = existing_id(state, kind, id).await?;
    let store = store(state)?;
    let delete = Write::Delete {
        kind,
        name: id.clone(),
    };
    check(store, &[delete])
        .await
        .map_err(|e| e.with_field("id"))?;
    let revision = store
        .delete(kind, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found(noun(kind), "id"))?;
    state.host.sync_after_write(&**store).await;
    Ok(axum::Json(json!({name_field(kind): id, "revision": revision})).into_response())
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

/// Checks `writes` against everything the store holds now (the rules of a load).
async fn check(store: &Arc<dyn RegistryStore>, writes: &[Write]) -> Result<(), ApiError> {
    let listing = store.list().await.map_err(store_error)?;
    check_changes(&listing.docs, &store.describe(), writes).map_err(store_error)
}

/// The document's name field (`server_id` or `name`).
fn document_name(kind: DocKind, record: &RecordBody) -> Result<String, ApiError> {
    let invalid = |message: String| {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_record", message)
    };
    let format = DocFormat::from(record.format);
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

async fn write(
    state: &NodeState,
    store: &Arc<dyn RegistryStore>,
    kind: DocKind,
    name: &str,
    record: RecordBody,
    expected: Option<u64>,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let format = DocFormat::from(record.format);
    let body = record.body.into_bytes();
    let put = Write::Put(StoredDoc {
        kind,
        name: name.to_owned(),
        format,
        body: body.clone(),
        revision: 0,
        updated_at: None,
    });
    check(store, &[put]).await?;
    let written = match expected {
        Some(expected) => store.upsert_if(kind, name, format, body, expected).await,
        None => store.upsert(kind, name, format, body).await,
    };
    let revision = written.map_err(store_error)?;
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
        pub(in crate::serve) async fn $list(
            State(state): State<Arc<NodeState>>,
            RawQuery(query): RawQuery,
        ) -> Result<Response, ApiError> {
            list(&state, $kind, query.as_deref()).await
        }

        pub(in crate::serve) async fn $get(
            State(state): State<Arc<NodeState>>,
            id: Result<Path<String>, PathRejection>,
            RawQuery(query): RawQuery,
        ) -> Result<Response, ApiError> {
            get(&state, $kind, id, query.as_deref()).await
        }

        pub(in crate::serve) async fn $create(
            State(state): State<Arc<NodeState>>,
            RawQuery(query): RawQuery,
            headers: HeaderMap,
            body: Body,
        ) -> Result<Response, ApiError> {
            create(&state, $kind, &headers, body, query.as_deref()).await
        }

        pub(in crate::serve) async fn $replace(
            State(state): State<Arc<NodeState>>,
            id: Result<Path<String>, PathRejection>,
            RawQuery(query): RawQuery,
            headers: HeaderMap,
            body: Body,
        ) -> Result<Response, ApiError> {
            replace(&state, $kind, id, &headers, body, query.as_deref()).await
        }

        pub(in crate::serve) async fn $delete(
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
