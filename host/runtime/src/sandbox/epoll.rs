//! `spear_epoll_create/ctl/wait/close`: SPEAR's level-triggered readiness over the task's fds.
//!
//! An epoll set is an fd whose entry holds the watched fds and their interest bits, sorted
//! by fd. `spear_epoll_wait` scans them (each fd's [`Pollable::readiness`]), and when none is
//! ready waits on the task's [`ReadySignal`] until background work signals, the guest's
//! timeout passes or the task's deadline ends the task; a wake rescans, so spurious wakes are
//! harmless and nothing busy-loops. As in Linux, ERR and HUP are reported whether asked
//! for or not, and a watched fd that was closed reports HUP until it is deleted from the set
//! (fd numbers are never reused, so it cannot be mistaken for a newer fd).
//!
//! Bounded: [`defaults::MAX_EPOLL_SETS`] sets per task, [`defaults::MAX_EPOLL_WATCHES`]
//! fds per set, each set's list charged to the task's memory budget; a wait writes at most
//! one 8-byte record per watched fd.

use quiver_abi::epoll_events::{ERR, HUP, KNOWN};
use quiver_abi::{Errno, epoll_op};
use wasmtime::{Caller, Linker};

use super::poll::Pollable;
use super::{Charge, FdKindOf, HostcallError, MemoryBudget, SandboxView, finish, guest, heap};
use crate::defaults;

/// The bytes of one `spear_epoll_wait` record: `fd: i32, events: i32`, little-endian.
const RECORD: u32 = 8;

/// One epoll set: the watched fds with their interest bits, sorted by fd.
pub struct EpollSet {
    watch: Vec<(i32, i32)>,
    charge: Charge,
}

impl EpollSet {
    fn new(budget: &MemoryBudget) -> Self {
        Self {
            watch: Vec::new(),
            charge: budget.empty("epoll set"),
        }
    }

    /// Watches `fd` for `events` (or changes its events), charging the list first.
    fn set(&mut self, fd: i32, events: i32) -> Result<(), Errno> {
        match self.watch.binary_search_by_key(&fd, |&(f, _)| f) {
            Ok(at) => self.watch[at].1 = events,
            Err(at) => {
                if self.watch.len() >= defaults::MAX_EPOLL_WATCHES {
                    return Err(Errno::ENOSPC);
                }
                let capacity = self.watch.capacity().max(self.watch.len() + 1);
                let entry = size_of::<(i32, i32)>() as u64;
                self.charge
                    .resize(heap::alloc(entry.saturating_mul(capacity as u64 * 2)))?;
                self.watch.insert(at, (fd, events));
            }
        }
        Ok(())
    }

    fn remove(&mut self, fd: i32) -> bool {
        match self.watch.binary_search_by_key(&fd, |&(f, _)| f) {
            Ok(at) => {
                self.watch.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    fn watches(&self, fd: i32) -> bool {
        self.watch.binary_search_by_key(&fd, |&(f, _)| f).is_ok()
    }
}

/// What the fd/epoll imports need of the store's fd kind.
pub trait EpollFd: Pollable + FdKindOf<EpollSet> + Send {}
impl<K: Pollable + FdKindOf<EpollSet> + Send> EpollFd for K {}

pub(super) fn add_to_linker<T>(linker: &mut Linker<T>) -> wasmtime::Result<()>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    linker.func_wrap(
        "spear",
        "spear_epoll_create",
        |mut caller: Caller<'_, T>| finish(create(caller.data_mut())),
    )?;
    linker.func_wrap(
        "spear",
        "spear_epoll_ctl",
        |mut caller: Caller<'_, T>, epfd: i32, op: i32, fd: i32, events: i32| {
            finish(ctl(caller.data_mut(), epfd, op, fd, events))
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "spear_epoll_wait",
        |mut caller: Caller<'_, T>,
         (epfd, out_ptr, out_len_ptr, timeout_ms): (i32, i32, i32, i32)| {
            Box::new(async move {
                finish(wait(&mut caller, epfd, out_ptr, out_len_ptr, timeout_ms).await)
            })
        },
    )?;
    linker.func_wrap(
        "spear",
        "spear_epoll_close",
        |mut caller: Caller<'_, T>, epfd: i32| finish(close(caller.data_mut(), epfd)),
    )?;
    Ok(())
}

fn create<T>(state: &mut T) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let sandbox = state.sandbox();
    let _span = tracing::debug_span!("spear_epoll_create", task_id = %sandbox.task_id).entered();
    if sandbox.epoll_sets >= defaults::MAX_EPOLL_SETS {
        tracing::info!(
            max = defaults::MAX_EPOLL_SETS,
            "spear_epoll_create: the task has as many epoll sets as it may hold"
        );
        return Err(Errno::EMFILE.into());
    }
    let set = EpollSet::new(&sandbox.budget);
    let epfd = sandbox.fds.insert_as(set)?;
    sandbox.epoll_sets += 1;
    Ok(epfd)
}

fn ctl<T>(state: &mut T, epfd: i32, op: i32, fd: i32, events: i32) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let sandbox = state.sandbox();
    let _span =
        tracing::debug_span!("spear_epoll_ctl", task_id = %sandbox.task_id, epfd, op, fd, events)
            .entered();
    if epfd == fd {
        return Err(Errno::EINVAL.into());
    }
    let fds = &mut sandbox.fds;
    fds.get_as::<EpollSet>(epfd)?;
    let target = match fds.get_mut(fd).map(|target| target.is_epoll()) {
        Ok(is_epoll) => Some(is_epoll),
        // A closed fd can still be deleted from the set that reports its HUP.
        Err(_) if op == epoll_op::DEL && fds.get_as::<EpollSet>(epfd)?.watches(fd) => None,
        Err(errno) => return Err(errno.into()),
    };
    if target == Some(true) {
        return Err(Errno::EINVAL.into());
    }
    let set = fds.get_as::<EpollSet>(epfd)?;
    match op {
        // As in SPEAR: ADD of a watched fd and MOD of an unwatched one both set its events.
        epoll_op::ADD | epoll_op::MOD => set.set(fd, events & KNOWN)?,
        epoll_op::DEL => {
            set.remove(fd);
        }
        _ => return Err(Errno::EINVAL.into()),
    }
    Ok(0)
}

