//! What one task's MCP use is bound by, and what one `mcp_open` fd holds.

use std::sync::Arc;

use quiver_abi::Errno;

use super::McpPool;
use crate::policy::{self, Grant, Reason, SessionRequest, TaskMcpPolicy};
use crate::registry::Registry;
use crate::sandbox::{FdKindOf, SandboxView};

/// The MCP side of one task: its policy layer, the registry snapshot it started with, and
/// the host's pool. Fixed for the whole run.
pub struct McpTask {
    pub policy: TaskMcpPolicy,
    pub registry: Arc<Registry>,
    pub pool: Arc<McpPool>,
}

/// Store data through which the `mcp_*` hostcalls reach their task state and fds.
pub trait McpView: SandboxView<Fd: FdKindOf<McpSession>> {
    fn mcp(&self) -> &Arc<McpTask>;
}

impl McpTask {
    /// The one decision of `mcp_open` and the registry views: may this task use
    /// `server_id`, and with which tool filter? Unknown `-ENOENT`, a required env variable
    /// missing `-ENOTCONN`, anything else `-EACCES`; every denial is logged with its reason.
    pub fn decide_server(
        &self,
        task_id: &str,
        hostcall: &str,
        server_id: &str,
    ) -> Result<Grant, Errno> {
        let requested = [server_id.to_owned()];
        let effective = policy::effective(
            &self.registry,
            &self.policy,
            &SessionRequest::single(&requested),
        );
        if let Some(grant) = effective.grant(server_id) {
            return Ok(grant.clone());
        }
        let Some(decision) = effective.decision(server_id) else {
            return Err(Errno::EACCES);
        };
        tracing::info!(task_id, hostcall, server_id, reason = ?decision.reason, detail = %decision.detail, "denied by policy");
        Err(match decision.reason {
            Reason::UnknownServer => Errno::ENOENT,
            Reason::EnvMissing => Errno::ENOTCONN,
            _ => Errno::EACCES,
        })
    }
}

/// Identifies a request whose output did not fit the guest's buffer, so that the retry
/// with a bigger buffer gets the same bytes instead of running the work again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PendingKey {
    ListTools,
    CallTool { name: String, args: Vec<u8> },
}

/// One `mcp_open` fd: the server granted (registry ∩ task, fixed at open) and the output
/// kept for a retry.
pub struct McpSession {
    pub(crate) grant: Grant,
    pending: Option<(PendingKey, Vec<u8>)>,
}

impl McpSession {
    pub(crate) fn new(grant: Grant) -> Self {
        Self {
            grant,
            pending: None,
        }
    }

    /// The kept output of `key`, if the last request on this fd was the same one.
    pub(crate) fn pending_output(&self, key: &PendingKey) -> Option<&[u8]> {
        match &self.pending {
            Some((k, bytes)) if k == key => Some(bytes),
            _ => None,
        }
    }

    pub(crate) fn keep_output(&mut self, key: PendingKey, bytes: Vec<u8>) {
        self.pending = Some((key, bytes));
    }

    pub(crate) fn clear_output(&mut self) {
        self.pending = None;
    }
}
