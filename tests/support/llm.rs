//! A scripted, OpenAI-compatible chat-completions server for tests.
//!
//! [`ScriptedLlm`] is a real HTTP server on `127.0.0.1:<random port>` that answers
//! `POST /v1/chat/completions` with the next [`Reply`] of its script and records every request
//! it receives (method, path, lower-cased headers and JSON body). Point the host's LLM backend
//! at [`ScriptedLlm::base_url`] and assert on [`ScriptedLlm::requests`] afterwards.
//!
//! ```ignore
//! let llm = ScriptedLlm::start(vec![
//!     Reply::tool_call("call_1", "echo", json!({"text": "hi"})),
//!     Reply::text("done"),
//! ])
//! .await;
//! // ... run a guest against llm.base_url() ...
//! assert_eq!(llm.remaining(), 0);
//! assert_eq!(tool_names(&llm.requests()[0]), ["echo"]);
//! ```
//!
//! The server runs on its own thread with its own Tokio runtime, so it keeps answering whatever
//! the test's runtime is doing (even a blocking call on a current-thread runtime). It stops when
//! the `ScriptedLlm` is dropped: the drop signals a graceful shutdown, cancels pending
//! [`Reply::Delay`]s, and joins the thread.
//!
//! A script that runs out never hangs a test: extra requests get a 500 whose body says
//! `scripted LLM: no reply left for request N`. Requests to any other method or path are
//! recorded too (so a wrong URL shows up in [`ScriptedLlm::recorded`]) and answered 404 without
//! consuming a reply.
//!
//! [`ScriptedLlm::start_anthropic`] serves the same script as the Anthropic Messages API
//! (`POST /v1/messages`): text and tool calls become `text` and `tool_use` blocks, errors
//! [`Reply::anthropic_error`] bodies. It checks each request has the shape that API requires
//! and answers a 400 naming the fault otherwise: the `anthropic-version` header, `model`,
//! `max_tokens`, a `temperature` of 0 to 1; `user`/`assistant` turns that alternate and
//! start with `user` (stricter than the API, which would combine repeated turns, so a
//! translation that leaves them is seen); non-empty content and text blocks that are not
//! just whitespace; `tool_use` ids matching `^[a-zA-Z0-9_-]+$` and unique in the request;
//! every `tool_use` answered by a `tool_result` at the start of the next turn and every
//! `tool_result` answering one; images of the four types the API takes, of at most 5 MB
//! of base64, at most 100 of them.
//!
//! [`ScriptedLlm::start_responses`] serves it as the OpenAI Responses API
//! (`POST /v1/responses`) and [`ScriptedLlm::start_gemini`] as Gemini `generateContent`
//! (`POST /v1/models/{model}:generateContent`); each checks the rules of its API, kept in
//! one place ([`responses`], [`gemini`]'s module docs list them).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri, header};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::serve::{BackgroundServer, Bound};

mod gemini;
mod responses;

/// Prompt tokens reported per request message (`prompt_tokens = 10 * messages.len()`).
pub const PROMPT_TOKENS_PER_MESSAGE: u64 = 10;
/// Completion tokens reported for every [`Reply::Text`] and [`Reply::ToolCalls`].
pub const COMPLETION_TOKENS: u64 = 5;

/// One scripted answer; each chat-completions request consumes the next one.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A `chat.completion` whose assistant message has this text content
    /// (`finish_reason: "stop"`).
    Text(String),
    /// A `chat.completion` whose assistant message calls these tools, as
    /// `(id, name, arguments JSON string)`; `content` is null and `finish_reason` is
    /// `"tool_calls"`.
    ToolCalls(Vec<(String, String, String)>),
    /// Any JSON body, status 200.
    Json(Value),
    /// This status with this raw body (served as `application/json` if it parses as JSON,
    /// `text/plain` otherwise) and an optional `Retry-After` header.
    Status {
        code: u16,
        body: String,
        retry_after: Option<String>,
    },
    /// Status 200, `Content-Type: application/json`, with a body that is not JSON.
    Garbage(String),
    /// Sleeps this long, then answers with the inner reply (for timeout tests). Cut short
    /// when the server is dropped.
    Delay(Duration, Box<Reply>),
    /// Status 200, `application/json`: a `chat.completion` padded to `bytes` bytes (for
    /// response-size caps). With `chunked`, it streams in 64 KiB pieces without a
    /// `Content-Length`; otherwise it declares its length up front.
    Huge { bytes: usize, chunked: bool },
    /// Status 200, `application/json`, the first bytes of a completion, and then nothing
    /// more until the server stops: a body that never ends (for deadline tests).
    Stalled,
}

