//! Chat completion sessions: conversations held by the host and sent to an LLM backend,
//! with guest tools and MCP tools the host can run for the model.

//!
//! [`Chat`] and [`Response`] are re-exported at the crate root; this module also holds the
//! typed views of what the host answers ([`ResponseBody`], [`Completion`], [`Spear`],
//! [`ChatError`], [`Metrics`], ..).

use std::cell::OnceCell;
use std::fmt;
use std::future::Future;
use std::ops::{BitOr, BitOrAssign};
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use serde_json::{Value, json};

use crate::buffer::{INITIAL_CAPACITY, addr, arg, call_json, call_with_buffer, check};
use crate::rt::InFlight;
use crate::{Errno, Error, Result, Tool, sys, tool};

mod arena;
mod types;

use arena::Arena;
#[cfg(test)]
pub(crate) use arena::tests as arena_tests;
pub use types::{
    ChatError, ChatErrorCode, Choice, Completion, ContentPart, FinishReason, FunctionCall, Latency,
    Message, MessageContent, Metrics, ResponseBody, Spear, ToolCall, ToolCallCounts,
    ToolCallRecord, ToolKind, Usage,
};

/// Size of the tool arena a [`Chat`] lends the host unless told otherwise: 1 MiB.
pub const DEFAULT_TOOL_ARENA_BYTES: usize = 1 << 20;

/// The flags of [`Chat::send`].
///
/// ```
/// use quiver_guest::SendFlags;
///
/// let flags = SendFlags::AUTO_TOOL_CALL | SendFlags::METRICS;
/// assert_eq!(flags.bits(), 3);
/// assert!(flags.contains(SendFlags::AUTO_TOOL_CALL));
/// assert_eq!(format!("{flags:?}"), "METRICS | AUTO_TOOL_CALL");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SendFlags(i32);

impl SendFlags {
    /// No flags: one request, the model's tool calls are returned to the guest.
    pub const NONE: SendFlags = SendFlags(0);
    /// Bit 0: ask for metrics. The host always collects them; accepted for compatibility.
    pub const METRICS: SendFlags = SendFlags(sys::SEND_METRICS);
    /// Bit 1: the host runs the model's tool calls (guest and MCP tools) and loops until
    /// the model answers or a budget is hit.
    pub const AUTO_TOOL_CALL: SendFlags = SendFlags(sys::SEND_AUTO_TOOL_CALL);

    /// The flags from their raw bits (unknown bits are passed on, and the host rejects them
    /// with [`Errno::EINVAL`]).
    pub const fn from_bits(bits: i32) -> SendFlags {
        SendFlags(bits)
    }

    /// The raw bits, as `cchat_send` takes them.
    pub const fn bits(self) -> i32 {
        self.0
    }

    /// True if every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for SendFlags {
    type Output = SendFlags;

    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for SendFlags {
    fn bitor_assign(&mut self, rhs: SendFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for SendFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(SendFlags::METRICS) {
            names.push("METRICS".to_owned());
        }
        if self.contains(SendFlags::AUTO_TOOL_CALL) {
            names.push("AUTO_TOOL_CALL".to_owned());
        }
        let unknown = self.0 & !(SendFlags::METRICS.0 | SendFlags::AUTO_TOOL_CALL.0);
        if unknown != 0 {
            names.push(format!("{unknown:#x}"));
        }
        if names.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&names.join(" | "))
        }
    }
}

/// Whose memory a session's tool arena params point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArenaParams {
    /// Not set yet: the session lends its own arena when a tool is registered.
    Unset,
    /// The session's own arena, [`Chat::arena`].
    Own,
    /// Memory the caller lent with [`Chat::lend_tool_arena`] (set from before the first
    /// param is sent).
    Lent,
}

