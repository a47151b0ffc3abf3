//! The per-task fd table.
//!
//! Every handle a guest holds (an MCP session today, chat sessions later) is an fd in this
//! table. Entries live in a [`Slab`], so lookups are O(1) and memory stays dense, but an fd
//! number is never handed out twice within a task: the number carries a serial besides the
//! slab slot, so a stale fd from a closed session is `-EBADF`, never somebody else's entry.
//! The table does not know what a kind does; the ABI layer does.

use slab::Slab;

use crate::abi::Errno;
use crate::chat::{ChatResponse, ChatSession};
use crate::mcp::McpSession;

/// What an fd refers to.
pub(crate) enum FdKind {
    McpSession(McpSession),
    ChatSession(Box<ChatSession>),
    ChatResponse(ChatResponse),
}

pub(crate) struct FdTable {
    entries: Slab<(i32, FdKind)>,
    cap: usize,
    slot_bits: u32,
    next_serial: u32,
}

impl FdTable {
    /// A table holding at most `cap` open fds (clamped to 1..=2^20).
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.clamp(1, 1 << 20);
        let slot_bits = usize::BITS - (cap - 1).leading_zeros();
        Self {
            entries: Slab::with_capacity(cap.min(64)),
            cap,
            slot_bits,
            next_serial: 1,
        }
    }

    /// Stores `kind` and returns its new fd, or `-EMFILE` when the table is full (or, after
    /// billions of opens, when fresh numbers run out).
    pub(crate) fn insert(&mut self, kind: FdKind) -> Result<i32, Errno> {
        if self.entries.len() >= self.cap {
            return Err(Errno::EMFILE);
        }
        let max_serial = (i32::MAX as u32) >> self.slot_bits;
        if self.next_serial > max_serial {
            return Err(Errno::EMFILE);
        }
        let entry = self.entries.vacant_entry();
        let fd = ((self.next_serial << self.slot_bits) | entry.key() as u32) as i32;
        entry.insert((fd, kind));
        self.next_serial += 1;
        Ok(fd)
    }

    fn slot(&self, fd: i32) -> Option<usize> {
        (fd >= 0).then(|| (fd as u32 & ((1u32 << self.slot_bits) - 1)) as usize)
    }

    pub(crate) fn get_mut(&mut self, fd: i32) -> Result<&mut FdKind, Errno> {
        let slot = self.slot(fd).ok_or(Errno::EBADF)?;
        match self.entries.get_mut(slot) {
            Some((stored, kind)) if *stored == fd => Ok(kind),
            _ => Err(Errno::EBADF),
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// Removes `fd` and returns what it held.
    pub(crate) fn remove(&mut self, fd: i32) -> Result<FdKind, Errno> {
        self.get_mut(fd)?;
        let slot = self.slot(fd).ok_or(Errno::EBADF)?;
        Ok(self.entries.remove(slot).1)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::McpSession;

    fn session() -> FdKind {
        FdKind::McpSession(McpSession::detached_for_tests())
    }

    #[test]
    fn fds_are_never_reused_and_closed_fds_are_ebadf() {
        let mut table = FdTable::new(2);
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
        let mut table = FdTable::new(3);
        let fds: Vec<i32> = (0..3).map(|_| table.insert(session()).unwrap()).collect();
        assert_eq!(table.insert(session()).err(), Some(Errno::EMFILE));
        table.remove(fds[1]).unwrap();
        assert!(table.insert(session()).is_ok());
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn hostile_fd_numbers_are_ebadf() {
        let mut table = FdTable::new(8);
        table.insert(session()).unwrap();
        for fd in [-1, i32::MIN, 0, 1, 7, i32::MAX] {
            assert_eq!(table.get_mut(fd).err(), Some(Errno::EBADF), "fd {fd}");
        }
    }
}
