//! Typed views of what the host answers a chat session: the response body (an upstream
//! `chat.completion` with the host's `_spear` object, or an `error` object) and the
//! GET_METRICS object. Field by field as `docs/abi.md` describes them.
//!
//! Decoding is lenient (see the crate docs): a missing or wrongly typed field is its
//! default, unknown fields are kept in `extra`, and nothing here fails or panics on an odd
//! answer. The JSON as sent is always available from [`Response::json`](crate::Response::json).

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::lenient::{self, field, is_empty, list, open_enum};

/// A response body from `cchat_recv`, split into its parts.
///
/// On success it is the upstream `chat.completion` plus `_spear`; on failure `error` and
/// `_spear`, with `last_response` for `tool_call_limit`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ResponseBody {
    /// The `chat.completion` fields (empty `choices` for a failed request).
    #[serde(flatten)]
    pub completion: Completion,
    /// The host's `error` object, if the request failed.
    #[serde(deserialize_with = "field")]
    pub error: Option<ChatError>,
    /// The host's `_spear` object.
    #[serde(rename = "_spear", deserialize_with = "field")]
    pub spear: Option<Spear>,
    /// For `tool_call_limit`: the last model answer, which still asked for tools.
    #[serde(deserialize_with = "field")]
    pub last_response: Option<Completion>,
}

impl ResponseBody {
    /// Decodes a response body leniently (any JSON value gives a body; a non-object gives
    /// an empty one).
    pub fn from_json(json: &Value) -> ResponseBody {
        lenient::value(json)
    }
}

/// An OpenAI `chat.completion` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Completion {
    /// `id`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `object`: `"chat.completion"`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// `created`, in seconds since the Unix epoch.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// `model`, as the upstream names it.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `choices`; the host asks for one.
    #[serde(deserialize_with = "list")]
    pub choices: Vec<Choice>,
    /// `usage` of this upstream request.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Every other field, as sent (`system_fingerprint`, ..).
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

impl Completion {
    /// The first choice's message, if there is a choice.
    pub fn message(&self) -> Option<&Message> {
        self.choices.first().map(|choice| &choice.message)
    }

    /// The first choice's text (see [`Message::text`]).
    pub fn text(&self) -> Option<String> {
        self.message()?.text()
    }

    /// The first choice's tool calls (empty if none).
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.message().map_or(&[], |m| &m.tool_calls)
    }

    /// The first choice's `finish_reason`.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.choices.first()?.finish_reason.as_ref()
    }
}

/// One of a completion's `choices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Choice {
    /// `index`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// `message`.
    #[serde(deserialize_with = "field")]
    pub message: Message,
    /// `finish_reason`.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Every other field, as sent (`logprobs`, ..).
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

open_enum! {
    /// Why the model stopped: a choice's `finish_reason`.
    pub enum FinishReason {
        /// The model answered.
        Stop = "stop",
        /// The model asks for tool calls.
        ToolCalls = "tool_calls",
        /// The answer hit the token limit.
        Length = "length",
        /// The upstream's content filter stopped the answer.
        ContentFilter = "content_filter",
    }
}

/// A chat message, as in a completion's choice (and as [`Chat::message`](crate::Chat::message)
/// accepts it: it serializes back to the OpenAI shape, so an answer can be appended to a
/// session as it is).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Message {
    /// `role`: `"assistant"` in an answer.
    #[serde(deserialize_with = "field")]
    pub role: String,
    /// `content`: text, parts, or none (`null` in an answer that only calls tools).
    #[serde(deserialize_with = "field")]
    pub content: Option<MessageContent>,
    /// `refusal`, if the model refused.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// `tool_calls` the model asks for.
    #[serde(deserialize_with = "list", skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

impl Message {
    /// The message's text: the content string, or its `text` parts joined. `None` if there
    /// is no content.
    pub fn text(&self) -> Option<String> {
        match self.content.as_ref()? {
            MessageContent::Text(text) => Some(text.clone()),
            MessageContent::Parts(parts) => Some(
                parts
                    .iter()
                    .filter(|part| part.kind == "text")
                    .filter_map(|part| part.text.as_deref())
                    .collect(),
            ),
        }
    }
}

