//! Multi round-trip requests (SEP-2322) against the real fixture MCP server over stdio
//! (`--ask-tools`, speaking 2026-07-28): a server's question answered by the host's
//! approver with the form's defaults filled in, declined when nobody answers or the answer
//! does not fit, a form too large to show, sampling refused, the task's roots (none), a
//! server that never stops asking, and each round in the observers and the audit log.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver::defaults::MAX_INPUT_ROUNDS;
use quiver::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, ElicitationAnswer,
    ElicitationFuture, ElicitationRequest, Host, InputRound, McpErrorCode, TaskSpec, ToolCallError,
    ToolCallRequest, ToolObserver,
};
use quiver_tests::{RegistryDir, host_builder, init_logging};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Answers every question with `answer`, keeping each question.
struct Answers {
    answer: Option<ElicitationAnswer>,
    asked: Mutex<Vec<ElicitationRequest>>,
}

impl Approver for Answers {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::approve()))
    }

    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        self.asked.lock().unwrap().push(request);
        Box::pin(std::future::ready(self.answer.clone()))
    }
}

#[derive(Default)]
struct Rounds(Mutex<Vec<InputRound>>);

impl ToolObserver for Rounds {
    fn input_round(&self, round: &InputRound) {
        self.0.lock().unwrap().push(round.clone());
    }
}

struct Setup {
    host: Host,
    approver: Option<Arc<Answers>>,
    rounds: Arc<Rounds>,
    audit: PathBuf,
    _dirs: (RegistryDir, TempDir),
}

/// A host on the fixture server with its ask tools, answering with `answer` (no approver
/// at all for `None`).
fn setup(answer: Option<Option<ElicitationAnswer>>) -> Setup {
    init_logging();
    let registry = RegistryDir::new();
    registry.fixture_with_args("asks", &["*"], &["--ask-tools"], "");
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let rounds = Arc::new(Rounds::default());
    let mut builder = host_builder(&registry)
        .with_tool_observer(rounds.clone())
        .with_audit_log(&audit);
    let approver = answer.map(|answer| {
        Arc::new(Answers {
            answer,
            asked: Mutex::default(),
        })
    });
    if let Some(approver) = &approver {
        builder = builder.with_approver(approver.clone());
    }
    Setup {
        host: builder.build().unwrap(),
        approver,
        rounds,
        audit,
        _dirs: (registry, dir),
    }
}

fn task() -> TaskSpec {
    TaskSpec::new("asked")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", json!(["asks"]))
        .with_deadline(Duration::from_secs(60))
}

fn accept(content: Value) -> Option<ElicitationAnswer> {
    Some(ElicitationAnswer::Accept {
        content: content.as_object().unwrap().clone(),
    })
}

impl Setup {
    async fn call(&self, tool: &str) -> Result<String, ToolCallError> {
        let output = self
            .host
            .call_tool(&task(), ToolCallRequest::new("asks", tool))
            .await?;
        Ok(output.result.content[0]
            .as_text()
            .expect("a text result")
            .text
            .clone())
    }

    fn asked(&self) -> Vec<ElicitationRequest> {
        self.approver
            .as_ref()
            .map(|a| a.asked.lock().unwrap().clone())
            .unwrap_or_default()
    }

    fn rounds(&self) -> Vec<InputRound> {
        self.rounds.0.lock().unwrap().clone()
    }

