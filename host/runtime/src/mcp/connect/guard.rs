//! What one connection lets through from its server: a bounded answer to each request the
//! host sent, the server's own messages at a bounded rate, and nothing else.
//!
//! rmcp drops an answer it cannot match to a request, and its stdio reader drops lines it
//! cannot parse or that are too long; either way the request waits for its whole timeout and
//! the guest gets a retryable `mcp_timeout`. The transports (stdio lines, legacy SSE, and
//! Streamable HTTP through [`Guarded`]) therefore hand every message to a [`Guard`] first. It
//! remembers the requests in flight, so a message that could not be read but whose id was
//! found fails that one request at once with the right error ([`host_error`]); everything
//! else it drops, counting. A server whose drops outrun [`defaults::MCP_MAX_DROPPED_MESSAGES`]
//! is flooding: the guard fails every pending request and the connection closes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::transport::Transport;

use crate::defaults;
use crate::mcp::error::{McpError, McpErrorCode, host_error};
use crate::registry::ServerEntry;
use crate::text;

/// Requests one connection tracks on top of the server's `max_concurrency` calls; past
/// them the oldest is given up (its caller has long timed out: the pool's calls are bounded
/// by `max_concurrency` and `tool_timeout_ms`).
const MAX_PENDING: usize = 4096;

/// The most of a server's `max_concurrency` a connection tracks beyond [`MAX_PENDING`]: a
/// record may say any `u32`, and stale entries of a server that never answers must stay
/// bounded (a few MiB at most).
const MAX_LIVE_CALLS: usize = 1 << 16;

/// Longest parse error quoted in a `tool_exec_failed` message.
const MAX_REASON_CHARS: usize = 200;

/// How often dropped messages are logged (with their count since the last line).
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

/// The byte caps of one server, from its registry budgets.
#[derive(Clone, Debug)]
pub(in crate::mcp) struct Limits {
    pub(in crate::mcp) server_id: Arc<str>,
    max_tool_output_bytes: u64,
    max_tool_list_bytes: u64,
    /// How long one write to the server may block before it counts as not reading.
    pub(in crate::mcp) write_timeout: Duration,
    /// Requests tracked at once: [`MAX_PENDING`] beyond the calls the server may run, so a
    /// server allowed more than [`MAX_PENDING`] calls never has live ones given up.
    max_pending: usize,
}

impl Limits {
    pub(in crate::mcp) fn of(entry: &ServerEntry) -> Self {
        let budgets = &entry.record.budgets;
        Self {
            server_id: entry.server_id().into(),
            max_tool_output_bytes: budgets.max_tool_output_bytes,
            max_tool_list_bytes: budgets.max_tool_list_bytes,
            write_timeout: budgets.tool_timeout,
            max_pending: MAX_PENDING
                .saturating_add((budgets.max_concurrency as usize).min(MAX_LIVE_CALLS)),
        }
    }

    #[cfg(test)]
    pub(in crate::mcp) fn for_tests(output: u64, list: u64, write_timeout: Duration) -> Self {
        Self {
            server_id: "s".into(),
            max_tool_output_bytes: output,
            max_tool_list_bytes: list,
            write_timeout,
            max_pending: MAX_PENDING,
        }
    }

    /// The payload cap of an answer to a request of `kind` (the envelope not included).
    fn cap(&self, kind: &Kind) -> u64 {
        match kind {
            Kind::Call(_) => self.max_tool_output_bytes,
            Kind::List => self.max_tool_list_bytes,
            Kind::Other(_) => defaults::MAX_MCP_MESSAGE_BYTES,
        }
    }

    /// The most bytes one message for a request of `kind` may take, envelope included.
    pub(in crate::mcp) fn message_cap(&self, kind: &Kind) -> usize {
        bytes_usize(self.cap(kind).saturating_add(defaults::MCP_ENVELOPE_BYTES))
    }

