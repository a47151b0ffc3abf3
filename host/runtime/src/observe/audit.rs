//! The audit log: one JSON line per finished tool call, per policy denial, per approval
//! decision, per `input_required` round and per sampling request, saying who called what (the task, its `principal` and the `client` that submitted it), how it ended and with
//! what shape of arguments, and who decided a call that waited for approval.
//!
//! Observers run on the task's path, so the log never writes there: each event is queued
//! (bounded, [`defaults::AUDIT_QUEUE_CAPACITY`]) for a writer thread. A queue that is full
//! because the disk is slow drops the event and counts it; the writer reports the count as
//! one `{"event":"audit_dropped","count":N}` line as soon as it gets to write again, so a
//! gap is never silent. [`AuditLog::flush`] (called by [`Host::shutdown`](crate::Host::shutdown))
//! and dropping the log write out everything queued, each waiting at most
//! [`defaults::AUDIT_FLUSH_TIMEOUT`]: a pipe nobody reads or a hung mount must not keep the
//! process from exiting, so a stuck writer is left behind with an error naming the lines
//! it did not write.
//!
//! Each line is encoded whole before any of it is written, and the file gets a line's
//! bytes in order or not at all, so a failed write (a full disk) never leaves half a line
//! for the next one to be glued to. The writer keeps what the file refused and tries again
//! (at most [`defaults::AUDIT_BUFFER_BYTES`]); past that, lines are dropped and counted
//! like a full queue's.
//!
//! Lines hold what the events hold: argument keys and sizes, and argument values only for
//! servers whose record sets `audit_arguments` (already redacted and capped when the event
//! was made, see [`super::ToolCall::argument_values`]).

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{
    Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel,
};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::{
    ApprovalDecided, InputRound, McpTaskStatus, PinsChanged, PolicyDenial, SamplingDone, ToolCall,
    ToolCallEnd, ToolObserver,
};
use crate::defaults;

/// A [`ToolObserver`] that appends one JSON line per tool call end and per policy denial
/// to a file.
pub struct AuditLog {
    path: PathBuf,
    queue: Mutex<Option<SyncSender<Message>>>,
    counts: Arc<Counts>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Disconnects when the writer thread ends.
    writer_done: Mutex<Option<Receiver<()>>>,
    /// How long [`AuditLog::flush`] and dropping the log wait for the writer.
    flush_timeout: Duration,
}

/// What the log and its writer count together.
#[derive(Default)]
struct Counts {
    /// Drops the writer has not reported yet.
    pending_drops: AtomicU64,
    /// Every drop so far.
    dropped: AtomicU64,
    /// Events queued and not yet written to the file (dropped ones excluded).
    unwritten: AtomicU64,
}

impl Counts {
    fn drop_one(&self) {
        self.pending_drops.fetch_add(1, Ordering::Relaxed);
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuditLog({})", self.path.display())
    }
}

enum Message {
    Call(Box<(ToolCall, ToolCallEnd, SystemTime)>),
    Denial(Box<PolicyDenial>),
    Decision(Box<ApprovalDecided>),
    Pins(Box<PinsChanged>),
    Input(Box<InputRound>),
    TaskStatus(Box<McpTaskStatus>),
    Sampling(Box<SamplingDone>),
    /// Write out everything before this, then answer.
    Flush(SyncSender<()>),
}

#[derive(Serialize)]
struct CallLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    call: &'a ToolCall,
    #[serde(flatten)]
    end: &'a ToolCallEnd,
}

#[derive(Serialize)]
struct DenialLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    denial: &'a PolicyDenial,
}

#[derive(Serialize)]
struct DecisionLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    decision: &'a ApprovalDecided,
}

#[derive(Serialize)]
struct PinsLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    pins: &'a PinsChanged,
}

#[derive(Serialize)]
struct InputLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    round: &'a InputRound,
}

#[derive(Serialize)]
struct TaskStatusLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    status: &'a McpTaskStatus,
}

#[derive(Serialize)]
struct SamplingLine<'a> {
    event: &'static str,
    #[serde(serialize_with = "super::event::unix_seconds")]
    time: SystemTime,
    #[serde(flatten)]
    sampling: &'a SamplingDone,
}

