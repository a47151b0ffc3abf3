//! A fleet: real `quiver serve` nodes following one real etcd (`--registry
//! etcd://HOST:PORT/PREFIX`). Records are written with `EtcdStore` directly, as an
//! operator's script would, or through one node's admin API. A record written to etcd reaches a task on another node within
//! seconds, its deletion stops the server there, and with etcd stopped the nodes keep
//! serving their last snapshot, degraded, until it comes back.

use std::time::Duration;

use quiver::registry::{DocFormat, DocKind, RegistryStore};
use quiver_node::EtcdStore;
use quiver_tests::etcd::Etcd;
use quiver_tests::node::{Answer, Node};
use quiver_tests::{errno, fixture_pids, fixture_toml, openmetrics, unique_id, wait_gone, wat};
use reqwest::Method;
use serde_json::{Value, json};

/// Generous: several engineers build on two cores. Polls end as soon as the state is seen.
const WITHIN: Duration = Duration::from_secs(30);

/// The `--registry` URL of `etcd` under `prefix`, as the node describes its store.
fn url(etcd: &Etcd, prefix: &str) -> String {
    let endpoint = etcd.endpoint();
    let host = endpoint.trim_start_matches("http://");
    format!("etcd://{host}/{prefix}")
}

async fn store(etcd: &Etcd, prefix: &str) -> EtcdStore {
    EtcdStore::connect(vec![etcd.endpoint()], prefix.into())
        .await
        .expect("connect to etcd")
}

/// Writes the fixture server as `server_id`; etcd's revision after the write.
async fn put_fixture(store: &EtcdStore, server_id: &str) -> u64 {
    store
        .upsert(
            DocKind::Server,
            server_id,
            DocFormat::Toml,
            fixture_toml(server_id, &["echo"], "").into_bytes(),
        )
        .await
        .expect("upsert the fixture record")
}

fn node(registry: &str) -> Node {
    Node::start_on(registry.as_ref(), None, &[], &[])
}

fn mcp_task(id: &str, servers: &[&str]) -> Value {
    json!({
        "task_id": id,
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!(servers).to_string()},
        "limits": {"deadline_ms": 120000},
    })
}

/// A change must reach a node by its watch within this; the poll alone would take at least
/// 24 s (`REGISTRY_POLL_INTERVAL` 30 s less its 20 % jitter), so this tells them apart.
const CHANGE_WITHIN: Duration = Duration::from_secs(15);

/// Waits until every node has the change at etcd revision `revision`, by its watch.
async fn wait_change(nodes: &[&Node], revision: u64) {
    let start = std::time::Instant::now();
    for node in nodes {
        wait_synced(node, revision).await;
    }
    let took = start.elapsed();
    eprintln!(
        "revision {revision} reached {} node(s) in {took:?}",
        nodes.len()
    );
    assert!(
        took < CHANGE_WITHIN,
        "revision {revision} took {took:?} to reach the nodes"
    );
}

/// Waits until `node`'s registry is in force at etcd revision `revision` and not degraded.
async fn wait_synced(node: &Node, revision: u64) -> Value {
    node.poll_json("/v1/registry", WITHIN, |h| {
        h["store_revision"] == revision && h["degraded"] == false
    })
    .await
}

/// Runs a task on `node` that calls `server`'s `echo` with `text`; the finished task.
async fn echo_on(node: &Node, server: &str, text: &str) -> Answer {
    let args = json!({ "text": text }).to_string();
    let module = node
        .upload(wat::mcp_calls(&[(server, "echo", &args)], 1).as_bytes())
        .await;
    let id = node
        .submit_ok(&module, mcp_task(&unique_id("fleet"), &[server]))
        .await;
    let done = node.task(&id, 60).await;
    assert_eq!(
        done.json["status"],
        "finished",
        "{done:?}\n{}",
        node.stderr()
    );
    done
}

/// Asserts that a task on `node` reached `server`'s `echo` tool and got `text` back.
async fn assert_echoes(node: &Node, server: &str, text: &str) {
    let done = echo_on(node, server, text).await;
    let stderr = done.json["stderr"].as_str().unwrap_or_default();
    let result: Value = serde_json::from_str(stderr.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {done:?}"));
    assert_eq!(result["content"][0]["text"], text, "{done:?}");
}

/// A guest that opens `server` and writes `ENOENT` to stderr if `mcp_open` says so,
/// `OPENED` if it gave an fd, `OTHER` otherwise.
fn open_guest(server: &str) -> String {
    wat::guest(
        &[
            (1024, server.as_bytes()),
            (2048, b"ENOENT"),
            (2056, b"OPENED"),
            (2064, b"OTHER"),
        ],
        &format!(
            "(func $main (local $fd i32)
               (local.set $fd (call $mcp_open (i32.const 1024) (i32.const {})))
               (if (i32.eq (local.get $fd) (i32.const {}))
                 (then (call $emit (i32.const 2048) (i32.const 6)))
                 (else (if (i32.ge_s (local.get $fd) (i32.const 0))
                   (then (call $emit (i32.const 2056) (i32.const 6)))
                   (else (call $emit (i32.const 2064) (i32.const 5)))))))",
            server.len(),
            errno::ENOENT
        ),
    )
}

