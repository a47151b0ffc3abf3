//! Long-running tool calls as tasks (the `io.modelcontextprotocol/tasks` extension,
//! SEP-2663, MCP 2026-07-28). The host declares the extension, so a server may answer a
//! `tools/call` with a task (`resultType: "task"`) instead of its result. The host then
//! follows the task for the caller, who still sees one call with one result:
//!
//! - it polls `tasks/get`, waiting what the server's `pollIntervalMs` asks between polls,
//!   clamped to [`defaults::TASK_POLL_INTERVAL_MIN`]..[`defaults::TASK_POLL_INTERVAL_MAX`];
//! - a task that needs input (`input_required`) is answered for the caller's task by the
//!   same path as SEP-2322 rounds ([`Asker`]), with `tasks/update`; each batch of requests
//!   is a round (bounded by [`defaults::MAX_INPUT_ROUNDS`]) and a key is answered once;
//! - the final `tasks/get` (`completed`) carries the tool's result (there is no
//!   `tasks/result` in this version); `failed` and `cancelled` fail the call;
//! - the task runs within the server's `tool_timeout_ms`, counted from the call, not
//!   counting time a person takes to answer (bounded by the approval timeout and the
//!   task's deadline instead); the caller's own deadline ends it too;
//! - whenever the host stops following a task that has not ended (the timeout, the
//!   guest's call ended early or its task is gone, a failed poll, a refused input) it sends
//!   `tasks/cancel`, in the background and best effort ([`CancelOnDrop`]);
//! - each change of status or message reaches the observers (and the audit log), at most
//!   [`defaults::MAX_TASK_STATUS_REPORTS`] per task, the message cut and redacted.
//!
//! A call keeps its server's `max_concurrency` permit while its task runs (it is still a
//! call in flight on that server); each poll takes one of the host's call permits only
//! while it is on the wire.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rmcp::model::{
    CallToolResult, CancelTaskParams, CreateTaskResult, GetTaskParams, InputRequests, Task,
    TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;
use tokio::time::Instant;

use super::failure::{CallPhase, service_failed};
use super::{Connection, McpPool};
use crate::defaults;
use crate::mcp::input::{Asked, Asker};
use crate::mcp::{McpError, McpErrorCode};
use crate::observe::McpTaskStatus;
use crate::registry::ServerEntry;
use crate::text::{cut, printable};

/// The call a task runs: its server, its tool, and whom it is for.
pub(super) struct TaskCall<'a> {
    pub(super) entry: &'a Arc<ServerEntry>,
    pub(super) conn: &'a Arc<Connection>,
    pub(super) tool: &'a str,
    pub(super) asker: &'a Asker,
    /// When the call was sent: its `tool_timeout_ms` counts from there.
    pub(super) sent: Instant,
    pub(super) phase: &'a CallPhase,
}

