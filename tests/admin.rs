//! The admin API of a real `quiver serve` over a real registry directory: records created,
//! changed and deleted over HTTP reach the next task at once; invalid records are refused
//! naming the field; only the admin token opens it; records come back as written, with
//! `${ENV:..}` references and never their values.

use quiver_tests::node::{Answer, Node};
use quiver_tests::{
    RegistryDir, fixture_pids, fixture_toml, hostile_server, pid_alive, unique_id, until, wat,
};
use reqwest::Method;
use serde_json::{Value, json};

const ADMIN: &str = "admin-secret-token";
const TASKS: &str = "task-token";
const SECRET: &str = "s3cr3t-value-never-shown";
const CONFIG: &str =
    "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n";

fn node(registry: &RegistryDir) -> Node {
    Node::start(
        registry,
        Some(CONFIG),
        &[
            ("QUIVER_TEST_TOKEN", TASKS),
            ("QUIVER_TEST_ADMIN", ADMIN),
            ("QV_ADMIN_SECRET", SECRET),
        ],
    )
}

fn admin(node: &Node, method: Method, path: &str) -> reqwest::RequestBuilder {
    node.anonymous(method, &format!("/admin/api/mcp{path}"))
        .bearer_auth(ADMIN)
}

fn record(server_id: &str, allowed: &[&str]) -> Value {
    json!({"format": "toml", "body": fixture_toml(server_id, allowed, "")})
}

/// Runs a task calling `server`'s `echo` with `text`; the task's stderr.
async fn echo(node: &Node, server: &str, text: &str) -> String {
    let args = json!({ "text": text }).to_string();
    let module = node
        .upload(wat::mcp_calls(&[(server, "echo", &args)], 1).as_bytes())
        .await;
    let task = json!({
        "task_id": unique_id("admin"),
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!([server]).to_string()},
        "limits": {"deadline_ms": 120000},
    });
    let id = node.submit_ok(&module, task).await;
    let done = node.task(&id, 60).await;
    assert_eq!(
        done.json["status"],
        "finished",
        "{done:?}\n{}",
        node.stderr()
    );
    done.json["stderr"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn records_written_over_the_admin_api_reach_the_next_task() {
    let registry = RegistryDir::new();
    let node = node(&registry);

    let created =
        Node::send(admin(&node, Method::POST, "/servers").json(&record("fx", &["echo"]))).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert!(registry.path().join("fx.toml").is_file());
    assert!(
        echo(&node, "fx", "first-hello")
            .await
            .contains("first-hello")
    );

    let listed = Node::send(admin(&node, Method::GET, "/servers")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let fx = &listed.json["servers"][0];
    assert_eq!(fx["server_id"], "fx");
    assert_eq!(fx["format"], "toml");
    // The task's call connected it; no `tools/list` yet, so no count.
    assert_eq!(fx["state"], "connected", "{fx}");
    assert!(
        fx.get("tool_count").is_some() && fx.get("last_error").is_some(),
        "{fx}"
    );

    let again =
        Node::send(admin(&node, Method::POST, "/servers").json(&record("fx", &["echo"]))).await;
    assert_eq!(
        (again.status, again.code()),
        (409, "already_exists"),
        "{again:?}"
    );

    // `echo` is no longer allowed: the call fails, no result reaches the guest.
    let changed =
        Node::send(admin(&node, Method::PUT, "/servers/fx").json(&record("fx", &["add"]))).await;
    assert_eq!(changed.status, 200, "{changed:?}");
    let fx = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    let body = fx.json["body"].as_str().unwrap_or_default();
    assert!(body.contains("allowed_tools = [\"add\"]"), "{fx:?}");
    assert!(
        !echo(&node, "fx", "second-hello")
            .await
            .contains("second-hello")
    );

    let mismatch =
        Node::send(admin(&node, Method::PUT, "/servers/fx").json(&record("other", &["echo"])))
            .await;
    assert_eq!(
        (mismatch.status, mismatch.field()),
        (409, "server_id"),
        "{mismatch:?}"
    );
    let unknown =
        Node::send(admin(&node, Method::PUT, "/servers/nope").json(&record("nope", &["echo"])))
            .await;
    assert_eq!(unknown.status, 404, "{unknown:?}");

    let deleted = Node::send(admin(&node, Method::DELETE, "/servers/fx")).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert!(!registry.path().join("fx.toml").exists());
    let gone = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    assert_eq!(gone.status, 404, "{gone:?}");
    let servers = node.get_json("/v1/mcp/servers").await;
    assert_eq!(servers["servers"], json!([]), "{servers}");
}

#[tokio::test]
async fn an_invalid_record_is_refused_naming_the_field() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let bad = fixture_toml("fx", &["echo"], "")
        .replace("transport = \"stdio\"", "transport = \"carrier-pigeon\"");
    let refused: Answer = Node::send(
        admin(&node, Method::POST, "/servers").json(&json!({"format": "toml", "body": bad})),
    )
    .await;
    assert_eq!(
        (refused.status, refused.code()),
        (422, "invalid_record"),
        "{refused:?}"
    );
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("transport"), "{message}");
    assert!(!registry.path().join("fx.toml").exists());

    let no_id = Node::send(
        admin(&node, Method::POST, "/servers")
            .json(&json!({"format": "toml", "body": "transport = \"stdio\""})),
    )
    .await;
    assert_eq!(
        (no_id.status, no_id.field()),
        (422, "server_id"),
        "{no_id:?}"
    );

    // `servers/import` is the import route: a server by that name could never be read.
    let reserved = fixture_toml("import", &["echo"], "");
    let refused = Node::send(
        admin(&node, Method::POST, "/servers").json(&json!({"format": "toml", "body": reserved})),
    )
    .await;
    assert_eq!(
        (refused.status, refused.code(), refused.field()),
        (422, "reserved_name", "server_id"),
        "{refused:?}"
    );
    let imported = Node::send(
        admin(&node, Method::POST, "/servers/import")
            .json(&json!({"format": "toml", "body": fixture_toml("import", &["echo"], "")})),
    )
    .await;
    assert_eq!(
        (imported.status, imported.code()),
        (422, "reserved_name"),
        "{imported:?}"
    );
    assert!(!registry.path().join("import.toml").exists());
}

