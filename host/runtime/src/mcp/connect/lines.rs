//! The stdio wire: newline-delimited JSON-RPC, read with a cap and written with a timeout.
//!
//! rmcp's own stdio reader drops a line over 16 MiB or one it cannot parse, so the request
//! it answered waits out its timeout. This reader never holds more than the [`Guard`]'s read
//! cap (the largest answer pending plus an envelope). A longer line is not kept: the rest is
//! read and thrown away while an [`IdScan`] looks for its id, and the request it answers
//! fails with `mcp_output_too_large` as soon as the id is known. A line that does not parse
//! is scanned the same way and fails its request with `tool_exec_failed`. Everything goes
//! through the guard, which also drops what answers nothing and closes on a flood (blank
//! lines included: they count against the server's message rate like any other line).
//!
//! Writes are whole lines behind one lock; a write that cannot finish within the server's
//! `tool_timeout_ms` means the server stopped reading, and its stdin is closed. The guard,
//! the writer and the reader are shared with the connection's [`DirectCalls`], whose
//! `tools/call`s bypass rmcp's loop: they register in the same guard, write under the same
//! lock, and read while they wait ([`ReadSide`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::answer::call_answer;
use super::direct::DirectCalls;
use super::guard::{Guard, Incoming, Limits, Problem};
use super::scan::IdScan;
use crate::defaults;
use crate::sync::lock;

/// Line buffer capacity kept between lines; a larger one (after a big answer) is released.
const KEEP_LINE_CAPACITY: usize = 64 * 1024;

/// Bytes read from the pipe at once.
const READ_BUFFER_BYTES: usize = 64 * 1024;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A line being skipped because it is over the cap.
struct Discard {
    scan: IdScan,
    seen: u64,
    /// Whether its request has been failed already (the id came early).
    reported: bool,
    /// Whether it was found endless (the guard then closes the connection).
    ended: bool,
}

/// What the last read step left.
enum Step {
    More,
    Line,
    /// A whole line that sat in the read buffer, parsed there (into `parsed`).
    Parsed,
    Discarding,
    Discarded,
}

/// A JSON-RPC transport over a byte stream pair (a server's stdout and stdin).
pub(super) struct LineTransport<R, W> {
    read: Arc<ReadSide<R>>,
    writer: Writer<W>,
    /// Shared with the connection's [`DirectCalls`], which register their requests in it.
    guard: Arc<Mutex<Guard>>,
    limits: Limits,
}

/// The server's stdout and what reading it left, shared by rmcp's `receive` and the direct
/// calls waiting for their answers.
///
/// Whoever holds `state` reads, and hands every message to the guard, which routes a
/// direct call's answer to its caller and queues the rest for rmcp. A direct call that
/// reads its own answer is woken by the pipe itself: through rmcp's loop the answer
/// would wake that loop's task first, and the caller only after it. Neither reader waits
/// for the lock (whoever holds it wakes the other when it must):
/// - a direct call that finds the lock taken waits for its answer, which the holder
///   routes to it;
/// - rmcp's `receive` that finds it taken waits to be woken through `rmcp_waker`: for a
///   message queued for rmcp, for the end, or when the call that reads stops waiting and
///   leaves the pipe to rmcp ([`Self::hand_back`]).
pub(super) struct ReadSide<R> {
    state: Mutex<ReadState<R>>,
    /// rmcp's `receive`, as it last waited. rmcp polls it from its loop's one task, so
    /// this waker does not change between a reader taking it and registering it.
    rmcp_waker: Mutex<Option<Waker>>,
    /// The span rmcp's loop runs in (the connection's), where a direct call that reads logs
    /// what the guard makes of the connection, as rmcp's reading did.
    span: OnceLock<tracing::Span>,
}

struct ReadState<R> {
    /// `None` once rmcp dropped the transport: the server's stdout is closed then, as
    /// before direct calls shared it, so a server still writing gets `EPIPE`.
    reader: Option<BufReader<R>>,
    line: Vec<u8>,
    /// The scan of `line`, once it is longer than the smallest cap.
    scan: Option<IdScan>,
    discard: Option<Discard>,
}

