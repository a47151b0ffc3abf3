//! Every format each store writes is read back (issue 20, item 8): servers and profiles, as
//! TOML and as JSON, written through a real node's admin API into a directory store and
//! into a real etcd, then read back, listed, and loaded by the node (a task reaches the
//! server through the profile). A JSON profile in a directory store used to be written as
//! `profiles/NAME.json` and never loaded: absent from the list, 404 on a GET.

use std::time::Duration;

use quiver::registry::Registry;
use quiver_tests::etcd::Etcd;
use quiver_tests::node::Node;
use quiver_tests::{RegistryDir, fixture_toml, unique_id, wat};
use reqwest::Method;
use serde_json::{Value, json};

const ADMIN: &str = "formats-admin-token";
const WITHIN: Duration = Duration::from_secs(30);
const FORMATS: [&str; 2] = ["toml", "json"];

fn config() -> &'static str {
    "[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n"
}

async fn admin(node: &Node, method: Method, path: &str, body: Option<Value>) -> Value {
    let mut request = node
        .anonymous(method.clone(), &format!("/admin/api/mcp{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = Node::send(request).await;
    let want = if method == Method::POST { 201 } else { 200 };
    assert_eq!(
        answer.status,
        want,
        "{method} {path}: {answer:?}\n{}",
        node.stderr()
    );
    answer.json
}

/// A server record (the fixture, `echo` allowed) in `format`.
fn server_body(id: &str, format: &str) -> String {
    let toml = fixture_toml(id, &["echo"], "");
    match format {
        "toml" => toml,
        _ => {
            let value: Value = toml::from_str(&toml).expect("fixture toml");
            serde_json::to_string_pretty(&value).expect("json")
        }
    }
}

/// A profile naming `server`, in `format`.
fn profile_body(name: &str, server: &str, format: &str) -> String {
    match format {
        "toml" => format!("name = {name:?}\nserver_ids = [{server:?}]\n"),
        _ => json!({"name": name, "server_ids": [server]}).to_string(),
    }
}

/// A task naming only `profile` reaches `server`'s `echo` through it.
async fn assert_echoes_through(node: &Node, profile: &str, server: &str) {
    let text = format!("via {profile}");
    let args = json!({ "text": text }).to_string();
    let module = node
        .upload(wat::mcp_calls(&[(server, "echo", &args)], 1).as_bytes())
        .await;
    let task = json!({
        "task_id": unique_id("formats"),
        "config": {"mcp.enabled": "true", "mcp.profile": profile},
        "limits": {"deadline_ms": 120000},
    });
    let submitted = node.submit(&module, task).await;
    assert_eq!(
        submitted.status, 202,
        "profile `{profile}` is not loaded: {submitted:?}"
    );
    let id = submitted.json["id"].as_str().expect("id");
    let done = node.task(id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    let stderr = done.json["stderr"].as_str().unwrap_or_default();
    let result: Value = serde_json::from_str(stderr.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {done:?}"));
    assert_eq!(result["content"][0]["text"], text, "{done:?}");
}

/// Writes a server and a profile in each format through `node`'s admin API, then reads
/// each back, finds it in the listing with its format, and runs a task through it.
/// The names written, `(format, server, profile)`.
async fn every_format_round_trips(node: &Node) -> Vec<(&'static str, String, String)> {
    let mut written = Vec::new();
    for format in FORMATS {
        let server = unique_id(&format!("fmt{format}"));
        let profile = unique_id(&format!("prof{format}"));
        let body = server_body(&server, format);
        admin(
            node,
            Method::POST,
            "/servers",
            Some(json!({"format": format, "body": body})),
        )
        .await;
        let body = profile_body(&profile, &server, format);
        admin(
            node,
            Method::POST,
            "/profiles",
            Some(json!({"format": format, "body": body})),
        )
        .await;
        written.push((format, server, profile));
    }
    for (format, server, profile) in &written {
        let got = admin(node, Method::GET, &format!("/servers/{server}"), None).await;
        assert_eq!(
            (&got["format"], &got["fields"]["server_id"]),
            (&json!(format), &json!(server)),
            "{got}"
        );
        let got = admin(node, Method::GET, &format!("/profiles/{profile}"), None).await;
        assert_eq!(
            (&got["format"], &got["fields"]["server_ids"]),
            (&json!(format), &json!([server])),
            "{got}"
        );
    }
    let servers = admin(node, Method::GET, "/servers", None).await;
    let profiles = admin(node, Method::GET, "/profiles", None).await;
    let listed = |list: &Value, key: &str, field: &str| -> Vec<(String, String)> {
        list[key]
            .as_array()
            .expect("a list")
            .iter()
            .map(|d| {
                (
                    d[field].as_str().unwrap_or_default().to_owned(),
                    d["format"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let servers = listed(&servers, "servers", "server_id");
    let profiles = listed(&profiles, "profiles", "name");
    for (format, server, profile) in &written {
        assert!(
            servers.contains(&(server.clone(), (*format).to_owned())),
            "{server} ({format}) not in {servers:?}"
        );
        assert!(
            profiles.contains(&(profile.clone(), (*format).to_owned())),
            "{profile} ({format}) not in {profiles:?}"
        );
    }
    for (_, server, profile) in &written {
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let loaded = node.get_json("/v1/mcp/servers").await;
            let known = loaded["servers"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["server_id"] == server.as_str()));
            if known {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{server} never loaded: {loaded}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_echoes_through(node, profile, server).await;
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_store_loads_every_format_it_writes() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, Some(config()), &[("QUIVER_TEST_ADMIN", ADMIN)]);
    let written = every_format_round_trips(&node).await;
    // On disk as the format says, and a host loading the directory afresh finds them all.
    let loaded = Registry::load_dir(registry.path()).expect("load the directory");
    for (format, server, profile) in &written {
        assert!(registry.path().join(format!("{server}.{format}")).is_file());
        assert!(
            registry
                .path()
                .join(format!("profiles/{profile}.{format}"))
                .is_file()
        );
        assert!(loaded.get(server).is_some(), "{server}");
        assert!(loaded.profile(profile).is_some(), "{profile}");
    }
    assert!(loaded.problems().is_empty(), "{:?}", loaded.problems());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_store_loads_every_format_it_writes() {
    let etcd = Etcd::start();
    let url = format!("etcd://{}/{}", etcd.address(), unique_id("formats"));
    let node = Node::start_on(
        url.as_ref(),
        Some(config()),
        &[("QUIVER_TEST_ADMIN", ADMIN)],
        &[],
    );
    every_format_round_trips(&node).await;
}