impl Reply {
    /// [`Reply::Text`].
    pub fn text(content: impl Into<String>) -> Self {
        Reply::Text(content.into())
    }

    /// A [`Reply::ToolCalls`] with a single call; `arguments` is serialised to a JSON string.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Reply::ToolCalls(vec![(id.into(), name.into(), arguments.to_string())])
    }

    /// A [`Reply::ToolCalls`] from `(id, name, arguments)` triples; each `arguments` is
    /// serialised to a JSON string.
    pub fn tool_calls<I, N>(calls: impl IntoIterator<Item = (I, N, Value)>) -> Self
    where
        I: Into<String>,
        N: Into<String>,
    {
        Reply::ToolCalls(
            calls
                .into_iter()
                .map(|(id, name, args)| (id.into(), name.into(), args.to_string()))
                .collect(),
        )
    }

    /// A [`Reply::Status`] without `Retry-After`.
    pub fn status(code: u16, body: impl Into<String>) -> Self {
        Reply::Status {
            code,
            body: body.into(),
            retry_after: None,
        }
    }

    /// A 429 with an OpenAI-style error body and `Retry-After: <retry_after>`.
    pub fn rate_limited(retry_after: impl Into<String>) -> Self {
        Reply::Status {
            code: 429,
            body: openai_error("Rate limit reached", "rate_limit_exceeded").to_string(),
            retry_after: Some(retry_after.into()),
        }
    }

    /// A status with an OpenAI-style error body (`{"error":{"message":..,"type":..}}`).
    pub fn error(code: u16, message: &str) -> Self {
        let kind = match code {
            400 => "invalid_request_error",
            401 => "authentication_error",
            429 => "rate_limit_exceeded",
            _ => "server_error",
        };
        Reply::status(code, openai_error(message, kind).to_string())
    }

    /// A status with an Anthropic error body (`{"type":"error","error":{...}}`).
    pub fn anthropic_error(code: u16, message: &str) -> Self {
        Reply::status(code, anthropic_error(code, message).to_string())
    }

    /// An Anthropic `message` with these content blocks and `stop_reason`, for answers
    /// [`Reply::Text`] and [`Reply::ToolCalls`] do not make (served as [`Reply::Json`]).
    pub fn anthropic_message(content: Value, stop_reason: &str) -> Self {
        Reply::Json(json!({
            "id": "msg_scripted",
            "type": "message",
            "role": "assistant",
            "model": "scripted-model",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": COMPLETION_TOKENS},
        }))
    }

    /// [`Reply::Delay`]: `reply`, after `delay`.
    pub fn delayed(delay: Duration, reply: Reply) -> Self {
        Reply::Delay(delay, Box::new(reply))
    }
}

