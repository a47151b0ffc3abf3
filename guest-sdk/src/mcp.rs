//! MCP sessions: list and call the tools of the MCP servers in the host's registry.

use serde_json::Value;

use crate::buffer::{INITIAL_CAPACITY, addr, arg, call_json, call_with_buffer, check};
use crate::{Errno, Error, Result, sys};

/// An open MCP session: an fd on one server of the host's MCP registry.
///
/// The host pools the server connections, so opening and dropping sessions is cheap and
/// never starts or stops a server process. The fd is closed when the `Mcp` is dropped; use
/// [`Mcp::close`] to see the error, if any.
///
/// ```no_run
/// use quiver_guest::Mcp;
/// use serde_json::json;
///
/// # fn main() -> quiver_guest::Result<()> {
/// let fs = Mcp::open("fs")?;
/// for name in fs.list_tool_names()? {
///     println!("{name}");
/// }
/// let result = fs.call_tool("read_file", json!({ "path": "/etc/hostname" }))?;
/// if result.is_error() {
///     eprintln!("{:?}: {}", result.error_code(), result.error_message().unwrap_or(""));
/// } else {
///     println!("{}", result.text());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Mcp {
    fd: i32,
    server_id: String,
}

impl Mcp {
    /// Opens a session on the registry server `server_id`.
    ///
    /// # Errors
    ///
    /// [`Errno::ENOENT`] if the id is not in the registry, [`Errno::EACCES`] if the task or
    /// session policy does not permit the server, [`Errno::EMFILE`] if the fd table is
    /// full.
    pub fn open(server_id: &str) -> Result<Mcp> {
        let op = || format!("mcp_open({server_id:?})");
        let (id_ptr, id_len) = arg(&op(), server_id.as_bytes())?;
        // SAFETY: `server_id` is readable for `id_len` bytes during the call.
        let ret = unsafe { sys::mcp_open(id_ptr, id_len) };
        let fd = check(op, ret)?;
        Ok(Mcp {
            fd,
            server_id: server_id.to_owned(),
        })
    }

    /// The session's fd.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// The registry id this session was opened on.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// Lists the server's tools, after the host's allow/deny filters.
    ///
    /// The host returns `{"server_id": .., "tools": [{"name", "description",
    /// "inputSchema", ..}]}` with MCP-native tool names.
    pub fn list_tools(&self) -> Result<Value> {
        let op = format!("mcp_list_tools({:?})", self.server_id);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::mcp_list_tools(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// The names of the server's tools, in the order the host lists them.
    pub fn list_tool_names(&self) -> Result<Vec<String>> {
        let listing = self.list_tools()?;
        let names = listing["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|tool| tool["name"].as_str())
            .map(str::to_owned)
            .collect();
        Ok(names)
    }

    /// Calls the tool `name` with `args`, which must be a JSON object.
    ///
    /// A failure of the tool itself (the server's `isError`, or the host's
    /// `{"error": ..}` for an unavailable server, a timeout, invalid arguments, ...) is
    /// an `Ok` [`ToolResult`] whose [`is_error`](ToolResult::is_error) is true; `Err` means
    /// the hostcall itself failed.
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] (without calling the host) if `args` is not an object,
    /// [`Errno::EACCES`] if the tool is outside the allow/deny filters, [`Errno::EBADF`]
    /// if the session is closed, or a [`Error::Json`] if the host's answer is not JSON.
    pub fn call_tool(&self, name: &str, args: Value) -> Result<ToolResult> {
        let op = || format!("mcp_call_tool({:?}, {name:?})", self.server_id);
        if !args.is_object() {
            return Err(Error::from_errno(op(), Errno::EINVAL));
        }
        let args = args.to_string();
        let bytes = self.call_tool_raw(name, &args)?;
        ToolResult::from_slice(&bytes).map_err(|e| Error::from_json(op(), e))
    }

    /// Calls the tool `name` with `args_json` (a JSON object, passed through unchecked)
    /// and returns the host's answer undecoded.
    pub fn call_tool_raw(&self, name: &str, args_json: &str) -> Result<Vec<u8>> {
        let op = format!("mcp_call_tool({:?}, {name:?})", self.server_id);
        let (name_ptr, name_len) = arg(&op, name.as_bytes())?;
        let (args_ptr, args_len) = arg(&op, args_json.as_bytes())?;
        call_with_buffer(&op, INITIAL_CAPACITY, |out, out_len| {
            // SAFETY: `name` and `args_json` are readable for their lengths, and
            // `call_with_buffer` passes a writable buffer of `*out_len` bytes. A retry after
            // -ENOSPC returns the result the host kept on the fd; the tool runs once.
            unsafe {
                sys::mcp_call_tool(
                    self.fd,
                    name_ptr,
                    name_len,
                    args_ptr,
                    args_len,
                    addr(out),
                    addr(out_len),
                )
            }
        })
    }

    /// Closes the session, reporting the host's error if there is one.
    pub fn close(mut self) -> Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        // SAFETY: no pointer arguments.
        let ret = unsafe { sys::mcp_close(fd) };
        check(|| format!("mcp_close({:?})", self.server_id), ret).map(drop)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: no pointer arguments. Errors cannot be reported from `drop`.
            unsafe { sys::mcp_close(self.fd) };
        }
    }
}