/// The server's stdin; `None` once closed.
pub(super) type Writer<W> = Arc<tokio::sync::Mutex<Option<W>>>;

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub(super) fn new(read: R, write: W, limits: Limits) -> Self {
        let state = ReadState {
            reader: Some(BufReader::with_capacity(READ_BUFFER_BYTES, read)),
            line: Vec::new(),
            scan: None,
            discard: None,
        };
        Self {
            read: Arc::new(ReadSide {
                state: Mutex::new(state),
                rmcp_waker: Mutex::new(None),
                span: OnceLock::new(),
            }),
            writer: Arc::new(tokio::sync::Mutex::new(Some(write))),
            guard: Arc::new(Mutex::new(Guard::new(limits.clone()))),
            limits,
        }
    }

    /// The host's own `tools/call` path on this connection (see [`super::direct`]).
    pub(super) fn direct_calls(&self) -> DirectCalls<R, W> {
        DirectCalls::new(
            self.guard.clone(),
            self.read.clone(),
            self.writer.clone(),
            self.limits.clone(),
        )
    }

    /// Closes the server's stdin (the MCP way to ask a stdio server to exit).
    async fn close_input(&mut self) {
        self.writer.lock().await.take();
    }
}

impl<R: AsyncRead + Unpin> ReadSide<R> {
    /// Reads and hands the guard what it reads, until the pipe has nothing more now, the
    /// stream ends, or `done` says stop; `None` when another reader holds the pipe (it
    /// hands the guard what it reads in the meantime). A direct call (not `by_rmcp`) stops
    /// too once something waits for rmcp (a message, the closing, the end), and wakes
    /// rmcp's `receive`: rmcp takes the pipe from there, so its queue holds one message
    /// at most, as when only rmcp read. The stream's end ends the guard: pending direct
    /// calls fail.
    pub(super) fn read_for_guard(
        &self,
        guard: &Mutex<Guard>,
        limits: &Limits,
        cx: &mut Context<'_>,
        by_rmcp: bool,
        mut done: impl FnMut() -> bool,
    ) -> Option<Poll<()>> {
        let mut state = try_lock_state(&self.state)?;
        let _rmcp_span = (!by_rmcp)
            .then(|| self.span.get().map(tracing::Span::enter))
            .flatten();
        loop {
            let incoming = match state.poll_incoming(guard, limits, cx) {
                Poll::Ready(incoming) => incoming,
                Poll::Pending => return Some(Poll::Pending),
            };
            let for_rmcp = {
                let mut guard = lock(guard);
                match incoming {
                    Some(incoming) => guard.take(incoming),
                    None => guard.end(),
                }
                guard.has_ready() || guard.is_closed() || guard.is_ended()
            };
            if for_rmcp && !by_rmcp {
                drop(state);
                self.wake_rmcp();
                return Some(Poll::Ready(()));
            }
            if done() || for_rmcp {
                return Some(Poll::Ready(()));
            }
        }
    }

    /// A direct call stops waiting: the pipe goes back to rmcp's `receive`, whose waker
    /// the call's own may have replaced. Registered without waking rmcp when the pipe has
    /// nothing yet.
    pub(super) fn hand_back(&self) {
        let Some(rmcp) = lock(&self.rmcp_waker).clone() else {
            return;
        };
        // Another reader holds the pipe: it hands it back in turn.
        let Some(mut state) = try_lock_state(&self.state) else {
            return;
        };
        let Some(reader) = state.reader.as_mut() else {
            return;
        };
        if Pin::new(reader)
            .poll_fill_buf(&mut Context::from_waker(&rmcp))
            .is_ready()
        {
            rmcp.wake();
        }
    }

    fn wake_rmcp(&self) {
        if let Some(rmcp) = lock(&self.rmcp_waker).as_ref() {
            rmcp.wake_by_ref();
        }
    }
}