/// A chat completion session: an OpenAI-compatible conversation held by the host.
///
/// Messages, params and tools accumulate in the host; [`send`](Chat::send) or
/// [`complete`](Chat::complete) sends the whole session to the LLM backend and returns a
/// [`Response`]. The methods that change the session return `&mut Chat`, so they chain
/// with `?`. The fd is closed when the `Chat` is dropped; use [`Chat::close`] to see the
/// error, if any.
///
/// # Tools
///
/// [`Chat::tool`] registers a guest [`Tool`] (see [`tool!`](crate::tool!)). With
/// [`SendFlags::AUTO_TOOL_CALL`] (as in [`complete`](Chat::complete)) the host calls it
/// when the model asks, inside a **tool arena** of guest memory the session lends it: the
/// first registration allocates the session's own arena ([`DEFAULT_TOOL_ARENA_BYTES`], or
/// the size given to [`with_tool_arena`](Chat::with_tool_arena)) and sets the session's
/// `tool_arena_ptr` and `tool_arena_len` params. The `Chat` owns the arena and frees it
/// when it is closed or dropped, once the host can no longer use it. Each session has its
/// own, so a tool may run a chat of its own. To lend other memory instead, use the
/// `unsafe` [`lend_tool_arena`](Chat::lend_tool_arena); [`param`](Chat::param) refuses
/// the two keys.
///
/// The host finds a tool's entry point in the module's exported function table, which a
/// Rust binary does not export by default: link guests that register tools with
/// `--export-table`, for example with this `build.rs`:
///
/// ```ignore
/// fn main() {
///     if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
///         println!("cargo::rustc-link-arg-bins=--export-table");
///     }
/// }
/// ```
///
/// Without it `cchat_write_fn` fails with [`Errno::EINVAL`].
///
/// # Example
///
/// ```no_run
/// use quiver_guest::Chat;
///
/// # fn main() -> quiver_guest::Result<()> {
/// let mut chat = Chat::new()?;
/// chat.model("gpt-4o-mini")?
///     .param("temperature", 0.2)?
///     .system("You answer in one sentence.")?
///     .user("Why is the sky blue?")?;
/// let response = chat.complete()?;
/// if let Some(error) = response.error()? {
///     eprintln!("chat failed: {error}");
/// } else {
///     println!("{}", response.text()?.unwrap_or_default());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Chat {
    fd: i32,
    /// Size of the tool arena this session asks for.
    arena_bytes: usize,
    /// The session's own tool arena, once allocated. Kept until the session is closed
    /// (see the `arena` module for why that is sound), even if the caller lends other
    /// memory meanwhile: the host may have been given its address.
    arena: Option<Arena>,
    /// What the session's arena params point at.
    arena_params: ArenaParams,
    /// Tools registered so far.
    tools: usize,
}

impl Chat {
    /// Creates an empty session. Its MCP settings start from the task's.
    ///
    /// # Errors
    ///
    /// [`Errno::EMFILE`] if the fd table is full.
    pub fn new() -> Result<Chat> {
        Chat::with_tool_arena(DEFAULT_TOOL_ARENA_BYTES)
    }

    /// Creates an empty session whose guest tools get a tool arena of at least `bytes`
    /// bytes (the arguments, and the output buffer, of one tool call must fit in it).
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if `bytes` is 0 or over `i32::MAX`;
    /// otherwise as [`Chat::new`].
    pub fn with_tool_arena(bytes: usize) -> Result<Chat> {
        if bytes == 0 || i32::try_from(bytes).is_err() {
            return Err(Error::from_errno(
                format!("Chat::with_tool_arena({bytes})"),
                Errno::EINVAL,
            ));
        }
        // SAFETY: no arguments.
        let ret = unsafe { sys::cchat_create() };
        let fd = check(|| "cchat_create()".to_owned(), ret)?;
        Ok(Chat {
            fd,
            arena_bytes: bytes,
            arena: None,
            arena_params: ArenaParams::Unset,
            tools: 0,
        })
    }

    /// The session's fd.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Appends `{"role": role, "content": content}`. `role` is `system`, `developer`,
    /// `user`, `assistant` or `tool` (the host rejects others with [`Errno::EINVAL`]).
    pub fn write_msg(&mut self, role: &str, content: &str) -> Result<&mut Chat> {
        let op = || format!("cchat_write_msg({}, {role:?})", self.fd);
        let (role_ptr, role_len) = arg(&op(), role.as_bytes())?;
        let (content_ptr, content_len) = arg(&op(), content.as_bytes())?;
        // SAFETY: `role` and `content` are readable for their lengths during the call.
        let ret =
            unsafe { sys::cchat_write_msg(self.fd, role_ptr, role_len, content_ptr, content_len) };
        check(op, ret)?;
        Ok(self)
    }

    /// Appends a `system` message.
    pub fn system(&mut self, text: &str) -> Result<&mut Chat> {
        self.write_msg("system", text)
    }

    /// Appends a `user` message.
    pub fn user(&mut self, text: &str) -> Result<&mut Chat> {
        self.write_msg("user", text)
    }

    /// Appends an `assistant` message.
    pub fn assistant(&mut self, text: &str) -> Result<&mut Chat> {
        self.write_msg("assistant", text)
    }

