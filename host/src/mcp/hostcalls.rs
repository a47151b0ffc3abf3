//! The `mcp_*` hostcalls: registry views and sessions on pooled MCP connections.
//!
//! Each hostcall opens a span named after itself and decides policy before any work:
//! `mcp_open` and `mcp_registry_get` through [`McpTask::decide_server`] (the listing through
//! [`McpTask::lists`]), every list and call through the fd's
//! [`Grant`](crate::policy::Grant) (its tool filter, and for calls
//! [`Grant::check_call`](crate::policy::Grant::check_call), which adds the approval policy;
//! a call needing approval waits for the host's [approver](crate::approval)). A result that
//! does not fit the guest's buffer stays on the fd and is handed
//! back on the retry, so a retry never runs the tool twice. Kept results and a call's
//! arguments are charged to the task's memory budget; when it cannot hold them the call is
//! `-ENOMEM`.

use std::time::SystemTime;

use quiver_abi::Errno;
use serde_json::{Value, json};
use tracing::Instrument;
use tracing::field::Empty;
use wasmtime::{Caller, Linker};

use super::session::{McpSession, McpView, PendingKey};
use super::{McpError, McpErrorCode};
use crate::approval::AskFor;
use crate::defaults;
use crate::observe::{ArgumentsSummary, PolicyDenial, ToolCall, ToolKind, ToolOutcome, Via};
use crate::policy::Approval;
use crate::sandbox::{
    Charge, GuestMemory, HostcallError, MemoryBudget, OutBuf, before_deadline, finish, guest, heap,
};

/// Registers the `mcp_*` imports.
pub fn add_to_linker<T: McpView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "spear",
        "mcp_open",
        |mut caller: Caller<'_, T>, ptr: i32, len: i32| finish(open(&mut caller, ptr, len)),
    )?;
    linker.func_wrap(
        "spear",
        "mcp_close",
        |mut caller: Caller<'_, T>, fd: i32| finish(close(&mut caller, fd)),
    )?;
    linker.func_wrap(
        "spear",
        "mcp_registry_list",
        |mut caller: Caller<'_, T>, out_ptr: i32, out_len_ptr: i32| {
            finish(registry_list(&mut caller, out_ptr, out_len_ptr))
        },
    )?;
    linker.func_wrap(
        "spear",
        "mcp_registry_get",
        |mut caller: Caller<'_, T>, ptr: i32, len: i32, out_ptr: i32, out_len_ptr: i32| {
            finish(registry_get(&mut caller, ptr, len, out_ptr, out_len_ptr))
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_list_tools",
        |mut caller: Caller<'_, T>, (fd, out_ptr, out_len_ptr): (i32, i32, i32)| {
            Box::new(async move { finish(list_tools(&mut caller, fd, out_ptr, out_len_ptr).await) })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_call_tool",
        |mut caller: Caller<'_, T>,
         (fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
        )| {
            Box::new(async move {
                let call = CallArgs {
                    fd,
                    name_ptr,
                    name_len,
                    args_ptr,
                    args_len,
                    out_ptr,
                    out_len_ptr,
                };
                finish(call_tool(&mut caller, call).await)
            })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_list_resources",
        |mut caller: Caller<'_, T>, (fd, out_ptr, out_len_ptr): (i32, i32, i32)| {
            Box::new(async move {
                finish(
                    list_resources(&mut caller, fd, Listing::Resources, out_ptr, out_len_ptr).await,
                )
            })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_list_resource_templates",
        |mut caller: Caller<'_, T>, (fd, out_ptr, out_len_ptr): (i32, i32, i32)| {
            Box::new(async move {
                finish(
                    list_resources(&mut caller, fd, Listing::Templates, out_ptr, out_len_ptr).await,
                )
            })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_read_resource",
        |mut caller: Caller<'_, T>,
         (fd, uri_ptr, uri_len, out_ptr, out_len_ptr): (i32, i32, i32, i32, i32)| {
            Box::new(async move {
                finish(
                    read_resource(&mut caller, fd, (uri_ptr, uri_len), out_ptr, out_len_ptr).await,
                )
            })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_list_prompts",
        |mut caller: Caller<'_, T>, (fd, out_ptr, out_len_ptr): (i32, i32, i32)| {
            Box::new(async move {
                finish(
                    list_resources(&mut caller, fd, Listing::Prompts, out_ptr, out_len_ptr).await,
                )
            })
        },
    )?;
    linker.func_wrap_async(
        "spear",
        "mcp_get_prompt",
        |mut caller: Caller<'_, T>,
         (fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
        )| {
            Box::new(async move {
                let call = CallArgs {
                    fd,
                    name_ptr,
                    name_len,
                    args_ptr,
                    args_len,
                    out_ptr,
                    out_len_ptr,
                };
                finish(get_prompt(&mut caller, call).await)
            })
        },
    )?;
    Ok(())
}

