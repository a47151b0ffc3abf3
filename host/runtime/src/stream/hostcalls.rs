//! `user_stream_open/read/write/close` and `user_stream_ctl_open/read`, SPEAR's names,
//! signatures and errno values. Every call answers at once, as in SPEAR: an empty queue
//! is `-EAGAIN` on read, a full one `-EAGAIN` on write, whatever the fd's flags; a guest
//! waits with `spear_epoll_wait` (EPOLLIN, EPOLLOUT, EPOLLHUP when the client went away,
//! EPOLLERR too when it was cut off). A task without user streams (no client could ever
//! attach) gets `-ENOTCONN` from both opens.

use quiver_abi::Errno;
use quiver_abi::epoll_events::IN;
use quiver_abi::user_stream::CTL_EVENT_BYTES;
use wasmtime::{Caller, Linker};

use super::hub::{Direction, GuestSide};
use super::ssf;
use crate::defaults;
use crate::sandbox::{FdKindOf, HostcallError, SandboxView, finish, guest};

/// A stream fd: one stream id, read, written or both.
pub(crate) struct UserStreamFd {
    side: GuestSide,
    stream_id: u32,
    direction: Direction,
}

impl UserStreamFd {
    pub(crate) fn readiness(&self) -> i32 {
        self.side.readiness(self.stream_id, self.direction)
    }
}

/// A control fd: reads the session's events from its own place in them.
pub(crate) struct UserStreamCtlFd {
    side: GuestSide,
    cursor: usize,
}

impl UserStreamCtlFd {
    pub(crate) fn readiness(&self) -> i32 {
        if self.side.event(self.cursor).is_some() {
            IN
        } else {
            0
        }
    }
}

/// Store data whose task may have user streams.
pub(crate) trait StreamView:
    SandboxView<Fd: FdKindOf<UserStreamFd> + FdKindOf<UserStreamCtlFd>>
{
    /// The guest's side of the task's streams; `None` when the task has none.
    fn user_streams(&self) -> Option<GuestSide>;
}

pub(crate) fn add_to_linker<T: StreamView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "spear",
        "user_stream_open",
        |mut caller: Caller<'_, T>, stream_id: i32, direction: i32| {
            finish(open(caller.data_mut(), stream_id, direction))
        },
    )?;
    linker.func_wrap(
        "spear",
        "user_stream_read",
        |mut caller: Caller<'_, T>, fd: i32, out_ptr: i32, out_len_ptr: i32| {
            finish(read(&mut caller, fd, out_ptr, out_len_ptr))
        },
    )?;
    linker.func_wrap(
        "spear",
        "user_stream_write",
        |mut caller: Caller<'_, T>, fd: i32, buf_ptr: i32, buf_len: i32| {
            finish(write(&mut caller, fd, buf_ptr, buf_len))
        },
    )?;
    linker.func_wrap(
        "spear",
        "user_stream_close",
        |mut caller: Caller<'_, T>, fd: i32| finish(close(caller.data_mut(), fd)),
    )?;
    linker.func_wrap(
        "spear",
        "user_stream_ctl_open",
        |mut caller: Caller<'_, T>| finish(ctl_open(caller.data_mut())),
    )?;
    linker.func_wrap(
        "spear",
        "user_stream_ctl_read",
        |mut caller: Caller<'_, T>, fd: i32, out_ptr: i32, out_len_ptr: i32| {
            finish(ctl_read(&mut caller, fd, out_ptr, out_len_ptr))
        },
    )?;
    Ok(())
}

fn open<T: StreamView>(
    state: &mut T,
    stream_id: i32,
    direction: i32,
) -> Result<i32, HostcallError> {
    let side = state.user_streams().ok_or(Errno::ENOTCONN)?;
    let stream_id = u32::try_from(stream_id).map_err(|_| Errno::EINVAL)?;
    let direction = Direction::from_abi(direction).ok_or(Errno::EINVAL)?;
    let fds = &mut state.sandbox().fds;
    let room = fds.vacant()?;
    side.open(stream_id)?;
    Ok(room.insert_as(UserStreamFd {
        side,
        stream_id,
        direction,
    }))
}

fn read<T: StreamView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let stream = state.sandbox().fds.get_as::<UserStreamFd>(fd)?;
    if !stream.direction.read {
        return Err(Errno::EINVAL.into());
    }
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    let cap = mem.read_u32(out_len_ptr as u32)?;
    match stream.side.read(stream.stream_id, cap)? {
        Ok(frame) => Ok(mem.deliver(out, &frame)?),
        Err(needed) => {
            mem.write_u32(out_len_ptr as u32, needed)?;
            Err(Errno::ENOSPC.into())
        }
    }
}

fn write<T: StreamView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    buf_ptr: i32,
    buf_len: i32,
) -> Result<i32, HostcallError> {
    let (mem, state) = guest(caller)?;
    let stream = state.sandbox().fds.get_as::<UserStreamFd>(fd)?;
    if !stream.direction.write {
        return Err(Errno::EINVAL.into());
    }
    if buf_len as u32 as usize > defaults::USER_STREAM_MAX_FRAME_BYTES {
        return Err(Errno::EINVAL.into());
    }
    let frame = mem.bytes(buf_ptr, buf_len)?;
    let header = ssf::parse(frame).map_err(|_| Errno::EINVAL)?;
    // A frame names its stream; it must be the fd's.
    if header.stream_id != stream.stream_id {
        return Err(Errno::EINVAL.into());
    }
    stream.side.write(stream.stream_id, frame)?;
    Ok(0)
}

fn close<T: StreamView>(state: &mut T, fd: i32) -> Result<i32, HostcallError> {
    let fds = &mut state.sandbox().fds;
    if fds.get_as::<UserStreamFd>(fd).is_err() {
        fds.get_as::<UserStreamCtlFd>(fd)?;
    }
    fds.remove(fd)?;
    Ok(0)
}

fn ctl_open<T: StreamView>(state: &mut T) -> Result<i32, HostcallError> {
    let side = state.user_streams().ok_or(Errno::ENOTCONN)?;
    Ok(state
        .sandbox()
        .fds
        .insert_as(UserStreamCtlFd { side, cursor: 0 })?)
}

fn ctl_read<T: StreamView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let ctl = state.sandbox().fds.get_as::<UserStreamCtlFd>(fd)?;
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    let event = ctl.side.event(ctl.cursor).ok_or(Errno::EAGAIN)?;
    debug_assert_eq!(event.len() as u32, CTL_EVENT_BYTES);
    let len = mem.deliver(out, &event)?;
    ctl.cursor += 1;
    Ok(len)
}