#[tokio::test]
async fn only_the_admin_token_opens_the_admin_api() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let none = Node::send(node.anonymous(Method::GET, "/admin/api/mcp/servers")).await;
    assert_eq!(none.status, 401, "{none:?}");
    let wrong = Node::send(
        node.anonymous(Method::GET, "/admin/api/mcp/servers")
            .bearer_auth("nope"),
    )
    .await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    // `request` sends the task token: a known client without the `registry` role.
    let task_token = Node::send(node.request(Method::GET, "/admin/api/mcp/servers")).await;
    assert_eq!(
        (task_token.status, task_token.code()),
        (403, "forbidden"),
        "{task_token:?}"
    );
    // The admin token holds `registry` only: no tasks, no status, no approvals.
    for (method, path) in [
        (Method::GET, "/v1/mcp/servers"),
        (Method::POST, "/v1/tasks"),
        (Method::GET, "/v1/approvals"),
    ] {
        let admin_elsewhere = Node::send(node.anonymous(method, path).bearer_auth(ADMIN)).await;
        assert_eq!(
            (admin_elsewhere.status, admin_elsewhere.code()),
            (403, "forbidden"),
            "{path}: {admin_elsewhere:?}"
        );
    }
    let ok = Node::send(admin(&node, Method::GET, "/servers")).await;
    assert_eq!(ok.status, 200, "{ok:?}");

    let plain = Node::start(&registry, None, &[]);
    let off = Node::send(
        plain
            .anonymous(Method::GET, "/admin/api/mcp/servers")
            .bearer_auth(ADMIN),
    )
    .await;
    assert_eq!((off.status, off.code()), (404, "admin_disabled"), "{off:?}");
}

#[tokio::test]
async fn records_come_back_with_env_references_never_their_values() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let body = fixture_toml("fx", &["echo"], "").replace(
        "\n\n[stdio]\n",
        "\n\n[stdio]\nenv = { QV_ADMIN_SECRET = \"${ENV:QV_ADMIN_SECRET}\" }\n",
    );
    let created = Node::send(
        admin(&node, Method::POST, "/servers").json(&json!({"format": "toml", "body": body})),
    )
    .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert!(echo(&node, "fx", "env-hello").await.contains("env-hello"));
    for path in ["/servers", "/servers/fx"] {
        let answer = Node::send(admin(&node, Method::GET, path)).await;
        let text = answer.json.to_string();
        assert!(text.contains("${ENV:QV_ADMIN_SECRET}"), "{text}");
        assert!(!text.contains(SECRET), "{text}");
    }
}