/// The read state, unless another reader holds it (whatever a panic left it in, as
/// [`lock`] takes it).
fn try_lock_state<R>(state: &Mutex<ReadState<R>>) -> Option<MutexGuard<'_, ReadState<R>>> {
    match state.try_lock() {
        Ok(state) => Some(state),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl<R: AsyncRead + Unpin> ReadState<R> {
    /// Reads until something for the guard: a message, an unreadable one, or `None` at the
    /// end of the stream. All state lives in `self` and bytes are consumed only after they
    /// were handled, so whoever reads next resumes where this read stopped.
    fn poll_incoming(
        &mut self,
        guard: &Mutex<Guard>,
        limits: &Limits,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Incoming>> {
        loop {
            let read_cap = lock(guard).read_cap();
            let smallest = limits.smallest_message();
            let mut parsed = None;
            let (consumed, step) = {
                let Some(reader) = self.reader.as_mut() else {
                    return Poll::Ready(None);
                };
                let available = match ready!(Pin::new(reader).poll_fill_buf(cx)) {
                    Ok(available) => available,
                    Err(error) => {
                        tracing::warn!(server_id = %limits.server_id, %error, "cannot read from the MCP server");
                        return Poll::Ready(None);
                    }
                };
                if available.is_empty() {
                    return Poll::Ready(None);
                }
                let newline = available.iter().position(|&b| b == b'\n');
                let take = newline.map_or(available.len(), |at| at + 1);
                let chunk = &available[..take];
                let ends = newline.is_some();
                let step = if let Some(discard) = &mut self.discard {
                    if !discard.reported {
                        discard.scan.feed(chunk);
                    }
                    discard.seen = discard.seen.saturating_add(take as u64);
                    if ends {
                        Step::Discarded
                    } else {
                        Step::Discarding
                    }
                } else {
                    let len = self.line.len().saturating_add(take);
                    let mut limit = read_cap;
                    if len > smallest {
                        // Long enough that its own cap may be smaller than the read cap:
                        // find out whose answer it is while reading.
                        let scan = self.scan.get_or_insert_with(|| {
                            let mut scan = IdScan::default();
                            scan.feed(&self.line);
                            scan
                        });
                        scan.feed(chunk);
                        if scan.is_answer() && scan.id().is_some() {
                            limit = limit.min(lock(guard).cap_of(scan.id(), true));
                        }
                    }
                    if len > limit {
                        // `len > limit >= smallest`, so the line has been scanned.
                        let scan = self.scan.take().unwrap_or_default();
                        self.line = Vec::new();
                        self.discard = Some(Discard {
                            scan,
                            seen: len as u64,
                            reported: false,
                            ended: false,
                        });
                        if ends {
                            Step::Discarded
                        } else {
                            Step::Discarding
                        }
                    } else if ends && self.line.is_empty() {
                        // The whole line is in the read buffer: no copy into `line`.
                        parsed = Some(parse(guard, self.scan.as_ref(), chunk));
                        Step::Parsed
                    } else {
                        self.line.extend_from_slice(chunk);
                        if ends { Step::Line } else { Step::More }
                    }
                };
                (take, step)
            };
            if let Some(reader) = self.reader.as_mut() {
                Pin::new(reader).consume(consumed);
            }
            match step {
                Step::More => {}
                Step::Parsed => {
                    self.scan = None;
                    return Poll::Ready(parsed);
                }
                Step::Line => {
                    let incoming = parse(guard, self.scan.as_ref(), &self.line);
                    self.line.clear();
                    self.line.shrink_to(KEEP_LINE_CAPACITY);
                    self.scan = None;
                    return Poll::Ready(Some(incoming));
                }
                Step::Discarding => {
                    let Some(discard) = &mut self.discard else {
                        continue;
                    };
                    let over = discard.seen.saturating_sub(read_cap as u64);
                    if over > defaults::MCP_MAX_DISCARD_BYTES && !discard.ended {
                        discard.ended = true;
                        return Poll::Ready(Some(Incoming::Endless { seen: discard.seen }));
                    }
                    if !discard.reported
                        && discard.scan.is_answer()
                        && let Some(id) = discard.scan.id()
                    {
                        discard.reported = true;
                        return Poll::Ready(Some(Incoming::Unreadable {
                            id: Some(id.clone()),
                            answer: true,
                            problem: Problem::TooLarge { seen: discard.seen },
                        }));
                    }
                }
                Step::Discarded => {
                    if let Some(discard) = self.discard.take()
                        && !discard.reported
                    {
                        return Poll::Ready(Some(Incoming::Unreadable {
                            id: discard.scan.id().cloned(),
                            answer: discard.scan.is_answer(),
                            problem: Problem::TooLarge { seen: discard.seen },
                        }));
                    }
                }
            }
        }
    }
}

/// A complete `line` read within the read cap (and scanned in `scan` if longer than the
/// smallest cap). An answer to a pending `tools/call` is read as one ([`call_answer`]);
/// everything else goes through rmcp's generic parse. The guard is locked only to look
/// up ids, not while a line is parsed.
fn parse(guard: &Mutex<Guard>, scan: Option<&IdScan>, line: &[u8]) -> Incoming {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Incoming::Blank;
    }
    // A line over its own cap that the read cap let through: one that turned out not
    // to be an answer (a notification may not be as large as a list).
    if let Some(scan) = scan
        && line.len() > lock(guard).cap_of(scan.id(), scan.is_answer())
    {
        return Incoming::Unreadable {
            id: scan.id().cloned(),
            answer: scan.is_answer(),
            problem: Problem::TooLarge {
                seen: line.len() as u64,
            },
        };
    }
    // One check of the whole line for serde_json's reserved key serves both parses.
    let parsed = crate::json::refuse_raw_value_key(line).and_then(|()| {
        match call_answer(line, |id| lock(guard).is_pending_call(id)) {
            Some(message) => Ok(message),
            None => serde_json::from_slice::<ServerJsonRpcMessage>(line),
        }
    });
    match parsed {
        Ok(message) => Incoming::Message(message),
        Err(error) => {
            let fresh;
            let scan = match scan {
                Some(scan) => scan,
                None => {
                    let mut scan = IdScan::default();
                    scan.feed(line);
                    fresh = scan;
                    &fresh
                }
            };
            Incoming::Unreadable {
                id: scan.id().cloned(),
                answer: scan.is_answer(),
                problem: Problem::Invalid(error.to_string()),
            }
        }
    }
}

impl<R, W> Drop for LineTransport<R, W> {
    /// rmcp dropped the transport (the session ended): no direct call can be answered, and
    /// no one reads the server's stdout any more.
    fn drop(&mut self) {
        lock(&self.guard).end();
        lock(&self.read.state).reader = None;
    }
}

/// Writes `line` (a whole line) to `writer`: at once, as far as the pipe takes it without
/// waiting, when no other write holds the pipe (tokio's lock is fair: none is queued
/// either); the rest, if any, in the returned future, which waits its turn and gives up
/// after `timeout` (the server stopped reading: its stdin is closed). The flag says the
/// future will not wait (the line is written, or cannot be).
///
/// rmcp runs a send's future as a task of its own, so a line left to it would reach the
/// server only once that task is scheduled.
pub(super) fn write_line<W>(
    writer: &Writer<W>,
    bytes: Vec<u8>,
    timeout: Duration,
    server_id: Arc<str>,
) -> (
    bool,
    impl Future<Output = std::io::Result<()>> + Send + 'static,
)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut held = None;
    let (mut written, mut done) = (0, false);
    if let Ok(mut stdin) = writer.clone().try_lock_owned() {
        match stdin.as_mut() {
            Some(pipe) => (written, done) = write_now(pipe, &bytes),
            None => done = true,
        }
        held = Some(stdin);
    }
    let writer = writer.clone();
    let write = async move {
        let mut writer = match held {
            Some(held) => held,
            None => writer.lock_owned().await,
        };
        let Some(stdin) = writer.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the server's stdin is closed",
            ));
        };
        if done {
            return Ok(());
        }
        let write = async {
            stdin.write_all(&bytes[written..]).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(written) => written,
            Err(_) => {
                // A partial line is on the wire: nothing more can be sent after it.
                writer.take();
                tracing::warn!(server_id = %server_id, timeout_ms = timeout.as_millis() as u64, "the MCP server stopped reading its stdin; closed it");
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the server did not read its input within {} ms",
                        timeout.as_millis()
                    ),
                ))
            }
        }
    };
    (done, write)
}

