//! LLM failures as the structured `error` object of a chat response.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Cause;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// `message` is the transport error with its causes; `source` is that error.
    #[error("cannot reach the LLM backend `{backend}`: {message}")]
    Unavailable {
        backend: String,
        message: String,
        #[source]
        source: Cause,
    },
    #[error("the LLM backend `{backend}` did not answer within {} ms", timeout.as_millis())]
    Timeout { backend: String, timeout: Duration },
    #[error("the LLM backend `{backend}` answered HTTP {status}: {body}")]
    Http {
        backend: String,
        status: u16,
        body: String,
    },
    /// `source` is the parse error, when the response was not a chat completion.
    #[error("the LLM backend `{backend}` sent an invalid response: {message}")]
    InvalidResponse {
        backend: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error(
        "the LLM backend `{backend}` sent a response larger than {limit} bytes, the most the host reads"
    )]
    ResponseTooLarge { backend: String, limit: usize },
    /// The answer (as read, or as parsed) is more than the caller's host memory budget
    /// has left.
    #[error(
        "the answer of the LLM backend `{backend}` does not fit the task's host memory budget (limits.host_memory_bytes)"
    )]
    AnswerOverBudget { backend: String },
    /// The session holds what the backend's API cannot be sent (a tool schema Gemini cannot
    /// express, a model name that cannot be part of a URL); nothing was sent.
    #[error("cannot send this request to the LLM backend `{backend}`: {message}")]
    InvalidRequest { backend: String, message: String },
    #[error("no LLM backend named `{name}` (configured: {})", known.join(", "))]
    BackendUnknown { name: String, known: Vec<String> },
}

impl LlmError {
    pub fn code(&self) -> &'static str {
        match self {
            LlmError::Unavailable { .. } => "llm_unavailable",
            LlmError::Timeout { .. } => "llm_timeout",
            LlmError::Http { .. } => "llm_http_error",
            LlmError::InvalidResponse { .. } => "llm_invalid_response",
            LlmError::ResponseTooLarge { .. } => "llm_response_too_large",
            LlmError::AnswerOverBudget { .. } => "host_memory_exhausted",
            LlmError::InvalidRequest { .. } => "llm_invalid_request",
            LlmError::BackendUnknown { .. } => "backend_unknown",
        }
    }

    /// `{"code", "message", ...}` for a chat response's `error` field.
    pub fn to_json(&self) -> Value {
        let mut error = json!({"code": self.code(), "message": self.to_string()});
        if let LlmError::Http { status, .. } = self {
            error["status"] = json!(status);
        }
        error
    }
}
