//! The `cchat_*` hostcalls: chat sessions, the send that runs the tool-call loop, and the
//! guest side of guest tools (the funcref table and the tool arena).
//!
//! Each hostcall opens a span named after itself. The session layer of policy is decided
//! when a param is set ([`ChatSession::set_param`] only narrows the task's MCP settings);
//! which tools a send may offer and run is decided by the loop through the policy module.
//! Whatever a hostcall makes the host hold is charged to the task's memory budget first:
//! guest JSON before it is parsed, copies before they are made; at the limit the call is
//! `-ENOMEM` and the session is as it was.

use quiver_abi::Errno;
use quiver_abi::ctl::{ADD_MESSAGE, GET_MESSAGES, GET_METRICS, SET_PARAM};
use quiver_abi::send_flags;
use wasmtime::{Caller, Linker};

use super::guest_tools::CallerTools;
use super::message::Message;
use super::params::{ParamArg, shown};
use super::pending::{self, Owned, PendingSend};
use super::session::{ChatResponse, ChatSession, ChatView, SetParamError};
use super::{GuestTool, ParamError, ROLES, SendContext, run};
use crate::sandbox::{HostcallError, before_deadline, finish, guest, heap, is_guest_callback};

/// Registers the `cchat_*` imports.
pub fn add_to_linker<T: ChatView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap("spear", "cchat_create", |mut caller: Caller<'_, T>| {
        finish(create(&mut caller))
    })?;
    linker.func_wrap(
        "spear",
        "cchat_write_msg",
        |mut caller: Caller<'_, T>,
         fd: i32,
         role_ptr: i32,
         role_len: i32,
         content_ptr: i32,
         content_len: i32| {
            finish(write_msg(
                &mut caller,
                fd,
                (role_ptr, role_len),
                (content_ptr, content_len),
            ))
        },
    )?;
    linker.func_wrap(
        "spear",
        "cchat_write_fn",
        |mut caller: Caller<'_, T>, fd: i32, fn_offset: i32, json_ptr: i32, json_len: i32| {
            finish(write_fn(&mut caller, fd, fn_offset, json_ptr, json_len))
        },
    )?;
    linker.func_wrap(
        "spear",
        "cchat_ctl",
        |mut caller: Caller<'_, T>, fd: i32, cmd: i32, arg_ptr: i32, arg_len_ptr: i32| {
            finish(ctl(&mut caller, fd, cmd, arg_ptr, arg_len_ptr))
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "cchat_send",
        |mut caller: Caller<'_, T>, (fd, flags): (i32, i32)| {
            Box::new(async move { finish(send(&mut caller, fd, flags).await) })
        },
    )?;
    linker.func_wrap(
        "spear",
        "cchat_recv",
        |mut caller: Caller<'_, T>, fd: i32, out_ptr: i32, out_len_ptr: i32| {
            finish(recv(&mut caller, fd, out_ptr, out_len_ptr))
        },
    )?;
    linker.func_wrap(
        "spear",
        "cchat_close",
        |mut caller: Caller<'_, T>, fd: i32| finish(close(&mut caller, fd)),
    )?;
    Ok(())
}

fn session<T: ChatView>(state: &mut T, fd: i32) -> Result<&mut ChatSession, Errno> {
    state.sandbox().fds.get_as::<ChatSession>(fd)
}

fn response<T: ChatView>(state: &mut T, fd: i32) -> Result<&mut ChatResponse, Errno> {
    state.sandbox().fds.get_as::<ChatResponse>(fd)
}

fn create<T: ChatView>(caller: &mut Caller<'_, T>) -> Result<i32, HostcallError> {
    let state = caller.data_mut();
    let budget = state.sandbox().budget.clone();
    let session = ChatSession::new(&state.mcp().policy, &budget);
    let sandbox = state.sandbox();
    let _span = tracing::debug_span!("cchat_create", task_id = %sandbox.task_id).entered();
    Ok(sandbox.fds.insert_as(session)?)
}

fn write_msg<T: ChatView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    role: (i32, i32),
    content: (i32, i32),
) -> Result<i32, HostcallError> {
    let (mem, state) = guest(caller)?;
    let _span =
        tracing::trace_span!("cchat_write_msg", task_id = %state.sandbox().task_id, fd).entered();
    let role = mem.str(role.0, role.1)?;
    let content = mem.str(content.0, content.1)?;
    let budget = state.sandbox().budget.clone();
    let session = session(state, fd)?;
    if !ROLES.contains(&role) {
        return Err(Errno::EINVAL.into());
    }
    let mut charge = budget.empty("chat message");
    let message = Message::text(role, content, &mut charge)?;
    session.push_message(message, charge)?;
    Ok(0)
}

