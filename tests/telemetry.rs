//! OpenTelemetry traces against a real backend: `quiver serve` exports a task over OTLP to
//! Arize Phoenix (tests/support/phoenix.rs), and the test reads the spans back through
//! Phoenix's REST API: one trace continuing the caller's, the parent/child shape, the
//! GenAI and MCP conventions' attribute names, and no secret or argument value. An
//! unreachable collector costs a task nothing. (Phoenix answers every span's kind as
//! INTERNAL, keeping OpenInference's kinds instead, so the client kind is not read back.)

use std::time::Duration;

use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::node::Node;
use quiver_tests::phoenix::{Phoenix, attribute};
use quiver_tests::{RegistryDir, example_guest, unique_id};
use reqwest::Method;
use serde_json::{Value, json};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const LLM_KEY: &str = "llm-key-secret-3b9e";
const COLLECTOR_KEY: &str = "collector-secret-71c2";
const ARGUMENT_VALUE: &str = "argument-value-5d0a";

/// The model asks for the guest's weather tool and two MCP calls, the second with
/// arguments the server refuses, then answers.
fn script() -> Vec<Reply> {
    vec![
        Reply::tool_calls([
            ("w", "get_weather", json!({"city": "Paris"})),
            ("a", "mcp__fixture__add", json!({"a": 2, "b": 3})),
            (
                "b",
                "mcp__fixture__add",
                json!({"a": ARGUMENT_VALUE, "b": 1}),
            ),
        ]),
        Reply::text("Sunny in Paris; 2+3=5."),
    ]
}

fn config(llm: &ScriptedLlm) -> String {
    format!(
        "default_backend = \"scripted\"\n\
         [backends.scripted]\nkind = \"openai\"\nbase_url = \"{}\"\n\
         api_key_env = \"QUIVER_TEST_LLM_KEY\"\ndefault_model = \"scripted-default\"\n",
        llm.base_url()
    )
}

fn task(id: &str) -> Value {
    json!({
        "task_id": id,
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": "[\"fixture\"]"},
        "limits": {"deadline_ms": 120000},
    })
}

