//! A task's host-side memory budget: every byte of host state a guest can grow is charged
//! to it, and released when that state is freed.
//!
//! The linear-memory limit bounds what a guest holds in its own memory; this bounds what it
//! makes the host hold for it (chat messages, params, tools, kept outputs, response bodies,
//! captured output, the copies a send makes). A [`Charge`] is owned by the value it accounts
//! for and gives its bytes back when dropped, so state freed by any path (a close, the end
//! of the task, an error halfway) is released without anyone remembering to. Growing a
//! charge past the limit fails with `-ENOMEM` before the state changes.
//!
//! Every task's budget also draws on its host's [`HostMemory`]: per-task limits times
//! running tasks would otherwise be the only bound (1024 tasks x 64 MiB), so a host full of
//! hostile tenants could still grow past the machine. A charge needs room in both.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use quiver_abi::Errno;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::heap;

/// One task's budget; clones share it. The limit is `limits.host_memory_bytes`.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    account: Arc<Account>,
}

#[derive(Debug)]
struct Account {
    task_id: Arc<str>,
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    host: Option<HostMemory>,
}

/// The host memory all tasks of a host hold together; clones share it.
#[derive(Clone, Debug)]
pub struct HostMemory {
    total: Arc<Total>,
}

#[derive(Debug)]
struct Total {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

/// What the tasks of a host hold now, for its status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostMemoryStatus {
    /// The host's total (`[tasks] host_memory_total_bytes`).
    pub limit_bytes: u64,
    pub used_bytes: u64,
    pub peak_bytes: u64,
}

impl HostMemory {
    pub fn new(limit: u64) -> Self {
        Self {
            total: Arc::new(Total {
                limit,
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            }),
        }
    }

    pub fn status(&self) -> HostMemoryStatus {
        HostMemoryStatus {
            limit_bytes: self.total.limit,
            used_bytes: self.total.used.load(Ordering::SeqCst),
            peak_bytes: self.total.peak.load(Ordering::SeqCst),
        }
    }

    /// Takes `bytes`, or returns what is used if they do not fit.
    fn take(&self, bytes: u64) -> Result<(), u64> {
        let total = &self.total;
        let before = total
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&sum| sum <= total.limit)
            })?;
        total.peak.fetch_max(before + bytes, Ordering::SeqCst);
        Ok(())
    }

    fn give_back(&self, bytes: u64) {
        give_back(&self.total.used, bytes);
    }
}

/// Subtracts `bytes` from `used`, never below zero: a charge only gives back what it took.
fn give_back(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
        Some(used.saturating_sub(bytes))
    });
}

