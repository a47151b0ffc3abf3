//! MCP sessions: list and call the tools, read the resources and get the prompts of the MCP
//! servers in the host's registry.
//!
//! [`Mcp`] and [`ToolResult`] are re-exported at the crate root; this module also holds the
//! typed views of what the host answers ([`ToolList`], [`Content`], [`HostError`], ..).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::buffer::{INITIAL_CAPACITY, addr, arg, call_json, call_with_buffer, check};
use crate::rt::InFlight;
use crate::{Errno, Error, Result, lenient, sys};

mod questions;
mod types;

pub use questions::{Answer, Answerer, QUESTION_ARENA_BYTES, Question};
pub use types::{
    Content, EmbeddedResource, HostError, HostErrorCode, McpTool, MediaContent, ResourceContents,
    ResourceLink, TextContent, ToolList,
};

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
/// if let Some(error) = result.host_error() {
///     eprintln!("{error} (retryable: {})", error.retryable);
/// } else if result.is_error() {
///     eprintln!("tool failed: {}", result.text());
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

    /// Lists the server's tools, after the host's allow/deny filters, with MCP-native
    /// names.
    pub fn list_tools(&self) -> Result<ToolList> {
        self.list_tools_json().map(|json| lenient::value(&json))
    }

    /// The tool listing as the JSON the host returns: `{"server_id": .., "tools":
    /// [{"name", "description", "inputSchema", ..}]}`.
    pub fn list_tools_json(&self) -> Result<Value> {
        let op = format!("mcp_list_tools({:?})", self.server_id);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::mcp_list_tools(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// The server's resources within the session's resource filters, as the host
    /// returns them: `{"server_id": .., "resources": [{"uri", "name", "mimeType", ..}]}`.
    pub fn list_resources_json(&self) -> Result<Value> {
        let op = format!("mcp_list_resources({:?})", self.server_id);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::mcp_list_resources(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// The server's resource templates whose `uriTemplate` passes the resource filters:
    /// `{"server_id": .., "resourceTemplates": [{"uriTemplate", "name", ..}]}`.
    pub fn list_resource_templates_json(&self) -> Result<Value> {
        let op = format!("mcp_list_resource_templates({:?})", self.server_id);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::mcp_list_resource_templates(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// Reads the resource at `uri`: the MCP `ReadResourceResult` (`{"contents": [..]}`), or
    /// the host's `{"error": ..}` when the server failed.
    ///
    /// # Errors
    ///
    /// [`Errno::EACCES`] if `uri` is outside the resource filters, [`Errno::EINVAL`] if it is
    /// longer than 4096 bytes, [`Errno::EBADF`] if the session is closed.
    pub fn read_resource_json(&self, uri: &str) -> Result<Value> {
        let op = format!("mcp_read_resource({:?}, {uri:?})", self.server_id);
        let (uri_ptr, uri_len) = arg(&op, uri.as_bytes())?;
        call_json(&op, |out, out_len| {
            // SAFETY: `uri` is readable for its length, and `call_json` passes a writable
            // buffer of `*out_len` bytes; a retry gets the answer the host kept on the fd.
            unsafe { sys::mcp_read_resource(self.fd, uri_ptr, uri_len, addr(out), addr(out_len)) }
        })
    }

    /// The server's prompts within the session's prompt filters:
    /// `{"server_id": .., "prompts": [{"name", "description", "arguments", ..}]}`.
    pub fn list_prompts_json(&self) -> Result<Value> {
        let op = format!("mcp_list_prompts({:?})", self.server_id);
        call_json(&op, |out, out_len| {
            // SAFETY: `call_json` passes a writable buffer of `*out_len` bytes.
            unsafe { sys::mcp_list_prompts(self.fd, addr(out), addr(out_len)) }
        })
    }

    /// Gets the prompt `name` with `args` (a JSON object of strings, e.g.
    /// `{"city": "Lisbon"}`): the MCP `GetPromptResult` (`{"description", "messages"}`), or
    /// the host's `{"error": ..}` when the server failed or `args` is not an object of
    /// strings.
    ///
    /// # Errors
    ///
    /// [`Errno::EACCES`] if `name` is outside the prompt filters, [`Errno::EINVAL`] if it
    /// is longer than 128 bytes, [`Errno::EBADF`] if the session is closed.
    pub fn get_prompt_json(&self, name: &str, args: &Value) -> Result<Value> {
        let op = format!("mcp_get_prompt({:?}, {name:?})", self.server_id);
        let args = args.to_string();
        let (name_ptr, name_len) = arg(&op, name.as_bytes())?;
        let (args_ptr, args_len) = arg(&op, args.as_bytes())?;
        call_json(&op, |out, out_len| {
            // SAFETY: `name` and `args` are readable for their lengths, and `call_json`
            // passes a writable buffer of `*out_len` bytes; a retry gets the kept answer.
            unsafe {
                sys::mcp_get_prompt(
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

    /// Narrows this session with its own list `key` (`"mcp.tool_allowlist"`,
    /// `"mcp.tool_denylist"`, `"mcp.resource_allowlist"`, `"mcp.resource_denylist"`,
    /// `"mcp.prompt_allowlist"` or `"mcp.prompt_denylist"`) of at most 64 patterns, replacing
    /// its earlier list of that key. The registry's and the task's lists still apply: a
    /// session can only see less than it was opened with.
    ///
    /// ```no_run
    /// # fn main() -> quiver_guest::Result<()> {
    /// let docs = quiver_guest::Mcp::open("docs")?;
    /// docs.set_list("mcp.resource_allowlist", &["file:///srv/docs/public/*"])?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Errno::EINVAL`] for another key, too many or too long patterns,
    /// [`Errno::EBADF`] if the session is closed, [`Errno::ENOMEM`] if the host memory
    /// budget cannot hold the lists.
    pub fn set_list(&self, key: &str, patterns: &[&str]) -> Result<()> {
        let op = || format!("mcp_set_param({:?}, {key:?})", self.server_id);
        let param = serde_json::json!({ "key": key, "value": patterns }).to_string();
        let (param_ptr, param_len) = arg(&op(), param.as_bytes())?;
        // SAFETY: `param` is readable for its length.
        let ret = unsafe { sys::mcp_set_param(self.fd, param_ptr, param_len) };
        check(op, ret).map(drop)
    }

    /// The names of the server's tools, in the order the host lists them.
    pub fn list_tool_names(&self) -> Result<Vec<String>> {
        let listing = self.list_tools()?;
        Ok(listing.tools.into_iter().map(|tool| tool.name).collect())
    }

    /// Calls the tool `name` with `args`, which must serialize to a JSON object (a
    /// `serde_json::Value`, or a struct of your own).
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
    pub fn call_tool(&self, name: &str, args: impl serde::Serialize) -> Result<ToolResult> {
        let op = || format!("mcp_call_tool({:?}, {name:?})", self.server_id);
        let args = serde_json::to_value(args).unwrap_or(Value::Null);
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

    /// Starts calling the tool `name` with `args` (`mcp_call_start`) and returns at once;
    /// the returned future (see [`rt`](crate::rt)) gives what [`call_tool`](Mcp::call_tool)
    /// would. Dropping it before it is done cancels the call.
    ///
    /// # Errors
    ///
    /// As [`call_tool`](Mcp::call_tool), and [`Errno::EAGAIN`] when the task has 64 calls
    /// and sends in flight, or half of the server's `max_concurrency` in calls in flight.
    pub fn call_tool_async(&self, name: &str, args: impl serde::Serialize) -> Result<PendingCall> {
        let op = format!("mcp_call_start({:?}, {name:?})", self.server_id);
        let args = serde_json::to_value(args).unwrap_or(Value::Null);
        if !args.is_object() {
            return Err(Error::from_errno(op, Errno::EINVAL));
        }
        let args = args.to_string();
        let (name_ptr, name_len) = arg(&op, name.as_bytes())?;
        let (args_ptr, args_len) = arg(&op, args.as_bytes())?;
        // SAFETY: `name` and `args` are readable for their lengths.
        let ret = unsafe { sys::mcp_call_start(self.fd, name_ptr, name_len, args_ptr, args_len) };
        let fd = check(|| op.clone(), ret)?;
        Ok(PendingCall {
            inner: InFlight {
                fd,
                op: format!("mcp_call_recv({:?}, {name:?})", self.server_id),
                // SAFETY (at the call): the executor passes a writable buffer and length.
                read: |fd, out, out_len| unsafe { sys::mcp_call_recv(fd, out, out_len) },
            },
        })
    }

    /// Closes the session, reporting the host's error if there is one.
    pub fn close(mut self) -> Result<()> {
        let fd = std::mem::replace(&mut self.fd, -1);
        questions::forget(fd);
        // SAFETY: no pointer arguments.
        let ret = unsafe { sys::mcp_close(fd) };
        check(|| format!("mcp_close({:?})", self.server_id), ret).map(drop)
    }
}

/// A tool call in flight ([`Mcp::call_tool_async`]): a future of its [`ToolResult`].
/// Dropping it closes its call fd, which cancels the call if it still runs.
pub struct PendingCall {
    inner: InFlight<fn(i32, i32, i32) -> i32>,
}

impl PendingCall {
    /// The call fd (readable once the answer is there).
    pub fn fd(&self) -> i32 {
        self.inner.fd
    }
}

impl Future for PendingCall {
    type Output = Result<ToolResult>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        Pin::new(&mut this.inner).poll(cx).map(|read| {
            let bytes = read?;
            ToolResult::from_slice(&bytes).map_err(|e| Error::from_json(this.inner.op.clone(), e))
        })
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        // SAFETY: no pointer arguments. Errors cannot be reported from `drop`.
        unsafe { sys::mcp_close(self.inner.fd) };
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        if self.fd >= 0 {
            questions::forget(self.fd);
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
///   "mimeType": ..}, ..], "isError": bool?, "structuredContent": ..?}`, whose parts are
///   typed as [`Content`];
/// - the host's error object when the call could not be completed:
///   `{"error": {"code": .., "message": .., "retryable": bool}}`, typed as [`HostError`].
///
/// Decoding never fails on an odd shape: what does not decode is left out of the typed
/// view, and [`json`](ToolResult::json) has the answer as sent.
///
/// ```
/// use quiver_guest::ToolResult;
/// use quiver_guest::mcp::{Content, HostErrorCode};
/// use serde_json::json;
///
/// let ok = ToolResult::from_json(json!({
///     "content": [{"type": "text", "text": "a"},
///                 {"type": "image", "data": "AAAA", "mimeType": "image/png"},
///                 {"type": "text", "text": "b"}]
/// }));
/// assert!(!ok.is_error());
/// assert_eq!(ok.text(), "a\nb");
/// let Content::Image(image) = &ok.content()[1] else { panic!() };
/// assert_eq!(image.mime_type, "image/png");
///
/// let failed = ToolResult::from_json(json!({
///     "error": {"code": "mcp_timeout", "message": "no answer in 30s", "retryable": true}
/// }));
/// assert!(failed.is_error());
/// let error = failed.host_error().unwrap();
/// assert_eq!(error.code, HostErrorCode::Timeout);
/// assert!(error.retryable);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    json: Value,
    content: Vec<Content>,
    tool_error: bool,
    host_error: Option<HostError>,
}

impl ToolResult {
    /// Wraps a JSON value returned by the host.
    pub fn from_json(json: Value) -> ToolResult {
        let host_error = json
            .get("error")
            .filter(|e| e.is_object())
            .map(lenient::value::<HostError>);
        let result: types::CallToolResult = lenient::value(&json);
        ToolResult {
            json,
            content: result.content,
            tool_error: result.is_error,
            host_error,
        }
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

    /// True if the tool reported `isError`, or the host returned an `error` object.
    pub fn is_error(&self) -> bool {
        self.host_error.is_some() || self.tool_error
    }

    /// The host's error object, if it could not complete the call.
    pub fn host_error(&self) -> Option<&HostError> {
        self.host_error.as_ref()
    }

    /// The host's error code (`"mcp_timeout"`, ..), if it returned an `error` object.
    pub fn error_code(&self) -> Option<&str> {
        Some(self.host_error.as_ref()?.code.as_str())
    }

    /// The host's error message, if it returned an `error` object.
    pub fn error_message(&self) -> Option<&str> {
        Some(&self.host_error.as_ref()?.message)
    }

    /// True if the host's error object says a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        self.host_error.as_ref().is_some_and(|e| e.retryable)
    }

    /// The `content` parts of the result, typed (empty for a host error).
    pub fn content(&self) -> &[Content] {
        &self.content
    }

    /// The `content` parts as sent.
    pub fn content_json(&self) -> &[Value] {
        self.json["content"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The text of the `"type": "text"` content parts, joined by `"\n"`.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self.content.iter().filter_map(Content::as_text).collect();
        texts.join("\n")
    }

    /// The result's `structuredContent`, if the tool returned one.
    pub fn structured_content(&self) -> Option<&Value> {
        self.json.get("structuredContent").filter(|v| !v.is_null())
    }

    /// The result's `structuredContent` decoded into `T`; `None` if there is none.
    pub fn structured<T: DeserializeOwned>(&self) -> Option<serde_json::Result<T>> {
        self.structured_content().map(T::deserialize)
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
    fn typed_content_parts() {
        let result = ToolResult::from_json(json!({"content": [
            {"type": "text", "text": "hello", "annotations": {"audience": ["user"]}},
            {"type": "image", "data": "iVBO", "mimeType": "image/png"},
            {"type": "audio", "data": "UklG", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain",
                                              "text": "A"}},
            {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAEC"}},
            {"type": "resource_link", "uri": "file:///c", "name": "c", "size": 12},
            {"type": "video", "url": "x"},
            "not a part",
            {"type": "text", "text": 7}
        ], "structuredContent": {"sum": 5}}));
        let parts = result.content();
        assert_eq!(parts.len(), 9, "nothing is left out");
        let kinds: Vec<&str> = parts.iter().map(Content::kind).collect();
        assert_eq!(
            kinds,
            [
                "text",
                "image",
                "audio",
                "resource",
                "resource",
                "resource_link",
                "video",
                "",
                "text"
            ]
        );
        let Content::Text(text) = &parts[0] else {
            panic!("{:?}", parts[0])
        };
        assert_eq!(text.text, "hello");
        assert_eq!(text.extra["annotations"]["audience"][0], "user");
        assert!(!text.extra.contains_key("type"));
        let Content::Audio(audio) = &parts[2] else {
            panic!()
        };
        assert_eq!(
            (audio.data.as_str(), audio.mime_type.as_str()),
            ("UklG", "audio/wav")
        );
        let Content::Resource(embedded) = &parts[3] else {
            panic!()
        };
        assert_eq!(embedded.resource.text.as_deref(), Some("A"));
        let Content::Resource(binary) = &parts[4] else {
            panic!()
        };
        assert_eq!(binary.resource.blob.as_deref(), Some("AAEC"));
        let Content::ResourceLink(link) = &parts[5] else {
            panic!()
        };
        assert_eq!((link.name.as_str(), link.size), ("c", Some(12)));
        assert_eq!(
            parts[6],
            Content::Other(json!({"type": "video", "url": "x"}))
        );
        assert_eq!(parts[7], Content::Other(json!("not a part")));
        assert_eq!(result.text(), "hello\n");
        assert_eq!(result.content_json().len(), 9);

        // Parts serialize back to the MCP shape.
        for (part, json) in parts.iter().zip(result.content_json()) {
            if part.kind() != "text" || part.as_text() != Some("") {
                assert_eq!(&serde_json::to_value(part).unwrap(), json);
            }
        }

        #[derive(serde::Deserialize)]
        struct Sum {
            sum: i64,
        }
        assert_eq!(result.structured::<Sum>().unwrap().unwrap().sum, 5);
        assert!(result.structured::<String>().unwrap().is_err());
        assert!(
            ToolResult::from_json(json!({}))
                .structured::<Sum>()
                .is_none()
        );
    }

    #[test]
    fn typed_host_errors() {
        let result = ToolResult::from_json(json!({"error": {
            "code": "mcp_output_too_large", "message": "2 MiB", "retryable": false, "limit": 1
        }}));
        let error = result.host_error().unwrap();
        assert_eq!(error.code, HostErrorCode::OutputTooLarge);
        assert_eq!(error.extra["limit"], 1);
        assert_eq!(error.to_string(), "mcp_output_too_large: 2 MiB");

        let result =
            ToolResult::from_json(json!({"error": {"code": "brand_new", "retryable": "yes"}}));
        let error = result.host_error().unwrap();
        assert_eq!(error.code, HostErrorCode::Other("brand_new".into()));
        assert_eq!((error.message.as_str(), error.retryable), ("", false));
        assert_eq!(result.error_code(), Some("brand_new"));
        assert!(result.is_error());
    }

    #[test]
    fn tool_listing() {
        let listing: ToolList = lenient::value(&json!({"server_id": "fs", "tools": [
            {"name": "read", "description": "Reads", "inputSchema": {"type": "object"},
             "annotations": {"readOnlyHint": true}, "icons": []},
            {"name": "bare"},
            42,
            {"name": ["not", "a", "string"], "description": 3}
        ], "nextCursor": null}));
        assert_eq!(listing.server_id, "fs");
        assert_eq!(listing.tools.len(), 3);
        let read = listing.get("read").unwrap();
        assert_eq!(read.input_schema, json!({"type": "object"}));
        assert_eq!(read.annotations.as_ref().unwrap()["readOnlyHint"], true);
        assert_eq!(read.extra["icons"], json!([]));
        let bare = listing.get("bare").unwrap();
        assert_eq!(
            (bare.description.as_deref(), &bare.input_schema),
            (None, &Value::Null)
        );
        assert_eq!(listing.tools[2].name, "");
        assert!(listing.extra.contains_key("nextCursor"));
        assert_eq!(lenient::value::<ToolList>(&json!([1])), ToolList::default());
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
