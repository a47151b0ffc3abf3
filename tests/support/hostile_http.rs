//! A remote MCP server that answers too much, for the hostile-server tests: Streamable HTTP
//! at `/mcp` and the legacy HTTP+SSE transport at `/sse` (+ `POST /messages`).
//!
//! It speaks just enough MCP for the host to connect and call tools, with raw JSON-RPC so it
//! can break the rules. Tool `ok` answers `ok 1`; the tools of [`Misbehaviour`] answer with
//! an SSE event or a JSON body over any reasonable cap. Runs on its own thread (see
//! [`crate::serve`]) and stops when dropped.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::serve::{BackgroundServer, Bound};

/// Bytes of a huge answer: over any test's cap.
const HUGE: usize = 5_000_000;

/// Bytes of a JSON answer sent before it stalls.
const STALLED: usize = 200_000;

/// How a tool call is answered badly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// One SSE event (or legacy `message` event) of about 5 MB.
    HugeEvent,
    /// An SSE event that starts the answer and never ends (Streamable HTTP only).
    EndlessEvent,
    /// A JSON body of 17 MiB, over the 16 MiB rmcp's own client reads (Streamable HTTP
    /// only).
    HugeJsonBody,
    /// A JSON body that sends 200 000 bytes of an answer and then nothing more, without
    /// ending (Streamable HTTP only): a client that reads on to rmcp's 16 MiB waits forever.
    StalledJsonBody,
    /// HTTP 400 with a JSON-RPC error body of about 100 KB, over rmcp's 64 KiB cap for an
    /// error body (Streamable HTTP only).
    HugeJsonError,
    /// An SSE event (or legacy `message` event) whose result uses serde_json's reserved key
    /// `$serde_json::private::RawValue`, which would turn the string into structure.
    HiddenValues,
    /// The same answer as a plain JSON body (Streamable HTTP only).
    HiddenValuesJson,
    /// The same answer on the stream the client resumes (GET with `Last-Event-ID`) after
    /// the POST's stream ends with only an event id and a `retry:` (Streamable HTTP only).
    HiddenValuesResumed,
}

impl Misbehaviour {
    /// The tool whose call misbehaves this way.
    pub fn tool(self) -> &'static str {
        match self {
            Misbehaviour::HugeEvent => "huge_event",
            Misbehaviour::EndlessEvent => "endless_event",
            Misbehaviour::HugeJsonBody => "huge_json",
            Misbehaviour::StalledJsonBody => "stalled_json",
            Misbehaviour::HugeJsonError => "huge_json_error",
            Misbehaviour::HiddenValues => "hidden_values",
            Misbehaviour::HiddenValuesJson => "hidden_values_json",
            Misbehaviour::HiddenValuesResumed => "hidden_values_resumed",
        }
    }
}

#[derive(Default)]
struct Shared {
    /// The open legacy event stream, if any.
    legacy: Mutex<Option<mpsc::Sender<Bytes>>>,
    /// The answer a resumed Streamable HTTP stream carries, if any.
    resumed: Mutex<Option<Value>>,
}

/// The running server; see the module docs.
pub struct HostileHttp {
    _server: BackgroundServer,
    base: String,
}

impl HostileHttp {
    pub async fn start() -> HostileHttp {
        let bound = Bound::new("hostile HTTP");
        let base = format!("http://{}", bound.addr);
        let router = Router::new()
            .route(
                "/mcp",
                post(streamable)
                    .get(resume)
                    .delete(|| async { StatusCode::OK }),
            )
            .route("/sse", get(legacy_stream))
            .route("/messages", post(legacy_post))
            .with_state(Arc::new(Shared::default()));
        HostileHttp {
            _server: bound.serve("hostile-http", router),
            base,
        }
    }

    /// The Streamable HTTP endpoint.
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// The legacy SSE stream.
    pub fn sse_url(&self) -> String {
        format!("{}/sse", self.base)
    }
}

/// What a request is answered with.
enum Answer {
    None,
    Json(Value),
    /// An SSE event's bytes, ready to send.
    Event(Vec<u8>),
    Endless(Value),
    HugeJson(Value),
    /// A JSON body's first bytes, then a stall.
    StalledJson(Vec<u8>),
    /// Given on the stream the client resumes.
    Resumed(Value),
    HugeJsonError(Value),
}

