//! Calling an MCP tool from library code: [`Host::call_tool`], in a task's name, through the
//! gate a guest's `mcp_call_tool` goes through (`mcp/call.rs`). The task's spec supplies
//! the policy layers (its `mcp.*` keys, its profile) and the limits (its deadline, its host
//! memory budget); the registry snapshot is the host's current one. The server is granted
//! as `mcp_open` grants it, then the same `check` and `run` decide, wait for approval,
//! report to the observers (the metrics, the audit log) and call through the pool; events
//! say `via: library` and carry no fd.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::Value;
use tracing::Instrument;
use tracing::field::Empty;

use super::Host;
use crate::approval::Refusal;
use crate::defaults;
use crate::mcp::call::{self, ACTION, Ended, Origin};
use crate::mcp::{McpError, McpErrorCode, McpTask, ToolCallOutput};
use crate::observe::Via;
use crate::policy::{Denial, Grant, Layer, Reason};
use crate::sandbox::{Charge, Deadline, MemoryBudget, heap};
use crate::task::{TaskError, TaskSpec};

/// One MCP tool call a library makes: the server, the tool's MCP-native name and its
/// arguments, a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallRequest {
    pub server_id: String,
    pub tool: String,
    /// Sent as the call's `arguments`; anything but an object is refused as
    /// `mcp_invalid_arguments`, as a guest's would be.
    pub arguments: Value,
}

impl ToolCallRequest {
    /// A call of `tool` of `server_id` with no arguments (`{}`).
    pub fn new(server_id: impl Into<String>, tool: impl Into<String>) -> Self {
        Self {
            server_id: server_id.into(),
            tool: tool.into(),
            arguments: Value::Object(JsonObject::new()),
        }
    }

    #[must_use]
    pub fn with_arguments(self, arguments: Value) -> Self {
        Self { arguments, ..self }
    }
}

/// Why a policy layer or the approver refused a call; the same reason and detail the
/// observers and the audit log got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRefusal {
    pub server_id: String,
    pub tool: String,
    pub reason: Reason,
    /// The layer that refused: that of the filter, or the one a server-level reason comes
    /// from (`unknown_server` and `deny_all_server` the registry, `not_allowed_by_task`
    /// and `disabled` the task, `not_allowed_for_principal` the principal); `None` for the
    /// approval reasons.
    pub layer: Option<Layer>,
    pub detail: String,
}

/// Why [`Host::call_tool`] has no result. Every refusal by policy or the approver was also
/// reported to the observers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolCallError {
    /// The task's `mcp.*` config cannot be used with this registry.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// A policy layer refused the server or the tool, or the call needs an approval and the
    /// host has no approver (`approval_required`). Nothing was sent.
    #[error("tool `{}` of server `{}` is denied by policy ({}): {}", .0.tool, .0.server_id, reason_name(.0.reason), .0.detail)]
    Denied(CallRefusal),
    /// The approver refused the call (`approval_denied`) or did not decide in time
    /// (`approval_timeout`). Nothing was sent.
    #[error("tool `{}` of server `{}` was not approved ({}): {}", .0.tool, .0.server_id, reason_name(.0.reason), .0.detail)]
    NotApproved(CallRefusal),
    /// The request cannot be made as it is: a server id or tool name longer than any the
    /// registry may hold, or arguments the task's host memory budget cannot hold. Nothing
    /// was reported or sent, as for a guest's `-EINVAL` or `-ENOMEM`.
    #[error("{0}")]
    Invalid(String),
    /// The call ran past its server's `tool_timeout_ms` (waiting for a permit included),
    /// or past the task's deadline.
    #[error(transparent)]
    Timeout(McpError),
    /// The server or the host failed the call: `mcp_unavailable` (it could not be started
    /// or reached, or egress refused it), `mcp_invalid_arguments`, `mcp_output_too_large`,
    /// `tool_exec_failed` (an unknown tool, on most servers).
    #[error(transparent)]
    Failed(McpError),
}

