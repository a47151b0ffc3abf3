//! The `mcp_*` hostcalls: registry views and sessions on pooled MCP connections.
//!
//! Each hostcall opens a span named after itself and decides policy before any work:
//! `mcp_open` and `mcp_registry_get` through [`McpTask::decide_server`] (the listing through
//! [`McpTask::lists`]). Every request on an fd (the listings, `mcp_call_tool`,
//! `mcp_read_resource`, `mcp_get_prompt`) goes through one path, `begin`: the output buffer
//! and input are checked, the fd's [`Grant`] decides (its resource or prompt filter; for
//! calls [`call::check`], the gate library calls go through too), a denial is reported to
//! observers, and the answer kept for a retry is handed back; only then does the request's
//! own part run, within the task's deadline, and its answer go out with the buffer protocol.
//! A tool call's own part is [`call::run`]: the approval, the observers and the pool.
//! An answer that does not fit the guest's buffer stays on the fd and is handed back on the
//! retry, so a retry never runs the tool twice. Kept answers and a request's input are
//! charged to the task's memory budget; when it cannot hold them the call is `-ENOMEM`.
//! `mcp_set_param` narrows an fd's filters (its session layer) and can never widen them.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;

use quiver_abi::Errno;
use rmcp::model::{Prompt, Resource, ResourceTemplate};
use serde_json::{Value, json};
use tracing::field::Empty;
use tracing::{Instrument, Span};
use wasmtime::{Caller, Linker};

use super::call::{self, Ended, Origin};
use super::guest_answers::{self, Answerer, FromServer, serving};
use super::session::{McpSession, McpTask, McpView, Op, PendingKey};
use super::{McpError, McpErrorCode, McpPool, Tool};
use crate::defaults;
use crate::observe::{PolicyDenial, Via};
use crate::policy::{Approval, Denial, Grant, ListKey, Pattern};
use crate::registry::ServerEntry;
use crate::sandbox::{
    Charge, Deadline, DeadlineExceeded, GuestMemory, HandedOff, HostcallError, MemoryBudget,
    OutBuf, before_deadline, finish, guest, heap, off_stack,
};

/// Registers the `mcp_*` imports.
pub fn add_to_linker<T: McpView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    super::in_flight::add_to_linker(linker)?;
    guest_answers::add_to_linker(linker)?;
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
        "mcp_set_param",
        |mut caller: Caller<'_, T>, fd: i32, ptr: i32, len: i32| {
            finish(set_param(&mut caller, fd, ptr, len))
        },
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
    // The fd requests: a listing takes (fd, out_ptr, out_len_ptr), a read a URI before the
    // output buffer, a call or get a name and JSON arguments. Each opens its span, goes
    // through `begin` (policy, kept answers) and only then runs its own part.
    type Listing = (i32, i32, i32);
    type Read = (i32, i32, i32, i32, i32);
    type Call = (i32, i32, i32, i32, i32, i32, i32);
    macro_rules! fd_request {
        ($name:literal, $level:ident, $op:expr, $params:ty, $args:expr, $run:ident) => {
            linker.func_wrap_async(
                "spear",
                $name,
                |mut caller: Caller<'_, T>, params: $params| {
                    Box::new(async move {
                        let args: Args = $args(params);
                        let span = tracing::span!(
                            tracing::Level::$level,
                            $name,
                            task_id = Empty,
                            fd = args.fd,
                            server_id = Empty
                        );
                        finish(match begin(&mut caller, $op, args, span) {
                            Ok(ControlFlow::Break(kept_len)) => Ok(kept_len),
                            // Off the stack: this block runs on the task's fiber stack, where
                            // a large frame stays resident while the task waits (`off_stack`).
                            Ok(ControlFlow::Continue(request)) => {
                                off_stack(|| $run(&mut caller, request)).await
                            }
                            Err(error) => Err(error),
                        })
                    })
                },
            )?;
        };
    }
    fd_request!(
        "mcp_list_tools",
        DEBUG,
        Op::ListTools,
        Listing,
        Args::listing,
        list_tools
    );
    fd_request!(
        "mcp_call_tool",
        INFO,
        Op::CallTool,
        Call,
        Args::call,
        call_tool
    );
    fd_request!(
        "mcp_list_resources",
        DEBUG,
        Op::ListResources,
        Listing,
        Args::listing,
        list_resources
    );
    fd_request!(
        "mcp_list_resource_templates",
        DEBUG,
        Op::ListResourceTemplates,
        Listing,
        Args::listing,
        list_resource_templates
    );
    fd_request!(
        "mcp_read_resource",
        INFO,
        Op::ReadResource,
        Read,
        Args::read,
        read_resource
    );
    fd_request!(
        "mcp_list_prompts",
        DEBUG,
        Op::ListPrompts,
        Listing,
        Args::listing,
        list_prompts
    );
    fd_request!(
        "mcp_get_prompt",
        INFO,
        Op::GetPrompt,
        Call,
        Args::call,
        get_prompt
    );
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
    // A session, or a call in flight (which closing cancels).
    if sandbox.fds.get_as::<McpSession>(fd).is_err() {
        sandbox.fds.get_as::<super::McpCall>(fd)?;
    }
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