fn write_fn<T: ChatView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    fn_offset: i32,
    json_ptr: i32,
    json_len: i32,
) -> Result<i32, HostcallError> {
    let task_id = caller.data_mut().sandbox().task_id.clone();
    let _span = tracing::debug_span!("cchat_write_fn", task_id = %task_id, fd, fn_offset).entered();
    let mut tool = {
        let (mem, state) = guest(caller)?;
        let budget = state.sandbox().budget.clone();
        session(state, fd)?;
        let text = mem.str(json_ptr, json_len)?;
        let last = &state.chat().last_tool;
        match last.reuse(text.as_bytes()) {
            Some(tool) => tool,
            None => {
                let (definition, _input) = budget
                    .parse_json("guest tool", text.as_bytes())
                    .map_err(|errno| match errno {
                        // A definition that is not JSON is a bad definition, as in SPEAR.
                        Errno::EIO => {
                            tracing::info!("cchat_write_fn: the tool definition is not JSON");
                            Errno::EINVAL
                        }
                        other => other,
                    })?;
                let tool = GuestTool::from_json(0, definition).map_err(|reason| {
                    tracing::info!(%reason, "cchat_write_fn: refused tool definition");
                    Errno::EINVAL
                })?;
                last.keep(text.as_bytes(), &tool, &budget);
                tool
            }
        }
    };
    let table_index = u32::try_from(fn_offset).map_err(|_| Errno::EINVAL)?;
    tool.table_index = table_index;
    if !is_guest_callback(caller, table_index) {
        tracing::info!(
            table_index,
            "cchat_write_fn: no function of type (i32, i32, i32, i32) -> i32 at this table index"
        );
        return Err(Errno::EINVAL.into());
    }
    session(caller.data_mut(), fd)?.add_guest_tool(tool)?;
    Ok(0)
}

fn ctl<T: ChatView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    cmd: i32,
    arg_ptr: i32,
    arg_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let task_id = state.sandbox().task_id.clone();
    let budget = state.sandbox().budget.clone();
    let _span = tracing::debug_span!("cchat_ctl", task_id = %task_id, fd, cmd).entered();
    match cmd {
        SET_PARAM => {
            let input = mem.bytes_at_len_ptr(arg_ptr, arg_len_ptr)?;
            let (ParamArg { key, value }, _input) =
                budget.parse_json_as("SET_PARAM input", input)?;
            let mcp = state.mcp().clone();
            let set = session(state, fd)?.set_param(&key, value, &mcp.policy);
            set.map_err(|error| match error {
                SetParamError::Param(ParamError::Invalid(reason)) => {
                    tracing::info!(task_id = %task_id, fd, key = %shown(&key), %reason, "SET_PARAM refused");
                    Errno::EINVAL
                }
                SetParamError::Param(ParamError::Denied(reason)) => {
                    tracing::info!(task_id = %task_id, fd, key = %shown(&key), %reason, "SET_PARAM denied by policy");
                    Errno::EACCES
                }
                SetParamError::Budget(errno) => errno,
            })?;
            Ok(0)
        }
        ADD_MESSAGE => {
            let input = mem.bytes_at_len_ptr(arg_ptr, arg_len_ptr)?;
            let (message, mut charge) = budget.parse_json("chat message", input)?;
            let valid_role = message["role"]
                .as_str()
                .is_some_and(|role| ROLES.contains(&role));
            if !message.is_object() || !valid_role {
                return Err(Errno::EINVAL.into());
            }
            let message = Message::from_value(message, &mut charge)?;
            session(state, fd)?.push_message(message, charge)?;
            Ok(0)
        }
        GET_METRICS => {
            let out = mem.out_buf(arg_ptr, arg_len_ptr)?;
            pending::settle(&mut state.sandbox().fds, fd)?;
            let metrics = response(state, fd)?.metrics().unwrap_or_default();
            Ok(mem.deliver(out, &metrics)?)
        }
        GET_MESSAGES => {
            let out = mem.out_buf(arg_ptr, arg_len_ptr)?;
            let messages = &session(state, fd)?.messages;
            let len = heap::json_len(messages);
            let _copy = budget.charge("GET_MESSAGES copy", heap::alloc(len))?;
            let mut bytes = Vec::with_capacity(usize::try_from(len).map_err(|_| Errno::ENOMEM)?);
            serde_json::to_writer(&mut bytes, messages).map_err(|_| Errno::EIO)?;
            Ok(mem.deliver(out, &bytes)?)
        }
        _ => Err(Errno::EINVAL.into()),
    }
}

