//! How a request failed: where it was when it did (which decides whether the server's
//! health hears of it) and the [`McpError`] it becomes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::ErrorCode;

use crate::mcp::error::from_host_error;
use crate::mcp::{McpError, McpErrorCode};

/// Where a call is, so a failure counts against the server's health only when it happened
/// on the wire: not while waiting for a permit, and not when the server answered that it
/// has no such tool or method.
pub(super) struct CallPhase(AtomicU8);

impl CallPhase {
    pub(super) const WAITING_FOR_SERVER: u8 = 0;
    pub(super) const WAITING_FOR_HOST: u8 = 1;
    pub(super) const ON_WIRE: u8 = 2;
    /// The server answered with an error that says nothing of its health.
    pub(super) const ANSWERED: u8 = 3;

    pub(super) fn new(phase: u8) -> Self {
        Self(AtomicU8::new(phase))
    }

    pub(super) fn set(&self, phase: u8) {
        self.0.store(phase, Ordering::SeqCst);
    }

    pub(super) fn get(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }

    pub(super) fn on_wire(&self) -> bool {
        self.get() == Self::ON_WIRE
    }
}

/// Whether an error of `code` is the server's (or its transport's) failure, as health
/// counts it; bad arguments, a policy refusal or a result over the host's cap are not.
pub(super) fn server_failure(code: McpErrorCode) -> bool {
    matches!(
        code,
        McpErrorCode::Unavailable | McpErrorCode::Timeout | McpErrorCode::ToolExecFailed
    )
}

pub(super) fn timed_out(server_id: &str, what: &str, timeout: Duration) -> McpError {
    McpError::new(
        McpErrorCode::Timeout,
        format!(
            "server `{server_id}` did not answer {what} within {} ms (budgets.tool_timeout_ms)",
            timeout.as_millis()
        ),
    )
}

/// `error` as the guest sees it; a JSON-RPC "method not found" (an unknown tool, on some
/// servers) marks `phase` answered, as no failure of the server's.
pub(super) fn service_failed(
    server_id: &str,
    what: &str,
    error: ServiceError,
    phase: &CallPhase,
) -> McpError {
    if let ServiceError::McpError(data) = &error
        && data.code == ErrorCode::METHOD_NOT_FOUND
    {
        phase.set(CallPhase::ANSWERED);
    }
    match error {
        // A transport failed this request itself and said why.
        ServiceError::McpError(data) if let Some(error) = from_host_error(&data) => error,
        ServiceError::McpError(data) if data.code == ErrorCode::INVALID_PARAMS => McpError::new(
            McpErrorCode::InvalidArguments,
            format!("server `{server_id}` rejected {what}: {}", data.message),
        ),
        ServiceError::McpError(data) => McpError::new(
            McpErrorCode::ToolExecFailed,
            format!(
                "server `{server_id}` failed {what}: {} (code {})",
                data.message, data.code.0
            ),
        ),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => McpError::new(
            McpErrorCode::Unavailable,
            format!("server `{server_id}` went away during {what}; the next call restarts it"),
        ),
        ServiceError::Timeout { timeout } => timed_out(server_id, what, timeout),
        other => McpError::new(
            McpErrorCode::ToolExecFailed,
            format!("server `{server_id}` failed {what}: {other}"),
        ),
    }
}
