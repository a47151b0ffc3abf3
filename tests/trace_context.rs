//! W3C trace context on MCP requests (issue 24): a `resources/read` and a `tools/call`
//! carry their span's `traceparent`/`tracestate` in `_meta`. The
//! embedder's [`Propagator`] (the node's is OpenTelemetry's) gives every span a context
//! derived from its `tracing` id, so the test sees which span the server was sent.

use quiver::telemetry::{Propagator, TraceContext, set_propagator};
use quiver_tests::{RegistryDir, host, mcp_task, wat};
use serde_json::Value;

const TRACE: &str = "5b8aa5a2d2c872e8321cf37308d69df2";

struct SpanIds;

impl Propagator for SpanIds {
    fn context_of(&self, span: &tracing::Span) -> Option<TraceContext> {
        let id = span.id()?.into_u64();
        TraceContext::parse(&format!("00-{TRACE}-{id:016x}-01"), Some("quiver-test=1")).ok()
    }

    fn set_parent(&self, _span: &tracing::Span, _parent: &TraceContext) {}
}

/// Both requests run in one test: the subscriber and the propagator are process-wide.
#[tokio::test]
async fn a_resource_read_and_a_tool_call_send_their_spans_trace_context_in_meta() {
    // Spans need a subscriber to have ids.
    tracing::subscriber::set_global_default(tracing_subscriber::registry()).unwrap();
    assert!(set_propagator(SpanIds));
    let registry = RegistryDir::new();
    registry.write(
        "fixture.toml",
        &format!(
            "allowed_resources = [\"fixture://*\"]\n{}",
            quiver_tests::fixture_toml("fixture", &["echo", "request_meta"], "")
        ),
    );
    let host = host(&registry);
    let body = r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1100) (i32.const 14) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1200) (i32.const 12) (i32.const 1300) (i32.const 2) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#;
    let guest = wat::guest(
        &[
            (1024, b"fixture"),
            (1100, b"fixture://meta"),
            (1200, b"request_meta"),
            (1300, b"{}"),
        ],
        body,
    );
    let run = wat::run_ok(&host, &guest, &mcp_task("meta", &["fixture"])).await;
    assert!(
        run.results.iter().all(|&n| n > 0),
        "{:?} {:?}",
        run.results,
        run.emitted
    );
    let read: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    let called: Value = serde_json::from_str(&run.emitted[1]).unwrap();
    for text in [&read["contents"][0]["text"], &called["content"][0]["text"]] {
        let meta: Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
        let parent = meta["traceparent"].as_str().unwrap_or_default();
        assert!(
            parent.starts_with(&format!("00-{TRACE}-")) && parent.ends_with("-01"),
            "{meta}"
        );
        assert_ne!(&parent[36..52], "0000000000000000", "{meta}");
        assert_eq!(meta["tracestate"], "quiver-test=1", "{meta}");
    }
    // The call's line is the host's own (the direct path): the rest of its `_meta` is what
    // rmcp would have sent, as the server read it.
    let meta: Value = serde_json::from_str(called["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        meta["io.modelcontextprotocol/protocolVersion"], "2026-07-28",
        "{meta}"
    );
    assert!(
        meta["io.modelcontextprotocol/clientInfo"]["name"].is_string(),
        "{meta}"
    );
    assert!(
        meta["io.modelcontextprotocol/clientCapabilities"].is_object(),
        "{meta}"
    );
    assert!(
        meta["progressToken"].as_i64().is_some_and(|n| n < 0),
        "{meta}"
    );
    host.shutdown().await;
}