fn session<T: McpView>(state: &mut T, fd: i32) -> Result<&mut McpSession, Errno> {
    state.sandbox().fds.get_as::<McpSession>(fd)
}

fn open<T: McpView>(caller: &mut Caller<'_, T>, ptr: i32, len: i32) -> Result<i32, HostcallError> {
    let (mem, state) = guest(caller)?;
    let task_id = state.sandbox().task_id.clone();
    let span = tracing::debug_span!("mcp_open", task_id = %task_id, server_id = Empty).entered();
    let server_id = server_id_arg(&mem, ptr, len)?;
    span.record("server_id", server_id);
    let grant = state.mcp().decide_server(&task_id, "mcp_open", server_id)?;
    let fd = state.sandbox().fds.insert_as(McpSession::new(grant))?;
    tracing::debug!(fd, "opened");
    Ok(fd)
}

fn close<T: McpView>(caller: &mut Caller<'_, T>, fd: i32) -> Result<i32, HostcallError> {
    let sandbox = caller.data_mut().sandbox();
    let _span = tracing::debug_span!("mcp_close", task_id = %sandbox.task_id, fd).entered();
    sandbox.fds.get_as::<McpSession>(fd)?;
    sandbox.fds.remove(fd)?;
    Ok(0)
}

fn registry_list<T: McpView>(
    caller: &mut Caller<'_, T>,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let task_id = state.sandbox().task_id.clone();
    let _span = tracing::debug_span!("mcp_registry_list", task_id = %task_id).entered();
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    let mcp = state.mcp();
    let servers: Vec<_> = mcp
        .registry
        .servers()
        .filter(|entry| mcp.lists(entry.server_id()))
        .map(|entry| entry.view())
        .collect();
    let body = json!({"revision": mcp.registry.revision(), "servers": servers});
    Ok(mem.deliver(out, &encode(&body))?)
}

fn registry_get<T: McpView>(
    caller: &mut Caller<'_, T>,
    ptr: i32,
    len: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    let task_id = state.sandbox().task_id.clone();
    let span =
        tracing::debug_span!("mcp_registry_get", task_id = %task_id, server_id = Empty).entered();
    let server_id = server_id_arg(&mem, ptr, len)?;
    span.record("server_id", server_id);
    let out = mem.out_buf(out_ptr, out_len_ptr)?;
    let mcp = state.mcp();
    let entry = mcp.registry.get(server_id).ok_or(Errno::ENOENT)?;
    match mcp.decide_server(&task_id, "mcp_registry_get", server_id) {
        Ok(_) | Err(Errno::ENOTCONN) => Ok(mem.deliver(out, &encode(&entry.view()))?),
        Err(errno) => Err(errno.into()),
    }
}

/// A server id from the guest: longer than any registry id is `-EINVAL`, before it is read,
/// so no guest-sized string reaches a log line or an observer.
fn server_id_arg<'a>(mem: &'a GuestMemory<'_>, ptr: i32, len: i32) -> Result<&'a str, Errno> {
    if usize::try_from(len).is_ok_and(|len| len > defaults::MAX_SERVER_ID_BYTES) {
        return Err(Errno::EINVAL);
    }
    mem.str(ptr, len)
}

