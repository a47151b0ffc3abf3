//! Readiness: what each fd is ready for, and the signal that wakes a waiting guest.
//!
//! Every fd kind says what it is ready for now ([`Pollable::readiness`], as
//! `quiver_abi::epoll_events` bits); epoll sets ([`super::epoll`]) ask it level-triggered,
//! by scanning, never by remembering edges. Work that runs in the background for a task (a
//! nonblocking chat send, an MCP call in flight) changes what its fd reports when it ends,
//! and then calls [`ReadySignal::signal`], which wakes the task's `spear_epoll_wait` to scan
//! again. A new fd kind only has to report its
//! readiness and signal when it changes to fit in, which is how user streams join later.

use std::sync::Arc;

use tokio::sync::Notify;

/// What an fd kind must tell the fd/epoll layer.
pub trait Pollable {
    /// SPEAR's name of the kind (`spear_fd_ctl` GET_KIND), e.g. `"ChatResponse"`.
    fn kind_name(&self) -> &'static str;
    /// What the fd is ready for now: `epoll_events` bits (IN, OUT, ERR).
    fn readiness(&mut self) -> i32;
    /// `spear_fd_ctl` GET_METRICS: the fd's metrics JSON, if its kind keeps any.
    fn metrics(&self) -> Option<Vec<u8>> {
        None
    }
    /// Whether the fd is an epoll set (which cannot be watched by another).
    fn is_epoll(&self) -> bool {
        false
    }
}

/// Wakes a task's waiting `spear_epoll_wait` when an fd's readiness may have changed.
/// Cheap to clone; background work of the task holds one.
#[derive(Clone, Debug, Default)]
pub struct ReadySignal(Arc<Notify>);

impl ReadySignal {
    /// Says that some fd of the task may be ready now. A spurious signal only costs a scan.
    pub fn signal(&self) {
        self.0.notify_waiters();
    }

    pub(super) fn notify(&self) -> &Notify {
        &self.0
    }
}