    /// Appends any OpenAI chat message object (`cchat_ctl` ADD_MESSAGE), e.g. an assistant
    /// message with `tool_calls`, or `{"role": "tool", "tool_call_id": .., "content": ..}`.
    /// `message` is anything that serializes to one: a `serde_json::Value`, or a
    /// [`Message`] from a [`Response`], which appends the model's answer as it came.
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if `message` does not serialize to an
    /// object with a string `role`.
    pub fn message(&mut self, message: impl Serialize) -> Result<&mut Chat> {
        let message = serde_json::to_value(message).unwrap_or(Value::Null);
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let op = || format!("cchat_ctl({}, ADD_MESSAGE, {role:?})", self.fd);
        if !message.is_object() || message.get("role").is_none_or(|r| !r.is_string()) {
            return Err(Error::from_errno(op(), Errno::EINVAL));
        }
        self.ctl_in(sys::CTL_ADD_MESSAGE, op, message.to_string().as_bytes())?;
        Ok(self)
    }

    /// Sets the session param `key` to `value` (`cchat_ctl` SET_PARAM).
    ///
    /// The host consumes its own keys (`model`, `backend`, `timeout_ms`,
    /// `max_iterations`, `max_total_tool_calls`, `max_tool_output_bytes`, `mcp.enabled`,
    /// `mcp.server_ids`, `mcp.tool_allowlist`, `mcp.tool_denylist`) and sends every other
    /// key upstream as given; `null` removes a key. The tool arena's keys are the SDK's
    /// (see [Tools](Chat#tools)).
    ///
    /// ```no_run
    /// # fn main() -> quiver_guest::Result<()> {
    /// let mut chat = quiver_guest::Chat::new()?;
    /// chat.param("mcp.enabled", true)?
    ///     .param("mcp.server_ids", ["fs"])?
    ///     .param("max_iterations", 4)?
    ///     .param("temperature", 0)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Errno::EACCES`] if an `mcp.*` key would widen the task's MCP policy,
    /// [`Errno::EINVAL`] for a wrong value type (or, without calling the host, a `value`
    /// that does not serialize to JSON, or the key `tool_arena_ptr` or `tool_arena_len`:
    /// the host writes wherever they point, so only the SDK, or the `unsafe`
    /// [`lend_tool_arena`](Chat::lend_tool_arena), sets them).
    pub fn param(&mut self, key: &str, value: impl Serialize) -> Result<&mut Chat> {
        if key == "tool_arena_ptr" || key == "tool_arena_len" {
            let op = format!("cchat_ctl({}, SET_PARAM, {key:?})", self.fd);
            return Err(Error::from_errno(op, Errno::EINVAL));
        }
        self.set_param(key, value)?;
        Ok(self)
    }