#[derive(Serialize)]
struct DroppedLine {
    event: &'static str,
    count: u64,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600) and starts its writer thread.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        Self::open_tuned(path.as_ref(), Tuning::default())
    }

    fn open_tuned(path: &Path, tuning: Tuning) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        Self::start(file, path, tuning)
    }

    fn start(
        out: impl Write + Send + 'static,
        path: &Path,
        tuning: Tuning,
    ) -> std::io::Result<Self> {
        let (queue, lines) = sync_channel(tuning.queue_capacity);
        let (done, writer_done) = sync_channel(0);
        let counts = Arc::new(Counts::default());
        let writer = Writer {
            out,
            pending: Vec::new(),
            pending_lines: VecDeque::new(),
            buffer_bytes: tuning.buffer_bytes,
            counts: counts.clone(),
            path: path.to_owned(),
            failed: false,
        };
        let thread = std::thread::Builder::new()
            .name("quiver-audit".into())
            .spawn(move || {
                writer.run(&lines);
                drop(done);
            })?;
        Ok(Self {
            path: path.to_owned(),
            queue: Mutex::new(Some(queue)),
            counts,
            writer: Mutex::new(Some(thread)),
            writer_done: Mutex::new(Some(writer_done)),
            flush_timeout: tuning.flush_timeout,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events dropped so far: the queue was full, or the file refused them for longer than
    /// the writer's buffer could hold them (each counted in an `audit_dropped` line).
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    fn sender(&self) -> Option<SyncSender<Message>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues without waiting; a full queue drops the event and counts it.
    fn offer(&self, message: Message) {
        let Some(queue) = self.sender() else {
            return;
        };
        // Counted first: the writer may write it before `try_send` returns.
        self.counts.unwritten.fetch_add(1, Ordering::Relaxed);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = queue.try_send(message)
        {
            self.counts.unwritten.fetch_sub(1, Ordering::Relaxed);
            self.counts.drop_one();
        }
    }

    /// Waits until every event queued so far is written and flushed to the file, at most
    /// [`defaults::AUDIT_FLUSH_TIMEOUT`]. Blocks: call it off async worker threads. Returns
    /// whether it finished in time.
    pub fn flush(&self) -> bool {
        let Some(queue) = self.sender() else {
            return true;
        };
        let (done, answer) = sync_channel(1);
        let deadline = std::time::Instant::now() + self.flush_timeout;
        let mut message = Message::Flush(done);
        // A full queue is waited out here: this is the one caller that may wait.
        loop {
            match queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    message = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        answer.recv_timeout(left).is_ok()
    }

    /// Closes the queue and waits at most the flush timeout for the writer to write out
    /// what it holds. Returns the events it left unwritten if it did not finish (a pipe
    /// nobody reads, a hung mount): the writer thread is then left to itself.
    fn close(&self) -> Option<u64> {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let done = self
            .writer_done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        if let Err(RecvTimeoutError::Timeout) = done.recv_timeout(self.flush_timeout) {
            return Some(self.counts.unwritten.load(Ordering::Relaxed));
        }
        let thread = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "the audit log writer panicked");
        }
        None
    }
}

impl Drop for AuditLog {
    /// Writes out what is queued, but never holds up the process past the flush timeout.
    fn drop(&mut self) {
        if let Some(unwritten) = self.close() {
            tracing::error!(
                path = %self.path.display(),
                unwritten,
                timeout_ms = self.flush_timeout.as_millis() as u64,
                "the audit log writer is stuck; leaving it with audit lines not written"
            );
        }
    }
}

impl ToolObserver for AuditLog {
    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        self.offer(Message::Call(Box::new((
            call.clone(),
            end.clone(),
            SystemTime::now(),
        ))));
    }

    fn policy_denied(&self, denial: &PolicyDenial) {
        self.offer(Message::Denial(Box::new(denial.clone())));
    }

    fn approval_decided(&self, decision: &ApprovalDecided) {
        self.offer(Message::Decision(Box::new(decision.clone())));
    }

    fn pins_changed(&self, event: &PinsChanged) {
        self.offer(Message::Pins(Box::new(event.clone())));
    }

    fn input_round(&self, round: &InputRound) {
        self.offer(Message::Input(Box::new(round.clone())));
    }

    fn mcp_task_status(&self, status: &McpTaskStatus) {
        self.offer(Message::TaskStatus(Box::new(status.clone())));
    }

    fn sampling(&self, event: &SamplingDone) {
        self.offer(Message::Sampling(Box::new(event.clone())));
    }
}

