//! Work a task runs in the background: a nonblocking chat send, an MCP call in flight.
//!
//! Each piece is a tokio task owned by the fd that will hand back its answer
//! ([`Background`]): closing the fd, or the task ending (which drops its fd table), aborts
//! it. When the work ends it stores its answer, then signals the task's [`ReadySignal`], in
//! that order, so a `spear_epoll_wait` woken by the signal finds the answer on its rescan.
//!
//! Bounded per task: [`defaults::MAX_IN_FLIGHT`] pieces at once (one more is `-EAGAIN`),
//! each holding [`defaults::IN_FLIGHT_BYTES`] of the task's memory budget besides what its
//! own work charges. The slot and the charge belong to the [`Background`], not to the
//! tokio task, so closing the fd gives them back at once, not when the runtime gets round
//! to dropping the aborted task.
//!
//! What the aborted work itself holds (what its request charged, the request's
//! cancellation and its observers' event) goes when the runtime drops it. Every piece is
//! tracked, so the task's end waits for them ([`BackgroundWork::drained`]). Not tracked:
//! an answer to a server's own question (a 2025-protocol sampling or elicitation request)
//! runs in the connection's handler and stops when the request it came with ends, possibly
//! just after the task does.

use std::future::Future;
use std::sync::Arc;

use quiver_abi::Errno;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::{Charge, MemoryBudget, ReadySignal};
use crate::defaults;

/// A task's background work: its wake-up signal, its slots, and every tokio task it
/// started.
#[derive(Clone, Debug)]
pub struct BackgroundWork {
    signal: ReadySignal,
    slots: Arc<Semaphore>,
    started: TaskTracker,
}

impl Default for BackgroundWork {
    fn default() -> Self {
        Self {
            signal: ReadySignal::default(),
            slots: Arc::new(Semaphore::new(defaults::MAX_IN_FLIGHT)),
            started: TaskTracker::new(),
        }
    }
}

impl BackgroundWork {
    /// Waits, at most `within`, until every tokio task the work started has been dropped
    /// (once the task's fds are gone, each is aborted and goes at the runtime's next
    /// turn). `false` if some were still there.
    pub async fn drained(&self, within: std::time::Duration) -> bool {
        self.started.close();
        // Most tasks started none: no timer for them.
        self.started.is_empty()
            || tokio::time::timeout(within, self.started.wait())
                .await
                .is_ok()
    }

    /// The signal background work raises when it ends.
    pub fn signal(&self) -> &ReadySignal {
        &self.signal
    }

    /// Starts `work` on the runtime, charging `budget` for it while it runs. `-EAGAIN` when
    /// the task has [`defaults::MAX_IN_FLIGHT`] pieces running, `-ENOMEM` when the budget
    /// cannot hold another.
    pub fn spawn<T, F>(&self, budget: &MemoryBudget, work: F) -> Result<Background<T>, Errno>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Errno::EAGAIN)?;
        let charge = budget.charge("work in flight", defaults::IN_FLIGHT_BYTES)?;
        let (tx, rx) = oneshot::channel();
        let signal = self.signal.clone();
        let task = self.started.spawn(async move {
            let answer = work.await;
            // The answer first, then the signal: a woken wait must find it.
            let _ = tx.send(answer);
            signal.signal();
        });
        Ok(Background {
            state: State::Running {
                answer: rx,
                _task: AbortOnDropHandle::new(task),
            },
            _slot: (permit, charge),
        })
    }
}

enum State<T> {
    Running {
        answer: oneshot::Receiver<T>,
        _task: AbortOnDropHandle<()>,
    },
    Done(T),
    /// The work ended without an answer (it panicked); reads say `-EIO`.
    Lost,
    Taken,
}

/// One piece of background work, owned by its fd; dropping it aborts the work and gives
/// its slot back.
pub struct Background<T> {
    state: State<T>,
    _slot: (OwnedSemaphorePermit, Charge),
}

impl<T> Background<T> {
    /// Whether the work has ended (with an answer or not).
    pub fn is_done(&mut self) -> bool {
        if let State::Running { answer, .. } = &mut self.state {
            match answer.try_recv() {
                Ok(done) => self.state = State::Done(done),
                Err(oneshot::error::TryRecvError::Empty) => return false,
                Err(oneshot::error::TryRecvError::Closed) => self.state = State::Lost,
            }
        }
        true
    }

    /// The answer, once: `-EAGAIN` while the work runs, `-EIO` if it was lost, `-EBADF`
    /// once taken.
    pub fn take(&mut self) -> Result<T, Errno> {
        if !self.is_done() {
            return Err(Errno::EAGAIN);
        }
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Done(answer) => Ok(answer),
            State::Lost => Err(Errno::EIO),
            State::Running { .. } | State::Taken => Err(Errno::EBADF),
        }
    }
}
