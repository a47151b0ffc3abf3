//! One task's user streams: the queues between its guest and the one client attached to
//! it, shared by the guest's fds and the client's [`StreamClient`].
//!
//! An embedder makes a [`UserStreams`] and puts a clone in the task's spec; while the task
//! runs, the host binds it to the task's wake-up signal and memory budget, and
//! [`UserStreams::attach`] hands out the one client. Every queue is bounded in frames and
//! bytes per stream and direction ([`defaults::USER_STREAM_QUEUE_BYTES`],
//! [`defaults::USER_STREAM_QUEUE_FRAMES`]), streams per task are bounded
//! ([`defaults::MAX_USER_STREAMS`]), and each queued frame is charged to the task's budget.
//! Backpressure goes both ways: a guest's write to a full queue is `-EAGAIN` (EPOLLOUT
//! clears), and a client's [`StreamClient::send`] waits for room, so a client that floods
//! only fills its own socket, and one that never reads makes the guest wait, never the host
//! grow.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use quiver_abi::Errno;
use quiver_abi::user_stream::{CTL_EVENT_SESSION_CLOSED, CTL_EVENT_STREAM_CONNECTED};
use tokio::sync::Notify;

use super::ssf::{self, FrameError};
use crate::defaults;
use crate::sandbox::{Charge, MemoryBudget, ReadySignal, heap};

/// The user streams of one task: made by the embedder, put in the task's
/// [`TaskSpec::user_streams`](crate::TaskSpec::user_streams), attached to with
/// [`UserStreams::attach`]. Clones share the streams; one handle serves one task run.
#[derive(Clone, Default)]
pub struct UserStreams {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for UserStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserStreams").finish_non_exhaustive()
    }
}

impl PartialEq for UserStreams {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.hub, &other.hub)
    }
}

/// Why a client cannot attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("another client is attached to this task's streams; one client at a time")]
    Busy,
    #[error(
        "this task's stream session is over: a client was attached and went away, or the task ended"
    )]
    Over,
}

/// Why a client's frame was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("not an SSF v1 frame: {0}")]
    Frame(#[from] FrameError),
    #[error("the frame is {0} bytes; a user-stream frame holds at most {max}", max = defaults::USER_STREAM_MAX_FRAME_BYTES)]
    TooLarge(usize),
    #[error("stream_id {0} is above 2147483647; a guest can only open ids 0 to 2^31-1")]
    StreamId(u32),
    #[error("the task has {max} user streams; a frame on another stream_id is refused", max = defaults::MAX_USER_STREAMS)]
    TooManyStreams,
    #[error("the task has ended")]
    Ended,
}

#[derive(Default)]
struct Hub {
    state: Mutex<State>,
    /// Wakes the client: room in an inbound queue, a frame outbound, the task's end.
    client: Notify,
}

#[derive(Default)]
struct State {
    task: TaskLink,
    client: ClientLink,
    streams: BTreeMap<u32, Channel>,
    /// Control events, oldest first; each control fd reads them from its own cursor, so
    /// one opened late still learns of streams connected before it. Bounded: one per
    /// stream and one close.
    events: Vec<[u8; 8]>,
    /// Where the client's next outbound read starts, so no stream starves another.
    next_out: u32,
}

#[derive(Default)]
enum TaskLink {
    /// The task has not started (it may wait in the host's queue).
    #[default]
    Waiting,
    Running {
        signal: ReadySignal,
        budget: MemoryBudget,
    },
    Ended,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum ClientLink {
    #[default]
    None,
    Attached,
    /// The client went away; `failed` when it was cut off for breaking the rules.
    Gone {
        failed: bool,
    },
}

#[derive(Default)]
struct Channel {
    /// A client sent a frame on it.
    connected: bool,
    inbound: Queue,
    outbound: Queue,
}

/// A frame and its charge to the task's budget (none once the task has ended).
struct Frame {
    bytes: Vec<u8>,
    _charge: Option<Charge>,
}

#[derive(Default)]
struct Queue {
    frames: VecDeque<Frame>,
    bytes: usize,
}

impl Queue {
    fn has_room(&self, len: usize) -> bool {
        self.frames.len() < defaults::USER_STREAM_QUEUE_FRAMES
            && self.bytes.saturating_add(len) <= defaults::USER_STREAM_QUEUE_BYTES
    }

