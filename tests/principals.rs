//! A principal for every task, end to end: the real `quiver serve` binary with named clients
//! (one acting for end users), the host config's `[principals]` layer, real fixture MCP
//! servers, the audit log and the metrics over real HTTP; and `quiver run`'s default
//! principal.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use quiver_tests::node::{Answer, Node};
use quiver_tests::{RegistryDir, fixture_launch_rules, openmetrics, quiver_cli, unique_id, wat};
use reqwest::Method;
use serde_json::{Value, json};

const PORTAL: &str = "portal-token-0042-principals";
const CI: &str = "ci-token-0042-principals";
const OPS: &str = "ops-token-0042-principals";

/// `portal` may act for `*@example.com`; `ci` for nobody; `ops` sees every task. Ann may
/// use every server; everyone else (and `ci` itself) only `shared`.
const CONFIG: &str = r#"
[clients.portal]
token_env = "PORTAL_TOKEN"
roles = ["submit"]
act_for = ["*@example.com"]
[clients.ci]
token_env = "CI_TOKEN"
roles = ["submit"]
[clients.ops]
token_env = "OPS_TOKEN"
roles = ["submit", "observe"]

[principals."ann@example.com"]
servers = ["*"]
[principals."*"]
servers = ["shared-*"]
"#;

struct Fixture {
    node: Node,
    audit: std::path::PathBuf,
    shared: String,
    secret: String,
    _logs: tempfile::TempDir,
    _registry: RegistryDir,
}

/// Clients only, as a node without principals configures them.
const CLIENTS_ONLY: &str = r#"
[clients.portal]
token_env = "PORTAL_TOKEN"
roles = ["submit"]
[clients.ci]
token_env = "CI_TOKEN"
roles = ["submit"]
[clients.ops]
token_env = "OPS_TOKEN"
roles = ["submit", "observe"]
"#;

fn start() -> Fixture {
    start_with(CONFIG)
}

fn start_with(config: &str) -> Fixture {
    let (shared, secret) = (unique_id("shared"), unique_id("secret"));
    let registry = RegistryDir::new();
    registry.fixture(&shared, &["echo"], "");
    registry.fixture(&secret, &["echo"], "");
    let logs = tempfile::tempdir().expect("tempdir");
    let audit = logs.path().join("audit.jsonl");
    let node = Node::start_with_args(
        &registry,
        Some(config),
        &[
            ("PORTAL_TOKEN", PORTAL),
            ("CI_TOKEN", CI),
            ("OPS_TOKEN", OPS),
        ],
        &["--audit-log".as_ref(), audit.as_os_str()],
    );
    Fixture {
        node,
        audit,
        shared,
        secret,
        _logs: logs,
        _registry: registry,
    }
}

impl Fixture {
    fn as_client(&self, token: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.node.anonymous(method, path).bearer_auth(token)
    }

    async fn upload(&self, wat: &str) -> String {
        let sha = quiver_tests::node::sha256_hex(wat.as_bytes());
        let answer = Node::send(
            self.as_client(OPS, Method::PUT, &format!("/v1/modules/{sha}"))
                .header("content-type", "application/wasm")
                .body(wat.as_bytes().to_vec()),
        )
        .await;
        assert!(matches!(answer.status, 200 | 201), "{answer:?}");
        sha
    }

    async fn submit(&self, token: &str, body: Value) -> Answer {
        Node::send(self.as_client(token, Method::POST, "/v1/tasks").json(&body)).await
    }

    /// The finished task `id`, read by `ops` (who sees every task).
    async fn finished(&self, id: &str) -> Answer {
        let done =
            Node::send(self.as_client(OPS, Method::GET, &format!("/v1/tasks/{id}?wait=60"))).await;
        assert_eq!(done.json["status"], "finished", "{done:?}");
        done
    }
}

/// A task enabling MCP with `servers` allowed (and no defaults needed by `mcp_open`).
fn task(id: &str, servers: &[&str]) -> Value {
    json!({
        "task_id": id,
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!(servers).to_string()},
        "limits": {"deadline_ms": 120000},
    })
}

