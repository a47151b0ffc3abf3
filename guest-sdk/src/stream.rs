//! User streams (SPEAR's `user_stream_*`): SSF v1 frames between the task and the client
//! that started it (a WebSocket on `quiver serve`, the terminal with
//! `quiver run --user-stream-stdio`). Reads and writes never wait: `Ok(None)` /
//! `Ok(false)` mean "not now" (`-EAGAIN`); wait with `spear_epoll_*` on [`UserStream::fd`]
//! and [`StreamControl::fd`] ([`rt`](crate::rt) has the epoll wrappers).

use crate::buffer::{addr, arg, call_with_buffer, check};
use crate::{Errno, Error, Result, sys};

use quiver_abi::user_stream::ssf;
pub use quiver_abi::user_stream::{
    CTL_EVENT_SESSION_CLOSED, CTL_EVENT_STREAM_CONNECTED, DIR_BIDIRECTIONAL, DIR_INBOUND,
    DIR_OUTBOUND,
};

/// An fd on one stream of the task's session; closed when dropped.
#[derive(Debug)]
pub struct UserStream {
    fd: i32,
    stream_id: u32,
}

impl UserStream {
    /// `user_stream_open(stream_id, direction)`, `direction` one of [`DIR_INBOUND`],
    /// [`DIR_OUTBOUND`], [`DIR_BIDIRECTIONAL`].
    pub fn open(stream_id: u32, direction: i32) -> Result<Self> {
        let op = || format!("user_stream_open({stream_id})");
        let id = i32::try_from(stream_id).map_err(|_| Error::from_errno(op(), Errno::EINVAL))?;
        // SAFETY: plain integers.
        let fd = check(op, unsafe { sys::user_stream_open(id, direction) })?;
        Ok(Self { fd, stream_id })
    }

    /// The fd, to watch with `spear_epoll_ctl`.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The stream id it was opened on.
    pub fn stream_id(&self) -> u32 {
        self.stream_id
    }

    /// The next whole SSF frame from the client, `None` when none is queued.
    pub fn read_frame(&self) -> Result<Option<Vec<u8>>> {
        let op = format!("user_stream_read({})", self.stream_id);
        let read = call_with_buffer(&op, 64 * 1024, |out, len| {
            // SAFETY: `call_with_buffer` passes a writable buffer of `*len` bytes.
            unsafe { sys::user_stream_read(self.fd, addr(out), addr(len)) }
        });
        match read {
            Ok(frame) => Ok(Some(frame)),
            Err(e) if e.errno() == Some(Errno::EAGAIN) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Queues one whole SSF frame for the client: `false` when its queue is full.
    pub fn write_frame(&self, frame: &[u8]) -> Result<bool> {
        let op = format!("user_stream_write({})", self.stream_id);
        let (ptr, len) = arg(&op, frame)?;
        // SAFETY: `frame` is `len` readable bytes at `ptr`.
        match check(|| op.clone(), unsafe {
            sys::user_stream_write(self.fd, ptr, len)
        }) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(Errno::EAGAIN) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Queues `data` as one SSF DATA frame with sequence number `seq`.
    pub fn write_data(&self, seq: u64, data: &[u8]) -> Result<bool> {
        self.write_frame(&data_frame(self.stream_id, seq, data))
    }
}

impl Drop for UserStream {
    fn drop(&mut self) {
        // SAFETY: plain integer.
        unsafe { sys::user_stream_close(self.fd) };
    }
}

/// The session's control fd: which streams a client connected, and when it left.
#[derive(Debug)]
pub struct StreamControl {
    fd: i32,
}

/// One control event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// The client sent its first frame on this stream id.
    Connected(u32),
    /// The client went away.
    SessionClosed,
    /// A kind this SDK does not know, with its stream id.
    Other {
        /// The event's kind.
        kind: u32,
        /// The event's stream id.
        stream_id: u32,
    },
}

impl StreamControl {
    /// `user_stream_ctl_open()`: `-ENOTCONN` when no client can ever attach to the task.
    pub fn open() -> Result<Self> {
        // SAFETY: no arguments.
        let fd = check(|| "user_stream_ctl_open".into(), unsafe {
            sys::user_stream_ctl_open()
        })?;
        Ok(Self { fd })
    }

    /// The fd, to watch for EPOLLIN with `spear_epoll_ctl`.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The next event, `None` when there is none yet.
    pub fn read_event(&self) -> Result<Option<StreamEvent>> {
        let mut event = [0u8; 8];
        let mut len = event.len() as u32;
        // SAFETY: `event` is `len` writable bytes; `len` is a writable u32.
        let ret = unsafe {
            sys::user_stream_ctl_read(self.fd, addr(event.as_mut_ptr()), addr(&raw mut len))
        };
        match check(|| "user_stream_ctl_read".into(), ret) {
            Ok(_) => {}
            Err(e) if e.errno() == Some(Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e),
        }
        let stream_id = u32::from_le_bytes([event[0], event[1], event[2], event[3]]);
        let kind = u32::from_le_bytes([event[4], event[5], event[6], event[7]]);
        Ok(Some(match kind as i32 {
            CTL_EVENT_STREAM_CONNECTED => StreamEvent::Connected(stream_id),
            CTL_EVENT_SESSION_CLOSED => StreamEvent::SessionClosed,
            _ => StreamEvent::Other { kind, stream_id },
        }))
    }
}

impl Drop for StreamControl {
    fn drop(&mut self) {
        // SAFETY: plain integer.
        unsafe { sys::user_stream_close(self.fd) };
    }
}

/// An SSF v1 DATA frame (32-byte header, no metadata) carrying `data` on `stream_id`.
pub fn data_frame(stream_id: u32, seq: u64, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(ssf::HEADER_BYTES + data.len());
    frame.extend_from_slice(&ssf::MAGIC);
    frame.extend_from_slice(&ssf::VERSION.to_le_bytes());
    frame.extend_from_slice(&(ssf::HEADER_BYTES as u16).to_le_bytes());
    frame.extend_from_slice(&ssf::MSG_DATA.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&stream_id.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
    frame.extend_from_slice(data);
    frame
}

/// The data section of an SSF v1 frame, `None` when it is not one (the host checked the
/// frames it hands a guest).
pub fn frame_data(frame: &[u8]) -> Option<&[u8]> {
    if frame.len() < ssf::HEADER_BYTES || frame[..4] != ssf::MAGIC {
        return None;
    }
    let header_len = usize::from(u16::from_le_bytes([frame[6], frame[7]]));
    let meta_len = u32::from_le_bytes([frame[24], frame[25], frame[26], frame[27]]) as usize;
    frame.get(header_len.checked_add(meta_len)?..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_frame_reads_back_and_a_short_one_is_none() {
        let frame = data_frame(3, 1, b"hi");
        assert_eq!(frame.len(), 34);
        assert_eq!(frame_data(&frame), Some(&b"hi"[..]));
        assert_eq!(frame_data(&frame[..10]), None);
        // Native builds answer ENOSYS, never panic.
        assert!(UserStream::open(1, DIR_BIDIRECTIONAL).is_err());
        assert!(StreamControl::open().is_err());
    }
}
