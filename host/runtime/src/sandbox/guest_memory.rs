//! The host-wide total of guest linear memory: what all running tasks' memories may hold
//! together (`[tasks] guest_memory_total_bytes`).
//!
//! Each task may grow to its own limit (512 MiB by default) and a thousand may run, so the
//! per-task limit alone lets a handful of tenants push the machine into the OOM killer.
//! The total is kept in two steps:
//!
//! - **At admission** a task reserves its module's initial memory (what instantiation
//!   needs), waiting in the queue like it waits for a running slot. A task that cannot
//!   even start waits instead of failing halfway.
//! - **While it runs** every `memory.grow` is charged to the same total by the store's
//!   resource limiter ([`GuestMemoryHold::grow`]). A grow the total cannot hold traps the
//!   task with an error naming the setting, just as a grow past the task's own limit traps
//!   (`trap_on_grow_failure`): a guest's allocator rarely survives a failed grow, and a
//!   trap says why.
//!
//! Reserving each task's maximum at admission instead would bound the total just as well,
//! but a 4 GiB total would then run 8 default tasks at once where most use a few MiB.
//! Charging growth only would admit tasks that cannot instantiate.
//!
//! The counter is a semaphore of 64 KiB pages (tokio's is fair, so a large reservation is
//! not starved by small ones). A task's pages go back when the last of its holders is
//! dropped: the store (which owns the limiter) and the task's run, so the total is only
//! released once the memory itself is, however the task ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::sync::Semaphore;
use wasmtime::{ResourceLimiter, StoreLimits};

/// Bytes per counted page: a wasm page.
const PAGE: u64 = 64 * 1024;

/// The guest linear memory all tasks of a host hold together; clones share it.
#[derive(Clone, Debug)]
pub struct GuestMemoryTotal {
    total: Arc<Total>,
}

#[derive(Debug)]
struct Total {
    limit_bytes: u64,
    pages: u64,
    free: Semaphore,
    peak_pages: AtomicU64,
}

/// What the tasks of a host hold of guest linear memory now, for its status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GuestMemoryStatus {
    /// The host's total (`[tasks] guest_memory_total_bytes`).
    pub limit_bytes: u64,
    /// Reserved or grown by running tasks.
    pub used_bytes: u64,
    pub peak_bytes: u64,
}

/// A grow that the host's total cannot hold; the task traps with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "memory.grow to {desired} bytes refused: running tasks hold {used} of the host's {limit} bytes of guest linear memory ([tasks] guest_memory_total_bytes); raise it, lower the tasks' limits.memory_bytes, or run fewer at once"
)]
pub struct GuestMemoryExhausted {
    pub desired: u64,
    pub used: u64,
    pub limit: u64,
}

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE)
}

impl GuestMemoryTotal {
    /// A total of `limit_bytes` (counted in whole 64 KiB pages).
    pub fn new(limit_bytes: u64) -> Self {
        let pages = (limit_bytes / PAGE).min(Semaphore::MAX_PERMITS as u64);
        Self {
            total: Arc::new(Total {
                limit_bytes,
                pages,
                free: Semaphore::new(pages as usize),
                peak_pages: AtomicU64::new(0),
            }),
        }
    }

    pub fn status(&self) -> GuestMemoryStatus {
        GuestMemoryStatus {
            limit_bytes: self.total.limit_bytes,
            used_bytes: self.used_pages() * PAGE,
            peak_bytes: self.total.peak_pages.load(Ordering::SeqCst) * PAGE,
        }
    }

    pub fn limit_bytes(&self) -> u64 {
        self.total.limit_bytes
    }

    /// Whether `bytes` could ever be reserved (with nothing else running).
    pub fn fits(&self, bytes: u64) -> bool {
        pages(bytes) <= self.total.pages
    }

    fn used_pages(&self) -> u64 {
        self.total
            .pages
            .saturating_sub(self.total.free.available_permits() as u64)
    }

    fn taken(&self) {
        self.total
            .peak_pages
            .fetch_max(self.used_pages(), Ordering::SeqCst);
    }

    /// `bytes` if they are free now.
    pub fn try_reserve(&self, bytes: u64) -> Option<GuestMemoryHold> {
        let want = u32::try_from(pages(bytes)).ok()?;
        self.total.free.try_acquire_many(want).ok()?.forget();
        self.taken();
        Some(self.hold(pages(bytes)))
    }

    /// Waits until `bytes` are free; pending forever for more than [`Self::fits`] allows,
    /// so callers bound the wait.
    pub async fn reserve(&self, bytes: u64) -> GuestMemoryHold {
        match u32::try_from(pages(bytes)) {
            Ok(want) => match self.total.free.acquire_many(want).await {
                Ok(permit) => permit.forget(),
                // The semaphore is never closed.
                Err(_) => std::future::pending().await,
            },
            Err(_) => std::future::pending().await,
        }
        self.taken();
        self.hold(pages(bytes))
    }

    fn hold(&self, held: u64) -> GuestMemoryHold {
        GuestMemoryHold {
            account: Arc::new(Account {
                total: self.clone(),
                held: AtomicU64::new(held),
                size: AtomicU64::new(0),
                last_grow: AtomicU64::new(0),
            }),
        }
    }
}