    /// Lends the host `len` bytes at `ptr` as this session's tool arena, instead of the
    /// arena the session allocates itself (which, if already allocated, is still freed only
    /// when the session is closed).
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` must be valid for reads and writes, and nothing else may use it
    /// (no Rust reference into it may be live) during any send of this session, until the
    /// session is closed and the close succeeded. The host writes tool arguments and
    /// results there during [`send`](Chat::send).
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if `len` is 0 or over `i32::MAX`;
    /// otherwise as [`param`](Chat::param). On an error the session's arena params may be
    /// half set; the memory must then be treated as lent all the same.
    pub unsafe fn lend_tool_arena(&mut self, ptr: *mut u8, len: usize) -> Result<&mut Chat> {
        if len == 0 || i32::try_from(len).is_err() {
            let op = format!("Chat::lend_tool_arena({}, {len})", self.fd);
            return Err(Error::from_errno(op, Errno::EINVAL));
        }
        // Set first, so that the SDK never points the params back at its own arena.
        self.arena_params = ArenaParams::Lent;
        self.set_param("tool_arena_ptr", ptr.expose_provenance())?;
        self.set_param("tool_arena_len", len)?;
        Ok(self)
    }

    /// Sets the `model` param.
    pub fn model(&mut self, name: &str) -> Result<&mut Chat> {
        self.param("model", name)
    }

    /// Registers a guest tool (`cchat_write_fn`); registering a name again replaces the
    /// earlier tool. The first registration also lends the host the tool arena (see
    /// [Tools](Chat#tools)).
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if the name does not match
    /// `^[a-zA-Z0-9_-]{1,64}$` or starts with `mcp__`; from the host, [`Errno::EINVAL`]
    /// if it cannot find the entry point in the module's exported function table.
    pub fn tool(&mut self, tool: &Tool) -> Result<&mut Chat> {
        let op = || format!("cchat_write_fn({}, {:?})", self.fd, tool.name());
        if !tool::valid_name(tool.name()) {
            return Err(Error::from_errno(op(), Errno::EINVAL));
        }
        let definition = tool.definition().to_string();
        let (def_ptr, def_len) = arg(&op(), definition.as_bytes())?;
        // SAFETY: `definition` is readable for `def_len` bytes during the call.
        let ret = unsafe { sys::cchat_write_fn(self.fd, tool.fn_offset(), def_ptr, def_len) };
        check(op, ret)?;
        self.tools += 1;
        self.ensure_tool_arena()?;
        Ok(self)
    }

    /// The session's messages, as the JSON array the host holds (`cchat_ctl` GET_MESSAGES).
    pub fn messages(&self) -> Result<Value> {
        let op = format!("cchat_ctl({}, GET_MESSAGES)", self.fd);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::cchat_ctl(self.fd, sys::CTL_GET_MESSAGES, addr(out), addr(out_len)) }
        })
    }

    /// Sends the session (`cchat_send`) and returns the response.
    ///
    /// A failed request (network, HTTP status, timeout, tool budget, ..) is still an `Ok`
    /// response, with an [`error`](Response::error) object; `Err` means the hostcall
    /// itself failed. With [`SendFlags::AUTO_TOOL_CALL`] the tool arena is lent first if
    /// tools are registered and it is not yet set.
    pub fn send(&mut self, flags: SendFlags) -> Result<Response> {
        if flags.contains(SendFlags::AUTO_TOOL_CALL) && self.tools > 0 {
            self.ensure_tool_arena()?;
        }
        // SAFETY: no pointer arguments.
        let ret = unsafe { sys::cchat_send(self.fd, flags.bits()) };
        let fd = check(|| format!("cchat_send({}, {flags:?})", self.fd), ret)?;
        Ok(Response::from_fd(fd))
    }

    /// Sends the session without waiting (`cchat_send` with the session's `O_NONBLOCK` set
    /// for the call) and returns a future of its [`Response`] at once (see
    /// [`rt`](crate::rt)); the host runs the send, with its MCP tool calls, meanwhile. The
    /// messages it adds join the session once the response is read. Dropping the future
    /// before it is done cancels the send.
    ///
    /// # Errors
    ///
    /// As [`send`](Chat::send); [`Errno::EINVAL`] if the session has guest tools (they
    /// run only in a blocking send), [`Errno::EAGAIN`] with 64 calls and sends in flight, or
    /// while this session's last `send_async` is in flight or its response unread.
    pub fn send_async(&mut self, flags: SendFlags) -> Result<PendingResponse> {
        let op = format!("cchat_send({}, {flags:?})", self.fd);
        set_nonblocking(self.fd, true)?;
        // SAFETY: no pointer arguments.
        let ret = unsafe { sys::cchat_send(self.fd, flags.bits()) };
        let cleared = set_nonblocking(self.fd, false);
        let fd = check(|| op.clone(), ret)?;
        let pending = PendingResponse {
            inner: InFlight {
                fd,
                op: format!("cchat_recv({fd})"),
                // SAFETY (at the call): the executor passes a writable buffer and length.
                read: |fd, out, out_len| unsafe { sys::cchat_recv(fd, out, out_len) },
            },
            done: false,
        };
        cleared?;
        Ok(pending)
    }

    /// Sends the session with [`SendFlags::AUTO_TOOL_CALL`] and [`SendFlags::METRICS`]: the
    /// host runs the model's tool calls until it answers. The answer is appended to the
    /// session, so the conversation can go on with [`user`](Chat::user).
    pub fn complete(&mut self) -> Result<Response> {
        self.send(SendFlags::AUTO_TOOL_CALL | SendFlags::METRICS)
    }

    /// Closes the session, reporting the host's error if there is one. Its responses stay
    /// open. The session's tool arena is freed, unless the host's error leaves it unclear
    /// whether the host still holds it (then it is leaked).
    pub fn close(mut self) -> Result<()> {
        self.release()
    }

    /// Closes the fd (once) and frees the arena when that is safe.
    fn release(&mut self) -> Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        let result = if fd >= 0 { close(fd) } else { Ok(()) };
        let arena = self.arena.take();
        match &result {
            // The host no longer has the session (or never had this fd): nothing can
            // reach the arena any more.
            Ok(()) => drop(arena),
            Err(err) if err.errno() == Some(Errno::EBADF) => drop(arena),
            // The session may live on in the host with the arena's address.
            Err(_) => std::mem::forget(arena),
        }
        result
    }

    /// SET_PARAM without the bookkeeping of [`Chat::param`].
    fn set_param(&self, key: &str, value: impl Serialize) -> Result<()> {
        let op = || format!("cchat_ctl({}, SET_PARAM, {key:?})", self.fd);
        let value =
            serde_json::to_value(value).map_err(|_| Error::from_errno(op(), Errno::EINVAL))?;
        let param = json!({ "key": key, "value": value }).to_string();
        self.ctl_in(sys::CTL_SET_PARAM, op, param.as_bytes())
    }

    /// Lends the host the session's own tool arena, unless its arena params are set.
    /// After an error the params stay unset, and the next registration or send tries again
    /// with the same arena.
    fn ensure_tool_arena(&mut self) -> Result<()> {
        if self.arena_params != ArenaParams::Unset {
            return Ok(());
        }
        if self.arena.is_none() {
            let arena = Arena::new(self.arena_bytes).ok_or_else(|| {
                Error::from_errno(format!("tool_arena({})", self.arena_bytes), Errno::ENOMEM)
            })?;
            // Owned by the session from before the host may see its address: from here on
            // it is freed only as `release` allows.
            self.arena = Some(arena);
        }
        let (ptr, len) = self.arena.as_ref().map_or((0, 0), |a| (a.addr(), a.len()));
        self.set_param("tool_arena_ptr", ptr)?;
        self.set_param("tool_arena_len", len)?;
        self.arena_params = ArenaParams::Own;
        Ok(())
    }

    /// A `cchat_ctl` command whose argument is `bytes`, with its length in `*arg_len_ptr`.
    fn ctl_in(&self, cmd: i32, op: impl Fn() -> String, bytes: &[u8]) -> Result<()> {
        let (ptr, len) = arg(&op(), bytes)?;
        let len = len as u32;
        // SAFETY: `bytes` is readable for `len` bytes, and `len` is a `u32` the host may
        // read, during the call.
        let ret = unsafe { sys::cchat_ctl(self.fd, cmd, ptr, addr(&len)) };
        check(op, ret).map(drop)
    }
}

impl Drop for Chat {
    fn drop(&mut self) {
        // Errors cannot be reported from `drop`.
        let _ = self.release();
    }
}

/// `cchat_close(fd)`.
fn close(fd: i32) -> Result<()> {
    // SAFETY: no pointer arguments.
    let ret = unsafe { sys::cchat_close(fd) };
    check(|| format!("cchat_close({fd})"), ret).map(drop)
}

/// The answer to [`Chat::send`]: an fd on the host's response body.
///
/// On success the body is the final upstream `chat.completion` object plus a `_spear`
/// object (backend, model, iterations, usage and the tool calls the host ran); on failure
/// it is `{"error": {"code", "message", ..}, "_spear": {..}}`. The body is read from the
/// host once, on first use, and decoded into a [`ResponseBody`]; the typed accessors
/// borrow from it. The JSON as sent stays available ([`json`](Response::json),
/// [`body`](Response::body)). The fd is closed when the `Response` is dropped.
///
/// ```no_run
/// use quiver_guest::chat::ToolKind;
///
/// # fn main() -> quiver_guest::Result<()> {
/// # let mut chat = quiver_guest::Chat::new()?;
/// let response = chat.complete()?;
/// if let Some(error) = response.error()? {
///     eprintln!("{}: {}", error.code, error.message);
///     return Ok(());
/// }
/// println!("{}", response.text()?.unwrap_or_default());
/// for call in &response.spear()?.expect("the host adds _spear").tool_calls {
///     let kind = if call.kind == ToolKind::Guest { "mine" } else { call.kind.as_str() };
///     println!("ran {} ({kind})", call.name);
/// }
/// let metrics = response.metrics()?;
/// println!("{} ms, {} tokens", metrics.latency_ms.total, metrics.total_tokens);
/// # Ok(())
/// # }
/// ```
pub struct Response {
    fd: i32,
    body: OnceCell<(Value, ResponseBody)>,
}

impl Response {
    fn from_fd(fd: i32) -> Response {
        Response {
            fd,
            body: OnceCell::new(),
        }
    }

