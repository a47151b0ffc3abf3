//! Admission control: how many tasks run at once, and how the rest wait.
//!
//! Each running task holds one of the engine's pooled slots (instance, linear memory, table,
//! fiber stack), so a host can only run as many tasks as it has slots. Without this gate the
//! task after the last slot failed inside wasmtime. Now tasks beyond the capacity wait in a
//! bounded FIFO queue (tokio's semaphore is fair), and a caller hears that the host is busy
//! only when the queue is full or its wait runs out. A task's deadline starts when it gets
//! its slot; its wait in the queue has its own bound, the shorter of the queue timeout and
//! the task's `limits.deadline_ms`. Counts are atomics, so [`Admission::status`] is cheap.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The task side of the host's status: capacity and what uses it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TaskStatus {
    /// Tasks that may run at once.
    pub capacity: u32,
    /// Tasks running now (each holds a slot from admission until it ends).
    pub running: u32,
    /// Tasks waiting for a slot.
    pub queued: u32,
    /// Tasks that may wait; one more is refused with `HostError::Busy`.
    pub queue_capacity: u32,
    /// Longest wait in the queue, in milliseconds.
    pub queue_timeout_ms: u64,
}

/// Why a task was refused instead of run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyReason {
    /// Every slot was taken and the queue was full.
    QueueFull,
    /// No slot freed up within the queue timeout, `after`.
    QueueTimeout { after: Duration },
    /// No slot freed up within the task's own deadline, `after`, which also bounds its wait.
    DeadlineInQueue { after: Duration },
}

impl std::fmt::Display for BusyReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusyReason::QueueFull => write!(f, "every running slot is taken and the queue is full"),
            BusyReason::QueueTimeout { after } => write!(
                f,
                "no running slot freed up within the queue timeout of {} ms",
                after.as_millis()
            ),
            BusyReason::DeadlineInQueue { after } => write!(
                f,
                "no running slot freed up within the task's limits.deadline_ms of {} ms, which also bounds its wait in the queue",
                after.as_millis()
            ),
        }
    }
}

impl BusyReason {
    /// What raises the limit that was hit.
    pub fn fix(&self) -> &'static str {
        match self {
            BusyReason::QueueFull => {
                "raise HostBuilder::with_max_concurrent_tasks or with_task_queue_capacity ([tasks] max_concurrent or queue_capacity in quiver.toml), or retry later"
            }
            BusyReason::QueueTimeout { .. } => {
                "raise HostBuilder::with_task_queue_timeout or with_max_concurrent_tasks ([tasks] queue_timeout_ms or max_concurrent in quiver.toml), or retry later"
            }
            BusyReason::DeadlineInQueue { .. } => {
                "raise the task's limits.deadline_ms or HostBuilder::with_max_concurrent_tasks ([tasks] max_concurrent in quiver.toml), or retry later"
            }
        }
    }
}

/// The running slots and the queue in front of them.
pub(super) struct Admission {
    slots: Semaphore,
    capacity: u32,
    queue_capacity: u32,
    queue_timeout: Duration,
    queued: AtomicU32,
}

/// A place in the queue; given back when dropped, also when the waiting caller is cancelled.
struct QueuePlace<'a>(&'a AtomicU32);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub(super) fn new(capacity: u32, queue_capacity: u32, queue_timeout: Duration) -> Self {
        let capacity = capacity.max(1);
        Self {
            // Never above tokio's limit (it panics there); the engine cannot reserve that
            // many slots anyway and says so.
            slots: Semaphore::new(
                usize::try_from(capacity)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            ),
            capacity,
            queue_capacity,
            queue_timeout,
            queued: AtomicU32::new(0),
        }
    }

    /// Waits for a running slot, at most the queue timeout and at most `deadline`; the slot
    /// is held until the permit is dropped.
    pub(super) async fn admit(
        &self,
        deadline: Duration,
    ) -> Result<SemaphorePermit<'_>, BusyReason> {
        if let Ok(slot) = self.slots.try_acquire() {
            return Ok(slot);
        }
        let _place = self.queue_place().ok_or(BusyReason::QueueFull)?;
        let (bound, refusal) = if deadline < self.queue_timeout {
            (deadline, BusyReason::DeadlineInQueue { after: deadline })
        } else {
            let after = self.queue_timeout;
            (after, BusyReason::QueueTimeout { after })
        };
        match tokio::time::timeout(bound, self.slots.acquire()).await {
            Ok(Ok(slot)) => Ok(slot),
            // The semaphore is never closed; a wait that ends without a slot timed out.
            Ok(Err(_)) | Err(_) => Err(refusal),
        }
    }

    /// Takes a place in the queue if one is free.
    fn queue_place(&self) -> Option<QueuePlace<'_>> {
        self.queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
                (queued < self.queue_capacity).then_some(queued + 1)
            })
            .ok()
            .map(|_| QueuePlace(&self.queued))
    }

    pub(super) fn status(&self) -> TaskStatus {
        let free = u32::try_from(self.slots.available_permits()).unwrap_or(u32::MAX);
        TaskStatus {
            capacity: self.capacity,
            running: self.capacity.saturating_sub(free),
            queued: self.queued.load(Ordering::SeqCst),
            queue_capacity: self.queue_capacity,
            queue_timeout_ms: u64::try_from(self.queue_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holding slots and queue places is visible in the status, and dropping a waiter (a
    /// cancelled caller) gives its place back at once.
    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_back() {
        let admission = Admission::new(1, 1, Duration::from_secs(60));
        let slot = admission.admit(Duration::from_secs(60)).await.unwrap();
        let mut waiter = Box::pin(admission.admit(Duration::from_secs(60)));
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        let status = admission.status();
        assert_eq!((status.running, status.queued), (1, 1));
        assert_eq!(
            admission.admit(Duration::from_secs(60)).await.unwrap_err(),
            BusyReason::QueueFull
        );
        drop(waiter);
        assert_eq!(admission.status().queued, 0);
        drop(slot);
        let status = admission.status();
        assert_eq!((status.running, status.queued), (0, 0));
    }

    /// The wait is bounded by the shorter of the queue timeout and the task's deadline, and
    /// the refusal says which one ran out.
    #[tokio::test]
    async fn the_shorter_of_queue_timeout_and_deadline_bounds_the_wait() {
        let queue_timeout = Duration::from_millis(50);
        let admission = Admission::new(1, 4, queue_timeout);
        let _slot = admission.admit(Duration::from_secs(60)).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            admission.admit(Duration::from_secs(60)).await.unwrap_err(),
            BusyReason::QueueTimeout {
                after: queue_timeout
            }
        );
        assert!(started.elapsed() >= queue_timeout);
        let deadline = Duration::from_millis(20);
        assert_eq!(
            admission.admit(deadline).await.unwrap_err(),
            BusyReason::DeadlineInQueue { after: deadline }
        );
        assert_eq!(admission.status().queued, 0);
    }
}
