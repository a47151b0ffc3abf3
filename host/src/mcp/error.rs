//! Tool-call failures as the structured error JSON guests and models see.

use serde_json::{Value, json};

/// The `error.code` of a failed MCP call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McpErrorCode {
    /// The server could not be started or reached, or went away mid-call.
    Unavailable,
    /// The server did not answer within its `tool_timeout_ms`.
    Timeout,
    /// The arguments were not a JSON object, or the server rejected them.
    InvalidArguments,
    /// Policy (e.g. an approval requirement) refused the call.
    PolicyDenied,
    /// The result was larger than the server's `max_tool_output_bytes`.
    OutputTooLarge,
    /// The server answered with a protocol error other than bad arguments.
    ToolExecFailed,
}

impl McpErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "mcp_unavailable",
            Self::Timeout => "mcp_timeout",
            Self::InvalidArguments => "mcp_invalid_arguments",
            Self::PolicyDenied => "mcp_policy_denied",
            Self::OutputTooLarge => "mcp_output_too_large",
            Self::ToolExecFailed => "tool_exec_failed",
        }
    }

    /// Whether trying the same call again later may succeed.
    pub fn retryable(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout)
    }
}

/// A failed MCP call, naming the server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct McpError {
    pub code: McpErrorCode,
    pub message: String,
}

impl McpError {
    pub fn new(code: McpErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The same error with `secrets` cut out of its message.
    #[must_use]
    pub fn redacted(self, secrets: &crate::registry::Secrets) -> Self {
        match secrets.redact(&self.message) {
            std::borrow::Cow::Borrowed(_) => self,
            std::borrow::Cow::Owned(message) => Self { message, ..self },
        }
    }

    /// `{"error": {"code", "message", "retryable"}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "code": self.code.as_str(),
            "message": self.message,
            "retryable": self.code.retryable(),
        }})
    }
}

/// An error and its causes, `a: b: c`. A cause whose text is already there (our typed
/// errors show their cause and also return it as `source`) is not repeated.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
