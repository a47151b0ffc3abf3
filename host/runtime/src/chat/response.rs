//! The body `cchat_send` hands back: the model's answer (its `choices` first) or the
//! error that ended the send, then `_spear`, SPEAR's keys and a short summary of what the
//! send did. The key order is part of the ABI: SPEAR's C samples read it through a small
//! buffer.

use serde_json::{Value, json};

use super::Metrics;
use super::llm::LlmError;
use super::tools::ToolSet;
use super::wire::ChatCompletion;
use crate::policy::Decision;

/// Why a send ended without an answer: the `error` of the response.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error("the model still wanted tools when the {limit} limit ({value}) was reached")]
    ToolCallLimit {
        limit: &'static str,
        value: u32,
        last_response: Box<ChatCompletion>,
    },
    /// The answer asking for tools was cut off by the model's output limit, so its tool
    /// calls (their arguments above all) may be incomplete: none is run.
    #[error(
        "the model's answer was cut off by its output token limit (finish_reason \"length\") while it asked for tools; they were not run (raise max_tokens)"
    )]
    ToolCallsTruncated { last_response: Box<ChatCompletion> },
}

impl SendError {
    pub(super) fn limit(limit: &'static str, value: u32, last: ChatCompletion) -> Self {
        Self::ToolCallLimit {
            limit,
            value,
            last_response: Box::new(last),
        }
    }

    /// `{"error": {...}, "last_response"?: {...}, "_spear": spear}`: `last_response` (a limit's
    /// last model answer, with its `choices`) before `_spear`, as in an answer.
    fn into_body(self, spear: &Spear<'_>) -> Vec<u8> {
        match self {
            SendError::Llm(error) => encode(&FailureBody {
                error: error.to_json(),
                last_response: None,
                spear,
            }),
            SendError::ToolCallLimit {
                limit,
                value,
                ref last_response,
            } => {
                let error = json!({
                    "code": "tool_call_limit",
                    "message": self.to_string(),
                    "limit": limit,
                    "value": value,
                });
                encode(&FailureBody {
                    error,
                    last_response: Some(last_response),
                    spear,
                })
            }
            SendError::ToolCallsTruncated { ref last_response } => {
                let error = json!({
                    "code": "tool_calls_truncated",
                    "message": self.to_string(),
                    "finish_reason": "length",
                });
                encode(&FailureBody {
                    error,
                    last_response: Some(last_response),
                    spear,
                })
            }
        }
    }
}

/// `_spear`, written in this order: SPEAR's own keys (`backend`, `model`) first, then a short
/// summary. SPEAR's C samples print a response through a 1 KiB buffer and look for
/// `"_spear"` then `"backend":"`, so it stays small and after `choices`.
#[derive(serde::Serialize)]
pub(super) struct Spear<'a> {
    backend: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    iterations: u32,
    /// Absent when no backend was found.
    #[serde(flatten)]
    summary: Option<Summary<'a>>,
}

/// What a send did, after `_spear`'s SPEAR keys.
#[derive(serde::Serialize)]
struct Summary<'a> {
    usage: SpearUsage,
    tool_call_count: usize,
    tool_calls_ok: usize,
    tool_calls: &'a [ToolCallSummary],
    mcp: SpearMcp<'a>,
}

/// `servers`, and the decision log when the session asked for it.
#[derive(serde::Serialize)]
struct SpearMcp<'a> {
    servers: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    decisions: Option<&'a [Decision]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decisions_omitted: Option<usize>,
}

/// One tool call of a send, run or refused, as `_spear.tool_calls` lists it.
#[derive(serde::Serialize)]
pub(super) struct ToolCallSummary {
    id: String,
    name: String,
    /// `guest`, `mcp`, or why it was refused (`denied`, `unknown`).
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool: Option<String>,
    /// How long it ran; absent for a refused call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ms: Option<u64>,
    ok: bool,
    /// The failure's code, when it ran and failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<&'static str>,
}

impl ToolCallSummary {
    pub(super) fn new(id: &str, name: &str, kind: &'static str, ok: bool) -> Self {
        Self {
            id: id.to_owned(),
            name: name.to_owned(),
            kind,
            server_id: None,
            tool: None,
            ms: None,
            ok,
            error: None,
        }
    }
}

/// Usage summed over a send's requests.
#[derive(serde::Serialize)]
struct SpearUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

/// A successful response: the upstream completion (`choices` first), then `_spear`.
#[derive(serde::Serialize)]
struct AnswerBody<'a> {
    #[serde(flatten)]
    completion: &'a ChatCompletion,
    #[serde(rename = "_spear")]
    spear: &'a Spear<'a>,
}

/// A failed response, in this key order.
#[derive(serde::Serialize)]
struct FailureBody<'a> {
    error: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_response: Option<&'a ChatCompletion>,
    #[serde(rename = "_spear")]
    spear: &'a Spear<'a>,
}

/// Decision-log entries copied into `_spear` with `mcp.decision_log` (the rest are
/// counted; all are logged).
const MAX_DECISIONS_SHOWN: usize = 100;

/// The body of a send whose session names no configured backend.
pub(super) fn no_backend(backend: Option<&str>, error: &LlmError) -> Vec<u8> {
    let spear = Spear {
        backend,
        model: None,
        iterations: 0,
        summary: None,
    };
    encode(&FailureBody {
        error: error.to_json(),
        last_response: None,
        spear: &spear,
    })
}

/// `_spear` for a send that reached `backend`.
pub(super) fn spear<'a>(
    backend: &'a str,
    model: &'a str,
    metrics: &Metrics,
    summary: &'a [ToolCallSummary],
    tools: &'a ToolSet<'_>,
    decision_log: bool,
) -> Spear<'a> {
    let decisions = tools.decisions();
    let shown = &decisions[..decisions.len().min(MAX_DECISIONS_SHOWN)];
    let mcp = SpearMcp {
        servers: tools.servers(),
        decisions: decision_log.then_some(shown),
        decisions_omitted: decision_log.then(|| decisions.len() - shown.len()),
    };
    Spear {
        backend: Some(backend),
        model: Some(model),
        iterations: metrics.iterations,
        summary: Some(Summary {
            usage: SpearUsage {
                prompt_tokens: metrics.prompt_tokens,
                completion_tokens: metrics.completion_tokens,
                total_tokens: metrics.total_tokens,
            },
            tool_call_count: summary.len(),
            tool_calls_ok: summary.iter().filter(|call| call.ok).count(),
            tool_calls: summary,
            mcp,
        }),
    }
}

/// The response body: the upstream completion as it came plus `_spear` (replacing any
/// upstream one), or the error with `_spear`.
pub(super) fn body(outcome: Result<ChatCompletion, SendError>, spear: &Spear<'_>) -> Vec<u8> {
    match outcome {
        Ok(mut completion) => {
            completion.rest.remove("_spear");
            encode(&AnswerBody {
                completion: &completion,
                spear,
            })
        }
        Err(error) => error.into_body(spear),
    }
}

/// `value` as JSON in a buffer of exactly its length (a response body is kept, and charged,
/// until the guest closes it; a grown buffer would hold up to twice that). One pass, then
/// the spare room is given back (a shrink the allocator does in place).
fn encode(value: &impl serde::Serialize) -> Vec<u8> {
    match serde_json::to_vec(value) {
        Ok(mut bytes) => {
            bytes.shrink_to_fit();
            bytes
        }
        Err(_) => Vec::new(),
    }
}