    /// The most bytes any message on this connection may take.
    pub(in crate::mcp) fn largest_message(&self) -> usize {
        [Kind::Call(String::new()), Kind::List, Kind::Other("")]
            .iter()
            .map(|kind| self.message_cap(kind))
            .max()
            .unwrap_or(usize::MAX)
    }

    /// The fewest bytes any cap allows: a shorter message fits whatever it is.
    pub(in crate::mcp) fn smallest_message(&self) -> usize {
        [Kind::Call(String::new()), Kind::List, Kind::Other("")]
            .iter()
            .map(|kind| self.message_cap(kind))
            .min()
            .unwrap_or(0)
    }

    /// The error that fails a request of `kind` whose answer was at least `seen` bytes.
    pub(in crate::mcp) fn too_large(&self, kind: &Kind, seen: u64) -> McpError {
        let server_id = &self.server_id;
        let cap = self.cap(kind);
        let message = match kind {
            Kind::Call(tool) => format!(
                "tool `{tool}` on server `{server_id}` returned at least {seen} bytes; the limit (budgets.max_tool_output_bytes) is {cap}"
            ),
            Kind::List => format!(
                "server `{server_id}` answered tools/list with at least {seen} bytes; the limit (budgets.max_tool_list_bytes) is {cap}"
            ),
            Kind::Other(method) => format!(
                "server `{server_id}` answered {method} with at least {seen} bytes; the limit for such messages is {cap}"
            ),
        };
        McpError::new(McpErrorCode::OutputTooLarge, message)
    }

    pub(in crate::mcp) fn invalid(&self, kind: &Kind, reason: &str) -> McpError {
        let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
        McpError::new(
            McpErrorCode::ToolExecFailed,
            format!(
                "server `{}` answered {} with a message that is not valid JSON-RPC: {reason}",
                self.server_id,
                kind.what()
            ),
        )
    }

    /// An HTTP error answer to `kind` whose body was over `max` bytes, the most rmcp reads
    /// of an error body: a failure of the server's, not an oversized result.
    pub(in crate::mcp) fn error_body_too_large(&self, kind: &Kind, max: usize) -> McpError {
        McpError::new(
            McpErrorCode::ToolExecFailed,
            format!(
                "server `{}` answered {} with an HTTP error whose body is over {max} bytes",
                self.server_id,
                kind.what()
            ),
        )
    }
}

fn bytes_usize(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// What a request asked for, which decides the cap of its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::mcp) enum Kind {
    /// `tools/call`, with the tool's name.
    Call(String),
    List,
    /// Any other request, by method.
    Other(&'static str),
}

impl Kind {
    /// A `tools/call` of `name`.
    pub(in crate::mcp) fn call(name: &str) -> Self {
        Kind::Call(bounded_name(name))
    }

    pub(in crate::mcp) fn of(request: &ClientRequest) -> Self {
        match request {
            ClientRequest::CallToolRequest(call) => Kind::Call(bounded_name(&call.params.name)),
            ClientRequest::ListToolsRequest(_) => Kind::List,
            ClientRequest::InitializeRequest(_) => Kind::Other("initialize"),
            ClientRequest::DiscoverRequest(_) => Kind::Other("server/discover"),
            ClientRequest::PingRequest(_) => Kind::Other("ping"),
            _ => Kind::Other("a request"),
        }
    }

    fn what(&self) -> String {
        match self {
            Kind::Call(tool) => format!("tools/call of `{tool}`"),
            Kind::List => "tools/list".into(),
            Kind::Other(method) => (*method).into(),
        }
    }
}

/// At most [`defaults::MAX_TOOL_NAME_BYTES`] of a tool name (an LLM may ask for any), cut
/// at a character boundary: enough to name it in an error, never a large copy per request.
fn bounded_name(name: &str) -> String {
    text::cut(name, defaults::MAX_TOOL_NAME_BYTES).to_owned()
}

/// Why a transport could not turn what it read into a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::mcp) enum Problem {
    /// Longer than the cap; at least `seen` bytes were read.
    TooLarge { seen: u64 },
    /// Not a JSON-RPC message; the parser's reason.
    Invalid(String),
}