async fn audit_lines(path: &Path, count: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= count || start.elapsed() > Duration::from_secs(30) {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ann (through the portal) may call both servers; Bob (through the portal) and `ci`
/// itself only `shared`: the other call is denied by the principal layer, audited naming
/// the principal, the client, the server and the fix. The portal may not act for a user
/// outside its patterns, `ci` for anybody. The metrics label Ann by name and Bob as
/// `other`; a guest's `mcp_registry_list` shows Bob no server he may not use.
#[tokio::test]
async fn principals_bind_servers_and_clients_act_only_for_the_users_they_may() {
    let f = start();
    let (shared, secret) = (f.shared.as_str(), f.secret.as_str());
    let calls = wat::mcp_calls(
        &[
            (secret, "echo", r#"{"text":"s"}"#),
            (shared, "echo", r#"{"text":"p"}"#),
        ],
        1,
    );
    let module = f.upload(&calls).await;
    let both = [secret, shared];

    let submit = |token: &'static str, id: &str, principal: Option<&str>| {
        let mut body = json!({"module": module, "task": task(id, &both)});
        if let Some(principal) = principal {
            body["principal"] = json!(principal);
        }
        f.submit(token, body)
    };
    let ann = submit(PORTAL, "ann-task", Some("ann@example.com")).await;
    assert_eq!(ann.status, 202, "{ann:?}");
    let bob = submit(PORTAL, "bob-task", Some("bob@example.com")).await;
    assert_eq!(bob.status, 202, "{bob:?}");
    let own = submit(CI, "ci-task", None).await;
    assert_eq!(own.status, 202, "{own:?}");

    let outside = submit(PORTAL, "eve-task", Some("eve@evil.test")).await;
    assert_eq!(
        (outside.status, outside.field()),
        (403, "principal"),
        "{outside:?}"
    );
    let message = outside.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("client `portal`") && message.contains("[clients.portal] act_for"),
        "{message}"
    );
    let no_act_for = submit(CI, "ci-for-ann", Some("ann@example.com")).await;
    assert_eq!(no_act_for.status, 403, "{no_act_for:?}");
    assert!(
        no_act_for.json["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("has no `act_for`"),
        "{no_act_for:?}"
    );
    let invisible = submit(PORTAL, "x", Some("ann\u{202e}@example.com")).await;
    assert_eq!(
        (invisible.status, invisible.field()),
        (400, "principal"),
        "{invisible:?}"
    );

    let mut emitted = Vec::new();
    for answer in [&ann, &bob, &own] {
        let done = f.finished(answer.json["id"].as_str().expect("id")).await;
        emitted.push(
            done.json["stderr"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .count(),
        );
        assert!(done.json["client"].is_string(), "{done:?}");
    }
    assert_eq!(
        emitted,
        [2, 1, 1],
        "Ann's calls both ran, the others' one each"
    );

    // Ann: two calls; Bob and ci: a denial and a call each.
    let lines = audit_lines(&f.audit, 6).await;
    let row = |l: &Value| {
        let s = |k: &str| l[k].as_str().unwrap_or("-").to_owned();
        (
            s("event"),
            s("task_id"),
            s("principal"),
            s("client"),
            s("server_id"),
        )
    };
    let mut rows: Vec<_> = lines.iter().map(row).collect();
    rows.sort();
    let r = |e: &str, t: &str, p: &str, c: &str, s: &str| {
        (
            e.to_owned(),
            t.to_owned(),
            p.to_owned(),
            c.to_owned(),
            s.to_owned(),
        )
    };
    let mut expected = vec![
        r("tool_call", "ann-task", "ann@example.com", "portal", secret),
        r("tool_call", "ann-task", "ann@example.com", "portal", shared),
        r(
            "policy_denied",
            "bob-task",
            "bob@example.com",
            "portal",
            secret,
        ),
        r("tool_call", "bob-task", "bob@example.com", "portal", shared),
        r("policy_denied", "ci-task", "ci", "ci", secret),
        r("tool_call", "ci-task", "ci", "ci", shared),
    ];
    expected.sort();
    assert_eq!(rows, expected, "{lines:#?}");
    let denial = lines
        .iter()
        .find(|l| l["task_id"] == "bob-task" && l["event"] == "policy_denied")
        .expect("bob's denial");
    assert_eq!(denial["reason"], "not_allowed_for_principal", "{denial}");
    let detail = denial["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "principal `bob@example.com` may not use server `{secret}`"
        )) && detail.contains("[principals.\"*\"] servers"),
        "{detail}"
    );

    let metrics = f
        .as_client(OPS, Method::GET, "/metrics")
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert!(
        !metrics.contains("bob@example.com"),
        "unlisted names get no series"
    );
    let samples = openmetrics::parse(&metrics);
    let calls = "quiver_mcp_tool_calls_total";
    let of = |server: &str, principal: &str| {
        openmetrics::find(
            &samples,
            calls,
            &[
                ("server_id", server),
                ("tool", "echo"),
                ("outcome", "ok"),
                ("principal", principal),
            ],
        )
    };
    assert_eq!(of(secret, "ann@example.com"), Some(1.0), "{metrics}");
    assert_eq!(of(shared, "other"), Some(2.0), "{metrics}");
    let denials = openmetrics::find(
        &samples,
        "quiver_policy_denials_total",
        &[
            ("reason", "not_allowed_for_principal"),
            ("principal", "other"),
        ],
    );
    assert_eq!(denials, Some(2.0), "{metrics}");

    // Listing: Bob's guest sees `shared` only, Ann's both.
    let lister = f
        .upload(&wat::guest(
            &[],
            "(func $main
               (call $cap (i32.const 8192) (i32.const 65536))
               (call $out (call $mcp_registry_list (i32.const 16384) (i32.const 8192)))
               (call $emit (i32.const 16384) (call $len (i32.const 8192))))",
        ))
        .await;
    for (principal, sees_secret) in [("bob@example.com", false), ("ann@example.com", true)] {
        let body = json!({"module": lister, "task": task("lister", &both), "principal": principal});
        let answer = f.submit(PORTAL, body).await;
        assert_eq!(answer.status, 202, "{answer:?}");
        let done = f.finished(answer.json["id"].as_str().expect("id")).await;
        let listed = done.json["stderr"].as_str().unwrap_or_default();
        assert!(listed.contains(shared), "{principal}: {listed}");
        assert_eq!(
            listed.contains(secret),
            sees_secret,
            "{principal}: {listed}"
        );
    }
}

/// A client holding only `submit` sees, waits for and cancels only its own tasks: another
/// client's ids are 404, exactly as an unknown id; `observe` sees them all.
#[tokio::test]
async fn a_submit_only_client_sees_and_cancels_only_its_own_tasks() {
    let f = start_with(CLIENTS_ONLY);
    let module = f.upload(quiver_tests::node::LOOP).await;
    let spin = json!({"task_id": "spin", "limits": {"deadline_ms": 60000}});
    let mine = f
        .submit(PORTAL, json!({"module": module, "task": spin}))
        .await;
    assert_eq!(mine.status, 202, "{mine:?}");
    let id = mine.json["id"].as_str().expect("id").to_owned();
    let path = format!("/v1/tasks/{id}");
    let unknown = "/v1/tasks/0123456789abcdef01234567";

    for (method, path) in [
        (Method::GET, path.as_str()),
        (Method::GET, &format!("{path}?wait=1")),
        (Method::DELETE, path.as_str()),
        (Method::GET, unknown),
    ] {
        let other = Node::send(f.as_client(CI, method.clone(), path)).await;
        assert_eq!(
            (other.status, other.code()),
            (404, "not_found"),
            "{method} {path}: {other:?}"
        );
    }
    let seen = Node::send(f.as_client(OPS, Method::GET, &path)).await;
    assert_eq!(seen.status, 200, "{seen:?}");
    assert_eq!(
        (
            seen.json["principal"].as_str(),
            seen.json["client"].as_str()
        ),
        (Some("portal"), Some("portal"))
    );
    let own = Node::send(f.as_client(PORTAL, Method::GET, &path)).await;
    assert_eq!(own.status, 200, "{own:?}");
    assert_ne!(
        own.json["status"], "cancelled",
        "ci's DELETE did nothing: {own:?}"
    );
    let cancelled = Node::send(f.as_client(PORTAL, Method::DELETE, &path)).await;
    assert_eq!(
        (cancelled.status, cancelled.json["status"].as_str()),
        (200, Some("cancelled"))
    );
}

/// Whatever a guest's task sets (environment variables, config keys that look like a
/// principal), its audit lines name the client that submitted it.
#[tokio::test]
async fn a_task_cannot_choose_its_principal() {
    let f = start();
    let shared = f.shared.clone();
    let module = f
        .upload(&wat::mcp_calls(&[(&shared, "echo", r#"{"text":"x"}"#)], 1))
        .await;
    let mut spoof = task("spoof", &[&shared]);
    spoof["env"] = json!({"USER": "ann@example.com", "QUIVER_PRINCIPAL": "ann@example.com", "LOGNAME": "root"});
    spoof["config"]["principal"] = json!("ann@example.com");
    spoof["config"]["client"] = json!("portal");
    let answer = f.submit(CI, json!({"module": module, "task": spoof})).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    f.finished(answer.json["id"].as_str().expect("id")).await;
    let lines = audit_lines(&f.audit, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (lines[0]["principal"].as_str(), lines[0]["client"].as_str()),
        (Some("ci"), Some("ci")),
        "{lines:?}"
    );
    // A principal field inside the task is not task.json's: refused, not obeyed.
    let mut inside = task("inside", &[&shared]);
    inside["principal"] = json!("ann@example.com");
    let refused = f
        .submit(CI, json!({"module": module, "task": inside}))
        .await;
    assert_eq!(
        (refused.status, refused.field()),
        (400, "task.principal"),
        "{refused:?}"
    );
}

/// `quiver run` without `--as` acts as the login name, or `local` without a usable one; a
/// `[principals]` entry binds it like any other principal.
#[test]
fn quiver_run_acts_as_the_login_name_by_default() {
    let registry = RegistryDir::new();
    let server = unique_id("cli");
    registry.fixture(&server, &["echo"], "");
    let dir = tempfile::tempdir().expect("tempdir");
    let guest = dir.path().join("calls.wat");
    std::fs::write(
        &guest,
        wat::mcp_calls(&[(&server, "echo", r#"{"text":"x"}"#)], 1),
    )
    .expect("write");
    let task = dir.path().join("task.json");
    std::fs::write(&task, task_json_of(&server)).expect("write");
    let config = dir.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[principals.tester]\nservers = [\"*\"]\n",
            fixture_launch_rules()
        ),
    )
    .expect("write");
    let run = |user: Option<&str>| {
        let audit = dir
            .path()
            .join(format!("audit-{}.jsonl", user.unwrap_or("none").len()));
        let mut cmd = Command::new(quiver_cli());
        cmd.arg("run")
            .arg("--registry")
            .arg(registry.path())
            .arg("--config")
            .arg(&config)
            .arg("--task")
            .arg(&task)
            .arg("--audit-log")
            .arg(&audit)
            .arg(&guest)
            .env_remove("LOGNAME")
            .env_remove("QUIVER_CONFIG");
        match user {
            Some(user) => cmd.env("USER", user),
            None => cmd.env_remove("USER"),
        };
        let out = cmd.output().expect("quiver run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&audit).expect("audit log");
        let line: Value = serde_json::from_str(text.lines().next().expect("a line")).expect("json");
        (
            line["event"].as_str().map(str::to_owned),
            line["principal"].as_str().map(str::to_owned),
        )
    };
    assert_eq!(
        run(Some("tester")),
        (Some("tool_call".into()), Some("tester".into()))
    );
    // `local` has no entry and there is no `*`: it may use nothing.
    assert_eq!(
        run(Some("bad\u{7}name")),
        (Some("policy_denied".into()), Some("local".into()))
    );
    assert_eq!(
        run(None),
        (Some("policy_denied".into()), Some("local".into()))
    );
}

fn task_json_of(server: &str) -> String {
    json!({
        "task_id": "cli-principal",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!([server]).to_string()},
    })
    .to_string()
}
