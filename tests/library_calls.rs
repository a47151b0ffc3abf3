//! Library calls of MCP tools (`Host::call_tool`) against a guest's `mcp_call_tool`, on the
//! same host, registry and task: the real fixture MCP server over stdio and WAT guests.
//! Both go through one gate, so every pair must be denied, held for approval, observed
//! and audited alike; only the path (`via`) and the fd (a library call has none) differ.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver::{ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver};
use quiver::{CallRefusal, Host, HostBuilder, TaskSpec, ToolCallError, ToolCallRequest};
use quiver::{Layer, Reason};
use quiver::{McpErrorCode, ToolCallOutput};
use quiver::{PolicyDenial, ToolCall, ToolCallEnd, ToolObserver, ToolOutcome, Via};
use quiver_tests::errno::{EACCES, EINVAL, ENOENT};
use quiver_tests::openmetrics::{get, parse};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, call_tool_text, fixture_toml, host_builder, quiver_cli};
use serde_json::{Value, json};
use tempfile::TempDir;

/// `fs` allows a few tools (not `crash`) and audits argument values; `held` makes every
/// call wait for approval; `any` allows every tool. The profile `narrow` covers all three
/// and denies `delete_*`.
fn registry() -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "fs.toml",
        &format!(
            "audit_arguments = true\n{}",
            fixture_toml(
                "fs",
                &["echo", "add", "read_text", "delete_*", "slow", "count"],
                ""
            )
        ),
    );
    registry.write(
        "held.toml",
        &format!(
            "approval_policy = \"always\"\n{}",
            fixture_toml("held", &["echo", "add", "count"], "")
        ),
    );
    registry.fixture("any", &["*"], "");
    std::fs::create_dir(registry.path().join("profiles")).unwrap();
    registry.write(
        "profiles/narrow.toml",
        "name = \"narrow\"\nserver_ids = [\"fs\", \"held\", \"any\"]\ntool_denylist = [\"delete_*\"]\n",
    );
    registry
}

/// The one task both the guest and the library act in: the profile's layer, and its own
/// list denying `slow`.
fn task() -> TaskSpec {
    TaskSpec::new("same-task")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.profile", "narrow")
        .with_config("mcp.tool_denylist", json!(["slow"]))
        .with_deadline(Duration::from_secs(60))
}

/// Everything the observers were told, in order.
#[derive(Default)]
struct Recorder {
    started: Mutex<Vec<ToolCall>>,
    ended: Mutex<Vec<(ToolCall, ToolCallEnd)>>,
    denied: Mutex<Vec<PolicyDenial>>,
}

impl ToolObserver for Recorder {
    fn before_tool_call(&self, call: &ToolCall) {
        self.started.lock().unwrap().push(call.clone());
    }
    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        self.ended.lock().unwrap().push((call.clone(), end.clone()));
    }
    fn policy_denied(&self, denial: &PolicyDenial) {
        self.denied.lock().unwrap().push(denial.clone());
    }
}

/// Refuses `echo` and approves everything else, keeping every request.
#[derive(Default)]
struct NoEcho(Mutex<Vec<ApprovalRequest>>);

impl Approver for NoEcho {
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_> {
        let decision = match request.tool.as_str() {
            "echo" => ApprovalDecision::deny("echo needs a human"),
            _ => ApprovalDecision::approve(),
        };
        self.0.lock().unwrap().push(request);
        Box::pin(std::future::ready(decision))
    }
}

/// A host on `registry` with a [`Recorder`], a [`NoEcho`] approver and an audit log.
struct Setup {
    host: Host,
    seen: Arc<Recorder>,
    approver: Arc<NoEcho>,
    audit: PathBuf,
    _dirs: (RegistryDir, TempDir),
}

fn setup() -> Setup {
    setup_with(|builder| builder)
}