/// Hostile bodies and ids get a 4xx naming what is wrong, nothing is written, and the node
/// keeps serving.
#[tokio::test]
async fn hostile_admin_requests_are_refused_and_write_nothing() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let post = |body: reqwest::Body| {
        admin(&node, Method::POST, "/servers")
            .header("content-type", "application/json")
            .body(body)
    };
    // Past max_request_bytes (1 MiB by default).
    let huge = json!({"format": "toml", "body": "x".repeat(2 * 1024 * 1024)}).to_string();
    let answer = Node::send(post(huge.into())).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    for body in [
        b"{not json".to_vec(),
        vec![0xff, 0xfe, 0x7b],
        b"[]".to_vec(),
        br#"{"format":"toml","body":"server_id = 'x'","extra":1}"#.to_vec(),
        br#"{"format":"yaml","body":"server_id: x"}"#.to_vec(),
    ] {
        let shown = String::from_utf8_lossy(&body).into_owned();
        let answer = Node::send(post(body.into())).await;
        assert!(
            (400..500).contains(&answer.status) && answer.json["error"]["code"].is_string(),
            "{shown}: {answer:?}"
        );
    }
    for id in ["..%2Fetc", &"a".repeat(65), "%00"] {
        let answer = Node::send(admin(&node, Method::DELETE, &format!("/servers/{id}"))).await;
        assert!((400..500).contains(&answer.status), "{id}: {answer:?}");
    }
    // A write that reached the store took the lock (and left its file), nothing more.
    let files: Vec<_> = std::fs::read_dir(registry.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != ".quiver-write.lock")
        .collect();
    assert!(files.is_empty(), "nothing written: {files:?}");
    let listed = Node::send(admin(&node, Method::GET, "/servers")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
}

/// Pids of hostile servers started with `--bytes <marker>` (a number unique to one test).
fn hostile_pids(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.first()
                .is_some_and(|a| a.ends_with(b"hostile-mcp-server"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--bytes" && w[1] == marker.as_bytes())
                && pid_alive(*pid)
        })
        .collect()
}

/// The fixture's whole listing, read by a host of the library on the same record.
async fn fixture_tool_count(registry: &RegistryDir, server: &str) -> usize {
    let host = quiver_tests::host(registry);
    let tools = host.server_tools(server).await.expect("the fixture lists");
    host.shutdown().await;
    tools.len()
}