    fn push(&mut self, frame: Frame) {
        self.bytes = self.bytes.saturating_add(frame.bytes.len());
        self.frames.push_back(frame);
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let frame = self.frames.pop_front()?;
        self.bytes = self.bytes.saturating_sub(frame.bytes.len());
        Some(frame.bytes)
    }
}

/// What a queued frame costs the task: its bytes and its place in the queue.
fn frame_cost(len: usize) -> u64 {
    heap::alloc(len as u64).saturating_add(std::mem::size_of::<Frame>() as u64)
}

fn event(stream_id: u32, kind: i32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&stream_id.to_le_bytes());
    out[4..].copy_from_slice(&kind.to_le_bytes());
    out
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn signal_task(&self) {
        if let TaskLink::Running { signal, .. } = &self.task {
            signal.signal();
        }
    }

    /// The channel of `stream_id`, made if there is room for another stream.
    fn channel(&mut self, stream_id: u32) -> Option<&mut Channel> {
        if !self.streams.contains_key(&stream_id)
            && self.streams.len() >= defaults::MAX_USER_STREAMS
        {
            return None;
        }
        Some(self.streams.entry(stream_id).or_default())
    }

    fn close_session(&mut self, failed: bool) {
        if matches!(self.client, ClientLink::Gone { .. }) {
            return;
        }
        self.client = ClientLink::Gone { failed };
        self.events.push(event(0, CTL_EVENT_SESSION_CLOSED));
        self.signal_task();
    }
}

impl UserStreams {
    pub fn new() -> Self {
        Self::default()
    }

    /// The client of this task's streams. One at a time, and one session per task: once
    /// the client is dropped the guest sees the session closed, and no other may attach.
    pub fn attach(&self) -> Result<StreamClient, AttachError> {
        let mut state = self.hub.lock();
        match (&state.task, state.client) {
            (TaskLink::Ended, _) | (_, ClientLink::Gone { .. }) => Err(AttachError::Over),
            (_, ClientLink::Attached) => Err(AttachError::Busy),
            (_, ClientLink::None) => {
                state.client = ClientLink::Attached;
                Ok(StreamClient {
                    hub: self.hub.clone(),
                })
            }
        }
    }

    /// Ends the session of a task that ended before it started (refused, failed to set
    /// up, cancelled in the queue): a client waiting for it is told the task ended. A
    /// task that started ends its session itself; then this does nothing.
    pub fn end(&self) {
        let mut state = self.hub.lock();
        if !matches!(state.task, TaskLink::Waiting) {
            return;
        }
        state.task = TaskLink::Ended;
        state.streams.clear();
        drop(state);
        self.hub.client.notify_waiters();
    }

    /// Binds the streams to a starting task; `None` if another task has them already.
    pub(crate) fn bind(&self, signal: ReadySignal, budget: MemoryBudget) -> Option<Bound> {
        let mut state = self.hub.lock();
        if !matches!(state.task, TaskLink::Waiting) {
            return None;
        }
        state.task = TaskLink::Running { signal, budget };
        drop(state);
        self.hub.client.notify_waiters();
        Some(Bound {
            hub: self.hub.clone(),
        })
    }
}