fn anthropic_error(code: u16, message: &str) -> Value {
    let kind = match code {
        400 => "invalid_request_error",
        401 => "authentication_error",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn openai_error(message: &str, kind: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// `"POST"`, `"GET"`, ...
    pub method: String,
    /// The URI path, without the query, e.g. `"/v1/chat/completions"`.
    pub path: String,
    /// Headers in the order received; names are lower-case.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON; a body that is not JSON is recorded as a JSON string
    /// (`Value::Null` for an empty body).
    pub body: Value,
}

impl Recorded {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    recorded: Vec<Recorded>,
    /// Chat-completions requests seen so far (numbering for ids and error messages).
    chat_requests: usize,
    /// Responses: the stored responses (`store: true`) by id, with their calls' ids.
    stored: std::collections::HashMap<String, Vec<String>>,
}

/// The wire format a [`ScriptedLlm`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
    Responses,
    Gemini,
}

impl Wire {
    /// The backend kind that speaks it.
    pub fn backend_kind(self) -> quiver::llm::BackendKind {
        match self {
            Wire::OpenAi => quiver::llm::BackendKind::Openai,
            Wire::Anthropic => quiver::llm::BackendKind::Anthropic,
            Wire::Responses => quiver::llm::BackendKind::OpenaiResponses,
            Wire::Gemini => quiver::llm::BackendKind::Gemini,
        }
    }
}

struct Shared {
    wire: Wire,
    inner: Mutex<Inner>,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A scripted OpenAI-compatible chat-completions server; see the module docs.
pub struct ScriptedLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _server: BackgroundServer,
}

impl ScriptedLlm {
    /// Binds `127.0.0.1:0` and serves `script` in the background until dropped.
    pub async fn start(script: Vec<Reply>) -> ScriptedLlm {
        Self::start_blocking(script)
    }

    /// [`ScriptedLlm::start`] for synchronous tests; needs no Tokio runtime.
    pub fn start_blocking(script: Vec<Reply>) -> ScriptedLlm {
        Self::start_wire(script, Wire::OpenAi)
    }

    /// A scripted Anthropic Messages server (`POST /v1/messages`); see the module docs.
    pub async fn start_anthropic(script: Vec<Reply>) -> ScriptedLlm {
        Self::start_wire(script, Wire::Anthropic)
    }

    /// A scripted OpenAI Responses server (`POST /v1/responses`); see [`responses`].
    pub async fn start_responses(script: Vec<Reply>) -> ScriptedLlm {
        Self::start_wire(script, Wire::Responses)
    }

    /// A scripted Gemini server (`POST /v1/models/{model}:generateContent`); see [`gemini`].
    pub async fn start_gemini(script: Vec<Reply>) -> ScriptedLlm {
        Self::start_wire(script, Wire::Gemini)
    }

    /// The wire format this server speaks.
    pub fn wire(&self) -> Wire {
        self.shared.wire
    }

    /// A server speaking `wire`.
    pub fn start_wire(script: Vec<Reply>, wire: Wire) -> ScriptedLlm {
        let bound = Bound::new("scripted LLM");
        let addr = bound.addr;
        let shared = Arc::new(Shared {
            wire,
            inner: Mutex::new(Inner {
                script: script.into(),
                ..Inner::default()
            }),
            shutdown: bound.stopping.clone(),
        });

        let router = Router::new()
            .fallback(handle)
            .with_state(shared.clone())
            .layer(DefaultBodyLimit::disable());

        let server = bound.serve("scripted-llm", router);

        ScriptedLlm {
            addr,
            shared,
            _server: server,
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1`, the OpenAI-style base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1/chat/completions`.
    pub fn chat_completions_url(&self) -> String {
        format!("{}/chat/completions", self.base_url())
    }

    /// The JSON bodies of the chat-completions requests received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.chat_recorded().into_iter().map(|r| r.body).collect()
    }

    /// The headers (lower-case names) of the chat-completions requests received, in order.
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        self.chat_recorded()
            .into_iter()
            .map(|r| r.headers)
            .collect()
    }

    /// The body of the `index`-th (0-based) chat-completions request; panics if there is none.
    pub fn request(&self, index: usize) -> Value {
        let requests = self.requests();
        match requests.get(index) {
            Some(r) => r.clone(),
            None => panic!(
                "scripted LLM: no request #{index} (received {} chat-completions requests)",
                requests.len()
            ),
        }
    }

    /// Every request received, on any path (including ones answered 404), in order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared.lock().recorded.clone()
    }

    /// How many chat-completions requests were received (served or not).
    pub fn request_count(&self) -> usize {
        self.shared.lock().chat_requests
    }

    /// Replies not yet served.
    pub fn remaining(&self) -> usize {
        self.shared.lock().script.len()
    }

    /// Appends `reply` to the script.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().script.push_back(reply);
    }

    /// Drops the replies not yet served.
    pub fn clear_script(&self) {
        self.shared.lock().script.clear();
    }

    /// Forgets the requests recorded so far (a long run would otherwise keep them all);
    /// [`request_count`](Self::request_count) keeps counting.
    pub fn clear_recorded(&self) {
        self.shared.lock().recorded.clear();
    }

    fn chat_recorded(&self) -> Vec<Recorded> {
        self.shared
            .lock()
            .recorded
            .iter()
            .filter(|r| is_chat(&r.method, &r.path, self.shared.wire))
            .cloned()
            .collect()
    }
}

impl std::fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedLlm")
            .field("addr", &self.addr)
            .field("remaining", &self.remaining())
            .field("requests", &self.request_count())
            .finish()
    }
}

