//! One task's chat state, and what the `cchat_*` fds hold.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::llm::Backends;
use super::{GuestTool, SessionMcp, Settings};
use crate::mcp::McpView;
use crate::policy::TaskMcpPolicy;
use crate::sandbox::FdKindOf;

/// Roles `cchat_write_msg` accepts.
pub(crate) const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The chat side of one task: the host's LLM backends. (Its MCP side is the task's
/// [`McpTask`](crate::mcp::McpTask), which chat asks for tools.)
pub struct ChatTask {
    pub backends: Arc<Backends>,
}

/// Store data through which the `cchat_*` hostcalls reach their task state and fds.
pub trait ChatView: McpView<Fd: FdKindOf<ChatSession> + FdKindOf<ChatResponse>> {
    fn chat(&self) -> &Arc<ChatTask>;
}

/// One chat session (`cchat_create`).
#[derive(Clone, Debug)]
pub struct ChatSession {
    pub(crate) messages: Vec<Value>,
    /// Params forwarded upstream as given.
    pub(crate) upstream: Map<String, Value>,
    pub(crate) settings: Settings,
    pub(crate) mcp: SessionMcp,
    pub(crate) guest_tools: Vec<GuestTool>,
}

impl ChatSession {
    /// A session starting from the task's MCP defaults.
    pub(crate) fn new(task: &TaskMcpPolicy) -> Self {
        Self {
            messages: Vec::new(),
            upstream: Map::new(),
            settings: Settings::default(),
            mcp: SessionMcp::from_task(task),
            guest_tools: Vec::new(),
        }
    }

    /// Registers (or replaces) a guest tool.
    pub(crate) fn add_guest_tool(&mut self, tool: GuestTool) {
        match self.guest_tools.iter_mut().find(|t| t.name == tool.name) {
            Some(existing) => *existing = tool,
            None => self.guest_tools.push(tool),
        }
    }
}

/// The answer to one `cchat_send` (a response fd).
#[derive(Clone, Debug)]
pub struct ChatResponse {
    pub(crate) body: Vec<u8>,
    pub(crate) metrics: Vec<u8>,
}
