//! The one path of an MCP tool call, whoever makes it: a guest's `mcp_call_tool` (once its
//! glue has read the fd, the name and the arguments), the chat loop running a tool the
//! model asked for (its tool set made the [`check`] when it was built), and a library's
//! [`Host::call_tool`](crate::Host::call_tool) (once it has the task's grant for the
//! server). They go through [`check`] and then [`run`], and nothing else reaches the pool's
//! `tools/call`, so a call is denied, held, observed and audited the same way whichever
//! caller made it; only the [`Origin`] in its events differs.
//!
//! [`check`] is the policy decision ([`Grant::check_call`]: every layer's tool filter, then
//! whether the approval policy makes the call wait); a denial is logged and reported to the
//! observers. [`run`] first holds the tool's listed definition to the record's pins
//! (`check_pin`), whoever calls. [`run`] asks the host's approver when the decision says so, reports the call
//! to the observers before it is sent and once when it ends, and sends it through the pool
//! (its server's and the host's permits, `tool_timeout_ms`, egress, the output cap), never
//! past the task's deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use rmcp::model::JsonObject;
use serde_json::Value;
use tracing::Instrument;

use super::guest_answers::ToGuest;
use super::input::Asker;
use super::pool::ToolCallOutput;
use super::session::McpTask;
use super::{McpError, McpErrorCode};
use crate::approval::{AskFor, Refusal};
use crate::defaults;
use crate::observe::{ArgumentsSummary, PolicyDenial, ToolCall, ToolKind, ToolOutcome, Via};
use crate::policy::{Approval, Denial, Grant, Reason, check_definition};
use crate::registry::ServerEntry;
use crate::sandbox::{Deadline, DeadlineExceeded, off_stack};
use crate::text::cut;

/// What observers see as the `action` of a refused direct tool call, from a guest or a
/// library alike (`via` tells them apart).
pub(crate) const ACTION: &str = "mcp_call_tool";

/// Whose call it is: the task it acts for, where it came from, and when it must end.
#[derive(Clone, Debug)]
pub(crate) struct Origin {
    pub(crate) task_id: Arc<str>,
    /// The guest's MCP session fd; `None` for a library call.
    pub(crate) session_fd: Option<i32>,
    pub(crate) via: Via,
    pub(crate) deadline: Deadline,
    /// Where the server's questions go when the guest answers them itself.
    pub(crate) to_guest: Option<ToGuest>,
}

impl Origin {
    /// Who answers what a server asks during this caller's requests: the task.
    pub(crate) fn asker(&self, mcp: &McpTask) -> Asker {
        Asker {
            task_id: self.task_id.clone(),
            observers: mcp.observers.clone(),
            approvals: mcp.approvals.clone(),
            sampler: mcp.sampler.clone(),
            session_fd: self.session_fd,
            via: self.via,
            deadline: self.deadline,
            to_guest: self.to_guest.clone(),
            roots: mcp.roots.clone(),
        }
    }

    /// The hostcall a refused call is reported under: the chat loop's calls belong to the
    /// guest's `cchat_send`.
    fn action(&self) -> &'static str {
        match self.via {
            Via::Chat => "cchat_send",
            Via::McpCall | Via::Library => ACTION,
        }
    }

    /// Logs a refused call of `tool` of `server_id` and reports it to the observers (and so
    /// to the metrics and the audit log).
    pub(crate) fn report_denial(
        &self,
        mcp: &McpTask,
        (server_id, tool): (&str, &str),
        reason: Reason,
        detail: String,
    ) {
        let (task_id, via, action) = (&self.task_id, self.via, self.action());
        tracing::info!(task_id = %task_id, action, ?via, server_id, tool, ?reason, %detail, "denied by policy");
        mcp.observers.policy_denied(&PolicyDenial {
            task_id: task_id.clone(),
            // Set by the observers from the task's.
            principal: None,
            client: None,
            session_fd: self.session_fd,
            action,
            via: Some(via),
            // Callers refuse longer names first; cut anyway, it goes into every observer.
            server_id: cut(server_id, defaults::MAX_SERVER_ID_BYTES).to_owned(),
            tool: Some(cut(tool, defaults::MAX_TOOL_NAME_BYTES).to_owned()),
            reason,
            detail,
            at: SystemTime::now(),
        });
    }
}

/// The one decision on calling `tool` under `grant`: every layer's tool filter, then
/// whether the server's approval policy makes the call wait. A denial is reported.
pub(crate) fn check(
    mcp: &McpTask,
    origin: &Origin,
    grant: &Grant,
    tool: &str,
) -> Result<Approval, Denial> {
    grant.check_call(tool).inspect_err(|denial| {
        let server_id = grant.entry.server_id();
        origin.report_denial(mcp, (server_id, tool), denial.reason(), denial.to_string());
    })
}

/// How a call that [`check`] let through ended.
pub(crate) enum Ended {
    /// The server answered; its result may be an `isError` one.
    Answered(ToolCallOutput),
    /// The pool or the server failed the call; `json` is its error object, what a guest
    /// receives.
    Failed { error: McpError, json: Vec<u8> },
    /// The call needed approval and did not get it (reported to the observers); nothing
    /// was sent.
    Refused(Refusal),
}