#[tokio::test]
async fn a_connection_test_lists_the_tools_then_stops_the_server_and_leaves_the_pool_alone() {
    let registry = RegistryDir::new();
    let id = unique_id("probe");
    registry.fixture(&id, &["echo"], "");
    let node = node(&registry);
    let expected = fixture_tool_count(&registry, &id).await;
    assert!(
        fixture_pids(&id).is_empty(),
        "the library host stopped its server"
    );

    let tested = Node::send(admin(&node, Method::POST, &format!("/servers/{id}/test"))).await;
    assert_eq!(tested.status, 200, "{tested:?}");
    let report = &tested.json;
    assert_eq!(report["server_id"], id.as_str(), "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["tool_count"], expected, "{report}");
    let names = report["tools"].as_array().expect("tools");
    assert_eq!(names.len(), expected.min(20), "{report}");
    assert!(names.contains(&json!("echo")), "{report}");
    assert!(report["elapsed_ms"].is_u64(), "{report}");
    // The test's own process is stopped; the pool never connected.
    until("the tested server is gone", || fixture_pids(&id).is_empty()).await;
    let listed = Node::send(admin(&node, Method::GET, "/servers")).await;
    assert_eq!(listed.json["servers"][0]["state"], "idle", "{listed:?}");

    let unknown = Node::send(admin(&node, Method::POST, "/servers/nope/test")).await;
    assert_eq!(
        (unknown.status, unknown.code()),
        (404, "not_found"),
        "{unknown:?}"
    );
    let query = Node::send(admin(
        &node,
        Method::POST,
        &format!("/servers/{id}/test?x=1"),
    ))
    .await;
    assert_eq!((query.status, query.field()), (400, "x"), "{query:?}");
}

#[tokio::test]
async fn a_failing_connection_test_answers_ok_false_within_its_bound_and_leaves_no_process() {
    let registry = RegistryDir::new();
    registry.write(
        "missing.toml",
        "server_id = \"missing\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/nonexistent/quiver-no-such-server\"\n",
    );
    // A server that starts but never answers `initialize`, marked by a unique `--bytes`.
    let marker = format!("{}{}", std::process::id(), 7_001);
    registry.write(
        "hangs.toml",
        &format!(
            "server_id = \"hangs\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = {:?}\nargs = [\"--mode\", \"hang-initialize\", \"--bytes\", \"{marker}\"]\n[budgets]\nconnect_timeout_ms = 800\n",
            hostile_server().display().to_string()
        ),
    );
    let node = node(&registry);

    let missing = Node::send(admin(&node, Method::POST, "/servers/missing/test")).await;
    assert_eq!(missing.status, 200, "{missing:?}");
    assert_eq!(missing.json["ok"], false, "{missing:?}");
    assert_eq!(missing.json["tool_count"], Value::Null, "{missing:?}");
    let reason = missing.json["error"].as_str().unwrap_or_default();
    assert!(reason.contains("quiver-no-such-server"), "{reason}");

    let started = std::time::Instant::now();
    let hangs = Node::send(admin(&node, Method::POST, "/servers/hangs/test")).await;
    assert_eq!(hangs.status, 200, "{hangs:?}");
    assert_eq!(hangs.json["ok"], false, "{hangs:?}");
    let reason = hangs.json["error"].as_str().unwrap_or_default();
    assert!(reason.contains("800 ms"), "names its bound: {reason}");
    assert!(hangs.json["elapsed_ms"].as_u64() >= Some(700), "{hangs:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "bounded by the connect timeout, not a test-wide one"
    );
    until("the hanging server is gone", || {
        hostile_pids(&marker).is_empty()
    })
    .await;
}

#[tokio::test]
async fn the_tool_preview_shows_only_allowed_tools_under_their_model_names() {
    let registry = RegistryDir::new();
    registry.fixture("fx", &["echo", "add"], "");
    registry.write(
        "down.toml",
        "server_id = \"down\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/nonexistent/quiver-no-such-server\"\n",
    );
    let node = node(&registry);

    let preview = Node::send(admin(&node, Method::GET, "/servers/fx/tools")).await;
    assert_eq!(preview.status, 200, "{preview:?}");
    assert_eq!(preview.json["server_id"], "fx");
    let tools = preview.json["tools"].as_array().expect("tools");
    let shown: Vec<(&str, &str)> = tools
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or_default(),
                t["model_name"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("add", "mcp__fx__add"), ("echo", "mcp__fx__echo")],
        "{preview:?}"
    );
    assert!(
        tools[1]["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty())
    );

    let down = Node::send(admin(&node, Method::GET, "/servers/down/tools")).await;
    assert_eq!(
        (down.status, down.code()),
        (502, "server_unavailable"),
        "{down:?}"
    );
    assert!(
        down.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("quiver-no-such-server"))
    );
    let unknown = Node::send(admin(&node, Method::GET, "/servers/nope/tools")).await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
}

fn profile(name: &str, servers: &[&str]) -> Value {
    json!({"format": "toml", "body": format!("name = {name:?}\nserver_ids = {}\n", json!(servers))})
}

