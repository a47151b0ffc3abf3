//! Requests a hostcall hands off the task's fiber, to be polled by the future that drives
//! the task.
//!
//! A task waiting in a hostcall keeps resident every page of its fiber stack that the
//! hostcall's polls touched. A request to an MCP server polls through the pool, rmcp and
//! tokio's channels, about 16 KiB of frames even with [`off_stack`]. Handed off, those
//! polls run in [`OffFiber::drive`], the future that runs the guest's call, on the stack of
//! the thread that polls the task (a worker's, or an embedder's `block_on` thread's),
//! which every task shares; the fiber keeps only the wait for the output.
//!
//! The work stays in the task: no tokio task per request, and no hop from one task to
//! another when the answer comes. A tokio task per request cost about 1.6 µs of CPU a
//! call and one more wake-up (BENCHMARKS.md, issue 25). Work whose wait is dropped (its
//! hostcall ended early) is dropped in the same poll, and the rest when the task's call
//! ends, before [`Runtime::run`](super::Runtime::run) returns.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use super::off_stack;
use crate::sync::lock;

/// A task's handed-off work: hostcalls add to it ([`Self::run`]), the future that runs the
/// guest polls it ([`Self::drive`]).
#[derive(Clone, Default)]
pub struct OffFiber {
    shared: Arc<Shared>,
}

/// Only the task's own polls touch these (its hostcalls run inside the driver's poll), one
/// thread at a time with tokio's hand-over between them: the flags need no ordering.
#[derive(Default)]
struct Shared {
    /// Whether a [`OffFiber::drive`] is running: without one, work runs inline.
    driven: AtomicBool,
    /// Work handed off since the driver last looked.
    incoming: Mutex<Vec<Entry>>,
    /// Whether `incoming` may hold any: most polls need not take the lock.
    handed_off: AtomicBool,
    /// Some wait was dropped before its work ended.
    abandoned: AtomicBool,
}

/// One piece of work, as the driver sees it.
type Entry = Arc<dyn Drivable>;

impl OffFiber {
    /// Hands the future `make` builds to the task's driver; awaiting the result waits for
    /// its output. The future is built and boxed by the driver, at its first poll, so its
    /// size never touches the fiber either. Dropping the result drops the work.
    ///
    /// Outside a [`Self::drive`] (a hostcall run some other way) the work runs inline, as
    /// [`off_stack`] does.
    pub fn run<M, F>(&self, make: M) -> HandedOff<F::Output>
    where
        M: FnOnce() -> F + Send + 'static,
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if !self.shared.driven.load(Ordering::Relaxed) {
            return HandedOff(Wait::Inline(off_stack(make)));
        }
        let work = Arc::new(Work {
            stage: Mutex::new(Stage::Make(make)),
            abandoned: AtomicBool::new(false),
        });
        lock(&self.shared.incoming).push(work.clone());
        self.shared.handed_off.store(true, Ordering::Relaxed);
        HandedOff(Wait::Driven {
            work,
            shared: self.shared.clone(),
        })
    }

    /// Runs `guest` (the task's call into its guest) and the work its hostcalls hand off,
    /// until `guest` ends; then drops the work still running.
    ///
    /// Each poll polls the work first, then `guest`; and again while `guest` hands off new
    /// work that ends at once. A wait is not woken by its work ending, since the work ends
    /// only here, right before `guest` is polled.
    pub fn drive<F: Future>(&self, guest: F) -> Drive<'_, F> {
        Drive {
            guest,
            running: Vec::new(),
            driving: Driving::start(&self.shared),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future [`OffFiber::drive`] returns. A struct, not an `async fn`: an `async fn`
    /// keeps its argument apart from its locals, which would hold the guest's call twice
    /// in every waiting task's future.
    pub struct Drive<'a, F> {
        // The first field dropped: a guest dropped mid-call is unwound on its fiber, and
        // the waits it drops there must not hold the work's last reference, or the work
        // would be dropped on the fiber's stack.
        #[pin]
        guest: F,
        running: Vec<Entry>,
        driving: Driving<'a>,
    }
}

