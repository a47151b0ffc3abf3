//! A guest that answers its servers' questions itself (`mcp_elicit_fn`): the Rust SDK
//! guest `examples/elicit-answers` against the real fixture server (`--ask-tools`), asked
//! the 2026-07-28 way (`input_required`) and the 2025 way (`elicitation/create` during the
//! call); the answer is checked against the form and its defaults filled in, the host's
//! approver is not asked, and a guest that answers badly (garbage, too large, another
//! question's id, a field of the wrong type, too late, or traps) has the question declined
//! or its task ended. And a task's declared roots answer `roots/list` of both
//! generations (none by default). Each task runs in a tokio task of its own, as the node
//! runs them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, ElicitationAnswer,
    ElicitationFuture, ElicitationRequest, Host, InputRound, TaskOutcome, ToolObserver,
};
use quiver_tests::{
    RegistryDir, example_guest, fixture_toml_with_args, host_builder, init_logging, mcp_task, run,
};
use serde_json::json;

/// An approver that would accept with another name, so a test sees who answered.
#[derive(Default)]
struct Approver2 {
    asked: Mutex<usize>,
}

impl Approver for Approver2 {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::approve()))
    }

    fn elicit(&self, _request: ElicitationRequest) -> ElicitationFuture<'_> {
        *self.asked.lock().unwrap() += 1;
        let content = json!({"name": "Approver"}).as_object().unwrap().clone();
        Box::pin(std::future::ready(Some(ElicitationAnswer::Accept {
            content,
        })))
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
    approver: Arc<Approver2>,
    rounds: Arc<Rounds>,
    _registry: RegistryDir,
}

/// The fixture server as `asks` (2026-07-28) and `old` (2025-11-25 only), each with an
/// approval timeout of 1 s.
fn setup() -> Setup {
    init_logging();
    let registry = RegistryDir::new();
    for (server, args) in [
        ("asks", &["--ask-tools"][..]),
        (
            "old",
            &["--ask-tools", "--protocol-version", "2025-11-25"][..],
        ),
    ] {
        registry.write(
            &format!("{server}.toml"),
            &format!(
                "approval_timeout_ms = 1000\n{}",
                fixture_toml_with_args(server, &["*"], args, "")
            ),
        );
    }
    let approver = Arc::new(Approver2::default());
    let rounds = Arc::new(Rounds::default());
    let host = host_builder(&registry)
        .with_approver(approver.clone())
        .with_tool_observer(rounds.clone())
        .build()
        .unwrap();
    Setup {
        host,
        approver,
        rounds,
        _registry: registry,
    }
}

impl Setup {
    /// Runs the guest in a tokio task of its own, as `quiver serve` runs tasks. Its
    /// requests run off the task's fiber, and the server's questions cross from that work
    /// to the waiting hostcall. However the task ends (a trap in the callback too),
    /// every byte it charged is given back by then.
    async fn guest(&self, server: &str, tool: &str, mode: &str) -> TaskOutcome {
        let task = mcp_task("elicit", &["asks", "old"])
            .with_args([server, tool, mode])
            .with_deadline(Duration::from_secs(30));
        let (host, guest) = (self.host.clone(), example_guest("elicit-answers"));
        let out = tokio::spawn(async move { run(&host, &guest, &task).await })
            .await
            .unwrap();
        assert_eq!(
            out.host_memory.unreleased_bytes, 0,
            "{mode}: {:?}",
            out.host_memory
        );
        out
    }

    /// Runs the guest and returns what the tool said: `ACTION CONTENT`.
    async fn answered(&self, server: &str, tool: &str, mode: &str) -> String {
        let out = self.guest(server, tool, mode).await;
        assert!(
            out.success(),
            "{mode}: {:?}\n{}{}",
            out.failure,
            out.stdout_text(),
            out.stderr_text()
        );
        out.stdout_text().trim_end().to_owned()
    }

    fn approver_asked(&self) -> usize {
        *self.approver.asked.lock().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_answers_both_generations_questions_before_the_approver() {
    let setup = setup();
    for (server, tool) in [("asks", "ask_name"), ("old", "ask_name_2025")] {
        assert_eq!(
            setup.answered(server, tool, "accept").await,
            r#"accept {"name":"Ada","greeting":"hello"}"#,
            "{server}: the guest's answer with the form's default filled in"
        );
        assert_eq!(
            setup.answered(server, tool, "decline").await,
            "decline null"
        );
    }
    assert_eq!(
        setup.approver_asked(),
        0,
        "the guest answered every question"
    );
    let rounds = setup.rounds.0.lock().unwrap().clone();
    assert!(!rounds.is_empty());
    assert!(
        rounds
            .iter()
            .flat_map(|r| &r.inputs)
            .all(|input| input.by == "guest"),
        "{rounds:?}"
    );
    setup.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_answers_badly_has_the_question_declined() {
    let setup = setup();
    for mode in ["garbage", "huge", "wrong-id", "wrong-type", "slow"] {
        for (server, tool) in [("asks", "ask_name"), ("old", "ask_name_2025")] {
            assert_eq!(
                setup.answered(server, tool, mode).await,
                "decline null",
                "{mode} on {server}"
            );
        }
    }
    assert_eq!(setup.approver_asked(), 0, "a bad answer is not passed on");
    // A trap in the callback ends the task, as any trap of the guest does.
    let out = setup.guest("asks", "ask_name", "trap").await;
    assert!(out.failure.is_some(), "{}", out.stdout_text());
    setup.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_opting_in_the_approver_answers() {
    let setup = setup();
    let out = setup
        .host
        .call_tool(
            &mcp_task("lib", &["asks"]),
            quiver::ToolCallRequest::new("asks", "ask_name"),
        )
        .await
        .unwrap();
    assert_eq!(
        out.result.content[0].as_text().unwrap().text,
        r#"accept {"name":"Approver","greeting":"hello"}"#
    );
    assert_eq!(setup.approver_asked(), 1);
    setup.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_declared_roots_answer_roots_list_in_both_generations() {
    let setup = setup();
    let declared =
        mcp_task("roots", &["asks", "old"]).with_root("file:///srv/project", Some("project"));
    let plain = mcp_task("plain", &["asks", "old"]);
    for (server, tool) in [("asks", "ask_roots"), ("old", "ask_roots_2025")] {
        for (task, expected) in [
            (
                &declared,
                r#"{"roots":[{"uri":"file:///srv/project","name":"project"}]}"#,
            ),
            (&plain, r#"{"roots":[]}"#),
        ] {
            let out = setup
                .host
                .call_tool(task, quiver::ToolCallRequest::new(server, tool))
                .await
                .unwrap();
            assert_eq!(
                out.result.content[0].as_text().unwrap().text,
                expected,
                "{server}, task {}",
                task.task_id
            );
        }
    }
    let rounds = setup.rounds.0.lock().unwrap().clone();
    assert!(
        rounds
            .iter()
            .any(|r| r.server_id == "old" && r.inputs.iter().any(|i| i.kind == "roots")),
        "a 2025-era roots/list is a round too: {rounds:?}"
    );
    setup.host.shutdown().await;
}