fn encode(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("host-built JSON values always serialise")
}

/// Hands the fd's kept output back (for the retry of its last request); a retry needs no
/// new memory, so it works even when the budget is spent.
fn deliver_kept(
    mem: &mut GuestMemory<'_>,
    session: &mut McpSession,
    out: OutBuf,
) -> Result<i32, Errno> {
    let delivered = mem.deliver(out, session.kept_output());
    if delivered.is_ok() {
        session.clear_output();
    }
    delivered
}

/// Delivers fresh output; if it does not fit, keeps it on the fd for the retry, or is
/// `-ENOMEM` when the task's budget cannot hold it (the needed length is still reported).
fn deliver_fresh<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    key: PendingKey,
    out: OutBuf,
    bytes: Vec<u8>,
) -> Result<i32, HostcallError> {
    let (mut mem, state) = guest(caller)?;
    match mem.deliver(out, &bytes) {
        Err(Errno::ENOSPC) => {
            let budget = state.sandbox().budget.clone();
            // The fd cannot have been closed meanwhile: the guest was waiting on us.
            if let Ok(session) = session(state, fd) {
                session.keep_output(key, bytes, &budget)?;
            }
            Err(Errno::ENOSPC.into())
        }
        other => Ok(other?),
    }
}

fn list_errno(error: &McpError) -> Errno {
    match error.code {
        McpErrorCode::Unavailable => Errno::ENOTCONN,
        McpErrorCode::Timeout => Errno::ETIMEDOUT,
        _ => Errno::EIO,
    }
}

async fn list_tools<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mcp, task_id, deadline, grant, out) = {
        let (mut mem, state) = guest(caller)?;
        let out = mem.out_buf(out_ptr, out_len_ptr)?;
        let mcp = state.mcp().clone();
        let (task_id, deadline) = (state.sandbox().task_id.clone(), state.sandbox().deadline);
        let session = session(state, fd)?;
        if session.keeps_output_for(|key| *key == PendingKey::ListTools) {
            return Ok(deliver_kept(&mut mem, session, out)?);
        }
        session.clear_output();
        (mcp, task_id, deadline, session.grant.clone(), out)
    };
    let server_id = grant.entry.server_id();
    let span = tracing::debug_span!("mcp_list_tools", task_id = %task_id, fd, server_id);
    let listed =
        before_deadline(deadline, mcp.pool.list_tools(&grant.entry).instrument(span)).await?;
    let tools = listed.map_err(|error| {
        tracing::warn!(task_id = %task_id, server_id, %error, "tools/list failed");
        list_errno(&error)
    })?;
    // Serialised straight from the pool's cached tools: no intermediate JSON value.
    #[derive(serde::Serialize)]
    struct Listing<'a> {
        server_id: &'a str,
        tools: Vec<&'a super::Tool>,
    }
    let tools = tools
        .iter()
        .filter(|tool| grant.tools.permits(&tool.name))
        .collect();
    let body = encode(&Listing { server_id, tools });
    deliver_fresh(caller, fd, PendingKey::ListTools, out, body)
}

/// Which listing `mcp_list_resources`, `mcp_list_resource_templates` or `mcp_list_prompts`
/// asks for.
#[derive(Clone, Copy)]
enum Listing {
    Resources,
    Templates,
    Prompts,
}

