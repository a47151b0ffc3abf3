//! `POST /admin/api/mcp/servers/{id}/pin`: pins the definitions the server lists now into
//! its record (the `pins` table; the rest of the document is kept as written), as
//! `quiver registry pin` does for a directory. The listing goes through the node's pool
//! (its policy gate, egress and credential); the write is checked and made like a `PUT`;
//! each changed pin, old and new digest, goes to the audit log under the caller's name.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::records::{check, find};
use super::{NodeState, existing_id, no_query, store, store_error};
use crate::auth::Caller;
use crate::body::{Media, parse_json, read_body};
use crate::error::ApiError;
use quiver::PreviewError;
use quiver::registry::{DocKind, StoredDoc, Write, with_pins};

/// The request: the tools to pin; absent or empty, every tool `allowed_tools` lets through.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinRequest {
    #[serde(default)]
    tools: Vec<String>,
}

pub(crate) async fn pin(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    no_query(query.as_deref())?;
    let id = existing_id(&state, DocKind::Server, id).await?;
    let bytes = read_body(
        &headers,
        body,
        Media::Json,
        state.config.max_request_bytes,
        state.config.body_timeout,
    )
    .await?;
    let request: PinRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        PinRequest::default()
    } else {
        parse_json(&bytes, "")?
    };
    if request.tools.len() > quiver::defaults::MAX_TOOL_PINS {
        return Err(ApiError::bad(
            "tools",
            format!(
                "at most {} tools; send none to pin every allowed tool",
                quiver::defaults::MAX_TOOL_PINS
            ),
        ));
    }
    let old = state
        .host
        .registry()
        .get(&id)
        .map(|entry| entry.record.pins.clone())
        .unwrap_or_default();
    let pins = state
        .host
        .pins_from_server(&id, &request.tools, None)
        .await
        .map_err(|e| match e {
            PreviewError::NotPinnable(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_pinnable",
                e.to_string(),
            )
            .with_field("tools"),
            _ => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_unavailable",
                format!("{e}; GET /v1/registry says why"),
            ),
        })?;
    let store = store(&state)?;
    let listing = store.list().await.map_err(store_error)?;
    let current =
        find(&listing, DocKind::Server, &id).ok_or_else(|| ApiError::not_found("server", "id"))?;
    let text = String::from_utf8_lossy(&current.body);
    let body = with_pins(current.format, &text, &pins).map_err(|e| {
        ApiError::new(
            StatusCode::CONFLICT,
            "record_unreadable",
            format!("the stored record cannot be rewritten: {e}"),
        )
    })?;
    let put = Write::Put(StoredDoc {
        kind: DocKind::Server,
        name: id.clone(),
        format: current.format,
        body: body.into_bytes(),
        revision: 0,
        updated_at: None,
    });
    let (put, listed_at) = check(&state, store, listing, put).await?;
    let revision = store
        .apply(vec![put], listed_at)
        .await
        .map_err(store_error)?;
    state.host.sync_after_write(&**store).await;
    let by = format!("admin:{}", caller.client.as_deref().unwrap_or("anonymous"));
    let changes = state.host.report_pins_changed(&id, &by, &old, &pins);
    Ok(axum::Json(json!({
        "server_id": id,
        "revision": revision,
        "pins": pins,
        "changes": changes,
    }))
    .into_response())
}