/// The messages of a chat-completions request body (`request["messages"]`); panics if absent.
pub fn messages(request: &Value) -> &Vec<Value> {
    match request.get("messages").and_then(Value::as_array) {
        Some(m) => m,
        None => panic!("request has no \"messages\" array: {request}"),
    }
}

/// The `role` of each message in `request`.
pub fn roles(request: &Value) -> Vec<String> {
    messages(request)
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The last message of `request`; panics if there are none.
pub fn last_message(request: &Value) -> &Value {
    messages(request)
        .last()
        .unwrap_or_else(|| panic!("request has no messages: {request}"))
}

/// The text of a message's `content`: the string itself, or the concatenated `text` of its
/// content parts; `""` when null or absent.
pub fn content_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .concat(),
        _ => String::new(),
    }
}

/// The function names offered in `request["tools"]` (empty if there are no tools).
pub fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `tool` messages of `request` as `(tool_call_id, content text)`, in order.
pub fn tool_results(request: &Value) -> Vec<(String, String)> {
    messages(request)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                content_text(m),
            )
        })
        .collect()
}

/// The `usage` a scripted completion reports for a request with `message_count` messages:
/// `(prompt_tokens, completion_tokens, total_tokens)`.
pub fn expected_usage(message_count: usize) -> (u64, u64, u64) {
    let prompt = PROMPT_TOKENS_PER_MESSAGE * message_count as u64;
    (prompt, COMPLETION_TOKENS, prompt + COMPLETION_TOKENS)
}

fn is_chat(method: &str, path: &str, wire: Wire) -> bool {
    if wire == Wire::Gemini {
        return method == "POST" && !gemini::model(path).is_empty();
    }
    let route = match wire {
        Wire::OpenAi => "/v1/chat/completions",
        Wire::Anthropic => "/v1/messages",
        Wire::Responses => "/v1/responses",
        Wire::Gemini => unreachable!("matched above"),
    };
    method == "POST" && path.trim_end_matches('/') == route
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    let recorded = Recorded {
        method: method.as_str().to_owned(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
    };
    let chat = is_chat(&recorded.method, &recorded.path, shared.wire);
    let request = recorded.body.clone();

    let (number, reply) = {
        let mut inner = shared.lock();
        let fault = match shared.wire {
            _ if !chat => None,
            Wire::OpenAi => None,
            Wire::Anthropic => anthropic_fault(&recorded),
            Wire::Responses => responses::fault(&recorded, &inner.stored),
            Wire::Gemini => gemini::fault(&recorded),
        };
        let path = recorded.path.clone();
        inner.recorded.push(recorded);
        if !chat {
            drop(inner);
            return plain(
                StatusCode::NOT_FOUND,
                format!("scripted LLM: no route for {method} {}", uri.path()),
            );
        }
        inner.chat_requests += 1;
        if let Some(fault) = fault {
            drop(inner);
            let body = match shared.wire {
                Wire::Anthropic => anthropic_error(400, &fault),
                Wire::Gemini => gemini::error_body(400, &fault),
                _ => openai_error(&fault, "invalid_request_error"),
            };
            return json_response(StatusCode::BAD_REQUEST, body.to_string(), None);
        }
        let number = inner.chat_requests;
        let reply = inner.script.pop_front();
        if shared.wire == Wire::Gemini
            && let Some(answer) = gemini::answer(number, &path, &request, reply.as_ref())
        {
            return json_response(StatusCode::OK, answer.to_string(), None);
        }
        if shared.wire == Wire::Responses
            && let Some(answer) =
                responses::answer(number, &request, reply.as_ref(), &mut inner.stored)
        {
            return json_response(StatusCode::OK, answer.to_string(), None);
        }
        (number, reply)
    };
    if shared.wire == Wire::Anthropic {
        match reply {
            Some(Reply::Text(text)) => {
                let blocks = json!([{"type": "text", "text": text}]);
                return json_response(
                    StatusCode::OK,
                    anthropic_message(number, &request, blocks, "end_turn").to_string(),
                    None,
                );
            }
            Some(Reply::ToolCalls(calls)) => {
                let blocks: Vec<Value> = calls
                    .into_iter()
                    .map(|(id, name, arguments)| {
                        let input: Value = serde_json::from_str(&arguments)
                            .expect("scripted LLM: tool call arguments must be JSON");
                        json!({"type": "tool_use", "id": id, "name": name, "input": input})
                    })
                    .collect();
                return json_response(
                    StatusCode::OK,
                    anthropic_message(number, &request, Value::Array(blocks), "tool_use")
                        .to_string(),
                    None,
                );
            }
            _ => {}
        }
    }
    let Some(mut reply) = reply else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("scripted LLM: no reply left for request {number}"),
        );
    };

    while let Reply::Delay(delay, inner) = reply {
        let mut shutdown = shared.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait_for(|stop| *stop) => {
                return plain(StatusCode::SERVICE_UNAVAILABLE, "scripted LLM: shutting down".into());
            }
        }
        reply = *inner;
    }

    match reply {
        Reply::Text(text) => json_response(
            StatusCode::OK,
            completion(number, &request, json!(text), None, "stop").to_string(),
            None,
        ),
        Reply::ToolCalls(calls) => {
            let calls: Vec<Value> = calls
                .into_iter()
                .map(|(id, name, arguments)| {
                    json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    })
                })
                .collect();
            json_response(
                StatusCode::OK,
                completion(number, &request, Value::Null, Some(calls), "tool_calls").to_string(),
                None,
            )
        }
        Reply::Json(value) => json_response(StatusCode::OK, value.to_string(), None),
        Reply::Status {
            code,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(code)
                .unwrap_or_else(|_| panic!("scripted LLM: invalid status code {code}"));
            if serde_json::from_str::<Value>(&body).is_ok() {
                json_response(status, body, retry_after)
            } else {
                response(status, "text/plain; charset=utf-8", body, retry_after)
            }
        }
        Reply::Garbage(body) => json_response(StatusCode::OK, body, None),
        Reply::Huge { bytes, chunked } => huge(bytes, chunked),
        Reply::Stalled => {
            let mut shutdown = shared.shutdown.clone();
            let start = futures::stream::once(async { Ok(Bytes::from_static(b"{\"choices\":[")) });
            let never_more = futures::stream::once(async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
                Err(std::io::Error::other("scripted LLM: shutting down"))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(futures::StreamExt::chain(
                    start, never_more,
                )))
                .expect("scripted LLM: build response")
        }
        Reply::Delay(..) => unreachable!("delays were unwrapped above"),
    }
}

