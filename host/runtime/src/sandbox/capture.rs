//! Guest stdout and stderr kept in memory, for tasks that capture them, charged to the
//! task's memory budget as they grow.
//!
//! wasmtime-wasi's own memory pipe has a fixed capacity and traps the guest past it; this
//! one fails the write instead: once the budget is spent, `fd_write` on stdout or stderr
//! returns WASI's `ENOMEM` and the guest carries on.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::{Charge, MemoryBudget};

/// Guest stdout and stderr, when the task asked for capture.
pub struct CapturedOutput {
    stdout: CapturePipe,
    stderr: CapturePipe,
}

impl CapturedOutput {
    pub(super) fn new(budget: &MemoryBudget) -> Self {
        Self {
            stdout: CapturePipe::new(budget.empty("captured stdout")),
            stderr: CapturePipe::new(budget.empty("captured stderr")),
        }
    }

    /// The stdout and stderr pipes; clones share what they hold.
    pub(super) fn pipes(&self) -> (CapturePipe, CapturePipe) {
        (self.stdout.clone(), self.stderr.clone())
    }

    /// The stderr pipe, where the guest's `log` lines go too.
    pub(super) fn stderr(&self) -> CapturePipe {
        self.stderr.clone()
    }

    /// What the guest wrote, moved out (and given back to the budget).
    pub fn take(&self) -> (Vec<u8>, Vec<u8>) {
        (self.stdout.take(), self.stderr.take())
    }
}

/// One captured stream; clones share it.
#[derive(Clone)]
pub(super) struct CapturePipe {
    inner: Arc<Mutex<Kept>>,
}

struct Kept {
    bytes: Vec<u8>,
    /// The capacity of `bytes`.
    charge: Charge,
}

/// How much a write may offer at once; the budget (or the stderr queue) decides whether
/// it is taken.
pub(super) const WRITE_CHUNK: usize = 64 * 1024;

impl CapturePipe {
    fn new(charge: Charge) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Kept {
                bytes: Vec::new(),
                charge,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `data`, growing the buffer only as far as the budget allows.
    pub(super) fn append(&self, data: &[u8]) -> io::Result<()> {
        self.lock().extend(&[data])
    }

    /// Appends a whole `line` (ending in a newline) on a line of its own: a line the
    /// guest's writes left open is ended first. All or nothing, like [`Self::append`].
    pub(super) fn append_line(&self, line: &[u8]) -> io::Result<()> {
        let mut kept = self.lock();
        let open = kept.bytes.last().is_some_and(|&last| last != b'\n');
        let parts: &[&[u8]] = if open { &[b"\n", line] } else { &[line] };
        kept.extend(parts)
    }

    fn take(&self) -> Vec<u8> {
        let mut kept = self.lock();
        let bytes = std::mem::take(&mut kept.bytes);
        kept.charge.shrink(u64::MAX);
        bytes
    }
}

impl Kept {
    /// Appends `parts`, growing the buffer only as far as the budget allows.
    fn extend(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let Kept { bytes, charge } = self;
        let needed = parts
            .iter()
            .try_fold(bytes.len(), |total, part| total.checked_add(part.len()))
            .ok_or_else(out_of_budget)?;
        if needed > bytes.capacity() {
            let wanted = needed.max(bytes.capacity().saturating_mul(2));
            let granted = charge
                .resize_between(needed as u64, wanted as u64)
                .map_err(|_| out_of_budget())?;
            let capacity = usize::try_from(granted).map_err(|_| out_of_budget())?;
            bytes.reserve_exact(capacity - bytes.len());
        }
        for part in parts {
            bytes.extend_from_slice(part);
        }
        Ok(())
    }
}

/// What a write past the budget fails with; WASI reports it to the guest as `ENOMEM`.
fn out_of_budget() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOMEM)
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturePipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturePipe {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.append(&bytes)
            .map_err(|e| StreamError::LastOperationFailed(e.into()))
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_CHUNK)
    }
}

impl tokio::io::AsyncWrite for CapturePipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(self.append(buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CapturePipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturePipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_charged_and_refused_past_the_budget() {
        let budget = MemoryBudget::new(Arc::from("t"), 1000);
        let output = CapturedOutput::new(&budget);
        let (stdout, stderr) = output.pipes();
        stdout.append(&[b'a'; 300]).unwrap();
        stderr.append(&[b'b'; 300]).unwrap();
        let used = budget.used();
        assert!(used >= 600, "{used}");
        let error = stdout.append(&[b'c'; 500]).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOMEM));
        stdout.append(&[b'd'; 10]).unwrap();
        let (out, err) = output.take();
        assert_eq!(out.len(), 310);
        assert_eq!(err, vec![b'b'; 300]);
        assert_eq!(budget.used(), 0, "taking the output gives it back");
    }
}
