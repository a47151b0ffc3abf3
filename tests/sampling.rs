//! Sampling served by the task's own LLM backend, against the real fixture MCP server over
//! stdio and the scripted chat-completions server over HTTP: a server's
//! `sampling/createMessage` as an `input_required` input (2026-07-28) and as a 2025-era
//! request of its own during a call (`lifecycle = "initialize"`). A record without
//! `[sampling] allow = true` is refused (the 2025-era server gets an error and finishes
//! its call as it decides); with it, the operator's backend and model answer (not the
//! server's model hint); `maxTokens` over the record's cap, thousands of messages, a
//! huge prompt, the per-server request cap and the task's token budget are refused
//! before the model is asked; each request reaches the observers and the audit log
//! without its text.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver::{
    Host, HostConfig, McpErrorCode, SamplingDone, TaskSpec, ToolCallError, ToolCallRequest,
    ToolObserver,
};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::{RegistryDir, fixture_toml_with_args, host_builder, init_logging};
use serde_json::{Value, json};
use tempfile::TempDir;

#[derive(Default)]
struct Events(Mutex<Vec<SamplingDone>>);

impl ToolObserver for Events {
    fn sampling(&self, event: &SamplingDone) {
        self.0.lock().unwrap().push(event.clone());
    }
}

const ALLOWED: &str =
    "[sampling]\nallow = true\nmodel = \"operator-model\"\nmax_tokens = 100\nmax_requests = 3\n";

struct Setup {
    host: Host,
    llm: ScriptedLlm,
    events: Arc<Events>,
    audit: PathBuf,
    _dirs: (RegistryDir, TempDir),
}