    /// The response's fd.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The response body, undecoded (`cchat_recv`; reading does not consume it).
    pub fn body(&self) -> Result<Vec<u8>> {
        let op = format!("cchat_recv({})", self.fd);
        call_with_buffer(&op, INITIAL_CAPACITY, |out, out_len| {
            // SAFETY: `call_with_buffer` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::cchat_recv(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// The body as JSON and typed, read from the host on the first call.
    fn decoded(&self) -> Result<&(Value, ResponseBody)> {
        if let Some(body) = self.body.get() {
            return Ok(body);
        }
        let bytes = self.body()?;
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::from_json(format!("cchat_recv({})", self.fd), e))?;
        let typed = ResponseBody::from_json(&json);
        Ok(self.body.get_or_init(|| (json, typed)))
    }

    /// The whole response body as JSON, as the host sent it.
    pub fn json(&self) -> Result<&Value> {
        Ok(&self.decoded()?.0)
    }

    /// The whole response body, typed.
    pub fn parsed(&self) -> Result<&ResponseBody> {
        Ok(&self.decoded()?.1)
    }

    /// The `chat.completion` (with no `choices` if the request failed).
    pub fn completion(&self) -> Result<&Completion> {
        Ok(&self.parsed()?.completion)
    }

    /// The answer's text: `choices[0].message.content` (the `text` parts joined, if the
    /// content is an array of parts). `None` if there is no content, e.g. for an error or
    /// an answer that only has `tool_calls`.
    pub fn text(&self) -> Result<Option<String>> {
        Ok(self.completion()?.text())
    }

    /// The tool calls the model asks for in this answer: `choices[0].message.tool_calls`
    /// (empty if none). After [`Chat::complete`] the host has already run them; see
    /// [`spear`](Response::spear) for what it ran.
    pub fn tool_calls(&self) -> Result<&[ToolCall]> {
        Ok(self.completion()?.tool_calls())
    }

    /// The host's `error` object if the request failed (`llm_unavailable`,
    /// `llm_timeout`, `llm_http_error`, `llm_invalid_response`, `llm_response_too_large`,
    /// `llm_invalid_request`, `backend_unknown`, `tool_call_limit`), `None` on success.
    pub fn error(&self) -> Result<Option<&ChatError>> {
        Ok(self.parsed()?.error.as_ref())
    }

    /// The host's `_spear` object: `backend`, `model`, `iterations`, `usage`, and
    /// `tool_calls`, one record per tool call the host ran. `None` if absent.
    pub fn spear(&self) -> Result<Option<&Spear>> {
        Ok(self.parsed()?.spear.as_ref())
    }

    /// The metrics of the send (`cchat_ctl` GET_METRICS): iterations, LLM requests,
    /// retries and errors, token counts, tool call counts and latencies.
    pub fn metrics(&self) -> Result<Metrics> {
        Ok(crate::lenient::value(&self.metrics_json()?))
    }

    /// The metrics as the JSON the host returns.
    pub fn metrics_json(&self) -> Result<Value> {
        let op = format!("cchat_ctl({}, GET_METRICS)", self.fd);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::cchat_ctl(self.fd, sys::CTL_GET_METRICS, addr(out), addr(out_len)) }
        })
    }