/// What a task's budget saw, reported in its outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryUse {
    /// The budget (`limits.host_memory_bytes`, capped by the host's).
    pub limit_bytes: u64,
    /// The most host memory the task held at once.
    pub peak_bytes: u64,
    /// Bytes still charged when the task ended; always 0 unless the host has a bug.
    pub unreleased_bytes: u64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes for `task_id` (named in the log when it is hit), on its own.
    pub fn new(task_id: Arc<str>, limit: u64) -> Self {
        Self::with_host(task_id, limit, None)
    }

    /// A budget of `limit` bytes for `task_id` that also draws on `host`.
    pub fn within(task_id: Arc<str>, limit: u64, host: &HostMemory) -> Self {
        Self::with_host(task_id, limit, Some(host.clone()))
    }

    fn with_host(task_id: Arc<str>, limit: u64, host: Option<HostMemory>) -> Self {
        Self {
            account: Arc::new(Account {
                task_id,
                limit,
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                host,
            }),
        }
    }

    /// A budget that is never hit, for state built outside a task (e.g. `--explain-policy`).
    pub fn unlimited() -> Self {
        Self::new(Arc::from(""), u64::MAX)
    }

    pub fn limit(&self) -> u64 {
        self.account.limit
    }

    /// The task the budget is for.
    pub(crate) fn task_id(&self) -> &Arc<str> {
        &self.account.task_id
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.account.used.load(Ordering::SeqCst)
    }

    pub fn usage(&self) -> HostMemoryUse {
        HostMemoryUse {
            limit_bytes: self.limit(),
            peak_bytes: self.account.peak.load(Ordering::SeqCst),
            unreleased_bytes: self.used(),
        }
    }

    /// A charge of `bytes` for `what`, or `-ENOMEM` if the budget cannot hold it.
    pub fn charge(&self, what: &'static str, bytes: u64) -> Result<Charge, Errno> {
        let mut charge = self.empty(what);
        charge.grow(bytes)?;
        Ok(charge)
    }

    /// A charge of nothing yet, to be grown as `what` grows.
    pub fn empty(&self, what: &'static str) -> Charge {
        Charge {
            budget: self.clone(),
            what,
            bytes: 0,
        }
    }

    /// Parses guest JSON `text`, charging what the value will hold before it is built:
    /// `-EIO` for text that is not JSON, `-ENOMEM` when the budget cannot hold the value.
    /// The charge goes with the value; drop it when the value is gone.
    pub fn parse_json(&self, what: &'static str, text: &[u8]) -> Result<(Value, Charge), Errno> {
        // Any JSON is a `Value`, so only text that is not JSON fails here.
        self.parse_json_as(what, text)
    }

    /// [`parse_json`](Self::parse_json) into a `T` that holds no more than the JSON value
    /// would; JSON of another shape is `-EINVAL`. The charge is the byte scan's bound when
    /// the budget has room for it, as it has for most texts; else serde_json's walk, which
    /// is exact and tells text that is not JSON (`-EIO`) from a value the budget cannot hold
    /// (`-ENOMEM`).
    pub fn parse_json_as<T: DeserializeOwned>(
        &self,
        what: &'static str,
        text: &[u8],
    ) -> Result<(T, Charge), Errno> {
        crate::json::refuse_raw_value_key(text).map_err(|_| Errno::EIO)?;
        let mut charge = self.empty(what);
        let bound = heap::json_text_bound(text);
        if charge.resize_between(0, bound)? < bound {
            let cost = heap::json_text(text).map_err(|_| Errno::EIO)?;
            charge.grow(cost)?;
        }
        let value = serde_json::from_slice(text).map_err(|e| {
            if e.is_data() {
                Errno::EINVAL
            } else {
                Errno::EIO
            }
        })?;
        Ok((value, charge))
    }

    fn take(&self, what: &'static str, bytes: u64, quiet: bool) -> Result<(), Errno> {
        let account = &self.account;
        let reserved = account
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= account.limit)
            });
        let before = match reserved {
            Ok(before) => before,
            Err(used) => {
                if !quiet {
                    tracing::debug!(
                        task_id = %account.task_id,
                        what,
                        requested = bytes,
                        used,
                        limit = account.limit,
                        "the task's host memory budget is exhausted (limits.host_memory_bytes); the hostcall fails with ENOMEM"
                    );
                }
                return Err(Errno::ENOMEM);
            }
        };
        if let Some(host) = &account.host
            && let Err(used) = host.take(bytes)
        {
            give_back(&account.used, bytes);
            if !quiet {
                tracing::debug!(
                    task_id = %account.task_id,
                    what,
                    requested = bytes,
                    used,
                    limit = host.total.limit,
                    "the host memory all tasks share is exhausted ([tasks] host_memory_total_bytes); the hostcall fails with ENOMEM"
                );
            }
            return Err(Errno::ENOMEM);
        }
        account.peak.fetch_max(before + bytes, Ordering::SeqCst);
        Ok(())
    }

    fn give_back(&self, bytes: u64) {
        give_back(&self.account.used, bytes);
        if let Some(host) = &self.account.host {
            host.give_back(bytes);
        }
    }
}

/// Bytes of a budget held by one piece of state; given back when dropped.
#[derive(Debug)]
#[must_use = "a charge is given back as soon as it is dropped"]
pub struct Charge {
    budget: MemoryBudget,
    what: &'static str,
    bytes: u64,
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes `more` bytes; `-ENOMEM` (and no change) if the budget cannot hold them.
    pub fn grow(&mut self, more: u64) -> Result<(), Errno> {
        if more == 0 {
            return Ok(());
        }
        self.budget.take(self.what, more, false)?;
        self.bytes = self.bytes.saturating_add(more);
        Ok(())
    }

