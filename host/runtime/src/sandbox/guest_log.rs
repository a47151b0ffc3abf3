//! The guest's output on the host's stderr, and where its `log` lines go.
//!
//! Guest authors use `log` as `printf` (SPEAR's C header maps `printf` to it), so a line is
//! shown as written, one per call, with control and format characters made visible
//! ([`text::printable_lines`]) so a guest cannot drive the terminal or disguise its text, and with every secret this process resolved cut out
//! ([`redact_known`]), wherever it goes. With captured output it is appended to the task's
//! captured stderr, charged to the same budget as WASI writes. Otherwise it goes to the
//! host's stderr through one process-wide writer thread, and so do the guest's own stderr
//! writes (WASI fd 2, [`HostStderr`]): one queue keeps them in the order the guest made
//! them. A hostcall never waits on a slow or stuck stderr (it cannot be interrupted at the
//! task's deadline while blocked in a write); lines and writes are dropped, and counted,
//! once [`GUEST_STDERR_QUEUE_BYTES`](defaults::GUEST_STDERR_QUEUE_BYTES) are waiting.
//!
//! A stderr write passes through as the guest wrote it, neither escaped nor redacted (like
//! its stdout; one write may end anywhere, even inside a character or a secret). A `log`
//! line is always a line of its own: when the guest's writes left a line open, it is ended
//! first, so a line never runs into what the guest wrote around it.

use std::collections::VecDeque;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::capture::{CapturePipe, WRITE_CHUNK};
use crate::defaults;
use crate::registry::redact_known;
use crate::text;

/// Where one task's `log` lines go (from [`GuestLogs`](super::GuestLogs) and capture).
pub(super) enum GuestLogSink {
    /// The host's stderr, through the writer thread.
    Stderr,
    /// The task's captured stderr.
    Captured(CapturePipe),
    /// Host tracing events at the guest's level.
    Tracing,
}

impl GuestLogSink {
    /// Shows `line` as the guest's output. `Err` when captured output is over its budget.
    pub(super) fn write(&self, line: &str) -> std::io::Result<()> {
        let shown = || as_shown(&redact_known(line));
        match self {
            GuestLogSink::Stderr => {
                queue().push(Piece::Line(shown()));
                Ok(())
            }
            GuestLogSink::Captured(pipe) => pipe.append_line(&shown()),
            GuestLogSink::Tracing => Ok(()),
        }
    }
}

/// The guest's stderr (WASI fd 2) when it is the host's: its writes join the `log` lines'
/// queue, so both come out in the guest's order. A write the queue cannot hold is dropped
/// and counted, and still succeeds for the guest, as a line of its log would.
#[derive(Clone, Copy)]
pub(super) struct HostStderr;

impl HostStderr {
    fn push(bytes: Vec<u8>) {
        if !bytes.is_empty() {
            queue().push(Piece::Write(bytes));
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for HostStderr {
    async fn ready(&mut self) {}
}

impl OutputStream for HostStderr {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        Self::push(Vec::from(bytes));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_CHUNK)
    }
}

impl tokio::io::AsyncWrite for HostStderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Self::push(buf.to_vec());
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The guest sees what it would with the host's stderr inherited.
impl IsTerminal for HostStderr {
    fn is_terminal(&self) -> bool {
        std::io::IsTerminal::is_terminal(&std::io::stderr())
    }
}

impl StdoutStream for HostStderr {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(*self)
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(*self)
    }
}

/// `line` as shown: one trailing line end dropped (the host ends every line), line feeds
/// and tabs inside kept, everything else that could drive a terminal or disguise text
/// escaped as on every line the host shows ([`text::printable_lines`]).
fn as_shown(line: &str) -> Vec<u8> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut out = text::printable_lines(line);
    out.push('\n');
    out.into_bytes()
}

/// Waits until the guest output queued for the host's stderr before this call is written
/// (later output does not hold it), at most `timeout`; false if some was not. `quiver run`
/// calls it before it exits, and its log writer before each host log line, so that line
/// keeps its place after the guest output that led to it.
pub fn flush_guest_stderr(timeout: Duration) -> bool {
    QUEUE.get().is_none_or(|queue| queue.wait_written(timeout))
}