#[tokio::test]
async fn profiles_are_managed_like_servers_and_may_only_name_servers_that_exist() {
    let registry = RegistryDir::new();
    registry.fixture("fx", &["echo"], "");
    let node = node(&registry);

    let ghost =
        Node::send(admin(&node, Method::POST, "/profiles").json(&profile("ops", &["ghost"]))).await;
    assert_eq!(
        (ghost.status, ghost.code()),
        (422, "invalid_record"),
        "{ghost:?}"
    );
    let message = ghost.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("ghost"), "{message}");
    assert!(!registry.path().join("profiles/ops.toml").exists());

    let created =
        Node::send(admin(&node, Method::POST, "/profiles").json(&profile("ops", &["fx"]))).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.json["name"], "ops", "{created:?}");
    assert!(registry.path().join("profiles/ops.toml").is_file());
    let again =
        Node::send(admin(&node, Method::POST, "/profiles").json(&profile("ops", &["fx"]))).await;
    assert_eq!(
        (again.status, again.code()),
        (409, "already_exists"),
        "{again:?}"
    );

    let listed = Node::send(admin(&node, Method::GET, "/profiles")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let ops = &listed.json["profiles"][0];
    assert_eq!(
        (&ops["name"], &ops["format"]),
        (&json!("ops"), &json!("toml")),
        "{listed:?}"
    );
    assert!(
        ops["updated_at"].is_u64() && ops["revision"].is_u64(),
        "{ops}"
    );
    let one = Node::send(admin(&node, Method::GET, "/profiles/ops")).await;
    assert_eq!(one.json["fields"]["server_ids"], json!(["fx"]), "{one:?}");

    // The profile still names `fx`: deleting it would break the profile.
    let named = Node::send(admin(&node, Method::DELETE, "/servers/fx")).await;
    assert_eq!(
        (named.status, named.code()),
        (422, "invalid_record"),
        "{named:?}"
    );
    assert!(registry.path().join("fx.toml").is_file());

    let mismatch =
        Node::send(admin(&node, Method::PUT, "/profiles/ops").json(&profile("dev", &["fx"]))).await;
    assert_eq!(
        (mismatch.status, mismatch.field()),
        (409, "name"),
        "{mismatch:?}"
    );
    let missing =
        Node::send(admin(&node, Method::PUT, "/profiles/dev").json(&profile("dev", &["fx"]))).await;
    assert_eq!(missing.status, 404, "{missing:?}");
    let replaced =
        Node::send(admin(&node, Method::PUT, "/profiles/ops").json(&profile("ops", &[]))).await;
    assert_eq!(replaced.status, 200, "{replaced:?}");

    let deleted = Node::send(admin(&node, Method::DELETE, "/profiles/ops")).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert!(!registry.path().join("profiles/ops.toml").exists());
    let gone = Node::send(admin(&node, Method::GET, "/profiles/ops")).await;
    assert_eq!(gone.status, 404, "{gone:?}");
    let server_now = Node::send(admin(&node, Method::DELETE, "/servers/fx")).await;
    assert_eq!(server_now.status, 200, "{server_now:?}");
}

#[tokio::test]
async fn a_put_on_a_stale_revision_is_refused_and_records_show_their_write_time() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created =
        Node::send(admin(&node, Method::POST, "/servers").json(&record("fx", &["echo"]))).await;
    assert_eq!(created.status, 201, "{created:?}");
    let read = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    let revision = read.json["revision"].as_u64().expect("revision");
    let updated_at = read.json["updated_at"].as_u64().expect("updated_at");
    assert!(
        updated_at + 1 >= before && updated_at <= before + 120,
        "{read:?}"
    );
    assert_eq!(read.json["transport"], "stdio", "{read:?}");
    assert_eq!(
        read.json["fields"]["allowed_tools"],
        json!(["echo"]),
        "{read:?}"
    );

    let current = Node::send(
        admin(&node, Method::PUT, "/servers/fx")
            .header("If-Match", revision.to_string())
            .json(&record("fx", &["add"])),
    )
    .await;
    assert_eq!(current.status, 200, "{current:?}");
    let stale = Node::send(
        admin(&node, Method::PUT, "/servers/fx")
            .header("If-Match", format!("\"{revision}\""))
            .json(&record("fx", &["echo", "add"])),
    )
    .await;
    assert_eq!(
        (stale.status, stale.code()),
        (412, "revision_mismatch"),
        "{stale:?}"
    );
    let kept = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    assert_eq!(
        kept.json["fields"]["allowed_tools"],
        json!(["add"]),
        "{kept:?}"
    );
    let garbage = Node::send(
        admin(&node, Method::PUT, "/servers/fx")
            .header("If-Match", "yesterday")
            .json(&record("fx", &["echo"])),
    )
    .await;
    assert_eq!(
        (garbage.status, garbage.field()),
        (400, "If-Match"),
        "{garbage:?}"
    );
}

/// A TOML bundle of `fx` (changed), `fy` (new) and a profile naming both.
fn bundle(fx_tools: &[&str], fy_command_ok: bool) -> String {
    let fx = fixture_toml("fx", fx_tools, "");
    let mut fy = fixture_toml("fy", &["echo"], "");
    if !fy_command_ok {
        fy = fy.replace("transport = \"stdio\"", "transport = \"carrier-pigeon\"");
    }
    let entry = |record: &str| {
        // Each record's own tables become sub-tables of its `[[servers]]` entry.
        record
            .replace("[stdio]", "[servers.stdio]")
            .replace("[budgets]", "[servers.budgets]")
    };
    format!(
        "[[servers]]\n{}\n[[servers]]\n{}\n[[profiles]]\nname = \"both\"\nserver_ids = [\"fx\", \"fy\"]\n",
        entry(&fx),
        entry(&fy)
    )
}