/// A message's `content`: a string, or an array of parts.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ..}`, ..). Parts that are not objects are
    /// left out.
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MessageContent, D::Error> {
        match Value::deserialize(d)? {
            Value::String(text) => Ok(MessageContent::Text(text)),
            Value::Array(parts) => Ok(MessageContent::Parts(
                parts
                    .into_iter()
                    .filter_map(|part| ContentPart::deserialize(part).ok())
                    .collect(),
            )),
            _ => Err(D::Error::custom("content is neither a string nor an array")),
        }
    }
}

/// One part of a message's content.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ContentPart {
    /// `type`: `"text"`, `"image_url"`, `"refusal"`, ..
    #[serde(rename = "type", deserialize_with = "field")]
    pub kind: String,
    /// `text`, for a text part.
    #[serde(deserialize_with = "field", skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// A tool call the model asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ToolCall {
    /// `id`, which the `tool` message answering it names as `tool_call_id`.
    #[serde(deserialize_with = "field")]
    pub id: String,
    /// `type`: `"function"`.
    #[serde(rename = "type", deserialize_with = "field")]
    pub kind: String,
    /// `function`: the tool's name and arguments.
    #[serde(deserialize_with = "field")]
    pub function: FunctionCall,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// The function part of a [`ToolCall`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct FunctionCall {
    /// The tool's name (an MCP tool's is `mcp__<server_id>__<tool>`).
    #[serde(deserialize_with = "field")]
    pub name: String,
    /// The arguments as JSON text, as the model wrote them (not always valid JSON).
    #[serde(deserialize_with = "field")]
    pub arguments: String,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

impl FunctionCall {
    /// Decodes the arguments into `T` (empty arguments are `{}`).
    pub fn args<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        let args = self.arguments.trim();
        serde_json::from_str(if args.is_empty() { "{}" } else { args })
    }
}

/// Token counts: `usage`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Usage {
    /// `prompt_tokens`.
    #[serde(deserialize_with = "field")]
    pub prompt_tokens: u64,
    /// `completion_tokens`.
    #[serde(deserialize_with = "field")]
    pub completion_tokens: u64,
    /// `total_tokens`.
    #[serde(deserialize_with = "field")]
    pub total_tokens: u64,
    /// Every other field, as sent (`prompt_tokens_details`, ..).
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// The host's `_spear` object: what the send did.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Spear {
    /// The backend used.
    #[serde(deserialize_with = "field")]
    pub backend: Option<String>,
    /// The model asked for.
    #[serde(deserialize_with = "field")]
    pub model: Option<String>,
    /// Model requests made.
    #[serde(deserialize_with = "field")]
    pub iterations: u64,
    /// Tokens over every request of the send.
    #[serde(deserialize_with = "field")]
    pub usage: Option<Usage>,
    /// One record per tool call the host ran, in order.
    #[serde(deserialize_with = "list")]
    pub tool_calls: Vec<ToolCallRecord>,
    /// Every other field, as sent (`mcp`: servers and policy decisions, ..).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One tool call the host ran, from `_spear.tool_calls`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ToolCallRecord {
    /// The model's tool call id.
    #[serde(deserialize_with = "field")]
    pub id: String,
    /// The tool name the model used.
    #[serde(deserialize_with = "field")]
    pub name: String,
    /// What ran.
    #[serde(deserialize_with = "field")]
    pub kind: ToolKind,
    /// For an MCP tool: its server.
    #[serde(deserialize_with = "field")]
    pub server_id: Option<String>,
    /// For an MCP tool: its MCP-native name.
    #[serde(deserialize_with = "field")]
    pub tool: Option<String>,
    /// Whether it succeeded (`None` if the host did not say).
    #[serde(deserialize_with = "field")]
    pub ok: Option<bool>,
    /// How long it took, in milliseconds.
    #[serde(deserialize_with = "field")]
    pub ms: Option<u64>,
    /// For a failed call: the error code the model saw (`tool_exec_failed`, ..).
    #[serde(deserialize_with = "field")]
    pub error: Option<String>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

open_enum! {
    /// What kind of tool a [`ToolCallRecord`] is.
    pub enum ToolKind {
        /// A guest tool ([`tool!`](crate::tool!)).
        Guest = "guest",
        /// An MCP tool.
        Mcp = "mcp",
        /// A name the model made up; nothing ran.
        Unknown = "unknown",
        /// An MCP tool this session may not call; nothing ran.
        Denied = "denied",
    }
}