/// One task's share of the total: what it reserved at admission and grew since. Clones
/// share it; its pages go back when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct GuestMemoryHold {
    account: Arc<Account>,
}

#[derive(Debug)]
struct Account {
    total: GuestMemoryTotal,
    /// Pages taken from the total.
    held: AtomicU64,
    /// Bytes of the task's memories now (at most `held` pages).
    size: AtomicU64,
    /// The last grow allowed, taken back if wasmtime then fails it.
    last_grow: AtomicU64,
}

impl GuestMemoryHold {
    /// A memory of the task grows by `desired - current` bytes: charged to what the task
    /// holds, taking more pages from the total when that is not enough.
    pub fn grow(&self, current: u64, desired: u64) -> Result<(), GuestMemoryExhausted> {
        let account = &self.account;
        let delta = desired.saturating_sub(current);
        let size = account.size.load(Ordering::SeqCst).saturating_add(delta);
        let need = pages(size);
        let held = account.held.load(Ordering::SeqCst);
        if need > held {
            let total = &account.total;
            let refused = || GuestMemoryExhausted {
                desired,
                used: total.used_pages() * PAGE,
                limit: total.limit_bytes(),
            };
            let more = u32::try_from(need - held).map_err(|_| refused())?;
            total
                .total
                .free
                .try_acquire_many(more)
                .map_err(|_| refused())?
                .forget();
            account.held.store(need, Ordering::SeqCst);
            total.taken();
        }
        account.size.store(size, Ordering::SeqCst);
        account.last_grow.store(delta, Ordering::SeqCst);
        Ok(())
    }

    /// wasmtime failed the grow [`Self::grow`] allowed last: the memory did not grow. Its
    /// pages stay held (the task may grow into them again) and go back with the task.
    pub fn grow_failed(&self) {
        let delta = self.account.last_grow.swap(0, Ordering::SeqCst);
        let _ = self
            .account
            .size
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |size| {
                Some(size.saturating_sub(delta))
            });
    }

    /// Bytes this task holds of the total.
    #[cfg(test)]
    fn held_bytes(&self) -> u64 {
        self.account.held.load(Ordering::SeqCst) * PAGE
    }
}

/// A store's resource limiter: the task's own limits first, then the host's total.
pub(super) struct Limits {
    pub(super) task: StoreLimits,
    pub(super) guest_memory: GuestMemoryHold,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if !self.task.memory_growing(current, desired, maximum)? {
            return Ok(false);
        }
        self.guest_memory
            .grow(current as u64, desired as u64)
            .map_err(wasmtime::Error::new)?;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.guest_memory.grow_failed();
        self.task.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.task.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.task.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.task.instances()
    }

    fn tables(&self) -> usize {
        self.task.tables()
    }

    fn memories(&self) -> usize {
        self.task.memories()
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        self.total
            .total
            .free
            .add_permits(usize::try_from(held).unwrap_or(usize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn grows_are_charged_until_the_total_is_used_and_all_of_it_comes_back() {
        let total = GuestMemoryTotal::new(4 * MIB);
        let a = total.try_reserve(MIB).unwrap();
        a.grow(0, MIB).unwrap();
        assert_eq!(
            total.status().used_bytes,
            MIB,
            "the floor covers the first grow"
        );
        a.grow(MIB, 4 * MIB - PAGE).unwrap();
        let b = total.try_reserve(PAGE).unwrap();
        let refused = b.grow(0, 2 * PAGE).unwrap_err();
        assert_eq!((refused.used, refused.limit), (4 * MIB, 4 * MIB));
        assert!(
            refused.to_string().contains("guest_memory_total_bytes"),
            "{refused}"
        );
        b.grow(0, PAGE).unwrap();
        assert!(total.try_reserve(PAGE).is_none(), "full");
        drop(a.clone());
        assert_eq!(total.status().used_bytes, 4 * MIB, "a clone keeps it");
        drop(a);
        b.grow(PAGE, 2 * PAGE).unwrap();
        drop(b);
        let status = total.status();
        assert_eq!((status.used_bytes, status.peak_bytes), (0, 4 * MIB));
    }

    #[test]
    fn a_failed_grow_is_taken_back_and_sizes_never_overflow() {
        let total = GuestMemoryTotal::new(MIB);
        let hold = total.try_reserve(0).unwrap();
        hold.grow(0, 8 * PAGE).unwrap();
        hold.grow_failed();
        hold.grow(0, 16 * PAGE).unwrap();
        assert_eq!(hold.held_bytes(), MIB);
        assert!(hold.grow(16 * PAGE, u64::MAX).is_err());
        assert!(!total.fits(MIB + 1));
        assert!(total.try_reserve(u64::MAX).is_none());
    }

    #[tokio::test]
    async fn a_reservation_waits_for_room() {
        let total = GuestMemoryTotal::new(2 * MIB);
        let first = total.reserve(2 * MIB).await;
        let mut waiting = Box::pin(total.reserve(MIB));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(first);
        let second = waiting.await;
        assert_eq!(total.status().used_bytes, MIB);
        drop(second);
        assert_eq!(total.status().used_bytes, 0);
    }
}
