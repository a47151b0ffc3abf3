//! Sampling: a server's `sampling/createMessage` (asked during a task's request, as an
//! `input_required` input or as a 2025-era request of its own) answered by one of the
//! host's LLM backends, for the task and within its budgets.
//!
//! The operator decides in the server's registry record (`[sampling]`, see
//! [`SamplingConfig`]) whether it may sample at all, which backend and model answer
//! (the server's `modelPreferences` are hints the host does not follow: they never choose
//! a backend or model), the largest `maxTokens` and how many requests one task answers. The
//! task holds one token budget over all its servers ([`Sampler`]; a task's
//! `mcp.sampling_max_tokens` only lowers it): each request reserves its `maxTokens` and an
//! estimate of its prompt first and is refused when they do not fit, and the tokens the
//! backend reports (else the reservation) replace it once it answers.
//!
//! A request is checked and bounded before anything is built from it (message count,
//! bytes, tools, stop sequences; images checked as the chat loop checks them; audio only
//! for a backend that takes it), then mapped to the OpenAI chat-completions body every
//! backend takes (text, `image_url` and `input_audio` parts, tools and tool calls, tool
//! results as `tool` messages), and the answer mapped back to a `CreateMessageResult`
//! (role `assistant`, text and `tool_use` content, the model, `stopReason`). Each request
//! is bounded by the record's `timeout_ms` (else the backend's timeout) and the task's
//! deadline. Nothing here logs a prompt or an answer.

// rmcp marks sampling deprecated (SEP-2577), yet 2025-11-25 and 2026-07-28 servers use it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    ContentBlock, CreateMessageRequestParams, CreateMessageResult, Role, SamplingMessage,
    SamplingMessageContentBlock, ToolChoiceMode,
};
use serde_json::{Map, Value, json};

use super::images;
use super::llm::{Backend, Backends, LlmError};
use super::wire::ChatCompletion;
use crate::defaults;
use crate::mcp::{Sampled, SamplingRefused, TaskSampler};
use crate::observe::Metrics;
use crate::registry::SamplingConfig;
use crate::sandbox::{Deadline, MemoryBudget, heap};
use crate::text::cut;

/// One task's sampling: the host's backends and the task's token budget, shared by every
/// server the task uses.
pub(crate) struct Sampler {
    backends: Arc<Backends>,
    metrics: Metrics,
    /// Tokens the task's sampling may use in all.
    max_tokens: u64,
    used: Mutex<Used>,
    /// The task's host memory, which holds each model answer.
    budget: MemoryBudget,
}

#[derive(Default)]
struct Used {
    /// Tokens used or reserved so far.
    tokens: u64,
    /// Requests answered (or tried) per server.
    requests: HashMap<String, u32>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sampler(max_tokens: {})", self.max_tokens)
    }
}

impl Sampler {
    pub(crate) fn new(
        backends: Arc<Backends>,
        metrics: Metrics,
        max_tokens: u64,
        budget: MemoryBudget,
    ) -> Self {
        Self {
            backends,
            metrics,
            max_tokens,
            used: Mutex::default(),
            budget,
        }
    }

