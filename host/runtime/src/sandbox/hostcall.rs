//! How a hostcall ends: an errno the guest sees, or a trap that ends the task.
//!
//! Capabilities return `Result<i32, HostcallError>`; [`finish`] turns it into what
//! wasmtime expects. Keeping the two apart is what makes "bad arguments never trap" easy
//! to hold: only [`HostcallError::Trap`] can end a task, and only the deadline or a trap
//! inside a guest tool produces one.

use std::future::Future;
use std::pin::Pin;

use quiver_abi::Errno;

use super::Deadline;

/// Why a hostcall did not succeed.
#[derive(Debug)]
pub enum HostcallError {
    /// Returned to the guest as `-errno`.
    Errno(Errno),
    /// Ends the task.
    Trap(wasmtime::Error),
}

impl From<Errno> for HostcallError {
    fn from(errno: Errno) -> Self {
        Self::Errno(errno)
    }
}

/// Turns a hostcall's result into what wasmtime expects.
pub fn finish(result: Result<i32, HostcallError>) -> wasmtime::Result<i32> {
    match result {
        Ok(value) => Ok(value),
        Err(HostcallError::Errno(errno)) => Ok(errno.ret()),
        Err(HostcallError::Trap(error)) => Err(error),
    }
}

/// Runs `work` unless the task's deadline passes first; epochs stop guest code, this stops
/// a hostcall that is waiting on the outside world.
pub async fn before_deadline<F: Future>(
    deadline: Deadline,
    work: F,
) -> Result<F::Output, HostcallError> {
    tokio::time::timeout_at(deadline.instant(), work)
        .await
        .map_err(|_| HostcallError::Trap(wasmtime::Error::new(deadline.exceeded())))
}

/// A future boxed where `make` builds it, in a frame of its own, and polled through a
/// vtable.
///
/// The host code of an async hostcall runs on the task's fiber stack, where every page a
/// frame touches stays resident until the task ends, and stack probes touch every page of
/// a frame on entry. `Box::pin(f())` builds `f`'s whole future in the caller's frame
/// first, and a boxed future of a known type has its poll inlined into its caller's; on
/// the MCP call path that made 68 KiB of stack resident per waiting task (BENCHMARKS.md,
/// issue 25). Built here, a future's bytes are on the stack only while this call runs,
/// and each poll keeps a frame of its own size.
#[inline(never)]
pub fn off_stack<'a, F>(
    make: impl FnOnce() -> F,
) -> Pin<Box<dyn Future<Output = F::Output> + Send + 'a>>
where
    F: Future + Send + 'a,
{
    Box::pin(make())
}
