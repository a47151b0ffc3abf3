//! The host's own `tools/call` on a stdio connection, beside rmcp's service loop.
//!
//! Through rmcp, a call is a message to the service loop's task, which registers it and
//! writes the line; the answer comes back through that task to the caller. The caller and
//! the loop are two tasks, so each call costs a wake-up (often a thread switch) on the way
//! out. A [`DirectCalls`] call skips the loop on the way out: the caller registers its
//! request in the connection's [`Guard`] (with its id, its kind for the caps, and a
//! oneshot for the answer) and writes the line itself under the transport's writer lock.
//! While it waits, the caller reads the pipe itself ([`ReadSide`]), so its answer wakes it
//! and not rmcp's loop first, which took that hop off the way back as well (BENCHMARKS.md,
//! issue 25, fourteenth look). Whoever reads hands the guard every
//! message as before; an answer to a direct call, or the error the guard makes for it (too
//! large, unreadable, flood, given up), goes to that oneshot and never reaches rmcp.
//! Everything else the server sends (its requests, notifications, answers to rmcp's own
//! requests) still goes to rmcp.
//!
//! Any stdio session uses it. A 2026-07-28 server asks its questions (roots, sampling,
//! elicitation) in `input_required` results, which are answers like any other: the
//! revision has no server-initiated requests (the multi round-trip pattern replaced them).
//! A server that sends one anyway during a direct call gets rmcp's -32602 (SEP-2260: none
//! of rmcp's own requests is in flight), or, if an rmcp request happens to be, the host's
//! refusal for want of a single request to own it; on rmcp's path it was answered.
//!
//! What rmcp would do is kept: the request carries the same `_meta` (a progress token; at
//! 2026-07-28 the client's protocol version, info and capabilities too), a dropped call
//! sends `notifications/cancelled` with rmcp's reason, an error answer is an
//! `McpError`, and the end of the transport fails the call as `TransportClosed`. The line
//! is serialised straight from the call's borrowed parts ([`CallRound`]): building rmcp's
//! request first would copy the arguments and the client context for every call. Ids are
//! negative numbers (-1, -2, ...), which JSON-RPC allows and rmcp's ids (counting up from
//! 0) never are; a number, because servers that answer `"7"` for 7 are matched as before.

use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotification, CancelledNotificationParam,
    ClientJsonRpcMessage, ClientNotification, InputResponses, JsonObject, JsonRpcMessage,
    RequestId, RequestMetaObject, ServerResult,
};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use super::guard::{Guard, Kind, Limits};
use super::lines::{ReadSide, Writer, write_line};
use crate::sync::lock;

/// The reason rmcp gives when a caller drops its request.
const ABANDONED: &str = "request abandoned by the caller";

/// A stdio connection's direct `tools/call` path (see the module docs).
pub(in crate::mcp) struct DirectCalls<R, W> {
    guard: Arc<Mutex<Guard>>,
    read: Arc<ReadSide<R>>,
    writer: Writer<W>,
    limits: Limits,
    /// The last id used, counting down.
    last_id: AtomicI64,
    /// The client context rmcp puts in every request's `_meta` on a session without
    /// `initialize` (2026-07-28); `None` before.
    meta: Option<ClientContext>,
}

