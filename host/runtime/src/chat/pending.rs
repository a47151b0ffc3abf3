//! Nonblocking sends: `cchat_send` on a session with `O_NONBLOCK` returns its response fd
//! at once, and the send (with its whole tool-call loop) runs as the task's background
//! work, owned by that fd. `cchat_recv` answers `-EAGAIN` until it ends, the response fd
//! reports EPOLLIN then, and the first read settles it: the response takes the answer and
//! the session the messages the send added, as a blocking send does when it returns.
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
    work: Background<Result<SendOutcome, HostcallError>>,
    /// Why the send failed, once a read found out.
    failed: Option<Errno>,
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
            .field("failed", &self.failed)
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
            work: work.spawn(&budget, send)?,
            failed: None,
        })
    }

    /// `epoll_events` bits: IN once the send ended, with ERR once a read found it failed.
    pub(crate) fn readiness(&mut self) -> i32 {
        match self.failed {
            Some(_) => IN | ERR,
            None if self.work.is_done() => IN,
            None => 0,
        }
    }
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
    if let Some(errno) = pending.failed {
        return Err(errno);
    }
    let outcome = match pending.work.take() {
        Ok(Ok(outcome)) => outcome,
        Err(Errno::EAGAIN) => return Err(Errno::EAGAIN),
        Ok(Err(HostcallError::Errno(errno))) | Err(errno) => {
            pending.failed = Some(errno);
            return Err(errno);
        }
        // Only the deadline, which ends the task anyway.
        Ok(Err(HostcallError::Trap(_))) => {
            pending.failed = Some(Errno::ETIMEDOUT);
            return Err(Errno::ETIMEDOUT);
        }
    };
    let session_fd = pending.session_fd;
    *response = outcome.response;
    if let Ok(session) = fds.get_as::<ChatSession>(session_fd) {
        session.append_messages(outcome.added, outcome.added_charge)?;
    }
    Ok(())
}