/// A listing of resources or templates, filtered by the registry's `allowed_resources`
/// (a template by its `uriTemplate` text), or of prompts, filtered by `allowed_prompts`;
/// errors are errnos as for `mcp_list_tools`.
async fn list_resources<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    listing: Listing,
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let key = match listing {
        Listing::Resources => PendingKey::ListResources,
        Listing::Templates => PendingKey::ListResourceTemplates,
        Listing::Prompts => PendingKey::ListPrompts,
    };
    let (mcp, task_id, deadline, grant, out) = {
        let (mut mem, state) = guest(caller)?;
        let out = mem.out_buf(out_ptr, out_len_ptr)?;
        let mcp = state.mcp().clone();
        let (task_id, deadline) = (state.sandbox().task_id.clone(), state.sandbox().deadline);
        let session = session(state, fd)?;
        if session.keeps_output_for(|kept| *kept == key) {
            return Ok(deliver_kept(&mut mem, session, out)?);
        }
        session.clear_output();
        (mcp, task_id, deadline, session.grant.clone(), out)
    };
    let server_id = grant.entry.server_id();
    let body = match listing {
        Listing::Resources => {
            let span =
                tracing::debug_span!("mcp_list_resources", task_id = %task_id, fd, server_id);
            let listed = before_deadline(deadline, mcp.pool.list_resources(&grant.entry))
                .instrument(span)
                .await?;
            let resources = listed.map_err(|error| {
                tracing::warn!(task_id = %task_id, server_id, %error, "resources/list failed");
                list_errno(&error)
            })?;
            let resources: Vec<_> = resources
                .iter()
                .filter(|resource| grant.check_resource(&resource.uri).is_ok())
                .collect();
            encode(&json!({"server_id": server_id, "resources": resources}))
        }
        Listing::Templates => {
            let span = tracing::debug_span!("mcp_list_resource_templates", task_id = %task_id, fd, server_id);
            let listed = before_deadline(deadline, mcp.pool.list_resource_templates(&grant.entry))
                .instrument(span)
                .await?;
            let templates = listed.map_err(|error| {
                tracing::warn!(task_id = %task_id, server_id, %error, "resources/templates/list failed");
                list_errno(&error)
            })?;
            let templates: Vec<_> = templates
                .iter()
                .filter(|template| grant.permits_template(&template.uri_template))
                .collect();
            encode(&json!({"server_id": server_id, "resourceTemplates": templates}))
        }
        Listing::Prompts => {
            let span = tracing::debug_span!("mcp_list_prompts", task_id = %task_id, fd, server_id);
            let listed = before_deadline(deadline, mcp.pool.list_prompts(&grant.entry))
                .instrument(span)
                .await?;
            let prompts = listed.map_err(|error| {
                tracing::warn!(task_id = %task_id, server_id, %error, "prompts/list failed");
                list_errno(&error)
            })?;
            let prompts: Vec<_> = prompts
                .iter()
                .filter(|prompt| grant.check_prompt(&prompt.name).is_ok())
                .collect();
            encode(&json!({"server_id": server_id, "prompts": prompts}))
        }
    };
    deliver_fresh(caller, fd, key, out, body)
}

/// Reads one resource: a URI outside `allowed_resources` is `-EACCES` and a policy denial
/// to observers, as a denied tool call; the server's errors are MCP error objects, as for
/// `mcp_call_tool`.
async fn read_resource<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    (uri_ptr, uri_len): (i32, i32),
    out_ptr: i32,
    out_len_ptr: i32,
) -> Result<i32, HostcallError> {
    let (mcp, task_id, deadline, entry, key, out) = {
        let (mut mem, state) = guest(caller)?;
        let out = mem.out_buf(out_ptr, out_len_ptr)?;
        if usize::try_from(uri_len).is_ok_and(|len| len > defaults::MAX_RESOURCE_URI_BYTES) {
            return Err(Errno::EINVAL.into());
        }
        let uri = mem.str(uri_ptr, uri_len)?;
        let mcp = state.mcp().clone();
        let sandbox = state.sandbox();
        let (task_id, deadline) = (sandbox.task_id.clone(), sandbox.deadline);
        let session = session(state, fd)?;
        let server_id = session.grant.entry.server_id();
        if let Err(denial) = session.grant.check_resource(uri) {
            tracing::info!(task_id = %task_id, hostcall = "mcp_read_resource", server_id, uri, reason = ?denial.reason(), detail = %denial, "denied by policy");
            let event = PolicyDenial::of_tool(
                task_id.clone(),
                fd,
                "mcp_read_resource",
                (server_id, uri),
                denial.reason(),
                denial.to_string(),
            );
            mcp.observers.policy_denied(&event);
            return Err(Errno::EACCES.into());
        }
        if session
            .keeps_output_for(|key| matches!(key, PendingKey::ReadResource { uri: u } if u == uri))
        {
            return Ok(deliver_kept(&mut mem, session, out)?);
        }
        let key = PendingKey::ReadResource {
            uri: uri.to_owned(),
        };
        session.clear_output();
        (
            mcp,
            task_id,
            deadline,
            session.grant.entry.clone(),
            key,
            out,
        )
    };
    let PendingKey::ReadResource { uri } = &key else {
        unreachable!("built above")
    };
    let server_id = entry.server_id();
    let span =
        tracing::info_span!("mcp_read_resource", task_id = %task_id, fd, server_id, uri = %uri);
    let read = before_deadline(deadline, mcp.pool.read_resource(&entry, uri))
        .instrument(span)
        .await?;
    let bytes = read.unwrap_or_else(|error| {
        tracing::info!(task_id = %task_id, server_id, %error, "resources/read failed");
        encode(&error.to_json())
    });
    deliver_fresh(caller, fd, key, out, bytes)
}