#[tokio::test]
async fn an_import_previews_then_applies_and_one_bad_entry_writes_nothing() {
    let registry = RegistryDir::new();
    registry.fixture("fx", &["echo"], "");
    registry.fixture("kept", &["echo"], "");
    let node = node(&registry);
    let import = |query: &str, body: String| {
        admin(&node, Method::POST, &format!("/servers/import{query}"))
            .json(&json!({"format": "toml", "body": body}))
    };
    let changes = |answer: &Answer| -> Vec<(String, String, String)> {
        answer.json["changes"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                        (s("kind"), s("name"), s("change"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let expected = |fx: &str| {
        vec![
            ("server".to_owned(), "fx".to_owned(), fx.to_owned()),
            ("server".to_owned(), "fy".to_owned(), "add".to_owned()),
            ("profile".to_owned(), "both".to_owned(), "add".to_owned()),
        ]
    };

    let bad = Node::send(import("", bundle(&["echo", "add"], false))).await;
    assert_eq!((bad.status, bad.code()), (422, "invalid_record"), "{bad:?}");
    assert_eq!(bad.field(), "servers[1]", "{bad:?}");
    let message = bad.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("transport"), "{message}");

    let preview = Node::send(import("?dry_run=true", bundle(&["echo", "add"], true))).await;
    assert_eq!(preview.status, 200, "{preview:?}");
    assert_eq!(preview.json["dry_run"], true);
    assert_eq!(changes(&preview), expected("update"), "{preview:?}");
    for path in ["/servers/fy", "/profiles/both"] {
        let absent = Node::send(admin(&node, Method::GET, path)).await;
        assert_eq!(absent.status, 404, "a dry run writes nothing: {absent:?}");
    }
    let fx = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    assert_eq!(
        fx.json["fields"]["allowed_tools"],
        json!(["echo"]),
        "{fx:?}"
    );

    let applied = Node::send(import("", bundle(&["echo", "add"], true))).await;
    assert_eq!(applied.status, 200, "{applied:?}");
    assert_eq!(applied.json["dry_run"], false);
    assert_eq!(changes(&applied), expected("update"), "{applied:?}");
    let fx = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    assert_eq!(
        fx.json["fields"]["allowed_tools"],
        json!(["echo", "add"]),
        "{fx:?}"
    );
    assert!(
        echo(&node, "fy", "imported-hello")
            .await
            .contains("imported-hello")
    );
    // Import never removes.
    let kept = Node::send(admin(&node, Method::GET, "/servers/kept")).await;
    assert_eq!(kept.status, 200, "{kept:?}");

    let again = Node::send(import("?dry_run", bundle(&["echo", "add"], true))).await;
    let unchanged: Vec<_> = changes(&again).into_iter().map(|c| c.2).collect();
    assert_eq!(unchanged, ["unchanged"; 3], "{again:?}");

    let unknown = Node::send(import("?force=1", bundle(&["echo"], true))).await;
    assert_eq!(
        (unknown.status, unknown.field()),
        (400, "force"),
        "{unknown:?}"
    );
    let broken = Node::send(import("", "[[servers]]\ndisplay_name = \"x\"\n".into())).await;
    assert_eq!(
        (broken.status, broken.field()),
        (422, "servers[0].server_id"),
        "{broken:?}"
    );
    let huge = Node::send(import("", "#".repeat(2 * 1024 * 1024))).await;
    assert_eq!(huge.status, 413, "{huge:?}");
    let many: String = (0..=quiver_node::defaults::ADMIN_IMPORT_MAX_DOCS)
        .map(|i| format!("[[profiles]]\nname = \"p{i}\"\nserver_ids = []\n"))
        .collect();
    let too_many = Node::send(import("", many)).await;
    assert_eq!(
        (too_many.status, too_many.code()),
        (422, "too_many_records"),
        "{too_many:?}"
    );
    let files: Vec<_> = std::fs::read_dir(registry.path().join("profiles"))
        .unwrap()
        .collect();
    assert_eq!(files.len(), 1, "only `both`: {files:?}");
}

/// Parallel creates of one id: the create is a write made only while the store is as
/// listed, so exactly one wins and the others are told the record exists (none is lost
/// silently behind a `201`).
#[tokio::test]
async fn parallel_creates_of_one_id_give_one_201_and_the_rest_409() {
    let registry = RegistryDir::new();
    let node = node(&registry);
    let tries = 6;
    let sends = (0..tries).map(|i| {
        let tool = format!("tool{i}");
        Node::send(admin(&node, Method::POST, "/servers").json(&record("fx", &[&tool])))
    });
    let answers = futures::future::join_all(sends).await;
    let created: Vec<usize> = (0..tries).filter(|&i| answers[i].status == 201).collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    for lost in answers.iter().filter(|a| a.status != 201) {
        assert_eq!(
            (lost.status, lost.code()),
            (409, "already_exists"),
            "{lost:?}"
        );
    }
    // The stored record is the winner's.
    let read = Node::send(admin(&node, Method::GET, "/servers/fx")).await;
    let winner = format!("tool{}", created[0]);
    assert_eq!(
        read.json["fields"]["allowed_tools"],
        json!([winner]),
        "{read:?}"
    );
}

/// The record of issue 20's attack: `/bin/sh -c` writing two of the node's secrets (the
/// admin token and another variable) to `loot`.
fn shell_record(loot: &std::path::Path) -> String {
    format!(
        "server_id = \"evil\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"echo \\\"$A $B\\\" > {}\"]\nenv = {{ A = \"${{ENV:QUIVER_TEST_ADMIN}}\", B = \"${{ENV:QV_ADMIN_SECRET}}\" }}\n",
        loot.display()
    )
}

#[tokio::test]
async fn a_record_running_a_shell_with_the_nodes_secrets_never_runs() {
    let registry = RegistryDir::new();
    let loot_dir = tempfile::tempdir().unwrap();
    let loot = loot_dir.path().join("loot");
    let env = [
        ("QUIVER_TEST_TOKEN", TASKS),
        ("QUIVER_TEST_ADMIN", ADMIN),
        ("QV_ADMIN_SECRET", SECRET),
    ];
    let node = Node::start_with_default_launch_rules(&registry, Some(CONFIG), &env);
    let attack = json!({"format": "toml", "body": shell_record(&loot)});
    let refused = Node::send(admin(&node, Method::POST, "/servers").json(&attack)).await;
    assert_eq!(
        (refused.status, refused.code()),
        (422, "invalid_record"),
        "{refused:?}"
    );
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("servers/evil")
            && message.contains("stdio.command")
            && message.contains("/bin/sh")
            && message.contains("[mcp.launch] commands"),
        "{message}"
    );
    assert!(
        !message.contains(ADMIN) && !message.contains(SECRET),
        "{message}"
    );
    assert!(!registry.path().join("evil.toml").exists());
    let imported = Node::send(admin(&node, Method::POST, "/servers/import").json(&json!({
        "format": "toml",
        "body": shell_record(&loot),
    })))
    .await;
    assert_eq!(
        (imported.status, imported.code()),
        (422, "invalid_record"),
        "{imported:?}"
    );
    let tested = Node::send(admin(&node, Method::POST, "/servers/evil/test")).await;
    assert_eq!(tested.status, 404, "{tested:?}");

    // Planted in the directory behind the API's back: the reload leaves it out, says why,
    // and a connection test cannot start it.
    registry.write("evil.toml", &shell_record(&loot));
    let health = node
        .poll_json("/v1/registry", std::time::Duration::from_secs(30), |h| {
            h["last_reload_error"]
                .as_str()
                .is_some_and(|e| e.contains("evil.toml") && e.contains("stdio.command"))
        })
        .await;
    assert_eq!(health["degraded"], true, "{health}");
    let tested = Node::send(admin(&node, Method::POST, "/servers/evil/test")).await;
    assert_eq!(tested.json["ok"], false, "{tested:?}");
    drop(node);

    // The command allowed, the variables not: still refused, naming the variable.
    std::fs::remove_file(registry.path().join("evil.toml")).unwrap();
    let config = format!("{CONFIG}[mcp.launch]\ncommands = [\"/bin/sh\"]\n");
    let node = Node::start_with_default_launch_rules(&registry, Some(&config), &env);
    let refused = Node::send(admin(&node, Method::POST, "/servers").json(&attack)).await;
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(refused.status, 422, "{refused:?}");
    assert!(
        message.contains("stdio.env.A") && message.contains("`QUIVER_TEST_ADMIN`"),
        "{message}"
    );
    assert!(
        !message.contains(ADMIN) && !message.contains(SECRET),
        "{message}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!loot.exists(), "the shell ran");
}
