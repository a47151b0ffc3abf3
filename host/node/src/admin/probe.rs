//! `POST servers/{id}/test` and `GET servers/{id}/tools`: thin wrappers over
//! [`Host::probe_server`](quiver::Host::probe_server) and
//! [`Host::preview_tools`](quiver::Host::preview_tools). The id must name a record in the
//! store (404 otherwise); what is tested or listed is that record as the node's current
//! snapshot has it, which every write refreshes.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{NodeState, existing_id, no_query};
use crate::error::ApiError;
use quiver::registry::DocKind;
use quiver::{PreviewError, ProbeReport};

/// `POST /admin/api/mcp/servers/{id}/test`: a failed test is `ok: false`, not an error.
pub(crate) async fn test(
    State(state): State<Arc<NodeState>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    no_query(query.as_deref())?;
    let id = existing_id(&state, DocKind::Server, id).await?;
    // In the store but not in the snapshot: the snapshot refused it (see /v1/registry).
    let report = state
        .host
        .probe_server(&id)
        .await
        .unwrap_or_else(|| ProbeReport {
            server_id: id,
            ok: false,
            elapsed_ms: 0,
            tool_count: None,
            tools: Vec::new(),
            error: Some(
                "the node's registry snapshot does not hold this record; GET /v1/registry says why"
                    .into(),
            ),
        });
    Ok(axum::Json(report).into_response())
}

/// `GET /admin/api/mcp/servers/{id}/tools`: the tools after `allowed_tools`, with the
/// names a model sees.
pub(crate) async fn tools(
    State(state): State<Arc<NodeState>>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    no_query(query.as_deref())?;
    let id = existing_id(&state, DocKind::Server, id).await?;
    let tools = state.host.preview_tools(&id).await.map_err(|e| match e {
        PreviewError::UnknownServer(_) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_unavailable",
            format!("{e}; GET /v1/registry says why"),
        ),
        PreviewError::Unavailable(_) | PreviewError::NotPinnable(_) => {
            ApiError::new(StatusCode::BAD_GATEWAY, "server_unavailable", e.to_string())
        }
    })?;
    Ok(axum::Json(json!({"server_id": id, "tools": tools})).into_response())
}