fn setup_with(more: impl FnOnce(HostBuilder) -> HostBuilder) -> Setup {
    let registry = registry();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let seen = Arc::new(Recorder::default());
    let approver = Arc::new(NoEcho::default());
    let builder = host_builder(&registry)
        .with_tool_observer(seen.clone())
        .with_approver(approver.clone())
        .with_audit_log(&audit);
    Setup {
        host: more(builder).build().unwrap(),
        seen,
        approver,
        audit,
        _dirs: (registry, dir),
    }
}

/// The guest's side: each `(server, tool, arguments)` through `mcp_open` and
/// `mcp_call_tool` in [`task`].
async fn guest_calls(host: &Host, steps: &[(&str, &str, &str)]) -> WatRun {
    wat::run_ok(host, &wat::mcp_calls(steps, 1), &task()).await
}

/// The library's side: the same calls through `Host::call_tool` in [`task`].
async fn library_calls(
    host: &Host,
    steps: &[(&str, &str, &str)],
) -> Vec<Result<ToolCallOutput, ToolCallError>> {
    let mut results = Vec::new();
    for (server_id, tool, arguments) in steps {
        let arguments: Value = serde_json::from_str(arguments).unwrap();
        let request = ToolCallRequest::new(*server_id, *tool).with_arguments(arguments);
        results.push(host.call_tool(&task(), request).await);
    }
    results
}

/// `value` (an event or an audit line, as JSON) without `keys`.
fn without(value: impl serde::Serialize, keys: &[&str]) -> Value {
    let mut value = serde_json::to_value(value).unwrap();
    for key in keys {
        value.as_object_mut().unwrap().remove(*key);
    }
    value
}

/// What may differ between a guest's event and a library's: the path, the fd, the time.
const PATH_AND_TIME: &[&str] = &[
    "via",
    "session_fd",
    "at",
    "time",
    "started_at",
    "duration",
    "id",
    "requested_at",
    "expires_at",
];

/// Asserts that the first half of `events` (the guest's) matches the second (the
/// library's) pairwise but for the path, the fd and the times, and that each says where
/// it came from.
fn alike<T: serde::Serialize>(events: &[T], what: &str) {
    assert_eq!(events.len() % 2, 0, "{what}: {}", events.len());
    let (guest, library) = events.split_at(events.len() / 2);
    for (guest, library) in guest.iter().zip(library) {
        let (g, l) = (json!(guest), json!(library));
        assert_eq!(
            without(&g, PATH_AND_TIME),
            without(&l, PATH_AND_TIME),
            "{what}"
        );
        assert!(g["session_fd"].as_i64().is_some_and(|fd| fd > 0), "{g}");
        assert!(
            l.get("session_fd").is_none(),
            "a library call has no fd: {l}"
        );
        assert_eq!(l["via"], "library", "{l}");
    }
}

