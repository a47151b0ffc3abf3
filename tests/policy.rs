//! The three-layer MCP policy through a real guest, the scripted LLM and real fixture
//! servers: the examples of seed 002's appendix, failure tolerance, profiles, and
//! `quiver run --explain-policy`.

use std::process::Command;

use quiver::TaskSpec;
use quiver_tests::chat_wat::{ChatGuest, scripted_host};
use quiver_tests::llm::{Reply, ScriptedLlm, tool_names, tool_results};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, quiver_cli};
use serde_json::{Value, json};

/// The registry of seed 002's appendix: four servers, all the fixture server.
fn seed_registry() -> RegistryDir {
    let registry = RegistryDir::new();
    for id in ["gitlab", "fs", "duckduckgo-search", "jira"] {
        registry.fixture(id, &["*"], "");
    }
    registry
}

/// The task config of seed 002's appendix, verbatim (string values).
fn seed_task() -> TaskSpec {
    TaskSpec::from_json(
        r#"{"task_id": "seed-002", "config": {
            "mcp.enabled": "true",
            "mcp.default_server_ids": "[\"gitlab\",\"fs\"]",
            "mcp.allowed_server_ids": "[\"gitlab\",\"fs\",\"duckduckgo-search\"]",
            "mcp.tool_allowlist": "[\"*\"]",
            "mcp.tool_denylist": "[\"delete_*\"]"}}"#,
    )
    .unwrap()
}

async fn run(host: &quiver::Host, guest: &ChatGuest, task: &TaskSpec) -> WatRun {
    wat::run_ok(host, &guest.build(), task).await
}

fn started(host: &quiver::Host, server_id: &str) -> bool {
    host.status()
        .mcp_servers
        .iter()
        .any(|s| s.server_id == server_id && s.connections > 0)
}