/// Writes as much of `bytes` to `pipe` as it takes without waiting: how many bytes, and
/// whether all of them were flushed too. An error stops here; the caller's retry of the
/// rest reports it.
fn write_now<W: AsyncWrite + Unpin>(pipe: &mut W, bytes: &[u8]) -> (usize, bool) {
    let mut cx = Context::from_waker(Waker::noop());
    let mut written = 0;
    while written < bytes.len() {
        match Pin::new(&mut *pipe).poll_write(&mut cx, &bytes[written..]) {
            Poll::Ready(Ok(n)) if n > 0 => written += n,
            _ => return (written, false),
        }
    }
    let flushed = matches!(Pin::new(pipe).poll_flush(&mut cx), Poll::Ready(Ok(())));
    (written, flushed)
}

impl<R, W> Transport<RoleClient> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        lock(&self.guard).on_send(&item);
        let encoded = serde_json::to_vec(&item).map(|mut bytes| {
            bytes.push(b'\n');
            bytes
        });
        let write = encoded.map(|bytes| {
            write_line(
                &self.writer,
                bytes,
                self.limits.write_timeout,
                self.limits.server_id.clone(),
            )
            .1
        });
        async move { write.map_err(std::io::Error::other)?.await }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        self.read.span.get_or_init(tracing::Span::current);
        std::future::poll_fn(|cx| {
            {
                let mut rmcp = lock(&self.read.rmcp_waker);
                match rmcp.as_ref() {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *rmcp = Some(cx.waker().clone()),
                }
            }
            loop {
                if let Some(next) = lock(&self.guard).next_ready() {
                    return Poll::Ready(next);
                }
                if lock(&self.guard).is_ended() {
                    return Poll::Ready(None);
                }
                // Whoever reads instead wakes this when it matters (see `ReadSide`).
                match self
                    .read
                    .read_for_guard(&self.guard, &self.limits, cx, true, || true)
                {
                    Some(Poll::Ready(())) => {}
                    Some(Poll::Pending) | None => return Poll::Pending,
                }
            }
        })
        .await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.close_input().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, RequestId};
    use tokio::io::{AsyncReadExt, DuplexStream, duplex};

    use super::*;
    use crate::mcp::error::{McpErrorCode, from_host_error};

    const CAP: u64 = 1000;

    fn limits() -> Limits {
        Limits::for_tests(CAP, CAP, Duration::from_millis(300))
    }

    /// A transport whose server side is the returned pair (what the server writes, what it
    /// reads).
    fn transport() -> (
        LineTransport<DuplexStream, DuplexStream>,
        DuplexStream,
        DuplexStream,
    ) {
        let (server_out, host_in) = duplex(1 << 16);
        let (host_out, server_in) = duplex(1 << 16);
        (
            LineTransport::new(host_in, host_out, limits()),
            server_out,
            server_in,
        )
    }

    fn call(id: i64) -> ClientJsonRpcMessage {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("t".to_owned()),
        ));
        ClientJsonRpcMessage::request(request, RequestId::Number(id))
    }

    fn host_error_of(message: ServerJsonRpcMessage) -> (RequestId, McpErrorCode, String) {
        let (data, id) = message.into_error().expect("an error");
        let error = from_host_error(&data).expect("made by the host");
        (id.unwrap(), error.code, error.message)
    }

    #[tokio::test]
    async fn an_endless_line_fails_its_call_at_once_and_the_next_line_is_read() {
        let (mut transport, mut server_out, _server_in) = transport();
        transport.send(call(1)).await.unwrap();
        transport.send(call(2)).await.unwrap();
        let (failed, wait_failed) = tokio::sync::oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            server_out
                .write_all(
                    br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":""#,
                )
                .await
                .unwrap();
            // 100 times the cap, with no newline: the call fails before the line ends.
            for _ in 0..100 {
                server_out.write_all(&[b'x'; CAP as usize]).await.unwrap();
            }
            wait_failed.await.unwrap();
            for _ in 0..100 {
                server_out.write_all(&[b'x'; CAP as usize]).await.unwrap();
            }
            server_out
                .write_all(b"\"}]}}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n")
                .await
                .unwrap();
            server_out
        });
        let (id, code, message) = host_error_of(transport.receive().await.unwrap());
        assert_eq!(
            (id, code),
            (RequestId::Number(1), McpErrorCode::OutputTooLarge)
        );
        assert!(
            message.contains("budgets.max_tool_output_bytes") && message.contains("server `s`"),
            "{message}"
        );
        assert!(
            transport.line_capacity() <= CAP as usize + 65536 + 8192,
            "never buffered the line"
        );
        failed.send(()).unwrap();
        let next = transport.receive().await.unwrap();
        assert!(
            matches!(next, rmcp::model::JsonRpcMessage::Response(ref r) if r.id == RequestId::Number(2)),
            "{next:?}"
        );
        drop(writer.await.unwrap());
        assert!(transport.receive().await.is_none(), "end of stream");
    }

    #[tokio::test]
    async fn a_late_id_a_garbage_line_and_a_line_for_a_smaller_cap_each_fail_their_call() {
        let (mut transport, mut server_out, _server_in) = transport();
        for id in 1..=3 {
            transport.send(call(id)).await.unwrap();
        }
        let big = "y".repeat(70_000);
        let text = format!(
            "{{\"result\":{{\"text\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\":1}}\n\
             not json at all\n\
             {{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{{\"content\":7}}, oops\n\
             \n\
             {{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"content\":[]}}}}\n"
        );
        tokio::spawn(async move { server_out.write_all(text.as_bytes()).await });
        let (id, code, _) = host_error_of(transport.receive().await.unwrap());
        assert_eq!(
            (id, code),
            (RequestId::Number(1), McpErrorCode::OutputTooLarge)
        );
        let (id, code, message) = host_error_of(transport.receive().await.unwrap());
        assert_eq!(
            (id, code),
            (RequestId::Number(2), McpErrorCode::ToolExecFailed),
            "{message}"
        );
        assert!(message.contains("not valid JSON-RPC"), "{message}");
        let last = transport.receive().await.unwrap();
        assert!(
            matches!(last, rmcp::model::JsonRpcMessage::Response(ref r) if r.id == RequestId::Number(3))
        );
        assert_eq!(
            transport.guard_dropped(),
            1,
            "the garbage line answered nothing"
        );
    }

    /// serde_json would read the string under its reserved key as the JSON it holds.
    #[tokio::test]
    async fn a_call_answer_hiding_values_in_a_string_fails_its_call() {
        let (mut transport, mut server_out, _server_in) = transport();
        transport.send(call(1)).await.unwrap();
        let line = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"$serde_json::private::RawValue":"[[1]]"}}}"#;
        tokio::spawn(async move { server_out.write_all(format!("{line}\n").as_bytes()).await });
        let (id, code, message) = host_error_of(transport.receive().await.unwrap());
        assert_eq!(
            (id, code),
            (RequestId::Number(1), McpErrorCode::ToolExecFailed)
        );
        assert!(message.contains("is reserved"), "{message}");
    }

    #[tokio::test]
    async fn a_server_that_stops_reading_gets_its_input_closed() {
        let (mut transport, _server_out, mut server_in) = transport();
        let mut huge = call(1);
        if let rmcp::model::JsonRpcMessage::Request(request) = &mut huge
            && let ClientRequest::CallToolRequest(call) = &mut request.request
        {
            let mut args = rmcp::model::JsonObject::new();
            args.insert("x".into(), "z".repeat(1 << 20).into());
            call.params.arguments = Some(args);
        }
        let started = Instant::now();
        let error = transport.send(huge).await.expect_err("the pipe is full");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
        let error = transport.send(call(2)).await.expect_err("input closed");
        assert_eq!(error.kind(), std::io::ErrorKind::NotConnected);
        let mut sink = Vec::new();
        server_in.read_to_end(&mut sink).await.unwrap();
    }

    #[tokio::test]
    async fn a_line_is_on_the_wire_before_its_future_runs_and_lines_keep_their_order() {
        let (mut transport, _server_out, mut server_in) = transport();
        // Not polled: rmcp spawns it as a task, which may run much later.
        let sent = transport.send(call(1));
        let mut line = vec![0; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), server_in.read(&mut line))
            .await
            .expect("written by send itself")
            .unwrap();
        assert!(line[..n].ends_with(b"\n"), "a whole line");
        sent.await.unwrap();

        // A line the pipe cannot take at once goes on in its future; a line sent after it
        // waits for it, so nothing interleaves.
        let mut big = call(2);
        if let rmcp::model::JsonRpcMessage::Request(request) = &mut big
            && let ClientRequest::CallToolRequest(call) = &mut request.request
        {
            let mut args = rmcp::model::JsonObject::new();
            args.insert("x".into(), "z".repeat(200_000).into());
            call.params.arguments = Some(args);
        }
        let big = tokio::spawn(transport.send(big));
        let small = tokio::spawn(transport.send(call(3)));
        let mut all = Vec::new();
        let mut buf = vec![0; 1 << 16];
        while all.iter().filter(|&&b| b == b'\n').count() < 2 {
            let n = server_in.read(&mut buf).await.unwrap();
            assert!(n > 0);
            all.extend_from_slice(&buf[..n]);
        }
        let lines: Vec<serde_json::Value> = all
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("whole lines"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[0]["id"].as_i64(), lines[1]["id"].as_i64()),
            (Some(2), Some(3))
        );
        big.await.unwrap().unwrap();
        small.await.unwrap().unwrap();
    }

    impl<R, W> LineTransport<R, W> {
        fn guard_dropped(&self) -> u64 {
            lock(&self.guard).dropped()
        }

        fn line_capacity(&self) -> usize {
            lock(&self.read.state).line.capacity()
        }
    }
}
