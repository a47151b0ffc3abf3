//! LLM backends over HTTP: OpenAI-compatible chat completions, and through translations
//! the Anthropic Messages API ([`super::anthropic`]) and the OpenAI Responses API
//! ([`super::responses`]), all with the same client, retries and caps.
//!
//! 429 and 5xx answers and network errors are retried with bounded exponential backoff,
//! honouring `Retry-After`; everything else, including a body that is not a chat
//! completion, is reported at once. The API key is read from the environment variable the
//! config names, at request time, and never logged.
//!
//! A body is read only up to [`defaults::LLM_MAX_RESPONSE_BYTES`]: a larger one (by its
//! `Content-Length` or as it streams in) is `llm_response_too_large`, not a cut-off JSON
//! text reported as invalid. An error body is read only as far as its quoted start. The
//! body, and then what it parses to, is charged to the caller's budget before it is held:
//! an answer the task cannot hold is `host_memory_exhausted`.

use std::borrow::Cow;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{
    AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER,
};
use serde_json::Value;

use super::AnswerError;
use super::anthropic;
use super::config::{BackendConfig, BackendKind};
use super::gemini;
use super::responses;
use super::{LlmError, LlmFailure, LlmReply, ModelPatterns, Payload};
use crate::Cause;
use crate::chat::wire::ChatCompletion;
use crate::config::ConfigError;
use crate::defaults;
use crate::sandbox::{Charge, heap};

pub(super) struct OpenAiBackend {
    name: String,
    /// The endpoint, parsed once: reqwest would parse a string again for every request.
    url: reqwest::Url,
    api_key_env: Option<String>,
    headers: HeaderMap,
    client: reqwest::Client,
    wire: Wire,
}

/// The wire format a backend speaks.
enum Wire {
    OpenAi,
    /// Anthropic Messages; `max_tokens` for requests that set none (the API requires it).
    Anthropic {
        max_tokens: u32,
    },
    /// OpenAI Responses, stateless or chained, and the models that reason.
    Responses(responses::State, ModelPatterns),
    /// Gemini `generateContent`; the URL names the model.
    Gemini(gemini::ImageModels),
}

