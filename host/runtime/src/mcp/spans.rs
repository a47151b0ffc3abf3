//! The MCP client span of each request (OpenTelemetry MCP conventions: named
//! `{mcp.method.name} {target}`, kind client) and the W3C trace context its `_meta` and
//! HTTP headers carry (SEP-414). Attributes hold names, never argument values or results;
//! every text a server controls is cut to [`defaults::MAX_SPAN_ATTRIBUTE_BYTES`].

use std::collections::HashMap;

use http::{HeaderName, HeaderValue};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, RequestMetaObject, RequestParamsMeta, ServerPeerInfo,
};
use tracing::field::Empty;

use super::McpError;
use crate::defaults;
use crate::registry::{ServerEntry, Transport};
use crate::text::cut;

/// The span of one `method` request to `entry`'s server; `target` is the tool or prompt
/// name, if the method has one.
pub(crate) fn request(entry: &ServerEntry, method: &str, target: Option<&str>) -> tracing::Span {
    let target = target.map(|t| cut(t, defaults::MAX_TOOL_NAME_BYTES));
    let transport = match entry.record.transport {
        Transport::Stdio => "pipe",
        Transport::StreamableHttp | Transport::HttpSseLegacy => "tcp",
    };
    let tool = (method == "tools/call").then_some(target).flatten();
    tracing::info_span!(
        "mcp_request",
        otel.name = %SpanName(method, target),
        otel.kind = "client",
        otel.status_code = Empty,
        mcp.method.name = method,
        gen_ai.operation.name = tool.map(|_| "execute_tool"),
        gen_ai.tool.name = tool,
        gen_ai.prompt.name = (method == "prompts/get").then_some(target).flatten(),
        quiver.server.id = entry.server_id(),
        network.transport = transport,
        mcp.protocol.version = Empty,
        error.type = Empty,
    )
}

/// `{method} {target}`, formatted only by a subscriber that records the span.
struct SpanName<'a>(&'a str, Option<&'a str>);

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            Some(target) => write!(f, "{} {target}", self.0),
            None => f.write_str(self.0),
        }
    }
}

/// What the server said in its handshake (its protocol version).
pub(crate) fn record_peer(span: &tracing::Span, info: Option<&ServerPeerInfo>) {
    if span.is_disabled() {
        return;
    }
    if let Some(info) = info {
        let version = info.protocol_version.to_string();
        span.record(
            "mcp.protocol.version",
            cut(&version, defaults::MAX_SPAN_ATTRIBUTE_BYTES),
        );
    }
}

/// A request that failed: its error code (`mcp_timeout`, ...) is the span's `error.type`.
pub(crate) fn record_error(span: &tracing::Span, error: &McpError) {
    span.record("otel.status_code", "error");
    span.record("error.type", error.code.as_str());
}

/// A `tools/call` answered with `isError`: `error.type` is `tool_error`, as the
/// conventions say.
pub(crate) fn record_tool_error(span: &tracing::Span) {
    span.record("otel.status_code", "error");
    span.record("error.type", "tool_error");
}

/// Puts `span`'s trace context into `params`' `_meta` (`traceparent`, `tracestate`), if a
/// propagator knows it.
pub(crate) fn propagate(span: &tracing::Span, params: &mut impl RequestParamsMeta) {
    if let Some(meta) = trace_meta(span) {
        params.meta_or_default().extend(meta);
    }
}

/// `span`'s trace context as a request's `_meta` (what [`propagate`] adds), if a
/// propagator knows it.
pub(crate) fn trace_meta(span: &tracing::Span) -> Option<RequestMetaObject> {
    let context = crate::trace::context_of(span)?;
    let mut meta = RequestMetaObject::new();
    meta.set_traceparent(context.traceparent());
    if let Some(state) = context.tracestate() {
        meta.set_tracestate(state);
    }
    Some(meta)
}

/// The HTTP headers for `message`: its `_meta` trace context, as `traceparent` and
/// `tracestate` headers (the request is sent from rmcp's transport task, outside the
/// caller's span, so the message is where the context travels). Only values the host
/// wrote itself pass: a value that is not a valid context is not sent.
pub(crate) fn with_trace_headers(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return headers;
    };
    let meta = match &request.request {
        ClientRequest::CallToolRequest(r) => r.params.meta(),
        ClientRequest::ReadResourceRequest(r) => r.params.meta(),
        ClientRequest::GetPromptRequest(r) => r.params.meta(),
        _ => None,
    };
    let Some(meta) = meta else {
        return headers;
    };
    let Some(parent) = meta.get_traceparent() else {
        return headers;
    };
    if let Ok(context) = crate::TraceContext::parse(parent, meta.get_tracestate()) {
        for (name, value) in context.pairs() {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolRequestParams, JsonRpcRequest, NumberOrString, Request};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn call_with_meta(parent: Option<&str>) -> ClientJsonRpcMessage {
        let mut params = CallToolRequestParams::new("add");
        if let Some(parent) = parent {
            params.set_traceparent(parent);
            params.set_tracestate("vendor=1");
        }
        ClientJsonRpcMessage::Request(JsonRpcRequest::new(
            NumberOrString::Number(1),
            ClientRequest::CallToolRequest(Request::new(params)),
        ))
    }

    #[test]
    fn the_meta_context_becomes_http_headers() {
        let headers = with_trace_headers(&call_with_meta(Some(PARENT)), HashMap::new());
        assert_eq!(headers[&HeaderName::from_static("traceparent")], PARENT);
        assert_eq!(headers[&HeaderName::from_static("tracestate")], "vendor=1");
        assert!(with_trace_headers(&call_with_meta(None), HashMap::new()).is_empty());
    }

    #[test]
    fn a_meta_value_that_is_not_a_context_sends_no_header() {
        let forged = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx-evil: 1";
        let headers = with_trace_headers(&call_with_meta(Some(forged)), HashMap::new());
        assert!(headers.is_empty(), "{headers:?}");
    }
}