/// The running task's hold on its streams; dropped when the task ends (its store is
/// dropped), which ends the session and wakes the client.
pub(crate) struct Bound {
    hub: Arc<Hub>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        let mut state = self.hub.lock();
        state.task = TaskLink::Ended;
        // What the guest did not read is dropped; what it wrote still reaches an attached
        // client, no longer charged to a task that is gone (the queues and the client's
        // drain deadline bound it). With no client to take them, they are dropped too.
        let attached = state.client == ClientLink::Attached;
        for channel in state.streams.values_mut() {
            channel.inbound = Queue::default();
            if attached {
                for frame in &mut channel.outbound.frames {
                    frame._charge = None;
                }
            } else {
                channel.outbound = Queue::default();
            }
        }
        drop(state);
        self.hub.client.notify_waiters();
    }
}

/// A guest-side stream fd's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Direction {
    pub(crate) read: bool,
    pub(crate) write: bool,
}

impl Direction {
    pub(crate) fn from_abi(direction: i32) -> Option<Self> {
        use quiver_abi::user_stream::{DIR_BIDIRECTIONAL, DIR_INBOUND, DIR_OUTBOUND};
        let (read, write) = match direction {
            DIR_INBOUND => (true, false),
            DIR_OUTBOUND => (false, true),
            DIR_BIDIRECTIONAL => (true, true),
            _ => return None,
        };
        Some(Self { read, write })
    }
}

impl Bound {
    /// The guest's side of the streams, for its hostcalls and fds.
    pub(crate) fn guest(&self) -> GuestSide {
        GuestSide {
            hub: self.hub.clone(),
        }
    }
}

/// The guest's side of a task's streams: what its hostcalls and stream fds use.
#[derive(Clone)]
pub(crate) struct GuestSide {
    hub: Arc<Hub>,
}

impl GuestSide {
    /// Makes room for `stream_id` (`-EMFILE` past [`defaults::MAX_USER_STREAMS`]).
    pub(crate) fn open(&self, stream_id: u32) -> Result<(), Errno> {
        let mut state = self.hub.lock();
        state.channel(stream_id).map(|_| ()).ok_or(Errno::EMFILE)
    }

    /// The next inbound frame of `stream_id`, if it fits in `cap` bytes: `Err(len)` when
    /// it does not (the frame stays), `-EAGAIN` when there is none.
    pub(crate) fn read(&self, stream_id: u32, cap: u32) -> Result<Result<Vec<u8>, u32>, Errno> {
        let mut state = self.hub.lock();
        let channel = state.streams.get_mut(&stream_id).ok_or(Errno::EAGAIN)?;
        let Some(front) = channel.inbound.frames.front() else {
            return Err(Errno::EAGAIN);
        };
        let len = front.bytes.len() as u32;
        if len > cap {
            return Ok(Err(len));
        }
        let frame = channel.inbound.pop().ok_or(Errno::EAGAIN)?;
        drop(state);
        self.hub.client.notify_waiters();
        Ok(Ok(frame))
    }

    /// Queues `frame` (checked by the caller) for the client: `-ENOTCONN` before a client
    /// sent on the stream, `-EPIPE` once the session closed, `-EAGAIN` when the queue is
    /// full, `-ENOMEM` when the task's budget cannot hold it.
    pub(crate) fn write(&self, stream_id: u32, frame: &[u8]) -> Result<(), Errno> {
        let mut state = self.hub.lock();
        let client = state.client;
        let TaskLink::Running { budget, .. } = &state.task else {
            return Err(Errno::EPIPE);
        };
        let budget = budget.clone();
        let channel = state.streams.get_mut(&stream_id).ok_or(Errno::ENOTCONN)?;
        match client {
            ClientLink::Gone { .. } => return Err(Errno::EPIPE),
            _ if !channel.connected => return Err(Errno::ENOTCONN),
            _ => {}
        }
        if !channel.outbound.has_room(frame.len()) {
            return Err(Errno::EAGAIN);
        }
        let charge = budget.charge("user stream frame", frame_cost(frame.len()))?;
        channel.outbound.push(Frame {
            bytes: frame.to_vec(),
            _charge: Some(charge),
        });
        drop(state);
        self.hub.client.notify_waiters();
        Ok(())
    }

