//! MCP tool calls in flight: `mcp_call_start` starts a call of a tool on an MCP session fd
//! and returns a call fd at once; `mcp_call_recv` reads the answer with the output buffer
//! protocol (`-EAGAIN` until it is there), as often as the guest likes; `mcp_close` on the
//! call fd ends it. The call fd reports EPOLLIN once the answer is there, so a guest can
//! wait for several calls at once with `spear_epoll_wait`.
//!
//! A started call goes through the same gate as `mcp_call_tool`: the fd's policy is decided
//! before the call fd exists (a denial is `-EACCES`, reported to the observers), and the
//! call runs [`call::run`] (pins, approvals, observers, audit, the pool's budgets) as the
//! task's background work, never past its deadline. Closing the call fd, or the task
//! ending, drops the call, and rmcp tells the server (`notifications/cancelled`; a call the
//! server runs as a task gets `tasks/cancel`, see the pool's `tasks`). Calls in
//! flight count against the task's background work and its memory budget; the answer is
//! charged when it arrives and given back when the call fd is closed. A task holds at most
//! [`defaults::IN_FLIGHT_SERVER_SHARE`]'s share of one server's `max_concurrency` with
//! calls in flight ([`PerServer`]), so it cannot take every permit other tasks share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quiver_abi::Errno;
use quiver_abi::epoll_events::{ERR, IN};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;
use wasmtime::{Caller, Linker};

use super::call::{self, Ended, Origin};
use super::hostcalls::{encode, parse_arguments};
use super::session::{McpSession, McpView};
use crate::defaults;
use crate::observe::Via;
use crate::registry::ServerEntry;
use crate::sandbox::{Background, Charge, HostcallError, finish, guest, heap, off_stack};

/// An answer, and what holding it costs.
type Answer = (Vec<u8>, Charge);

/// A call fd: the call running, then its answer (or why there is none).
pub struct McpCall {
    /// The call while it runs, with its place in the task's share of the server; dropped
    /// once its end is in `answer`, which frees both.
    work: Option<(Background<Result<Answer, Errno>>, OwnedSemaphorePermit)>,
    answer: Option<Result<Answer, Errno>>,
}

/// A task's calls in flight per server: each server's share, made on the first call.
#[derive(Debug, Default)]
pub(crate) struct PerServer(Mutex<HashMap<String, Arc<Semaphore>>>);

impl PerServer {
    /// A place for one more call to `entry`'s server; `-EAGAIN` when the task holds its
    /// share of the server's `max_concurrency` already.
    fn place(&self, entry: &ServerEntry) -> Result<OwnedSemaphorePermit, Errno> {
        let share = (entry.record.budgets.max_concurrency / defaults::IN_FLIGHT_SERVER_SHARE).max(1)
            as usize;
        let mut shares = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let share = shares
            .entry(entry.server_id().to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(share)))
            .clone();
        drop(shares);
        share.try_acquire_owned().map_err(|_| {
            tracing::info!("mcp_call_start: the task has its share of the server's budgets.max_concurrency in flight already; wait for a call to end");
            Errno::EAGAIN
        })
    }
}

impl McpCall {
    /// Moves the call's end into the fd once it is there; false while it runs.
    fn settle(&mut self) -> bool {
        let Some((work, _)) = &mut self.work else {
            return true;
        };
        self.answer = match work.take() {
            Err(Errno::EAGAIN) => return false,
            Ok(answer) => Some(answer),
            Err(errno) => Some(Err(errno)),
        };
        self.work = None;
        true
    }

    /// `epoll_events` bits: IN once the answer is there, with ERR if the call has none.
    pub(crate) fn readiness(&mut self) -> i32 {
        match self.settle() {
            false => 0,
            true if matches!(self.answer, Some(Err(_))) => IN | ERR,
            true => IN,
        }
    }
}

pub(super) fn add_to_linker<T: McpView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "spear",
        "mcp_call_start",
        |mut caller: Caller<'_, T>,
         fd: i32,
         name_ptr: i32,
         name_len: i32,
         args_ptr: i32,
         args_len: i32| {
            finish(start(
                &mut caller,
                fd,
                (name_ptr, name_len),
                (args_ptr, args_len),
            ))
        },
    )?;
    linker.func_wrap(
        "spear",
        "mcp_call_recv",
        |mut caller: Caller<'_, T>, fd: i32, out_ptr: i32, out_len_ptr: i32| {
            finish(recv(&mut caller, fd, out_ptr, out_len_ptr))
        },
    )?;
    Ok(())
}

