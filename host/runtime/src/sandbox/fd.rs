//! The per-task fd table.
//!
//! Every handle a guest holds (an MCP session, a chat session or response) is an fd in
//! this table. Entries live in a [`Slab`], so lookups are O(1) and memory stays dense, but an fd
//! number is never handed out twice within a task: the number carries a serial besides the
//! slab slot, so a stale fd from a closed session is `-EBADF`, never somebody else's entry.
//! The table is generic over what an entry is (`K`, the host's `FdKind`), so the sandbox
//! knows no capability; a capability reaches its own entries through [`FdKindOf`], and an
//! fd of another kind is `-EBADF`.
//!
//! Each entry carries its fd flags (SPEAR's `O_NONBLOCK`, set with `spear_fd_ctl`) beside
//! what it holds, so every kind has them without knowing of them.
//!
//! The table charges the task's memory budget for its slots and, per open fd,
//! [`FD_STATE_BYTES`] for the fixed-size state behind it; what an entry grows beyond that
//! (messages, kept output) is charged by the entry itself.

use quiver_abi::Errno;
use slab::Slab;

use super::{Charge, MemoryBudget};

/// Charged per open fd for the fixed-size state an entry owns on the heap (a chat
/// session's shared content, whose size a test holds to this, an MCP grant).
pub const FD_STATE_BYTES: u64 = 1024;

/// An fd kind that can hold a `V` (one capability's per-fd state).
pub trait FdKindOf<V>: Sized {
    fn wrap(value: V) -> Self;
    /// The `V` inside, if this entry is one.
    fn peek(&mut self) -> Option<&mut V>;
}

/// SPEAR's `O_NONBLOCK` fd flag: calls that would wait answer `-EAGAIN` or start work in
/// the background instead.
pub const O_NONBLOCK: u32 = 0x1;

struct Entry<K> {
    fd: i32,
    flags: u32,
    kind: K,
}

/// Room for one fd in an [`FdTable`], from [`FdTable::vacant`].
pub struct VacantFd<'a, K> {
    table: &'a mut FdTable<K>,
    /// The slab capacity charged for.
    capacity: usize,
}

impl<K> VacantFd<'_, K> {
    /// Stores `kind` in the room and returns its new fd.
    pub fn insert(self, kind: K) -> i32 {
        let table = &mut *self.table;
        let entry = table.entries.vacant_entry();
        let fd = ((table.next_serial << table.slot_bits) | entry.key() as u32) as i32;
        entry.insert(Entry { fd, flags: 0, kind });
        table.next_serial += 1;
        fd
    }

    /// Stores one capability's state in the room.
    pub fn insert_as<V>(self, value: V) -> i32
    where
        K: FdKindOf<V>,
    {
        self.insert(K::wrap(value))
    }
}

impl<K> Drop for VacantFd<'_, K> {
    /// Charges what the table holds now: the same once the room is used, the fd's part
    /// less if it was not (shrinking never fails).
    fn drop(&mut self) {
        let cost = FdTable::<K>::cost(self.capacity, self.table.entries.len());
        let _ = self.table.charge.resize(cost);
    }
}

pub struct FdTable<K> {
    entries: Slab<Entry<K>>,
    cap: usize,
    slot_bits: u32,
    next_serial: u32,
    /// The slab's slots and [`FD_STATE_BYTES`] per open fd.
    charge: Charge,
}

impl<K> FdTable<K> {
    /// A table holding at most `cap` open fds (clamped to 1..=2^20), charging `budget`.
    pub fn new(cap: usize, budget: &MemoryBudget) -> Self {
        let cap = cap.clamp(1, 1 << 20);
        let slot_bits = usize::BITS - (cap - 1).leading_zeros();
        Self {
            entries: Slab::new(),
            cap,
            slot_bits,
            next_serial: 1,
            charge: budget.empty("fd table"),
        }
    }

    /// What `len` open fds in a slab of `capacity` slots cost.
    fn cost(capacity: usize, len: usize) -> u64 {
        // A slab slot is an enum of the entry or a free-list link, with its tag.
        let slot = (std::mem::size_of::<Entry<K>>().max(8) + 8) as u64;
        super::heap::alloc(slot.saturating_mul(capacity as u64))
            .saturating_add(FD_STATE_BYTES.saturating_mul(len as u64))
    }