impl<R, W> DirectCalls<R, W>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub(super) fn new(
        guard: Arc<Mutex<Guard>>,
        read: Arc<ReadSide<R>>,
        writer: Writer<W>,
        limits: Limits,
    ) -> Self {
        Self {
            guard,
            read,
            writer,
            limits,
            last_id: AtomicI64::new(0),
            meta: None,
        }
    }

    /// With the `_meta` rmcp adds to every request of a session without `initialize`
    /// (2026-07-28).
    pub(super) fn with_meta(mut self, meta: Option<RequestMetaObject>) -> Self {
        self.meta = meta.map(ClientContext::new);
        self
    }

    /// One `tools/call`, as rmcp's `call_tool_once` makes it and with what it returns.
    pub(in crate::mcp) async fn call_tool(
        &self,
        round: &CallRound<'_>,
    ) -> Result<CallToolResponse, ServiceError> {
        let n = self.last_id.fetch_sub(1, Ordering::Relaxed) - 1;
        let id = RequestId::Number(n);
        let kind = Kind::call(round.name);
        let line = round
            .line(n, self.meta.as_ref())
            .map_err(|_| ServiceError::TransportClosed)?;

        let (reply, answer) = oneshot::channel();
        // Registered before the line is written, so the answer cannot come first.
        if lock(&self.guard).on_direct_call(id.clone(), kind, reply) {
            let _abandoned = Abandoned { calls: self, id };
            let (now, write) = write_line(
                &self.writer,
                line,
                self.limits.write_timeout,
                self.limits.server_id.clone(),
            );
            let written = if now {
                write.await
            } else {
                // A line half on the wire must be finished whatever becomes of the call.
                tokio::spawn(write)
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            };
            if written.is_err() {
                // Not sent (or cut off, and stdin closed): nothing to cancel.
                lock(&self.guard).forget(&_abandoned.id);
                return Err(ServiceError::TransportClosed);
            }
            return answered(self.wait(answer).await);
        }
        answered(answer.await.ok())
    }

    /// Waits for `answer`, reading the pipe meanwhile when no one else does (see the
    /// module docs); gives the pipe back to rmcp when it stops waiting, answered or not.
    async fn wait(
        &self,
        mut answer: oneshot::Receiver<rmcp::model::ServerJsonRpcMessage>,
    ) -> Option<rmcp::model::ServerJsonRpcMessage> {
        let _hand_back = HandBack(&self.read);
        std::future::poll_fn(|cx| {
            // No waker of this task's on the channel while it reads: its own read may send
            // the answer, and waking a running task makes tokio poll it again, often from
            // another worker that steals it (two thread wake-ups a call instead of one).
            let mut unwoken = Context::from_waker(Waker::noop());
            if let Poll::Ready(got) = Pin::new(&mut answer).poll(&mut unwoken) {
                return Poll::Ready(got.ok());
            }
            let mut got = None;
            let mut done = || match answer.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => false,
                Ok(message) => {
                    got = Some(Some(message));
                    true
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    got = Some(None);
                    true
                }
            };
            // However the read ended, the answer is in `got` or comes through the channel.
            let _ = self
                .read
                .read_for_guard(&self.guard, &self.limits, cx, false, &mut done);
            if let Some(got) = got {
                return Poll::Ready(got);
            }
            // Another reader may route the answer: then it wakes this task.
            Pin::new(&mut answer).poll(cx).map(Result::ok)
        })
        .await
    }
}

/// The pipe goes back to rmcp's `receive` when a direct call stops waiting.
struct HandBack<'a, R: AsyncRead + Unpin>(&'a ReadSide<R>);

impl<R: AsyncRead + Unpin> Drop for HandBack<'_, R> {
    fn drop(&mut self) {
        self.0.hand_back();
    }
}

/// What the answer (or its absence: the guard dropped the call's sender) means, as rmcp's
/// `call_tool_once` reports it.
fn answered(
    answer: Option<rmcp::model::ServerJsonRpcMessage>,
) -> Result<CallToolResponse, ServiceError> {
    match answer {
        Some(JsonRpcMessage::Response(response)) => match response.result {
            ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
            ServerResult::InputRequiredResult(result) => {
                Ok(CallToolResponse::InputRequired(result))
            }
            ServerResult::CreateTaskResult(result) => Ok(CallToolResponse::Task(result)),
            _ => Err(ServiceError::UnexpectedResponse),
        },
        Some(JsonRpcMessage::Error(error)) => Err(ServiceError::McpError(error.error)),
        Some(_) => Err(ServiceError::UnexpectedResponse),
        // The transport ended before an answer came.
        None => Err(ServiceError::TransportClosed),
    }
}

fn encode(message: &impl Serialize) -> serde_json::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}

/// One round of a `tools/call` (SEP-2322 retries are further rounds), borrowed from the
/// call: the direct path writes its line from these parts, where rmcp's path would copy
/// the arguments and the client context into its request first.
pub(in crate::mcp) struct CallRound<'a> {
    pub name: &'a str,
    pub arguments: &'a JsonObject,
    pub input_responses: Option<InputResponses>,
    pub request_state: Option<String>,
    /// What the caller puts in `_meta` (the trace context); the client context and the
    /// progress token take precedence over it, as in rmcp's merge.
    pub meta: Option<RequestMetaObject>,
}