fn start<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    name: (i32, i32),
    args: (i32, i32),
) -> Result<i32, HostcallError> {
    let (mem, state) = guest(caller)?;
    let mcp = state.mcp().clone();
    let sandbox = state.sandbox();
    let (task_id, deadline, budget) = (
        sandbox.task_id.clone(),
        sandbox.deadline,
        sandbox.budget.clone(),
    );
    let span = tracing::info_span!("mcp_call_start", task_id = %task_id, fd, server_id = tracing::field::Empty, name = tracing::field::Empty);
    let _entered = span.enter();
    if usize::try_from(name.1).is_ok_and(|len| len > defaults::MAX_TOOL_NAME_BYTES) {
        return Err(Errno::EINVAL.into());
    }
    let name = mem.str(name.0, name.1)?;
    let raw = mem.bytes(args.0, args.1)?;
    if sandbox.fds.is_full() {
        return Err(Errno::EMFILE.into());
    }
    let grant = sandbox.fds.get_as::<McpSession>(fd)?.grant.clone();
    span.record("server_id", grant.entry.server_id());
    span.record("name", name);
    let origin = Origin {
        task_id,
        session_fd: Some(fd),
        via: Via::McpCall,
        deadline,
        // Its questions go to the host's elicitor: the guest is not waiting in a hostcall
        // that could call it back.
        to_guest: None,
    };
    let approval = call::check(&mcp, &origin, &grant, name).map_err(|_| Errno::EACCES)?;
    let place = mcp.in_flight.place(&grant.entry)?;
    // The call keeps copies of the name and the arguments while it runs.
    let copies = budget.charge(
        "mcp_call_start",
        heap::string(name.len() as u64).saturating_add(heap::alloc(raw.len() as u64)),
    )?;
    let arguments = parse_arguments(raw, &budget)?;
    let (name, raw) = (name.to_owned(), raw.to_vec());
    let answer_budget = budget.clone();
    drop(_entered);
    let work = async move {
        let _copies = copies;
        let (arguments, _arguments_charge) = match arguments {
            Ok(arguments) => arguments,
            Err(error) => return Ok(encode(&error.to_json())),
        };
        let entry = &grant.entry;
        // Boxed apart (`off_stack`): this work is built on the task's fiber stack when it is
        // spawned, so its own future stays small.
        let ended =
            off_stack(|| call::run(&mcp, &origin, entry, &name, approval, arguments, &raw)).await;
        Ok(match ended.map_err(|_| Errno::ETIMEDOUT)? {
            Ended::Answered(output) => output.json,
            Ended::Failed { json, .. } => json,
            Ended::Refused(refusal) => {
                encode(&call::refused(entry.server_id(), &name, &refusal).to_json())
            }
        })
    };
    let work = async move {
        let json = work.await?;
        let charge =
            answer_budget.charge("mcp call answer", heap::alloc(json.capacity() as u64))?;
        Ok((json, charge))
    };
    let sandbox = caller.data_mut().sandbox();
    // The fd first: nothing is called unless the guest gets it.
    let room = sandbox.fds.vacant()?;
    let work = sandbox.work.spawn(&budget, work.instrument(span.clone()))?;
    let call_fd = room.insert_as(McpCall {
        work: Some((work, place)),
        answer: None,
    });
    span.in_scope(|| tracing::debug!(call_fd, "started"));
    Ok(call_fd)
}

fn recv<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let sandbox = state.sandbox();
    let _span = tracing::debug_span!("mcp_call_recv", task_id = %sandbox.task_id, fd).entered();
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    let call = sandbox.fds.get_as::<McpCall>(fd)?;
    if !call.settle() {
        return Err(Errno::EAGAIN.into());
    }
    match &call.answer {
        Some(Ok((json, _))) => Ok(mem.deliver(out, json)?),
        Some(Err(errno)) => Err((*errno).into()),
        None => Err(Errno::EIO.into()),
    }
}
