//! LLM backends: where a chat session's requests go.
//!
//! A backend takes a complete OpenAI chat-completions request body and returns the response
//! body, read as a [`ChatCompletion`] (unknown fields kept), or a structured [`LlmError`]. It does not know where tools come from; the chat loop
//! does. [`openai`] speaks the OpenAI wire format over HTTP (any compatible server);
//! [`anthropic`] the Anthropic Messages API, [`responses`] the OpenAI Responses API and
//! [`gemini`] Gemini's `generateContent`, translated, over the same client; [`replay`] answers from a transcript file, for offline
//! demos and tests. A [`Recorder`] can wrap any of them to write such a transcript from a
//! real conversation.

mod anthropic;
mod config;
mod error;
mod gemini;
mod ids;
mod openai;
mod record;
mod replay;
mod responses;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::wire::ChatCompletion;
use crate::config::{ConfigError, ConfigOrigin};
use crate::sandbox::Charge;
pub use config::{BackendConfig, BackendKind};
pub use error::LlmError;
pub use record::Recorder;

pub(crate) use anthropic::RICH_CONTENT_FIELD;

/// Model names a backend option applies to: the configured `*`/`?` patterns, or the
/// option's default ones.
struct ModelPatterns(Vec<crate::Pattern>);

impl ModelPatterns {
    fn new(configured: Option<&[String]>, default: &[&str]) -> Self {
        Self(match configured {
            Some(patterns) => patterns.iter().map(crate::Pattern::new).collect(),
            None => default.iter().map(|p| crate::Pattern::new(*p)).collect(),
        })
    }

    fn matches(&self, model: &str) -> bool {
        self.0.iter().any(|p| p.matches(model))
    }
}

/// Why a translated API's response body is not an answer.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    #[error(transparent)]
    NotJson(serde_json::Error),
    /// JSON without what an answer needs, or an answer saying it failed.
    #[error("{0}")]
    Shape(String),
}

impl AnswerError {
    fn shape(what: impl Into<String>) -> Self {
        Self::Shape(what.into())
    }
}

impl From<serde_json::Error> for AnswerError {
    /// JSON of another shape is a shape error, its text cut while it is formatted: serde's
    /// text quotes a misplaced string of the answer whole, escaped.
    fn from(error: serde_json::Error) -> Self {
        if error.is_data() {
            Self::Shape(crate::text::display_cut(
                &error,
                crate::defaults::MAX_SHAPE_ERROR_BYTES,
            ))
        } else {
            Self::NotJson(error)
        }
    }
}

/// A request body as the chat loop hands it to a backend.
pub(crate) enum Payload<'a> {
    Value(&'a Value),
    /// The JSON text of a chat-completions body, encoded (and charged) once by the loop,
    /// for a backend that [sends it as is](Backend::sends_json_as_is).
    Json(bytes::Bytes),
}

impl Payload<'_> {
    /// The body as a value: borrowed, or parsed back from its text (for a backend that
    /// translates it or a recorder, which the loop does not encode for).
    fn value(&self) -> Result<std::borrow::Cow<'_, Value>, serde_json::Error> {
        match self {
            Payload::Value(value) => Ok(std::borrow::Cow::Borrowed(*value)),
            Payload::Json(json) => serde_json::from_slice(json).map(std::borrow::Cow::Owned),
        }
    }
}

/// A successful exchange.
#[derive(Clone, Debug)]
pub struct LlmReply {
    /// The response body, a `chat.completion` object (its unknown fields kept).
    pub body: ChatCompletion,
    /// Retries it took (429, 5xx, network errors).
    pub retries: u32,
}

/// A failed exchange, with the retries spent on it.
#[derive(Clone, Debug)]
pub struct LlmFailure {
    pub error: LlmError,
    pub retries: u32,
}

/// One configured backend.
pub struct Backend {
    name: String,
    /// The `gen_ai.provider.name` of its spans.
    provider: &'static str,
    default_model: String,
    timeout: Duration,
    kind: BackendImpl,
    recorder: Option<Arc<Recorder>>,
}

enum BackendImpl {
    OpenAi(openai::OpenAiBackend),
    Replay(replay::ReplayBackend),
}