pub(super) fn encode(value: &impl serde::Serialize) -> Vec<u8> {
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

/// Narrows the fd's own lists (the session layer of its tool, resource and prompt
/// filters): `{"key": "mcp.<kind>_allowlist" | "mcp.<kind>_denylist", "value": [patterns]}`.
/// A new list replaces the fd's earlier one of that key; it can never get past the
/// registry, profile or task, so there is no policy to refuse. An unknown key or a bad
/// value is `-EINVAL` and leaves the fd as it was.
fn set_param<T: McpView>(
    caller: &mut Caller<'_, T>,
    fd: i32,
    ptr: i32,
    len: i32,
) -> Result<i32, HostcallError> {
    let (mem, state) = guest(caller)?;
    let task_id = state.sandbox().task_id.clone();
    let budget = state.sandbox().budget.clone();
    let span = tracing::debug_span!("mcp_set_param", task_id = %task_id, fd, key = Empty).entered();
    session(state, fd)?;
    let (param, _input) = budget.parse_json("mcp_set_param input", mem.bytes(ptr, len)?)?;
    let Value::Object(mut param) = param else {
        return Err(Errno::EINVAL.into());
    };
    let key = match param.remove("key") {
        Some(Value::String(key)) => ListKey::parse(&key).ok_or_else(|| {
            tracing::info!(key_bytes = key.len(), "mcp_set_param: unknown key");
            Errno::EINVAL
        })?,
        _ => return Err(Errno::EINVAL.into()),
    };
    span.record("key", key.name());
    let value = param.remove("value").unwrap_or(Value::Null);
    let patterns = Pattern::session_list(key, &value).map_err(|reason| {
        tracing::info!(%reason, "mcp_set_param refused");
        Errno::EINVAL
    })?;
    session(state, fd)?.narrow(key, patterns, &budget)?;
    Ok(0)
}

/// An fd request as the guest made it; a listing has no name and no arguments, a read no
/// arguments.
#[derive(Clone, Copy)]
struct Args {
    fd: i32,
    name: (i32, i32),
    args: (i32, i32),
    out: (i32, i32),
}

impl Args {
    fn listing((fd, out_ptr, out_len_ptr): (i32, i32, i32)) -> Self {
        Self {
            fd,
            name: (0, 0),
            args: (0, 0),
            out: (out_ptr, out_len_ptr),
        }
    }

    fn read((fd, uri_ptr, uri_len, out_ptr, out_len_ptr): (i32, i32, i32, i32, i32)) -> Self {
        Self {
            name: (uri_ptr, uri_len),
            ..Self::listing((fd, out_ptr, out_len_ptr))
        }
    }

    fn call(
        (fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
            i32,
        ),
    ) -> Self {
        Self {
            name: (name_ptr, name_len),
            args: (args_ptr, args_len),
            ..Self::listing((fd, out_ptr, out_len_ptr))
        }
    }
}

impl Op {
    fn hostcall(self) -> &'static str {
        match self {
            Op::ListTools => "mcp_list_tools",
            Op::CallTool => "mcp_call_tool",
            Op::ListResources => "mcp_list_resources",
            Op::ListResourceTemplates => "mcp_list_resource_templates",
            Op::ReadResource => "mcp_read_resource",
            Op::ListPrompts => "mcp_list_prompts",
            Op::GetPrompt => "mcp_get_prompt",
        }
    }

    /// The MCP method it sends, for log lines.
    fn method(self) -> &'static str {
        match self {
            Op::ListTools => "tools/list",
            Op::CallTool => "tools/call",
            Op::ListResources => "resources/list",
            Op::ListResourceTemplates => "resources/templates/list",
            Op::ReadResource => "resources/read",
            Op::ListPrompts => "prompts/list",
            Op::GetPrompt => "prompts/get",
        }
    }

    /// The longest name it takes (longer is `-EINVAL` before it is read); `None`: no name.
    fn max_name_bytes(self) -> Option<usize> {
        match self {
            Op::CallTool | Op::GetPrompt => Some(defaults::MAX_TOOL_NAME_BYTES),
            Op::ReadResource => Some(defaults::MAX_RESOURCE_URI_BYTES),
            Op::ListTools | Op::ListResources | Op::ListResourceTemplates | Op::ListPrompts => None,
        }
    }

    fn takes_arguments(self) -> bool {
        matches!(self, Op::CallTool | Op::GetPrompt)
    }

    /// The fd's resource or prompt filter on `name`; tool calls are decided by
    /// [`call::check`], and a listing is filtered afterwards instead.
    fn check(self, grant: &Grant, name: &str) -> Result<(), Denial> {
        match self {
            Op::ReadResource => grant.check_resource(name),
            Op::GetPrompt => grant.check_prompt(name),
            Op::CallTool
            | Op::ListTools
            | Op::ListResources
            | Op::ListResourceTemplates
            | Op::ListPrompts => Ok(()),
        }
    }
}