impl<F: Future> Future for Drive<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let (shared, running, mut guest) = (this.driving.0, this.running, this.guest);
        let mut first = true;
        loop {
            let known = running.len();
            if take_flag(&shared.handed_off) {
                running.append(&mut lock(&shared.incoming));
            }
            // All the work on the first round; after that, only what `guest` just added.
            let ended = poll_from(running, if first { 0 } else { known }, cx);
            if !first && !ended {
                return Poll::Pending;
            }
            first = false;
            if let Poll::Ready(output) = guest.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
            if take_flag(&shared.abandoned) {
                running.retain(|entry| !entry.abandoned());
            }
            if !shared.handed_off.load(Ordering::Relaxed) {
                return Poll::Pending;
            }
        }
    }
}

/// Clears `flag`; whether it was set. A load first: most polls find it clear, and a load
/// costs less than a swap.
fn take_flag(flag: &AtomicBool) -> bool {
    let set = flag.load(Ordering::Relaxed);
    if set {
        flag.store(false, Ordering::Relaxed);
    }
    set
}

/// Polls `running[from..]`, removing what ended or was abandoned; whether any ended.
fn poll_from(running: &mut Vec<Entry>, from: usize, cx: &mut Context<'_>) -> bool {
    let mut ended = false;
    let mut i = from;
    while i < running.len() {
        let entry = &running[i];
        if entry.abandoned() {
            running.swap_remove(i);
        } else if entry.poll(cx).is_ready() {
            running.swap_remove(i);
            ended = true;
        } else {
            i += 1;
        }
    }
    ended
}

/// Marks a driver as running for as long as it lives.
struct Driving<'a>(&'a Shared);

impl<'a> Driving<'a> {
    fn start(shared: &'a Shared) -> Self {
        debug_assert!(
            !shared.driven.load(Ordering::Relaxed),
            "one driver at a time per task"
        );
        shared.driven.store(true, Ordering::Relaxed);
        Self(shared)
    }
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.0.driven.store(false, Ordering::Relaxed);
        if take_flag(&self.0.handed_off) {
            lock(&self.0.incoming).clear();
        }
    }
}

/// One piece of work and, once it ends, its output: a single allocation, as a tokio task's
/// cell keeps its future and then its output in one place. The future itself is boxed
/// apart, built by the driver.
struct Work<M, F: Future> {
    stage: Mutex<Stage<M, F>>,
    abandoned: AtomicBool,
}

enum Stage<M, F: Future> {
    Make(M),
    Running(Pin<Box<F>>),
    Done(F::Output),
    /// The work panicked: the wait goes on unwinding with it, as it would have inline, so
    /// the guest's call is unwound by wasmtime before the panic leaves the driver.
    Panicked(Box<dyn std::any::Any + Send>),
    Taken,
}

/// The driver's side of a [`Work`].
trait Drivable: Send + Sync {
    /// Polls the work; `Ready` once it has stored its output.
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()>;
    fn abandoned(&self) -> bool;
}

/// The wait's side of a [`Work`].
trait Outcome<T>: Send + Sync {
    /// The output once the work has ended; a panic of the work goes on here.
    fn take(&self) -> Option<T>;
    /// Marks the work abandoned unless it has ended; whether it had not.
    fn abandon(&self) -> bool;
}

impl<M, F> Drivable for Work<M, F>
where
    M: FnOnce() -> F + Send,
    F: Future + Send,
    F::Output: Send,
{
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut stage = lock(&self.stage);
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if matches!(*stage, Stage::Make(_))
                && let Stage::Make(make) = std::mem::replace(&mut *stage, Stage::Taken)
            {
                *stage = Stage::Running(Box::pin(make()));
            }
            let Stage::Running(running) = &mut *stage else {
                return Poll::Ready(());
            };
            let output = std::task::ready!(running.as_mut().poll(cx));
            // Drops the finished future in here too: its drop may panic as well.
            *stage = Stage::Done(output);
            Poll::Ready(())
        }));
        polled.unwrap_or_else(|panic| {
            *stage = Stage::Panicked(panic);
            Poll::Ready(())
        })
    }

    fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }
}