fn decisions(response: &Value) -> Vec<(String, Option<String>, String)> {
    response["_spear"]["mcp"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["server_id"].as_str().unwrap().to_owned(),
                d["tool"].as_str().map(str::to_owned),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn seed_defaults_offer_gitlab_and_fs_without_delete_tools() {
    let llm = ScriptedLlm::start(vec![Reply::text("ok")]).await;
    let registry = seed_registry();
    let host = scripted_host(&registry, &llm);
    let run = run(
        &host,
        &ChatGuest::new()
            .param("mcp.decision_log", json!(true))
            .msg("user", "hi")
            .send(2)
            .recv(),
        &seed_task(),
    )
    .await;
    let names = tool_names(&llm.request(0));
    assert!(
        names.contains(&"mcp__gitlab__echo".to_owned())
            && names.contains(&"mcp__fs__echo".to_owned()),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("duckduckgo") || n.contains("jira")),
        "only the defaults: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n.contains("delete_")),
        "the task's denylist: {names:?}"
    );
    let response: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    let log = decisions(&response);
    assert!(
        log.contains(&(
            "gitlab".into(),
            Some("delete_file".into()),
            "denied_by_pattern".into()
        )),
        "{log:?}"
    );
    assert_eq!(
        response["_spear"]["mcp"]["servers"],
        json!(["gitlab", "fs"])
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_session_narrows_to_gitlab_and_a_call_to_fs_is_denied_without_reaching_it() {
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([
            ("f", "mcp.fs.read_text", json!({"path": "/etc/hostname"})),
            ("g", "mcp__gitlab__echo", json!({"text": "hi"})),
        ]),
        Reply::text("done"),
    ])
    .await;
    let registry = seed_registry();
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new()
        .param("mcp.server_ids", json!(["gitlab"]))
        .param("mcp.server_ids", json!(["jira"]))
        .param(
            "mcp.server_ids",
            json!(["gitlab", "duckduckgo-search", "jira"]),
        )
        .msg("user", "read a file")
        .send(2)
        .recv();
    let run = run(&host, &guest, &seed_task()).await;
    assert_eq!(
        &run.results[1..4],
        [0, -13, -13],
        "jira is outside the task's allowed servers"
    );
    let names = tool_names(&llm.request(0));
    assert!(
        names.iter().all(|n| n.starts_with("mcp__gitlab__")),
        "{names:?}"
    );
    let results = tool_results(&llm.request(1));
    let denied: Value = serde_json::from_str(&results[0].1).unwrap();
    assert_eq!(denied["error"]["code"], "mcp_policy_denied");
    assert_eq!(results[1].1, "hi");
    assert!(
        !started(&host, "fs"),
        "the fs server received nothing (was never even started)"
    );
    assert!(started(&host, "gitlab"));
    host.shutdown().await;
}

#[tokio::test]
async fn failing_servers_drop_out_alone_with_their_reason() {
    let llm = ScriptedLlm::start(vec![Reply::text("fine without them")]).await;
    let registry = RegistryDir::new();
    registry.fixture("fs", &["*"], "");
    registry.fixture("slow", &["*"], "[budgets]\ntool_timeout_ms = 300\n");
    let slow = std::fs::read_to_string(registry.path().join("slow.toml"))
        .unwrap()
        .replace("args = [", "args = [\"--slow-list-ms\", \"5000\", ");
    registry.write("slow.toml", &slow);
    registry.write("gitlab.toml", "server_id = \"gitlab\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"x\"\nenv = { TOKEN = \"${ENV:QUIVER_TEST_GITLAB_TOKEN_UNSET}\" }\n");
    registry.write("broken.toml", "server_id = \"broken\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/no/such/server\"\n");
    registry.write(
        "locked.toml",
        "server_id = \"locked\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n",
    );
    let host = scripted_host(&registry, &llm);
    let task = TaskSpec::new("tolerant")
        .with_config("mcp.enabled", "true")
        .with_config(
            "mcp.default_server_ids",
            "fs, gitlab, slow, broken, locked, ghost",
        )
        .with_captured_output();
    let run = run(
        &host,
        &ChatGuest::new()
            .param("mcp.decision_log", json!(true))
            .msg("user", "hi")
            .send(2)
            .recv(),
        &task,
    )
    .await;
    let response: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(
        response["choices"][0]["message"]["content"],
        "fine without them"
    );
    assert_eq!(response["_spear"]["mcp"]["servers"], json!(["fs"]));
    let reasons: Vec<(String, String)> = decisions(&response)
        .into_iter()
        .filter(|(_, tool, _)| tool.is_none())
        .map(|(s, _, r)| (s, r))
        .collect();
    for expected in [
        ("gitlab", "env_missing"),
        ("slow", "list_timeout"),
        ("broken", "list_failed"),
        ("locked", "deny_all_server"),
        ("ghost", "unknown_server"),
    ] {
        assert!(
            reasons.contains(&(expected.0.into(), expected.1.into())),
            "{expected:?} missing from {reasons:?}"
        );
    }
    assert!(
        tool_names(&llm.request(0))
            .iter()
            .all(|n| n.starts_with("mcp__fs__"))
    );
    host.shutdown().await;
}

#[tokio::test]
async fn an_empty_effective_set_lets_the_chat_proceed_without_mcp_tools() {
    let llm = ScriptedLlm::start(vec![Reply::text("no tools needed")]).await;
    let registry = seed_registry();
    let host = scripted_host(&registry, &llm);
    let task = TaskSpec::new("empty")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "[]");
    let run = run(
        &host,
        &ChatGuest::new().msg("user", "hi").send(2).recv(),
        &task,
    )
    .await;
    let response: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(
        response["choices"][0]["message"]["content"],
        "no tools needed"
    );
    assert!(
        llm.request(0).get("tools").is_none(),
        "no tools offered at all"
    );
}