/// A guest's tool call on its MCP session `fd`, as the call gate sees it.
fn origin(task_id: &Arc<str>, fd: i32, deadline: Deadline) -> Origin {
    Origin {
        task_id: task_id.clone(),
        session_fd: Some(fd),
        via: Via::McpCall,
        deadline,
        to_guest: None,
    }
}

/// An fd request that passed policy and has no kept answer: what the hostcall goes on with.
struct Request {
    mcp: Arc<McpTask>,
    task_id: Arc<str>,
    deadline: Deadline,
    budget: MemoryBudget,
    fd: i32,
    op: Op,
    grant: Arc<Grant>,
    /// The op with copies of its name and arguments; the answer is kept under it.
    key: PendingKey,
    out: OutBuf,
    approval: Approval,
    /// The fd's guest answerer of the server's questions, if it opted in.
    answerer: Option<Answerer>,
    _copies: Charge,
    /// The hostcall's span, for the wait on the server.
    span: Span,
}

/// What every fd request does before it reaches the server, under the hostcall's `span`:
/// checks the output buffer and the input, resolves the fd to its session, decides policy
/// (a denial is logged, reported to observers and `-EACCES`; the server is never asked),
/// hands back the answer kept for a retry (`Break` with its length), and charges the
/// copies of the input.
fn begin<T: McpView>(
    caller: &mut Caller<'_, T>,
    op: Op,
    args: Args,
    span: Span,
) -> Result<ControlFlow<i32, Request>, HostcallError> {
    let _entered = span.enter();
    let (mut mem, state) = guest(caller)?;
    let out = mem.out_buf(args.out.0, args.out.1)?;
    let name = match op.max_name_bytes() {
        Some(max) if usize::try_from(args.name.1).is_ok_and(|len| len > max) => {
            return Err(Errno::EINVAL.into());
        }
        Some(_) => mem.str(args.name.0, args.name.1)?,
        None => "",
    };
    let arguments = match op.takes_arguments() {
        true => mem.bytes(args.args.0, args.args.1)?,
        false => &[],
    };
    let mcp = state.mcp().clone();
    let sandbox = state.sandbox();
    let (task_id, deadline) = (sandbox.task_id.clone(), sandbox.deadline);
    let budget = sandbox.budget.clone();
    span.record("task_id", &*task_id);
    let session = session(state, args.fd)?;
    let server_id = session.grant.entry.server_id();
    span.record("server_id", server_id);
    let decided = match op {
        Op::CallTool => call::check(
            &mcp,
            &origin(&task_id, args.fd, deadline),
            &session.grant,
            name,
        ),
        _ => op
            .check(&session.grant, name)
            .inspect_err(|denial| {
                report_denial(&mcp, &task_id, args.fd, op, (server_id, name), denial)
            })
            .map(|()| Approval::NotNeeded),
    };
    let Ok(approval) = decided else {
        return Err(Errno::EACCES.into());
    };
    if session.keeps_output_for(|key| key.is(op, name, arguments)) {
        return Ok(ControlFlow::Break(deliver_kept(&mut mem, session, out)?));
    }
    // The key copies the input; the request to the server copies it again.
    let copies = budget.charge(
        op.hostcall(),
        heap::string(name.len() as u64)
            .saturating_add(heap::alloc(arguments.len() as u64))
            .saturating_mul(2),
    )?;
    session.clear_output();
    Ok(ControlFlow::Continue(Request {
        key: PendingKey::new(op, name, arguments),
        grant: session.grant.clone(),
        mcp,
        task_id,
        deadline,
        budget,
        fd: args.fd,
        op,
        out,
        approval,
        answerer: session.answerer,
        _copies: copies,
        span: span.clone(),
    }))
}

