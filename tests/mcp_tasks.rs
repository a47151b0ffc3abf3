//! Long-running tool calls as tasks (the `io.modelcontextprotocol/tasks` extension,
//! SEP-2663) against a real rmcp server over stdio (`fixtures/task-mcp-server`): a task
//! polled to its result with its statuses in the observers and the audit log, one that
//! needs input answered by the approver, one cancelled at its timeout or at the task's
//! deadline (the server sees `tasks/cancel`), hostile poll intervals, bad task ids, a flood
//! of huge status messages, and a failed task. And, on the same server, the resource and
//! prompt listings' cache hints (SEP-2549): a second listing within `ttlMs` does not reach
//! the server, one after it does.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver::defaults::{
    MAX_TASK_STATUS_MESSAGE_BYTES, MAX_TASK_STATUS_REPORTS, TASK_POLL_INTERVAL_MAX,
    TASK_POLL_INTERVAL_MIN,
};
use quiver::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, ElicitationAnswer,
    ElicitationFuture, ElicitationRequest, Host, InputRound, McpErrorCode, McpTaskStatus, TaskSpec,
    ToolCallError, ToolCallRequest, ToolObserver,
};
use quiver_tests::{RegistryDir, fixture_server, host_builder, init_logging};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Answers every question by accepting `{"confirm": true}`.
struct Confirms;

impl Approver for Confirms {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::approve()))
    }

    fn elicit(&self, _request: ElicitationRequest) -> ElicitationFuture<'_> {
        let content = json!({"confirm": true}).as_object().unwrap().clone();
        Box::pin(std::future::ready(Some(ElicitationAnswer::Accept {
            content,
        })))
    }
}

#[derive(Default)]
struct Seen {
    statuses: Mutex<Vec<McpTaskStatus>>,
    rounds: Mutex<Vec<InputRound>>,
}

impl ToolObserver for Seen {
    fn mcp_task_status(&self, status: &McpTaskStatus) {
        self.statuses.lock().unwrap().push(status.clone());
    }

    fn input_round(&self, round: &InputRound) {
        self.rounds.lock().unwrap().push(round.clone());
    }
}

struct Setup {
    host: Host,
    seen: Arc<Seen>,
    audit: PathBuf,
    _dirs: (RegistryDir, TempDir),
}

/// A host on the task server as `tasks`, with `tool_timeout_ms`.
fn setup(tool_timeout_ms: u64) -> Setup {
    setup_with(tool_timeout_ms, &[])
}

