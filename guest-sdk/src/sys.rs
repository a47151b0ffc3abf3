//! Raw hostcall imports from the `spear` import module.
//!
//! These are the functions exactly as the host exports them: every parameter is an `i32`,
//! a pointer is an offset into this module's linear memory, and every "length pointer"
//! points at a little-endian `u32`. A return value `>= 0` is success, a negative value is
//! `-errno`. Prefer the safe wrappers in the rest of the crate; this module exists for
//! callers that need a hostcall the wrappers do not cover yet.
//!
//! On targets other than `wasm32` the functions are replaced by fallbacks with identical
//! signatures that return `-ENOSYS` (and `0` for [`time_now_ms`]), so the crate, its docs
//! and its unit tests build natively.
//!
//! # Safety
//!
//! Every pointer argument must be the address of memory of the stated length that the
//! host may read (inputs) or write (outputs) for the duration of the call. Out-of-range
//! pointers are reported by the host as `-EFAULT`, but a valid-looking pointer to memory
//! the guest still uses elsewhere will be overwritten.

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "spear")]
unsafe extern "C" {
    /// `log(level, ptr, len) -> 0 / -errno`: write a log line at level 0 (trace) ..
    /// 4 (error).
    pub fn log(level: i32, ptr: i32, len: i32) -> i32;
    /// `time_now_ms() -> i64`: wall-clock milliseconds since the Unix epoch.
    pub fn time_now_ms() -> i64;

    /// `mcp_open(server_id_ptr, server_id_len) -> fd / -errno`.
    pub fn mcp_open(server_id_ptr: i32, server_id_len: i32) -> i32;
    /// `mcp_list_tools(fd, out_ptr, out_len_ptr) -> bytes / -errno`.
    pub fn mcp_list_tools(fd: i32, out_ptr: i32, out_len_ptr: i32) -> i32;
    /// `mcp_call_tool(fd, name_ptr, name_len, args_ptr, args_len, out_ptr, out_len_ptr)
    /// -> bytes / -errno`.
    pub fn mcp_call_tool(
        fd: i32,
        name_ptr: i32,
        name_len: i32,
        args_ptr: i32,
        args_len: i32,
        out_ptr: i32,
        out_len_ptr: i32,
    ) -> i32;
    /// `mcp_close(fd) -> 0 / -errno`.
    pub fn mcp_close(fd: i32) -> i32;
    /// `mcp_registry_list(out_ptr, out_len_ptr) -> bytes / -errno`.
    pub fn mcp_registry_list(out_ptr: i32, out_len_ptr: i32) -> i32;
    /// `mcp_registry_get(server_id_ptr, server_id_len, out_ptr, out_len_ptr)
    /// -> bytes / -errno`.
    pub fn mcp_registry_get(
        server_id_ptr: i32,
        server_id_len: i32,
        out_ptr: i32,
        out_len_ptr: i32,
    ) -> i32;

    /// `cchat_create() -> fd / -errno`: a new, empty chat session.
    pub fn cchat_create() -> i32;
    /// `cchat_write_msg(fd, role_ptr, role_len, content_ptr, content_len) -> 0 / -errno`:
    /// append `{"role": role, "content": content}`.
    pub fn cchat_write_msg(
        fd: i32,
        role_ptr: i32,
        role_len: i32,
        content_ptr: i32,
        content_len: i32,
    ) -> i32;
    /// `cchat_write_fn(fd, fn_offset, fn_json_ptr, fn_json_len) -> 0 / -errno`: register
    /// the guest tool at funcref table index `fn_offset` with an OpenAI tool definition.
    pub fn cchat_write_fn(fd: i32, fn_offset: i32, fn_json_ptr: i32, fn_json_len: i32) -> i32;
    /// `cchat_ctl(fd, cmd, arg_ptr, arg_len_ptr) -> 0 / bytes / -errno`: see the `CTL_*`
    /// constants.
    pub fn cchat_ctl(fd: i32, cmd: i32, arg_ptr: i32, arg_len_ptr: i32) -> i32;
    /// `cchat_send(fd, flags) -> response_fd / -errno`: see the `SEND_*` constants.
    pub fn cchat_send(fd: i32, flags: i32) -> i32;
    /// `cchat_recv(response_fd, out_ptr, out_len_ptr) -> bytes / -errno`: the response
    /// body.
    pub fn cchat_recv(response_fd: i32, out_ptr: i32, out_len_ptr: i32) -> i32;
    /// `cchat_close(fd) -> 0 / -errno`: close a session or response fd.
    pub fn cchat_close(fd: i32) -> i32;
}

/// `cchat_ctl` command 1, SET_PARAM: `arg` is `{"key": K, "value": V}`, its length in
/// `*arg_len_ptr`.
pub const CTL_SET_PARAM: i32 = 1;
/// `cchat_ctl` command 2, GET_METRICS: on a response fd; `arg` is an output buffer.
pub const CTL_GET_METRICS: i32 = 2;
/// `cchat_ctl` command 3, ADD_MESSAGE: `arg` is one chat message object, its length in
/// `*arg_len_ptr`.
pub const CTL_ADD_MESSAGE: i32 = 3;
/// `cchat_ctl` command 4, GET_MESSAGES: `arg` is an output buffer for the session's
/// messages.
pub const CTL_GET_MESSAGES: i32 = 4;

/// `cchat_send` flag bit 0: ask for metrics (always collected; accepted for
/// compatibility).
pub const SEND_METRICS: i32 = 1;
/// `cchat_send` flag bit 1: run the model's tool calls in the host and loop until it
/// answers.
pub const SEND_AUTO_TOOL_CALL: i32 = 2;

#[cfg(not(target_arch = "wasm32"))]
mod fallback {
    #![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
    //! Native stand-ins: there is no host, so every call fails with `-ENOSYS`.

    const NOSYS: i32 = -(crate::Errno::ENOSYS.raw());

    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn log(_level: i32, _ptr: i32, _len: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `0`.
    pub unsafe fn time_now_ms() -> i64 {
        0
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_open(_server_id_ptr: i32, _server_id_len: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_list_tools(_fd: i32, _out_ptr: i32, _out_len_ptr: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_call_tool(
        _fd: i32,
        _name_ptr: i32,
        _name_len: i32,
        _args_ptr: i32,
        _args_len: i32,
        _out_ptr: i32,
        _out_len_ptr: i32,
    ) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_close(_fd: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_registry_list(_out_ptr: i32, _out_len_ptr: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn mcp_registry_get(
        _server_id_ptr: i32,
        _server_id_len: i32,
        _out_ptr: i32,
        _out_len_ptr: i32,
    ) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_create() -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_write_msg(
        _fd: i32,
        _role_ptr: i32,
        _role_len: i32,
        _content_ptr: i32,
        _content_len: i32,
    ) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_write_fn(
        _fd: i32,
        _fn_offset: i32,
        _fn_json_ptr: i32,
        _fn_json_len: i32,
    ) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_ctl(_fd: i32, _cmd: i32, _arg_ptr: i32, _arg_len_ptr: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_send(_fd: i32, _flags: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_recv(_response_fd: i32, _out_ptr: i32, _out_len_ptr: i32) -> i32 {
        NOSYS
    }
    /// Native fallback: always `-ENOSYS`.
    pub unsafe fn cchat_close(_fd: i32) -> i32 {
        NOSYS
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use fallback::*;