/// A policy refusal of resource or prompt `name` on an fd: a log line and a
/// [`PolicyDenial`] to observers (and so to the audit log), naming the layer in its detail.
fn report_denial(
    mcp: &McpTask,
    task_id: &Arc<str>,
    fd: i32,
    op: Op,
    (server_id, name): (&str, &str),
    denial: &Denial,
) {
    let (hostcall, reason, detail) = (op.hostcall(), denial.reason(), denial.to_string());
    tracing::info!(task_id = %task_id, hostcall, server_id, name, ?reason, %detail, "denied by policy");
    let event = PolicyDenial::of_tool(
        task_id.clone(),
        fd,
        hostcall,
        (server_id, name),
        reason,
        detail,
    );
    mcp.observers.policy_denied(&event);
}

/// Runs a pool request off the task's fiber: its polls would keep about 16 KiB of the
/// task's stack resident while it waits (see `OffFiber`).
fn off_fiber<T: McpView, M, F>(caller: &mut Caller<'_, T>, make: M) -> HandedOff<F::Output>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    caller.data_mut().sandbox().off_fiber.run(make)
}

impl Request {
    /// The charge for the input's copies, for the hostcall to hold while the request runs
    /// off the fiber: given back when the hostcall ends, whenever the driver drops the
    /// work it handed off.
    fn hold_copies(&mut self) -> Charge {
        let empty = self.budget.empty(self.op.hostcall());
        std::mem::replace(&mut self._copies, empty)
    }

    fn name(&self) -> &str {
        &self.key.name
    }

    /// The request's origin, with the channel its questions take to the guest when the
    /// fd's guest answers them; the hostcall serves the other end while it waits.
    fn origin(&self) -> (Origin, Option<FromServer>) {
        let (to_guest, from_server) = guest_answers::channel(self.answerer, self.fd);
        let origin = Origin {
            to_guest,
            ..origin(&self.task_id, self.fd, self.deadline)
        };
        (origin, from_server)
    }

    /// Waits for `work` (the request to the server) in the hostcall's span, never past the
    /// deadline.
    async fn run<F: Future>(&self, work: F) -> Result<F::Output, HostcallError> {
        before_deadline(self.deadline, work.instrument(self.span.clone())).await
    }

    /// A failed request's answer: the error object, as a server's own errors are.
    fn failed(&self, error: &McpError) -> Vec<u8> {
        let (task_id, server_id) = (&self.task_id, self.grant.entry.server_id());
        tracing::info!(task_id = %task_id, server_id, name = self.name(), method = self.op.method(), %error, "request failed");
        encode(&error.to_json())
    }

    /// Writes `bytes` with the buffer protocol, keeping them for the retry if they do not fit.
    fn deliver<T: McpView>(
        self,
        caller: &mut Caller<'_, T>,
        bytes: Vec<u8>,
    ) -> Result<i32, HostcallError> {
        deliver_fresh(caller, self.fd, self.key, self.out, bytes)
    }
}

