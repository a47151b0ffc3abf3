//! Approvals end to end: the real host, the fixture MCP server over stdio, WAT guests and
//! the scripted LLM. A call of a server whose `approval_policy` asks for approval waits for
//! the host's approver; approved it runs, denied or timed out it is `mcp_policy_denied`
//! and never reaches the server (the fixture's `count` tool tells how many calls did).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver::Reason;
use quiver::{ApprovalDecided, PolicyDenial, ToolObserver};
use quiver::{
    ApprovalDecision, ApprovalError, ApprovalFuture, ApprovalQueue, ApprovalRequest, Approver,
};
use quiver::{Host, HostBuilder, TaskFailure};
use quiver_tests::chat_wat::{ChatGuest, scripted_host_builder};
use quiver_tests::errno::ENOSPC;
use quiver_tests::llm::{Reply, ScriptedLlm, tool_names, tool_results};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, call_tool_text, fixture_toml, host_builder, mcp_task, quiver_cli};
use serde_json::{Value, json};

const DATA: &[(u32, &[u8])] = &[
    (1024, b"fixture"),
    (1100, b"echo"),
    (1120, br#"{"text":"hi"}"#),
    (1264, b"delete_file"),
    (1296, br#"{"path":"/etc/x"}"#),
];
/// Address and length of test data.
type Span = (u32, u32);

const ECHO: Span = (1100, 4);
const HI: Span = (1120, 13);
const DELETE: Span = (1264, 11);
const PATH: Span = (1296, 17);

/// A guest that opens `fixture` and calls each `(name, args)` in turn, recording each
/// call's result with `$out` and emitting its output.
fn calls_guest(calls: &[(Span, Span)]) -> String {
    let body: String = calls
        .iter()
        .map(|(name, args)| {
            format!(
                "(call $cap (i32.const 8192) (i32.const 8192))
                 (call $out (call $mcp_call_tool (local.get $fd) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const 16384) (i32.const 8192)))
                 (call $emit (i32.const 16384) (call $len (i32.const 8192)))\n",
                name.0, name.1, args.0, args.1
            )
        })
        .collect();
    wat::guest(
        DATA,
        &format!(
            "(func $main (local $fd i32)
               (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
               {body})"
        ),
    )
}

/// The fixture registered as `fixture` with `top` (top-level keys) in its record.
fn registry(top: &str) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        "fixture.toml",
        &format!("{top}\n{}", fixture_toml("fixture", &["*"], "")),
    );
    registry
}

/// Records every policy denial and every approval decision.
#[derive(Default)]
struct Denials(Mutex<Vec<PolicyDenial>>, Mutex<Vec<ApprovalDecided>>);

impl ToolObserver for Denials {
    fn policy_denied(&self, denial: &PolicyDenial) {
        self.0.lock().unwrap().push(denial.clone());
    }

    fn approval_decided(&self, decision: &ApprovalDecided) {
        self.1.lock().unwrap().push(decision.clone());
    }
}

impl Denials {
    fn reasons(&self) -> Vec<(String, Reason)> {
        let denials = self.0.lock().unwrap();
        denials
            .iter()
            .map(|d| (d.tool.clone().unwrap_or_default(), d.reason))
            .collect()
    }
}

/// Decides what lands in `queue` with `decide` until `n` requests were decided; returns
/// what it saw. Polls: nothing here depends on how fast the host is.
fn decider(
    queue: Arc<ApprovalQueue>,
    n: usize,
    mut decide: impl FnMut(&ApprovalRequest) -> ApprovalDecision + Send + 'static,
) -> tokio::task::JoinHandle<Vec<ApprovalRequest>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let give_up = Instant::now() + Duration::from_secs(60);
        while seen.len() < n && Instant::now() < give_up {
            for pending in queue.pending() {
                queue.decide(&pending.id, decide(&pending)).unwrap();
                seen.push(pending);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seen
    })
}

/// How many calls reached the fixture: its `count` tool answers with its call number. The
/// count is a library call, held for approval like any other: on a host asking `queue`,
/// it is approved there.
async fn calls_served(host: &Host, queue: Option<&Arc<ApprovalQueue>>) -> u64 {
    let approving = queue.map(|queue| {
        decider(queue.clone(), 1, |pending| {
            assert_eq!(pending.tool, "count", "{pending:?}");
            ApprovalDecision::approve()
        })
    });
    let count = call_tool_text(host, "fixture", "count", json!({}))
        .await
        .unwrap();
    if let Some(approving) = approving {
        assert_eq!(approving.await.unwrap().len(), 1, "the count was approved");
    }
    let served: u64 = count.parse().unwrap();
    served - 1
}

