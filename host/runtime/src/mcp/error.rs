//! Tool-call failures as the structured error JSON guests and models see, and the one way
//! a transport fails a single request with one of them.
//!
//! A transport that cannot deliver an answer (too large, not JSON-RPC, a flooding server)
//! still knows which request it answered. It fails that request alone by handing rmcp a
//! JSON-RPC error for its id made by [`host_error`]; the pool turns it back into the
//! [`McpError`] with [`from_host_error`]. The error carries a random per-process mark in
//! its `data`, so a server cannot forge one: its own errors stay `tool_exec_failed`.

use std::sync::OnceLock;

use rmcp::model::{ErrorCode, ErrorData};
use serde_json::{Value, json};

use crate::observe::ToolOutcome;

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
    const ALL: [Self; 6] = [
        Self::Unavailable,
        Self::Timeout,
        Self::InvalidArguments,
        Self::PolicyDenied,
        Self::OutputTooLarge,
        Self::ToolExecFailed,
    ];

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

/// How observers see a call the host or server failed with this code.
impl From<McpErrorCode> for ToolOutcome {
    fn from(code: McpErrorCode) -> Self {
        match code {
            McpErrorCode::Timeout => ToolOutcome::Timeout,
            code => ToolOutcome::Failed(code.as_str()),
        }
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

/// The `data.quiver` mark of [`host_error`]: random per process, never sent anywhere.
fn host_mark() -> u64 {
    static MARK: OnceLock<u64> = OnceLock::new();
    *MARK.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS; that is all the randomness a mark needs.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(u64::from(std::process::id()));
        hasher.finish()
    })
}

/// The JSON-RPC error a transport hands rmcp to fail one request with `error`.
pub(crate) fn host_error(error: &McpError) -> ErrorData {
    ErrorData::new(
        ErrorCode::INTERNAL_ERROR,
        error.message.clone(),
        Some(json!({"quiver": host_mark(), "code": error.code.as_str()})),
    )
}

/// The [`McpError`] a [`host_error`] carries; `None` for any error a server sent.
pub(crate) fn from_host_error(data: &ErrorData) -> Option<McpError> {
    let extra = data.data.as_ref()?;
    if extra.get("quiver")?.as_u64()? != host_mark() {
        return None;
    }
    let code = McpErrorCode::ALL
        .into_iter()
        .find(|code| Some(code.as_str()) == extra.get("code").and_then(Value::as_str))?;
    Some(McpError::new(code, data.message.clone()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_host_can_make_a_host_error() {
        let error = McpError::new(McpErrorCode::OutputTooLarge, "too big");
        let data = host_error(&error);
        assert_eq!(from_host_error(&data), Some(error));

        let mut forged = data.clone();
        forged.data =
            Some(json!({"quiver": host_mark().wrapping_add(1), "code": "mcp_output_too_large"}));
        assert_eq!(from_host_error(&forged), None);
        forged.data = Some(json!({"quiver": "x", "code": "mcp_timeout"}));
        assert_eq!(from_host_error(&forged), None);
        forged.data = None;
        assert_eq!(from_host_error(&forged), None);
    }
}