/// A listing (`mcp_list_tools`, `_resources`, `_resource_templates`, `_prompts`):
/// `{"server_id": .., <field>: [items `keep` passes]}`, items as the server sent them.
/// Errors are errnos: `-ENOTCONN`, `-ETIMEDOUT`, `-EIO`.
async fn list<T, L, I, F>(
    caller: &mut Caller<'_, T>,
    request: Request,
    field: &str,
    fetch: impl FnOnce(Arc<McpPool>, Arc<ServerEntry>, Option<Arc<str>>) -> F + Send + 'static,
    keep: impl Fn(&Grant, &I) -> bool,
) -> Result<i32, HostcallError>
where
    T: McpView,
    F: Future<Output = Result<L, McpError>> + Send + 'static,
    L: AsRef<[I]> + Send + 'static,
    I: serde::Serialize,
{
    let (pool, entry) = (request.mcp.pool.clone(), request.grant.entry.clone());
    let principal = request.mcp.observers.principal().cloned();
    let span = request.span.clone();
    let listed = off_fiber(caller, move || {
        fetch(pool, entry, principal).instrument(span)
    });
    let listed = request.run(listed).await?;
    let server_id = request.grant.entry.server_id();
    let items = listed.map_err(|error| {
        tracing::warn!(task_id = %request.task_id, server_id, method = request.op.method(), %error, "listing failed");
        list_errno(&error)
    })?;
    let kept: Vec<&I> = items
        .as_ref()
        .iter()
        .filter(|item| keep(&request.grant, item))
        .collect();
    let body = encode(&Listed {
        server_id,
        field,
        items: kept,
    });
    request.deliver(caller, body)
}

/// A listing's answer, serialised straight from the server's items (no intermediate JSON
/// value): `{"server_id": .., <field>: [..]}`.
struct Listed<'a, I> {
    server_id: &'a str,
    field: &'a str,
    items: Vec<&'a I>,
}

impl<I: serde::Serialize> serde::Serialize for Listed<'_, I> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("server_id", self.server_id)?;
        map.serialize_entry(self.field, &self.items)?;
        map.end()
    }
}

async fn list_tools<T: McpView>(
    caller: &mut Caller<'_, T>,
    request: Request,
) -> Result<i32, HostcallError> {
    let fetch = |pool: Arc<McpPool>, entry, principal: Option<Arc<str>>| async move {
        pool.list_tools(&entry, principal.as_deref()).await
    };
    // A tool whose definition drifted from its pin is left out too (a call would be refused).
    let keep = |grant: &Grant, tool: &Tool| {
        grant.tools.permits(&tool.name) && grant.check_definition(tool).is_ok()
    };
    list(caller, request, "tools", fetch, keep).await
}

/// Resources within the fd's resource filter.
async fn list_resources<T: McpView>(
    caller: &mut Caller<'_, T>,
    request: Request,
) -> Result<i32, HostcallError> {
    let fetch = |pool: Arc<McpPool>, entry, principal: Option<Arc<str>>| async move {
        pool.list_resources(&entry, principal.as_deref()).await
    };
    let keep = |grant: &Grant, resource: &Resource| grant.check_resource(&resource.uri).is_ok();
    list(caller, request, "resources", fetch, keep).await
}

/// Templates whose `uriTemplate` text passes the fd's resource filter.
async fn list_resource_templates<T: McpView>(
    caller: &mut Caller<'_, T>,
    request: Request,
) -> Result<i32, HostcallError> {
    let fetch = |pool: Arc<McpPool>, entry, principal: Option<Arc<str>>| async move {
        pool.list_resource_templates(&entry, principal.as_deref())
            .await
    };
    let keep =
        |grant: &Grant, template: &ResourceTemplate| grant.permits_template(&template.uri_template);
    list(caller, request, "resourceTemplates", fetch, keep).await
}

/// Prompts within the fd's prompt filter.
async fn list_prompts<T: McpView>(
    caller: &mut Caller<'_, T>,
    request: Request,
) -> Result<i32, HostcallError> {
    let fetch = |pool: Arc<McpPool>, entry, principal: Option<Arc<str>>| async move {
        pool.list_prompts(&entry, principal.as_deref()).await
    };
    let keep = |grant: &Grant, prompt: &Prompt| grant.check_prompt(&prompt.name).is_ok();
    list(caller, request, "prompts", fetch, keep).await
}

/// Reads one resource (`begin` refused a URI outside the fd's resource filter); the
/// server's errors are MCP error objects, as for `mcp_call_tool`.
async fn read_resource<T: McpView>(
    caller: &mut Caller<'_, T>,
    mut request: Request,
) -> Result<i32, HostcallError> {
    let _copies = request.hold_copies();
    let (origin, from_server) = request.origin();
    let read = off_fiber(caller, move || async move {
        let r = &request;
        let asker = origin.asker(&r.mcp);
        let read = r
            .mcp
            .pool
            .read_resource(&r.grant.entry, r.mcp.principal(), r.name(), &asker);
        let read = r.run(read).await;
        (request, read)
    });
    let (request, read) = serving(caller, from_server, read).await?;
    let bytes = read?.unwrap_or_else(|error| request.failed(&error));
    request.deliver(caller, bytes)
}