/// Submits the chat-tools guest's task with `headers` and waits for it to finish; its
/// final view.
async fn run_task(node: &Node, headers: &[(&str, &str)]) -> Value {
    let module = node
        .upload(&std::fs::read(example_guest("chat-tools")).unwrap())
        .await;
    let mut request = node
        .request(Method::POST, "/v1/tasks")
        .json(&json!({"module": module, "task": task(&unique_id("otel"))}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let submitted = Node::send(request).await;
    assert_eq!(submitted.status, 202, "{submitted:?}");
    let id = submitted.json["id"].as_str().unwrap().to_owned();
    let done = node.task(&id, 60).await.json;
    assert_eq!(done["status"], "finished", "{done}\n{}", node.stderr());
    done
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one span {name:?} in {spans:#?}");
    found[0]
}

/// Whether `span`'s ancestors (within `spans`) include `ancestor`.
fn descends_from(spans: &[Value], span: &Value, ancestor: &Value) -> bool {
    let mut parent = span["parent_span_id"].as_str().map(str::to_owned);
    while let Some(id) = parent {
        if ancestor["span_id"] == id.as_str() {
            return true;
        }
        parent = spans
            .iter()
            .find(|s| s["span_id"] == id.as_str())
            .and_then(|s| s["parent_span_id"].as_str().map(str::to_owned));
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_is_one_trace_in_phoenix_continuing_the_callers() {
    let phoenix = Phoenix::start();
    let llm = ScriptedLlm::start(script()).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add"], "");
    let headers = format!("authorization=Bearer {COLLECTOR_KEY}");
    let config = format!(
        "{}[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n",
        config(&llm)
    );
    let node = Node::start(
        &registry,
        Some(&config),
        &[
            ("QUIVER_TEST_TOKEN", "otel-task-token"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &phoenix.base_url()),
            ("OTEL_EXPORTER_OTLP_HEADERS", &headers),
            ("OTEL_SERVICE_NAME", "quiver-test"),
            ("QUIVER_TEST_LLM_KEY", LLM_KEY),
        ],
    );
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let done = run_task(
        &node,
        &[("traceparent", &traceparent), ("tracestate", "caller=1")],
    )
    .await;
    assert_eq!(
        done["stdout"].as_str().unwrap_or_default().lines().next(),
        Some("Sunny in Paris; 2+3=5."),
        "{done}"
    );

    // task, cchat_send, 2 model requests, the guest tool, 2 tools/call (the chat tool
    // set's tools/list may add more).
    let spans = phoenix
        .trace(CALLER_TRACE, 7, Duration::from_secs(60))
        .await;
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    eprintln!("spans of the trace: {names:?}");
    let text = serde_json::to_string(&spans).unwrap();
    for secret in [LLM_KEY, COLLECTOR_KEY, ARGUMENT_VALUE, "Paris", "Sunny"] {
        assert!(
            !text.contains(secret),
            "{secret:?} reached the trace: {text}"
        );
    }
    assert!(
        spans.iter().all(|s| s["trace_id"] == CALLER_TRACE),
        "{spans:#?}"
    );

    let task = one(&spans, "task");
    assert_eq!(task["parent_span_id"], CALLER_SPAN, "{task:#}");
    assert!(attribute(task, "quiver.module.digest").is_some_and(|d| d.starts_with("sha256:")));
    assert_eq!(
        attribute(task, "quiver.task.outcome").as_deref(),
        Some("ok")
    );
    assert_eq!(attribute(task, "process.exit.code").as_deref(), Some("0"));
    assert_eq!(
        attribute(task, "quiver.principal").as_deref(),
        Some("serve")
    );

    let send = one(&spans, "cchat_send");
    assert_eq!(send["parent_span_id"], task["span_id"]);

    let requests = named(&spans, "chat scripted-default");
    assert_eq!(requests.len(), 2, "{spans:#?}");
    for request in &requests {
        assert_eq!(request["parent_span_id"], send["span_id"]);
        assert_eq!(
            attribute(request, "gen_ai.operation.name").as_deref(),
            Some("chat")
        );
        assert_eq!(
            attribute(request, "gen_ai.provider.name").as_deref(),
            Some("openai")
        );
        assert_eq!(
            attribute(request, "gen_ai.request.model").as_deref(),
            Some("scripted-default")
        );
        assert!(
            attribute(request, "gen_ai.response.model").is_some(),
            "{request:#}"
        );
        assert!(
            attribute(request, "gen_ai.usage.input_tokens").is_some(),
            "{request:#}"
        );
        assert!(
            attribute(request, "gen_ai.usage.output_tokens").is_some(),
            "{request:#}"
        );
    }
    let reasons: Vec<String> = requests
        .iter()
        .filter_map(|r| attribute(r, "gen_ai.response.finish_reasons"))
        .collect();
    assert!(reasons.contains(&"tool_calls".to_owned()), "{reasons:?}");
    assert!(reasons.contains(&"stop".to_owned()), "{reasons:?}");

    let weather = one(&spans, "execute_tool get_weather");
    assert_eq!(weather["parent_span_id"], send["span_id"]);
    assert_eq!(
        attribute(weather, "gen_ai.tool.name").as_deref(),
        Some("get_weather")
    );

    let calls = named(&spans, "tools/call add");
    assert_eq!(calls.len(), 2, "{spans:#?}");
    for call in &calls {
        assert!(descends_from(&spans, call, send), "{call:#}");
        assert_eq!(
            attribute(call, "mcp.method.name").as_deref(),
            Some("tools/call")
        );
        assert_eq!(attribute(call, "gen_ai.tool.name").as_deref(), Some("add"));
        assert_eq!(
            attribute(call, "network.transport").as_deref(),
            Some("pipe")
        );
        assert!(
            attribute(call, "mcp.protocol.version").is_some(),
            "{call:#}"
        );
    }
    let failed: Vec<_> = calls
        .iter()
        .filter_map(|c| attribute(c, "error.type"))
        .collect();
    assert_eq!(failed.len(), 1, "one of the two calls failed: {calls:#?}");

    // The node counts what it exported (and would count drops) on /metrics.
    let metrics = node
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("quiver_telemetry_spans_dropped_total 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("quiver_telemetry_spans_exported_total 0\n"),
        "{metrics}"
    );

    // The caller's trace went on to the LLM backend too.
    for headers in llm.request_headers() {
        let sent = headers
            .iter()
            .find(|(name, _)| name == "traceparent")
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        assert!(sent.contains(CALLER_TRACE), "{headers:?}");
    }
}

/// A collector that refuses connections: the task takes no longer than with export off
/// (and a malformed `traceparent` is ignored).
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_costs_a_task_nothing() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Bound and dropped: nothing listens there any more.
    let endpoint = format!("http://{closed}");
    let mut times = Vec::new();
    for export in [None, Some(endpoint.as_str())] {
        let llm = ScriptedLlm::start(script()).await;
        let registry = RegistryDir::new();
        registry.fixture("fixture", &["add"], "");
        let mut env = vec![("QUIVER_TEST_LLM_KEY", LLM_KEY)];
        env.extend(export.map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e)));
        let node = Node::start(&registry, Some(&config(&llm)), &env);
        // A malformed traceparent is ignored, never refused.
        let done = run_task(&node, &[("traceparent", "00-not-a-trace-01")]).await;
        let elapsed = done["_spear"]["elapsed_ms"].as_u64().expect("elapsed_ms");
        times.push(Duration::from_millis(elapsed));
    }
    let (off, on) = (times[0], times[1]);
    assert!(
        on < off + Duration::from_secs(2),
        "export to a closed port slowed the task: {on:?} with it, {off:?} without"
    );
}

/// `quiver run`: a `[telemetry]` typo names the file and field, bad export headers
/// name the variable and entry without showing a header value, and a bad sampler ratio
/// names its variable; none of them runs the guest.
#[test]
fn bad_telemetry_settings_are_named_and_secrets_never_shown() {
    use std::process::Command;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quiver.toml");
    std::fs::write(&config, "[telemetry]\nendpont = \"http://c:4318\"\n").unwrap();
    let module = dir.path().join("noop.wat");
    std::fs::write(&module, "(module (func (export \"_start\")))").unwrap();
    let run = |config: Option<&std::path::Path>, env: &[(&str, &str)]| {
        let mut cmd = Command::new(quiver_tests::quiver_cli());
        cmd.arg("run").arg("--no-cache").arg(&module);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        for var in [
            "QUIVER_CONFIG",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        let output = cmd.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(Some(&config), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("quiver.toml") && stderr.contains("telemetry.endpont"),
        "{stderr}"
    );
    let (code, stderr) = run(
        None,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer hdr-secret-41,oops-hdr-secret-41",
            ),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_HEADERS: entry 2"),
        "{stderr}"
    );
    assert!(!stderr.contains("hdr-secret-41"), "{stderr}");
    // A sampler the SDK would quietly replace with its default is refused by name.
    let (code, stderr) = run(
        None,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "10%"),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("OTEL_TRACES_SAMPLER_ARG: "), "{stderr}");
    // A working export to a closed port: the guest runs and the command exits at once.
    let started = std::time::Instant::now();
    let (code, stderr) = run(
        None,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