    /// `epoll_events` bits of a stream fd.
    pub(crate) fn readiness(&self, stream_id: u32, direction: Direction) -> i32 {
        use quiver_abi::epoll_events::{ERR, HUP, IN, OUT};
        let state = self.hub.lock();
        let mut ready = 0;
        if let Some(channel) = state.streams.get(&stream_id) {
            if direction.read && !channel.inbound.frames.is_empty() {
                ready |= IN;
            }
            if direction.write
                && channel.connected
                && state.client == ClientLink::Attached
                && channel.outbound.has_room(0)
            {
                ready |= OUT;
            }
        }
        if let ClientLink::Gone { failed } = state.client {
            ready |= HUP;
            if failed {
                ready |= ERR;
            }
        }
        ready
    }

    /// The control event at `cursor`, if there is one yet.
    pub(crate) fn event(&self, cursor: usize) -> Option<[u8; 8]> {
        self.hub.lock().events.get(cursor).copied()
    }
}

/// The client of a task's streams, from [`UserStreams::attach`]. Dropping it closes the
/// session: the guest's stream fds report EPOLLHUP and its control fds read
/// `SESSION_CLOSED`.
pub struct StreamClient {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for StreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamClient").finish_non_exhaustive()
    }
}

impl StreamClient {
    /// Hands the guest one SSF v1 frame on its `stream_id`, waiting while that stream's
    /// inbound queue is full or the task has not started. The first frame on a stream id
    /// connects it (a `STREAM_CONNECTED` control event).
    pub async fn send(&self, frame: Vec<u8>) -> Result<(), SendError> {
        if frame.len() > defaults::USER_STREAM_MAX_FRAME_BYTES {
            return Err(SendError::TooLarge(frame.len()));
        }
        let stream_id = ssf::parse(&frame)?.stream_id;
        if stream_id > i32::MAX as u32 {
            return Err(SendError::StreamId(stream_id));
        }
        let mut frame = Some(frame);
        loop {
            let room = self.hub.client.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.hub.lock();
                let budget = match &state.task {
                    TaskLink::Ended => return Err(SendError::Ended),
                    TaskLink::Running { budget, .. } => Some(budget.clone()),
                    TaskLink::Waiting => None,
                };
                if let Some(budget) = budget {
                    let len = frame.as_ref().map_or(0, Vec::len);
                    let channel = state.channel(stream_id).ok_or(SendError::TooManyStreams)?;
                    // A full budget is waited out like a full queue: the guest frees it
                    // by reading.
                    let charge = match channel.inbound.has_room(len) {
                        true => budget.charge("user stream frame", frame_cost(len)).ok(),
                        false => None,
                    };
                    if let Some(charge) = charge {
                        let bytes = frame.take().unwrap_or_default();
                        channel.inbound.push(Frame {
                            bytes,
                            _charge: Some(charge),
                        });
                        let connects = !std::mem::replace(&mut channel.connected, true);
                        if connects {
                            state
                                .events
                                .push(event(stream_id, CTL_EVENT_STREAM_CONNECTED));
                        }
                        state.signal_task();
                        return Ok(());
                    }
                }
            }
            room.await;
        }
    }

    /// The next frame the guest wrote, from any stream in turn, waiting for one; `None`
    /// once the task has ended and every frame it wrote was taken.
    pub async fn recv(&self) -> Option<Vec<u8>> {
        loop {
            let more = self.hub.client.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            {
                let mut state = self.hub.lock();
                let start = state.next_out;
                let ids = state
                    .streams
                    .range(start..)
                    .chain(state.streams.range(..start));
                let ready = ids
                    .filter(|(_, c)| !c.outbound.frames.is_empty())
                    .map(|(id, _)| *id)
                    .next();
                if let Some(id) = ready {
                    let frame = state.streams.get_mut(&id).and_then(|c| c.outbound.pop());
                    state.next_out = id.wrapping_add(1);
                    state.signal_task();
                    return frame;
                }
                if matches!(state.task, TaskLink::Ended) {
                    return None;
                }
            }
            more.await;
        }
    }

    /// Waits until the guest has read every frame sent to it, or the task has ended.
    pub async fn drained(&self) {
        loop {
            let more = self.hub.client.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            {
                let state = self.hub.lock();
                let empty = state.streams.values().all(|c| c.inbound.frames.is_empty());
                if empty || matches!(state.task, TaskLink::Ended) {
                    return;
                }
            }
            more.await;
        }
    }

    /// Waits until the task has ended (or ended before it started).
    pub async fn ended(&self) {
        loop {
            let more = self.hub.client.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            if matches!(self.hub.lock().task, TaskLink::Ended) {
                return;
            }
            more.await;
        }
    }

    /// Closes the session (as dropping the client does) while frames the guest wrote can
    /// still be received.
    pub fn close(&self) {
        self.hub.lock().close_session(false);
    }

    /// Closes the session as a refusal: the guest's stream fds report EPOLLERR besides
    /// EPOLLHUP (a client cut off for breaking the rules).
    pub fn fail(&self) {
        self.hub.lock().close_session(true);
    }
}