#[tokio::test]
async fn a_profile_selects_servers_by_tag_and_its_tool_lists_apply() {
    let llm = ScriptedLlm::start(vec![Reply::text("ok")]).await;
    let registry = RegistryDir::new();
    registry.fixture_tagged("gitlab", &["*"], &["scm"]);
    registry.fixture_tagged("github", &["*"], &["scm"]);
    registry.fixture_tagged("web", &["*"], &["search"]);
    std::fs::create_dir(registry.path().join("profiles")).unwrap();
    std::fs::write(
        registry.path().join("profiles/code-review.toml"),
        "name = \"code-review\"\ntags = [\"scm\"]\ntool_allowlist = [\"echo\", \"add\", \"delete_*\"]\ntool_denylist = [\"delete_*\"]\n",
    )
    .unwrap();
    let host = scripted_host(&registry, &llm);
    let task = TaskSpec::new("profiled")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.profile", "code-review");
    run(
        &host,
        &ChatGuest::new().msg("user", "hi").send(2).recv(),
        &task,
    )
    .await;
    let mut names = tool_names(&llm.request(0));
    names.sort();
    assert_eq!(
        names,
        [
            "mcp__github__add",
            "mcp__github__echo",
            "mcp__gitlab__add",
            "mcp__gitlab__echo"
        ]
    );

    let narrowing = TaskSpec::new("narrow")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.profile", "code-review")
        .with_config("mcp.allowed_server_ids", "gitlab, web");
    let module = host
        .load_module("g.wat", ChatGuest::new().build().as_bytes())
        .unwrap();
    let err = host
        .run_task(&module, &narrowing)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mcp.allowed_server_ids") && err.contains("`web`"),
        "{err}"
    );
    host.shutdown().await;
}

#[test]
fn validate_catches_profiles_naming_unknown_servers() {
    let registry = seed_registry();
    std::fs::create_dir(registry.path().join("profiles")).unwrap();
    std::fs::write(
        registry.path().join("profiles/ops.toml"),
        "name = \"ops\"\nserver_ids = [\"fs\", \"pagerduty\"]\n",
    )
    .unwrap();
    std::fs::write(
        registry.path().join("profiles/search.toml"),
        "name = \"search\"\ntags = [\"nothing-has-this\"]\n",
    )
    .unwrap();
    let out = Command::new(quiver_cli())
        .args(["registry", "validate"])
        .arg(registry.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("ops.toml: server_ids: profile `ops` names unknown server `pagerduty`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning") && stdout.contains("no server carries tag `nothing-has-this`"),
        "{stdout}"
    );
}

#[test]
fn explain_policy_prints_the_decision_log_before_running() {
    let registry = seed_registry();
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("task.json");
    let mut spec: Value = serde_json::from_str(r#"{"task_id": "seed-002", "config": {}}"#).unwrap();
    spec["config"] = json!({
        "mcp.enabled": "true",
        "mcp.default_server_ids": "[\"gitlab\",\"fs\"]",
        "mcp.allowed_server_ids": "[\"gitlab\",\"fs\",\"duckduckgo-search\"]",
        "mcp.tool_allowlist": "[\"*\"]",
        "mcp.tool_denylist": "[\"delete_*\"]"
    });
    std::fs::write(&task, spec.to_string()).unwrap();
    let module = dir.path().join("noop.wat");
    std::fs::write(
        &module,
        "(module (memory (export \"memory\") 1) (func (export \"_start\")))",
    )
    .unwrap();
    let out = Command::new(quiver_cli())
        .args(["run", "--no-cache", "--explain-policy", "--registry"])
        .arg(registry.path())
        .arg("--task")
        .arg(&task)
        .arg(&module)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "MCP policy for task `seed-002`",
        "allowed=[gitlab, fs, duckduckgo-search] defaults=[gitlab, fs]",
        "offered  gitlab: ",
        "offered  fs: ",
        "allowed  duckduckgo-search: not a default",
        "excluded jira: not_allowed_by_task",
        "excluded fs/delete_file: denied_by_pattern (matches the task's deny pattern `delete_*`)",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in:\n{stderr}");
    }
}