    /// Gives back up to `less` bytes.
    pub fn shrink(&mut self, less: u64) {
        let less = less.min(self.bytes);
        self.budget.give_back(less);
        self.bytes -= less;
    }

    /// Holds exactly `bytes`: shrinking always works, growing may be `-ENOMEM`.
    pub fn resize(&mut self, bytes: u64) -> Result<(), Errno> {
        match bytes.checked_sub(self.bytes) {
            Some(more) => self.grow(more),
            None => {
                self.shrink(self.bytes - bytes);
                Ok(())
            }
        }
    }

    /// Holds `wanted` bytes if the budget has room, else at least `needed` (for amortised
    /// growth: room to spare when possible, never less than what is needed). Returns the
    /// bytes now held.
    pub fn resize_between(&mut self, needed: u64, wanted: u64) -> Result<u64, Errno> {
        if wanted > self.bytes
            && self
                .budget
                .take(self.what, wanted - self.bytes, true)
                .is_ok()
        {
            self.bytes = wanted;
            return Ok(wanted);
        }
        self.resize(needed)?;
        Ok(self.bytes)
    }

    /// Takes over `other`'s bytes (a charge of the same budget), so they are given back
    /// with this one.
    pub fn absorb(&mut self, mut other: Charge) {
        if Arc::ptr_eq(&self.budget.account, &other.budget.account) {
            self.bytes = self.bytes.saturating_add(std::mem::take(&mut other.bytes));
        }
    }

    /// A second charge of as many bytes, for a copy of what this one accounts for.
    pub fn try_clone(&self) -> Result<Charge, Errno> {
        self.beside(self.bytes)
    }

    /// A second charge of `bytes` on the same budget, for what is held beside what this
    /// one accounts for.
    pub fn beside(&self, bytes: u64) -> Result<Charge, Errno> {
        self.budget.charge(self.what, bytes)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64) -> MemoryBudget {
        MemoryBudget::new(Arc::from("t"), limit)
    }