static QUEUE: OnceLock<StderrQueue> = OnceLock::new();

fn queue() -> &'static StderrQueue {
    QUEUE.get_or_init(|| {
        let new = StderrQueue {
            state: Mutex::new(Queued {
                writer_running: true,
                ..Queued::default()
            }),
            ready: Condvar::new(),
            drained: Condvar::new(),
        };
        let spawned = std::thread::Builder::new()
            .name("quiver-guest-stderr".into())
            // It waits here for this initialisation to finish.
            .spawn(|| write_out(queue()));
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the guest stderr writer; guest log lines are dropped");
            new.lock().writer_running = false;
        }
        new
    })
}

/// Guest output waiting for the host's stderr.
struct StderrQueue {
    state: Mutex<Queued>,
    /// Output arrived (or a drop to report).
    ready: Condvar,
    /// The writer finished a batch.
    drained: Condvar,
}

/// One piece of guest output, in the order the guest made it.
enum Piece {
    /// A `log` line, as shown ([`as_shown`]).
    Line(Vec<u8>),
    /// Bytes the guest wrote to its stderr.
    Write(Vec<u8>),
}

impl Piece {
    fn bytes(&self) -> &Vec<u8> {
        match self {
            Piece::Line(bytes) | Piece::Write(bytes) => bytes,
        }
    }
}

#[derive(Default)]
struct Queued {
    pieces: VecDeque<Piece>,
    /// Memory held by the pieces queued or being written ([`queued_cost`]).
    bytes: usize,
    /// Pieces dropped since the last report.
    dropped: Dropped,
    /// Pieces pushed so far, kept or dropped.
    pushed: u64,
    /// Of those, how many the writer has written out or reported dropped.
    shown: u64,
    writer_running: bool,
}

impl Queued {
    fn has_work(&self) -> bool {
        !self.pieces.is_empty() || self.dropped.any()
    }
}

/// What was dropped since the last report, by kind.
#[derive(Default, Clone, Copy)]
struct Dropped {
    lines: u64,
    writes: u64,
}

impl Dropped {
    fn any(self) -> bool {
        self.lines > 0 || self.writes > 0
    }

    fn count(&mut self, piece: &Piece) {
        let count = match piece {
            Piece::Line(_) => &mut self.lines,
            Piece::Write(_) => &mut self.writes,
        };
        *count = count.saturating_add(1);
    }

    /// The line that reports the drop, without its line end.
    fn notice(self) -> Option<String> {
        let what = match (self.lines, self.writes) {
            (0, 0) => return None,
            (lines, 0) => format!("{lines} guest log line(s)"),
            (0, writes) => format!("{writes} guest stderr write(s)"),
            (lines, writes) => {
                format!("{lines} guest log line(s) and {writes} guest stderr write(s)")
            }
        };
        Some(format!("quiver: {what} dropped: stderr did not keep up"))
    }
}