impl<M, F> Outcome<F::Output> for Work<M, F>
where
    M: Send,
    F: Future + Send,
    F::Output: Send,
{
    fn take(&self) -> Option<F::Output> {
        let mut stage = lock(&self.stage);
        if !matches!(*stage, Stage::Done(_) | Stage::Panicked(_)) {
            return None;
        }
        match std::mem::replace(&mut *stage, Stage::Taken) {
            Stage::Done(output) => Some(output),
            Stage::Panicked(panic) => {
                drop(stage);
                std::panic::resume_unwind(panic)
            }
            _ => None,
        }
    }

    fn abandon(&self) -> bool {
        let stage = lock(&self.stage);
        let running = matches!(*stage, Stage::Make(_) | Stage::Running(_));
        self.abandoned.store(running, Ordering::Relaxed);
        running
    }
}

/// Work handed off by [`OffFiber::run`]: its output. Only the guest's call, polled by
/// [`OffFiber::drive`], may await it: it is not woken when its work ends.
pub struct HandedOff<T>(Wait<T>);

enum Wait<T> {
    Driven {
        work: Arc<dyn Outcome<T>>,
        shared: Arc<Shared>,
    },
    Inline(Pin<Box<dyn Future<Output = T> + Send>>),
}

impl<T> Future for HandedOff<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Both variants are `Unpin` (two `Arc`s, a box).
        match &mut self.get_mut().0 {
            Wait::Inline(work) => work.as_mut().poll(cx),
            Wait::Driven { work, .. } => match work.take() {
                Some(output) => Poll::Ready(output),
                None => Poll::Pending,
            },
        }
    }
}

impl<T> Drop for HandedOff<T> {
    fn drop(&mut self) {
        if let Wait::Driven { work, shared } = &self.0
            && work.abandon()
        {
            shared.abandoned.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    thread_local! {
        /// Set while [`OnFiber`] polls its future: stands in for the fiber's stack.
        static ON_FIBER: Cell<bool> = const { Cell::new(false) };
    }

    fn on_fiber() -> bool {
        ON_FIBER.with(Cell::get)
    }

    /// Polls and drops `F` with [`ON_FIBER`] set, as wasmtime polls a hostcall on the
    /// task's fiber and unwinds a dropped call there.
    struct OnFiber<F>(Option<Pin<Box<F>>>);

    impl<F: Future> Future for OnFiber<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let future = self.0.as_mut().expect("polled after it ended");
            ON_FIBER.with(|flag| flag.set(true));
            let polled = future.as_mut().poll(cx);
            ON_FIBER.with(|flag| flag.set(false));
            polled
        }
    }

    impl<F> Drop for OnFiber<F> {
        fn drop(&mut self) {
            ON_FIBER.with(|flag| flag.set(true));
            self.0 = None;
            ON_FIBER.with(|flag| flag.set(false));
        }
    }

    fn guest<F: Future>(future: F) -> OnFiber<F> {
        OnFiber(Some(Box::pin(future)))
    }

    /// Records that it was dropped, and whether on the fiber.
    struct DroppedWhere(Arc<Mutex<Option<bool>>>);

    impl Drop for DroppedWhere {
        fn drop(&mut self) {
            *lock(&self.0) = Some(on_fiber());
        }
    }

    #[tokio::test]
    async fn driven_work_is_polled_off_the_fiber_in_the_same_task() {
        let off = OffFiber::default();
        let driving = tokio::spawn(async move {
            let work = off.clone();
            let ran = off.drive(guest(async move {
                assert!(on_fiber());
                let wait = work.run(|| async {
                    let built_on_fiber = on_fiber();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    (built_on_fiber, on_fiber(), tokio::task::id())
                });
                wait.await
            }));
            (ran.await, tokio::task::id())
        });
        let ((built_on_fiber, polled_on_fiber, work_task), task) = driving.await.unwrap();
        assert!(!built_on_fiber && !polled_on_fiber);
        assert_eq!(work_task, task, "no task of its own");
    }