/// Gets a prompt: a name outside `allowed_prompts` is `-EACCES` and a policy denial, as
/// for a tool; `args` is a JSON object of strings (empty means `{}`); the server's errors
/// and arguments that are not an object of strings are MCP error objects.
async fn get_prompt<T: McpView>(
    caller: &mut Caller<'_, T>,
    call: CallArgs,
) -> Result<i32, HostcallError> {
    let (mcp, task_id, deadline, budget, entry, key, out) = {
        let (mut mem, state) = guest(caller)?;
        let out = mem.out_buf(call.out_ptr, call.out_len_ptr)?;
        if usize::try_from(call.name_len).is_ok_and(|len| len > defaults::MAX_TOOL_NAME_BYTES) {
            return Err(Errno::EINVAL.into());
        }
        let name = mem.str(call.name_ptr, call.name_len)?;
        let args = mem.bytes(call.args_ptr, call.args_len)?;
        let mcp = state.mcp().clone();
        let sandbox = state.sandbox();
        let (task_id, deadline) = (sandbox.task_id.clone(), sandbox.deadline);
        let budget = sandbox.budget.clone();
        let session = session(state, call.fd)?;
        let server_id = session.grant.entry.server_id();
        if let Err(denial) = session.grant.check_prompt(name) {
            tracing::info!(task_id = %task_id, hostcall = "mcp_get_prompt", server_id, prompt = %name, reason = ?denial.reason(), detail = %denial, "denied by policy");
            let event = PolicyDenial::of_tool(
                task_id.clone(),
                call.fd,
                "mcp_get_prompt",
                (server_id, name),
                denial.reason(),
                denial.to_string(),
            );
            mcp.observers.policy_denied(&event);
            return Err(Errno::EACCES.into());
        }
        if session.keeps_output_for(|key| {
            matches!(key, PendingKey::GetPrompt { name: n, args: a } if n == name && a == args)
        }) {
            return Ok(deliver_kept(&mut mem, session, out)?);
        }
        // As for a tool call: the key and the request each copy the name and arguments.
        let copies = budget.charge(
            "mcp_get_prompt arguments",
            heap::string(name.len() as u64)
                .saturating_add(heap::alloc(args.len() as u64))
                .saturating_mul(2),
        )?;
        let key = PendingKey::GetPrompt {
            name: name.to_owned(),
            args: args.to_vec(),
        };
        session.clear_output();
        (
            mcp,
            task_id,
            deadline,
            (budget, copies),
            session.grant.entry.clone(),
            key,
            out,
        )
    };
    let (budget, _copies) = budget;
    let PendingKey::GetPrompt { name, args } = &key else {
        unreachable!("built above")
    };
    let server_id = entry.server_id();
    let (arguments, _arguments_charge) = match parse_arguments(args, &budget)? {
        Ok((arguments, _)) if arguments.values().any(|v| !v.is_string()) => {
            let error = McpError::new(
                McpErrorCode::InvalidArguments,
                "prompt arguments must be a JSON object of strings",
            );
            return deliver_fresh(caller, call.fd, key, out, encode(&error.to_json()));
        }
        Ok(arguments) => arguments,
        Err(error) => return deliver_fresh(caller, call.fd, key, out, encode(&error.to_json())),
    };
    let span = tracing::info_span!("mcp_get_prompt", task_id = %task_id, fd = call.fd, server_id, prompt = %name);
    let got = before_deadline(deadline, mcp.pool.get_prompt(&entry, name, arguments))
        .instrument(span)
        .await?;
    let bytes = got.unwrap_or_else(|error| {
        tracing::info!(task_id = %task_id, server_id, prompt = %name, %error, "prompts/get failed");
        encode(&error.to_json())
    });
    deliver_fresh(caller, call.fd, key, out, bytes)
}