/// Gets a prompt (`begin` refused a name outside the fd's prompt filter): `args` is a JSON
/// object of strings (empty means `{}`); the server's errors and arguments that are not an
/// object of strings are MCP error objects.
async fn get_prompt<T: McpView>(
    caller: &mut Caller<'_, T>,
    mut request: Request,
) -> Result<i32, HostcallError> {
    let (arguments, arguments_charge) = match parse_arguments(&request.key.args, &request.budget)? {
        Ok((arguments, _)) if arguments.values().any(|v| !v.is_string()) => {
            let error = McpError::new(
                McpErrorCode::InvalidArguments,
                "prompt arguments must be a JSON object of strings",
            );
            return request.deliver(caller, encode(&error.to_json()));
        }
        Ok(arguments) => arguments,
        Err(error) => return request.deliver(caller, encode(&error.to_json())),
    };
    // The charges stay with the hostcall (see `Request::hold_copies`).
    let _charges = (request.hold_copies(), arguments_charge);
    let (origin, from_server) = request.origin();
    let got = off_fiber(caller, move || async move {
        let r = &request;
        let asker = origin.asker(&r.mcp);
        let (entry, principal) = (&r.grant.entry, r.mcp.principal());
        let got = r
            .mcp
            .pool
            .get_prompt(entry, principal, r.name(), arguments, &asker);
        let got = r.run(got).await;
        (request, got)
    });
    let (request, got) = serving(caller, from_server, got).await?;
    let bytes = got?.unwrap_or_else(|error| request.failed(&error));
    request.deliver(caller, bytes)
}

/// Calls a tool (`begin` refused one outside the fd's tool filter): the arguments are
/// read, then [`call::run`] does the rest (approval, observers, the pool). An approval
/// refusal is an `mcp_policy_denied` result, or ends the task if its deadline ended the
/// wait.
async fn call_tool<T: McpView>(
    caller: &mut Caller<'_, T>,
    mut request: Request,
) -> Result<i32, HostcallError> {
    let (arguments, arguments_charge) = match parse_arguments(&request.key.args, &request.budget)? {
        Ok(arguments) => arguments,
        Err(error) => return request.deliver(caller, encode(&error.to_json())),
    };
    // The charges stay with the hostcall (see `Request::hold_copies`).
    let _charges = (request.hold_copies(), arguments_charge);
    let (origin, from_server) = request.origin();
    let span = request.span.clone();
    let ran = off_fiber(caller, move || {
        async move {
            let r = &request;
            let (entry, name, raw) = (&r.grant.entry, r.name(), &r.key.args);
            let ended = call::run(&r.mcp, &origin, entry, name, r.approval, arguments, raw).await;
            (request, ended)
        }
        .instrument(span)
    });
    let (request, ended) = serving(caller, from_server, ran).await?;
    let (entry, name) = (&request.grant.entry, request.name());
    let bytes = match ended.map_err(trap)? {
        Ended::Answered(output) => output.json,
        Ended::Failed { json, .. } => json,
        Ended::Refused(_) if request.deadline.remaining().is_zero() => {
            return Err(trap(request.deadline.exceeded()));
        }
        Ended::Refused(refusal) => {
            encode(&call::refused(entry.server_id(), name, &refusal).to_json())
        }
    };
    request.deliver(caller, bytes)
}

/// The task's deadline passed: the trap that ends it.
fn trap(exceeded: DeadlineExceeded) -> HostcallError {
    HostcallError::Trap(wasmtime::Error::new(exceeded))
}

/// The parsed arguments of a call, with their charge.
type Arguments = (serde_json::Map<String, Value>, Charge);

/// Empty input means `{}`; text that is not JSON is `-EIO` (a malformed argument); JSON that
/// is not an object is an `mcp_invalid_arguments` result, as a server would answer. The
/// parsed value is charged to `budget` before it is built (`-ENOMEM`).
pub(super) fn parse_arguments(
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
        (other, _) => Ok(Err(call::not_an_object(&other))),
    }
}