    /// Closes the response, reporting the host's error if there is one.
    pub fn close(mut self) -> Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        close(fd)
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("fd", &self.fd)
            .field("body", &self.body.get().map(|(json, _)| json))
            .finish()
    }
}

/// Sets or clears `O_NONBLOCK` on `fd` (`spear_fd_ctl`).
fn set_nonblocking(fd: i32, on: bool) -> Result<()> {
    let json: &[u8] = if on {
        br#"{"set":["O_NONBLOCK"]}"#
    } else {
        br#"{"clear":["O_NONBLOCK"]}"#
    };
    let op = || format!("spear_fd_ctl({fd}, SET_FLAGS)");
    let len = json.len() as u32;
    // SAFETY: `json` and `len` are readable for the call.
    let ret = unsafe {
        sys::spear_fd_ctl(
            fd,
            quiver_abi::fd_ctl::SET_FLAGS,
            addr(json.as_ptr()),
            addr(&len),
        )
    };
    check(op, ret).map(drop)
}

/// A send in flight ([`Chat::send_async`]): a future of its [`Response`]. Dropping it
/// before it is done closes the response fd, which cancels the send.
pub struct PendingResponse {
    inner: InFlight<fn(i32, i32, i32) -> i32>,
    done: bool,
}

impl PendingResponse {
    /// The response fd (readable once the answer is there).
    pub fn fd(&self) -> i32 {
        self.inner.fd
    }
}