struct CallArgs {
    fd: i32,
    name_ptr: i32,
    name_len: i32,
    args_ptr: i32,
    args_len: i32,
    out_ptr: i32,
    out_len_ptr: i32,
}

async fn call_tool<T: McpView>(
    caller: &mut Caller<'_, T>,
    call: CallArgs,
) -> Result<i32, HostcallError> {
    let (mcp, task_id, deadline, budget, entry, key, out, approval) = {
        let (mut mem, state) = guest(caller)?;
        let out = mem.out_buf(call.out_ptr, call.out_len_ptr)?;
        if usize::try_from(call.name_len).is_ok_and(|len| len > defaults::MAX_TOOL_NAME_BYTES) {
            return Err(Errno::EINVAL.into());
        }
        let name = mem.str(call.name_ptr, call.name_len)?;
        let args = mem.bytes(call.args_ptr, call.args_len)?;
        let mcp = state.mcp().clone();
        let sandbox = state.sandbox();
        let (task_id, deadline) = (sandbox.task_id.clone(), sandbox.deadline);
        let budget = sandbox.budget.clone();
        let session = session(state, call.fd)?;
        let server_id = session.grant.entry.server_id();
        let approval = match session.grant.check_call(name) {
            Ok(approval) => approval,
            Err(denial) => {
                tracing::info!(task_id = %task_id, hostcall = "mcp_call_tool", server_id, tool = %name, reason = ?denial.reason(), detail = %denial, "denied by policy");
                let event = PolicyDenial::of_tool(
                    task_id.clone(),
                    call.fd,
                    "mcp_call_tool",
                    (server_id, name),
                    denial.reason(),
                    denial.to_string(),
                );
                mcp.observers.policy_denied(&event);
                return Err(Errno::EACCES.into());
            }
        };
        if session.keeps_output_for(|key| key.is_call(name, args)) {
            return Ok(deliver_kept(&mut mem, session, out)?);
        }
        // The key copies the name and arguments; the request to the server copies them again.
        let copies = budget.charge(
            "mcp_call_tool arguments",
            heap::string(name.len() as u64)
                .saturating_add(heap::alloc(args.len() as u64))
                .saturating_mul(2),
        )?;
        let key = PendingKey::CallTool {
            name: name.to_owned(),
            args: args.to_vec(),
        };
        session.clear_output();
        (
            mcp,
            task_id,
            deadline,
            (budget, copies),
            session.grant.entry.clone(),
            key,
            out,
            approval,
        )
    };
    let (budget, _copies) = budget;
    let PendingKey::CallTool { name, args } = &key else {
        unreachable!("built above")
    };
    let server_id = entry.server_id();
    let (arguments, _arguments_charge) = match parse_arguments(args, &budget)? {
        Ok(arguments) => arguments,
        Err(error) => return deliver_fresh(caller, call.fd, key, out, encode(&error.to_json())),
    };
    let summary = ArgumentsSummary::of_object(&arguments, args.len() as u64);
    if let Approval::Needed(policy) = approval {
        // The gate ends the wait at the task's deadline itself, so the refusal is reported
        // below before the deadline traps the task.
        let asked = mcp.approvals.ask(AskFor {
            task_id: &task_id,
            session_fd: call.fd,
            via: Via::McpCall,
            entry: &entry,
            tool: name,
            arguments: summary.clone(),
            policy,
            task_deadline: deadline,
        });
        if let Err(refusal) = before_deadline(deadline, asked).await? {
            tracing::info!(task_id = %task_id, hostcall = "mcp_call_tool", server_id, tool = %name, reason = ?refusal.reason, detail = %refusal.detail, "denied by policy");
            let event = PolicyDenial::of_tool(
                task_id.clone(),
                call.fd,
                "mcp_call_tool",
                (server_id, name),
                refusal.reason,
                refusal.detail.clone(),
            );
            mcp.observers.policy_denied(&event);
            if deadline.remaining().is_zero() {
                return Err(HostcallError::Trap(wasmtime::Error::new(
                    deadline.exceeded(),
                )));
            }
            let error = McpError::new(
                McpErrorCode::PolicyDenied,
                format!("tool `{name}` on server `{server_id}`: {}", refusal.detail),
            );
            return deliver_fresh(caller, call.fd, key, out, encode(&error.to_json()));
        }
    }
    let observed = mcp.observers.start(ToolCall {
        task_id: task_id.clone(),
        session_fd: call.fd,
        via: Via::McpCall,
        kind: ToolKind::Mcp {
            server_id: server_id.to_owned(),
        },
        tool: name.clone(),
        arguments: summary,
        argument_values: std::str::from_utf8(args)
            .ok()
            .and_then(|text| ToolCall::audited_arguments(&entry, text)),
        started_at: SystemTime::now(),
    });
    let span = tracing::info_span!("mcp_call_tool", task_id = %task_id, fd = call.fd, server_id, tool = %name);
    // Boxed: the call's future is about 22 KB, and moved around on the task's fiber stack it
    // kept about 40 KiB more of every waiting task's stack resident (BENCHMARKS.md).
    let result = before_deadline(
        deadline,
        Box::pin(mcp.pool.call_tool(&entry, name, arguments)).instrument(span),
    )
    .await?;
    let (bytes, outcome) = match result {
        Ok(output) => {
            let outcome = if output.result.is_error == Some(true) {
                ToolOutcome::ToolError
            } else {
                ToolOutcome::Ok
            };
            (output.json, outcome)
        }
        Err(error) => {
            tracing::info!(task_id = %task_id, server_id, tool = %name, %error, "tool call failed");
            (
                encode(&error.to_json()),
                ToolOutcome::of_mcp_error(error.code),
            )
        }
    };
    observed.finish(outcome, bytes.len() as u64);
    deliver_fresh(caller, call.fd, key, out, bytes)
}

/// The parsed arguments of a call, with their charge.
type Arguments = (serde_json::Map<String, Value>, Charge);

/// Empty input means `{}`; text that is not JSON is `-EIO` (a malformed argument); JSON that
/// is not an object is an `mcp_invalid_arguments` result, as a server would answer. The
/// parsed value is charged to `budget` before it is built (`-ENOMEM`).
fn parse_arguments(
    args: &[u8],
    budget: &MemoryBudget,
) -> Result<Result<Arguments, McpError>, Errno> {
    if args.iter().all(u8::is_ascii_whitespace) {
        return Ok(Ok((
            serde_json::Map::new(),
            budget.empty("mcp_call_tool arguments"),
        )));
    }
    std::str::from_utf8(args).map_err(|_| Errno::EINVAL)?;
    match budget.parse_json("mcp_call_tool arguments", args)? {
        (Value::Object(map), charge) => Ok(Ok((map, charge))),
        (other, _) => Ok(Err(McpError::new(
            McpErrorCode::InvalidArguments,
            format!(
                "tool arguments must be a JSON object, got {}",
                kind_of(&other)
            ),
        ))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