impl OpenAiBackend {
    pub(super) fn new(
        name: &str,
        config: &BackendConfig,
        config_path: &std::path::Path,
    ) -> Result<Self, ConfigError> {
        crate::mcp::ensure_tls_provider();
        let at = |field: &str| format!("backends.{name}.{field}");
        let anthropic = config.kind == BackendKind::Anthropic;
        let base = config
            .base_url
            .clone()
            .unwrap_or_else(|| match config.kind {
                BackendKind::Anthropic => defaults::ANTHROPIC_DEFAULT_BASE_URL.into(),
                BackendKind::Gemini => defaults::GEMINI_DEFAULT_BASE_URL.into(),
                _ => defaults::OPENAI_DEFAULT_BASE_URL.into(),
            });
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ConfigError::new(
                config_path,
                at("base_url"),
                format!("{base:?} is not an http(s) URL"),
            ));
        }
        let mut headers = HeaderMap::new();
        if anthropic {
            let version = config
                .anthropic_version
                .as_deref()
                .unwrap_or(defaults::ANTHROPIC_VERSION);
            let version = HeaderValue::try_from(version).map_err(|e| {
                ConfigError::new(config_path, at("anthropic_version"), e.to_string()).with_source(e)
            })?;
            headers.insert("anthropic-version", version);
        }
        for (key, value) in &config.headers {
            let header_error = |e: &dyn std::fmt::Display| {
                ConfigError::new(config_path, at(&format!("headers.{key}")), e.to_string())
            };
            let name =
                HeaderName::try_from(key.as_str()).map_err(|e| header_error(&e).with_source(e))?;
            let value = HeaderValue::try_from(value.as_str())
                .map_err(|e| header_error(&e).with_source(e))?;
            headers.insert(name, value);
        }
        // No redirects: a hop to another host would carry the API key (reqwest strips only
        // `Authorization` and cookies, not `x-api-key` or `x-goog-api-key`) and the whole
        // conversation, to an address the operator never configured. A 3xx is an error.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                ConfigError::new(
                    config_path,
                    at("base_url"),
                    format!("cannot build an HTTP client: {e}"),
                )
                .with_source(e)
            })?;
        let (path, wire) = match config.kind {
            BackendKind::Anthropic => {
                let max_tokens = config.max_tokens.unwrap_or(defaults::ANTHROPIC_MAX_TOKENS);
                ("messages", Wire::Anthropic { max_tokens })
            }
            BackendKind::OpenaiResponses => {
                let state = if config.chain_responses == Some(true) {
                    responses::State::Chained
                } else {
                    responses::State::Stateless
                };
                let reasoning = ModelPatterns::new(
                    config.reasoning_models.as_deref(),
                    defaults::RESPONSES_REASONING_MODELS,
                );
                ("responses", Wire::Responses(state, reasoning))
            }
            BackendKind::Gemini => {
                let models = gemini::ImageModels::new(config.image_result_models.as_deref());
                ("models", Wire::Gemini(models))
            }
            _ => ("chat/completions", Wire::OpenAi),
        };
        let url = format!("{}/{path}", base.trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).map_err(|e| {
            ConfigError::new(
                config_path,
                at("base_url"),
                format!("{base:?} is not a valid URL ({e}); set the API's base, e.g. \"https://api.openai.com/v1\""),
            )
            .with_source(e)
        })?;
        Ok(Self {
            name: name.to_owned(),
            url,
            api_key_env: config.api_key_env.clone(),
            headers,
            client,
            wire,
        })
    }

    pub(super) async fn complete(
        &self,
        body: &Payload<'_>,
        timeout: Duration,
        answer: &mut Charge,
    ) -> Result<LlmReply, LlmFailure> {
        let failed = |error| LlmFailure { error, retries: 0 };
        let invalid = |e: serde_json::Error| {
            failed(LlmError::InvalidRequest {
                backend: self.name.clone(),
                message: format!("the request body cannot be encoded: {e}"),
            })
        };
        // What the wire sends, encoded once for every attempt; the value, for a wire that
        // translates it (and reads the answer by it).
        let (url, json, value) = match (&self.wire, body) {
            (Wire::OpenAi, Payload::Json(json)) => (Cow::Borrowed(&self.url), json.clone(), None),
            _ => {
                let value = body.value().map_err(invalid)?;
                let (url, request) = self.request(&value).map_err(failed)?;
                let json = serde_json::to_vec(&*request).map_err(invalid)?;
                (url, bytes::Bytes::from(json), Some(value))
            }
        };
        let mut retries = 0;
        loop {
            let outcome = self
                .attempt(&url, json.clone(), value.as_deref(), timeout, answer)
                .await;
            let delay = match &outcome {
                Ok(_) => None,
                Err(Attempt::Retryable { retry_after, .. })
                    if retries < defaults::LLM_MAX_RETRIES =>
                {
                    let backoff = defaults::LLM_BACKOFF_BASE * 2u32.pow(retries);
                    match retry_after {
                        Some(wait) if *wait <= defaults::LLM_RETRY_AFTER_MAX => Some(*wait),
                        Some(_) => None,
                        None => Some(backoff.min(defaults::LLM_BACKOFF_MAX)),
                    }
                }
                Err(_) => None,
            };
            if outcome.is_err() {
                // Nothing of a failed attempt's answer is held through the wait.
                answer.shrink(answer.bytes());
            }
            match (outcome, delay) {
                (Ok(body), _) => return Ok(LlmReply { body, retries }),
                (Err(failure), Some(delay)) => {
                    tracing::info!(backend = %self.name, retry = retries + 1, delay_ms = delay.as_millis() as u64, error = %failure.error(), "retrying LLM request");
                    tokio::time::sleep(delay).await;
                    retries += 1;
                }
                (Err(failure), None) => {
                    return Err(LlmFailure {
                        error: failure.into_error(),
                        retries,
                    });
                }
            }
        }
    }

    pub(super) fn takes_rich_results(&self) -> bool {
        !matches!(self.wire, Wire::OpenAi)
    }

    /// The header carrying API key `key`, marked sensitive so no debug output shows it;
    /// `None` for a key that cannot be a header value.
    fn auth_header(&self, key: &str) -> Option<(HeaderName, HeaderValue)> {
        let (name, value) = match self.wire {
            Wire::OpenAi | Wire::Responses(..) => (AUTHORIZATION, format!("Bearer {key}")),
            Wire::Anthropic { .. } => (HeaderName::from_static("x-api-key"), key.to_owned()),
            Wire::Gemini(_) => (HeaderName::from_static("x-goog-api-key"), key.to_owned()),
        };
        let mut value = HeaderValue::try_from(value).ok()?;
        value.set_sensitive(true);
        Some((name, value))
    }

    /// Where `body` goes and as what, in this backend's wire format; an error when the
    /// API cannot be sent what it holds.
    fn request<'a>(
        &self,
        body: &'a Value,
    ) -> Result<(Cow<'_, reqwest::Url>, Cow<'a, Value>), LlmError> {
        let url = Cow::Borrowed(&self.url);
        Ok(match &self.wire {
            Wire::OpenAi => (url, without_rich_content(body)),
            Wire::Anthropic { max_tokens } => {
                (url, Cow::Owned(anthropic::to_messages(body, *max_tokens)))
            }
            Wire::Responses(state, reasoning) => {
                let reasons = reasoning.matches(body["model"].as_str().unwrap_or(""));
                (
                    url,
                    Cow::Owned(responses::to_responses(body, *state, reasons)),
                )
            }
            Wire::Gemini(models) => {
                let invalid = |message| LlmError::InvalidRequest {
                    backend: self.name.clone(),
                    message,
                };
                let model = body["model"].as_str().unwrap_or_default();
                let segment = gemini::model_segment(model).map_err(invalid)?;
                let request = gemini::to_gemini(body, &models.options(model)).map_err(invalid)?;
                let url = format!("{}/{segment}:generateContent", self.url);
                let url = reqwest::Url::parse(&url)
                    .map_err(|e| invalid(format!("the model `{model}` gives no valid URL: {e}")))?;
                (Cow::Owned(url), Cow::Owned(request))
            }
        })
    }

    /// One POST of `json` to `url`; `body`: the value it was translated from, if it was.
    async fn attempt(
        &self,
        url: &reqwest::Url,
        json: bytes::Bytes,
        body: Option<&Value>,
        timeout: Duration,
        answer: &mut Charge,
    ) -> Result<ChatCompletion, Attempt> {
        // Built by reqwest's builder: it moves a `user:pass@` of the URL into a sensitive
        // `Authorization` header, so the credentials never show in an error's URL.
        let request = self
            .client
            .post(url.clone())
            .headers(self.request_headers())
            .body(json)
            .build()
            .map_err(|e| self.transport_error(e))?;
        // One deadline for the request and the whole answer, its body included.
        let (status, retry_after, bytes) =
            match tokio::time::timeout(timeout, self.exchange(request, answer)).await {
                Ok(exchanged) => exchanged?,
                Err(_) => {
                    return Err(Attempt::Final(LlmError::Timeout {
                        backend: self.name.clone(),
                        timeout,
                    }));
                }
            };
        if !status.is_success() {
            let error = LlmError::Http {
                backend: self.name.clone(),
                status: status.as_u16(),
                body: snippet(&bytes),
            };
            let retryable = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
            return Err(if retryable {
                let retry_after = retry_after.or_else(|| retry_delay(&bytes));
                Attempt::Retryable { error, retry_after }
            } else {
                Attempt::Final(error)
            });
        }
        let invalid = |message: String, source: Option<Cause>| {
            Attempt::Final(LlmError::InvalidResponse {
                backend: self.name.clone(),
                message: format!("{message}: {}", snippet(&bytes)),
                source,
            })
        };
        // What the text parses to, charged before it is built; for text that is not JSON,
        // what the parse below builds before it fails.
        let parsed = heap::json_text_bound(&bytes);
        let peak = match self.wire {
            Wire::OpenAi => parsed,
            // A translation holds the typed answer and the completion it builds (texts
            // joined, parts copied) at once.
            _ => parsed.saturating_mul(2),
        };
        answer.grow(peak).map_err(|_| self.over_budget())?;
        let completion = self
            .parse(&bytes, body)
            .map_err(|(message, source)| invalid(message, source));
        drop(bytes);
        answer.resize(parsed).map_err(|_| self.over_budget())?;
        completion
    }

    /// The configured headers, the API key's (read from its variable at each request, so a
    /// rotated key is used at once), the trace context's, and `content-type`.
    fn request_headers(&self) -> HeaderMap {
        let mut headers = self.headers.clone();
        if let Some(key) = self
            .api_key_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
        {
            match self.auth_header(&key) {
                // Replaces a configured header of that name rather than sending both.
                Some((name, value)) => {
                    headers.insert(name, value);
                }
                None => {
                    tracing::warn!(backend = %self.name, "the API key is not a valid header value; sent without it")
                }
            }
        }
        headers.extend(crate::trace::headers());
        // As reqwest's `.json()` would: unless a configured header says otherwise.
        headers
            .entry(CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/json"));
        headers
    }

    /// Sends `request` and reads its answer's status, `Retry-After` and body (up to the
    /// cap for its status, charged to `answer`).
    async fn exchange(
        &self,
        request: reqwest::Request,
        answer: &mut Charge,
    ) -> Result<(StatusCode, Option<Duration>, Vec<u8>), Attempt> {
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let cap = if status.is_success() {
            defaults::LLM_MAX_RESPONSE_BYTES
        } else {
            ERROR_BODY_BYTES
        };
        let too_large = || {
            Attempt::Final(LlmError::ResponseTooLarge {
                backend: self.name.clone(),
                limit: cap,
            })
        };
        if status.is_success()
            && response
                .content_length()
                .is_some_and(|len| len > cap as u64)
        {
            return Err(too_large());
        }
        let bytes = match read_capped(response, cap, answer).await {
            Ok(Body::Whole(bytes)) => bytes,
            // The start of an error body is all its message quotes.
            Ok(Body::Cut(bytes)) if !status.is_success() => bytes,
            Ok(Body::Cut(_)) => return Err(too_large()),
            Ok(Body::OverBudget) => return Err(self.over_budget()),
            Err(e) => return Err(self.transport_error(e)),
        };
        Ok((status, retry_after, bytes))
    }

    fn over_budget(&self) -> Attempt {
        Attempt::Final(LlmError::AnswerOverBudget {
            backend: self.name.clone(),
        })
    }

    /// `bytes`, this wire's answer to `body`, as a chat completion; else why not.
    fn parse(
        &self,
        bytes: &[u8],
        body: Option<&Value>,
    ) -> Result<ChatCompletion, (String, Option<Cause>)> {
        let answer = match &self.wire {
            Wire::OpenAi => {
                return ChatCompletion::from_slice(bytes)
                    .map_err(|e| (e.to_string(), Some(Cause::new(e))));
            }
            Wire::Anthropic { .. } => anthropic::from_messages(bytes),
            Wire::Responses(state, _) => responses::from_responses(bytes, *state),
            Wire::Gemini(_) => {
                let offered: Vec<&str> = body
                    .and_then(|body| body["tools"].as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect();
                gemini::from_gemini(bytes, &offered)
            }
        };
        answer.map_err(|e| match e {
            AnswerError::NotJson(e) => (e.to_string(), Some(Cause::new(e))),
            AnswerError::Shape(what) => (what, None),
        })
    }

    /// A request that failed on the way (the deadline is `attempt`'s own): worth another
    /// try.
    fn transport_error(&self, error: reqwest::Error) -> Attempt {
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Attempt::Retryable {
            error: LlmError::Unavailable {
                backend: self.name.clone(),
                message,
                source: Cause::new(error),
            },
            retry_after: None,
        }
    }
}

enum Attempt {
    Retryable {
        error: LlmError,
        retry_after: Option<Duration>,
    },
    Final(LlmError),
}

impl Attempt {
    fn error(&self) -> &LlmError {
        match self {
            Attempt::Retryable { error, .. } | Attempt::Final(error) => error,
        }
    }

    fn into_error(self) -> LlmError {
        match self {
            Attempt::Retryable { error, .. } | Attempt::Final(error) => error,
        }
    }
}

/// `body` without the rich tool-result parts OpenAI's tool messages cannot carry (and its
/// API would refuse as unknown fields); copies only when there are some.
fn without_rich_content(body: &Value) -> Cow<'_, Value> {
    let field = anthropic::RICH_CONTENT_FIELD;
    let has_rich = body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m.get(field).is_some()));
    if !has_rich {
        return Cow::Borrowed(body);
    }
    let mut body = body.clone();
    if let Some(messages) = body["messages"].as_array_mut() {
        for message in messages {
            if let Some(message) = message.as_object_mut() {
                message.remove(field);
            }
        }
    }
    Cow::Owned(body)
}

