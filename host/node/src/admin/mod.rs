//! The admin API (`/admin/api/mcp/...`), guarded by the admin token (see
//! [`api`](super::api)): CRUD of server records and profiles ([`records`]), a connection
//! test and a tool preview ([`probe`]), and import of many records at once ([`import`]).
//!
//! Records are read and written as documents in the node's registry store (or its
//! registry directory): the text as written, with `${ENV:..}` references unresolved, so no
//! answer ever carries a secret. Every write is checked against a listing of the whole
//! store first ([`check_changes`](quiver::registry::check_changes): a bad field, a profile
//! naming an unknown server, a server a profile still names), off the async workers, and
//! then made as a checked write ([`RegistryStore::apply`]) that fails with `409
//! changed_meanwhile` if another write reached the store after that listing: a check and
//! its write cannot be split by another node's write. After a write the node lists the
//! store again at once, so the next request or task sees it. This module holds what the handlers share: the request shapes, the store and its
//! errors, and the checks of ids and query strings.

mod import;
mod pin;
mod probe;
mod records;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

pub(super) use import::import;
pub(super) use pin::pin;
pub(super) use probe::{test, tools};
pub(super) use records::{
    create_profile, create_server, delete_profile, delete_server, get_profile, get_server,
    list_profiles, list_servers, replace_profile, replace_server,
};

use super::NodeState;
use super::error::ApiError;
use crate::body::{Media, parse_json, read_body};
use quiver::registry::{DocFormat, DocKind, RegistryStore, StoreError};

/// A record (or a bundle) as a client sends it: the document text and how it is written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordBody {
    format: DocFormat,
    body: String,
}

/// What the API calls each kind of document, and the field naming it.
fn noun(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "server",
        DocKind::Profile => "profile",
    }
}

fn name_field(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "server_id",
        DocKind::Profile => "name",
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
        StoreError::Conflict { .. } => ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "revision_mismatch",
            format!("{error}; send its current revision in If-Match"),
        )
        .with_field("If-Match"),
        StoreError::Changed { .. } => {
            ApiError::new(StatusCode::CONFLICT, "changed_meanwhile", error.to_string())
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

/// The name in the path; a name no store could hold is simply not found.
fn id_param(kind: DocKind, id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad("id", e.body_text()))?;
    if !quiver::registry::is_valid_server_id(&id) {
        return Err(ApiError::not_found(noun(kind), "id"));
    }
    Ok(id)
}

/// The id in the path, when the store holds a document of `kind` under it (404 if not).
async fn existing_id(
    state: &NodeState,
    kind: DocKind,
    id: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let id = id_param(kind, id)?;
    store(state)?
        .get(kind, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found(noun(kind), "id"))?;
    Ok(id)
}

/// The query's `key=value` pairs, refusing any key not in `known`.
fn query_pairs<'q>(
    query: Option<&'q str>,
    known: &[&str],
) -> Result<Vec<(&'q str, &'q str)>, ApiError> {
    let mut pairs = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&key) {
            let takes = if known.is_empty() {
                "this endpoint takes none".to_owned()
            } else {
                format!("this endpoint takes only {}", known.join(", "))
            };
            return Err(ApiError::bad(
                key.chars().take(64).collect::<String>(),
                format!("unknown query parameter; {takes}"),
            ));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Refuses any query parameter: most endpoints take none.
fn no_query(query: Option<&str>) -> Result<(), ApiError> {
    query_pairs(query, &[]).map(|_| ())
}

/// The request body as a [`RecordBody`], within the node's body size and time limits.
async fn read_record(
    state: &NodeState,
    headers: &HeaderMap,
    body: Body,
) -> Result<RecordBody, ApiError> {
    let bytes = read_body(
        headers,
        body,
        Media::Json,
        state.config.max_request_bytes,
        state.config.body_timeout,
    )
    .await?;
    parse_json(&bytes, "")
}