/// The host's `error` object of a failed send.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ChatError {
    /// `code`.
    #[serde(deserialize_with = "field")]
    pub code: ChatErrorCode,
    /// `message`, for people.
    #[serde(deserialize_with = "field")]
    pub message: String,
    /// For `llm_http_error`: the HTTP status.
    #[serde(deserialize_with = "field")]
    pub status: Option<u16>,
    /// For `tool_call_limit`: the budget reached (`max_iterations` or
    /// `max_total_tool_calls`).
    #[serde(deserialize_with = "field")]
    pub limit: Option<String>,
    /// For `tool_call_limit`: the budget's value.
    #[serde(deserialize_with = "field")]
    pub value: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl std::fmt::Display for ChatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ChatError {}

open_enum! {
    /// The `code` of a [`ChatError`].
    pub enum ChatErrorCode {
        /// The backend could not be reached.
        LlmUnavailable = "llm_unavailable",
        /// The backend did not answer in time.
        LlmTimeout = "llm_timeout",
        /// The backend answered with an HTTP error status.
        LlmHttpError = "llm_http_error",
        /// The backend's answer was not a chat completion.
        LlmInvalidResponse = "llm_invalid_response",
        /// The backend's answer was larger than the host reads (16 MiB).
        LlmResponseTooLarge = "llm_response_too_large",
        /// The session holds what the backend's API cannot be sent (a tool schema it
        /// cannot express); nothing was sent.
        LlmInvalidRequest = "llm_invalid_request",
        /// The session names a backend the host does not have.
        BackendUnknown = "backend_unknown",
        /// The model still wanted tools when a budget ran out.
        ToolCallLimit = "tool_call_limit",
    }
}

/// What one send cost: the GET_METRICS object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Metrics {
    /// Model requests that got an answer.
    #[serde(deserialize_with = "field")]
    pub iterations: u64,
    /// Model requests made, retries included.
    #[serde(deserialize_with = "field")]
    pub llm_requests: u64,
    /// Retried model requests.
    #[serde(deserialize_with = "field")]
    pub llm_retries: u64,
    /// Failed model requests.
    #[serde(deserialize_with = "field")]
    pub llm_errors: u64,
    /// Prompt tokens over the send.
    #[serde(deserialize_with = "field")]
    pub prompt_tokens: u64,
    /// Completion tokens over the send.
    #[serde(deserialize_with = "field")]
    pub completion_tokens: u64,
    /// Total tokens over the send.
    #[serde(deserialize_with = "field")]
    pub total_tokens: u64,
    /// Tool calls by kind.
    #[serde(deserialize_with = "field")]
    pub tool_calls: ToolCallCounts,
    /// Latencies.
    #[serde(deserialize_with = "field")]
    pub latency_ms: Latency,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// [`Metrics::tool_calls`]: tool calls by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ToolCallCounts {
    /// Guest tools run.
    #[serde(deserialize_with = "field")]
    pub guest: u64,
    /// MCP tools run.
    #[serde(deserialize_with = "field")]
    pub mcp: u64,
    /// Calls of names no tool has.
    #[serde(deserialize_with = "field")]
    pub unknown: u64,
    /// Calls the session's policy refused.
    #[serde(deserialize_with = "field")]
    pub denied: u64,
    /// Calls that ran and failed.
    #[serde(deserialize_with = "field")]
    pub failed: u64,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