/// The wait a 429 or 5xx asks for: OpenAI's `retry-after-ms`, or `Retry-After` seconds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let millis = header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    millis.or_else(|| {
        header(RETRY_AFTER.as_str())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
    })
}

/// The wait a Google API error body asks for: the `retryDelay` (`"17s"`, `"0.5s"`) of its
/// `google.rpc.RetryInfo` detail, when the body was read whole.
fn retry_delay(body: &[u8]) -> Option<Duration> {
    let error: Value = crate::json::from_slice(body).ok()?;
    let details = error["error"]["details"].as_array()?;
    let info = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.RetryInfo")?;
    let seconds: f64 = info["retryDelay"]
        .as_str()?
        .strip_suffix('s')?
        .parse()
        .ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(1e9)))
}

/// Bytes of an error body read, for the start [`snippet`] quotes.
const ERROR_BODY_BYTES: usize = 4 * 1024;

/// A body read up to a cap.
enum Body {
    Whole(Vec<u8>),
    /// The body was longer than the cap; these are its first `cap` bytes.
    Cut(Vec<u8>),
    /// The budget could not hold the body read so far.
    OverBudget,
}

/// Reads `response` up to `cap` bytes, `charge` holding what the buffer takes before it
/// grows (its declared length at once, else doubling).
async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
    charge: &mut Charge,
) -> Result<Body, reqwest::Error> {
    let mut body = Vec::new();
    if let Some(len) = response.content_length().filter(|&len| len <= cap as u64) {
        if charge.resize(heap::alloc(len)).is_err() {
            return Ok(Body::OverBudget);
        }
        body.reserve_exact(len as usize);
    }
    while let Some(chunk) = response.chunk().await? {
        let take = chunk.len().min(cap - body.len());
        let needed = body.len() + take;
        if needed > body.capacity() {
            let wanted = needed.max(body.capacity() * 2).min(cap);
            let Ok(held) =
                charge.resize_between(heap::alloc(needed as u64), heap::alloc(wanted as u64))
            else {
                return Ok(Body::OverBudget);
            };
            let room = if held >= heap::alloc(wanted as u64) {
                wanted
            } else {
                needed
            };
            body.reserve_exact(room - body.len());
        }
        body.extend_from_slice(&chunk[..take]);
        if take < chunk.len() {
            return Ok(Body::Cut(body));
        }
    }
    Ok(Body::Whole(body))
}

