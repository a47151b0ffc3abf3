//! The tool arena: guest memory a [`Chat`](crate::Chat) lends the host for its tool calls.
//!
//! # Why this is sound
//!
//! The ABI hands the host the arena as two integers, the session params `tool_arena_ptr`
//! and `tool_arena_len`. The host writes into it (arguments, the output length word) and
//! the tool entry point reads and writes it through pointers made from those integers.
//! Rust code must therefore never hold a reference into the arena while that can happen,
//! and the memory must stay allocated for as long as the host may use the address. This
//! module and [`Chat`](crate::Chat) make both true by construction:
//!
//! 1. **No references.** An [`Arena`] is a raw allocation (`std::alloc::alloc_zeroed`),
//!    held as a pointer whose provenance is exposed when its address is handed out. It is
//!    not a `Vec` or `Box` (whose uniqueness Rust relies on), and nothing in the crate
//!    creates a `&` or `&mut` to its bytes; only the host and the tool entry point touch
//!    them, through the exposed address.
//! 2. **One owner, one session.** Each `Chat` owns its own arena, and only the SDK can set
//!    a session's arena params to it: [`Chat::param`](crate::Chat::param) refuses the two
//!    keys, and lending other memory takes the `unsafe`
//!    [`Chat::lend_tool_arena`](crate::Chat::lend_tool_arena). Sessions no longer share one
//!    arena, so a tool that runs a chat of its own does not overwrite its caller's
//!    arguments.
//! 3. **Used only while lent.** The host reads the params when `cchat_send` starts and
//!    touches the arena only while that call runs (it calls the guest's tools from inside
//!    it; `docs/abi.md`, "The tool arena"). `Chat::send` takes `&mut self`, so the arena
//!    cannot be dropped during a send.
//! 4. **Freed only when the host can no longer use it.** The arena is freed after
//!    `cchat_close` on the session succeeds, or says the fd is not open (`EBADF`): then no
//!    session holds the address, and fds are never reused, so no later send can reach it.
//!    If the close fails in any other way the arena is leaked rather than freed under the
//!    host's feet.
//!
//! The arena is zeroed, so the host never reads uninitialised memory, and 8-byte aligned
//! (the host 4-aligns the output length word from the arena's start).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// The alignment of an arena.
const ALIGN: usize = 8;

/// A zeroed allocation of guest memory lent to the host, freed on drop (see the module
/// docs for when dropping is allowed).
#[derive(Debug)]
pub(crate) struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: an `Arena` owns its allocation like a `Box<[u8]>` does, and gives out no
// references to it; moving or sharing the owner between threads is as safe as for a `Box`.
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only reads the address and length.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates a zeroed arena of `len` bytes; `None` if `len` is 0, too large for an
    /// `i32` (the ABI's lengths), or the allocation fails.
    pub(crate) fn new(len: usize) -> Option<Arena> {
        if len == 0 || i32::try_from(len).is_err() {
            return None;
        }
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Arena { ptr, layout })
    }

    /// The arena's address, with its provenance exposed so that the tool entry point may
    /// turn the host's integers back into pointers (`std::ptr::with_exposed_provenance`).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr().expose_provenance()
    }

    /// The arena's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated with `layout` by `alloc_zeroed`, and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, System};
    use std::sync::Mutex;

    /// The test binary's allocator: the system's, recording the blocks freed with a size
    /// of [`WATCHED`] or more, so tests can see an arena being freed.
    pub(crate) struct Watching;

    /// Frees of blocks this large or larger are recorded (arenas in tests are this large;
    /// nothing else in the tests allocates that much).
    pub(crate) const WATCHED: usize = 3 << 20;

    pub(crate) static FREED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    // SAFETY: forwards to `System`. Recording takes a lock but never allocates: it only
    // pushes into capacity reserved beforehand by `watch`.
    unsafe impl GlobalAlloc for Watching {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if layout.size() >= WATCHED {
                // A futex lock: taking it does not allocate.
                let mut freed = FREED.lock().unwrap_or_else(|e| e.into_inner());
                if freed.len() < freed.capacity() {
                    freed.push(ptr as usize);
                }
            }
            // SAFETY: forwarded.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Makes room in [`FREED`] (outside the allocator, which must not allocate).
    pub(crate) fn watch() {
        FREED.lock().unwrap().reserve(64);
    }

    pub(crate) fn was_freed(addr: usize) -> bool {
        FREED.lock().unwrap().contains(&addr)
    }

    #[test]
    fn arenas_are_zeroed_aligned_and_freed_on_drop() {
        watch();
        let arena = Arena::new(WATCHED).unwrap();
        assert_eq!(arena.len(), WATCHED);
        assert_eq!(arena.addr() % ALIGN, 0);
        let addr = arena.addr();
        // Read as the host would: through the exposed address, no reference kept.
        let bytes = std::ptr::with_exposed_provenance::<u8>(addr);
        // SAFETY: the arena is `WATCHED` bytes, zeroed, and alive.
        assert!(
            (0..WATCHED)
                .step_by(4096)
                .all(|i| unsafe { *bytes.add(i) } == 0)
        );
        assert!(!was_freed(addr));
        drop(arena);
        assert!(was_freed(addr));
    }

    #[test]
    fn bad_lengths() {
        assert!(Arena::new(0).is_none());
        assert!(Arena::new(i32::MAX as usize + 1).is_none());
        assert!(Arena::new(1).is_some());
    }
}