/// A host whose backend is the scripted server answering `script`, on four records of
/// the fixture server: `allowed` and `denied` (2026-07-28, `input_required`), `old` and
/// `old_denied` (2025-era `initialize`, requests of its own).
async fn setup(script: Vec<Reply>) -> Setup {
    init_logging();
    let llm = ScriptedLlm::start(script).await;
    let registry = RegistryDir::new();
    registry.fixture_with_args("allowed", &["*"], &["--ask-tools"], ALLOWED);
    registry.fixture_with_args("denied", &["*"], &["--ask-tools"], "");
    for (id, extra) in [("old", ALLOWED), ("old_denied", "")] {
        let record = fixture_toml_with_args(id, &["*"], &["--ask-tools"], extra);
        registry.write(
            &format!("{id}.toml"),
            &format!("lifecycle = \"initialize\"\n{record}"),
        );
    }
    let backend = quiver::llm::BackendConfig {
        base_url: Some(llm.base_url()),
        default_model: Some("default-model".into()),
        ..Default::default()
    };
    let config = HostConfig {
        backends: BTreeMap::from([("scripted".into(), backend)]),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let events = Arc::new(Events::default());
    let host = host_builder(&registry)
        .with_config(config, ".")
        .with_tool_observer(events.clone())
        .with_audit_log(&audit)
        .build()
        .unwrap();
    Setup {
        host,
        llm,
        events,
        audit,
        _dirs: (registry, dir),
    }
}

fn task(server: &str) -> TaskSpec {
    TaskSpec::new("sampler")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", json!([server]))
        .with_deadline(Duration::from_secs(60))
}

impl Setup {
    async fn call_in(
        &self,
        task: &TaskSpec,
        server: &str,
        tool: &str,
        args: Value,
    ) -> Result<String, ToolCallError> {
        let request = ToolCallRequest::new(server, tool).with_arguments(args);
        // Boxed: a debug build's call future is large, and this test awaits many.
        let output = Box::pin(self.host.call_tool(task, request)).await?;
        Ok(output.result.content[0]
            .as_text()
            .expect("a text result")
            .text
            .clone())
    }

    async fn call(&self, server: &str, tool: &str, args: Value) -> Result<String, ToolCallError> {
        self.call_in(&task(server), server, tool, args).await
    }

    fn events(&self) -> Vec<SamplingDone> {
        self.events.0.lock().unwrap().clone()
    }

    async fn audit_text(self) -> String {
        self.host.shutdown().await;
        std::fs::read_to_string(&self.audit).unwrap()
    }
}

fn failed(result: Result<String, ToolCallError>) -> quiver::McpError {
    match result {
        Err(ToolCallError::Failed(error)) => error,
        other => panic!("the call did not fail: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_sampling_refuses_it_in_both_generations() {
    let setup = setup(vec![]).await;
    let error = failed(setup.call("denied", "ask_sample", json!({})).await);
    assert_eq!(error.code, McpErrorCode::PolicyDenied);
    assert!(error.message.contains("[sampling] allow = true"), "{error}");
    // The 2025-era server gets a JSON-RPC error and finishes its call as it decides.
    let text = setup
        .call("old_denied", "sample_now", json!({}))
        .await
        .unwrap();
    assert!(
        text.starts_with("refused -1 ") && text.contains("[sampling] allow = true"),
        "{text}"
    );
    assert!(setup.llm.requests().is_empty(), "the model was never asked");
    let events = setup.events();
    assert_eq!(events.len(), 2, "{events:?}");
    for (event, generation) in events.iter().zip(["input_required", "request"]) {
        assert_eq!(
            (event.outcome, event.reason, event.generation),
            ("refused", Some("not_allowed"), generation)
        );
    }
    let audit = setup.audit_text().await;
    assert_eq!(audit.matches(r#""event":"sampling""#).count(), 2, "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_with_sampling_is_served_by_the_tasks_backend_in_both_generations() {
    let setup = setup(vec![
        Reply::text("first answer"),
        Reply::text("second answer"),
    ])
    .await;
    for (server, tool, answer) in [
        ("allowed", "ask_sample", "first answer"),
        ("old", "sample_now", "second answer"),
    ] {
        let text = setup.call(server, tool, json!({})).await.unwrap();
        let result: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
        assert_eq!(result["role"], "assistant", "{result}");
        assert_eq!(
            result["content"],
            json!({"type": "text", "text": answer}),
            "{result}"
        );
        // The operator's model, not the server's hint.
        assert_eq!(result["model"], "operator-model");
        assert_eq!(result["stopReason"], "endTurn");
    }
    let requests = setup.llm.requests();
    assert_eq!(requests.len(), 2);
    for body in &requests {
        assert_eq!(body["model"], "operator-model");
        assert_eq!(body["max_tokens"], 10);
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
    }
    let events = setup.events();
    assert_eq!(events.len(), 2, "{events:?}");
    for (event, generation) in events.iter().zip(["input_required", "request"]) {
        assert_eq!(event.outcome, "answered");
        assert_eq!(event.generation, generation);
        assert_eq!(event.model.as_deref(), Some("operator-model"));
        assert_eq!(event.backend.as_deref(), Some("scripted"));
        // The scripted server's usage: 10 per message, 5 completion tokens.
        assert_eq!(
            (event.prompt_tokens, event.completion_tokens),
            (Some(20), Some(5))
        );
    }
    let audit = setup.audit_text().await;
    assert_eq!(audit.matches(r#""event":"sampling""#).count(), 2, "{audit}");
    assert!(
        !audit.contains("be brief") && !audit.contains("answer\""),
        "no prompt or answer text in the audit log: {audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_and_spent_budgets_are_refused_before_the_model_is_asked() {
    let setup = setup(vec![
        Reply::text("one"),
        Reply::text("two"),
        Reply::text("three"),
    ])
    .await;
    // maxTokens beyond the record's cap, absurdly so.
    let error = failed(
        setup
            .call(
                "allowed",
                "ask_sample",
                json!({"max_tokens": 4_000_000_000u64}),
            )
            .await,
    );
    assert_eq!(error.code, McpErrorCode::PolicyDenied);
    assert!(error.message.contains("maxTokens 4000000000"), "{error}");
    // Thousands of messages.
    let error = failed(
        setup
            .call("allowed", "ask_sample", json!({"count": 5000}))
            .await,
    );
    assert!(error.message.contains("5000 messages"), "{error}");
    // A huge prompt (refused by the host's sampling cap or, first, the call's output cap).
    let huge = "x".repeat(3 * 1024 * 1024);
    setup
        .call("allowed", "ask_sample", json!({"count": 3, "text": huge}))
        .await
        .expect_err("a 9 MiB prompt is refused");
    // The 2025-era server is told why and carries on.
    let text = setup
        .call("old", "sample_now", json!({"count": 5000}))
        .await
        .unwrap();
    assert!(
        text.starts_with("refused -32602 ") && text.contains("5000 messages"),
        "{text}"
    );
    assert!(setup.llm.requests().is_empty(), "the model was never asked");

    // The record's max_requests (3) for one task: the fourth input of a round is refused.
    let error = failed(
        setup
            .call("allowed", "ask_sample", json!({"inputs": 4}))
            .await,
    );
    assert!(error.message.contains("max_requests"), "{error}");
    assert_eq!(setup.llm.requests().len(), 3);

    // The task's budget: a reservation is maxTokens (10) plus the prompt's estimate (2),
    // replaced by the 25 tokens used; a second one no longer fits in 30.
    let small = task("allowed").with_config("mcp.sampling_max_tokens", 30);
    setup.llm.push(Reply::text("four"));
    let error = failed(
        setup
            .call_in(&small, "allowed", "ask_sample", json!({"inputs": 2}))
            .await,
    );
    assert_eq!(error.code, McpErrorCode::PolicyDenied);
    assert!(error.message.contains("sampling budget"), "{error}");
    assert_eq!(setup.llm.requests().len(), 4);
    let zero = task("allowed").with_config("mcp.sampling_max_tokens", 0);
    let error = failed(
        setup
            .call_in(&zero, "allowed", "ask_sample", json!({}))
            .await,
    );
    assert!(error.message.contains("sampling budget"), "{error}");
    assert_eq!(setup.llm.requests().len(), 4);

    let reasons: Vec<_> = setup
        .events()
        .iter()
        .filter_map(|e| e.reason)
        .collect::<Vec<_>>();
    for reason in ["max_tokens", "too_large", "max_requests", "task_budget"] {
        assert!(reasons.contains(&reason), "{reason}: {reasons:?}");
    }
}

/// A model answer is charged to the task's host memory budget: one larger than the budget,
/// or one whose tool input would grow past it once parsed (short text, many objects), is
/// refused as `host_memory`, and the task's next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_past_the_tasks_host_memory_is_refused_and_the_next_is_served() {
    let amplified = json!({"a": vec![json!({"a": 0}); 25_000]});
    let setup = setup(vec![
        Reply::text("x".repeat(1536 * 1024)),
        Reply::tool_call("call_1", "lookup", amplified),
        Reply::text("fits"),
    ])
    .await;
    let small = task("allowed").with_host_memory_limit(1024 * 1024);
    for _ in 0..2 {
        let error = failed(
            setup
                .call_in(&small, "allowed", "ask_sample", json!({}))
                .await,
        );
        assert_eq!(error.code, McpErrorCode::PolicyDenied, "{error}");
        assert!(
            error.message.contains("limits.host_memory_bytes"),
            "{error}"
        );
    }
    let text = setup
        .call_in(&small, "allowed", "ask_sample", json!({}))
        .await
        .unwrap();
    assert!(text.contains("fits"), "{text}");
    assert_eq!(setup.llm.requests().len(), 3);
    let reasons: Vec<_> = setup.events().iter().filter_map(|e| e.reason).collect();
    assert_eq!(reasons, ["host_memory", "host_memory"]);
}
