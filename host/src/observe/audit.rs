//! The audit log: one JSON line per finished tool call and per policy denial, saying who
//! called what, how it ended and with what shape of arguments.
//!
//! Observers run on the task's path, so the log never writes there: each event is queued
//! (bounded, [`defaults::AUDIT_QUEUE_CAPACITY`]) for a writer thread. A queue that is full
//! because the disk is slow drops the event and counts it; the writer reports the count as
//! one `{"event":"audit_dropped","count":N}` line as soon as it gets to write again, so a
//! gap is never silent. [`AuditLog::flush`] (called by [`Host::shutdown`](crate::Host::shutdown))
//! and dropping the log write out everything queued.
//!
//! Lines hold what the events hold: argument keys and sizes, and argument values only for
//! servers whose record sets `audit_arguments` (already redacted and capped when the event
//! was made, see [`super::ToolCall::argument_values`]).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use serde::Serialize;

use super::{PolicyDenial, ToolCall, ToolCallEnd, ToolObserver};
use crate::defaults;

/// A [`ToolObserver`] that appends one JSON line per tool call end and per policy denial
/// to a file.
pub struct AuditLog {
    path: PathBuf,
    queue: Mutex<Option<SyncSender<Message>>>,
    /// Drops the writer has not reported yet.
    pending_drops: Arc<AtomicU64>,
    dropped: AtomicU64,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuditLog({})", self.path.display())
    }
}

enum Message {
    Call(Box<(ToolCall, ToolCallEnd, SystemTime)>),
    Denial(Box<PolicyDenial>),
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
struct DroppedLine {
    event: &'static str,
    count: u64,
}

impl AuditLog {
    /// Opens `path` for appending (created with mode 0600) and starts its writer thread.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        Self::open_bounded(path.as_ref(), defaults::AUDIT_QUEUE_CAPACITY)
    }

    fn open_bounded(path: &Path, capacity: usize) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?;
        let (queue, lines) = sync_channel(capacity);
        let pending_drops = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            out: BufWriter::new(file),
            dropped: pending_drops.clone(),
            path: path.to_owned(),
        };
        let thread = std::thread::Builder::new()
            .name("quiver-audit".into())
            .spawn(move || writer.run(&lines))?;
        Ok(Self {
            path: path.to_owned(),
            queue: Mutex::new(Some(queue)),
            pending_drops,
            dropped: AtomicU64::new(0),
            writer: Mutex::new(Some(thread)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events dropped so far because the queue was full (also written to the log).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn sender(&self) -> Option<SyncSender<Message>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues without waiting; a full queue drops the event and counts it.
    fn offer(&self, message: Message) {
        let Some(queue) = self.sender() else {
            return;
        };
        if let Err(TrySendError::Full(_)) = queue.try_send(message) {
            self.pending_drops.fetch_add(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
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
        let deadline = std::time::Instant::now() + defaults::AUDIT_FLUSH_TIMEOUT;
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
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        answer.recv_timeout(left).is_ok()
    }
}

impl Drop for AuditLog {
    /// Closes the queue and waits for the writer to write out what it holds.
    fn drop(&mut self) {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "the audit log writer panicked");
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
}

struct Writer {
    out: BufWriter<File>,
    dropped: Arc<AtomicU64>,
    path: PathBuf,
}

impl Writer {
    /// Writes until the queue closes, flushing whenever it runs empty.
    fn run(mut self, lines: &Receiver<Message>) {
        let mut failed = false;
        loop {
            let message = match lines.try_recv() {
                Ok(message) => message,
                Err(TryRecvError::Empty) => {
                    self.report_dropped(&mut failed);
                    self.flush(&mut failed);
                    match lines.recv() {
                        Ok(message) => message,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            let written = match message {
                Message::Call(call) => {
                    let (call, end, time) = &*call;
                    self.line(&CallLine {
                        event: "tool_call",
                        time: *time,
                        call,
                        end,
                    })
                }
                Message::Denial(denial) => self.line(&DenialLine {
                    event: "policy_denied",
                    time: denial.at,
                    denial: &denial,
                }),
                Message::Flush(done) => {
                    self.report_dropped(&mut failed);
                    self.flush(&mut failed);
                    let _ = done.send(());
                    Ok(())
                }
            };
            self.note(written, &mut failed);
        }
        self.report_dropped(&mut failed);
        self.flush(&mut failed);
    }

    fn line(&mut self, line: &impl Serialize) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.out.write_all(b"\n")
    }

    /// One `audit_dropped` line for the events dropped since the last.
    fn report_dropped(&mut self, failed: &mut bool) {
        let count = self.dropped.swap(0, Ordering::Relaxed);
        if count > 0 {
            let written = self.line(&DroppedLine {
                event: "audit_dropped",
                count,
            });
            self.note(written, failed);
        }
    }

    fn flush(&mut self, failed: &mut bool) {
        let flushed = self.out.flush();
        self.note(flushed, failed);
    }

    /// Logs the first write error of a run of them (a full disk would repeat it per line).
    fn note(&self, result: std::io::Result<()>, failed: &mut bool) {
        match result {
            Ok(()) if *failed => {
                *failed = false;
                tracing::info!(path = %self.path.display(), "audit log writable again");
            }
            Ok(()) => {}
            Err(e) if !*failed => {
                *failed = true;
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
            session_fd: 3,
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

    /// A writer stuck on a pipe nobody reads: offering never blocks, the overflow is
    /// counted, and once the pipe is read every event is either a line or in a count.
    #[test]
    fn a_stuck_writer_drops_and_counts_instead_of_blocking() {
        let dir = std::env::temp_dir().join(format!("quiver-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("audit.fifo");
        let _ = std::fs::remove_file(&fifo);
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let mut reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let log = AuditLog::open_bounded(&fifo, 4).unwrap();
        let end = ToolCallEnd {
            outcome: ToolOutcome::Ok,
            duration: Duration::from_millis(1),
            output_bytes: 2,
        };
        const EVENTS: u64 = 2000;
        for i in 0..EVENTS {
            log.after_tool_call(&call(i as usize), &end);
        }
        assert!(
            log.dropped() > 0,
            "a 64 KiB pipe cannot hold {EVENTS} lines"
        );
        let dropped = log.dropped();
        let reading = std::thread::spawn(move || {
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
        });
        assert!(log.flush(), "the flush finishes once the pipe is read");
        drop(log);
        let text = reading.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let written = lines.iter().filter(|l| l["event"] == "tool_call").count() as u64;
        let counted: u64 = lines
            .iter()
            .filter(|l| l["event"] == "audit_dropped")
            .map(|l| l["count"].as_u64().unwrap())
            .sum();
        assert_eq!(counted, dropped);
        assert_eq!(written + counted, EVENTS);
    }
}
