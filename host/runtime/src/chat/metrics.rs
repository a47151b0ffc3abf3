//! GET_METRICS: what one `cchat_send` cost.

use serde::Serialize;

use super::wire::Usage;

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
    /// Adds an upstream `usage`; counts saturate rather than wrap.
    pub(crate) fn add_usage(&mut self, usage: &Usage) {
        let add = |total: &mut u64, n: Option<u64>| *total = total.saturating_add(n.unwrap_or(0));
        add(&mut self.prompt_tokens, usage.prompt_tokens);
        add(&mut self.completion_tokens, usage.completion_tokens);
        add(&mut self.total_tokens, usage.total_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_saturates_instead_of_overflowing() {
        let mut metrics = Metrics::default();
        let huge = Usage {
            prompt_tokens: Some(u64::MAX - 1),
            completion_tokens: None,
            total_tokens: Some(u64::MAX),
            ..Usage::default()
        };
        metrics.add_usage(&huge);
        metrics.add_usage(&huge);
        assert_eq!(metrics.prompt_tokens, u64::MAX);
        assert_eq!(metrics.completion_tokens, 0);
        assert_eq!(metrics.total_tokens, u64::MAX);
    }
}