/// An OpenAI `chat.completion` object for request number `number`.
fn completion(
    number: usize,
    request: &Value,
    content: Value,
    tool_calls: Option<Vec<Value>>,
    finish_reason: &str,
) -> Value {
    let model = request["model"].as_str().unwrap_or("scripted-model");
    let message_count = request["messages"].as_array().map_or(0, Vec::len);
    let (prompt_tokens, completion_tokens, total_tokens) = expected_usage(message_count);
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(calls) = tool_calls {
        message["tool_calls"] = Value::Array(calls);
    }
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "id": format!("chatcmpl-scripted-{number}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": total_tokens,
        },
    })
}

/// An Anthropic `message` with these content blocks; usage as [`expected_usage`] (by the
/// request's message count).
fn anthropic_message(number: usize, request: &Value, content: Value, stop: &str) -> Value {
    let message_count = request["messages"].as_array().map_or(0, Vec::len);
    let (input_tokens, output_tokens, _) = expected_usage(message_count);
    json!({
        "id": format!("msg_scripted_{number}"),
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    })
}

/// What is wrong with a Messages request, by the rules in the module docs.
fn anthropic_fault(request: &Recorded) -> Option<String> {
    let body = &request.body;
    if request.header("anthropic-version").is_none() {
        return Some("missing anthropic-version header".into());
    }
    if !body["model"].is_string() || body["max_tokens"].as_u64().is_none_or(|n| n < 1) {
        return Some("model and max_tokens are required".into());
    }
    if body["temperature"]
        .as_f64()
        .is_some_and(|t| !(0.0..=1.0).contains(&t))
    {
        return Some("temperature: Input should be less than or equal to 1".into());
    }
    let Some(messages) = body["messages"].as_array() else {
        return Some("messages: Field required".into());
    };
    let mut ids = std::collections::HashSet::new();
    let mut images = 0;
    // The ids of the `tool_use` blocks of the turn before, each answered at most once.
    let mut asked: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages.{i}");
        let want = if i % 2 == 0 { "user" } else { "assistant" };
        if message["role"] != want {
            return Some(format!("{at}.role: expected `{want}`"));
        }
        let blocks = match &message["content"] {
            Value::String(text) if text.trim().is_empty() => {
                return Some(format!(
                    "{at}: text content blocks must contain non-whitespace text"
                ));
            }
            Value::String(_) if asked.is_empty() => continue,
            Value::String(_) => {
                return Some(format!(
                    "{at}: `tool_use` ids were found without `tool_result` blocks immediately after: {}",
                    asked.join(", ")
                ));
            }
            Value::Array(blocks) if blocks.is_empty() => {
                return Some(format!("{at}: all messages must have non-empty content"));
            }
            Value::Array(blocks) => blocks,
            _ => return Some(format!("{at}.content: Input should be a valid list")),
        };
        let mut answered = Vec::new();
        let mut past_results = false;
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content.{j}");
            let nested = match &block["content"] {
                Value::Array(parts) => parts.iter().collect(),
                _ => Vec::new(),
            };
            for part in std::iter::once(block).chain(nested) {
                if let Some(fault) = block_fault(part, &mut images) {
                    return Some(format!("{at}: {fault}"));
                }
            }
            match block["type"].as_str() {
                Some("tool_use") => {
                    let id = block["id"].as_str().unwrap_or_default();
                    let valid = !id.is_empty()
                        && id
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                    if !valid {
                        return Some(format!(
                            "{at}.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                        ));
                    }
                    if !ids.insert(id.to_owned()) {
                        return Some(format!("{at}: `tool_use` ids must be unique ({id})"));
                    }
                }
                Some("tool_result") => {
                    if past_results {
                        return Some(format!("{at}: tool_result blocks must come first"));
                    }
                    let id = block["tool_use_id"].as_str().unwrap_or_default();
                    match asked.iter().position(|asked| asked == id) {
                        Some(k) => answered.push(asked.remove(k)),
                        None => {
                            return Some(format!(
                                "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                            ));
                        }
                    }
                }
                _ => past_results = true,
            }
        }
        if !asked.is_empty() {
            return Some(format!(
                "{at}: `tool_use` ids were found without `tool_result` blocks immediately after: {}",
                asked.join(", ")
            ));
        }
        if message["role"] == "assistant" {
            asked = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap_or_default().to_owned())
                .collect();
        }
    }
    if !asked.is_empty() {
        return Some(format!(
            "`tool_use` ids were found without `tool_result` blocks immediately after: {}",
            asked.join(", ")
        ));
    }
    None
}

/// Images one request may carry.
const ANTHROPIC_MAX_IMAGES: usize = 100;

/// What is wrong with one content block (top-level, or inside a `tool_result`).
fn block_fault(block: &Value, images: &mut usize) -> Option<String> {
    match block["type"].as_str() {
        Some("text") if block["text"].as_str().is_none_or(|t| t.trim().is_empty()) => {
            Some("text content blocks must contain non-whitespace text".into())
        }
        Some("image") => {
            *images += 1;
            if *images > ANTHROPIC_MAX_IMAGES {
                return Some(format!("too many images (at most {ANTHROPIC_MAX_IMAGES})"));
            }
            let source = &block["source"];
            match source["type"].as_str() {
                Some("base64") => {
                    let media_type = source["media_type"].as_str().unwrap_or_default();
                    if !["image/jpeg", "image/png", "image/gif", "image/webp"].contains(&media_type)
                    {
                        return Some(format!(
                            "source.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp' ({media_type})"
                        ));
                    }
                    let len = source["data"].as_str().map_or(0, str::len);
                    (len > 5 * 1024 * 1024).then(|| "image exceeds 5 MB maximum".into())
                }
                Some("url") => None,
                _ => Some("source: Input tag does not match 'base64' or 'url'".into()),
            }
        }
        _ => None,
    }
}

/// A `chat.completion` whose `pad` field makes it `bytes` long (see [`Reply::Huge`]).
fn huge(bytes: usize, chunked: bool) -> Response<Body> {
    const HEAD: &str = r#"{"object":"chat.completion","choices":[],"pad":""#;
    const TAIL: &str = r#""}"#;
    let pad = bytes.saturating_sub(HEAD.len() + TAIL.len());
    let builder = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json");
    let body = if chunked {
        const PIECE: usize = 64 * 1024;
        let pieces = std::iter::once(Bytes::from_static(HEAD.as_bytes()))
            .chain(
                (0..pad.div_ceil(PIECE))
                    .map(move |i| Bytes::from(vec![b'x'; PIECE.min(pad - i * PIECE)])),
            )
            .chain(std::iter::once(Bytes::from_static(TAIL.as_bytes())))
            .map(Ok::<_, std::convert::Infallible>);
        Body::from_stream(futures::stream::iter(pieces))
    } else {
        Body::from(format!("{HEAD}{}{TAIL}", "x".repeat(pad)))
    };
    builder.body(body).expect("scripted LLM: build response")
}

fn plain(status: StatusCode, body: String) -> Response<Body> {
    response(status, "text/plain; charset=utf-8", body, None)
}

fn json_response(status: StatusCode, body: String, retry_after: Option<String>) -> Response<Body> {
    response(status, "application/json", body, retry_after)
}

fn response(
    status: StatusCode,
    content_type: &str,
    body: String,
    retry_after: Option<String>,
) -> Response<Body> {
    let mut builder = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type);
    if let Some(retry_after) = retry_after {
        builder = builder.header(header::RETRY_AFTER, retry_after);
    }
    builder
        .body(Body::from(body))
        .expect("scripted LLM: build response")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::raw_http::{self, Answer};

    async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
        let headers = [
            ("Authorization", "Bearer sk-test"),
            ("Content-Type", "application/json"),
            ("X-Custom", "Yes"),
        ];
        raw_http::send(addr, method, path, &headers, body).await
    }

    async fn chat(llm: &ScriptedLlm, body: &Value) -> Answer {
        send(
            llm.addr(),
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        )
        .await
    }

    fn request_with(messages: usize) -> Value {
        let messages: Vec<Value> = (0..messages)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        json!({
            "model": "gpt-test",
            "messages": messages,
            "tools": [
                {"type": "function", "function": {"name": "search", "parameters": {}}},
                {"type": "function", "function": {"name": "fetch", "parameters": {}}},
            ],
        })
    }

    #[tokio::test]
    async fn text_completion_has_openai_shape_and_is_recorded() {
        let llm = ScriptedLlm::start(vec![Reply::text("hello")]).await;
        assert!(llm.base_url().starts_with("http://127.0.0.1:"));
        assert!(llm.base_url().ends_with("/v1"));
        assert_eq!(llm.remaining(), 1);

        let answer = chat(&llm, &request_with(3)).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let body = answer.json();
        assert_eq!(body["id"], "chatcmpl-scripted-1");
        assert_eq!(body["object"], "chat.completion");
        assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
        assert_eq!(body["model"], "gpt-test");
        let choice = &body["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": "hello"})
        );
        assert_eq!(
            body["usage"],
            json!({"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35})
        );
        assert_eq!(expected_usage(3), (30, 5, 35));

        assert_eq!(llm.remaining(), 0);
        assert_eq!(llm.request_count(), 1);
        let requests = llm.requests();
        assert_eq!(requests, vec![request_with(3)]);
        assert_eq!(tool_names(&requests[0]), ["search", "fetch"]);
        assert_eq!(messages(&requests[0]).len(), 3);
        assert_eq!(roles(&requests[0]), ["user", "user", "user"]);
        assert_eq!(content_text(last_message(&requests[0])), "m2");

        let headers = &llm.request_headers()[0];
        assert!(headers.contains(&("authorization".into(), "Bearer sk-test".into())));
        assert!(headers.contains(&("x-custom".into(), "Yes".into())));
        let recorded = &llm.recorded()[0];
        assert_eq!(recorded.method, "POST");
        assert_eq!(recorded.path, "/v1/chat/completions");
        assert_eq!(recorded.header("Content-Type"), Some("application/json"));
    }

    #[tokio::test]
    async fn tool_calls_completion() {
        let llm = ScriptedLlm::start(vec![
            Reply::ToolCalls(vec![
                ("call_1".into(), "search".into(), r#"{"q":"rust"}"#.into()),
                ("call_2".into(), "fetch".into(), "{}".into()),
            ]),
            Reply::tool_call("call_3", "search", json!({"q": "wasm"})),
        ])
        .await;
        let mut request = json!({"messages": [{"role": "user", "content": "go"}]});
        let body = chat(&llm, &request).await.json();
        assert_eq!(body["id"], "chatcmpl-scripted-1");
        assert_eq!(body["model"], "scripted-model");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["role"], "assistant");
        assert!(choice["message"]["content"].is_null());
        assert_eq!(
            choice["message"]["tool_calls"],
            json!([
                {"id": "call_1", "type": "function",
                 "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "fetch", "arguments": "{}"}},
            ])
        );
        assert_eq!(body["usage"]["total_tokens"], 15);

        request["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "tool", "tool_call_id": "call_1", "content": "found"}));
        let body = chat(&llm, &request).await.json();
        assert_eq!(body["id"], "chatcmpl-scripted-2");
        assert_eq!(
            body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"q\":\"wasm\"}"
        );
        assert_eq!(body["usage"]["prompt_tokens"], 20);
        assert_eq!(
            tool_results(&llm.request(1)),
            [("call_1".to_owned(), "found".to_owned())]
        );
        assert!(tool_names(&llm.request(1)).is_empty());
    }

    #[tokio::test]
    async fn status_json_garbage_and_exhaustion() {
        let llm = ScriptedLlm::start(vec![
            Reply::Status {
                code: 429,
                body: "slow down".into(),
                retry_after: Some("2".into()),
            },
            Reply::error(500, "boom"),
            Reply::Json(json!({"anything": true})),
            Reply::Garbage("<html>not json".into()),
        ])
        .await;
        let request = request_with(1);

        let answer = chat(&llm, &request).await;
        assert_eq!(answer.status, 429);
        assert_eq!(answer.header("retry-after"), Some("2"));
        assert_eq!(answer.body, "slow down");

        let answer = chat(&llm, &request).await;
        assert_eq!(answer.status, 500);
        assert_eq!(answer.header("retry-after"), None);
        assert_eq!(answer.json()["error"]["message"], "boom");

        let answer = chat(&llm, &request).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json(), json!({"anything": true}));

        let answer = chat(&llm, &request).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, "<html>not json");

        assert_eq!(llm.remaining(), 0);
        let answer = chat(&llm, &request).await;
        assert_eq!(answer.status, 500);
        assert_eq!(answer.body, "scripted LLM: no reply left for request 5");
        assert_eq!(llm.requests().len(), 5);
    }

    #[tokio::test]
    async fn non_json_bodies_and_other_paths_are_recorded() {
        let llm = ScriptedLlm::start(vec![Reply::text("ok")]).await;

        let answer = send(llm.addr(), "POST", "/v1/completions", "{}").await;
        assert_eq!(answer.status, 404);
        assert_eq!(llm.remaining(), 1, "a wrong path consumes no reply");

        let answer = send(llm.addr(), "POST", "/v1/chat/completions", "not json").await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["model"], "scripted-model");

        assert_eq!(llm.requests(), vec![json!("not json")]);
        let recorded = llm.recorded();
        assert_eq!(recorded.len(), 2);
        assert_eq!(recorded[0].path, "/v1/completions");
        assert_eq!(recorded[0].body, json!({}));
    }

    #[tokio::test]
    async fn delay_then_push() {
        let llm = ScriptedLlm::start(vec![Reply::delayed(
            Duration::from_millis(200),
            Reply::text("late"),
        )])
        .await;
        let started = std::time::Instant::now();
        let answer = chat(&llm, &request_with(1)).await;
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(answer.json()["choices"][0]["message"]["content"], "late");

        llm.push(Reply::text("more"));
        assert_eq!(llm.remaining(), 1);
        let answer = chat(&llm, &request_with(1)).await;
        assert_eq!(answer.json()["id"], "chatcmpl-scripted-2");
    }

    #[tokio::test]
    async fn drop_stops_the_server_even_with_a_pending_delay() {
        let llm = ScriptedLlm::start(vec![Reply::delayed(
            Duration::from_secs(3600),
            Reply::text("never"),
        )])
        .await;
        let addr = llm.addr();
        let pending =
            tokio::spawn(async move { send(addr, "POST", "/v1/chat/completions", "{}").await });
        while llm.request_count() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = std::time::Instant::now();
        drop(llm);
        assert!(started.elapsed() < Duration::from_secs(3));
        let answer = pending.await.expect("pending request");
        assert_eq!(answer.status, 503);
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn works_without_a_runtime() {
        let llm = ScriptedLlm::start_blocking(vec![Reply::text("sync")]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = runtime.block_on(chat(&llm, &request_with(2)));
        assert_eq!(answer.json()["usage"]["prompt_tokens"], 20);
    }
}