/// What `mcp_open(server)` gives a new task on `node`: `ENOENT`, `OPENED` or `OTHER`
/// (or why the task was refused).
async fn open_on(node: &Node, server: &str) -> String {
    let module = node.upload(open_guest(server).as_bytes()).await;
    let submitted = node
        .submit(&module, mcp_task(&unique_id("open"), &[server]))
        .await;
    if submitted.status != 202 {
        return format!("refused {}: {}", submitted.status, submitted.json);
    }
    let id = submitted.json["id"].as_str().expect("id");
    let done = node.task(id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    done.json["stderr"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

async fn server_ids(node: &Node) -> Vec<String> {
    let servers = node.get_json("/v1/mcp/servers").await;
    servers["servers"]
        .as_array()
        .expect("servers array")
        .iter()
        .filter_map(|s| s["server_id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_in_etcd_reaches_another_node_and_its_deletion_stops_it_there() {
    let etcd = Etcd::start();
    let prefix = unique_id("fleet");
    let url = url(&etcd, &prefix);
    let store = store(&etcd, &prefix).await;
    let empty = store.list().await.expect("list").revision;
    let (a, b) = (node(&url), node(&url));
    for node in [&a, &b] {
        let health = wait_synced(node, empty).await;
        assert_eq!(health["source"], url.as_str(), "{health}");
    }

    let server = unique_id("fleetecho");
    let put = put_fixture(&store, &server).await;
    wait_change(&[&a, &b], put).await;
    assert_echoes(&b, &server, "from etcd to node B").await;
    assert_eq!(server_ids(&b).await, [server.as_str()]);
    let pids = fixture_pids(&server);
    assert_eq!(pids.len(), 1, "B runs the server once: {pids:?}");

    let deleted = store
        .delete(DocKind::Server, &server)
        .await
        .expect("delete")
        .expect("the record existed");
    wait_change(&[&a, &b], deleted).await;
    assert!(server_ids(&b).await.is_empty());
    assert!(
        wait_gone(pids[0], WITHIN),
        "B still runs the deleted server (pid {})",
        pids[0]
    );
    // A new task naming it: the registry has no such server (docs/abi.md, mcp_open).
    assert_eq!(open_on(&b, &server).await, "ENOENT");
    assert!(fixture_pids(&server).is_empty());
}

/// Waits until `node` reports its registry degraded; the health.
async fn wait_degraded(node: &Node) -> Value {
    node.poll_json("/v1/registry", WITHIN, |h| h["degraded"] == true)
        .await
}

/// `quiver_registry_degraded` scraped from `node`.
async fn degraded_gauge(node: &Node) -> f64 {
    let response = node
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    let samples = openmetrics::parse(&response.text().await.expect("metrics text"));
    openmetrics::get(&samples, "quiver_registry_degraded", &[])
}

/// Asserts the degraded state: the reason names the store, `/readyz` still says 200 (the
/// last snapshot serves) and reports it, and the gauge is 1.
async fn assert_degraded_on(node: &Node, url: &str, kept: &Value) {
    let health = wait_degraded(node).await;
    let reason = health["last_reload_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains(url) && reason.contains("unreachable"),
        "{health}"
    );
    assert_eq!(health["source"], url, "{health}");
    assert_eq!(
        health["revision"], kept["revision"],
        "the last snapshot stays"
    );
    let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(
        ready.status, 200,
        "a degraded registry still serves: {ready:?}"
    );
    assert_eq!(ready.json["registry"]["degraded"], true, "{ready:?}");
    assert_eq!(degraded_gauge(node).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_stopped_nodes_serve_degraded_and_recover_when_it_returns() {
    let mut etcd = Etcd::start();
    let prefix = unique_id("fleet");
    let url = url(&etcd, &prefix);
    let store = store(&etcd, &prefix).await;
    let server = unique_id("kept");
    let put = put_fixture(&store, &server).await;
    let (a, b) = (node(&url), node(&url));
    let mut kept = Vec::new();
    for node in [&a, &b] {
        kept.push(wait_synced(node, put).await);
        assert_eq!(degraded_gauge(node).await, 0.0);
    }

    etcd.stop();
    for (node, kept) in [&a, &b].into_iter().zip(&kept) {
        assert_degraded_on(node, &url, kept).await;
        assert_echoes(node, &server, "served from the last snapshot").await;
    }

    // Same data and port: both list again, clear degraded and follow new changes.
    etcd.restart();
    for node in [&a, &b] {
        wait_synced(node, put).await;
        assert_eq!(degraded_gauge(node).await, 0.0);
    }
    let added = unique_id("added");
    let later = put_fixture(&store, &added).await;
    wait_change(&[&a, &b], later).await;
    for node in [&a, &b] {
        assert_echoes(node, &added, "added after the restart").await;
    }
}

/// `quiver serve` started while etcd is down must not exit after its first-sync wait: it
/// serves an empty registry, degraded, and catches up once etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_while_etcd_is_down_serves_degraded_and_catches_up() {
    let mut etcd = Etcd::start();
    let prefix = unique_id("fleet");
    let url = url(&etcd, &prefix);
    let store = store(&etcd, &prefix).await;
    let server = unique_id("waiting");
    let put = put_fixture(&store, &server).await;
    etcd.stop();

    let mut late = node(&url);
    let health = wait_degraded(&late).await;
    assert_eq!(health["store_revision"], Value::Null, "{health}");
    assert!(server_ids(&late).await.is_empty());
    let ready = Node::send(late.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json["registry"]["degraded"], true, "{ready:?}");
    assert_eq!(degraded_gauge(&late).await, 1.0);
    assert_eq!(open_on(&late, &server).await, "ENOENT");
    // Past the CLI's first-sync wait (REGISTRY_STORE_TIMEOUT) the node is still there.
    assert_eq!(
        late.wait_exit(quiver::defaults::REGISTRY_STORE_TIMEOUT + Duration::from_secs(1)),
        None,
        "the node exited with etcd down:\n{}",
        late.stderr()
    );

    etcd.restart();
    wait_synced(&late, put).await;
    assert_eq!(degraded_gauge(&late).await, 0.0);
    assert_echoes(&late, &server, "caught up").await;
}

const ADMIN_TOKEN: &str = "fleet-admin-token";

/// A node on `registry` with the admin API on (`[admin]`, token [`ADMIN_TOKEN`]).
fn admin_node(registry: &str) -> Node {
    Node::start_on(
        registry.as_ref(),
        Some("[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n"),
        &[("QUIVER_TEST_ADMIN", ADMIN_TOKEN)],
        &[],
    )
}

/// `method /admin/api/mcp/servers{path}` on `node` with the admin token.
async fn admin(node: &Node, method: Method, path: &str, body: Option<Value>) -> Answer {
    let mut request = node
        .anonymous(method, &format!("/admin/api/mcp/servers{path}"))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    Node::send(request).await
}

/// Adds the fixture server as `server_id` through `node`'s admin API; the etcd revision.
async fn add_through(node: &Node, server_id: &str) -> u64 {
    let record = json!({"format": "toml", "body": fixture_toml(server_id, &["echo"], "")});
    let created = admin(node, Method::POST, "", Some(record)).await;
    assert_eq!(created.status, 201, "{created:?}\n{}", node.stderr());
    created.json["revision"].as_u64().expect("revision")
}

/// Deletes `server_id` through `node`'s admin API; the etcd revision.
async fn delete_through(node: &Node, server_id: &str) -> u64 {
    let deleted = admin(node, Method::DELETE, &format!("/{server_id}"), None).await;
    assert_eq!(deleted.status, 200, "{deleted:?}\n{}", node.stderr());
    deleted.json["revision"].as_u64().expect("revision")
}

/// The operator's path: every write goes to node A's admin API, node B only runs tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_added_through_node_a_admin_api_serves_on_node_b_through_an_etcd_outage() {
    let mut etcd = Etcd::start();
    let prefix = unique_id("fleet");
    let url = url(&etcd, &prefix);
    let empty = store(&etcd, &prefix)
        .await
        .list()
        .await
        .expect("list")
        .revision;
    let (a, b) = (admin_node(&url), admin_node(&url));
    for node in [&a, &b] {
        wait_synced(node, empty).await;
    }

    let first = unique_id("viaadmin");
    let added = add_through(&a, &first).await;
    wait_change(&[&a, &b], added).await;
    assert_echoes(&b, &first, "written on A, called on B").await;

    let deleted = delete_through(&a, &first).await;
    wait_change(&[&a, &b], deleted).await;
    assert!(server_ids(&b).await.is_empty());
    assert_eq!(open_on(&b, &first).await, "ENOENT");

    let kept_server = unique_id("kept");
    let added = add_through(&a, &kept_server).await;
    wait_change(&[&a, &b], added).await;
    let mut kept = Vec::new();
    for node in [&a, &b] {
        kept.push(wait_synced(node, added).await);
    }

    etcd.stop();
    for (node, kept) in [&a, &b].into_iter().zip(&kept) {
        assert_degraded_on(node, &url, kept).await;
    }
    assert_echoes(&b, &kept_server, "B serves its last snapshot").await;
    // A write has nowhere to go: refused as retryable, and nothing changes on B.
    let record = json!({"format": "toml", "body": fixture_toml("lost", &["echo"], "")});
    let refused = admin(&a, Method::POST, "", Some(record)).await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "store_unavailable"),
        "{refused:?}"
    );
    assert_eq!(server_ids(&b).await, [kept_server.as_str()]);

    etcd.restart();
    for node in [&a, &b] {
        wait_synced(node, added).await;
        assert_eq!(degraded_gauge(node).await, 0.0);
    }
    let removed = delete_through(&a, &kept_server).await;
    wait_change(&[&a, &b], removed).await;
    assert!(server_ids(&b).await.is_empty());
}