impl Drop for StreamClient {
    fn drop(&mut self) {
        let mut state = self.hub.lock();
        state.close_session(false);
        // Nobody can take them any more (no other client may attach); the guest's writes
        // now fail with -EPIPE.
        for channel in state.streams.values_mut() {
            channel.outbound = Queue::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn data(stream_id: u32) -> Vec<u8> {
        ssf::data_frame(stream_id, 1, b"hello")
    }

    fn outbound_frames(streams: &UserStreams) -> usize {
        let state = streams.hub.lock();
        state
            .streams
            .values()
            .map(|c| c.outbound.frames.len())
            .sum()
    }

    /// A task refused or cancelled before it started never binds: its client must hear
    /// that it ended, not wait forever.
    #[tokio::test]
    async fn a_task_that_never_started_ends_its_session() {
        let streams = UserStreams::new();
        let client = streams.attach().expect("attach");
        let sending = tokio::spawn({
            let streams = streams.clone();
            async move {
                let _keep = streams;
                client.send(data(1)).await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        streams.end();
        let sent = tokio::time::timeout(Duration::from_secs(5), sending)
            .await
            .expect("the send ends")
            .expect("join");
        assert_eq!(sent, Err(SendError::Ended));
        assert!(
            streams
                .bind(ReadySignal::default(), MemoryBudget::unlimited())
                .is_none()
        );
    }

    /// Frames the guest wrote are dropped once no client can take them: when the client
    /// goes, and when the task ends without one.
    #[tokio::test]
    async fn frames_nobody_can_take_are_not_kept() {
        let budget = MemoryBudget::new(Arc::from("t"), 1 << 20);
        let streams = UserStreams::new();
        let bound = streams
            .bind(ReadySignal::default(), budget.clone())
            .expect("bind");
        let client = streams.attach().expect("attach");
        client.send(data(1)).await.expect("send");
        bound.guest().write(1, &data(1)).expect("write");
        assert_eq!(outbound_frames(&streams), 1);
        drop(client);
        assert_eq!(outbound_frames(&streams), 0, "the client went away");
        drop(bound);
        assert_eq!(budget.used(), 0);

        // Attached when the task ends: kept (uncharged) for the client to drain.
        let streams = UserStreams::new();
        let bound = streams
            .bind(ReadySignal::default(), budget.clone())
            .expect("bind");
        let client = streams.attach().expect("attach");
        client.send(data(2)).await.expect("send");
        bound.guest().write(2, &data(2)).expect("write");
        drop(bound);
        assert_eq!(budget.used(), 0);
        tokio::time::timeout(Duration::from_secs(5), client.ended())
            .await
            .expect("ended");
        assert_eq!(client.recv().await, Some(data(2)));
        assert_eq!(client.recv().await, None);
    }
}