    /// Stores `kind` and returns its new fd, or `-EMFILE` when the table is full (or, after
    /// billions of opens, when fresh numbers run out), or `-ENOMEM` when the task's memory
    /// budget cannot hold another fd.
    pub fn insert(&mut self, kind: K) -> Result<i32, Errno> {
        Ok(self.vacant()?.insert(kind))
    }

    /// Room for one more fd, charged already, so that storing in it cannot fail: a hostcall
    /// that starts work for its new fd reserves it first, and nothing starts unless the
    /// guest gets the fd. Errors as [`FdTable::insert`]; dropping the room unused gives
    /// its charge back.
    pub fn vacant(&mut self) -> Result<VacantFd<'_, K>, Errno> {
        if self.entries.len() >= self.cap {
            return Err(Errno::EMFILE);
        }
        let max_serial = (i32::MAX as u32) >> self.slot_bits;
        if self.next_serial > max_serial {
            return Err(Errno::EMFILE);
        }
        let len = self.entries.len() + 1;
        let capacity = match self.entries.capacity() {
            room if room >= len => room,
            room => room.saturating_mul(2).max(4).min(self.cap).max(len),
        };
        self.charge.resize(Self::cost(capacity, len))?;
        self.entries.reserve_exact(capacity - self.entries.len());
        Ok(VacantFd {
            table: self,
            capacity,
        })
    }

    fn slot(&self, fd: i32) -> Option<usize> {
        (fd >= 0).then(|| (fd as u32 & ((1u32 << self.slot_bits) - 1)) as usize)
    }

    fn entry(&mut self, fd: i32) -> Result<&mut Entry<K>, Errno> {
        let slot = self.slot(fd).ok_or(Errno::EBADF)?;
        match self.entries.get_mut(slot) {
            Some(entry) if entry.fd == fd => Ok(entry),
            _ => Err(Errno::EBADF),
        }
    }

    pub fn get_mut(&mut self, fd: i32) -> Result<&mut K, Errno> {
        Ok(&mut self.entry(fd)?.kind)
    }

    /// `fd`'s flags ([`O_NONBLOCK`]).
    pub fn flags(&mut self, fd: i32) -> Result<u32, Errno> {
        Ok(self.entry(fd)?.flags)
    }

    pub fn set_flags(&mut self, fd: i32, flags: u32) -> Result<(), Errno> {
        self.entry(fd)?.flags = flags;
        Ok(())
    }

    /// Whether `fd` is open with [`O_NONBLOCK`].
    pub fn nonblocking(&mut self, fd: i32) -> Result<bool, Errno> {
        Ok(self.flags(fd)? & O_NONBLOCK != 0)
    }

    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// Removes `fd` and returns what it held.
    pub fn remove(&mut self, fd: i32) -> Result<K, Errno> {
        self.get_mut(fd)?;
        let slot = self.slot(fd).ok_or(Errno::EBADF)?;
        let Entry { kind, .. } = self.entries.remove(slot);
        let cost = Self::cost(self.entries.capacity(), self.entries.len());
        // Shrinking never fails.
        let _ = self.charge.resize(cost);
        Ok(kind)
    }

    /// Stores one capability's state as a new fd.
    pub fn insert_as<V>(&mut self, value: V) -> Result<i32, Errno>
    where
        K: FdKindOf<V>,
    {
        self.insert(K::wrap(value))
    }

    /// The `V` behind `fd`; `-EBADF` if it is closed or of another kind.
    pub fn get_as<V>(&mut self, fd: i32) -> Result<&mut V, Errno>
    where
        K: FdKindOf<V>,
    {
        self.get_mut(fd)?.peek().ok_or(Errno::EBADF)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn budget() -> MemoryBudget {
        MemoryBudget::unlimited()
    }

    #[derive(Debug)]
    enum Kind {
        A(u8),
        B,
    }

    impl FdKindOf<u8> for Kind {
        fn wrap(value: u8) -> Self {
            Kind::A(value)
        }
        fn peek(&mut self) -> Option<&mut u8> {
            match self {
                Kind::A(v) => Some(v),
                Kind::B => None,
            }
        }
    }

    fn session() -> Kind {
        Kind::A(0)
    }

    #[test]
    fn an_fd_of_another_kind_is_ebadf() {
        let mut table = FdTable::new(4, &budget());
        let a = table.insert_as(7u8).unwrap();
        let b = table.insert(Kind::B).unwrap();
        assert_eq!(table.get_as::<u8>(a).copied(), Ok(7));
        assert_eq!(table.get_as::<u8>(b).err(), Some(Errno::EBADF));
    }

    #[test]
    fn fds_are_never_reused_and_closed_fds_are_ebadf() {
        let mut table = FdTable::new(2, &budget());
        let a = table.insert(session()).unwrap();
        table.remove(a).unwrap();
        let b = table.insert(session()).unwrap();
        assert_ne!(a, b, "a closed fd's number came back");
        assert_eq!(table.get_mut(a).err(), Some(Errno::EBADF));
        assert!(table.get_mut(b).is_ok());
        assert_eq!(table.remove(a).err(), Some(Errno::EBADF));
    }

    #[test]
    fn the_cap_gives_emfile_and_closing_frees_room() {
        let mut table = FdTable::new(3, &budget());
        let fds: Vec<i32> = (0..3).map(|_| table.insert(session()).unwrap()).collect();
        assert_eq!(table.insert(session()).err(), Some(Errno::EMFILE));
        table.remove(fds[1]).unwrap();
        assert!(table.insert(session()).is_ok());
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn flags_belong_to_one_fd_and_go_with_it() {
        let mut table = FdTable::new(4, &budget());
        let a = table.insert(session()).unwrap();
        let b = table.insert(session()).unwrap();
        assert_eq!(table.nonblocking(a), Ok(false));
        table.set_flags(a, O_NONBLOCK).unwrap();
        assert_eq!(table.nonblocking(a), Ok(true));
        assert_eq!(table.nonblocking(b), Ok(false));
        table.remove(a).unwrap();
        assert_eq!(table.flags(a), Err(Errno::EBADF));
        assert_eq!(table.set_flags(a, 0), Err(Errno::EBADF));
    }

    #[test]
    fn hostile_fd_numbers_are_ebadf() {
        let mut table = FdTable::new(8, &budget());
        table.insert(session()).unwrap();
        for fd in [-1, i32::MIN, 0, 1, 7, i32::MAX] {
            assert_eq!(table.get_mut(fd).err(), Some(Errno::EBADF), "fd {fd}");
        }
    }

    #[test]
    fn open_fds_are_charged_and_a_full_budget_is_enomem() {
        let budget = MemoryBudget::new(Arc::from("t"), 3 * FD_STATE_BYTES + 512);
        let mut table = FdTable::new(100, &budget);
        let a = table.insert(session()).unwrap();
        let b = table.insert(session()).unwrap();
        let charged = budget.used();
        assert!(charged >= 2 * FD_STATE_BYTES, "{charged}");
        let c = table.insert(session()).unwrap();
        assert_eq!(table.insert(session()).err(), Some(Errno::ENOMEM));
        assert_eq!(
            table.len(),
            3,
            "a refused insert leaves the table as it was"
        );
        table.remove(c).unwrap();
        assert!(table.insert(session()).is_ok(), "closing an fd makes room");
        for fd in [a, b] {
            table.remove(fd).unwrap();
        }
        drop(table);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_vacant_fd_is_charged_first_and_gives_the_charge_back_unused() {
        let budget = MemoryBudget::new(Arc::from("t"), 2 * FD_STATE_BYTES + 512);
        let mut table = FdTable::new(100, &budget);
        let room = table.vacant().unwrap();
        let reserved = budget.used();
        assert!(reserved >= FD_STATE_BYTES, "{reserved}");
        let a = room.insert(session());
        assert_eq!(
            budget.used(),
            reserved,
            "storing in the room charges nothing more"
        );
        assert!(table.get_mut(a).is_ok());
        let before = budget.used();
        let room = table.vacant().unwrap();
        assert!(budget.used() > before);
        drop(room);
        assert_eq!(table.len(), 1);
        assert_eq!(
            budget.used(),
            before,
            "an unused room gives its charge back"
        );
        // The budget cannot hold a third fd: the room is refused, nothing is stored.
        let _b = table.insert(session()).unwrap();
        assert_eq!(table.vacant().err(), Some(Errno::ENOMEM));
        assert_eq!(table.len(), 2);
    }
}
