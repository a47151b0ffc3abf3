//! GET_METRICS: what one `cchat_send` cost.

use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ToolCallCounts {
    pub(crate) guest: u32,
    pub(crate) mcp: u32,
    pub(crate) unknown: u32,
    pub(crate) denied: u32,
    pub(crate) failed: u32,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) total: u64,
    pub(crate) llm: u64,
    pub(crate) tools: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Metrics {
    pub(crate) iterations: u32,
    pub(crate) llm_requests: u32,
    pub(crate) llm_retries: u32,
    pub(crate) llm_errors: u32,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) total_tokens: u64,
    pub(crate) tool_calls: ToolCallCounts,
    pub(crate) latency_ms: Latency,
}

impl Metrics {
    /// Adds an upstream `usage` object.
    pub(crate) fn add_usage(&mut self, usage: &Value) {
        let get = |key: &str| usage[key].as_u64().unwrap_or(0);
        self.prompt_tokens += get("prompt_tokens");
        self.completion_tokens += get("completion_tokens");
        self.total_tokens += get("total_tokens");
    }
}