impl McpPool {
    /// Follows the task `created` answered for `call` until it ends; its result, or why
    /// the call failed. Dropped unfinished, the task is cancelled.
    pub(super) async fn follow_task(
        &self,
        call: TaskCall<'_>,
        created: CreateTaskResult,
    ) -> Result<CallToolResult, McpError> {
        let server_id = call.entry.server_id();
        let tool = call.tool;
        let id = checked_id(server_id, tool, &created.task.task_id)?;
        let mut cancel = CancelOnDrop {
            peer: Some(call.conn.service.peer().clone()),
            runtime: tokio::runtime::Handle::current(),
            server_id: server_id.to_owned(),
            task_id: id.clone(),
        };
        let timeout = call.entry.record.budgets.tool_timeout;
        let mut until = call.sent + timeout;
        let timed_out = || {
            McpError::new(
                McpErrorCode::Timeout,
                format!(
                    "server `{server_id}` did not finish tool `{}` (its task `{}`) within {} ms (budgets.tool_timeout_ms); the host cancelled the task",
                    cut(tool, defaults::MAX_TOOL_NAME_BYTES),
                    printable(&id),
                    timeout.as_millis()
                ),
            )
        };
        let mut statuses = Statuses::new(&call, &id);
        statuses.saw(&created.task);
        let mut interval = poll_interval(created.task.poll_interval_ms);
        let mut answered = HashSet::new();
        let mut round = 0;
        let asked = Asked {
            entry: call.entry,
            method: "tools/call",
            name: tool,
        };
        loop {
            let next = Instant::now() + interval;
            if next >= until {
                tokio::time::sleep_until(until).await;
                return Err(timed_out());
            }
            tokio::time::sleep_until(next).await;
            let polled = self.on_wire(until, call.conn.service.get_task(GetTaskParams::new(&id)));
            let detailed = match polled.await {
                None => return Err(timed_out()),
                Some(polled) => {
                    polled
                        .map_err(|e| service_failed(server_id, "tasks/get", e, call.phase))?
                        .task
                }
            };
            if detailed.task.task_id != id {
                return Err(McpError::new(
                    McpErrorCode::ToolExecFailed,
                    format!(
                        "server `{server_id}` answered tasks/get for task `{}` with another task (`{}`)",
                        printable(&id),
                        printable(cut(
                            &detailed.task.task_id,
                            defaults::MAX_SERVER_TASK_ID_BYTES
                        ))
                    ),
                ));
            }
            statuses.saw(&detailed.task);
            interval = poll_interval(detailed.task.poll_interval_ms);
            let requests = match detailed.payload {
                TaskPayload::Working => continue,
                TaskPayload::InputRequired { input_requests } => input_requests,
                TaskPayload::Completed { result } => {
                    cancel.disarm();
                    return serde_json::from_value(Value::Object(result)).map_err(|e| {
                        McpError::new(
                            McpErrorCode::ToolExecFailed,
                            format!(
                                "server `{server_id}` completed its task for tool `{}` with a result that is not a tool result: {e}",
                                cut(tool, defaults::MAX_TOOL_NAME_BYTES)
                            ),
                        )
                    });
                }
                TaskPayload::Failed { error } => {
                    cancel.disarm();
                    return Err(failed(server_id, tool, &error));
                }
                TaskPayload::Cancelled => {
                    cancel.disarm();
                    return Err(McpError::new(
                        McpErrorCode::ToolExecFailed,
                        format!(
                            "server `{server_id}` cancelled its task for tool `{}`",
                            cut(tool, defaults::MAX_TOOL_NAME_BYTES)
                        ),
                    ));
                }
                _ => {
                    return Err(McpError::new(
                        McpErrorCode::ToolExecFailed,
                        format!("server `{server_id}` answered tasks/get with an unknown status"),
                    ));
                }
            };
            // Keys are unique over a task's life: one answered already is still listed
            // only until the server has taken the answer in.
            let fresh: InputRequests = requests
                .into_iter()
                .filter(|(key, _)| !answered.contains(key))
                .collect();
            if fresh.is_empty() {
                continue;
            }
            round += 1;
            if round > defaults::MAX_INPUT_ROUNDS {
                return Err(McpError::new(
                    McpErrorCode::ToolExecFailed,
                    format!(
                        "server `{server_id}` still asked for input after {} rounds of its task for tool `{}`; the host gives up and cancels it",
                        defaults::MAX_INPUT_ROUNDS,
                        cut(tool, defaults::MAX_TOOL_NAME_BYTES)
                    ),
                ));
            }
            // A person's time to answer is not the server's.
            let asking = Instant::now();
            let responses = call.asker.answer(asked, round as u32, fresh).await?;
            until += asking.elapsed();
            answered.extend(responses.keys().cloned());
            let update = call
                .conn
                .service
                .update_task(UpdateTaskParams::new(&id, responses));
            match self.on_wire(until, update).await {
                None => return Err(timed_out()),
                Some(updated) => {
                    updated.map_err(|e| service_failed(server_id, "tasks/update", e, call.phase))?
                }
            }
            // The answer usually lets the task go on at once.
            interval = defaults::TASK_POLL_INTERVAL_MIN;
        }
    }

    /// `request` within one of the host's call permits, unless `until` passes first.
    async fn on_wire<T>(
        &self,
        until: Instant,
        request: impl Future<Output = Result<T, rmcp::ServiceError>>,
    ) -> Option<Result<T, rmcp::ServiceError>> {
        let sent = async {
            let _permit = self
                .call_permit()
                .await
                .map_err(|_| rmcp::ServiceError::TransportClosed)?;
            request.await
        };
        tokio::time::timeout_at(until, sent).await.ok()
    }
}

/// The server's task id, if the host can use it.
fn checked_id(server_id: &str, tool: &str, id: &str) -> Result<String, McpError> {
    if id.is_empty() || id.len() > defaults::MAX_SERVER_TASK_ID_BYTES {
        return Err(McpError::new(
            McpErrorCode::ToolExecFailed,
            format!(
                "server `{server_id}` answered tool `{}` with a task whose id is {} bytes long; the host accepts 1 to {} bytes",
                cut(tool, defaults::MAX_TOOL_NAME_BYTES),
                id.len(),
                defaults::MAX_SERVER_TASK_ID_BYTES
            ),
        ));
    }
    Ok(id.to_owned())
}

/// The wait before the next poll: the server's suggestion, within the host's bounds.
fn poll_interval(suggested_ms: Option<u64>) -> Duration {
    suggested_ms.map_or(defaults::TASK_POLL_INTERVAL, |ms| {
        Duration::from_millis(ms).clamp(
            defaults::TASK_POLL_INTERVAL_MIN,
            defaults::TASK_POLL_INTERVAL_MAX,
        )
    })
}

