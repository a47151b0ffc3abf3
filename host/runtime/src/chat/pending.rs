//! Nonblocking sends: `cchat_send` on a session with `O_NONBLOCK` returns its response fd
//! at once, and the send (with its whole tool-call loop) runs as the task's background
//! work, owned by that fd. `cchat_recv` answers `-EAGAIN` until it ends, the response fd
//! reports EPOLLIN then, and the first read settles it: the session takes the messages the
//! send added and then the response the answer, as a blocking send does when it returns.
//! Its slot of background work is given back as soon as its end is seen; only the outcome
//! stays until the read.
//!
//! A session has at most one send in flight or unread ([`unread`]): each send starts from
//! the session's messages, so a second one would not see the first one's turn, and the two
//! would append their turns in the order they are read.
//!
//! The loop runs outside the guest, so it cannot call guest tools: a nonblocking send on a
//! session that has any is `-EINVAL` (MCP tools run as usual).

use std::sync::Arc;

use quiver_abi::Errno;
use quiver_abi::epoll_events::{ERR, IN};

use super::run::{self, GuestTools, SendContext, SendOutcome};
use super::{ChatResponse, ChatSession, ChatTask};
use crate::mcp::McpTask;
use crate::sandbox::{
    Background, BackgroundWork, Charge, Deadline, FdKindOf, FdTable, HostcallError, MemoryBudget,
    before_deadline,
};

/// A send running in the background, held by its response fd.
pub struct PendingSend {
    session_fd: i32,
    /// The send while it runs; dropped once its end is in `ended`, which frees its slot.
    work: Option<Background<Result<SendOutcome, HostcallError>>>,
    /// How it ended: the outcome the first read settles, or why it failed.
    ended: Option<Result<SendOutcome, Errno>>,
}

/// What a send needs beyond its session, owned so it can outlive the hostcall.
pub(crate) struct Owned {
    pub(crate) task_id: Arc<str>,
    pub(crate) session_fd: i32,
    pub(crate) mcp: Arc<McpTask>,
    pub(crate) chat: Arc<ChatTask>,
    pub(crate) deadline: Deadline,
    pub(crate) budget: MemoryBudget,
}

/// Guest tools of a background send: there are none (a session with guest tools is refused
/// before the send starts), so a call the model makes of one is reported to it as failed.
struct NoGuestTools;

impl GuestTools for NoGuestTools {
    async fn call(
        &mut self,
        _table_index: u32,
        _args: &str,
    ) -> Result<Result<(String, Charge), String>, wasmtime::Error> {
        Ok(Err(
            "guest tools do not run in a nonblocking send".to_owned()
        ))
    }
}

impl std::fmt::Debug for PendingSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSend")
            .field("session_fd", &self.session_fd)
            .field(
                "failed",
                &self.ended.as_ref().and_then(|ended| ended.as_ref().err()),
            )
            .finish_non_exhaustive()
    }
}

impl PendingSend {
    /// Starts sending `snapshot` as background work of the task.
    pub(crate) fn start(
        snapshot: ChatSession,
        owned: Owned,
        auto_tool_call: bool,
        span: tracing::Span,
        work: &BackgroundWork,
    ) -> Result<Self, Errno> {
        if !snapshot.guest_tools.is_empty() {
            tracing::info!(parent: &span, "cchat_send: a nonblocking send cannot run guest tools; clear O_NONBLOCK (spear_fd_ctl) or register MCP tools only");
            return Err(Errno::EINVAL);
        }
        let session_fd = owned.session_fd;
        let budget = owned.budget.clone();
        let send = async move {
            let ctx = SendContext {
                task_id: &owned.task_id,
                session_fd: owned.session_fd,
                mcp: &owned.mcp,
                backends: &owned.chat.backends,
                metrics: &owned.chat.metrics,
                deadline: owned.deadline,
                budget: &owned.budget,
                tool_cache: &owned.chat.tool_cache,
            };
            let mut no_guest_tools = NoGuestTools;
            let sent = run::send(&snapshot, &ctx, &mut no_guest_tools, auto_tool_call);
            let outcome =
                before_deadline(owned.deadline, tracing::Instrument::instrument(sent, span))
                    .await
                    .and_then(|outcome| outcome);
            if let Err(HostcallError::Errno(Errno::ENOMEM)) = &outcome {
                owned.chat.metrics.budget_hit("host_memory");
            }
            outcome
        };
        Ok(Self {
            session_fd,
            work: Some(work.spawn(&budget, send)?),
            ended: None,
        })
    }

    /// How the send ended, moved out of its work (which is dropped then); `None` while it
    /// runs.
    fn ended(&mut self) -> Option<&Result<SendOutcome, Errno>> {
        if let Some(work) = &mut self.work {
            self.ended = Some(match work.take() {
                Err(Errno::EAGAIN) => return None,
                Ok(Ok(outcome)) => Ok(outcome),
                Ok(Err(HostcallError::Errno(errno))) | Err(errno) => Err(errno),
                // Only the deadline, which ends the task anyway.
                Ok(Err(HostcallError::Trap(_))) => Err(Errno::ETIMEDOUT),
            });
            self.work = None;
        }
        self.ended.as_ref()
    }

    /// `epoll_events` bits: IN once the send ended, with ERR if it failed.
    pub(crate) fn readiness(&mut self) -> i32 {
        match self.ended() {
            None => 0,
            Some(Ok(_)) => IN,
            Some(Err(_)) => IN | ERR,
        }
    }
}

/// Whether the session at `session_fd` has a nonblocking send in flight or unread: its
/// response fd is open and not settled yet.
pub(crate) fn unread<K>(fds: &mut FdTable<K>, session_fd: i32) -> Result<bool, Errno>
where
    K: FdKindOf<ChatResponse> + FdKindOf<ChatSession>,
{
    let Some(response_fd) = fds.get_as::<ChatSession>(session_fd)?.sending else {
        return Ok(false);
    };
    Ok(fds
        .get_as::<ChatResponse>(response_fd)
        .is_ok_and(|response| response.pending.is_some()))
}

/// Settles the response at `fd` if a nonblocking send made it: `-EAGAIN` while the send
/// runs, its errno if it failed; once it ended, the response holds its answer and its
/// session (if still open) the messages it added.
pub(crate) fn settle<K>(fds: &mut FdTable<K>, fd: i32) -> Result<(), Errno>
where
    K: FdKindOf<ChatResponse> + FdKindOf<ChatSession>,
{
    let response = fds.get_as::<ChatResponse>(fd)?;
    let Some(pending) = response.pending.as_mut() else {
        return Ok(());
    };
    let session_fd = pending.session_fd;
    match pending.ended() {
        None => return Err(Errno::EAGAIN),
        Some(Err(errno)) => return Err(*errno),
        Some(Ok(_)) => {}
    }
    let Some(Ok(outcome)) = pending.ended.take() else {
        return Err(Errno::EIO);
    };
    // The session first: a send whose turn the session cannot take failed, as a blocking
    // send does, rather than its answer being read without its turn in the history.
    if let Ok(session) = fds.get_as::<ChatSession>(session_fd)
        && let Err(errno) = session.append_messages(outcome.added, outcome.added_charge)
    {
        if let Some(pending) = fds.get_as::<ChatResponse>(fd)?.pending.as_mut() {
            pending.ended = Some(Err(errno));
        }
        return Err(errno);
    }
    *fds.get_as::<ChatResponse>(fd)? = outcome.response;
    Ok(())
}