impl<'a> CallRound<'a> {
    /// The first round of a call of `name` with `arguments`.
    pub(in crate::mcp) fn new(name: &'a str, arguments: &'a JsonObject) -> Self {
        Self {
            name,
            arguments,
            input_responses: None,
            request_state: None,
            meta: None,
        }
    }

    /// As rmcp's own request parameters, for rmcp's path. When rmcp's
    /// `CallToolRequestParams` gains a field, [`CallParams`] and this need it too.
    pub(in crate::mcp) fn into_params(self) -> CallToolRequestParams {
        let mut params =
            CallToolRequestParams::new(self.name.to_owned()).with_arguments(self.arguments.clone());
        params.input_responses = self.input_responses;
        params.request_state = self.request_state;
        params.meta = self.meta;
        params
    }

    /// The line rmcp would write for this round under id `n`, with `context` (a
    /// 2026-07-28 session's client context) in `_meta`; the direct path's progress token
    /// is the id.
    fn line(&self, n: i64, context: Option<&ClientContext>) -> serde_json::Result<Vec<u8>> {
        encode(&CallLine {
            jsonrpc: "2.0",
            id: n,
            method: "tools/call",
            params: CallParams {
                meta: CallMeta {
                    own: self.meta.as_ref(),
                    context,
                    progress_token: n,
                },
                name: self.name,
                arguments: self.arguments,
                input_responses: self.input_responses.as_ref(),
                request_state: self.request_state.as_deref(),
            },
        })
    }
}

/// A `tools/call` request as rmcp serialises it (`CallToolRequestParams` in a JSON-RPC
/// request), written from borrowed parts. The same keys and values; rmcp's order of the
/// params' keys after `_meta` is an artifact of how it splices `_meta` in, and JSON objects
/// are unordered.
#[derive(Serialize)]
struct CallLine<'a> {
    jsonrpc: &'static str,
    id: i64,
    method: &'static str,
    params: CallParams<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CallParams<'a> {
    #[serde(rename = "_meta")]
    meta: CallMeta<'a>,
    name: &'a str,
    arguments: &'a JsonObject,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_responses: Option<&'a InputResponses>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_state: Option<&'a str>,
}

/// A session's client context, each value serialised once: it goes into every request's
/// `_meta`, and writing its nested objects anew took a few percent of a call's CPU.
pub(super) struct ClientContext(Vec<(String, Box<RawValue>)>);

impl ClientContext {
    fn new(meta: RequestMetaObject) -> Self {
        let entries = meta
            .iter()
            .filter_map(|(key, value)| {
                // A `Value` always serialises.
                let raw = serde_json::value::to_raw_value(value).ok()?;
                Some((key.clone(), raw))
            })
            .collect();
        Self(entries)
    }

    fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }
}

/// The request's `_meta` as rmcp merges it: the caller's keys (the trace context), then the
/// session's client context, then the progress token, a later one replacing an earlier
/// one's value in that key's first place (`preserve_order`'s insert), so no key is written
/// twice whatever the caller put there.
struct CallMeta<'a> {
    own: Option<&'a RequestMetaObject>,
    context: Option<&'a ClientContext>,
    progress_token: i64,
}

const PROGRESS_TOKEN: &str = "progressToken";