    #[test]
    fn charges_are_given_back_when_dropped() {
        let budget = budget(100);
        let a = budget.charge("a", 60).unwrap();
        assert_eq!(budget.used(), 60);
        assert_eq!(budget.charge("b", 41).err(), Some(Errno::ENOMEM));
        assert_eq!(budget.used(), 60, "a refused charge takes nothing");
        let b = budget.charge("b", 40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!(budget.usage().unreleased_bytes, 0);
        assert_eq!(budget.usage().peak_bytes, 100);
    }

    #[test]
    fn growing_past_the_limit_is_enomem_and_changes_nothing() {
        let budget = budget(100);
        let mut charge = budget.empty("x");
        charge.grow(70).unwrap();
        assert_eq!(charge.grow(31), Err(Errno::ENOMEM));
        assert_eq!((charge.bytes(), budget.used()), (70, 70));
        charge.resize(20).unwrap();
        assert_eq!((charge.bytes(), budget.used()), (20, 20));
        charge.resize(100).unwrap();
        assert_eq!(charge.resize(101), Err(Errno::ENOMEM));
        charge.shrink(u64::MAX);
        assert_eq!((charge.bytes(), budget.used()), (0, 0));
        assert_eq!(charge.grow(u64::MAX), Err(Errno::ENOMEM), "no overflow");
    }

    #[test]
    fn resize_between_takes_spare_room_only_when_there_is_some() {
        let budget = budget(100);
        let mut charge = budget.empty("x");
        assert_eq!(charge.resize_between(30, 60), Ok(60));
        let _other = budget.charge("y", 30).unwrap();
        assert_eq!(charge.resize_between(65, 120), Ok(65));
        assert_eq!(charge.resize_between(80, 160), Err(Errno::ENOMEM));
        assert_eq!(charge.bytes(), 65);
        assert_eq!(budget.used(), 95);
    }

    #[test]
    fn absorb_and_clone_keep_the_books_straight() {
        let budget = budget(100);
        let mut a = budget.charge("a", 10).unwrap();
        a.absorb(budget.charge("b", 20).unwrap());
        assert_eq!((a.bytes(), budget.used()), (30, 30));
        let copy = a.try_clone().unwrap();
        assert_eq!(budget.used(), 60);
        let _big = budget.charge("c", 40).unwrap();
        assert_eq!(a.try_clone().err(), Some(Errno::ENOMEM));
        drop((a, copy));
        assert_eq!(budget.used(), 40);
        // A charge of another budget is not taken over: its bytes go back to their own.
        let other = self::budget(10);
        let mut c = budget.empty("c");
        c.absorb(other.charge("o", 5).unwrap());
        assert_eq!((c.bytes(), other.used()), (0, 0));
    }

    #[test]
    fn guest_json_is_charged_before_it_is_parsed() {
        let budget = budget(10_000);
        let (value, charge) = budget.parse_json("t", br#"{"a":["b","c"]}"#).unwrap();
        assert_eq!(charge.bytes(), heap::json(&value));
        assert_eq!(budget.used(), charge.bytes());
        drop(charge);
        assert_eq!(budget.parse_json("t", b"{nope").err(), Some(Errno::EIO));
        // 1 KB of text that would take far more than 10 KB once parsed.
        let bomb = format!("[{}]", ["{}", r#"{"a":0}"#].repeat(60).join(","));
        assert_eq!(
            budget.parse_json("t", bomb.as_bytes()).err(),
            Some(Errno::ENOMEM)
        );
        // Past the budget and not JSON either: not JSON.
        let broken = format!("{bomb}]");
        assert_eq!(
            budget.parse_json("t", broken.as_bytes()).err(),
            Some(Errno::EIO)
        );
        // Escapes the byte scan counts at their written length, over the budget: the
        // exact walk charges what the value holds, which fits.
        let escaped = format!(r#""{}""#, r"\u0041".repeat(2000));
        let (value, charge) = budget.parse_json("t", escaped.as_bytes()).unwrap();
        assert_eq!(charge.bytes(), heap::json(&value));
        drop(charge);
        assert_eq!(budget.used(), 0);
        // The bomb hidden in one string, which the scan counts as a string.
        let hidden = serde_json::json!({"$serde_json::private::RawValue": bomb}).to_string();
        assert_eq!(
            budget.parse_json("t", hidden.as_bytes()).err(),
            Some(Errno::EIO)
        );
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn every_task_draws_on_the_host_total_too() {
        let host = HostMemory::new(100);
        let a = MemoryBudget::within(Arc::from("a"), 80, &host);
        let b = MemoryBudget::within(Arc::from("b"), 80, &host);
        let held = a.charge("x", 70).unwrap();
        assert_eq!(
            b.charge("y", 40).err(),
            Some(Errno::ENOMEM),
            "b's own budget has room, the host's has not"
        );
        assert_eq!(
            (b.used(), host.status().used_bytes),
            (0, 70),
            "a refusal takes nothing"
        );
        let mut grown = b.charge("y", 30).unwrap();
        assert_eq!(host.status().used_bytes, 100);
        drop(held);
        grown.grow(50).unwrap();
        assert_eq!((b.used(), host.status().used_bytes), (80, 80));
        drop(grown);
        assert_eq!(host.status().used_bytes, 0);
        assert_eq!(host.status().peak_bytes, 100);
    }

    #[test]
    fn concurrent_charges_never_pass_the_limit() {
        let budget = budget(1000);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                let budget = budget.clone();
                scope.spawn(move || {
                    for _ in 0..1000 {
                        if let Ok(charge) = budget.charge("t", 7) {
                            assert!(budget.used() <= 1000);
                            drop(charge);
                        }
                    }
                });
            }
        });
        assert_eq!(budget.used(), 0);
        assert!(budget.usage().peak_bytes <= 1000);
    }
}