/// The log's sizes; tests make them small.
struct Tuning {
    queue_capacity: usize,
    buffer_bytes: usize,
    flush_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            queue_capacity: defaults::AUDIT_QUEUE_CAPACITY,
            buffer_bytes: defaults::AUDIT_BUFFER_BYTES,
            flush_timeout: defaults::AUDIT_FLUSH_TIMEOUT,
        }
    }
}

/// Owns the file. Whole lines go into `pending`, which is written out from its start, so
/// the file only ever ends in the middle of a line while the rest of it is still pending:
/// a failed or short write never glues two lines together.
struct Writer<W> {
    out: W,
    pending: Vec<u8>,
    /// For each line in `pending`, in order: whether it is an event (not a drop count).
    pending_lines: VecDeque<bool>,
    buffer_bytes: usize,
    counts: Arc<Counts>,
    path: PathBuf,
    /// The last write failed (its error was logged).
    failed: bool,
}

impl<W: Write> Writer<W> {
    /// Writes until the queue closes, flushing whenever it runs empty.
    fn run(mut self, lines: &Receiver<Message>) {
        loop {
            let message = match lines.try_recv() {
                Ok(message) => message,
                Err(TryRecvError::Empty) => {
                    self.report_dropped();
                    self.flush();
                    match lines.recv() {
                        Ok(message) => message,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            match message {
                Message::Call(call) => {
                    let (call, end, time) = &*call;
                    self.event(&CallLine {
                        event: "tool_call",
                        time: *time,
                        call,
                        end,
                    });
                }
                Message::Denial(denial) => self.event(&DenialLine {
                    event: "policy_denied",
                    time: denial.at,
                    denial: &denial,
                }),
                Message::Decision(decision) => self.event(&DecisionLine {
                    event: "approval_decided",
                    time: decision.at,
                    decision: &decision,
                }),
                Message::Pins(pins) => self.event(&PinsLine {
                    event: "pins_changed",
                    time: pins.at,
                    pins: &pins,
                }),
                Message::Input(round) => self.event(&InputLine {
                    event: "input_round",
                    time: round.at,
                    round: &round,
                }),
                Message::TaskStatus(status) => self.event(&TaskStatusLine {
                    event: "mcp_task_status",
                    time: status.at,
                    status: &status,
                }),
                Message::Sampling(sampling) => self.event(&SamplingLine {
                    event: "sampling",
                    time: sampling.at,
                    sampling: &sampling,
                }),
                Message::Flush(done) => {
                    self.report_dropped();
                    self.flush();
                    let _ = done.send(());
                }
            }
        }
        self.report_dropped();
        self.flush();
    }

    /// One event's line; dropped and counted if it cannot be held.
    fn event(&mut self, line: &impl Serialize) {
        if !self.push(line, true) {
            self.counts.unwritten.fetch_sub(1, Ordering::Relaxed);
            self.counts.drop_one();
        }
    }

    /// Adds `line` to what is pending, writing out first if the buffer is full. Returns
    /// false if it could not: the file refuses writes and the buffer is full.
    fn push(&mut self, line: &impl Serialize, is_event: bool) -> bool {
        let mut bytes = match serde_json::to_vec(line) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an audit line");
                return false;
            }
        };
        bytes.push(b'\n');
        if self.pending.len().saturating_add(bytes.len()) > self.buffer_bytes {
            self.flush();
            // An empty buffer takes any one line, so a long line is never refused for
            // its size alone.
            if !self.pending.is_empty()
                && self.pending.len().saturating_add(bytes.len()) > self.buffer_bytes
            {
                return false;
            }
        }
        self.pending.extend_from_slice(&bytes);
        self.pending_lines.push_back(is_event);
        true
    }

    /// One `audit_dropped` line for the events dropped since the last.
    fn report_dropped(&mut self) {
        let count = self.counts.pending_drops.swap(0, Ordering::Relaxed);
        if count == 0 {
            return;
        }
        let line = DroppedLine {
            event: "audit_dropped",
            count,
        };
        if !self.push(&line, false) {
            // Reported with the next count instead.
            self.counts
                .pending_drops
                .fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Writes out as much of `pending` as the file takes: until done, or until writes fail
    /// twice in a row (one failure may be a hiccup; a full disk fails again at once).
    fn flush(&mut self) {
        let mut written = 0;
        let mut failed_once = false;
        let mut result = Ok(());
        while written < self.pending.len() {
            match self.out.write(&self.pending[written..]) {
                Ok(0) => {
                    result = Err(ErrorKind::WriteZero.into());
                    break;
                }
                Ok(n) => {
                    written += n;
                    failed_once = false;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) if !failed_once => failed_once = true,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let done_lines = self.pending[..written]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        self.pending.drain(..written);
        let events = self
            .pending_lines
            .drain(..done_lines.min(self.pending_lines.len()))
            .filter(|&is_event| is_event)
            .count();
        self.counts
            .unwritten
            .fetch_sub(events as u64, Ordering::Relaxed);
        let result = result.and_then(|()| self.out.flush());
        self.note(result);
    }

    /// Logs the first write error of a run of them (a full disk would repeat it per line).
    fn note(&mut self, result: std::io::Result<()>) {
        match result {
            Ok(()) if self.failed => {
                self.failed = false;
                tracing::info!(path = %self.path.display(), "audit log writable again");
            }
            Ok(()) => {}
            Err(e) if !self.failed => {
                self.failed = true;
                tracing::error!(path = %self.path.display(), error = %e, "cannot write the audit log");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Duration;

    use super::*;
    use crate::observe::{ArgumentsSummary, ToolKind, ToolOutcome, Via};

    fn call(i: usize) -> ToolCall {
        ToolCall {
            task_id: "flood".into(),
            principal: None,
            client: None,
            session_fd: Some(3),
            via: Via::McpCall,
            kind: ToolKind::Mcp {
                server_id: "s".into(),
            },
            tool: format!("{i:0>120}"),
            arguments: ArgumentsSummary::default(),
            argument_values: None,
            started_at: SystemTime::now(),
        }
    }

    /// A successful call's end, the same for every event a test offers.
    const OK_END: ToolCallEnd = ToolCallEnd {
        outcome: ToolOutcome::Ok,
        duration: Duration::from_millis(1),
        output_bytes: 2,
    };

    /// A fresh fifo in `dir`, and its read end opened (not read) first so that the log's
    /// open for writing does not wait for a reader.
    fn unread_fifo(dir: &Path) -> (PathBuf, std::fs::File) {
        std::fs::create_dir_all(dir).unwrap();
        let fifo = dir.join("audit.fifo");
        let _ = std::fs::remove_file(&fifo);
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        (fifo, reader)
    }

    /// Everything written to the non-blocking `reader` until the last writer closes it.
    fn read_until_closed(mut reader: std::fs::File) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let mut buf = [0u8; 65536];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return String::from_utf8(text).unwrap(),
                    Ok(n) => text.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
    }

    /// The `tool_call` lines in `text`, and the events its `audit_dropped` lines count;
    /// every line must be whole JSON.
    fn written_and_dropped(text: &str) -> (u64, u64) {
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let written = lines.iter().filter(|l| l["event"] == "tool_call").count() as u64;
        let counted = lines
            .iter()
            .filter(|l| l["event"] == "audit_dropped")
            .map(|l| l["count"].as_u64().unwrap())
            .sum();
        (written, counted)
    }

    /// A writer stuck on a pipe nobody reads: offering never blocks, the overflow is
    /// counted, and once the pipe is read every event is either a line or in a count.
    #[test]
    fn a_stuck_writer_drops_and_counts_instead_of_blocking() {
        let dir = std::env::temp_dir().join(format!("quiver-audit-{}", std::process::id()));
        let (fifo, reader) = unread_fifo(&dir);
        let tuning = Tuning {
            queue_capacity: 4,
            ..Tuning::default()
        };
        let log = AuditLog::open_tuned(&fifo, tuning).unwrap();
        const EVENTS: u64 = 2000;
        for i in 0..EVENTS {
            log.after_tool_call(&call(i as usize), &OK_END);
        }
        assert!(
            log.dropped() > 0,
            "a 64 KiB pipe cannot hold {EVENTS} lines"
        );
        let dropped = log.dropped();
        let reading = read_until_closed(reader);
        assert!(log.flush(), "the flush finishes once the pipe is read");
        drop(log);
        let text = reading.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (written, counted) = written_and_dropped(&text);
        assert_eq!(counted, dropped);
        assert_eq!(written + counted, EVENTS);
    }

    /// A file that takes at most 37 bytes a write, fails every fifth write, and fails
    /// every write once `budget` bytes are in.
    struct Flaky {
        out: Arc<Mutex<Vec<u8>>>,
        budget: Arc<AtomicU64>,
        calls: u64,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.calls += 1;
            let mut out = self.out.lock().unwrap();
            let left = self
                .budget
                .load(Ordering::SeqCst)
                .saturating_sub(out.len() as u64);
            if self.calls.is_multiple_of(5) || left == 0 {
                return Err(std::io::Error::other("no space left"));
            }
            let n = buf.len().min(37).min(left as usize);
            out.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Short writes, failing writes, and a file full in the middle of a line: every line
    /// in the file is whole JSON, and every event is either a line or in a drop count.
    #[test]
    fn a_failing_file_never_glues_lines_and_counts_what_it_drops() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let budget = Arc::new(AtomicU64::new(1000));
        let file = Flaky {
            out: out.clone(),
            budget: budget.clone(),
            calls: 0,
        };
        let tuning = Tuning {
            buffer_bytes: 2048,
            ..Tuning::default()
        };
        let log = AuditLog::start(file, Path::new("flaky"), tuning).unwrap();
        for i in 0..100 {
            log.after_tool_call(&call(i), &OK_END);
        }
        assert!(log.flush());
        assert!(
            log.dropped() > 0,
            "a full file and a 2 KiB buffer cannot hold 100 lines"
        );
        budget.store(u64::MAX, Ordering::SeqCst);
        for i in 100..150 {
            log.after_tool_call(&call(i), &OK_END);
        }
        let dropped = log.dropped();
        assert_eq!(log.close(), None, "the writer finishes");
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let (written, counted) = written_and_dropped(&text);
        assert_eq!(counted, dropped);
        assert_eq!(written + counted, 150);
        assert_eq!(log.counts.unwritten.load(Ordering::Relaxed), 0);
    }

    /// A pipe nobody reads: closing the log gives up after the flush timeout and says how
    /// many events it leaves unwritten, rather than blocking forever.
    #[test]
    fn closing_a_log_stuck_on_a_pipe_gives_up_after_the_timeout() {
        let dir = std::env::temp_dir().join(format!("quiver-audit-stuck-{}", std::process::id()));
        let (fifo, reader) = unread_fifo(&dir);
        let tuning = Tuning {
            flush_timeout: Duration::from_millis(200),
            ..Tuning::default()
        };
        let log = AuditLog::open_tuned(&fifo, tuning).unwrap();
        // About 300 bytes a line: far more than a 64 KiB pipe holds.
        const EVENTS: u64 = 1000;
        for i in 0..EVENTS {
            log.after_tool_call(&call(i as usize), &OK_END);
        }
        let started = std::time::Instant::now();
        let unwritten = log.close().expect("the writer cannot finish");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(
            unwritten > 0 && unwritten + log.dropped() <= EVENTS,
            "{unwritten} unwritten, {} dropped",
            log.dropped()
        );
        drop(log);
        // The writer left behind ends on the broken pipe.
        drop(reader);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