/// The start of a body, for error messages.
fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]);
    let more = if bytes.len() > 300 { "…" } else { "" };
    format!("{}{more}", text.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_waits_come_from_headers_or_googles_retry_info() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("250.5"));
        assert_eq!(retry_after(&headers), Some(Duration::from_micros(250_500)));
        headers.insert("retry-after-ms", HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));

        let body = serde_json::json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"},
        ]}});
        assert_eq!(
            retry_delay(body.to_string().as_bytes()),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(retry_delay(b"{\"error\": {\"details\": [{\"@type\": \"type.googleapis.com/google.rpc.RetryInfo\", \"retryDelay\": \"soon\"}]}}"), None);
        assert_eq!(retry_delay(b"<html>"), None);
    }

    #[test]
    fn api_keys_go_in_sensitive_headers() {
        for (kind, header) in [
            (BackendKind::Openai, "authorization"),
            (BackendKind::OpenaiResponses, "authorization"),
            (BackendKind::Anthropic, "x-api-key"),
            (BackendKind::Gemini, "x-goog-api-key"),
        ] {
            let config = BackendConfig {
                kind,
                ..Default::default()
            };
            let backend = OpenAiBackend::new("b", &config, std::path::Path::new("q.toml")).unwrap();
            let (name, value) = backend.auth_header("sk-secret").unwrap();
            assert_eq!(name, header);
            assert!(value.is_sensitive(), "{header}");
            assert!(!format!("{value:?}").contains("sk-secret"));
            assert!(backend.auth_header("sk\nsecret").is_none());
        }
    }

    /// Credentials in `base_url` go out as a sensitive header, never in an error's text.
    #[tokio::test]
    async fn credentials_in_the_base_url_never_show_in_an_error() {
        let config = BackendConfig {
            base_url: Some("http://quiver-user:hunter2@127.0.0.1:9/v1".into()),
            ..BackendConfig::default()
        };
        let backend = OpenAiBackend::new("b", &config, std::path::Path::new("q.toml")).unwrap();
        let budget = crate::sandbox::MemoryBudget::new(std::sync::Arc::from("t"), 1 << 20);
        let mut answer = budget.empty("answer");
        let Err(failure) = backend
            .attempt(
                &backend.url,
                bytes::Bytes::from_static(b"{}"),
                None,
                Duration::from_secs(5),
                &mut answer,
            )
            .await
        else {
            panic!("nothing listens on port 9");
        };
        let shown = failure.into_error().to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
    }

    /// A backend that cannot be reached is `Unavailable` with reqwest's error as source.
    #[tokio::test]
    async fn an_unreachable_backend_keeps_the_transport_error() {
        use std::error::Error;
        let backend = OpenAiBackend::new(
            "b",
            &BackendConfig::default(),
            std::path::Path::new("q.toml"),
        )
        .unwrap();
        let refused = reqwest::Client::new()
            .get("http://127.0.0.1:9/")
            .send()
            .await
            .unwrap_err();
        let Attempt::Retryable { error, .. } = backend.transport_error(refused) else {
            panic!("a refused connection may be retried");
        };
        assert!(matches!(error, LlmError::Unavailable { .. }), "{error:?}");
        let source = error.source().expect("a source");
        assert!(
            source.downcast_ref::<reqwest::Error>().is_some(),
            "{source:?}"
        );
        assert!(error.to_string().contains(&source.to_string()), "{error}");
    }
}