fn error_of(emitted: &str) -> Value {
    let value: Value = serde_json::from_str(emitted).unwrap_or_else(|e| panic!("{e}: {emitted}"));
    assert_eq!(value["error"]["code"], "mcp_policy_denied", "{value}");
    value["error"].clone()
}

fn with_queue(builder: HostBuilder, queue: &Arc<ApprovalQueue>, denials: &Arc<Denials>) -> Host {
    builder
        .with_approver(queue.clone())
        .with_tool_observer(denials.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_approved_call_runs_and_a_denied_one_never_reaches_the_server() {
    let registry = registry("approval_policy = \"always\"");
    let queue = Arc::new(ApprovalQueue::default());
    let denials = Arc::new(Denials::default());
    let host = with_queue(host_builder(&registry), &queue, &denials);
    let mut first = true;
    let decided = decider(queue.clone(), 2, move |_| {
        let decision = if first {
            ApprovalDecision::approve().by("oncall")
        } else {
            ApprovalDecision::deny("looks risky\u{1b}[2J")
        };
        first = false;
        decision
    });
    let mut task = mcp_task("approve-deny", &["fixture"]);
    task.principal = Some("ci".into());
    let run = wat::run_ok(&host, &calls_guest(&[(ECHO, HI), (ECHO, HI)]), &task).await;
    let seen = decided.await.unwrap();

    // Each decision is an observer event: the task's principal, who decided, the reason
    // as cleaned for the guest.
    let decisions: Vec<_> = denials.1.lock().unwrap().clone();
    let shown: Vec<_> = decisions
        .iter()
        .filter(|d| &*d.task_id == "approve-deny")
        .map(|d| {
            (
                d.principal.as_deref(),
                d.approved,
                d.decided_by.as_deref(),
                d.reason.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (Some("ci"), true, Some("oncall"), None),
            (Some("ci"), false, None, Some("looks risky\\x1b[2J")),
        ]
    );
    assert_eq!(decisions[0].id, seen[0].id);
    assert!(seen.iter().all(|r| r.principal.as_deref() == Some("ci")));

    assert!(run.results.iter().all(|&n| n > 0), "{:?}", run.results);
    let approved: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(approved["content"][0]["text"], "hi", "{approved}");
    let error = error_of(&run.emitted[1]);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("denied by the approver: looks risky\\x1b[2J"),
        "the reason, cleaned: {message}"
    );
    assert_eq!(
        calls_served(&host, Some(&queue)).await,
        1,
        "the denied call never ran"
    );

    // What the approver saw: who, what, and the arguments' shape without their values.
    assert_eq!(seen.len(), 2);
    let listed = serde_json::to_value(&seen[0]).unwrap();
    assert_eq!(listed["task_id"], "approve-deny");
    assert_eq!(listed["server_id"], "fixture");
    assert_eq!(listed["tool"], "echo");
    assert_eq!(listed["via"], "mcp_call");
    assert_eq!(listed["arguments"]["keys"], json!(["text"]));
    assert_eq!(listed["arguments"]["bytes"], 13);
    assert!(!listed.to_string().contains("hi\""), "no values: {listed}");
    assert_ne!(seen[0].id, seen[1].id, "ids are unique");

    // Decided ids, and ids never issued, cannot be decided (again).
    assert!(matches!(
        queue.decide(&seen[0].id, ApprovalDecision::approve()),
        Err(ApprovalError::NoLongerWaiting { .. })
    ));
    let unknown = queue
        .decide("no-such-id", ApprovalDecision::approve())
        .unwrap_err();
    assert!(unknown.to_string().contains("no-such-id"), "{unknown}");
    assert_eq!(
        denials.reasons(),
        [("echo".to_owned(), Reason::ApprovalDenied)]
    );
    host.shutdown().await;
}

/// A result too large for the guest's buffer stays on the fd: the retry with a big enough
/// buffer gets it without asking the approver again or calling the tool again.
#[tokio::test]
async fn a_retry_after_a_too_small_buffer_is_neither_asked_nor_run_again() {
    /// Approves every request, counting them.
    #[derive(Default)]
    struct Counting(AtomicUsize);
    impl Approver for Counting {
        fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(ApprovalDecision::approve()))
        }
    }
    let registry = registry("approval_policy = \"always\"");
    let approver = Arc::new(Counting::default());
    let host = host_builder(&registry)
        .with_approver(approver.clone())
        .build()
        .unwrap();
    let call = |cap: u32| {
        format!(
            "(call $cap (i32.const 8192) (i32.const {cap}))
             (call $out (call $mcp_call_tool (local.get $fd) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const 16384) (i32.const 8192)))
             (call $out (call $len (i32.const 8192)))\n",
            ECHO.0, ECHO.1, HI.0, HI.1
        )
    };
    let guest = wat::guest(
        DATA,
        &format!(
            "(func $main (local $fd i32)
               (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
               {}{}
               (call $emit (i32.const 16384) (call $len (i32.const 8192))))",
            call(4),
            call(8192)
        ),
    );
    let run = wat::run_ok(&host, &guest, &mcp_task("small-buffer", &["fixture"])).await;
    assert_eq!(run.results[0], ENOSPC, "{:?}", run.results);
    let needed = run.results[1];
    assert!(
        needed > 4,
        "the length needed is reported: {:?}",
        run.results
    );
    assert_eq!(run.results[2..], [needed, needed], "{:?}", run.results);
    let result: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(result["content"][0]["text"], "hi", "{result}");
    assert_eq!(approver.0.load(Ordering::SeqCst), 1, "asked once");
    assert_eq!(calls_served(&host, None).await, 1, "the tool ran once");
    host.shutdown().await;
}

