//! Chat completion sessions: conversations held by the host and sent to an LLM backend,
//! with guest tools and MCP tools the host can run for the model.

use std::cell::OnceCell;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;
use serde_json::{Value, json};

use crate::buffer::{INITIAL_CAPACITY, addr, arg, call_json, call_with_buffer, check};
use crate::{Errno, Error, Result, Tool, sys, tool};

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

/// The tool arena the SDK lends the host: `(address, length)` of the largest one so far.
///
/// An arena is never freed: a session keeps its address until the end of the task, so
/// when a session asks for a larger one the smaller one is left allocated. Guest tools run
/// one at a time, inside `cchat_send`, so every session can share one arena.
static TOOL_ARENA: Mutex<Option<(usize, usize)>> = Mutex::new(None);

/// The SDK's tool arena, at least `min_len` bytes long, allocated on first use.
fn tool_arena(min_len: usize) -> Option<(usize, usize)> {
    let mut arena = TOOL_ARENA.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((ptr, len)) = *arena
        && len >= min_len
    {
        return Some((ptr, len));
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(min_len).ok()?;
    buf.resize(min_len, 0u8);
    // Leaked on purpose (see `TOOL_ARENA`); only the host writes to it, and only the tool
    // entry points read it, through raw pointers.
    let ptr = Box::into_raw(buf.into_boxed_slice()).cast::<u8>() as usize;
    *arena = Some((ptr, min_len));
    Some((ptr, min_len))
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
/// when the model asks, inside a **tool arena** of guest memory the SDK lends it: the
/// first registration allocates the SDK's arena ([`DEFAULT_TOOL_ARENA_BYTES`], or the
/// size given to [`with_tool_arena`](Chat::with_tool_arena)) and sets the session's
/// `tool_arena_ptr` and `tool_arena_len` params. Setting either param yourself turns this
/// off for the session.
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
    /// The session's arena params are set (by the SDK or by the caller).
    arena_set: bool,
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
            arena_set: false,
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
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if `message` is not an object with a
    /// string `role`.
    pub fn message(&mut self, message: Value) -> Result<&mut Chat> {
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
    /// `mcp.server_ids`, `mcp.tool_allowlist`, `mcp.tool_denylist`, `tool_arena_ptr`,
    /// `tool_arena_len`) and sends every other key upstream as given; `null` removes a key.
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
    /// that does not serialize to JSON).
    pub fn param(&mut self, key: &str, value: impl Serialize) -> Result<&mut Chat> {
        self.set_param(key, value)?;
        if key == "tool_arena_ptr" || key == "tool_arena_len" {
            // The caller manages the arena of this session.
            self.arena_set = true;
        }
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

    /// Sends the session with [`SendFlags::AUTO_TOOL_CALL`] and [`SendFlags::METRICS`]: the
    /// host runs the model's tool calls until it answers. The answer is appended to the
    /// session, so the conversation can go on with [`user`](Chat::user).
    pub fn complete(&mut self) -> Result<Response> {
        self.send(SendFlags::AUTO_TOOL_CALL | SendFlags::METRICS)
    }

    /// Closes the session, reporting the host's error if there is one. Its responses stay
    /// open.
    pub fn close(mut self) -> Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        close(fd)
    }

    /// SET_PARAM without the bookkeeping of [`Chat::param`].
    fn set_param(&self, key: &str, value: impl Serialize) -> Result<()> {
        let op = || format!("cchat_ctl({}, SET_PARAM, {key:?})", self.fd);
        let value =
            serde_json::to_value(value).map_err(|_| Error::from_errno(op(), Errno::EINVAL))?;
        let param = json!({ "key": key, "value": value }).to_string();
        self.ctl_in(sys::CTL_SET_PARAM, op, param.as_bytes())
    }

    /// Lends the host the SDK's tool arena, unless this session's arena is already set.
    fn ensure_tool_arena(&mut self) -> Result<()> {
        if self.arena_set {
            return Ok(());
        }
        let (ptr, len) = tool_arena(self.arena_bytes).ok_or_else(|| {
            Error::from_errno(format!("tool_arena({})", self.arena_bytes), Errno::ENOMEM)
        })?;
        self.set_param("tool_arena_ptr", ptr)?;
        self.set_param("tool_arena_len", len)?;
        self.arena_set = true;
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
        if self.fd >= 0 {
            // SAFETY: no pointer arguments. Errors cannot be reported from `drop`.
            unsafe { sys::cchat_close(self.fd) };
        }
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
/// it is `{"error": {"code", "message", ..}, "_spear": {..}}`. The body is read once
/// ([`json`](Response::json)) and cached. The fd is closed when the `Response` is dropped.
///
/// ```no_run
/// # fn main() -> quiver_guest::Result<()> {
/// # let mut chat = quiver_guest::Chat::new()?;
/// let response = chat.complete()?;
/// if let Some(error) = response.error()? {
///     eprintln!("{}: {}", error["code"], error["message"]);
///     return Ok(());
/// }
/// println!("{}", response.text()?.unwrap_or_default());
/// for call in response.spear()?["tool_calls"].as_array().into_iter().flatten() {
///     println!("ran {} ({})", call["name"], call["kind"]);
/// }
/// println!("{}", response.metrics()?["latency_ms"]["total"]);
/// # Ok(())
/// # }
/// ```
pub struct Response {
    fd: i32,
    body: OnceCell<Value>,
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

    /// The decoded body, read from the host on the first call.
    fn body_json(&self) -> Result<&Value> {
        if let Some(body) = self.body.get() {
            return Ok(body);
        }
        let bytes = self.body()?;
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| Error::from_json(format!("cchat_recv({})", self.fd), e))?;
        Ok(self.body.get_or_init(|| body))
    }

    /// The whole response body as JSON.
    pub fn json(&self) -> Result<Value> {
        self.body_json().cloned()
    }

    /// The answer's text: `choices[0].message.content` (the `text` parts joined, if the
    /// content is an array of parts). `None` if there is no content, e.g. for an error or
    /// an answer that only has `tool_calls`.
    pub fn text(&self) -> Result<Option<String>> {
        let content = &self.body_json()?["choices"][0]["message"]["content"];
        Ok(match content {
            Value::String(text) => Some(text.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter(|part| part["type"] == "text")
                    .filter_map(|part| part["text"].as_str())
                    .collect(),
            ),
            _ => None,
        })
    }

    /// The tool calls the model asks for in this answer: `choices[0].message.tool_calls`
    /// (empty if none). After [`Chat::complete`] the host has already run them; see
    /// [`spear`](Response::spear) for what it ran.
    pub fn tool_calls(&self) -> Result<Vec<Value>> {
        let calls = &self.body_json()?["choices"][0]["message"]["tool_calls"];
        Ok(calls.as_array().cloned().unwrap_or_default())
    }

    /// The top-level `error` object if the request failed (`llm_unavailable`,
    /// `llm_timeout`, `llm_http_error`, `llm_invalid_response`, `backend_unknown`,
    /// `tool_call_limit`), `None` on success.
    pub fn error(&self) -> Result<Option<Value>> {
        let body = self.body_json()?;
        Ok(body.get("error").filter(|e| !e.is_null()).cloned())
    }

    /// The host's `_spear` object: `backend`, `model`, `iterations`, `usage`, and
    /// `tool_calls` (one `{"id", "name", "kind", "ok", "ms", ..}` per tool call the host
    /// ran; `kind` is `guest` or `mcp`). `Null` if absent.
    pub fn spear(&self) -> Result<Value> {
        Ok(self.body_json()?["_spear"].clone())
    }

    /// The metrics of the send (`cchat_ctl` GET_METRICS): iterations, LLM requests,
    /// retries and errors, token counts, tool call counts and latencies.
    pub fn metrics(&self) -> Result<Value> {
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
            .field("body", &self.body.get())
            .finish()
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
            arena_set: false,
            tools: 0,
        }
    }

    fn response(body: Value) -> Response {
        Response {
            fd: -1,
            body: OnceCell::from(body),
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
    fn failed_arena_param_leaves_the_arena_to_the_sdk() {
        let mut chat = chat();
        // The fallback fails, so the flag stays unset.
        assert!(chat.param("tool_arena_len", 10).is_err());
        assert!(!chat.arena_set);
    }

    #[test]
    fn arena_is_shared_and_grows() {
        let (ptr, len) = tool_arena(1000).unwrap();
        assert!(len >= 1000);
        assert_eq!(tool_arena(10).unwrap(), (ptr, len));
        let (bigger, bigger_len) = tool_arena(len + 1).unwrap();
        assert_eq!(bigger_len, len + 1);
        assert_ne!(bigger, ptr);
        assert_eq!(tool_arena(len).unwrap(), (bigger, bigger_len));
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
        assert_eq!(r.spear().unwrap()["tool_calls"][0]["kind"], "guest");
        assert_eq!(r.json().unwrap()["id"], "x");
    }

    #[test]
    fn response_with_tool_calls_or_parts() {
        let r = response(json!({"choices": [{"message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"}}]
        }}]}));
        assert_eq!(r.text().unwrap(), None);
        assert_eq!(r.tool_calls().unwrap()[0]["id"], "c1");

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
        assert_eq!(r.error().unwrap().unwrap()["code"], "llm_timeout");
        assert_eq!(r.text().unwrap(), None);
        assert!(r.tool_calls().unwrap().is_empty());
        assert_eq!(response(json!({"error": null})).error().unwrap(), None);
        assert_eq!(response(json!([])).spear().unwrap(), Value::Null);
    }
}
