//! Admission control: how many tasks run at once, and how the rest wait.
//!
//! Each running task holds one of the engine's pooled slots (instance, linear memory, table,
//! fiber stack), so a host can only run as many tasks as it has slots. Without this gate the
//! task after the last slot failed inside wasmtime. Now tasks beyond the capacity wait in a
//! bounded FIFO queue (tokio's semaphore is fair), and a caller hears that the host is busy
//! only when the queue is full or its wait runs out. A task's deadline starts when it gets
//! its slot; its wait in the queue has its own bound, the shorter of the queue timeout and
//! the task's `limits.deadline_ms`. Counts are atomics, so [`Admission::status`] is cheap.
//!
//! A slot is not all a task needs: it also reserves its module's initial linear memory from
//! the host's total of guest memory ([`GuestMemoryTotal`], whose module doc says why that
//! and not the task's maximum), and waits in the same queue, within the same bound, until
//! running tasks leave room for it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::sandbox::{GuestMemoryHold, GuestMemoryTotal};

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
    /// Running tasks left no room in the host's total of guest linear memory for the
    /// module's initial memory (`needed` bytes) within `after`.
    GuestMemory {
        after: Duration,
        needed: u64,
        limit: u64,
    },
    /// The module's initial linear memory (`needed` bytes) is more than the host's whole
    /// total: it can never run here.
    GuestMemoryTooSmall { needed: u64, limit: u64 },
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
            BusyReason::GuestMemory {
                after,
                needed,
                limit,
            } => write!(
                f,
                "running tasks left no room for the module's {needed} bytes of initial linear memory in the host's total of {limit} bytes within {} ms",
                after.as_millis()
            ),
            BusyReason::GuestMemoryTooSmall { needed, limit } => write!(
                f,
                "the module's {needed} bytes of initial linear memory are more than the host's whole total of {limit} bytes of guest memory"
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
            BusyReason::GuestMemory { .. } => {
                "raise HostBuilder::with_guest_memory_total ([tasks] guest_memory_total_bytes in quiver.toml), or retry later"
            }
            BusyReason::GuestMemoryTooSmall { .. } => {
                "raise HostBuilder::with_guest_memory_total ([tasks] guest_memory_total_bytes in quiver.toml), or shrink the module's initial memory"
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
    guest_memory: GuestMemoryTotal,
}

/// What a running task holds: its slot and its share of guest memory.
#[derive(Debug)]
pub(super) struct Admitted<'a> {
    pub(super) _slot: SemaphorePermit<'a>,
    pub(super) guest_memory: GuestMemoryHold,
}

/// A place in the queue; given back when dropped, also when the waiting caller is cancelled.
struct QueuePlace<'a>(&'a AtomicU32);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub(super) fn new(
        capacity: u32,
        queue_capacity: u32,
        queue_timeout: Duration,
        guest_memory: GuestMemoryTotal,
    ) -> Self {
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
            guest_memory,
        }
    }

    pub(super) fn guest_memory(&self) -> &GuestMemoryTotal {
        &self.guest_memory
    }

    /// Waits for a running slot and `memory` bytes of guest memory, at most the queue
    /// timeout and at most `deadline`; both are held until the [`Admitted`] is dropped.
    pub(super) async fn admit(
        &self,
        deadline: Duration,
        memory: u64,
    ) -> Result<Admitted<'_>, BusyReason> {
        let limit = self.guest_memory.limit_bytes();
        if !self.guest_memory.fits(memory) {
            return Err(BusyReason::GuestMemoryTooSmall {
                needed: memory,
                limit,
            });
        }
        if let Ok(slot) = self.slots.try_acquire()
            && let Some(guest_memory) = self.guest_memory.try_reserve(memory)
        {
            return Ok(Admitted {
                _slot: slot,
                guest_memory,
            });
        }
        let _place = self.queue_place().ok_or(BusyReason::QueueFull)?;
        let (bound, refusal) = if deadline < self.queue_timeout {
            (deadline, BusyReason::DeadlineInQueue { after: deadline })
        } else {
            let after = self.queue_timeout;
            (after, BusyReason::QueueTimeout { after })
        };
        let has_slot = AtomicBool::new(false);
        let wait = async {
            // The semaphore is never closed.
            let slot = self.slots.acquire().await.ok()?;
            has_slot.store(true, Ordering::SeqCst);
            let guest_memory = self.guest_memory.reserve(memory).await;
            Some(Admitted {
                _slot: slot,
                guest_memory,
            })
        };
        match tokio::time::timeout(bound, wait).await {
            Ok(Some(admitted)) => Ok(admitted),
            _ if has_slot.load(Ordering::SeqCst) => Err(BusyReason::GuestMemory {
                after: bound,
                needed: memory,
                limit,
            }),
            _ => Err(refusal),
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

    fn unbounded() -> GuestMemoryTotal {
        GuestMemoryTotal::new(u64::MAX)
    }

    /// Holding slots and queue places is visible in the status, and dropping a waiter (a
    /// cancelled caller) gives its place back at once.
    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_back() {
        let admission = Admission::new(1, 1, Duration::from_secs(60), unbounded());
        let slot = admission.admit(Duration::from_secs(60), 0).await.unwrap();
        let mut waiter = Box::pin(admission.admit(Duration::from_secs(60), 0));
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        let status = admission.status();
        assert_eq!((status.running, status.queued), (1, 1));
        assert_eq!(
            admission
                .admit(Duration::from_secs(60), 0)
                .await
                .unwrap_err(),
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
        let admission = Admission::new(1, 4, queue_timeout, unbounded());
        let _slot = admission.admit(Duration::from_secs(60), 0).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            admission
                .admit(Duration::from_secs(60), 0)
                .await
                .unwrap_err(),
            BusyReason::QueueTimeout {
                after: queue_timeout
            }
        );
        assert!(started.elapsed() >= queue_timeout);
        let deadline = Duration::from_millis(20);
        assert_eq!(
            admission.admit(deadline, 0).await.unwrap_err(),
            BusyReason::DeadlineInQueue { after: deadline }
        );
        assert_eq!(admission.status().queued, 0);
    }

    /// A task whose memory does not fit waits in the queue (holding its slot), gets in
    /// once memory is given back, and is refused naming the total when its wait runs out.
    #[tokio::test]
    async fn a_task_waits_in_the_queue_for_guest_memory() {
        const MIB: u64 = 1 << 20;
        let admission = Admission::new(
            4,
            4,
            Duration::from_millis(50),
            GuestMemoryTotal::new(2 * MIB),
        );
        let first = admission
            .admit(Duration::from_secs(60), 2 * MIB)
            .await
            .unwrap();
        let mut waiter = Box::pin(admission.admit(Duration::from_secs(60), MIB));
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        assert_eq!(admission.status().queued, 1);
        drop(first);
        let second = waiter.await.unwrap();
        assert_eq!(admission.guest_memory().status().used_bytes, MIB);
        let _third = admission.admit(Duration::from_secs(60), MIB).await.unwrap();
        assert_eq!(
            admission
                .admit(Duration::from_secs(60), MIB)
                .await
                .unwrap_err(),
            BusyReason::GuestMemory {
                after: Duration::from_millis(50),
                needed: MIB,
                limit: 2 * MIB
            }
        );
        assert_eq!(
            admission
                .admit(Duration::from_secs(60), 3 * MIB)
                .await
                .unwrap_err(),
            BusyReason::GuestMemoryTooSmall {
                needed: 3 * MIB,
                limit: 2 * MIB
            }
        );
        drop(second);
        let status = admission.status();
        assert_eq!((status.running, status.queued), (1, 0));
    }
}