    async fn audit_lines(self) -> Vec<Value> {
        self.host.shutdown().await;
        std::fs::read_to_string(&self.audit)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .filter(|line: &Value| line["event"] == "input_round")
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approver_answers_a_question_and_the_forms_defaults_are_filled_in() {
    let setup = setup(Some(accept(json!({"name": "Ada"}))));
    let text = setup.call("ask_name").await.unwrap();
    // The server saw its requestState again (it fails the call otherwise) and the answer
    // with the default the approver left out.
    assert_eq!(text, r#"accept {"name":"Ada","greeting":"hello"}"#);
    let asked = setup.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].server_id, "asks");
    assert_eq!(asked[0].method, "tools/call");
    assert_eq!(asked[0].name, "ask_name");
    assert_eq!(asked[0].message, "Who are you?");
    assert_eq!(asked[0].requested_schema["required"], json!(["name"]));
    let rounds = setup.rounds();
    assert_eq!(rounds.len(), 1);
    assert_eq!(
        (rounds[0].round, rounds[0].inputs[0].outcome),
        (1, "accept")
    );
    assert_eq!(rounds[0].inputs[0].by, "approver");
    let lines = setup.audit_lines().await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["inputs"][0]["kind"], "elicitation");
    assert_eq!(lines[0]["task_id"], "asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_declined_when_nobody_answers_or_the_answer_does_not_fit() {
    let nobody = setup(None);
    assert_eq!(nobody.call("ask_name").await.unwrap(), "decline null");
    assert_eq!(nobody.rounds()[0].inputs[0].by, "host");

    let silent = setup(Some(None));
    assert_eq!(silent.call("ask_name").await.unwrap(), "decline null");
    assert_eq!(silent.asked().len(), 1);

    // A number for a string field, a field the form lacks, the required field missing.
    for answer in [
        json!({"name": 5}),
        json!({"name": "Ada", "admin": true}),
        json!({"greeting": "hi"}),
    ] {
        let wrong = setup(Some(accept(answer.clone())));
        assert_eq!(
            wrong.call("ask_name").await.unwrap(),
            "decline null",
            "{answer}"
        );
    }

    let cancelled = setup(Some(Some(ElicitationAnswer::Cancel)));
    assert_eq!(cancelled.call("ask_name").await.unwrap(), "cancel null");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_too_large_to_show_is_declined_without_asking() {
    let setup = setup(Some(accept(json!({}))));
    assert_eq!(setup.call("ask_huge_form").await.unwrap(), r#""decline""#);
    assert!(setup.asked().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_is_refused_and_roots_are_none() {
    let setup = setup(Some(accept(json!({}))));
    match setup.call("ask_sample").await {
        Err(ToolCallError::Failed(error)) => {
            assert_eq!(error.code, McpErrorCode::PolicyDenied);
            assert!(error.message.contains("sampling"), "{error}");
        }
        other => panic!("sampling was not refused: {other:?}"),
    }
    assert_eq!(setup.rounds()[0].inputs[0].outcome, "refused");
    assert_eq!(setup.call("ask_roots").await.unwrap(), r#"{"roots":[]}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_stops_asking_is_given_up_on() {
    let setup = setup(None);
    match setup.call("ask_forever").await {
        Err(ToolCallError::Failed(error)) => {
            assert_eq!(error.code, McpErrorCode::ToolExecFailed);
            assert!(error.message.contains("rounds"), "{error}");
        }
        other => panic!("endless rounds did not fail: {other:?}"),
    }
    assert_eq!(setup.rounds().len(), MAX_INPUT_ROUNDS);
    // The server is fine for the next call.
    assert_eq!(setup.call("ask_roots").await.unwrap(), r#"{"roots":[]}"#);
}

/// Answers each question with the asking task's id as the name.
struct ByTask;

impl Approver for ByTask {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::approve()))
    }

    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        Box::pin(async move {
            // Both tasks' questions are out before either is answered.
            tokio::time::sleep(Duration::from_millis(200)).await;
            accept(json!({"name": &*request.task_id}))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_of_two_tasks_keep_their_own_rounds() {
    init_logging();
    let registry = RegistryDir::new();
    registry.fixture_with_args("asks", &["*"], &["--ask-tools"], "");
    let host = host_builder(&registry)
        .with_approver(Arc::new(ByTask))
        .build()
        .unwrap();
    let call = |task_id: &'static str| {
        let host = &host;
        async move {
            let task = TaskSpec::new(task_id)
                .with_config("mcp.enabled", "true")
                .with_config("mcp.default_server_ids", json!(["asks"]));
            let output = host
                .call_tool(&task, ToolCallRequest::new("asks", "ask_name"))
                .await
                .unwrap();
            output.result.content[0].as_text().unwrap().text.clone()
        }
    };
    let (a, b) = tokio::join!(call("task-a"), call("task-b"));
    assert_eq!(a, r#"accept {"name":"task-a","greeting":"hello"}"#);
    assert_eq!(b, r#"accept {"name":"task-b","greeting":"hello"}"#);
    host.shutdown().await;
}