impl Backend {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn provider(&self) -> &'static str {
        self.provider
    }

    pub fn default_model(&self) -> &str {
        &self.default_model
    }

    /// Whether tool messages should keep MCP image parts (every translated API sends them
    /// as images; `openai` chat completions cannot).
    pub fn takes_rich_results(&self) -> bool {
        matches!(&self.kind, BackendImpl::OpenAi(backend) if backend.takes_rich_results())
    }

    /// Whether tool messages lose their MCP image parts on the way out: only the chat
    /// completions wire, which cannot carry them (replay and recordings keep them).
    pub fn drops_rich_results(&self) -> bool {
        matches!(&self.kind, BackendImpl::OpenAi(backend) if !backend.takes_rich_results())
    }

    /// Whether user messages may carry OpenAI `input_audio` parts: only the chat
    /// completions wire takes them (the translations would turn them into notes).
    pub fn takes_audio(&self) -> bool {
        matches!(&self.kind, BackendImpl::OpenAi(backend) if !backend.takes_rich_results())
    }

    /// The backend's request timeout (a session's `timeout_ms` overrides it).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the backend sends a chat-completions body's JSON text as is (OpenAI chat
    /// completions, no recorder): the chat loop then hands it [`Payload::Json`].
    pub(crate) fn sends_json_as_is(&self) -> bool {
        self.recorder.is_none() && self.takes_audio()
    }

    /// Sends one request body and returns the response body, which `answer` holds (it is
    /// charged as it is read, then for what it parsed to).
    pub async fn complete(
        &self,
        body: &Value,
        timeout: Duration,
        answer: &mut Charge,
    ) -> Result<LlmReply, LlmFailure> {
        self.send(Payload::Value(body), timeout, answer).await
    }

    /// [`complete`](Self::complete) of a body in either form.
    pub(crate) async fn send(
        &self,
        body: Payload<'_>,
        timeout: Duration,
        answer: &mut Charge,
    ) -> Result<LlmReply, LlmFailure> {
        let reply = match (&self.kind, &body) {
            (BackendImpl::OpenAi(backend), _) => backend.complete(&body, timeout, answer).await,
            (BackendImpl::Replay(backend), _) => match body.value() {
                Ok(value) => backend.complete(&value, answer),
                Err(e) => Err(self.unencodable(e)),
            },
        };
        if let (Ok(reply), Some(recorder)) = (&reply, &self.recorder)
            && let Ok(value) = body.value()
        {
            recorder.record(&value, &reply.body);
        }
        reply
    }

    fn unencodable(&self, error: serde_json::Error) -> LlmFailure {
        LlmFailure {
            error: LlmError::InvalidRequest {
                backend: self.name.clone(),
                message: format!("the request body is not JSON: {error}"),
            },
            retries: 0,
        }
    }
}

/// Every backend of a host, by name, and which one is the default.
pub struct Backends {
    default: String,
    backends: BTreeMap<String, Arc<Backend>>,
}

impl Backends {
    /// Builds `backends`, `default_backend` the default; errors name `origin.file`, and
    /// relative paths in them are relative to `origin.dir`.
    /// With no backends configured, one named `openai` is made from `OPENAI_BASE_URL`,
    /// `OPENAI_API_KEY` and `OPENAI_MODEL`.
    pub fn from_config(
        default_backend: Option<&str>,
        backends: &BTreeMap<String, BackendConfig>,
        origin: &ConfigOrigin,
        recorder: Option<Arc<Recorder>>,
    ) -> Result<Self, ConfigError> {
        let configs = config::backends_or_zero_config(backends);
        let mut backends = BTreeMap::new();
        for (name, backend) in &configs {
            let kind = match backend.kind {
                BackendKind::Openai
                | BackendKind::OpenaiResponses
                | BackendKind::Anthropic
                | BackendKind::Gemini => {
                    BackendImpl::OpenAi(openai::OpenAiBackend::new(name, backend, &origin.file)?)
                }
                BackendKind::Replay => {
                    BackendImpl::Replay(replay::ReplayBackend::load(name, backend, origin)?)
                }
            };
            let built = Backend {
                name: name.clone(),
                provider: backend.kind.provider(),
                default_model: backend
                    .default_model
                    .clone()
                    .unwrap_or_else(|| default_model(backend.kind)),
                timeout: backend
                    .request_timeout_ms
                    .map(Duration::from_millis)
                    .unwrap_or(crate::defaults::LLM_REQUEST_TIMEOUT),
                kind,
                recorder: recorder.clone(),
            };
            backends.insert(name.clone(), Arc::new(built));
        }
        let default = config::default_backend_name(default_backend, &configs, origin)?;
        Ok(Self { default, backends })
    }

    /// The backend named `name`, or the default one.
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Backend>, LlmError> {
        let name = name.unwrap_or(&self.default);
        self.backends
            .get(name)
            .cloned()
            .ok_or_else(|| LlmError::BackendUnknown {
                name: name.to_owned(),
                known: self.backends.keys().cloned().collect(),
            })
    }
}

fn default_model(kind: BackendKind) -> String {
    match kind {
        BackendKind::Openai | BackendKind::OpenaiResponses => std::env::var("OPENAI_MODEL")
            .unwrap_or_else(|_| crate::defaults::OPENAI_DEFAULT_MODEL.into()),
        BackendKind::Anthropic => std::env::var("ANTHROPIC_MODEL")
            .unwrap_or_else(|_| crate::defaults::ANTHROPIC_DEFAULT_MODEL.into()),
        BackendKind::Gemini => std::env::var("GEMINI_MODEL")
            .unwrap_or_else(|_| crate::defaults::GEMINI_DEFAULT_MODEL.into()),
        BackendKind::Replay => "replay".into(),
    }
}