#[tokio::test]
async fn an_undecided_call_is_denied_after_its_approval_timeout() {
    let registry = registry("approval_policy = \"always\"\napproval_timeout_ms = 300");
    let queue = Arc::new(ApprovalQueue::default());
    let denials = Arc::new(Denials::default());
    let host = with_queue(host_builder(&registry), &queue, &denials);
    let started = Instant::now();
    let run = wat::run_ok(
        &host,
        &calls_guest(&[(ECHO, HI)]),
        &mcp_task("timeout", &["fixture"]),
    )
    .await;
    let waited = started.elapsed();
    let error = error_of(&run.emitted[0]);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("timed out after 300 ms waiting for approval"),
        "{message}"
    );
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    assert!(
        queue.pending().is_empty(),
        "a timed-out request leaves the queue"
    );
    assert_eq!(calls_served(&host, Some(&queue)).await, 0);
    assert_eq!(
        denials.reasons(),
        [("echo".to_owned(), Reason::ApprovalTimeout)]
    );
    host.shutdown().await;
}

/// Denies every request, recording the tools asked about: an embedder's own approver.
#[derive(Default)]
struct Recording(Mutex<Vec<ApprovalRequest>>);

impl Approver for Recording {
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_> {
        self.0.lock().unwrap().push(request);
        Box::pin(async { ApprovalDecision::deny("not on a Friday") })
    }
}

#[tokio::test]
async fn with_policy_only_matching_tools_wait_for_approval() {
    let registry = registry("approval_policy = \"policy\"\napproval_tools = [\"delete_*\"]");
    let approver = Arc::new(Recording::default());
    let host = host_builder(&registry)
        .with_approver(approver.clone())
        .build()
        .unwrap();
    let run = wat::run_ok(
        &host,
        &calls_guest(&[(ECHO, HI), (DELETE, PATH)]),
        &mcp_task("policy", &["fixture"]),
    )
    .await;
    let echoed: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(echoed["content"][0]["text"], "hi", "echo needs no approval");
    let error = error_of(&run.emitted[1]);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("not on a Friday"),
        "{error}"
    );
    let asked: Vec<String> = approver
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.tool.clone())
        .collect();
    assert_eq!(asked, ["delete_file"]);
    assert_eq!(calls_served(&host, None).await, 1, "only echo ran");
    host.shutdown().await;
}