/// One thing a transport read from its server.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "moved once from the reader to the guard; boxing would allocate per message"
)]
pub(in crate::mcp) enum Incoming {
    Message(ServerJsonRpcMessage),
    /// A message that could not be read; `id` is its top-level id when one was found, and
    /// `answer` whether it looked like an answer rather than a request of the server's.
    Unreadable {
        id: Option<RequestId>,
        answer: bool,
        problem: Problem,
    },
    /// One message went on past [`defaults::MCP_MAX_DISCARD_BYTES`] over its cap: the
    /// stream cannot reach another message, so the connection must close.
    Endless {
        seen: u64,
    },
    /// A line with nothing on it: harmless alone, but it costs a read like any message,
    /// so it counts against the server's rate.
    Blank,
}

struct Pending {
    /// The id as sent, which the answer rmcp gets must carry.
    id: RequestId,
    kind: Kind,
    sent: Instant,
    /// Where the answer goes when the host sent the request itself (a direct call, see
    /// [`super::direct`]); `None`: to rmcp.
    reply: Option<Reply>,
}

/// The answer to a direct call: whatever would have gone to rmcp for it.
pub(in crate::mcp) type Reply = tokio::sync::oneshot::Sender<ServerJsonRpcMessage>;

/// A token bucket: `capacity` at once, refilled at `per_sec`.
#[derive(Debug)]
struct Bucket {
    tokens: u64,
    capacity: u64,
    per_sec: u64,
    last: Instant,
}

impl Bucket {
    fn new(capacity: u32, per_sec: u32) -> Self {
        Self {
            tokens: u64::from(capacity),
            capacity: u64::from(capacity),
            per_sec: u64::from(per_sec).max(1),
            last: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let elapsed_ms = u64::try_from(self.last.elapsed().as_millis()).unwrap_or(u64::MAX);
        let refill = elapsed_ms.saturating_mul(self.per_sec) / 1000;
        if refill > 0 {
            self.tokens = self.tokens.saturating_add(refill).min(self.capacity);
            self.last = Instant::now();
        }
        match self.tokens.checked_sub(1) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }
}

/// The per-connection state described in the module docs.
pub(in crate::mcp) struct Guard {
    limits: Limits,
    pending: HashMap<RequestId, Pending>,
    /// Pending requests per kind, so the read cap costs nothing to compute.
    calls: usize,
    lists: usize,
    ready: VecDeque<ServerJsonRpcMessage>,
    /// Why the connection was closed, once it was.
    closed: Option<McpError>,
    /// The transport read its end (or is gone): a direct call can have no answer.
    ended: bool,
    rate: Bucket,
    drops: Bucket,
    dropped: u64,
    dropped_unlogged: u64,
    last_drop_log: Option<Instant>,
}

impl Guard {
    pub(in crate::mcp) fn new(limits: Limits) -> Self {
        Self {
            limits,
            pending: HashMap::new(),
            calls: 0,
            lists: 0,
            ready: VecDeque::new(),
            closed: None,
            ended: false,
            rate: Bucket::new(
                defaults::MCP_SERVER_MESSAGES_PER_SEC,
                defaults::MCP_SERVER_MESSAGES_PER_SEC,
            ),
            drops: Bucket::new(
                defaults::MCP_MAX_DROPPED_MESSAGES,
                defaults::MCP_MAX_DROPPED_MESSAGES / 10,
            ),
            dropped: 0,
            dropped_unlogged: 0,
            last_drop_log: None,
        }
    }