/// [`setup`] with more arguments for the server.
fn setup_with(tool_timeout_ms: u64, args: &[&str]) -> Setup {
    init_logging();
    let registry = RegistryDir::new();
    let command = fixture_server().with_file_name("task-mcp-server");
    registry.write(
        "tasks.toml",
        &format!(
            "server_id = \"tasks\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\nallowed_resources = [\"*\"]\nallowed_prompts = [\"*\"]\n\n[stdio]\ncommand = {:?}\nargs = {args:?}\n\n[budgets]\ntool_timeout_ms = {tool_timeout_ms}\n",
            command.display().to_string()
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let seen = Arc::new(Seen::default());
    let host = host_builder(&registry)
        .with_tool_observer(seen.clone())
        .with_audit_log(&audit)
        .with_approver(Arc::new(Confirms))
        .build()
        .unwrap();
    Setup {
        host,
        seen,
        audit,
        _dirs: (registry, dir),
    }
}

fn task(deadline: Duration) -> TaskSpec {
    TaskSpec::new("tasked")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", json!(["tasks"]))
        .with_deadline(deadline)
}

impl Setup {
    async fn call_within(
        &self,
        deadline: Duration,
        tool: &str,
        arguments: Value,
    ) -> Result<String, ToolCallError> {
        let request = ToolCallRequest::new("tasks", tool).with_arguments(arguments);
        let output = self.host.call_tool(&task(deadline), request).await?;
        Ok(output.result.content[0]
            .as_text()
            .expect("a text result")
            .text
            .clone())
    }

    async fn call(&self, tool: &str, arguments: Value) -> Result<String, ToolCallError> {
        self.call_within(Duration::from_secs(60), tool, arguments)
            .await
    }

    fn statuses(&self) -> Vec<McpTaskStatus> {
        self.seen.statuses.lock().unwrap().clone()
    }

    /// The task ids the server was sent `tasks/cancel` for, once there is one (or after
    /// a few seconds).
    async fn cancelled(&self) -> Vec<String> {
        for _ in 0..50 {
            let text = self.call("cancelled", json!({})).await.unwrap();
            let ids: Vec<String> = serde_json::from_str(&text).unwrap();
            if !ids.is_empty() {
                return ids;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Vec::new()
    }

    async fn polls(&self) -> u64 {
        self.call("polls", json!({}))
            .await
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn failed(result: Result<String, ToolCallError>) -> quiver::McpError {
    match result {
        Err(ToolCallError::Failed(error) | ToolCallError::Timeout(error)) => error,
        other => panic!("expected a failed call, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_polled_to_its_result_and_its_statuses_are_observed_and_audited() {
    let setup = setup(30_000);
    let text = setup
        .call("count_polls", json!({"polls": 3, "poll_ms": 60}))
        .await
        .unwrap();
    assert_eq!(text, "done after 3 polls");
    let statuses: Vec<(&str, Option<String>)> = setup
        .statuses()
        .iter()
        .map(|s| (s.status, s.message.clone()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("working", None),
            ("working", Some("step 1 of 3".into())),
            ("working", Some("step 2 of 3".into())),
            ("completed", None),
        ]
    );
    let first = &setup.statuses()[0];
    assert_eq!(
        (
            first.task_id.as_ref(),
            first.server_id.as_str(),
            first.tool.as_str()
        ),
        ("tasked", "tasks", "count_polls")
    );
    assert_eq!(first.server_task_id, "task-0");
    setup.host.shutdown().await;
    let lines: Vec<Value> = std::fs::read_to_string(&setup.audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &Value| line["event"] == "mcp_task_status")
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[1]["message"], "step 1 of 3");
    assert_eq!(lines[3]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_needs_input_is_answered_by_the_approver_with_tasks_update() {
    let setup = setup(30_000);
    let text = setup.call("confirm", json!({})).await.unwrap();
    assert_eq!(text, r#"accept {"confirm":true}"#);
    let rounds = setup.seen.rounds.lock().unwrap().clone();
    assert_eq!(rounds.len(), 1, "{rounds:?}");
    assert_eq!(rounds[0].name, "confirm");
    assert_eq!(rounds[0].inputs[0].key, "confirm-1");
    assert_eq!(
        (rounds[0].inputs[0].outcome, rounds[0].inputs[0].by),
        ("accept", "approver")
    );
    assert!(
        setup
            .statuses()
            .iter()
            .any(|s| s.status == "input_required")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_never_finishes_ends_at_the_timeout_and_is_cancelled() {
    let setup = setup(1_000);
    let started = Instant::now();
    let error = failed(setup.call("forever", json!({})).await);
    assert_eq!(error.code, McpErrorCode::Timeout, "{error}");
    assert!(error.message.contains("tool_timeout_ms"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(setup.cancelled().await, ["task-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_cancelled_when_the_quiver_task_ends_first() {
    let setup = setup(60_000);
    let started = Instant::now();
    let result = setup
        .call_within(Duration::from_millis(800), "forever", json!({}))
        .await;
    assert!(
        matches!(result, Err(ToolCallError::Timeout(_))),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(setup.cancelled().await, ["task-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_poll_intervals_are_clamped() {
    let setup = setup(30_000);
    // `pollIntervalMs: 0`: polled at the host's shortest interval, not in a busy loop.
    let started = Instant::now();
    let text = setup
        .call("count_polls", json!({"polls": 10, "poll_ms": 0}))
        .await
        .unwrap();
    assert_eq!(text, "done after 10 polls");
    assert!(started.elapsed() >= TASK_POLL_INTERVAL_MIN * 9);
    assert_eq!(setup.polls().await, 10);
    // A huge one: the host looks again after its longest interval.
    let started = Instant::now();
    let text = setup
        .call("count_polls", json!({"polls": 1, "poll_ms": u64::MAX}))
        .await
        .unwrap();
    assert_eq!(text, "done after 1 polls");
    assert!(started.elapsed() < TASK_POLL_INTERVAL_MAX + Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_task_ids_fail_the_call() {
    let setup = setup(10_000);
    for kind in ["empty", "huge"] {
        let error = failed(setup.call("bad_id", json!({"kind": kind})).await);
        assert_eq!(error.code, McpErrorCode::ToolExecFailed, "{error}");
        assert!(error.message.contains("with a task whose id is"), "{error}");
        assert!(error.message.len() < 1024, "the id is not echoed");
    }
    let error = failed(setup.call("bad_id", json!({"kind": "other"})).await);
    assert!(error.message.contains("with another task"), "{error}");
    let error = failed(setup.call("bad_id", json!({"kind": "unknown"})).await);
    assert!(error.message.contains("tasks/get"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_huge_status_messages_stays_bounded() {
    let setup = setup(30_000);
    let text = setup.call("chatty", json!({"polls": 50})).await.unwrap();
    assert_eq!(text, "chatty done");
    let statuses = setup.statuses();
    assert_eq!(statuses.len(), MAX_TASK_STATUS_REPORTS);
    for status in &statuses {
        let message = status.message.as_deref().unwrap_or("");
        assert!(!message.contains('\u{1b}'), "made printable");
        assert!(message.len() <= MAX_TASK_STATUS_MESSAGE_BYTES + 16);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_fails_the_call_with_the_servers_error() {
    let setup = setup(10_000);
    let error = failed(setup.call("failing", json!({})).await);
    assert_eq!(error.code, McpErrorCode::ToolExecFailed);
    assert!(error.message.contains("disk on fire"), "{error}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled = setup.call("cancelled", json!({})).await.unwrap();
    assert_eq!(cancelled, "[]", "an ended task is not cancelled");
}

/// Lists the resources and the prompts of `tasks` twice each; the first resource listing
/// is emitted.
const LIST_TWICE: &str = r#"(func $main (local $fd i32)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 5)))
  (call $cap (i32.const 8192) (i32.const 60000))
  (call $out (call $mcp_list_resources (local.get $fd) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 60000))
  (call $out (call $mcp_list_resources (local.get $fd) (i32.const 16384) (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 60000))
  (call $out (call $mcp_list_prompts (local.get $fd) (i32.const 16384) (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 60000))
  (call $out (call $mcp_list_prompts (local.get $fd) (i32.const 16384) (i32.const 8192))))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_and_prompt_listings_are_cached_for_their_ttl_in_order() {
    let guest = quiver_tests::wat::guest(&[(1024, b"tasks")], LIST_TWICE);
    let run = |setup: &Setup| {
        let task = task(Duration::from_secs(30));
        let (host, guest) = (setup.host.clone(), guest.clone());
        async move { quiver_tests::wat::run_ok(&host, &guest, &task).await }
    };

    // With `ttlMs`: the second listing within it is the kept one; after it, the server's.
    let cached = setup_with(30_000, &["--list-ttl-ms", "1500"]);
    let listed = run(&cached).await;
    assert!(
        listed.results.iter().all(|r| *r >= 0),
        "{:?}",
        listed.results
    );
    let resources: Value = serde_json::from_str(&listed.emitted[0]).unwrap();
    let uris: Vec<&str> = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris, ["fixture://b", "fixture://a"], "the server's order");
    assert_eq!(cached.call("listings", json!({})).await.unwrap(), "1 1");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    run(&cached).await;
    assert_eq!(cached.call("listings", json!({})).await.unwrap(), "2 2");

    // Without hints nothing is kept.
    let uncached = setup(30_000);
    run(&uncached).await;
    assert_eq!(uncached.call("listings", json!({})).await.unwrap(), "2 2");
}

/// A blocking `mcp_call_tool` of `count_polls` (its answer emitted), then `forever` started
/// in flight and its call fd closed after 300 ms.
const GUEST_CALLS: &str = r#"(func $main (local $fd i32) (local $call i32)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 5)))
  (call $cap (i32.const 8192) (i32.const 60000))
  (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1040) (i32.const 11)
    (i32.const 1056) (i32.const 24) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  (local.set $call (call $mcp_call_start (local.get $fd) (i32.const 1088) (i32.const 7)
    (i32.const 1104) (i32.const 2)))
  (call $out (local.get $call))
  (call $sleep_ms (i32.const 300))
  (call $out (call $mcp_close (local.get $call))))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_call_follows_its_task_and_closing_an_in_flight_call_cancels_it() {
    let setup = setup(30_000);
    let guest = quiver_tests::wat::guest(
        &[
            (1024, b"tasks"),
            (1040, b"count_polls"),
            (1056, br#"{"polls":2,"poll_ms":50}"#),
            (1088, b"forever"),
            (1104, b"{}"),
        ],
        GUEST_CALLS,
    );
    let run = quiver_tests::wat::run_ok(&setup.host, &guest, &task(Duration::from_secs(30))).await;
    assert!(run.results.iter().all(|r| *r >= 0), "{:?}", run.results);
    let answer: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(answer["content"][0]["text"], "done after 2 polls");
    assert_eq!(setup.cancelled().await, ["task-1"]);
}