#[tokio::test]
async fn the_task_deadline_ends_the_wait_and_removes_the_pending_request() {
    let registry = registry("approval_policy = \"always\"");
    let queue = Arc::new(ApprovalQueue::default());
    let denials = Arc::new(Denials::default());
    let host = with_queue(host_builder(&registry), &queue, &denials);
    let watcher = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let give_up = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(pending) = queue.pending().pop() {
                    return Some(pending);
                }
                if Instant::now() > give_up {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let task = mcp_task("deadline", &["fixture"]).with_deadline(Duration::from_millis(1500));
    let run = wat::run(&host, &calls_guest(&[(ECHO, HI)]), &task).await;
    assert!(
        matches!(run.outcome.failure, Some(TaskFailure::Deadline(_))),
        "{:?}",
        run.outcome.failure
    );
    let pending = watcher
        .await
        .unwrap()
        .expect("the call waited in the queue");
    let shown = pending
        .expires_at
        .duration_since(pending.requested_at)
        .unwrap();
    assert!(
        shown <= Duration::from_millis(1500),
        "expires_at shows the task's deadline, not the 300 s default: {shown:?}"
    );
    assert!(
        queue.pending().is_empty(),
        "the ended task left nothing pending"
    );
    assert_eq!(calls_served(&host, Some(&queue)).await, 0);
    let denied = denials.0.lock().unwrap().clone();
    assert_eq!(denied.len(), 1, "observers saw the denial: {denied:?}");
    assert_eq!(denied[0].reason, Reason::ApprovalTimeout);
    assert!(
        denied[0].detail.contains("task's deadline ended the wait"),
        "{}",
        denied[0].detail
    );
    host.shutdown().await;
}

struct Chat {
    llm: ScriptedLlm,
    host: Host,
    queue: Arc<ApprovalQueue>,
    denials: Arc<Denials>,
    _registry: RegistryDir,
}

async fn chat(script: Vec<Reply>, queue: ApprovalQueue) -> Chat {
    let llm = ScriptedLlm::start(script).await;
    let registry = registry("approval_policy = \"always\"");
    let queue = Arc::new(queue);
    let denials = Arc::new(Denials::default());
    let host = with_queue(scripted_host_builder(&registry, &llm), &queue, &denials);
    Chat {
        llm,
        host,
        queue,
        denials,
        _registry: registry,
    }
}

async fn run_chat(chat: &Chat) -> WatRun {
    let guest = ChatGuest::new()
        .param("mcp.decision_log", json!(true))
        .msg("user", "go")
        .send(2)
        .recv();
    wat::run_ok(&chat.host, &guest.build(), &mcp_task("chat", &["fixture"])).await
}

#[tokio::test]
async fn the_chat_loop_offers_tools_needing_approval_and_the_model_gets_the_denial() {
    let chat = chat(
        vec![
            Reply::tool_calls([
                ("c1", "mcp__fixture__echo", json!({"text": "hi"})),
                ("c2", "mcp__fixture__delete_file", json!({"path": "/etc/x"})),
            ]),
            Reply::text("done"),
        ],
        ApprovalQueue::default(),
    )
    .await;
    let decided = decider(chat.queue.clone(), 2, |pending| {
        match pending.tool.as_str() {
            "echo" => ApprovalDecision::approve(),
            _ => ApprovalDecision::deny("deleting is off limits"),
        }
    });
    let run = run_chat(&chat).await;
    let seen = decided.await.unwrap();
    assert!(seen.iter().all(|p| p.via == quiver::Via::Chat));

    let offered = tool_names(&chat.llm.request(0));
    for tool in ["mcp__fixture__echo", "mcp__fixture__delete_file"] {
        assert!(
            offered.iter().any(|t| t == tool),
            "{tool} offered: {offered:?}"
        );
    }
    let results = tool_results(&chat.llm.request(1));
    assert_eq!(results[0].1, "hi");
    let denied: Value = serde_json::from_str(&results[1].1).unwrap();
    assert_eq!(denied["error"]["code"], "mcp_policy_denied", "{denied}");
    assert!(
        denied["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deleting is off limits"),
        "{denied}"
    );
    let response: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    let decisions = response["_spear"]["mcp"]["decisions"].as_array().unwrap();
    let needs: Vec<&str> = decisions
        .iter()
        .filter(|d| d["reason"] == "needs_approval")
        .map(|d| d["tool"].as_str().unwrap())
        .collect();
    assert!(
        needs.contains(&"echo") && needs.contains(&"delete_file"),
        "{decisions:?}"
    );
    assert_eq!(
        calls_served(&chat.host, Some(&chat.queue)).await,
        1,
        "only echo ran"
    );
    assert_eq!(
        chat.denials.reasons(),
        [("delete_file".to_owned(), Reason::ApprovalDenied)]
    );
    chat.host.shutdown().await;
}

#[tokio::test]
async fn over_the_queue_cap_a_request_is_denied_at_once_naming_the_cap() {
    let chat = chat(
        vec![
            Reply::tool_calls([
                ("c1", "mcp__fixture__echo", json!({"text": "hi"})),
                ("c2", "mcp__fixture__echo", json!({"text": "ho"})),
            ]),
            Reply::text("done"),
        ],
        ApprovalQueue::with_capacity(1),
    )
    .await;
    let decided = decider(chat.queue.clone(), 1, |_| ApprovalDecision::approve());
    run_chat(&chat).await;
    assert_eq!(decided.await.unwrap().len(), 1);
    let results = tool_results(&chat.llm.request(1));
    let (ran, refused): (Vec<_>, Vec<_>) = results
        .iter()
        .partition(|(_, text)| !text.contains("error"));
    assert_eq!(ran.len(), 1, "{results:?}");
    assert!(
        refused[0]
            .1
            .contains("the approval queue is full (1 requests waiting"),
        "{results:?}"
    );
    assert_eq!(calls_served(&chat.host, Some(&chat.queue)).await, 1);
    chat.host.shutdown().await;
}

/// `quiver run --approve MODE` on a guest calling `echo`: stderr (the guest's `$emit`
/// output and the CLI's own). Run in a new session, so there is no terminal to ask on.
fn cli_run(mode: &str, extra: &[&str]) -> (bool, String) {
    let registry = registry("approval_policy = \"always\"\napproval_timeout_ms = 20000");
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("task.json");
    let spec = json!({"task_id": "cli", "config": {
        "mcp.enabled": "true",
        "mcp.default_server_ids": "[\"fixture\"]",
    }});
    std::fs::write(&task, spec.to_string()).unwrap();
    let module = dir.path().join("guest.wat");
    std::fs::write(&module, calls_guest(&[(ECHO, HI)])).unwrap();
    let mut command = Command::new(quiver_cli());
    command
        .args(["run", "--no-cache", "--approve", mode])
        .args(extra)
        .arg("--registry")
        .arg(registry.path())
        .arg("--task")
        .arg(&task)
        .arg(&module)
        .stdin(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe; it detaches the child from any terminal.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::setsid();
            Ok(())
        });
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `quiver run --as NAME`: the task acts for NAME, which the audit log records; a name a
/// terminal or log could be fooled by is refused before anything runs.
#[test]
fn the_cli_runs_a_task_as_the_principal_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.to_str().unwrap();
    let (ok, stderr) = cli_run(
        "allow",
        &["--as", "alice@example.com", "--audit-log", audit_arg],
    );
    assert!(ok, "{stderr}");
    let lines = std::fs::read_to_string(&audit).unwrap();
    let call = lines
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|line| line["event"] == "tool_call")
        .unwrap_or_else(|| panic!("no tool_call line in {lines}"));
    assert_eq!(call["principal"], "alice@example.com", "{call}");

    let (ok, stderr) = cli_run("allow", &["--as", "eve\u{202e}nimda"]);
    assert!(!ok);
    assert!(stderr.contains("--as"), "{stderr}");
    let (ok, stderr) = cli_run("allow", &["--as", ""]);
    assert!(!ok && stderr.contains("1 to 128 bytes"), "{stderr}");
}