    #[cfg(test)]
    pub(in crate::mcp) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Notes what the host sends: requests become pending, a cancellation ends one.
    pub(in crate::mcp) fn on_send(&mut self, message: &ClientJsonRpcMessage) {
        match message {
            JsonRpcMessage::Request(request) => {
                // Sent before rmcp saw the end: it gets the reason at once, not a
                // vanished transport.
                if let Some(error) = &self.closed {
                    self.ready.push_back(ServerJsonRpcMessage::error(
                        host_error(error),
                        Some(request.id.clone()),
                    ));
                    return;
                }
                self.add_pending(request.id.clone(), Kind::of(&request.request), None);
            }
            JsonRpcMessage::Notification(note) => {
                if let ClientNotification::CancelledNotification(cancelled) = &note.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    self.answered(id);
                }
            }
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
        }
    }

    /// Notes a request the host writes itself (a direct call): its answer, or the error
    /// that fails it, goes to `reply` instead of rmcp. `false` when it must not be written:
    /// the connection is closed (`reply` has the reason) or ended (`reply` is dropped).
    pub(in crate::mcp) fn on_direct_call(
        &mut self,
        id: RequestId,
        kind: Kind,
        reply: Reply,
    ) -> bool {
        if let Some(error) = &self.closed {
            let _ = reply.send(ServerJsonRpcMessage::error(host_error(error), Some(id)));
            return false;
        }
        if self.ended {
            return false;
        }
        self.add_pending(id, kind, Some(reply));
        true
    }

    fn add_pending(&mut self, id: RequestId, kind: Kind, reply: Option<Reply>) {
        if self.pending.len() >= self.limits.max_pending {
            self.give_up_oldest();
        }
        self.count(&kind, true);
        let pending = Pending {
            id: id.clone(),
            kind,
            sent: Instant::now(),
            reply,
        };
        if let Some(replaced) = self.pending.insert(key(&id), pending) {
            self.count(&replaced.kind, false);
        }
    }

    /// Forgets the direct call `id` its caller gave up; whether it was still pending
    /// (then the server should hear it was cancelled).
    pub(in crate::mcp) fn forget(&mut self, id: &RequestId) -> bool {
        self.answered(id).is_some()
    }