fn reason_name(reason: Reason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Host {
    /// Calls `request`'s tool in the name of `task`, exactly as the task's guest would with
    /// `mcp_open` and `mcp_call_tool`: the registry, the task's profile and its lists decide
    /// (a denial names the layer); a server whose `approval_policy` asks waits for the
    /// host's approver, within its `approval_timeout_ms`; observers see the call start and
    /// end (metrics, the audit log) with `via: library`; the pool applies the server's
    /// budgets and the host's limits and egress. The call ends at the task's deadline
    /// (`limits.deadline_ms`, counted from now) at the latest. An `isError` result is a
    /// result: see [`ToolCallOutput::result`].
    pub async fn call_tool(
        &self,
        task: &TaskSpec,
        request: ToolCallRequest,
    ) -> Result<ToolCallOutput, ToolCallError> {
        let span = tracing::info_span!(
            "call_tool",
            task_id = %task.task_id,
            server_id = Empty,
            tool = Empty
        );
        self.call_tool_in(task, request, &span)
            .instrument(span.clone())
            .await
    }

    async fn call_tool_in(
        &self,
        task: &TaskSpec,
        request: ToolCallRequest,
        span: &tracing::Span,
    ) -> Result<ToolCallOutput, ToolCallError> {
        let ToolCallRequest {
            server_id,
            tool,
            arguments,
        } = request;
        check_lengths(&server_id, &tool)?;
        span.record("server_id", server_id.as_str());
        span.record("tool", tool.as_str());
        let task_id: Arc<str> = Arc::from(task.task_id.as_str());
        let budget = MemoryBudget::within(
            task_id.clone(),
            task.host_memory_limit(self.inner.task_host_memory),
            &self.inner.host_memory,
        );
        let mcp = self.mcp_task(task, &budget)?;
        let origin = Origin {
            task_id,
            session_fd: None,
            via: Via::Library,
            deadline: Deadline::after(task.deadline()),
            to_guest: None,
        };
        let grant = grant(&mcp, &origin, &server_id, &tool)?;
        let approval = call::check(&mcp, &origin, &grant, &tool)
            .map_err(|denial| ToolCallError::Denied(refusal_of(&server_id, &tool, &denial)))?;
        let (arguments, raw, _charge) = held_arguments(arguments, &budget)?;
        let ended = call::run(
            &mcp,
            &origin,
            &grant.entry,
            &tool,
            approval,
            arguments,
            &raw,
        )
        .await
        .map_err(|exceeded| {
            ToolCallError::Timeout(McpError::new(
                McpErrorCode::Timeout,
                format!("tool `{tool}` of server `{server_id}`: {exceeded} (limits.deadline_ms)"),
            ))
        })?;
        match ended {
            Ended::Answered(output) => Ok(output),
            Ended::Failed { error, .. } if error.code == McpErrorCode::Timeout => {
                Err(ToolCallError::Timeout(error))
            }
            Ended::Failed { error, .. } => Err(ToolCallError::Failed(error)),
            Ended::Refused(refusal) => Err(not_approved(&server_id, &tool, refusal)),
        }
    }
}

/// A server id or tool name longer than any the registry may hold is refused before it is
/// logged or reported, as a guest's is (`-EINVAL`).
fn check_lengths(server_id: &str, tool: &str) -> Result<(), ToolCallError> {
    let too_long = |what: &str, len: usize, max: usize| {
        ToolCallError::Invalid(format!(
            "the {what} is {len} bytes, more than the {max} any registry may hold"
        ))
    };
    if server_id.len() > defaults::MAX_SERVER_ID_BYTES {
        return Err(too_long(
            "server id",
            server_id.len(),
            defaults::MAX_SERVER_ID_BYTES,
        ));
    }
    if tool.len() > defaults::MAX_TOOL_NAME_BYTES {
        return Err(too_long(
            "tool name",
            tool.len(),
            defaults::MAX_TOOL_NAME_BYTES,
        ));
    }
    Ok(())
}

/// The task's grant of `server_id`, as `mcp_open` decides it (registry ∩ profile ∩ task); a
/// refusal is reported as a refused call of `tool`. A server missing a required
/// `${ENV:..}` value cannot be reached: `mcp_unavailable`, as a guest's open is
/// `-ENOTCONN`.
fn grant(
    mcp: &McpTask,
    origin: &Origin,
    server_id: &str,
    tool: &str,
) -> Result<Grant, ToolCallError> {
    let decision = match mcp.grant(server_id) {
        Ok(grant) => return Ok(grant),
        Err(decision) => decision,
    };
    let (reason, detail) = decision.map_or_else(
        || {
            (
                Reason::NotAllowedByTask,
                "the task may not use this server".to_owned(),
            )
        },
        |decision| (decision.reason, decision.detail),
    );
    origin.report_denial(mcp, (server_id, tool), reason, detail.clone());
    if reason == Reason::EnvMissing {
        return Err(ToolCallError::Failed(McpError::new(
            McpErrorCode::Unavailable,
            format!("server `{server_id}` cannot be started: {detail}"),
        )));
    }
    let layer = match reason {
        Reason::UnknownServer | Reason::DenyAllServer => Some(Layer::Registry),
        Reason::NotAllowedByTask | Reason::Disabled => Some(Layer::Task),
        Reason::NotAllowedForPrincipal => Some(Layer::Principal),
        _ => None,
    };
    Err(ToolCallError::Denied(CallRefusal {
        server_id: server_id.to_owned(),
        tool: tool.to_owned(),
        reason,
        layer,
        detail,
    }))
}

fn refusal_of(server_id: &str, tool: &str, denial: &Denial) -> CallRefusal {
    CallRefusal {
        server_id: server_id.to_owned(),
        tool: tool.to_owned(),
        reason: denial.reason(),
        layer: denial.layer(),
        detail: denial.to_string(),
    }
}

/// An approval refusal: the approver's (`NotApproved`), or the host's lack of one (`Denied`).
fn not_approved(server_id: &str, tool: &str, refusal: Refusal) -> ToolCallError {
    let refused = CallRefusal {
        server_id: server_id.to_owned(),
        tool: tool.to_owned(),
        reason: refusal.reason,
        layer: None,
        detail: refusal.detail,
    };
    match refused.reason {
        Reason::ApprovalDenied | Reason::ApprovalTimeout => ToolCallError::NotApproved(refused),
        _ => ToolCallError::Denied(refused),
    }
}

/// The arguments as the call holds them: the object and its JSON text (what observers
/// measure and, where the record opts in, audit), charged to the task's host memory
/// budget first, as a guest's are; then anything but an object is `mcp_invalid_arguments`.
fn held_arguments(
    arguments: Value,
    budget: &MemoryBudget,
) -> Result<(JsonObject, Vec<u8>, Charge), ToolCallError> {
    let len = heap::json_len(&arguments);
    let held = heap::string(len).saturating_add(heap::json(&arguments));
    let charge = budget.charge(ACTION, held).map_err(|_| {
        ToolCallError::Invalid(format!(
            "the arguments ({len} bytes as JSON) do not fit the task's host memory budget of {} bytes (limits.host_memory_bytes)",
            budget.limit()
        ))
    })?;
    let arguments = match arguments {
        Value::Object(arguments) => arguments,
        other => return Err(ToolCallError::Failed(call::not_an_object(&other))),
    };
    let text = serde_json::to_vec(&arguments).expect("JSON values always serialise");
    Ok((arguments, text, charge))
}