#[test]
fn the_cli_allows_denies_and_cannot_prompt_without_a_terminal() {
    let (ok, stderr) = cli_run("allow", &["--explain-policy"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(r#""text":"hi""#), "{stderr}");
    assert!(
        stderr.contains(
            "approval fixture/echo: needs_approval (offered; each call waits up to 20000 ms"
        ),
        "{stderr}"
    );

    // `deny` (the default) is no approver: nothing needing approval is offered to a model.
    let (ok, stderr) = cli_run("deny", &["--explain-policy"]);
    assert!(ok, "{stderr}");
    assert!(
        !stderr.contains("needs_approval") && stderr.contains("approval_required"),
        "{stderr}"
    );
    assert!(
        stderr.contains("mcp_policy_denied") && stderr.contains("has no approver"),
        "{stderr}"
    );

    let (ok, stderr) = cli_run("prompt", &[]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("mcp_policy_denied") && stderr.contains("no terminal to ask on"),
        "{stderr}"
    );
}

#[test]
fn approval_fields_are_checked_naming_the_field() {
    for (top, field) in [
        ("approval_tools = [\"delete_*\"]", "approval_tools"),
        (
            "approval_policy = \"policy\"\napproval_tools = [\" \"]",
            "approval_tools[0]",
        ),
        (
            "approval_policy = \"always\"\napproval_timeout_ms = 0",
            "approval_timeout_ms",
        ),
    ] {
        let registry = registry(top);
        let loaded = quiver::registry::Registry::load_dir(registry.path()).unwrap();
        assert!(loaded.get("fixture").is_none(), "{top}");
        let problem = loaded.problems()[0].to_string();
        assert!(problem.contains(field), "{top}: {problem}");
    }
    let registry = registry("approval_policy = \"policy\"\napproval_tools = [\"delete_*\"]");
    let loaded = quiver::registry::Registry::load_dir(registry.path()).unwrap();
    let view = serde_json::to_value(loaded.get("fixture").unwrap().view()).unwrap();
    assert_eq!(
        view["approval_tools"],
        json!(["delete_*"]),
        "guests see the patterns"
    );
}
