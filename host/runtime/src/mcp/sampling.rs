//! A server's sampling request during a task's request, whichever way it came (an
//! `input_required` input, or a 2025-era server's own `sampling/createMessage`): answered
//! by the task's [`TaskSampler`] (the chat unit's sampler) under the server's record and the task's
//! budget, logged without its text, and reported to the observers (and so to the audit log
//! and the metrics) as a [`SamplingDone`].

// rmcp marks sampling deprecated (SEP-2577), yet 2025-11-25 and 2026-07-28 servers use it.
#![allow(deprecated)]

use std::time::{Instant, SystemTime};

use futures::future::BoxFuture;
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult, ErrorCode};

use super::input::{Asked, Asker};
use super::{McpError, McpErrorCode};
use crate::defaults;
use crate::observe::SamplingDone;
use crate::registry::SamplingConfig;
use crate::sandbox::Deadline;
use crate::text::cut;

/// What answers a task's sampling requests: the chat unit's sampler, over the host's LLM
/// backends and the task's budget (mcp asks it and never speaks to a model itself).
pub(crate) trait TaskSampler: Send + Sync + std::fmt::Debug {
    /// Answers `params` of server `server_id`, whose record says `config`, before
    /// `deadline`.
    fn sample<'a>(
        &'a self,
        server_id: &'a str,
        config: &'a SamplingConfig,
        params: CreateMessageRequestParams,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<Sampled, SamplingRefused>>;
}

/// Why a sampling request was not answered: a short stable `reason` for observers and
/// metrics, and the message the server (or the guest) is told.
#[derive(Clone, Debug)]
pub(crate) struct SamplingRefused {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The backend and model asked, when it got that far.
    pub(crate) model: Option<(String, String)>,
}

impl SamplingRefused {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            model: None,
        }
    }

    /// Whether the host's policy refused it (otherwise the request or the model failed).
    pub(crate) fn is_policy(&self) -> bool {
        matches!(
            self.reason,
            "not_allowed" | "max_tokens" | "max_requests" | "task_budget" | "host_memory"
        )
    }
}

/// A request the model answered.
#[derive(Clone, Debug)]
pub(crate) struct Sampled {
    pub(crate) result: CreateMessageResult,
    pub(crate) backend: String,
    pub(crate) model: String,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
}

/// How the request came.
#[derive(Clone, Copy)]
pub(crate) enum Generation {
    /// An `input_required` input (SEP-2322).
    InputRequired,
    /// A 2025-era server's own request during the call.
    Request,
}

impl Generation {
    fn as_str(self) -> &'static str {
        match self {
            Self::InputRequired => "input_required",
            Self::Request => "request",
        }
    }
}

impl Asker {
    /// Answers a sampling request of `asked`'s server, and reports what became of it.
    pub(crate) async fn sample(
        &self,
        asked: Asked<'_>,
        generation: Generation,
        params: CreateMessageRequestParams,
    ) -> Result<CreateMessageResult, SamplingRefused> {
        let started = Instant::now();
        let max_tokens = params.max_tokens;
        let server_id = asked.entry.server_id();
        let outcome = self
            .sampler
            .sample(
                server_id,
                &asked.entry.record.sampling,
                params,
                self.deadline,
            )
            .await;
        self.report_sampling(asked, generation, max_tokens, started, outcome.as_ref());
        outcome.map(|served| served.result)
    }

    /// Reports a request refused before the sampler saw it.
    pub(crate) fn report_refused(
        &self,
        asked: Asked<'_>,
        generation: Generation,
        refused: &SamplingRefused,
        max_tokens: u32,
    ) {
        self.report_sampling(asked, generation, max_tokens, Instant::now(), Err(refused));
    }

    /// Logs what became of a request, without its text, and tells the observers.
    fn report_sampling(
        &self,
        asked: Asked<'_>,
        generation: Generation,
        max_tokens: u32,
        started: Instant,
        outcome: Result<&Sampled, &SamplingRefused>,
    ) {
        let server_id = asked.entry.server_id();
        let mut event = SamplingDone {
            task_id: self.task_id.clone(),
            // Set by the observers from the task's.
            principal: None,
            client: None,
            session_fd: self.session_fd,
            via: self.via,
            server_id: server_id.to_owned(),
            method: asked.method,
            name: cut(asked.name, defaults::MAX_RESOURCE_URI_BYTES).to_owned(),
            generation: generation.as_str(),
            outcome: "answered",
            reason: None,
            detail: None,
            backend: None,
            model: None,
            max_tokens,
            prompt_tokens: None,
            completion_tokens: None,
            stop_reason: None,
            duration_ms: started.elapsed().as_millis() as u64,
            at: SystemTime::now(),
        };
        match outcome {
            Ok(served) => {
                tracing::info!(task_id = %self.task_id, server_id, backend = %served.backend, model = %served.model, prompt_tokens = served.prompt_tokens, completion_tokens = served.completion_tokens, "answered the server's sampling request");
                event.backend = Some(served.backend.clone());
                event.model = Some(served.model.clone());
                event.prompt_tokens = Some(served.prompt_tokens);
                event.completion_tokens = Some(served.completion_tokens);
                event.stop_reason = served.result.stop_reason.clone();
            }
            Err(refused) => {
                tracing::info!(task_id = %self.task_id, server_id, reason = refused.reason, detail = %refused.message, "refused the server's sampling request");
                event.outcome = "refused";
                event.reason = Some(refused.reason);
                event.detail = Some(refused.message.clone());
                if let Some((backend, model)) = &refused.model {
                    event.backend = Some(backend.clone());
                    event.model = Some(model.clone());
                }
            }
        }
        self.observers.sampling(&event);
    }
}

/// A refusal the host must report without asking the sampler: the request came while
/// another request of the connection was in flight, or past the request's limit.
pub(crate) fn busy(why: &str) -> SamplingRefused {
    SamplingRefused::new("busy", format!("the sampling request is refused: {why}"))
}

/// How an `input_required` request whose sampling was refused fails, for the guest.
pub(crate) fn to_mcp_error(asked: Asked<'_>, refused: &SamplingRefused) -> McpError {
    let code = match refused.reason {
        "timeout" => McpErrorCode::Timeout,
        _ if refused.is_policy() => McpErrorCode::PolicyDenied,
        _ => McpErrorCode::ToolExecFailed,
    };
    McpError::new(
        code,
        format!(
            "server `{}` asked for sampling during {} `{}`, which was refused: {}",
            asked.entry.server_id(),
            asked.method,
            cut(asked.name, defaults::MAX_TOOL_NAME_BYTES),
            refused.message
        ),
    )
}

/// The JSON-RPC error a 2025-era server gets for a refused request: -1 (the spec's "user
/// rejected sampling request") for a policy refusal, invalid params for a request the host
/// cannot send, an internal error for a model that failed.
pub(crate) fn to_error_data(refused: &SamplingRefused) -> rmcp::ErrorData {
    let code = match refused.reason {
        "too_large" | "unsupported" => ErrorCode::INVALID_PARAMS,
        "timeout" | "llm_error" | "no_backend" => ErrorCode::INTERNAL_ERROR,
        _ => ErrorCode(-1),
    };
    rmcp::ErrorData::new(code, refused.message.clone(), None)
}
