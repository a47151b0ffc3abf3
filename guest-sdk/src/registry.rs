//! Read-only views of the host's MCP server registry.
//!
//! The views never include secrets: resolved environment values, headers and tokens stay
//! in the host. [`list`] and [`get`] return typed views (decoded leniently, with unknown
//! fields in `extra`); [`list_json`] and [`get_json`] return the JSON as the host sent it.
//!
//! ```no_run
//! # fn main() -> quiver_guest::Result<()> {
//! for server in quiver_guest::registry::list()?.servers {
//!     match server.unavailable_reason {
//!         None if server.available => println!("{}: {:?}", server.server_id, server.allowed_tools),
//!         reason => println!("{}: unavailable ({})", server.server_id, reason.unwrap_or_default()),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::buffer::{addr, arg, call_json};
use crate::lenient::{self, field, list as list_of};
use crate::{Result, sys};

/// The answer to [`list`]: the servers this task may open.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Listing {
    /// Changes whenever the registry's content changes.
    #[serde(deserialize_with = "field")]
    pub revision: String,
    /// The servers.
    #[serde(deserialize_with = "list_of")]
    pub servers: Vec<Server>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One registry server, as a guest may see it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Server {
    /// The id to open it with ([`Mcp::open`](crate::Mcp::open)).
    #[serde(deserialize_with = "field")]
    pub server_id: String,
    /// A display name.
    #[serde(deserialize_with = "field")]
    pub display_name: Option<String>,
    /// `stdio`, `streamable_http` or `sse`.
    #[serde(deserialize_with = "field")]
    pub transport: Option<String>,
    /// The namespace of its tools, e.g. `mcp.fs`.
    #[serde(deserialize_with = "field")]
    pub tool_namespace: Option<String>,
    /// The registry's tool patterns (`*` and `?` wildcards).
    #[serde(deserialize_with = "list_of")]
    pub allowed_tools: Vec<String>,
    /// `never`, or a policy that needs approvals.
    #[serde(deserialize_with = "field")]
    pub approval_policy: Option<String>,
    /// Tags, for task profiles.
    #[serde(deserialize_with = "list_of")]
    pub tags: Vec<String>,
    /// Its budgets.
    #[serde(deserialize_with = "field")]
    pub budgets: Budgets,
    /// Whether it can be used (`false` if the host did not say).
    #[serde(deserialize_with = "field")]
    pub available: bool,
    /// Why it cannot be used, if it cannot.
    #[serde(deserialize_with = "field")]
    pub unavailable_reason: Option<String>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A server's budgets.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Budgets {
    /// Milliseconds a tool call may take.
    #[serde(deserialize_with = "field")]
    pub tool_timeout_ms: Option<u64>,
    /// Concurrent calls across all tasks.
    #[serde(deserialize_with = "field")]
    pub max_concurrency: Option<u64>,
    /// The largest result, in bytes.
    #[serde(deserialize_with = "field")]
    pub max_tool_output_bytes: Option<u64>,
    /// The largest tool list (all pages), in bytes.
    #[serde(deserialize_with = "field")]
    pub max_tool_list_bytes: Option<u64>,
    /// Milliseconds to start and connect the server, when its record sets it (otherwise
    /// the host's).
    #[serde(deserialize_with = "field")]
    pub connect_timeout_ms: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Lists the servers in the registry that this task may open.
pub fn list() -> Result<Listing> {
    list_json().map(|json| lenient::value(&json))
}

/// Describes the registry server `server_id`.
///
/// # Errors
///
/// [`Errno::ENOENT`](crate::Errno::ENOENT) if the id is not in the registry,
/// [`Errno::EACCES`](crate::Errno::EACCES) if this task may not open it.
pub fn get(server_id: &str) -> Result<Server> {
    get_json(server_id).map(|json| lenient::value(&json))
}

/// [`list`], as the JSON the host returns.
pub fn list_json() -> Result<Value> {
    call_json("mcp_registry_list()", |out, out_len| {
        // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
        unsafe { sys::mcp_registry_list(addr(out), addr(out_len)) }
    })
}

/// [`get`], as the JSON the host returns.
pub fn get_json(server_id: &str) -> Result<Value> {
    let op = format!("mcp_registry_get({server_id:?})");
    let (id_ptr, id_len) = arg(&op, server_id.as_bytes())?;
    call_json(&op, |out, out_len| {
        // SAFETY: `server_id` is readable for `id_len` bytes, and `call_json` passes a
        // writable buffer of `*out_len` bytes.
        unsafe { sys::mcp_registry_get(id_ptr, id_len, addr(out), addr(out_len)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Errno;
    use serde_json::json;

    #[test]
    fn a_listing() {
        let listing: Listing = lenient::value(&json!({
            "revision": "9f2c4e1ab03d77e2",
            "servers": [
                {"server_id": "fs", "display_name": "Filesystem", "transport": "stdio",
                 "tool_namespace": "mcp.fs", "allowed_tools": ["read_*"],
                 "approval_policy": "never", "tags": ["files"],
                 "budgets": {"tool_timeout_ms": 8000, "max_concurrency": 8,
                             "max_tool_output_bytes": 1048576, "max_tool_list_bytes": 4194304,
                             "connect_timeout_ms": 500},
                 "available": true, "lifecycle": "auto"},
                {"server_id": "gh", "available": false, "unavailable_reason": "GH_TOKEN unset",
                 "allowed_tools": ["a", 3, null, "b"], "budgets": "none"},
                "junk"
            ]
        }));
        assert_eq!(listing.revision, "9f2c4e1ab03d77e2");
        let [fs, gh] = &listing.servers[..] else {
            panic!("two servers");
        };
        assert_eq!(fs.allowed_tools, ["read_*"]);
        assert_eq!(fs.budgets.tool_timeout_ms, Some(8000));
        assert_eq!(fs.budgets.max_tool_list_bytes, Some(4194304));
        assert_eq!(fs.budgets.connect_timeout_ms, Some(500));
        assert!(fs.available);
        assert_eq!(fs.extra["lifecycle"], "auto");
        assert_eq!(gh.allowed_tools, ["a", "b"]);
        assert!(!gh.available);
        assert_eq!(gh.unavailable_reason.as_deref(), Some("GH_TOKEN unset"));
        assert_eq!(gh.budgets, Budgets::default());
    }

    #[test]
    fn native_builds_report_enosys() {
        assert_eq!(list().unwrap_err().errno(), Some(Errno::ENOSYS));
        let err = get("fs").unwrap_err();
        assert_eq!(err.op(), r#"mcp_registry_get("fs")"#);
    }
}