    /// The transport is at its end: direct calls still pending fail as rmcp's do when
    /// its transport closes (their reply is dropped), and none can start.
    pub(in crate::mcp) fn end(&mut self) {
        self.ended = true;
        let direct: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.reply.is_some())
            .map(|(key, _)| key.clone())
            .collect();
        for key in direct {
            self.answered(&key);
        }
    }

    /// The most bytes the next message may take: enough for the largest answer pending.
    pub(in crate::mcp) fn read_cap(&self) -> usize {
        let mut cap = self.limits.message_cap(&Kind::Other(""));
        if self.calls > 0 {
            cap = cap.max(self.limits.message_cap(&Kind::Call(String::new())));
        }
        if self.lists > 0 {
            cap = cap.max(self.limits.message_cap(&Kind::List));
        }
        cap
    }

    /// The cap of the message with this `id` read whole: the cap of the request it answers,
    /// or of any other message when it answers none.
    pub(in crate::mcp) fn cap_of(&self, id: Option<&RequestId>, answer: bool) -> usize {
        let kind = id
            .filter(|_| answer)
            .and_then(|id| self.pending.get(&key(id)))
            .map(|p| &p.kind);
        self.limits.message_cap(kind.unwrap_or(&Kind::Other("")))
    }

    /// Whether `id` is a `tools/call` still waiting for its answer.
    pub(in crate::mcp) fn is_pending_call(&self, id: &RequestId) -> bool {
        self.pending
            .get(&key(id))
            .is_some_and(|p| matches!(p.kind, Kind::Call(_)))
    }

    /// The next message for rmcp, if one is ready.
    pub(in crate::mcp) fn pop(&mut self) -> Option<ServerJsonRpcMessage> {
        self.ready.pop_front()
    }

    /// Whether the connection must close once [`pop`](Self::pop) runs dry.
    pub(in crate::mcp) fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Whether a message waits for rmcp.
    pub(in crate::mcp) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Whether the transport read its end.
    pub(in crate::mcp) fn is_ended(&self) -> bool {
        self.ended
    }

    /// What a transport's `receive` returns without reading: a message that is ready, or
    /// the end once the guard has closed and nothing is left. `None` means: read more and
    /// [`take`](Self::take) it. Every guarded transport's `receive` loops on this (the
    /// stdio one also ends once another reader has read the end).
    pub(in crate::mcp) fn next_ready(&mut self) -> Option<Option<ServerJsonRpcMessage>> {
        match self.pop() {
            Some(message) => Some(Some(message)),
            None if self.is_closed() => Some(None),
            None => None,
        }
    }

    /// Takes what the transport read: passes it on, turns it into the error of the request
    /// it answers, or drops it.
    pub(in crate::mcp) fn take(&mut self, incoming: Incoming) {
        if self.closed.is_some() {
            return;
        }
        match incoming {
            Incoming::Message(message) => self.take_message(message),
            Incoming::Blank if self.rate.take() => {}
            Incoming::Blank => self.drop_one(&format!(
                "a blank line over the rate of {} messages per second",
                defaults::MCP_SERVER_MESSAGES_PER_SEC
            )),
            Incoming::Endless { seen } => self.close(format!(
                "server `{}` wrote one message of more than {seen} bytes, past every cap, so its connection was closed; the next call starts it again",
                self.limits.server_id
            )),
            Incoming::Unreadable {
                id,
                answer,
                problem,
            } => {
                let pending = id.filter(|_| answer).and_then(|id| self.answered(&id));
                match (pending, problem) {
                    (Some(pending), Problem::TooLarge { seen }) => {
                        let error = self.limits.too_large(&pending.kind, seen);
                        self.fail(pending, &error);
                    }
                    (Some(pending), Problem::Invalid(reason)) => {
                        let error = self.limits.invalid(&pending.kind, &reason);
                        self.fail(pending, &error);
                    }
                    (None, Problem::TooLarge { seen }) => {
                        self.drop_one(&format!("a message of at least {seen} bytes, over the cap"))
                    }
                    (None, Problem::Invalid(reason)) => {
                        let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
                        self.drop_one(&format!("a message that is not JSON-RPC ({reason})"))
                    }
                }
            }
        }
    }

    fn take_message(&mut self, message: ServerJsonRpcMessage) {
        let answers = match &message {
            JsonRpcMessage::Response(response) => Some(&response.id),
            JsonRpcMessage::Error(error) => match &error.id {
                Some(id) => Some(id),
                None => return self.drop_one("an error that names no request"),
            },
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        match answers {
            Some(id) => {
                if let Some(pending) = self.answered(id) {
                    self.deliver(pending, message);
                } else {
                    self.drop_one("an answer to no pending request (unknown or repeated id)");
                }
            }
            None if self.rate.take() => self.ready.push_back(message),
            None => self.drop_one(&format!(
                "a message over the rate of {} per second",
                defaults::MCP_SERVER_MESSAGES_PER_SEC
            )),
        }
    }

    /// Forgets the request `id` answers, returning it if it was pending.
    fn answered(&mut self, id: &RequestId) -> Option<Pending> {
        let pending = self.pending.remove(&key(id))?;
        self.count(&pending.kind, false);
        Some(pending)
    }

    fn count(&mut self, kind: &Kind, add: bool) {
        let counter = match kind {
            Kind::Call(_) => &mut self.calls,
            Kind::List => &mut self.lists,
            Kind::Other(_) => return,
        };
        *counter = if add {
            counter.saturating_add(1)
        } else {
            counter.saturating_sub(1)
        };
    }

    /// Hands `error` as the answer to the request `pending`.
    fn fail(&mut self, pending: Pending, error: &McpError) {
        tracing::warn!(server_id = %self.limits.server_id, %error, "failing one request");
        let message = ServerJsonRpcMessage::error(host_error(error), Some(pending.id.clone()));
        self.deliver(pending, message);
    }

    /// Hands the answer to `pending` to whoever waits for it: its direct caller, or rmcp.
    fn deliver(&mut self, pending: Pending, message: ServerJsonRpcMessage) {
        match pending.reply {
            // A caller that is gone gave up: like an answer rmcp finds no responder for.
            Some(reply) => drop(reply.send(message)),
            None => self.ready.push_back(message),
        }
    }

    /// Gives up the oldest pending request, so rmcp forgets it too.
    fn give_up_oldest(&mut self) {
        let Some(oldest) = self
            .pending
            .iter()
            .min_by_key(|(_, p)| p.sent)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if let Some(pending) = self.pending.remove(&oldest) {
            self.count(&pending.kind, false);
            let error = McpError::new(
                McpErrorCode::Unavailable,
                format!(
                    "server `{}` left more than {} requests unanswered; the oldest was given up",
                    self.limits.server_id, self.limits.max_pending
                ),
            );
            let message = ServerJsonRpcMessage::error(host_error(&error), Some(pending.id.clone()));
            self.deliver(pending, message);
        }
    }

    fn drop_one(&mut self, what: &str) {
        self.dropped = self.dropped.saturating_add(1);
        self.dropped_unlogged = self.dropped_unlogged.saturating_add(1);
        let server_id = &self.limits.server_id;
        if self
            .last_drop_log
            .is_none_or(|at| at.elapsed() >= DROP_LOG_EVERY)
        {
            tracing::warn!(server_id = %server_id, dropped = self.dropped_unlogged, last = what, "dropping messages from an MCP server");
            self.dropped_unlogged = 0;
            self.last_drop_log = Some(Instant::now());
        }
        if !self.drops.take() {
            self.close(format!(
                "server `{}` sent more messages the host had to drop than it allows ({} at once; {} dropped in all), so its connection was closed; the next call starts it again",
                self.limits.server_id,
                defaults::MCP_MAX_DROPPED_MESSAGES,
                self.dropped
            ));
        }
    }

    /// Fails every pending request with `mcp_unavailable` and closes the connection.
    fn close(&mut self, message: String) {
        let error = McpError::new(McpErrorCode::Unavailable, message);
        tracing::warn!(server_id = %self.limits.server_id, %error, "closing the connection to an MCP server");
        for (_, pending) in std::mem::take(&mut self.pending) {
            let message = ServerJsonRpcMessage::error(host_error(&error), Some(pending.id.clone()));
            self.deliver(pending, message);
        }
        self.calls = 0;
        self.lists = 0;
        self.closed = Some(error);
    }
}