impl StderrQueue {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until what was pushed before this call is shown, at most `timeout`.
    fn wait_written(&self, timeout: Duration) -> bool {
        let until = Instant::now().checked_add(timeout);
        let mut state = self.lock();
        let target = state.pushed;
        while state.shown < target {
            let left = until.map_or(timeout, |until| {
                until.saturating_duration_since(Instant::now())
            });
            if left.is_zero() || !state.writer_running {
                return false;
            }
            state = self
                .drained
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Queues `piece`, or counts it dropped when the queue is full or nothing writes it.
    fn push(&self, piece: Piece) {
        let mut state = self.lock();
        state.pushed = state.pushed.saturating_add(1);
        let cost = queued_cost(piece.bytes());
        let fits = state
            .bytes
            .checked_add(cost)
            .is_some_and(|total| total <= defaults::GUEST_STDERR_QUEUE_BYTES);
        if fits && state.writer_running {
            state.bytes += cost;
            state.pieces.push_back(piece);
        } else {
            state.dropped.count(&piece);
        }
        drop(state);
        self.ready.notify_one();
    }
}

/// What a queued piece holds in memory: its buffer and the queue's slot and allocation
/// around it, so a flood of empty lines or one-byte writes is bounded like one of long lines.
fn queued_cost(bytes: &Vec<u8>) -> usize {
    const PER_PIECE: usize = std::mem::size_of::<Piece>() + 32;
    bytes.capacity().saturating_add(PER_PIECE)
}

/// The writer thread: takes everything queued at once and writes it out, then says so.
fn write_out(queue: &StderrQueue) {
    let mut line_open = false;
    loop {
        let (pieces, dropped, upto) = {
            let mut state = queue.lock();
            while !state.has_work() {
                state = queue.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            (
                std::mem::take(&mut state.pieces),
                std::mem::take(&mut state.dropped),
                state.pushed,
            )
        };
        let mut stderr = std::io::stderr().lock();
        let written = show(&mut stderr, &pieces, dropped, &mut line_open);
        // Nothing to do about a closed stderr but go on dropping.
        let _ = stderr.flush();
        drop(stderr);
        let mut state = queue.lock();
        state.bytes = state.bytes.saturating_sub(written);
        state.shown = upto;
        drop(state);
        queue.drained.notify_all();
    }
}

/// Writes `pieces` in order, then the notice for `dropped`, each line (a `log` line or the
/// notice) on a line of its own; `line_open` says whether the last write left a line open.
/// Returns the queue memory the pieces held.
fn show(
    out: &mut impl std::io::Write,
    pieces: &VecDeque<Piece>,
    dropped: Dropped,
    line_open: &mut bool,
) -> usize {
    fn start_line(out: &mut impl std::io::Write, line_open: &mut bool) {
        if std::mem::take(line_open) {
            let _ = out.write_all(b"\n");
        }
    }
    let mut written = 0usize;
    for piece in pieces {
        // Errors are ignored: nothing to do about a closed stderr but go on dropping.
        match piece {
            Piece::Line(line) => {
                start_line(out, line_open);
                let _ = out.write_all(line);
            }
            Piece::Write(bytes) => {
                *line_open = bytes.last().is_some_and(|&last| last != b'\n');
                let _ = out.write_all(bytes);
            }
        }
        written = written.saturating_add(queued_cost(piece.bytes()));
    }
    if let Some(notice) = dropped.notice() {
        start_line(out, line_open);
        let _ = writeln!(out, "{notice}");
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue no thread writes out.
    fn unwritten_queue() -> StderrQueue {
        StderrQueue {
            state: Mutex::new(Queued {
                writer_running: true,
                ..Queued::default()
            }),
            ready: Condvar::new(),
            drained: Condvar::new(),
        }
    }

    #[test]
    fn a_flood_of_empty_lines_is_bounded_by_memory_not_text() {
        let queue = unwritten_queue();
        // Nothing writes: the queue only fills.
        for _ in 0..1_000_000 {
            queue.push(Piece::Line(b"\n".to_vec()));
        }
        let state = queue.lock();
        assert!(state.bytes <= defaults::GUEST_STDERR_QUEUE_BYTES);
        let most = defaults::GUEST_STDERR_QUEUE_BYTES / std::mem::size_of::<Vec<u8>>();
        assert!(
            state.pieces.len() < most,
            "{} lines queued",
            state.pieces.len()
        );
        assert!(state.dropped.lines > 0 && state.dropped.writes == 0);
    }

    #[test]
    fn writes_pass_through_and_lines_and_notices_start_a_line_of_their_own() {
        let pieces = |list: &[(bool, &[u8])]| -> VecDeque<Piece> {
            list.iter()
                .map(|&(line, bytes)| match line {
                    true => Piece::Line(bytes.to_vec()),
                    false => Piece::Write(bytes.to_vec()),
                })
                .collect()
        };
        let mut out = Vec::new();
        let mut line_open = false;
        let batch = pieces(&[
            (false, b"part"),
            (true, b"x\n"),
            (false, b"ial\n"),
            (true, b"y\n"),
            (false, b"\x1b[1mraw"),
        ]);
        let written = show(&mut out, &batch, Dropped::default(), &mut line_open);
        assert!(written > 0);
        assert!(line_open, "the last write left its line open");
        // The next batch goes on from there.
        let dropped = Dropped {
            lines: 2,
            writes: 0,
        };
        show(
            &mut out,
            &pieces(&[(false, b" more")]),
            dropped,
            &mut line_open,
        );
        show(
            &mut out,
            &pieces(&[(true, b"z\n")]),
            Dropped::default(),
            &mut line_open,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "part\nx\nial\ny\n\x1b[1mraw more\n\
             quiver: 2 guest log line(s) dropped: stderr did not keep up\nz\n"
        );
        assert!(!line_open);
    }

    #[test]
    fn a_flush_waits_for_what_was_pushed_before_it() {
        let queue = unwritten_queue();
        assert!(queue.wait_written(Duration::ZERO), "nothing pushed");
        queue.push(Piece::Write(b"a".to_vec()));
        queue.push(Piece::Line(b"b\n".to_vec()));
        // Nothing writes: the wait ends at its timeout.
        assert!(!queue.wait_written(Duration::from_millis(10)));
        queue.lock().shown = 2;
        assert!(
            queue.wait_written(Duration::ZERO),
            "the writer has shown both"
        );
        queue.push(Piece::Write(b"c".to_vec()));
        assert!(!queue.wait_written(Duration::ZERO), "one more to show");
    }

    #[test]
    fn a_notice_names_what_was_dropped() {
        let notice = |lines, writes| Dropped { lines, writes }.notice();
        assert_eq!(notice(0, 0), None);
        assert_eq!(
            notice(0, 3).unwrap(),
            "quiver: 3 guest stderr write(s) dropped: stderr did not keep up"
        );
        assert_eq!(
            notice(1, 2).unwrap(),
            "quiver: 1 guest log line(s) and 2 guest stderr write(s) dropped: stderr did not keep up"
        );
    }

    #[test]
    fn captured_lines_are_redacted_and_start_a_line_of_their_own() {
        let _secrets = crate::registry::Secrets::new(["captured-secret-91c4"]);
        let budget = super::super::MemoryBudget::new(std::sync::Arc::from("t"), 1 << 20);
        let output = super::super::CapturedOutput::new(&budget);
        let (_, stderr) = output.pipes();
        let sink = GuestLogSink::Captured(stderr.clone());
        sink.write("key=captured-secret-91c4;\x1b").unwrap();
        stderr.append(b"open").unwrap();
        sink.write("next").unwrap();
        assert_eq!(
            String::from_utf8(output.take().1).unwrap(),
            "key=[redacted];\\x1b\nopen\nnext\n"
        );
    }

    #[test]
    fn lines_are_shown_as_written_with_controls_made_visible() {
        let shown = |line: &str| String::from_utf8(as_shown(line)).unwrap();
        assert_eq!(shown("hello"), "hello\n");
        assert_eq!(
            shown("hello\n"),
            "hello\n",
            "a guest's own line end is not doubled"
        );
        assert_eq!(shown("crlf\r\n"), "crlf\n");
        assert_eq!(shown("a\n\nb\tc\n\n"), "a\n\nb\tc\n\n");
        assert_eq!(
            shown("\u{1b}[2J\u{7}bell\r\u{9b}31m\u{0}"),
            "\\x1b[2J\\x07bell\\x0d\\u{9b}31m\\x00\n"
        );
        assert_eq!(shown("Ω ünïcode"), "Ω ünïcode\n");
        assert_eq!(
            shown("ok\u{202e}txt.exe\u{200b}\u{2066}x\u{feff}"),
            "ok\\u{202e}txt.exe\\u{200b}\\u{2066}x\\u{feff}\n",
            "characters that reorder or hide text are shown escaped"
        );
    }

    #[test]
    fn a_guest_line_is_made_safe_as_every_other_line_the_host_shows() {
        // The same hostile text as a guest `log` line and as any other line of untrusted
        // text the host shows (a server's last error, the names in an approval question,
        // a cell of `quiver status`): escaped alike, a line end apart.
        let hostile =
            "ok\u{1b}[2J\u{9b}31m\rgone\u{2028}\u{202e}exe.txt\u{200d}\u{feff}\u{e0041}\u{7f}";
        let guest = String::from_utf8(as_shown(hostile)).unwrap();
        assert_eq!(guest, format!("{}\n", text::printable(hostile)));
        assert_eq!(
            guest,
            "ok\\x1b[2J\\u{9b}31m\\x0dgone\\u{2028}\\u{202e}exe.txt\\u{200d}\\u{feff}\\u{e0041}\\x7f\n"
        );
    }
}