/// [`Metrics::latency_ms`]: milliseconds spent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Latency {
    /// The whole send.
    #[serde(deserialize_with = "field")]
    pub total: u64,
    /// Waiting for the model.
    #[serde(deserialize_with = "field")]
    pub llm: u64,
    /// Running tools.
    #[serde(deserialize_with = "field")]
    pub tools: u64,
    /// Every other field, as sent.
    #[serde(flatten, skip_serializing_if = "is_empty")]
    pub extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_completion() {
        let body = ResponseBody::from_json(&json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1795000000,
            "model": "gpt-4o-mini", "system_fingerprint": "fp",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                         "message": {"role": "assistant", "content": "Hi.", "annotations": []}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": 0}},
            "_spear": {"backend": "openai", "model": "gpt-4o-mini", "iterations": 2,
                       "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
                       "tool_calls": [
                           {"id": "c1", "name": "get_weather", "kind": "guest", "ok": true, "ms": 0},
                           {"id": "c2", "name": "mcp__fs__read", "kind": "mcp", "server_id": "fs",
                            "tool": "read", "ok": false, "ms": 3, "error": "mcp_timeout"},
                           {"id": "c3", "name": "nope", "kind": "quantum", "ok": false}],
                       "mcp": {"servers": ["fs"]}}
        }));
        let c = &body.completion;
        assert_eq!(c.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(c.created, Some(1795000000));
        assert_eq!(c.text().as_deref(), Some("Hi."));
        assert_eq!(c.finish_reason(), Some(&FinishReason::Stop));
        assert_eq!(c.extra["system_fingerprint"], "fp");
        assert!(!c.extra.contains_key("_spear"), "{:?}", c.extra);
        assert_eq!(c.choices[0].extra["logprobs"], Value::Null);
        assert_eq!(c.message().unwrap().extra["annotations"], json!([]));
        let usage = c.usage.as_ref().unwrap();
        assert_eq!((usage.prompt_tokens, usage.total_tokens), (3, 5));
        assert_eq!(usage.extra["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(body.error, None);

        let spear = body.spear.unwrap();
        assert_eq!(spear.iterations, 2);
        assert_eq!(spear.usage.unwrap().total_tokens, 13);
        assert_eq!(spear.extra["mcp"]["servers"][0], "fs");
        let [weather, read, odd] = &spear.tool_calls[..] else {
            panic!("three records");
        };
        assert_eq!(weather.kind, ToolKind::Guest);
        assert_eq!(weather.ok, Some(true));
        assert_eq!(read.kind, ToolKind::Mcp);
        assert_eq!(read.server_id.as_deref(), Some("fs"));
        assert_eq!(read.error.as_deref(), Some("mcp_timeout"));
        assert_eq!(odd.kind, ToolKind::Other("quantum".into()));
        assert_eq!(odd.ms, None);
    }

    #[test]
    fn tool_calls_and_parts() {
        let c: Completion = lenient::value(&json!({"choices": [{
            "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "w", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                "garbage",
                {"id": "e", "type": "function", "function": {"name": "ping", "arguments": ""}}
            ]}
        }]}));
        assert_eq!(c.text(), None);
        assert_eq!(c.finish_reason(), Some(&FinishReason::ToolCalls));
        let calls = c.tool_calls();
        assert_eq!(calls.len(), 2, "the non-object call is left out");
        assert_eq!(calls[0].function.name, "get_weather");
        #[derive(Deserialize)]
        struct Args {
            city: String,
        }
        assert_eq!(calls[0].function.args::<Args>().unwrap().city, "Paris");
        assert_eq!(calls[1].function.args::<Value>().unwrap(), json!({}));

        // The message serializes back to the OpenAI shape, for ADD_MESSAGE.
        assert_eq!(
            serde_json::to_value(c.message().unwrap()).unwrap(),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "w", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "e", "type": "function", "function": {"name": "ping", "arguments": ""}}
            ]})
        );

        let c: Completion = lenient::value(&json!({"choices": [{"message": {"content": [
            {"type": "text", "text": "a"}, {"type": "image_url"}, 7, {"type": "text", "text": "b"},
            {"type": "text", "text": 5}
        ]}}]}));
        assert_eq!(c.text().as_deref(), Some("ab"));
    }

    #[test]
    fn errors_are_typed() {
        let body = ResponseBody::from_json(&json!({
            "error": {"code": "tool_call_limit", "message": "too many", "limit": "max_iterations",
                      "value": 8},
            "_spear": {"iterations": 8},
            "last_response": {"choices": [{"message": {"content": null,
                "tool_calls": [{"id": "x", "type": "function",
                                "function": {"name": "again", "arguments": "{}"}}]}}]}
        }));
        let error = body.error.unwrap();
        assert_eq!(error.code, ChatErrorCode::ToolCallLimit);
        assert_eq!(error.limit.as_deref(), Some("max_iterations"));
        assert_eq!(error.value, Some(8));
        assert_eq!(error.to_string(), "tool_call_limit: too many");
        assert!(body.completion.choices.is_empty());
        assert!(
            body.completion.extra.is_empty(),
            "{:?}",
            body.completion.extra
        );
        assert_eq!(
            body.last_response.unwrap().tool_calls()[0].function.name,
            "again"
        );

        let error: ChatError = lenient::value(&json!({
            "code": "llm_http_error", "message": "HTTP 429", "status": 429, "retry_after": 3
        }));
        assert_eq!(error.code, ChatErrorCode::LlmHttpError);
        assert_eq!(error.status, Some(429));
        assert_eq!(error.extra["retry_after"], 3);
    }

    #[test]
    fn hostile_shapes_do_not_panic() {
        let hostile = [
            json!(null),
            json!([]),
            json!("chat.completion"),
            json!(1e308),
            json!({"choices": "many"}),
            json!({"choices": [null, [], 3, {"message": "hi"}]}),
            json!({"choices": [{"message": {"content": 5, "tool_calls": {"a": 1}}}]}),
            json!({"choices": [{"message": {"role": 1, "content": {"text": "x"}},
                                "finish_reason": 3, "index": -1}]}),
            json!({"created": -5, "usage": {"prompt_tokens": 1e30, "total_tokens": "12",
                                            "completion_tokens": 1.8446744073709552e19}}),
            json!({"error": "broken", "_spear": [1], "last_response": 4}),
            json!({"error": {"code": 4, "message": null, "status": 70000, "value": -1}}),
            json!({"_spear": {"iterations": -1, "tool_calls": [{"kind": 3, "ok": "yes", "ms": 1.5}]}}),
        ];
        for json in hostile {
            let body = ResponseBody::from_json(&json);
            let _ = body.completion.text();
            let _ = body.completion.tool_calls();
            let _ = body.completion.finish_reason();
        }

        let body = ResponseBody::from_json(&json!({"created": -5, "usage": {
            "prompt_tokens": 1e30, "total_tokens": "12", "completion_tokens": 7}}));
        assert_eq!(body.completion.created, None);
        let usage = body.completion.usage.unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens
            ),
            (0, 7, 0)
        );

        let body = ResponseBody::from_json(&json!({
            "error": {"code": 4, "message": null, "status": 70000}}));
        let error = body.error.unwrap();
        assert_eq!(error.code, ChatErrorCode::Other(String::new()));
        assert_eq!((error.message.as_str(), error.status), ("", None));

        let body = ResponseBody::from_json(&json!({"error": "broken", "_spear": [1]}));
        assert_eq!((body.error, body.spear), (None, None));

        let body = ResponseBody::from_json(&json!({"_spear": {"tool_calls": [
            {"kind": 3, "ok": "yes", "ms": 1.5}]}}));
        let record = &body.spear.unwrap().tool_calls[0];
        assert_eq!(record.kind, ToolKind::Other(String::new()));
        assert_eq!((record.ok, record.ms), (None, None));
    }

    #[test]
    fn metrics() {
        let metrics: Metrics = lenient::value(&json!({
            "iterations": 2, "llm_requests": 3, "llm_retries": 1, "llm_errors": 0,
            "prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
            "tool_calls": {"guest": 1, "mcp": 1, "unknown": 0, "denied": 0, "failed": 0},
            "latency_ms": {"total": 412, "llm": 398, "tools": 9},
            "cache_hits": 4
        }));
        assert_eq!(metrics.llm_requests, 3);
        assert_eq!(metrics.tool_calls.guest, 1);
        assert_eq!(metrics.latency_ms.total, 412);
        assert_eq!(metrics.extra["cache_hits"], 4);
        assert_eq!(
            serde_json::to_value(&metrics).unwrap()["latency_ms"],
            json!({"total": 412, "llm": 398, "tools": 9})
        );

        let odd: Metrics = lenient::value(&json!({"iterations": "2", "tool_calls": [],
                                                 "latency_ms": {"total": -1, "llm": 5}}));
        assert_eq!(odd.iterations, 0);
        assert_eq!(odd.tool_calls, ToolCallCounts::default());
        assert_eq!((odd.latency_ms.total, odd.latency_ms.llm), (0, 5));
        assert_eq!(lenient::value::<Metrics>(&json!(null)), Metrics::default());
    }
}