async fn send<T: ChatView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    flags: i32,
) -> Result<i32, HostcallError> {
    if flags & !send_flags::KNOWN != 0 {
        return Err(Errno::EINVAL.into());
    }
    let state = caller.data_mut();
    if pending::unread(&mut state.sandbox().fds, fd)? {
        tracing::info!(task_id = %state.sandbox().task_id, fd, "cchat_send: the session's last nonblocking send is still in flight or unread; read its response (cchat_recv) or close it first");
        return Err(Errno::EAGAIN.into());
    }
    // Shares the session's content: a guest tool may write or close the session meanwhile.
    let snapshot = session(state, fd)?.snapshot();
    let (mcp, chat) = (state.mcp().clone(), state.chat().clone());
    let sandbox = state.sandbox();
    if sandbox.fds.is_full() {
        return Err(Errno::EMFILE.into());
    }
    let (task_id, deadline) = (sandbox.task_id.clone(), sandbox.deadline);
    let budget = sandbox.budget.clone();
    let span = tracing::info_span!("cchat_send", task_id = %task_id, fd, flags);
    let auto = flags & send_flags::AUTO_TOOL_CALL != 0;
    if sandbox.fds.nonblocking(fd)? {
        let owned = Owned {
            task_id,
            session_fd: fd,
            mcp,
            chat,
            deadline,
            budget: budget.clone(),
        };
        // The fd first: nothing is sent unless the guest gets it.
        let room = sandbox.fds.vacant()?;
        let send = PendingSend::start(snapshot, owned, auto, span, &sandbox.work)?;
        let response_fd = room.insert_as(ChatResponse::pending(send, &budget));
        session(state, fd)?.sending = Some(response_fd);
        return Ok(response_fd);
    }
    let send_ctx = SendContext {
        task_id: &task_id,
        session_fd: fd,
        mcp: &mcp,
        backends: &chat.backends,
        metrics: &chat.metrics,
        deadline,
        budget: &budget,
        tool_cache: &chat.tool_cache,
    };
    let settings = &snapshot.settings;
    let mut tools = CallerTools {
        caller: &mut *caller,
        arena: settings.tool_arena_ptr.zip(settings.tool_arena_len),
        max_output: settings.max_tool_output_bytes,
        budget: budget.clone(),
    };
    let outcome = before_deadline(
        deadline,
        tracing::Instrument::instrument(run::send(&snapshot, &send_ctx, &mut tools, auto), span),
    )
    .await?;
    if let Err(HostcallError::Errno(Errno::ENOMEM)) = &outcome {
        chat.metrics.budget_hit("host_memory");
    }
    let outcome = outcome?;
    drop(snapshot);
    let fds = &mut caller.data_mut().sandbox().fds;
    let response_fd = fds.insert_as(outcome.response)?;
    // A guest tool may have closed the session meanwhile; then there is nothing to update.
    if let Ok(session) = fds.get_as::<ChatSession>(fd)
        && let Err(errno) = session.append_messages(outcome.added, outcome.added_charge)
    {
        let _ = fds.remove(response_fd);
        return Err(errno.into());
    }
    Ok(response_fd)
}

fn recv<T: ChatView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let _span =
        tracing::debug_span!("cchat_recv", task_id = %state.sandbox().task_id, fd).entered();
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    pending::settle(&mut state.sandbox().fds, fd)?;
    let body = &response(state, fd)?.body;
    Ok(mem.deliver(out, body)?)
}

fn close<T: ChatView>(caller: &mut Caller<'_, T>, fd: i32) -> Result<i32, HostcallError> {
    let fds = &mut caller.data_mut().sandbox().fds;
    let _span = tracing::debug_span!("cchat_close", fd).entered();
    if fds.get_as::<ChatSession>(fd).is_err() {
        fds.get_as::<ChatResponse>(fd)?;
    }
    fds.remove(fd)?;
    Ok(0)
}
