//! Where a guest's `log` lines go: its own output, not the host's log.
//!
//! Guest authors use `log` as `printf` (SPEAR's C header maps `printf` to it), so a line is
//! shown as written, one per call, with control characters made visible so a guest cannot
//! drive the terminal. With captured output it is appended to the task's captured stderr,
//! charged to the same budget as WASI writes. Otherwise it goes to the host's stderr through
//! one process-wide writer thread: a hostcall never waits on a slow or stuck stderr (it
//! cannot be interrupted at the task's deadline while blocked in a write), and lines are
//! dropped, and counted, once [`GUEST_STDERR_QUEUE_BYTES`](defaults::GUEST_STDERR_QUEUE_BYTES)
//! are waiting.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::capture::CapturePipe;
use crate::defaults;
use crate::registry::redact_known;

/// Where one task's `log` lines go (from [`GuestLogs`](crate::task::GuestLogs) and capture).
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
        match self {
            GuestLogSink::Stderr => {
                queue().push(printable(line));
                Ok(())
            }
            GuestLogSink::Captured(pipe) => pipe.append(&printable(line)),
            GuestLogSink::Tracing => Ok(()),
        }
    }
}

/// `line` as shown: one trailing line end dropped (the host ends every line), newlines and
/// tabs inside kept, every other control character escaped (`\x1b`, `\u{9b}`), and so are
/// the invisible characters that reorder or hide text on a terminal (`\u{202e}`).
pub(crate) fn printable(line: &str) -> Vec<u8> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut out = String::with_capacity(line.len().saturating_add(1));
    for c in line.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || reorders_text(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('\n');
    out.into_bytes()
}

/// Bidirectional overrides, isolates and marks, zero-width characters and the BOM: they
/// would let a guest make its line read differently from what it holds.
fn reorders_text(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}' | '\u{061c}')
}

/// Waits until the guest lines queued for the host's stderr so far are written, at most
/// `timeout`; false if some were not. `quiver run` calls it before it exits; a process
/// that lives on need not.
pub fn flush_guest_stderr(timeout: Duration) -> bool {
    let Some(queue) = QUEUE.get() else {
        return true;
    };
    let until = Instant::now() + timeout;
    let mut state = queue.lock();
    while state.busy() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || !state.writer_running {
            return false;
        }
        state = queue
            .drained
            .wait_timeout(state, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
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

/// Guest lines waiting for the host's stderr.
struct StderrQueue {
    state: Mutex<Queued>,
    /// Lines arrived (or a drop to report).
    ready: Condvar,
    /// The writer finished a batch.
    drained: Condvar,
}

#[derive(Default)]
struct Queued {
    lines: VecDeque<Vec<u8>>,
    /// Memory held by the lines queued or being written ([`queued_cost`]).
    bytes: usize,
    /// Lines dropped since the last report.
    dropped: u64,
    /// The writer holds a batch.
    writing: bool,
    writer_running: bool,
}

impl Queued {
    fn busy(&self) -> bool {
        self.writing || !self.lines.is_empty() || self.dropped > 0
    }
}

impl StderrQueue {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `line`, or counts it dropped when the queue is full or nothing writes it.
    fn push(&self, line: Vec<u8>) {
        let mut state = self.lock();
        let cost = queued_cost(&line);
        let fits = state
            .bytes
            .checked_add(cost)
            .is_some_and(|total| total <= defaults::GUEST_STDERR_QUEUE_BYTES);
        if fits && state.writer_running {
            state.bytes += cost;
            state.lines.push_back(line);
        } else {
            state.dropped = state.dropped.saturating_add(1);
        }
        drop(state);
        self.ready.notify_one();
    }
}

/// What a queued line holds in memory: its buffer and the queue's slot and allocation
/// around it, so a flood of empty lines is bounded like one of long lines.
fn queued_cost(line: &Vec<u8>) -> usize {
    const PER_LINE: usize = std::mem::size_of::<Vec<u8>>() + 32;
    line.capacity().saturating_add(PER_LINE)
}

/// The writer thread: takes every queued line at once and writes it out, then says so.
fn write_out(queue: &StderrQueue) {
    loop {
        let (lines, dropped) = {
            let mut state = queue.lock();
            while !state.busy() {
                state = queue.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            state.writing = true;
            (
                std::mem::take(&mut state.lines),
                std::mem::take(&mut state.dropped),
            )
        };
        let mut written = 0usize;
        let mut stderr = std::io::stderr().lock();
        for line in &lines {
            // A secret the process resolved stays out of its stderr, as in the host log.
            let text = String::from_utf8_lossy(line);
            // Nothing to do about a closed stderr but go on dropping.
            let _ = stderr.write_all(redact_known(&text).as_bytes());
            written += queued_cost(line);
        }
        if dropped > 0 {
            let _ = writeln!(
                stderr,
                "quiver: {dropped} guest log line(s) dropped: stderr did not keep up"
            );
        }
        let _ = stderr.flush();
        drop(stderr);
        let mut state = queue.lock();
        state.bytes = state.bytes.saturating_sub(written);
        state.writing = false;
        drop(state);
        queue.drained.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_empty_lines_is_bounded_by_memory_not_text() {
        let queue = StderrQueue {
            state: Mutex::new(Queued {
                writer_running: true,
                ..Queued::default()
            }),
            ready: Condvar::new(),
            drained: Condvar::new(),
        };
        // Nothing writes: the queue only fills.
        for _ in 0..1_000_000 {
            queue.push(b"\n".to_vec());
        }
        let state = queue.lock();
        assert!(state.bytes <= defaults::GUEST_STDERR_QUEUE_BYTES);
        let most = defaults::GUEST_STDERR_QUEUE_BYTES / std::mem::size_of::<Vec<u8>>();
        assert!(
            state.lines.len() < most,
            "{} lines queued",
            state.lines.len()
        );
        assert!(state.dropped > 0);
    }

    #[test]
    fn lines_are_shown_as_written_with_controls_made_visible() {
        let shown = |line: &str| String::from_utf8(printable(line)).unwrap();
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
}