impl Serialize for CallMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let in_own = |key: &str| self.own.is_some_and(|own| own.contains_key(key));
        let in_context = |key: &str| self.context.and_then(|c| c.get(key));
        let mut map = serializer.serialize_map(None)?;
        let mut token_written = false;
        for (key, value) in self.own.into_iter().flat_map(|own| own.iter()) {
            if key == PROGRESS_TOKEN {
                token_written = true;
                map.serialize_entry(key, &self.progress_token)?;
            } else if let Some(latest) = in_context(key) {
                map.serialize_entry(key, latest)?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        let context = self.context.into_iter().flat_map(|c| c.0.iter());
        for (key, value) in context.filter(|(key, _)| !in_own(key)) {
            if key == PROGRESS_TOKEN {
                token_written = true;
                map.serialize_entry(key, &self.progress_token)?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        if !token_written {
            map.serialize_entry(PROGRESS_TOKEN, &self.progress_token)?;
        }
        map.end()
    }
}

/// A direct call on the wire: dropped before its answer (a timeout, the task ended), it
/// stops waiting and tells the server, as rmcp does for its own requests.
struct Abandoned<'a, R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> {
    calls: &'a DirectCalls<R, W>,
    id: RequestId,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> Drop for Abandoned<'_, R, W> {
    fn drop(&mut self) {
        if !lock(&self.calls.guard).forget(&self.id) {
            return;
        }
        let cancelled = ClientNotification::CancelledNotification(CancelledNotification::new(
            CancelledNotificationParam::new(Some(self.id.clone()), Some(ABANDONED.to_owned())),
        ));
        let Ok(line) = encode(&ClientJsonRpcMessage::notification(cancelled)) else {
            return;
        };
        let limits = &self.calls.limits;
        let (now, write) = write_line(
            &self.calls.writer,
            line,
            limits.write_timeout,
            limits.server_id.clone(),
        );
        // Best effort, like rmcp's: a pipe that is busy or full gets it from a task.
        if !now && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(write);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rmcp::model::{
        CallToolRequest, ClientRequest, GetMeta, NumberOrString, ProgressToken,
        ServerJsonRpcMessage,
    };
    use rmcp::transport::Transport;
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, duplex};
    use tokio::sync::mpsc;

    use super::*;
    use crate::mcp::connect::lines::LineTransport;
    use crate::mcp::error::{McpErrorCode, from_host_error};

    const CAP: u64 = 1000;
    const SOON: Duration = Duration::from_secs(5);

    /// A direct path on a transport whose reader runs as rmcp's loop would run it; what
    /// reaches rmcp comes out of the receiver. The server side: what it writes, and the
    /// lines it reads.
    struct Wire {
        calls: Arc<DirectCalls<DuplexStream, DuplexStream>>,
        to_rmcp: mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
        server_out: DuplexStream,
        server_in: Lines<BufReader<DuplexStream>>,
        dropped: Arc<Mutex<Guard>>,
    }

    fn wire(meta: Option<RequestMetaObject>) -> Wire {
        let (server_out, host_in) = duplex(1 << 16);
        let (host_out, server_in) = duplex(1 << 16);
        let limits = Limits::for_tests(CAP, CAP, Duration::from_millis(300));
        let mut transport = LineTransport::new(host_in, host_out, limits);
        let calls = transport.direct_calls().with_meta(meta);
        let dropped = calls.guard.clone();
        let (tx, to_rmcp) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(message) = transport.receive().await {
                let _ = tx.send(message);
            }
        });
        Wire {
            calls: Arc::new(calls),
            to_rmcp,
            server_out,
            server_in: BufReader::new(server_in).lines(),
            dropped,
        }
    }

    impl Wire {
        /// Starts a call of `tool`; returns it and the line the server read.
        async fn call(
            &mut self,
            tool: &str,
        ) -> (
            tokio::task::JoinHandle<Result<CallToolResponse, ServiceError>>,
            Value,
        ) {
            let calls = self.calls.clone();
            let tool = tool.to_owned();
            let call = tokio::spawn(async move {
                let arguments = json!({"text": "hi"}).as_object().unwrap().clone();
                calls.call_tool(&CallRound::new(&tool, &arguments)).await
            });
            (call, self.read().await)
        }

        async fn read(&mut self) -> Value {
            let line = tokio::time::timeout(SOON, self.server_in.next_line())
                .await
                .expect("a line")
                .unwrap()
                .expect("open");
            serde_json::from_str(&line).unwrap()
        }

        async fn answer(&mut self, line: Value) {
            let mut line = line.to_string().into_bytes();
            line.push(b'\n');
            self.server_out.write_all(&line).await.unwrap();
        }

        fn dropped(&self) -> u64 {
            lock(&self.dropped).dropped()
        }

        /// A notification reaches rmcp soon: something woke its loop.
        async fn rmcp_gets_a_notification(&mut self) {
            let got = tokio::time::timeout(SOON, self.to_rmcp.recv())
                .await
                .expect("rmcp woken")
                .unwrap();
            assert!(matches!(got, JsonRpcMessage::Notification(_)), "{got:?}");
        }

        /// Nothing reached rmcp (within a short wait for stragglers).
        async fn rmcp_got_nothing(&mut self) {
            let got = tokio::time::timeout(Duration::from_millis(100), self.to_rmcp.recv()).await;
            assert!(got.is_err(), "{got:?}");
        }
    }

    fn ok(id: &Value, text: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
    }

    async fn finished(
        call: tokio::task::JoinHandle<Result<CallToolResponse, ServiceError>>,
    ) -> Result<CallToolResponse, ServiceError> {
        tokio::time::timeout(SOON, call)
            .await
            .expect("answered at once")
            .unwrap()
    }

    fn text_of(response: CallToolResponse) -> String {
        let CallToolResponse::Complete(result) = response else {
            panic!("{response:?}");
        };
        serde_json::to_value(&result).unwrap()["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[tokio::test]
    async fn a_call_goes_out_as_rmcp_writes_it_and_its_answer_never_reaches_rmcp() {
        let meta = RequestMetaObject::with_client_context(
            rmcp::model::ProtocolVersion::V_2026_07_28,
            rmcp::model::Implementation::new("quiver", "1"),
            Default::default(),
        );
        let mut wire = wire(Some(meta.clone()));
        let (call, sent) = wire.call("echo").await;
        let id = sent["id"].clone();
        assert!(id.as_i64().is_some_and(|n| n < 0), "own id space: {sent}");

        // What rmcp writes for the same request, with its id and progress token.
        let mut request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("echo")
                .with_arguments(json!({"text": "hi"}).as_object().unwrap().clone()),
        ));
        request.get_meta_mut().extend(meta);
        request
            .get_meta_mut()
            .set_progress_token(ProgressToken(NumberOrString::Number(id.as_i64().unwrap())));
        let id_as_sent = RequestId::Number(id.as_i64().unwrap());
        let rmcp =
            serde_json::to_value(ClientJsonRpcMessage::request(request, id_as_sent)).unwrap();
        assert_eq!(sent, rmcp);
        assert_eq!(
            sent["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );

        // A request of the server's during the call goes to rmcp; the answer does not.
        wire.answer(json!({"jsonrpc": "2.0", "id": "s1", "method": "ping"}))
            .await;
        wire.answer(ok(&id, "hi")).await;
        assert_eq!(text_of(finished(call).await.unwrap()), "hi");
        let to_rmcp = wire.to_rmcp.recv().await.unwrap();
        assert!(matches!(to_rmcp, JsonRpcMessage::Request(_)), "{to_rmcp:?}");
        wire.rmcp_got_nothing().await;

        // Before 2026-07-28 rmcp adds only the progress token.
        let mut wire = self::wire(None);
        let (_call, sent) = wire.call("echo").await;
        let keys: Vec<&String> = sent["params"]["_meta"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, ["progressToken"]);
    }

    #[tokio::test]
    async fn a_waiting_call_reads_its_own_answer_and_leaves_the_rest_to_rmcp() {
        let (mut server_out, host_in) = duplex(1 << 16);
        let (host_out, server_in) = duplex(1 << 16);
        let limits = Limits::for_tests(CAP, CAP, Duration::from_millis(300));
        let mut transport = LineTransport::new(host_in, host_out, limits);
        let calls = Arc::new(transport.direct_calls());
        let mut server_in = BufReader::new(server_in).lines();
        // rmcp's loop is not reading: only the call itself can read its answer.
        let call = tokio::spawn({
            let calls = calls.clone();
            async move {
                let arguments = json!({"text": "hi"}).as_object().unwrap().clone();
                calls.call_tool(&CallRound::new("echo", &arguments)).await
            }
        });
        let sent: Value =
            serde_json::from_str(&server_in.next_line().await.unwrap().unwrap()).unwrap();
        let mut lines = Vec::new();
        for message in [
            ok(&sent["id"], "hi"),
            json!({"jsonrpc": "2.0", "id": "s1", "method": "ping"}),
        ] {
            lines.extend(message.to_string().into_bytes());
            lines.push(b'\n');
        }
        server_out.write_all(&lines).await.unwrap();
        assert_eq!(text_of(finished(call).await.unwrap()), "hi");
        // What came after the answer waits for rmcp's loop.
        let first = tokio::time::timeout(SOON, transport.receive())
            .await
            .expect("queued")
            .unwrap();
        assert!(matches!(first, JsonRpcMessage::Request(_)), "{first:?}");
    }

    #[tokio::test]
    async fn a_call_that_read_the_pipe_gives_it_back_to_rmcp() {
        let mut wire = wire(None);
        // rmcp's loop waits on the pipe first; the call's wait takes it over.
        tokio::time::sleep(Duration::from_millis(20)).await;
        for text in ["one", "two"] {
            let (call, sent) = wire.call("echo").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            wire.answer(ok(&sent["id"], text)).await;
            assert_eq!(text_of(finished(call).await.unwrap()), text);
        }
        // With no call waiting, what the server sends next reaches rmcp: the pipe's waker is
        // rmcp's again, or nothing would wake its loop.
        let changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        wire.answer(changed.clone()).await;
        wire.rmcp_gets_a_notification().await;

        // An answer and a notification in one write: the call reads its answer, and the
        // notification left in the read buffer wakes rmcp as the call hands the pipe back.
        let (call, sent) = wire.call("echo").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut both = ok(&sent["id"], "three").to_string();
        both.push('\n');
        both.push_str(&changed.to_string());
        wire.server_out
            .write_all(format!("{both}\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(text_of(finished(call).await.unwrap()), "three");
        wire.rmcp_gets_a_notification().await;
    }

    #[tokio::test]
    async fn calls_waiting_together_each_get_their_own_answer() {
        let mut wire = wire(None);
        let mut calls = Vec::new();
        for _ in 0..3 {
            calls.push(wire.call("echo").await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Answered in reverse, one write each.
        for (_, sent) in calls.iter().rev() {
            let text = format!("to {}", sent["id"]);
            wire.answer(ok(&sent["id"], &text)).await;
        }
        for (call, sent) in calls {
            assert_eq!(
                text_of(finished(call).await.unwrap()),
                format!("to {}", sent["id"])
            );
        }
        wire.rmcp_got_nothing().await;
    }

    /// The line rmcp writes for `round` under id `n` on a session with `context`.
    fn rmcp_line(round: &CallRound<'_>, n: i64, context: Option<RequestMetaObject>) -> Vec<u8> {
        let round = CallRound {
            input_responses: round.input_responses.clone(),
            request_state: round.request_state.clone(),
            meta: round.meta.clone(),
            ..CallRound::new(round.name, round.arguments)
        };
        let mut request = ClientRequest::CallToolRequest(CallToolRequest::new(round.into_params()));
        if let Some(context) = context {
            request.get_meta_mut().extend(context);
        }
        request
            .get_meta_mut()
            .set_progress_token(ProgressToken(NumberOrString::Number(n)));
        encode(&ClientJsonRpcMessage::request(
            request,
            RequestId::Number(n),
        ))
        .unwrap()
    }

    #[test]
    fn every_part_of_a_later_round_is_written_as_rmcp_writes_it() {
        let arguments = json!({"text": "hi", "nested": {"a": [1, 2]}});
        let mut trace = RequestMetaObject::new();
        trace.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        trace.set_tracestate("vendor=1");
        let round = CallRound {
            input_responses: Some([("ask-1".to_owned(), json!({"action": "accept"}))].into()),
            request_state: Some("opaque \"state\"".to_owned()),
            meta: Some(trace),
            ..CallRound::new("echo", arguments.as_object().unwrap())
        };
        let context = RequestMetaObject::with_client_context(
            rmcp::model::ProtocolVersion::V_2026_07_28,
            rmcp::model::Implementation::new("quiver", "1"),
            Default::default(),
        );
        // The same keys and values, and (parsing keeps only the last of a repeated key) no
        // `_meta` key written twice: its keys in the same order as rmcp's.
        let same = |round: &CallRound<'_>, context: Option<&RequestMetaObject>| {
            let serialised = context.cloned().map(ClientContext::new);
            let line = round.line(-7, serialised.as_ref()).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let ours: Value = serde_json::from_slice(&line).unwrap();
            let rmcp: Value =
                serde_json::from_slice(&rmcp_line(round, -7, context.cloned())).unwrap();
            assert_eq!(ours, rmcp);
            let text = String::from_utf8(line).unwrap();
            let meta_keys = |v: &Value| -> Vec<String> {
                v["params"]["_meta"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect()
            };
            assert_eq!(meta_keys(&ours), meta_keys(&rmcp), "{text}");
            for key in meta_keys(&ours) {
                assert_eq!(
                    text.matches(&format!("\"{key}\":")).count(),
                    1,
                    "{key} in {text}"
                );
            }
        };
        for context in [Some(&context), None] {
            same(&round, context);
        }
        // A first round: no responses, no state, no trace context.
        let empty = JsonObject::new();
        same(&CallRound::new("noop", &empty), None);

        // A caller's `_meta` that names the context's keys or the progress token: rmcp's
        // merge keeps each key once, the later layer's value in its first place.
        let mut clashing = RequestMetaObject::new();
        clashing.set_tracestate("first");
        clashing.set_progress_token(ProgressToken(NumberOrString::Number(99)));
        clashing.set_protocol_version(rmcp::model::ProtocolVersion::V_2025_06_18);
        let round = CallRound {
            meta: Some(clashing),
            ..CallRound::new("echo", arguments.as_object().unwrap())
        };
        for context in [Some(&context), None] {
            same(&round, context);
        }
    }

    #[tokio::test]
    async fn answers_under_unknown_ids_and_repeated_answers_are_dropped() {
        let mut wire = wire(None);
        let (call, sent) = wire.call("echo").await;
        let id = sent["id"].clone();
        wire.answer(ok(&json!(id.as_i64().unwrap() - 1), "someone else's"))
            .await;
        wire.answer(ok(&json!(12345), "nobody's")).await;
        // The id as a string answers it, as it answers rmcp's requests.
        wire.answer(ok(&json!(id.to_string()), "mine")).await;
        wire.answer(ok(&id, "again")).await;
        assert_eq!(text_of(finished(call).await.unwrap()), "mine");
        wire.rmcp_got_nothing().await;
        assert_eq!(wire.dropped(), 3);
    }

    #[tokio::test]
    async fn a_dropped_call_is_cancelled_and_its_late_answer_dropped() {
        let mut wire = wire(None);
        let (call, sent) = wire.call("slow").await;
        call.abort();
        let cancelled = wire.read().await;
        assert_eq!(
            cancelled,
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": sent["id"], "reason": ABANDONED}})
        );
        wire.answer(ok(&sent["id"], "late")).await;
        let (call, next) = wire.call("echo").await;
        wire.answer(ok(&next["id"], "next")).await;
        assert_eq!(text_of(finished(call).await.unwrap()), "next");
        wire.rmcp_got_nothing().await;
        assert_eq!(wire.dropped(), 1, "the late answer answered nothing");
    }

    #[tokio::test]
    async fn an_answer_over_the_cap_fails_the_call_at_once_and_an_error_is_the_servers() {
        let mut wire = wire(None);
        let (call, sent) = wire.call("huge").await;
        let big = ok(&sent["id"], &"x".repeat(CAP as usize * 200));
        let writing = {
            let mut line = big.to_string().into_bytes();
            line.push(b'\n');
            let mut out = std::mem::replace(&mut wire.server_out, duplex(1).0);
            tokio::spawn(async move {
                out.write_all(&line).await.unwrap();
                out
            })
        };
        let Err(ServiceError::McpError(data)) = finished(call).await else {
            panic!("not an error");
        };
        let error = from_host_error(&data).expect("the host's");
        assert_eq!(error.code, McpErrorCode::OutputTooLarge, "{error:?}");
        wire.server_out = writing.await.unwrap();

        let (call, sent) = wire.call("fails").await;
        wire.answer(
            json!({"jsonrpc": "2.0", "id": sent["id"], "error": {"code": -32000, "message": "no"}}),
        )
        .await;
        let Err(ServiceError::McpError(data)) = finished(call).await else {
            panic!("not an error");
        };
        assert!(from_host_error(&data).is_none());
        assert_eq!(data.message, "no");
        wire.rmcp_got_nothing().await;
    }

    #[tokio::test]
    async fn a_server_that_dies_mid_call_fails_it_at_once_and_later_calls_too() {
        let mut wire = wire(None);
        let (call, _) = wire.call("echo").await;
        drop(std::mem::replace(&mut wire.server_out, duplex(1).0));
        assert!(matches!(
            finished(call).await,
            Err(ServiceError::TransportClosed)
        ));
        let arguments = JsonObject::new();
        let round = CallRound::new("echo", &arguments);
        let after = tokio::time::timeout(SOON, wire.calls.call_tool(&round)).await;
        assert!(
            matches!(after, Ok(Err(ServiceError::TransportClosed))),
            "{after:?}"
        );
        // rmcp's loop sees the end too, whoever read it.
        let end = tokio::time::timeout(SOON, wire.to_rmcp.recv()).await;
        assert!(matches!(end, Ok(None)), "{end:?}");
    }
}