fn close<T>(state: &mut T, epfd: i32) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let sandbox = state.sandbox();
    let _span =
        tracing::debug_span!("spear_epoll_close", task_id = %sandbox.task_id, epfd).entered();
    sandbox.fds.get_as::<EpollSet>(epfd)?;
    sandbox.fds.remove(epfd)?;
    sandbox.epoll_sets = sandbox.epoll_sets.saturating_sub(1);
    Ok(0)
}

/// The records of the watched fds that are ready, at most `max`, in fd order.
fn scan<T>(state: &mut T, epfd: i32, max: usize) -> Result<Vec<u8>, Errno>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let fds = &mut state.sandbox().fds;
    // A copy, since asking each fd needs the table; bounded by MAX_EPOLL_WATCHES.
    let watch = fds.get_as::<EpollSet>(epfd)?.watch.clone();
    let mut records = Vec::new();
    for (fd, interest) in watch {
        let ready = match fds.get_mut(fd) {
            Ok(kind) => kind.readiness(),
            Err(_) => HUP,
        };
        let events = ready & (interest | ERR | HUP);
        if events != 0 {
            records.extend_from_slice(&fd.to_le_bytes());
            records.extend_from_slice(&events.to_le_bytes());
            if records.len() / RECORD as usize >= max {
                break;
            }
        }
    }
    Ok(records)
}

async fn wait<T>(
    caller: &mut Caller<'_, T>,
    epfd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
    timeout_ms: i32,
) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let task_id = caller.data_mut().sandbox().task_id.clone();
    let span = tracing::debug_span!("spear_epoll_wait", task_id = %task_id, epfd, timeout_ms);
    tracing::Instrument::instrument(
        wait_in_span(caller, epfd, out_ptr, out_len_ptr, timeout_ms),
        span,
    )
    .await
}

async fn wait_in_span<T>(
    caller: &mut Caller<'_, T>,
    epfd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
    timeout_ms: i32,
) -> Result<i32, HostcallError>
where
    T: SandboxView,
    T::Fd: EpollFd,
{
    let (mut mem, state) = guest(caller)?;
    let cap = mem.read_u32(out_len_ptr as u32)?;
    if cap < RECORD {
        mem.write_u32(out_len_ptr as u32, RECORD)?;
        return Err(Errno::ENOSPC.into());
    }
    // The whole buffer must lie in memory before anything waits, as for every output.
    mem.out_buf(out_ptr, out_len_ptr)?;
    let sandbox = state.sandbox();
    sandbox.fds.get_as::<EpollSet>(epfd)?;
    let (deadline, signal) = (sandbox.deadline, sandbox.work.signal().clone());
    let max = (cap / RECORD) as usize;
    let until = u64::try_from(timeout_ms)
        .ok()
        .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
    let records = super::before_deadline(deadline, async {
        loop {
            let notified = signal.notify().notified();
            tokio::pin!(notified);
            // Registered before the scan, so a signal during it is not lost.
            notified.as_mut().enable();
            let records = scan(caller.data_mut(), epfd, max)?;
            if !records.is_empty() || timeout_ms == 0 {
                return Ok::<_, Errno>(records);
            }
            match until {
                Some(until) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(until) => {
                            return scan(caller.data_mut(), epfd, max);
                        }
                    }
                }
                None => notified.await,
            }
        }
    })
    .await??;
    let (mut mem, _) = guest(caller)?;
    mem.write(out_ptr as u32, &records)?;
    mem.write_u32(out_len_ptr as u32, records.len() as u32)?;
    Ok((records.len() / RECORD as usize) as i32)
}