fn answer_to(request: &Value) -> Answer {
    let Some(id) = request
        .get("id")
        .filter(|_| request.get("method").is_some())
    else {
        return Answer::None; // a notification
    };
    let result = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    let text = |text: String| json!({"content": [{"type": "text", "text": text}]});
    match request["method"].as_str().unwrap_or_default() {
        "initialize" => Answer::Json(result(json!({
            "protocolVersion": request["params"]["protocolVersion"].as_str().unwrap_or("2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile-http", "version": "0"},
        }))),
        "tools/list" => {
            let tools: Vec<Value> = [
                "ok",
                "huge_event",
                "endless_event",
                "huge_json",
                "huge_json_error",
                "hidden_values",
                "stalled_json",
                "hidden_values_json",
                "hidden_values_resumed",
            ]
            .iter()
            .map(|name| json!({"name": name, "inputSchema": {"type": "object"}}))
            .collect();
            Answer::Json(result(json!({"tools": tools})))
        }
        "tools/call" => match request["params"]["name"].as_str().unwrap_or_default() {
            "huge_event" => {
                let huge = result(text("x".repeat(HUGE))).to_string();
                Answer::Event(format!("event: message\ndata: {huge}\n\n").into_bytes())
            }
            "endless_event" => Answer::Endless(id.clone()),
            "hidden_values" => {
                let answer = hiding_values(result(text("ok".into())));
                Answer::Event(format!("event: message\ndata: {answer}\n\n").into_bytes())
            }
            "hidden_values_json" => Answer::Json(hiding_values(result(text("ok".into())))),
            "hidden_values_resumed" => Answer::Resumed(hiding_values(result(text("ok".into())))),
            "stalled_json" => {
                let mut body = result(text("x".repeat(STALLED))).to_string().into_bytes();
                body.truncate(STALLED);
                Answer::StalledJson(body)
            }
            "huge_json" => Answer::HugeJson(result(text("x".repeat(17 << 20)))),
            "huge_json_error" => Answer::HugeJsonError(json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32000, "message": "x".repeat(100_000)},
            })),
            _ => Answer::Json(result(text("ok 1".into()))),
        },
        _ => Answer::Json(result(json!({}))),
    }
}

/// `answer` with its structured content hidden in a string under serde_json's reserved key.
fn hiding_values(mut answer: Value) -> Value {
    answer["result"]["structuredContent"] = json!({"$serde_json::private::RawValue": "[[[1]]]"});
    answer
}

fn response(status: StatusCode, content_type: &str, body: Body) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header("mcp-session-id", "hostile-1")
        .body(body)
        .expect("hostile HTTP: build response")
}

/// An SSE body that starts an answer to `id` and then sends `x` until the client goes.
fn endless(id: &Value) -> Body {
    let head = format!(
        r#"data: {{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":""#
    );
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let stream = futures::stream::once(async move { Bytes::from(head) })
        .chain(futures::stream::repeat(chunk))
        .map(Ok::<_, std::convert::Infallible>);
    Body::from_stream(stream)
}

async fn streamable(State(shared): State<Arc<Shared>>, body: Bytes) -> Response<Body> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match answer_to(&request) {
        Answer::Resumed(answer) => {
            *shared.resumed.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
            let head = "id: post-1\nretry: 10\ndata:\n\n";
            response(StatusCode::OK, "text/event-stream", Body::from(head))
        }
        Answer::None => response(StatusCode::ACCEPTED, "application/json", Body::empty()),
        Answer::Json(value) | Answer::HugeJson(value) => response(
            StatusCode::OK,
            "application/json",
            Body::from(value.to_string()),
        ),
        Answer::HugeJsonError(value) => response(
            StatusCode::BAD_REQUEST,
            "application/json",
            Body::from(value.to_string()),
        ),
        Answer::Event(bytes) => response(StatusCode::OK, "text/event-stream", Body::from(bytes)),
        Answer::Endless(id) => response(StatusCode::OK, "text/event-stream", endless(&id)),
        Answer::StalledJson(head) => {
            let stream = futures::stream::once(async move { Bytes::from(head) })
                .chain(futures::stream::pending())
                .map(Ok::<_, std::convert::Infallible>);
            response(
                StatusCode::OK,
                "application/json",
                Body::from_stream(stream),
            )
        }
    }
}

/// A GET resuming a stream (`Last-Event-ID`) gets the answer kept for it; any other GET
/// is refused, as a server without a standalone stream refuses it.
async fn resume(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
) -> Response<Body> {
    let answer = headers
        .contains_key("last-event-id")
        .then(|| {
            shared
                .resumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
        })
        .flatten();
    match answer {
        Some(answer) => {
            let event = format!("id: post-2\nevent: message\ndata: {answer}\n\n");
            response(StatusCode::OK, "text/event-stream", Body::from(event))
        }
        None => response(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Body::empty()),
    }
}

async fn legacy_stream(State(shared): State<Arc<Shared>>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tx.try_send(Bytes::from_static(b"event: endpoint\ndata: /messages\n\n"))
        .expect("a fresh channel has room");
    *shared.legacy.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    let stream = tokio_stream(rx).map(Ok::<_, std::convert::Infallible>);
    response(
        StatusCode::OK,
        "text/event-stream",
        Body::from_stream(stream),
    )
}

fn tokio_stream(mut rx: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn legacy_post(State(shared): State<Arc<Shared>>, body: Bytes) -> StatusCode {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let event = match answer_to(&request) {
        Answer::None => return StatusCode::ACCEPTED,
        Answer::Json(value)
        | Answer::HugeJson(value)
        | Answer::HugeJsonError(value)
        | Answer::Endless(value) => format!("event: message\ndata: {value}\n\n").into_bytes(),
        Answer::Event(bytes) | Answer::StalledJson(bytes) => bytes,
        Answer::Resumed(value) => format!("event: message\ndata: {value}\n\n").into_bytes(),
    };
    let tx = shared
        .legacy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(tx) = tx {
        let _ = tx.send(Bytes::from(event)).await;
    }
    StatusCode::ACCEPTED
}