    fn used(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers `params` of server `server_id`, whose record says `config`, before
    /// `deadline`.
    async fn sample(
        &self,
        server_id: &str,
        config: &SamplingConfig,
        params: CreateMessageRequestParams,
        deadline: Deadline,
    ) -> Result<Sampled, SamplingRefused> {
        if !config.allow {
            return Err(SamplingRefused::new(
                "not_allowed",
                format!(
                    "server `{server_id}` may not use the task's model: its registry record does not set [sampling] allow = true (docs/registry.md)"
                ),
            ));
        }
        let cap = config.max_tokens.unwrap_or(defaults::SAMPLING_MAX_TOKENS);
        if params.max_tokens == 0 || params.max_tokens > cap {
            self.metrics.budget_hit("sampling_max_tokens");
            return Err(SamplingRefused::new(
                "max_tokens",
                format!(
                    "the request asks for maxTokens {}; server `{server_id}` may ask for 1 to {cap} (its record's sampling.max_tokens)",
                    params.max_tokens
                ),
            ));
        }
        let prompt = bounded(&params)?;
        let backend = self
            .backends
            .get(config.backend.as_deref())
            .map_err(|e| {
                SamplingRefused::new(
                    "no_backend",
                    format!(
                        "server `{server_id}`'s record names a backend this host does not have (sampling.backend): {}",
                        cut(&e.to_string(), 300)
                    ),
                )
            })?;
        let model = config
            .model
            .clone()
            .unwrap_or_else(|| backend.default_model().to_owned());
        let with_model = |mut refused: SamplingRefused| {
            refused.model = Some((backend.name().to_owned(), model.clone()));
            refused
        };
        let body = request_body(&backend, &model, &params).map_err(with_model)?;
        let max_tokens = u64::from(params.max_tokens);
        drop(params);
        let reserved = prompt.saturating_add(max_tokens);
        self.reserve(server_id, config, reserved)
            .map_err(with_model)?;
        let timeout = config
            .timeout_ms
            .map_or(backend.timeout(), Duration::from_millis)
            .min(deadline.remaining());
        if timeout.is_zero() {
            self.settle(reserved, 0);
            return Err(with_model(SamplingRefused::new(
                "timeout",
                "the task's deadline has passed; the model was not asked",
            )));
        }
        let mut held = self.budget.empty("sampling answer");
        let reply = backend.complete(&body, timeout, &mut held).await;
        drop(body);
        let completion = match reply {
            Ok(reply) => {
                self.metrics.llm_request(backend.name(), "ok");
                reply.body
            }
            Err(failure) => {
                self.settle(reserved, 0);
                self.metrics
                    .llm_request(backend.name(), failure.error.code());
                if let LlmError::AnswerOverBudget { .. } = failure.error {
                    return Err(with_model(over_budget()));
                }
                return Err(with_model(SamplingRefused::new(
                    if failure.error.code() == "llm_timeout" {
                        "timeout"
                    } else {
                        "llm_error"
                    },
                    // Only the code goes back to the server: the error's text names the
                    // backend's URL and quotes the provider's answer, which are the
                    // operator's, not the server's. The log has the detail.
                    {
                        tracing::info!(server_id, error = %cut(&failure.error.to_string(), 300), "a sampling request's model call failed");
                        format!("the model did not answer ({})", failure.error.code())
                    },
                )));
            }
        };
        let usage = completion.usage();
        let prompt_tokens = usage.and_then(|u| u.prompt_tokens).unwrap_or(prompt);
        let completion_tokens = usage
            .and_then(|u| u.completion_tokens)
            .unwrap_or(max_tokens);
        self.settle(reserved, prompt_tokens.saturating_add(completion_tokens));
        self.metrics
            .llm_tokens(backend.name(), prompt_tokens, completion_tokens);
        // The copies the result makes of the answer's texts and tool inputs.
        held.grow(answer_cost(&completion))
            .map_err(|_| with_model(over_budget()))?;
        let result = answer(&completion, &model).map_err(with_model)?;
        Ok(Sampled {
            backend: backend.name().to_owned(),
            model: result.model.clone(),
            result,
            prompt_tokens,
            completion_tokens,
        })
    }

    /// Counts one request of `server_id` and reserves `tokens`, if both fit.
    fn reserve(
        &self,
        server_id: &str,
        config: &SamplingConfig,
        tokens: u64,
    ) -> Result<(), SamplingRefused> {
        let max_requests = config
            .max_requests
            .unwrap_or(defaults::SAMPLING_MAX_REQUESTS);
        let mut used = self.used();
        let left = self.max_tokens.saturating_sub(used.tokens);
        if tokens > left {
            self.metrics.budget_hit("sampling_tokens");
            return Err(SamplingRefused::new(
                "task_budget",
                format!(
                    "the task's sampling budget has {left} of {} tokens left and this request may take {tokens} (its maxTokens and prompt); ask for fewer tokens, or the operator may raise the budget",
                    self.max_tokens
                ),
            ));
        }
        let count = used.requests.entry(server_id.to_owned()).or_default();
        if *count >= max_requests {
            self.metrics.budget_hit("sampling_requests");
            return Err(SamplingRefused::new(
                "max_requests",
                format!(
                    "server `{server_id}` has had its {max_requests} sampling requests for this task (its record's sampling.max_requests)"
                ),
            ));
        }
        *count += 1;
        used.tokens = used.tokens.saturating_add(tokens);
        Ok(())
    }

    /// Replaces a reservation of `reserved` tokens with the `spent` ones.
    fn settle(&self, reserved: u64, spent: u64) {
        let mut used = self.used();
        used.tokens = used.tokens.saturating_sub(reserved).saturating_add(spent);
    }
}

impl TaskSampler for Sampler {
    fn sample<'a>(
        &'a self,
        server_id: &'a str,
        config: &'a SamplingConfig,
        params: CreateMessageRequestParams,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<Sampled, SamplingRefused>> {
        Box::pin(Sampler::sample(self, server_id, config, params, deadline))
    }
}

/// Checks the request's size before anything is built from it, and returns its estimated
/// prompt tokens (a token per four bytes of text, [`defaults::SAMPLING_MEDIA_TOKENS`] per
/// image or audio block).
fn bounded(params: &CreateMessageRequestParams) -> Result<u64, SamplingRefused> {
    let too_large = |what: String| SamplingRefused::new("too_large", what);
    if params.messages.len() > defaults::SAMPLING_MAX_MESSAGES {
        return Err(too_large(format!(
            "the request has {} messages; at most {} are sent to a model",
            params.messages.len(),
            defaults::SAMPLING_MAX_MESSAGES
        )));
    }
    let tools = params.tools.as_deref().unwrap_or_default();
    if tools.len() > defaults::SAMPLING_MAX_TOOLS {
        return Err(too_large(format!(
            "the request offers {} tools; at most {} are sent to a model",
            tools.len(),
            defaults::SAMPLING_MAX_TOOLS
        )));
    }
    let stops = params.stop_sequences.as_deref().unwrap_or_default();
    if stops.len() > defaults::SAMPLING_MAX_STOP_SEQUENCES {
        return Err(too_large(format!(
            "the request has {} stop sequences; at most {} are sent to a model",
            stops.len(),
            defaults::SAMPLING_MAX_STOP_SEQUENCES
        )));
    }
    let (mut bytes, mut media) = (0usize, 0u64);
    let blocks = params.messages.iter().flat_map(|m| m.content.iter());
    for block in blocks {
        bytes = bytes.saturating_add(match block {
            SamplingMessageContentBlock::Text(text) => text.text.len(),
            SamplingMessageContentBlock::Image(image) => {
                media += 1;
                image.data.len()
            }
            SamplingMessageContentBlock::Audio(audio) => {
                media += 1;
                audio.data.len()
            }
            SamplingMessageContentBlock::ToolUse(tool_use) => json_len(&tool_use.input),
            SamplingMessageContentBlock::ToolResult(result) => result
                .content
                .iter()
                .map(json_len)
                .fold(0, usize::saturating_add),
            _ => 0,
        });
    }
    bytes = bytes
        .saturating_add(params.system_prompt.as_deref().map_or(0, str::len))
        .saturating_add(stops.iter().map(String::len).fold(0, usize::saturating_add))
        .saturating_add(tools.iter().map(json_len).fold(0, usize::saturating_add));
    if bytes > defaults::SAMPLING_MAX_REQUEST_BYTES {
        return Err(too_large(format!(
            "the request holds more than {} bytes (messages, system prompt, tools); it is not sent to a model",
            defaults::SAMPLING_MAX_REQUEST_BYTES
        )));
    }
    // One token per byte: an upper bound for any tokenizer on text (token-dense text, such
    // as rare symbols, can take a token per byte), so a reservation is never exceeded by
    // the prompt a server chose.
    Ok((bytes as u64).saturating_add(media.saturating_mul(defaults::SAMPLING_MEDIA_TOKENS)))
}

/// `value`'s size as JSON, without building the text.
fn json_len<T: serde::Serialize>(value: &T) -> usize {
    usize::try_from(heap::json_len(value)).unwrap_or(usize::MAX)
}

fn unsupported(what: impl Into<String>) -> SamplingRefused {
    SamplingRefused::new("unsupported", what)
}

/// The chat-completions body for `params`, which [`bounded`] has checked.
fn request_body(
    backend: &Backend,
    model: &str,
    params: &CreateMessageRequestParams,
) -> Result<Value, SamplingRefused> {
    let mut messages = Vec::with_capacity(params.messages.len() + 1);
    if let Some(system) = &params.system_prompt {
        messages.push(json!({"role": "system", "content": system}));
    }
    for (i, message) in params.messages.iter().enumerate() {
        match message.role {
            Role::User => user_messages(backend, i, message, &mut messages)?,
            Role::Assistant => messages.push(assistant_message(i, message)?),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("max_tokens".into(), json!(params.max_tokens));
    if let Some(t) = params.temperature.filter(|t| t.is_finite()) {
        body.insert("temperature".into(), json!(t.clamp(0.0, 2.0)));
    }
    if let Some(stops) = params.stop_sequences.as_ref().filter(|s| !s.is_empty()) {
        body.insert("stop".into(), json!(stops));
    }
    if let Some(tools) = params.tools.as_ref().filter(|t| !t.is_empty()) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name,
                    "description": tool.description.as_deref().unwrap_or_default(),
                    "parameters": tool.input_schema,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        if let Some(mode) = params.tool_choice.as_ref().and_then(|c| c.mode.as_ref()) {
            let choice = match mode {
                ToolChoiceMode::Required => "required",
                ToolChoiceMode::None => "none",
                _ => "auto",
            };
            body.insert("tool_choice".into(), json!(choice));
        }
    }
    Ok(Value::Object(body))
}

/// A user message: its tool results as `tool` messages, or its text, image and audio as
/// one message.
fn user_messages(
    backend: &Backend,
    i: usize,
    message: &SamplingMessage,
    out: &mut Vec<Value>,
) -> Result<(), SamplingRefused> {
    let mut parts = Vec::new();
    for block in message.content.iter() {
        match block {
            SamplingMessageContentBlock::Text(text) => {
                parts.push(json!({"type": "text", "text": text.text}));
            }
            SamplingMessageContentBlock::Image(image) => {
                let media_type = images::check(&image.mime_type, &image.data).map_err(|why| {
                    unsupported(format!(
                        "messages[{i}]: an image is not sent to a model: {why}"
                    ))
                })?;
                let url = format!("data:{media_type};base64,{}", image.data);
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            SamplingMessageContentBlock::Audio(audio) => {
                let format = match audio.mime_type.to_ascii_lowercase().as_str() {
                    "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
                    "audio/mpeg" | "audio/mp3" => "mp3",
                    _ => {
                        return Err(unsupported(format!(
                            "messages[{i}]: audio of type `{}` is not sent to a model; WAV or MP3 is",
                            cut(&audio.mime_type, 64)
                        )));
                    }
                };
                if !backend.takes_audio() {
                    return Err(unsupported(format!(
                        "messages[{i}]: backend `{}` takes no audio; only an OpenAI chat-completions backend does",
                        backend.name()
                    )));
                }
                parts.push(
                    json!({"type": "input_audio", "input_audio": {"data": audio.data, "format": format}}),
                );
            }
            SamplingMessageContentBlock::ToolResult(result) => {
                let text = result
                    .content
                    .iter()
                    .map(|c| match c {
                        ContentBlock::Text(text) => text.text.as_str(),
                        _ => "[non-text content not sent]",
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let text = if result.is_error == Some(true) {
                    format!("[the tool failed] {text}")
                } else {
                    text
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": result.tool_use_id, "content": text}),
                );
            }
            _ => {
                return Err(unsupported(format!(
                    "messages[{i}]: a user message may hold text, images, audio and tool results"
                )));
            }
        }
    }
    if !parts.is_empty() {
        let content = match parts.as_slice() {
            [only] if only["type"] == "text" => only["text"].clone(),
            _ => Value::Array(parts),
        };
        out.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

/// An assistant message: its text, and its tool uses as tool calls.
fn assistant_message(i: usize, message: &SamplingMessage) -> Result<Value, SamplingRefused> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for block in message.content.iter() {
        match block {
            SamplingMessageContentBlock::Text(t) => text.push(t.text.as_str()),
            SamplingMessageContentBlock::ToolUse(tool_use) => calls.push(json!({
                "id": tool_use.id,
                "type": "function",
                "function": {"name": tool_use.name, "arguments": Value::Object(tool_use.input.clone()).to_string()},
            })),
            _ => {
                return Err(unsupported(format!(
                    "messages[{i}]: an assistant message may hold text and tool uses only"
                )));
            }
        }
    }
    let mut out = json!({"role": "assistant", "content": text.join("\n")});
    if !calls.is_empty() {
        out["tool_calls"] = Value::Array(calls);
    }
    Ok(out)
}

/// The refusal of an answer the task's host memory budget cannot hold.
fn over_budget() -> SamplingRefused {
    SamplingRefused::new(
        "host_memory",
        "the model's answer does not fit the task's host memory budget (limits.host_memory_bytes)",
    )
}

/// The heap [`answer`] takes for `completion`: its texts copied, each tool call's
/// arguments parsed.
fn answer_cost(completion: &ChatCompletion) -> u64 {
    let Some(message) = completion.message() else {
        return 0;
    };
    let text = |t: &str| heap::string(t.len() as u64);
    let texts = match &message.content {
        Some(Value::String(t)) => text(t),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .fold(0u64, |sum, t| sum.saturating_add(text(t))),
        _ => 0,
    };
    message.tool_calls().iter().fold(texts, |sum, call| {
        let arguments = heap::json_text(call.function.arguments.as_bytes()).unwrap_or(0);
        sum.saturating_add(arguments)
    })
}

/// The backend's answer as a `CreateMessageResult`.
fn answer(
    completion: &ChatCompletion,
    asked: &str,
) -> Result<CreateMessageResult, SamplingRefused> {
    let invalid =
        |what: &str| SamplingRefused::new("llm_error", format!("the model's answer {what}"));
    let message = completion
        .message()
        .ok_or_else(|| invalid("has no choices[0].message"))?;
    let mut blocks = Vec::new();
    match &message.content {
        Some(Value::String(text)) if !text.is_empty() => {
            blocks.push(SamplingMessageContentBlock::text(text.clone()));
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    blocks.push(SamplingMessageContentBlock::text(text));
                }
            }
        }
        _ => {}
    }
    for (n, call) in message.tool_calls().iter().enumerate() {
        let input = match call.function.arguments.trim() {
            "" => Map::new(),
            raw => match crate::json::from_str(raw) {
                Ok(Value::Object(input)) => input,
                _ => {
                    return Err(invalid(
                        "calls a tool with arguments that are not a JSON object",
                    ));
                }
            },
        };
        let id = call.id().map_or_else(|| format!("call_{n}"), str::to_owned);
        blocks.push(SamplingMessageContentBlock::tool_use(
            id,
            call.function.name.clone(),
            input,
        ));
    }
    if blocks.is_empty() {
        blocks.push(SamplingMessageContentBlock::text(""));
    }
    let stop_reason = match completion.finish_reason() {
        Some("stop") | None => CreateMessageResult::STOP_REASON_END_TURN.to_owned(),
        Some("length") => CreateMessageResult::STOP_REASON_END_MAX_TOKEN.to_owned(),
        Some("tool_calls") => CreateMessageResult::STOP_REASON_TOOL_USE.to_owned(),
        Some(other) => cut(other, 64).to_owned(),
    };
    let model = completion
        .model()
        .filter(|m| !m.is_empty() && m.len() <= defaults::MAX_MODEL_NAME_BYTES)
        .unwrap_or(asked);
    let message = match blocks.len() {
        1 => SamplingMessage::new(Role::Assistant, blocks.remove(0)),
        _ => SamplingMessage::new_multiple(Role::Assistant, blocks),
    };
    Ok(CreateMessageResult::new(message, model.to_owned()).with_stop_reason(stop_reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(messages: Vec<SamplingMessage>, max_tokens: u32) -> CreateMessageRequestParams {
        CreateMessageRequestParams::new(messages, max_tokens)
    }

    #[test]
    fn sizes_are_bounded_before_anything_is_built() {
        let many = vec![SamplingMessage::user_text("hi"); defaults::SAMPLING_MAX_MESSAGES + 1];
        assert_eq!(bounded(&params(many, 10)).unwrap_err().reason, "too_large");
        let huge = "x".repeat(defaults::SAMPLING_MAX_REQUEST_BYTES + 1);
        let one = vec![SamplingMessage::user_text(huge)];
        assert_eq!(bounded(&params(one, 10)).unwrap_err().reason, "too_large");
        let fine = vec![SamplingMessage::user_text("x".repeat(400))];
        // A token per byte: an upper bound for any tokenizer.
        assert_eq!(bounded(&params(fine, 10)).unwrap(), 400);
    }

    #[test]
    fn an_answer_maps_to_a_create_message_result() {
        let completion = ChatCompletion::from_value(json!({
            "model": "m-1",
            "choices": [{"message": {"role": "assistant", "content": "hello",
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "t", "arguments": "{\"a\":1}"}}]},
                "finish_reason": "tool_calls"}]}))
        .unwrap();
        let result = answer(&completion, "asked").unwrap();
        let value = serde_json::to_value(&result).unwrap();
        assert_eq!(value["role"], "assistant");
        assert_eq!(value["model"], "m-1");
        assert_eq!(value["stopReason"], "toolUse");
        assert_eq!(
            value["content"][0],
            json!({"type": "text", "text": "hello"})
        );
        assert_eq!(
            value["content"][1],
            json!({"type": "tool_use", "id": "c1", "name": "t", "input": {"a": 1}})
        );
    }
}
