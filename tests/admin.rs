//! The admin API of a real `quiver serve` over a real registry directory: records created,
//! changed and deleted over HTTP reach the next task at once; invalid records are refused
//! naming the field; only the admin token opens it; records come back as written, with
//! `${ENV:..}` references and never their values.

use quiver_tests::node::{Answer, Node};
use quiver_tests::{RegistryDir, fixture_toml, unique_id, wat};
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
    // `request` sends the task token.
    let task_token = Node::send(node.request(Method::GET, "/admin/api/mcp/servers")).await;
    assert_eq!(task_token.status, 401, "{task_token:?}");
    let admin_on_tasks = Node::send(
        node.anonymous(Method::GET, "/v1/mcp/servers")
            .bearer_auth(ADMIN),
    )
    .await;
    assert_eq!(admin_on_tasks.status, 401, "{admin_on_tasks:?}");
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
    let files: Vec<_> = std::fs::read_dir(registry.path()).unwrap().collect();
    assert!(files.is_empty(), "nothing written: {files:?}");
    let listed = Node::send(admin(&node, Method::GET, "/servers")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
}