impl Future for PendingResponse {
    type Output = Result<Response>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        Pin::new(&mut this.inner).poll(cx).map(|read| {
            read?;
            // The fd is the response's now.
            this.done = true;
            Ok(Response::from_fd(this.inner.fd))
        })
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: no pointer arguments. Errors cannot be reported from `drop`.
            unsafe { sys::cchat_close(self.inner.fd) };
        }
    }
}

impl Drop for Response {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: no pointer arguments. Errors cannot be reported from `drop`.
            unsafe { sys::cchat_close(self.fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat() -> Chat {
        Chat {
            fd: -1,
            arena_bytes: DEFAULT_TOOL_ARENA_BYTES,
            arena: None,
            arena_params: ArenaParams::Unset,
            tools: 0,
        }
    }

    fn response(body: Value) -> Response {
        let typed = ResponseBody::from_json(&body);
        Response {
            fd: -1,
            body: OnceCell::from((body, typed)),
        }
    }

    #[test]
    fn send_flags() {
        assert_eq!(SendFlags::default(), SendFlags::NONE);
        assert_eq!(format!("{:?}", SendFlags::NONE), "NONE");
        assert_eq!(
            format!("{:?}", SendFlags::from_bits(6)),
            "AUTO_TOOL_CALL | 0x4"
        );
        let mut flags = SendFlags::METRICS;
        flags |= SendFlags::AUTO_TOOL_CALL;
        assert_eq!(flags, SendFlags::from_bits(3));
        assert!(!SendFlags::METRICS.contains(SendFlags::AUTO_TOOL_CALL));
    }

    #[test]
    fn native_builds_report_enosys() {
        let err = Chat::new().unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOSYS));
        assert_eq!(err.op(), "cchat_create()");

        let err = chat().user("hi").unwrap_err();
        assert_eq!(err.op(), r#"cchat_write_msg(-1, "user")"#);
        let err = chat().param("temperature", 0.5).unwrap_err();
        assert_eq!(err.op(), r#"cchat_ctl(-1, SET_PARAM, "temperature")"#);
        let err = chat().messages().unwrap_err();
        assert_eq!(err.op(), "cchat_ctl(-1, GET_MESSAGES)");
        let err = chat().complete().unwrap_err();
        assert_eq!(err.op(), "cchat_send(-1, METRICS | AUTO_TOOL_CALL)");
        let err = response(json!({})).metrics().unwrap_err();
        assert_eq!(err.op(), "cchat_ctl(-1, GET_METRICS)");
        let err = Response::from_fd(-1).text().unwrap_err();
        assert_eq!(err.op(), "cchat_recv(-1)");
        assert_eq!(err.errno(), Some(Errno::ENOSYS));
    }

    #[test]
    fn arguments_checked_before_the_host() {
        let err = Chat::with_tool_arena(0).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        assert_eq!(err.op(), "Chat::with_tool_arena(0)");

        for message in [json!("hi"), json!({"content": "x"}), json!({"role": 1})] {
            let err = chat().message(message).unwrap_err();
            assert_eq!(err.errno(), Some(Errno::EINVAL));
        }
        let err = chat().message(json!({"role": "tool"})).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOSYS));
        assert_eq!(err.op(), r#"cchat_ctl(-1, ADD_MESSAGE, "tool")"#);

        let mut map = std::collections::HashMap::new();
        map.insert(vec![1u8], 1);
        let err = chat().param("bad", map).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
    }

    crate::tool!(
        BAD_NAME = std::convert::identity(Value),
        "mcp__x",
        "reserved prefix",
        Value::Null
    );

    #[test]
    fn tool_names_checked_before_the_host() {
        let mut chat = chat();
        let err = chat.tool(&BAD_NAME).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        assert_eq!(err.op(), r#"cchat_write_fn(-1, "mcp__x")"#);
        assert_eq!(chat.tools, 0);
    }

    #[test]
    fn arena_params_are_the_sdks() {
        let mut chat = chat();
        for key in ["tool_arena_ptr", "tool_arena_len"] {
            let err = chat.param(key, 10).unwrap_err();
            assert_eq!(err.errno(), Some(Errno::EINVAL), "refused before the host");
            assert_eq!(err.op(), format!("cchat_ctl(-1, SET_PARAM, {key:?})"));
        }
        assert_eq!(chat.arena_params, ArenaParams::Unset);

        let mut buf = [0u8; 64];
        // SAFETY: nothing is lent (the length is refused), and natively there is no host.
        let err = unsafe { chat.lend_tool_arena(buf.as_mut_ptr(), 0) }.unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        // SAFETY: natively there is no host to write into `buf`.
        let err = unsafe { chat.lend_tool_arena(buf.as_mut_ptr(), buf.len()) }.unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOSYS));
        assert_eq!(
            chat.arena_params,
            ArenaParams::Lent,
            "never pointed back at the SDK's"
        );
        assert!(chat.ensure_tool_arena().is_ok());
        assert!(chat.arena.is_none(), "no arena allocated for a lent one");
    }

