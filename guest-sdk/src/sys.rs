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
}

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
}

#[cfg(not(target_arch = "wasm32"))]
pub use fallback::*;
