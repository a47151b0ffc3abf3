//! How a hostcall ends: an errno the guest sees, or a trap that ends the task.
//!
//! Capabilities return `Result<i32, HostcallError>`; [`finish`] turns it into what
//! wasmtime expects. Keeping the two apart is what makes "bad arguments never trap" easy
//! to hold: only [`HostcallError::Trap`] can end a task, and only the deadline or a trap
//! inside a guest tool produces one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use quiver_abi::Errno;
use tokio_util::task::AbortOnDropHandle;

use super::{BackgroundWork, Deadline};

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

/// Starts the future `make` builds as a tokio task of its own; awaiting the result waits
/// for its output. None of its polls run on the task's fiber stack, and dropping the
/// result aborts the work.
///
/// A task waiting in a hostcall keeps resident every page of its fiber stack that the
/// hostcall's polls touched. A request to an MCP server polls through the pool, rmcp and
/// tokio's channels, about 16 KiB of frames even with [`off_stack`]; spawned, they run on a
/// worker thread's stack, which every task shares, and the fiber keeps only the wait for
/// the join handle. The future is built and boxed on the worker too, so its size never
/// touches the fiber, and what `make` captures is moved to the heap once, not into every
/// future that waits on it.
///
/// Only from inside a tokio task (how `quiver serve`, `quiver run` and the scale runs start
/// tasks): there the spawned work goes to the same worker's next slot, and costs no thread
/// switch. A task an embedder drives with `block_on` would hand each request to a worker
/// thread and back; it runs the work inline, as [`off_stack`] does (BENCHMARKS.md, issue
/// 25).
///
/// The spawned work is one of the task's `work` ([`BackgroundWork`]): the task's end waits
/// until an aborted one has been dropped.
pub fn off_fiber<M, F>(work: &BackgroundWork, make: M) -> OffFiber<F::Output>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if tokio::task::try_id().is_none() {
        return OffFiber::Inline(off_stack(make));
    }
    OffFiber::Spawned(AbortOnDropHandle::new(
        work.track(async move { Box::pin(make()).await }),
    ))
}

/// Work started by [`off_fiber`]: its output, or `-EIO` if the runtime shut down under it.
/// A panic in the work goes on unwinding here, as it would have inline.
pub enum OffFiber<T> {
    Spawned(AbortOnDropHandle<T>),
    Inline(Pin<Box<dyn Future<Output = T> + Send>>),
}

impl<T> Future for OffFiber<T> {
    type Output = Result<T, Errno>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both variants are `Unpin` (a handle, a box).
        match self.get_mut() {
            OffFiber::Inline(work) => work.as_mut().poll(cx).map(Ok),
            OffFiber::Spawned(handle) => {
                Poll::Ready(match std::task::ready!(Pin::new(handle).poll(cx)) {
                    Ok(output) => Ok(output),
                    Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                    Err(_) => Err(Errno::EIO),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    /// Sets its flag when dropped.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn inside_a_task_the_work_is_a_task_of_its_own_and_outside_it_runs_inline() {
        let work = BackgroundWork::default();
        let outside = off_fiber(&work, || async { tokio::task::try_id() });
        assert!(matches!(outside, OffFiber::Inline(_)));
        assert_eq!(outside.await, Ok(None));
        let inside = tokio::spawn(async move {
            let waiter = tokio::task::id();
            let ran_in = off_fiber(&work, || async {
                tokio::task::yield_now().await;
                tokio::task::id()
            });
            assert!(matches!(ran_in, OffFiber::Spawned(_)));
            (waiter, ran_in.await.unwrap())
        });
        let (waiter, worker) = inside.await.unwrap();
        assert_ne!(waiter, worker);
    }

    #[tokio::test]
    #[expect(
        clippy::async_yields_async,
        reason = "the work is started inside a task and dropped outside it"
    )]
    async fn dropping_the_wait_aborts_the_work_and_the_task_end_waits_until_it_is_gone() {
        let work = BackgroundWork::default();
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let started = tokio::spawn({
            let work = work.clone();
            async move {
                off_fiber(&work, move || async move {
                    let _guard = guard;
                    std::future::pending::<()>().await
                })
            }
        });
        let wait = started.await.unwrap();
        assert!(
            !work.drained(Duration::from_millis(10)).await,
            "the work runs while awaited"
        );
        assert!(!dropped.load(Ordering::SeqCst));
        drop(wait);
        assert!(work.drained(Duration::from_secs(5)).await);
        assert!(
            dropped.load(Ordering::SeqCst),
            "drained means the work was dropped"
        );
    }

    #[tokio::test]
    async fn a_panic_in_the_work_goes_on_in_the_waiter() {
        let waiter = tokio::spawn(async {
            let work = off_fiber(&BackgroundWork::default(), || async {
                panic!("the work's own panic")
            });
            assert!(matches!(work, OffFiber::Spawned(_)));
            let _ = work.await;
        });
        let error = waiter.await.expect_err("the waiter panics too");
        let payload = error.into_panic();
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"the work's own panic")
        );
    }
}