    /// A chat whose session has its own arena of `bytes`, as after a registration.
    fn chat_with_arena(bytes: usize) -> (Chat, usize) {
        let mut chat = chat();
        chat.arena_bytes = bytes;
        // Natively SET_PARAM fails, so the params stay unset, but the arena is allocated
        // first and owned by the session.
        let err = chat.ensure_tool_arena().unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOSYS));
        assert_eq!(chat.arena_params, ArenaParams::Unset);
        let arena = chat.arena.as_ref().unwrap();
        assert_eq!(arena.len(), bytes);
        let addr = arena.addr();
        (chat, addr)
    }

    #[test]
    fn each_session_owns_its_arena_and_frees_it_when_closed() {
        arena::tests::watch();
        let bytes = arena::tests::WATCHED;
        let (mut first, addr) = chat_with_arena(bytes);
        // A retry reuses the same arena.
        assert!(first.ensure_tool_arena().is_err());
        assert_eq!(first.arena.as_ref().unwrap().addr(), addr);
        // Another session gets another arena.
        let (second, other) = chat_with_arena(bytes + 8);
        assert_ne!(addr, other);

        // fd -1: there is no session in the host, so dropping frees the arena.
        drop(first);
        assert!(arena::tests::was_freed(addr));
        assert!(!arena::tests::was_freed(other));
        second.close().unwrap();
        assert!(arena::tests::was_freed(other));
    }

    #[test]
    fn an_arena_the_host_may_still_hold_is_leaked_not_freed() {
        arena::tests::watch();
        let (mut chat, addr) = chat_with_arena(arena::tests::WATCHED + 16);
        // A session fd the host does not confirm closed (natively: ENOSYS).
        chat.fd = 7;
        assert_eq!(chat.close().unwrap_err().errno(), Some(Errno::ENOSYS));
        assert!(!arena::tests::was_freed(addr));
    }

    #[test]
    fn response_accessors() {
        let r = response(json!({
            "id": "x", "object": "chat.completion",
            "choices": [{"message": {"role": "assistant", "content": "It is sunny."}}],
            "_spear": {"iterations": 2, "tool_calls": [
                {"id": "call_1", "name": "get_weather", "kind": "guest", "ok": true}
            ]}
        }));
        assert_eq!(r.text().unwrap().as_deref(), Some("It is sunny."));
        assert!(r.tool_calls().unwrap().is_empty());
        assert_eq!(r.error().unwrap(), None);
        let spear = r.spear().unwrap().unwrap();
        assert_eq!(spear.iterations, 2);
        assert_eq!(spear.tool_calls[0].kind, ToolKind::Guest);
        assert_eq!(r.json().unwrap()["id"], "x");
        assert_eq!(r.completion().unwrap().id.as_deref(), Some("x"));
    }

    #[test]
    fn response_with_tool_calls_or_parts() {
        let r = response(json!({"choices": [{"message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"}}]
        }}]}));
        assert_eq!(r.text().unwrap(), None);
        assert_eq!(r.tool_calls().unwrap()[0].id, "c1");
        assert_eq!(r.tool_calls().unwrap()[0].function.name, "get_weather");

        let r = response(json!({"choices": [{"message": {"content": [
            {"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}
        ]}}]}));
        assert_eq!(r.text().unwrap().as_deref(), Some("ab"));
    }

    #[test]
    fn error_response() {
        let r = response(json!({
            "error": {"code": "llm_timeout", "message": "no answer"},
            "_spear": {"iterations": 1}
        }));
        let error = r.error().unwrap().unwrap();
        assert_eq!(error.code, ChatErrorCode::LlmTimeout);
        assert_eq!(error.to_string(), "llm_timeout: no answer");
        assert_eq!(r.text().unwrap(), None);
        assert!(r.tool_calls().unwrap().is_empty());
        assert_eq!(response(json!({"error": null})).error().unwrap(), None);
        assert_eq!(response(json!([])).spear().unwrap(), None);
        assert_eq!(response(json!([])).json().unwrap(), &json!([]));
    }
}