/// A request id as rmcp matches it: `"7"` answers request `7`.
fn key(id: &RequestId) -> RequestId {
    match id {
        RequestId::String(text) => match text.parse::<i64>() {
            Ok(number) => RequestId::Number(number),
            Err(_) => id.clone(),
        },
        RequestId::Number(_) => id.clone(),
    }
}

/// Any rmcp transport behind a [`Guard`] (Streamable HTTP: rmcp's own transport, whose
/// answers the host's HTTP client has already capped).
pub(in crate::mcp) struct Guarded<T> {
    inner: T,
    guard: Guard,
}

impl<T> Guarded<T> {
    pub(in crate::mcp) fn new(inner: T, limits: Limits) -> Self {
        Self {
            inner,
            guard: Guard::new(limits),
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Guarded<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.guard.on_send(&item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            if let Some(next) = self.guard.next_ready() {
                return next;
            }
            let message = self.inner.receive().await?;
            self.guard.take(Incoming::Message(message));
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolRequestParams, ErrorData};
    use serde_json::json;

    use super::*;
    use crate::mcp::error::from_host_error;

    fn limits() -> Limits {
        Limits::for_tests(100, 8 << 20, Duration::from_secs(1))
    }

    fn call(id: i64, tool: &str) -> ClientJsonRpcMessage {
        let request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(
            CallToolRequestParams::new(tool.to_owned()),
        ));
        ClientJsonRpcMessage::request(request, RequestId::Number(id))
    }

    fn server(value: serde_json::Value) -> ServerJsonRpcMessage {
        serde_json::from_value(value).unwrap()
    }

    fn error_of(message: ServerJsonRpcMessage) -> (Option<RequestId>, McpError) {
        let (data, id): (ErrorData, _) = message.into_error().expect("an error");
        (id, from_host_error(&data).expect("a host error"))
    }

    #[test]
    fn an_unreadable_answer_fails_its_request_and_only_it() {
        let mut guard = Guard::new(limits());
        guard.on_send(&call(1, "big"));
        guard.on_send(&call(2, "fine"));
        assert_eq!(guard.read_cap(), limits().message_cap(&Kind::Other("")));
        guard.take(Incoming::Unreadable {
            id: Some(RequestId::String("1".into())),
            answer: true,
            problem: Problem::TooLarge { seen: 5000 },
        });
        let (id, error) = error_of(guard.pop().unwrap());
        assert_eq!(
            id,
            Some(RequestId::Number(1)),
            "answered with the id as sent"
        );
        assert_eq!(error.code, McpErrorCode::OutputTooLarge);
        assert_eq!(
            error.message,
            "tool `big` on server `s` returned at least 5000 bytes; the limit (budgets.max_tool_output_bytes) is 100"
        );

        guard.take(Incoming::Unreadable {
            id: Some(RequestId::Number(2)),
            answer: true,
            problem: Problem::Invalid("expected value at line 1 column 3".into()),
        });
        let (_, error) = error_of(guard.pop().unwrap());
        assert_eq!(error.code, McpErrorCode::ToolExecFailed);
        assert!(
            error.message.contains("not valid JSON-RPC: expected value"),
            "{}",
            error.message
        );
        assert!(guard.pop().is_none());

        // Repeated and unknown ids, requests of the server's with our ids: dropped.
        guard.on_send(&call(3, "x"));
        guard.take(Incoming::Message(server(
            json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
        )));
        guard.take(Incoming::Unreadable {
            id: Some(RequestId::Number(3)),
            answer: false,
            problem: Problem::TooLarge { seen: 10 },
        });
        assert!(guard.pop().is_none());
        guard.take(Incoming::Message(server(
            json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
        )));
        assert!(matches!(guard.pop(), Some(JsonRpcMessage::Response(_))));
        assert_eq!(guard.dropped, 2);
    }

    #[test]
    fn a_cancelled_request_is_forgotten() {
        let mut guard = Guard::new(limits());
        guard.on_send(&call(1, "a"));
        let cancelled: ClientJsonRpcMessage = serde_json::from_value(json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 1},
        }))
        .unwrap();
        guard.on_send(&cancelled);
        assert!(guard.pending.is_empty());
        assert_eq!(guard.read_cap(), limits().message_cap(&Kind::Other("")));
    }

    #[test]
    fn a_pending_call_keeps_a_bounded_tool_name() {
        let mut guard = Guard::new(limits());
        // 128 falls inside an `é`: the name is cut before it.
        guard.on_send(&call(1, &format!("a{}", "é".repeat(1 << 19))));
        let kept: Vec<usize> = guard
            .pending
            .values()
            .map(|p| match &p.kind {
                Kind::Call(name) => name.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kept, [defaults::MAX_TOOL_NAME_BYTES - 1]);
    }

    #[test]
    fn blank_lines_count_against_the_rate_and_a_flood_of_them_closes() {
        let mut guard = Guard::new(limits());
        guard.on_send(&call(1, "a"));
        for _ in 0..4 * (defaults::MCP_SERVER_MESSAGES_PER_SEC + defaults::MCP_MAX_DROPPED_MESSAGES)
        {
            guard.take(Incoming::Blank);
        }
        assert!(guard.is_closed());
        assert!(
            guard.pop().and_then(|m| m.into_error()).is_some(),
            "the pending call fails"
        );
    }

    #[test]
    fn a_flood_fails_every_pending_request_and_closes() {
        let mut guard = Guard::new(limits());
        guard.on_send(&call(1, "a"));
        guard.on_send(&call(2, "b"));
        let noise = || {
            Incoming::Message(server(
                json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}),
            ))
        };
        let mut passed = 0;
        for _ in 0..defaults::MCP_SERVER_MESSAGES_PER_SEC {
            guard.take(noise());
            passed += usize::from(guard.pop().is_some());
        }
        assert!(passed >= 999, "the rate allows a burst: {passed}");
        // More than the allowance, whatever trickles back in while this runs.
        for _ in 0..3 * defaults::MCP_MAX_DROPPED_MESSAGES {
            guard.take(noise());
        }
        assert!(guard.is_closed());
        let mut failed: Vec<_> = std::iter::from_fn(|| guard.pop())
            .filter_map(|m| m.into_error())
            .map(|(data, id)| (id, from_host_error(&data).unwrap().code))
            .collect();
        failed.sort_by_key(|(id, _)| format!("{id:?}"));
        assert_eq!(
            failed,
            vec![
                (Some(RequestId::Number(1)), McpErrorCode::Unavailable),
                (Some(RequestId::Number(2)), McpErrorCode::Unavailable)
            ]
        );
    }

    #[test]
    fn the_read_cap_follows_what_is_pending_and_the_table_is_bounded() {
        let mut guard = Guard::new(limits());
        let list = ClientJsonRpcMessage::request(
            ClientRequest::ListToolsRequest(Default::default()),
            RequestId::Number(0),
        );
        guard.on_send(&list);
        assert_eq!(
            guard.read_cap(),
            (8 << 20) + 65536,
            "a list may be larger than other messages"
        );
        guard.take(Incoming::Message(server(
            json!({"jsonrpc": "2.0", "id": 0, "result": {"tools": []}}),
        )));
        assert!(guard.pop().is_some());
        assert_eq!((guard.calls, guard.lists), (0, 0));

        for id in 1..=(MAX_PENDING as i64 + 5) {
            guard.on_send(&call(id, "t"));
        }
        assert_eq!(guard.pending.len(), MAX_PENDING);
        let given_up: Vec<_> = std::iter::from_fn(|| guard.pop()).map(error_of).collect();
        assert_eq!(given_up.len(), 5);
        assert_eq!(given_up[0].0, Some(RequestId::Number(1)));
        assert_eq!(given_up[0].1.code, McpErrorCode::Unavailable);
    }

    /// A server allowed more calls at once than the table's own bound has none of its live
    /// calls given up: with 10 000 tasks on a 10 000-slot host, calls past 4096 failed.
    #[test]
    fn a_server_allowed_many_calls_keeps_them_all_pending() {
        let mut record = crate::registry::ServerRecord::for_tests("s");
        record.budgets.max_concurrency = 6000;
        let entry = ServerEntry {
            record,
            source: "s.toml".into(),
            launch: Ok(crate::registry::Launch::Stdio {
                command: "s".into(),
                args: vec![],
                env: Default::default(),
                cwd: None,
                vars: Default::default(),
                secrets: Default::default(),
            }),
        };
        let mut guard = Guard::new(Limits::of(&entry));
        for id in 1..=6000 {
            guard.on_send(&call(id, "t"));
        }
        assert_eq!(guard.pending.len(), 6000);
        assert!(guard.pop().is_none(), "a live call was given up");
    }
}
