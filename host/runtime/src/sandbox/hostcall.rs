//! How a hostcall ends: an errno the guest sees, or a trap that ends the task.
//!
//! Capabilities return `Result<i32, HostcallError>`; [`finish`] turns it into what
//! wasmtime expects. Keeping the two apart is what makes "bad arguments never trap" easy
//! to hold: only [`HostcallError::Trap`] can end a task, and only the deadline or a trap
//! inside a guest tool produces one.

use std::future::Future;
use std::pin::Pin;

use quiver_abi::Errno;
use tokio_util::task::AbortOnDropHandle;

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

/// Runs the future `make` builds as a tokio task of its own and waits for it, so none of
/// its polls run on the task's fiber stack; dropping the wait aborts the work.
///
/// A task waiting in a hostcall keeps resident every page of its fiber stack that the
/// hostcall's polls touched. A request to an MCP server polls through the pool, rmcp and
/// tokio's channels, about 20 KiB of frames even with [`off_stack`]; spawned, they run on a
/// worker thread's stack, which every task shares, and the fiber keeps only the wait for
/// the join handle. The future is built and boxed on the worker too, so its size never
/// touches the fiber. The price is a spawn per request (BENCHMARKS.md, issue 25). `-EIO`
/// if the runtime shuts down under the work; a panic in it goes on unwinding here, as it
/// would have inline.
pub async fn off_fiber<M, F>(make: M) -> Result<F::Output, Errno>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let work = async move { Box::pin(make()).await };
    match AbortOnDropHandle::new(tokio::spawn(work)).await {
        Ok(output) => Ok(output),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => Err(Errno::EIO),
    }
}
