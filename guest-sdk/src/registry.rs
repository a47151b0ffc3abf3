//! Read-only views of the host's MCP server registry.
//!
//! The views never include secrets: resolved environment values, headers and tokens stay
//! in the host.

use serde_json::Value;

use crate::buffer::{addr, arg, call_json};
use crate::{Result, sys};

/// Lists the servers in the registry, as the JSON the host returns.
pub fn list() -> Result<Value> {
    call_json("mcp_registry_list()", |out, out_len| {
        // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
        unsafe { sys::mcp_registry_list(addr(out), addr(out_len)) }
    })
}

/// Describes the registry server `server_id`, as the JSON the host returns.
///
/// # Errors
///
/// [`Errno::ENOENT`](crate::Errno::ENOENT) if the id is not in the registry.
pub fn get(server_id: &str) -> Result<Value> {
    let op = format!("mcp_registry_get({server_id:?})");
    let (id_ptr, id_len) = arg(&op, server_id.as_bytes())?;
    call_json(&op, |out, out_len| {
        // SAFETY: `server_id` is readable for `id_len` bytes, and `call_json` passes a
        // writable buffer of `*out_len` bytes.
        unsafe { sys::mcp_registry_get(id_ptr, id_len, addr(out), addr(out_len)) }
    })
}
