//! Chat completion sessions and the host-side tool-call loop.
//!
//! A session holds what a guest built with `cchat_*`: messages, params (some consumed by
//! the host, the rest forwarded upstream), its own tools and its MCP settings, which can
//! only narrow the task's. `cchat_send` runs [`run::send`]: it builds the tool set once
//! (guest tools plus the MCP tools the session may use, from the pool's cache), asks the
//! backend, runs the tool calls the model makes through the session's own name map, and
//! loops until the model answers or a budget is hit. Guest tools are called through a
//! [`GuestTools`] implementation the ABI layer provides, so this module never touches
//! wasm.

mod metrics;
mod params;
pub(crate) mod run;
pub(crate) mod tools;

pub(crate) use metrics::Metrics;
pub(crate) use params::{ParamError, SessionMcp, Settings};
pub(crate) use run::{GuestTools, SendContext};
pub(crate) use tools::GuestTool;

use serde_json::{Map, Value};

use crate::policy::TaskMcpPolicy;

/// Roles `cchat_write_msg` accepts.
pub(crate) const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// One chat session (`cchat_create`).
#[derive(Clone, Debug)]
pub(crate) struct ChatSession {
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
pub(crate) struct ChatResponse {
    pub(crate) body: Vec<u8>,
    pub(crate) metrics: Vec<u8>,
}