    #[tokio::test]
    async fn without_a_driver_the_work_runs_inline() {
        let off = OffFiber::default();
        assert_eq!(off.run(|| async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn work_that_ends_at_once_and_many_pieces_at_a_time_all_end() {
        let off = OffFiber::default();
        let polls = Arc::new(AtomicUsize::new(0));
        let sum = off
            .drive(guest({
                let (off, polls) = (off.clone(), polls.clone());
                async move {
                    let mut sum = 0;
                    for i in 0..100u64 {
                        sum += off.run(move || async move { i }).await;
                    }
                    let waits: Vec<_> = (0..10u64)
                        .map(|i| {
                            off.run(move || async move {
                                tokio::time::sleep(Duration::from_millis(10 - i)).await;
                                i
                            })
                        })
                        .collect();
                    for wait in waits {
                        polls.fetch_add(1, Ordering::SeqCst);
                        sum += wait.await;
                    }
                    sum
                }
            }))
            .await;
        assert_eq!(sum, (0..100).sum::<u64>() + (0..10).sum::<u64>());
        assert_eq!(polls.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn dropping_the_wait_drops_the_work_in_the_same_poll() {
        let off = OffFiber::default();
        let dropped = Arc::new(Mutex::new(None));
        let seen = off
            .drive(guest({
                let (off, dropped) = (off.clone(), dropped.clone());
                async move {
                    let guard = DroppedWhere(dropped.clone());
                    let wait = off.run(move || async move {
                        let _guard = guard;
                        std::future::pending::<()>().await
                    });
                    // Let the driver start the work, then give up on it.
                    let started = tokio::time::timeout(Duration::from_millis(5), wait).await;
                    assert!(started.is_err());
                    let before = lock(&dropped).is_some();
                    tokio::task::yield_now().await;
                    (before, lock(&dropped).is_some())
                }
            }))
            .await;
        assert_eq!(seen, (false, true));
    }

    #[tokio::test]
    async fn dropping_the_driver_drops_the_work_still_running_off_the_fiber() {
        let off = OffFiber::default();
        let dropped = Arc::new(Mutex::new(None));
        let guard = DroppedWhere(dropped.clone());
        let waiting = off.drive(guest({
            let off = off.clone();
            async move {
                off.run(move || async move {
                    let _guard = guard;
                    std::future::pending::<()>().await
                })
                .await
            }
        }));
        let ended = tokio::time::timeout(Duration::from_millis(10), waiting).await;
        assert!(ended.is_err());
        assert_eq!(*lock(&dropped), Some(false), "dropped, and off the fiber");
        assert!(
            !off.shared.driven.load(Ordering::SeqCst),
            "no driver once it is dropped"
        );
    }

    #[tokio::test]
    async fn a_wait_dropped_before_the_driver_saw_its_work_never_starts_it() {
        let off = OffFiber::default();
        let built = Arc::new(AtomicBool::new(false));
        let after = off
            .drive(guest({
                let (off, built) = (off.clone(), built.clone());
                async move {
                    drop(off.run(move || {
                        built.store(true, Ordering::SeqCst);
                        async {}
                    }));
                    tokio::task::yield_now().await;
                    off.run(|| async { "the next one runs" }).await
                }
            }))
            .await;
        assert_eq!(after, "the next one runs");
        assert!(!built.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panic_while_building_the_work_goes_on_in_its_wait() {
        use futures::FutureExt;
        let off = OffFiber::default();
        let caught = off
            .drive(guest({
                let off = off.clone();
                async move {
                    let wait = off.run(|| -> std::future::Ready<()> { panic!("make's panic") });
                    AssertUnwindSafe(wait).catch_unwind().await
                }
            }))
            .await;
        let payload = caught.expect_err("the wait panics");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"make's panic"));
    }

    #[tokio::test]
    async fn a_panic_in_the_work_goes_on_in_its_wait() {
        use futures::FutureExt;
        let off = OffFiber::default();
        let driving = tokio::spawn(async move {
            let work = off.clone();
            off.drive(guest(async move {
                let wait = work.run(|| async { panic!("the work's own panic") });
                let caught = AssertUnwindSafe(wait).catch_unwind().await;
                (caught.expect_err("the wait panics"), on_fiber())
            }))
            .await
        });
        let (payload, on_fiber) = driving.await.unwrap();
        assert!(on_fiber, "where the guest would be unwound by wasmtime");
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"the work's own panic")
        );
    }
}