/// The answer to [`Mcp::call_tool`].
///
/// Wraps one of two JSON shapes:
///
/// - the MCP `CallToolResult` of the server:
///   `{"content": [{"type": "text", "text": ..}, {"type": "image", "data": ..,
///   "mimeType": ..}, ..], "isError": bool?, "structuredContent": ..?}`;
/// - the host's error object when the call could not be completed:
///   `{"error": {"code": .., "message": .., "retryable": bool}}`, with codes
///   `mcp_unavailable`, `mcp_timeout`, `mcp_invalid_arguments`, `mcp_policy_denied` and
///   `mcp_output_too_large`.
///
/// ```
/// use quiver_guest::ToolResult;
/// use serde_json::json;
///
/// let ok = ToolResult::from_json(json!({
///     "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
/// }));
/// assert!(!ok.is_error());
/// assert_eq!(ok.text(), "a\nb");
///
/// let failed = ToolResult::from_json(json!({
///     "error": {"code": "mcp_timeout", "message": "no answer in 30s", "retryable": true}
/// }));
/// assert!(failed.is_error());
/// assert_eq!(failed.error_code(), Some("mcp_timeout"));
/// assert!(failed.is_retryable());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    json: Value,
}

impl ToolResult {
    /// Wraps a JSON value returned by the host.
    pub fn from_json(json: Value) -> ToolResult {
        ToolResult { json }
    }

    /// Decodes the bytes returned by [`Mcp::call_tool_raw`].
    pub fn from_slice(bytes: &[u8]) -> serde_json::Result<ToolResult> {
        serde_json::from_slice(bytes).map(ToolResult::from_json)
    }

    /// The whole JSON answer.
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The whole JSON answer, by value.
    pub fn into_json(self) -> Value {
        self.json
    }

    /// The host's `error` object, if the call could not be completed.
    fn host_error(&self) -> Option<&Value> {
        self.json.get("error").filter(|e| e.is_object())
    }

    /// True if the tool reported `isError`, or the host returned an `error` object.
    pub fn is_error(&self) -> bool {
        self.host_error().is_some() || self.json["isError"].as_bool().unwrap_or(false)
    }

    /// The host's error code (`"mcp_timeout"`, ..), if it returned an `error` object.
    pub fn error_code(&self) -> Option<&str> {
        self.host_error()?["code"].as_str()
    }

    /// The host's error message, if it returned an `error` object.
    pub fn error_message(&self) -> Option<&str> {
        self.host_error()?["message"].as_str()
    }

    /// True if the host's error object says a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        self.host_error()
            .and_then(|e| e["retryable"].as_bool())
            .unwrap_or(false)
    }

    /// The `content` parts of the result (empty for a host error).
    pub fn content(&self) -> &[Value] {
        self.json["content"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The text of the `"type": "text"` content parts, joined by `"\n"`.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .content()
            .iter()
            .filter(|part| part["type"] == "text")
            .filter_map(|part| part["text"].as_str())
            .collect();
        texts.join("\n")
    }

    /// The result's `structuredContent`, if the tool returned one.
    pub fn structured_content(&self) -> Option<&Value> {
        self.json.get("structuredContent").filter(|v| !v.is_null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn success_result() {
        let result = ToolResult::from_slice(
            br#"{"content":[{"type":"text","text":"one"},
                {"type":"image","data":"AAAA","mimeType":"image/png"},
                {"type":"text","text":"two"}],
                "structuredContent":{"n":2}}"#,
        )
        .unwrap();
        assert!(!result.is_error());
        assert_eq!(result.error_code(), None);
        assert_eq!(result.error_message(), None);
        assert!(!result.is_retryable());
        assert_eq!(result.content().len(), 3);
        assert_eq!(result.text(), "one\ntwo");
        assert_eq!(result.structured_content(), Some(&json!({"n": 2})));
    }

    #[test]
    fn tool_reported_error() {
        let result = ToolResult::from_json(json!({
            "content": [{"type": "text", "text": "no such file"}],
            "isError": true
        }));
        assert!(result.is_error());
        assert_eq!(result.error_code(), None);
        assert_eq!(result.text(), "no such file");
    }

    #[test]
    fn host_error_object() {
        let result = ToolResult::from_json(json!({
            "error": {"code": "mcp_policy_denied", "message": "denied", "retryable": false}
        }));
        assert!(result.is_error());
        assert_eq!(result.error_code(), Some("mcp_policy_denied"));
        assert_eq!(result.error_message(), Some("denied"));
        assert!(!result.is_retryable());
        assert_eq!(result.text(), "");
        assert!(result.content().is_empty());
        assert_eq!(result.structured_content(), None);
    }

    #[test]
    fn odd_shapes_do_not_panic() {
        for json in [json!(null), json!([]), json!("x"), json!({"content": "x"})] {
            let result = ToolResult::from_json(json);
            assert!(!result.is_error());
            assert_eq!(result.text(), "");
        }
        let result = ToolResult::from_json(json!({"isError": false, "error": "not an object"}));
        assert!(!result.is_error());
    }

    #[test]
    fn call_tool_rejects_non_object_args() {
        let mcp = Mcp {
            fd: -1,
            server_id: "fs".into(),
        };
        let err = mcp.call_tool("read", json!([1])).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        assert_eq!(err.op(), r#"mcp_call_tool("fs", "read")"#);
    }
}