/// The error of a task that ended `failed`, with the server's JSON-RPC error (cut).
fn failed(server_id: &str, tool: &str, error: &serde_json::Map<String, Value>) -> McpError {
    let message = error.get("message").and_then(Value::as_str).unwrap_or("");
    let code = error.get("code").and_then(Value::as_i64);
    McpError::new(
        McpErrorCode::ToolExecFailed,
        format!(
            "server `{server_id}` failed tool `{}` (its task failed): {} (code {})",
            cut(tool, defaults::MAX_TOOL_NAME_BYTES),
            printable(cut(message, defaults::MAX_TASK_STATUS_MESSAGE_BYTES)),
            code.map_or_else(|| "none".to_owned(), |c| c.to_string()),
        ),
    )
}

fn status_name(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        _ => "unknown",
    }
}

/// What the observers heard of one task so far.
struct Statuses<'a> {
    call: &'a TaskCall<'a>,
    id: String,
    last: Option<(&'static str, Option<String>)>,
    reported: usize,
}

impl<'a> Statuses<'a> {
    fn new(call: &'a TaskCall<'a>, id: &str) -> Self {
        Self {
            call,
            id: printable(id),
            last: None,
            reported: 0,
        }
    }

    /// Reports `task`'s status if it changed since the last one reported.
    fn saw(&mut self, task: &Task) {
        let entry = self.call.entry;
        let status = status_name(task.status);
        let message = task.status_message.as_deref().map(|message| {
            // Redacted before it is cut, so no secret straddling the cut leaves a prefix.
            let redacted = entry.secrets().redact(message);
            printable(cut(&redacted, defaults::MAX_TASK_STATUS_MESSAGE_BYTES))
        });
        let now = (status, message);
        if self.last.as_ref() == Some(&now) {
            return;
        }
        let asker = self.call.asker;
        let server_id = entry.server_id();
        tracing::debug!(task_id = %asker.task_id, server_id, server_task = %self.id, status, "server task status");
        self.last = Some(now.clone());
        if self.reported >= defaults::MAX_TASK_STATUS_REPORTS {
            return;
        }
        self.reported += 1;
        if self.reported == defaults::MAX_TASK_STATUS_REPORTS {
            tracing::info!(task_id = %asker.task_id, server_id, server_task = %self.id, "the server's task changed its status too often; later changes are not reported");
        }
        asker.observers.mcp_task_status(&McpTaskStatus {
            task_id: asker.task_id.clone(),
            // Set by the observers from the task's.
            principal: None,
            client: None,
            session_fd: asker.session_fd,
            via: asker.via,
            server_id: server_id.to_owned(),
            tool: cut(self.call.tool, defaults::MAX_TOOL_NAME_BYTES).to_owned(),
            server_task_id: self.id.clone(),
            status: now.0,
            message: now.1,
            at: SystemTime::now(),
        });
    }
}

/// Sends `tasks/cancel` for a task the host stops following before it ended, whatever
/// stops it (an error, a timeout, the call's future dropped): in the background, within
/// [`defaults::TASK_CANCEL_TIMEOUT`], best effort.
struct CancelOnDrop {
    /// `None` once the task ended.
    peer: Option<Peer<RoleClient>>,
    runtime: tokio::runtime::Handle,
    server_id: String,
    task_id: String,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.peer = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let (server_id, task_id) = (
            std::mem::take(&mut self.server_id),
            std::mem::take(&mut self.task_id),
        );
        self.runtime.spawn(async move {
            let cancel = peer.cancel_task(CancelTaskParams::new(task_id.clone()));
            let shown = printable(&task_id);
            match tokio::time::timeout(defaults::TASK_CANCEL_TIMEOUT, cancel).await {
                Ok(Ok(())) => {
                    tracing::info!(server_id, server_task = %shown, "cancelled the server's task")
                }
                Ok(Err(error)) => {
                    tracing::info!(server_id, server_task = %shown, %error, "tasks/cancel failed")
                }
                Err(_) => {
                    tracing::info!(server_id, server_task = %shown, "tasks/cancel was not answered in time")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_poll_interval_is_clamped_to_the_hosts_bounds() {
        assert_eq!(poll_interval(None), defaults::TASK_POLL_INTERVAL);
        assert_eq!(poll_interval(Some(0)), defaults::TASK_POLL_INTERVAL_MIN);
        assert_eq!(
            poll_interval(Some(u64::MAX)),
            defaults::TASK_POLL_INTERVAL_MAX
        );
        assert_eq!(poll_interval(Some(700)), Duration::from_millis(700));
    }

    #[test]
    fn task_ids_must_be_short_and_present() {
        assert!(checked_id("s", "t", "").is_err());
        let long = "x".repeat(defaults::MAX_SERVER_TASK_ID_BYTES + 1);
        assert!(checked_id("s", "t", &long).is_err());
        assert_eq!(checked_id("s", "t", "task-1").unwrap(), "task-1");
    }
}