/// The audit log's lines once the host wrote it out.
async fn audit_lines(setup: Setup) -> Vec<Value> {
    setup.host.shutdown().await;
    std::fs::read_to_string(&setup.audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn refusal(result: &Result<ToolCallOutput, ToolCallError>) -> &CallRefusal {
    match result {
        Err(ToolCallError::Denied(refusal) | ToolCallError::NotApproved(refusal)) => refusal,
        other => panic!("not refused: {other:?}"),
    }
}

fn text_of(output: &ToolCallOutput) -> &str {
    &output.result.content[0].as_text().unwrap().text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_call_is_denied_by_every_layer_as_a_guest_call_is() {
    let setup = setup();
    let steps = [
        ("fs", "crash", "{}"),
        ("fs", "delete_file", r#"{"path":"/x"}"#),
        ("fs", "slow", r#"{"ms":1}"#),
    ];
    let run = guest_calls(&setup.host, &steps).await;
    assert_eq!(
        [run.results[1], run.results[3], run.results[5]],
        [EACCES; 3],
        "{:?}",
        run.results
    );
    let called = library_calls(&setup.host, &steps).await;
    let layers: Vec<(Reason, Option<Layer>)> = called
        .iter()
        .map(|result| {
            let refusal = refusal(result);
            (refusal.reason, refusal.layer)
        })
        .collect();
    assert_eq!(
        layers,
        [
            (Reason::NotInAllowlist, Some(Layer::Registry)),
            (Reason::DeniedByPattern, Some(Layer::Profile)),
            (Reason::DeniedByPattern, Some(Layer::Task)),
        ]
    );
    assert!(
        matches!(&called[2], Err(ToolCallError::Denied(r)) if r.detail == "matches the task's deny pattern `slow`"),
        "{:?}",
        called[2]
    );

    let denied = setup.seen.denied.lock().unwrap().clone();
    assert_eq!(denied.len(), 6, "{denied:?}");
    alike(&denied, "denial events");
    assert!(denied.iter().all(|d| d.action == "mcp_call_tool"));
    assert_eq!(denied[0].via, Some(Via::McpCall));
    assert_eq!(denied[3].via, Some(Via::Library));
    assert!(setup.seen.started.lock().unwrap().is_empty(), "nothing ran");
    let samples = parse(&setup.host.metrics().encode());
    let denials = |reason| {
        get(
            &samples,
            "quiver_policy_denials_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(denials("not_in_allowlist"), 2.0);
    assert_eq!(denials("denied_by_pattern"), 4.0);
    assert_eq!(
        call_tool_text(&setup.host, "fs", "count", json!({}))
            .await
            .unwrap(),
        "1",
        "no denied call reached the server"
    );

    let lines = audit_lines(setup).await;
    let denials: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "policy_denied")
        .collect();
    assert_eq!(denials.len(), 6, "{lines:?}");
    alike(&denials, "audit lines of denials");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_call_waits_for_the_approver_as_a_guest_call_does() {
    let setup = setup();
    let steps = [
        ("held", "echo", r#"{"text":"hi"}"#),
        ("held", "add", r#"{"a":1,"b":2}"#),
    ];
    let run = guest_calls(&setup.host, &steps).await;
    assert!(
        run.results[1] > 0 && run.results[3] > 0,
        "{:?}",
        run.results
    );
    let refused: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(refused["error"]["code"], "mcp_policy_denied", "{refused}");
    let added: Value = serde_json::from_str(&run.emitted[1]).unwrap();
    assert_eq!(added["content"][0]["text"], "3", "{added}");

    let called = library_calls(&setup.host, &steps).await;
    let Err(ToolCallError::NotApproved(not_approved)) = &called[0] else {
        panic!("{:?}", called[0]);
    };
    assert_eq!(not_approved.reason, Reason::ApprovalDenied);
    assert_eq!(
        not_approved.detail,
        "denied by the approver: echo needs a human"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with(&not_approved.detail),
        "the guest got the same reason: {refused}"
    );
    assert_eq!(text_of(called[1].as_ref().unwrap()), "3");

    let asked = setup.approver.0.lock().unwrap().clone();
    assert_eq!(asked.len(), 4, "{asked:?}");
    alike(&asked, "approval requests");
    assert_eq!(asked[0].via, Via::McpCall);
    assert_eq!(asked[2].via, Via::Library);
    let denied = setup.seen.denied.lock().unwrap().clone();
    assert_eq!(denied.len(), 2, "{denied:?}");
    alike(&denied, "approval denials");
    assert_eq!(denied[0].reason, Reason::ApprovalDenied);
    // The count is approved too; the refused calls never reached the server.
    assert_eq!(
        call_tool_text(&setup.host, "held", "count", json!({}))
            .await
            .unwrap(),
        "3",
        "only the two approved calls ran before the count"
    );
    setup.host.shutdown().await;

    // A host without an approver refuses both alike, asking nobody.
    let registry = registry();
    let host = host_builder(&registry).build().unwrap();
    let step = [("held", "add", r#"{"a":1,"b":2}"#)];
    let run = guest_calls(&host, &step).await;
    let refused: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(refused["error"]["code"], "mcp_policy_denied", "{refused}");
    let called = library_calls(&host, &step).await;
    let Err(ToolCallError::Denied(denied)) = &called[0] else {
        panic!("{:?}", called[0]);
    };
    assert_eq!(denied.reason, Reason::ApprovalRequired);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with(&denied.detail),
        "{refused}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_call_is_observed_and_audited_as_a_guest_call_is() {
    let setup = setup();
    let steps = [
        ("fs", "echo", r#"{"text":"hi"}"#),
        (
            "fs",
            "read_text",
            r#"{"path":"/nonexistent/quiver-library"}"#,
        ),
        ("fs", "add", r#"{"a":1,"b":2}"#),
    ];
    let run = guest_calls(&setup.host, &steps).await;
    let called = library_calls(&setup.host, &steps).await;
    for (i, result) in called.iter().enumerate() {
        let output = result.as_ref().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.json),
            run.emitted[i],
            "the library gets the bytes the guest got"
        );
    }
    assert_eq!(called[1].as_ref().unwrap().result.is_error, Some(true));

    let started = setup.seen.started.lock().unwrap().clone();
    assert_eq!(started.len(), 6);
    alike(&started, "call starts");
    assert_eq!(
        started[3].argument_values.as_deref(),
        Some(r#"{"text":"hi"}"#),
        "the record audits values, for library calls too"
    );
    let ended = setup.seen.ended.lock().unwrap().clone();
    let ends: Vec<Value> = ended
        .iter()
        .map(|(call, end)| json!({"call": without(call, PATH_AND_TIME), "end": without(end, &["duration"])}))
        .collect();
    assert_eq!(ends[..3], ends[3..], "the same ends");
    let outcomes: Vec<ToolOutcome> = ended.iter().map(|(_, end)| end.outcome).collect();
    use ToolOutcome::{Ok, ToolError};
    assert_eq!(outcomes, [Ok, ToolError, Ok, Ok, ToolError, Ok]);

    let samples = parse(&setup.host.metrics().encode());
    let calls = |tool, outcome| {
        get(
            &samples,
            "quiver_mcp_tool_calls_total",
            &[("server_id", "fs"), ("tool", tool), ("outcome", outcome)],
        )
    };
    assert_eq!(calls("echo", "ok"), 2.0);
    assert_eq!(calls("read_text", "tool_error"), 2.0);
    assert_eq!(calls("add", "ok"), 2.0);

    let lines = audit_lines(setup).await;
    let calls: Vec<&Value> = lines.iter().filter(|l| l["event"] == "tool_call").collect();
    assert_eq!(calls.len(), 6, "{lines:?}");
    alike(&calls, "audit lines of calls");
    assert_eq!(calls[3]["argument_values"], json!({"text": "hi"}));
    assert_eq!(calls[4]["outcome"], "tool_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_library_calls_fail_as_a_guests_would() {
    let setup = setup();
    let long_tool = "t".repeat(200);
    let steps = [
        ("any", "no_such_tool", "{}"),
        ("any", "echo", "[1,2]"),
        ("any", long_tool.as_str(), "{}"),
        ("nope", "echo", "{}"),
    ];
    let run = guest_calls(&setup.host, &steps).await;
    let r = &run.results;
    assert!(r[1] > 0 && r[3] > 0, "results, not errnos: {r:?}");
    assert_eq!([r[5], r[6]], [EINVAL, ENOENT], "{r:?}");
    let called = library_calls(&setup.host, &steps).await;

    // An unknown tool and arguments that are not an object: the same error the guest got.
    for (i, result) in called[..2].iter().enumerate() {
        let Err(ToolCallError::Failed(error)) = result else {
            panic!("{result:?}");
        };
        let guest: Value = serde_json::from_str(&run.emitted[i]).unwrap();
        assert_eq!(error.to_json(), guest, "step {i}");
    }
    let Err(ToolCallError::Failed(not_object)) = &called[1] else {
        unreachable!()
    };
    assert_eq!(not_object.code, McpErrorCode::InvalidArguments);
    // A name longer than any registry holds: refused unread, as the guest's -EINVAL.
    assert!(
        matches!(&called[2], Err(ToolCallError::Invalid(why)) if why.contains("tool name")),
        "{:?}",
        called[2]
    );
    // An unknown server: the registry's refusal, reported.
    let unknown = refusal(&called[3]);
    assert_eq!(
        (unknown.reason, unknown.layer),
        (Reason::UnknownServer, Some(Layer::Registry))
    );
    let denied = setup.seen.denied.lock().unwrap().clone();
    let actions: Vec<(&str, Option<Via>)> = denied.iter().map(|d| (d.action, d.via)).collect();
    assert_eq!(
        actions,
        [("mcp_open", None), ("mcp_call_tool", Some(Via::Library))],
        "only the unknown server was a denial: {denied:?}"
    );

    // Arguments past the task's host memory budget: refused before anything is sent or
    // reported, as the guest's -ENOMEM.
    let small = task().with_host_memory_limit(64 << 10);
    let huge =
        ToolCallRequest::new("fs", "echo").with_arguments(json!({"text": "x".repeat(1 << 20)}));
    let result = setup.host.call_tool(&small, huge).await;
    assert!(
        matches!(&result, Err(ToolCallError::Invalid(why)) if why.contains("limits.host_memory_bytes")),
        "{result:?}"
    );
    let fits =
        ToolCallRequest::new("fs", "echo").with_arguments(json!({"text": "x".repeat(16 << 10)}));
    let echoed = setup.host.call_tool(&small, fits).await.unwrap();
    assert_eq!(text_of(&echoed).len(), 16 << 10);
    let null = ToolCallRequest::new("fs", "echo").with_arguments(Value::Null);
    let result = setup.host.call_tool(&task(), null).await;
    assert!(
        matches!(&result, Err(ToolCallError::Failed(e)) if e.message.ends_with("got null")),
        "{result:?}"
    );
    assert_eq!(
        setup.seen.denied.lock().unwrap().len(),
        2,
        "nothing more reported"
    );
    assert_eq!(
        setup.host.status().tasks.running,
        0,
        "a library call takes no task slot"
    );
    setup.host.shutdown().await;
}

/// `quiver mcp call` on the [`registry`] directory.
fn cli_call(registry: &Path, server_tool: [&str; 2], extra: &[&str]) -> Output {
    Command::new(quiver_cli())
        .args(["mcp", "call", server_tool[0], server_tool[1], "--registry"])
        .arg(registry)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn quiver_mcp_call_goes_through_the_same_gate() {
    let registry = registry();
    let out = cli_call(
        registry.path(),
        ["fs", "echo"],
        &["--args", r#"{"text":"cli"}"#],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""text":"cli""#),
        "{out:?}"
    );

    let denied = cli_call(registry.path(), ["fs", "crash"], &[]);
    assert_eq!(denied.status.code(), Some(1), "{denied:?}");
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("denied by policy (not_in_allowlist)") && stderr.contains("allowed_tools"),
        "{stderr}"
    );

    // Approvals apply: refused without an approver, run with `--approve allow`.
    let held = cli_call(
        registry.path(),
        ["held", "add"],
        &["--args", r#"{"a":1,"b":2}"#],
    );
    assert_eq!(held.status.code(), Some(1), "{held:?}");
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("approval_required"),
        "{held:?}"
    );
    let allowed = cli_call(
        registry.path(),
        ["held", "add"],
        &["--args", r#"{"a":1,"b":2}"#, "--approve", "allow"],
    );
    assert_eq!(allowed.status.code(), Some(0), "{allowed:?}");

    // An isError result prints and exits 1; arguments that are not an object exit 2.
    let tool_error = cli_call(
        registry.path(),
        ["fs", "read_text"],
        &["--args", r#"{"path":"/nonexistent/quiver-cli"}"#],
    );
    assert_eq!(tool_error.status.code(), Some(1), "{tool_error:?}");
    assert!(String::from_utf8_lossy(&tool_error.stdout).contains("\"isError\":true"));
    let bad = cli_call(registry.path(), ["fs", "echo"], &["--args", "[1]"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}