/// Runs a call [`check`] let through with `approval`: `arguments` is the object sent,
/// `raw` its JSON text as the caller gave it (for the observers: its size, and its values
/// where the record opts in). `Err` when the task's deadline passed first; a call dropped
/// unfinished is reported to the observers as cancelled.
pub(crate) async fn run(
    mcp: &McpTask,
    origin: &Origin,
    entry: &Arc<ServerEntry>,
    tool: &str,
    approval: Approval,
    arguments: JsonObject,
    raw: &[u8],
) -> Result<Ended, DeadlineExceeded> {
    let server_id = entry.server_id();
    if let Err(refusal) = before(origin.deadline, off_stack(|| check_pin(mcp, entry, tool))).await?
    {
        let detail = refusal.detail.clone();
        origin.report_denial(mcp, (server_id, tool), refusal.reason, detail);
        return Ok(Ended::Refused(refusal));
    }
    let summary = ArgumentsSummary::of_object(&arguments, raw.len() as u64);
    if let Approval::Needed(policy) = approval {
        // The gate ends the wait at the task's deadline itself, so the refusal is reported
        // below before the deadline ends the call.
        let asked = off_stack(|| {
            mcp.approvals.ask(AskFor {
                task_id: &origin.task_id,
                observers: &mcp.observers,
                session_fd: origin.session_fd,
                via: origin.via,
                entry,
                tool,
                arguments: summary.clone(),
                policy,
                task_deadline: origin.deadline,
            })
        });
        let span = tracing::info_span!(
            "approval_wait",
            quiver.server.id = server_id,
            gen_ai.tool.name = tool,
            quiver.approval.decision = tracing::field::Empty,
        );
        let asked = before(origin.deadline, asked)
            .instrument(span.clone())
            .await?;
        span.record(
            "quiver.approval.decision",
            if asked.is_ok() { "approved" } else { "refused" },
        );
        if let Err(refusal) = asked {
            let detail = refusal.detail.clone();
            origin.report_denial(mcp, (server_id, tool), refusal.reason, detail);
            return Ok(Ended::Refused(refusal));
        }
    }
    let observed = mcp.observers.start(ToolCall {
        task_id: origin.task_id.clone(),
        // Set by the observers from the task's.
        principal: None,
        client: None,
        session_fd: origin.session_fd,
        via: origin.via,
        kind: ToolKind::Mcp {
            server_id: server_id.to_owned(),
        },
        tool: tool.to_owned(),
        arguments: summary,
        argument_values: std::str::from_utf8(raw)
            .ok()
            .and_then(|text| ToolCall::audited_arguments(entry, text)),
        started_at: SystemTime::now(),
    });
    // Off the stack, as every large future of the call path is (see `off_stack`).
    let asker = origin.asker(mcp);
    let called = off_stack(|| {
        mcp.pool
            .call_tool(entry, tool, arguments, mcp.principal(), &asker)
    });
    let (ended, outcome, output_bytes) = match before(origin.deadline, called).await? {
        Ok(output) => {
            let outcome = match output.result.is_error {
                Some(true) => ToolOutcome::ToolError,
                _ => ToolOutcome::Ok,
            };
            let bytes = output.json.len();
            (Ended::Answered(output), outcome, bytes)
        }
        Err(error) => {
            tracing::info!(task_id = %origin.task_id, server_id, name = tool, method = "tools/call", %error, "request failed");
            let json = serde_json::to_vec(&error.to_json())
                .expect("host-built JSON values always serialise");
            let (outcome, bytes) = (ToolOutcome::from(error.code), json.len());
            (Ended::Failed { error, json }, outcome, bytes)
        }
    };
    observed.finish(outcome, output_bytes as u64);
    Ok(ended)
}

/// Whether `tool`'s definition as the server lists it now (the pool's cached `tools/list`,
/// fetched if the host has none) matches the record's pins. Checked on every call, so a
/// call of a tool the host never listed, or one that changed since it was offered, is
/// refused; a listing that fails refuses the call too. Records without pins skip it.
async fn check_pin(mcp: &McpTask, entry: &Arc<ServerEntry>, tool: &str) -> Result<(), Refusal> {
    let record = &entry.record;
    if !record.pins_apply() {
        return Ok(());
    }
    let listed = mcp
        .pool
        .list_tools(entry, mcp.principal())
        .await
        .map_err(|error| Refusal {
            reason: Reason::ListFailed,
            detail: format!(
                "the registry pins this server's tools and its tool list could not be read to check them: {error}"
            ),
        })?;
    let definition = listed.iter().find(|t| t.name == tool);
    check_definition(record, tool, definition).map_err(|denial| Refusal {
        reason: denial.reason(),
        detail: denial.to_string(),
    })
}

/// The `mcp_policy_denied` error of a call of `tool` of `server_id` the approver refused.
pub(crate) fn refused(server_id: &str, tool: &str, refusal: &Refusal) -> McpError {
    McpError::new(
        McpErrorCode::PolicyDenied,
        format!("tool `{tool}` on server `{server_id}`: {}", refusal.detail),
    )
}

/// The `mcp_invalid_arguments` error of arguments that are not a JSON object, as a server
/// would answer them.
pub(crate) fn not_an_object(arguments: &Value) -> McpError {
    let kind = match arguments {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    McpError::new(
        McpErrorCode::InvalidArguments,
        format!("tool arguments must be a JSON object, got {kind}"),
    )
}

/// `work`, unless `deadline` passes first.
async fn before<F: Future>(deadline: Deadline, work: F) -> Result<F::Output, DeadlineExceeded> {
    tokio::time::timeout_at(deadline.instant(), work)
        .await
        .map_err(|_| deadline.exceeded())
}
