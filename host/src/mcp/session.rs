//! What one `mcp_open` fd holds.

use std::sync::Arc;

use crate::policy::ToolFilter;
use crate::registry::ServerEntry;

/// Identifies a request whose output did not fit the guest's buffer, so that the retry
/// with a bigger buffer gets the same bytes instead of running the work again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PendingKey {
    ListTools,
    CallTool { name: String, args: Vec<u8> },
}

pub(crate) struct McpSession {
    pub(crate) server: Arc<ServerEntry>,
    /// Registry ∩ task tool filter, fixed when the fd was opened.
    pub(crate) filter: ToolFilter,
    pending: Option<(PendingKey, Vec<u8>)>,
}

impl McpSession {
    pub(crate) fn new(server: Arc<ServerEntry>, filter: ToolFilter) -> Self {
        Self {
            server,
            filter,
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

    #[cfg(test)]
    pub(crate) fn detached_for_tests() -> Self {
        use crate::registry::{ApprovalPolicy, Budgets, ServerRecord, Transport};
        let record = ServerRecord {
            server_id: "test".into(),
            display_name: "test".into(),
            transport: Transport::Stdio,
            stdio: None,
            http: None,
            tool_namespace: "mcp.test".into(),
            allowed_tools: vec![],
            approval_policy: ApprovalPolicy::Never,
            budgets: Budgets {
                tool_timeout: crate::defaults::TOOL_TIMEOUT,
                max_concurrency: 1,
                max_tool_output_bytes: 1,
            },
            tags: vec![],
            lifecycle: Default::default(),
        };
        let filter = ToolFilter::new(&[], &Default::default());
        let server = ServerEntry {
            record,
            source: "test".into(),
            launch: Err("test".into()),
        };
        Self::new(Arc::new(server), filter)
    }
}
