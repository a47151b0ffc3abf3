//! `quiver serve` end to end: the real binary on an ephemeral port, real HTTP, real WAT
//! guests, and a real fixture MCP server for the drain.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use quiver_tests::node::{Node, sha256_hex};
use quiver_tests::{RegistryDir, fixture_pids, unique_id};
use reqwest::Method;
use serde_json::json;

/// Writes `hello` to stdout and exits 0.
const HELLO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 6))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// Exits with status 3.
const EXIT3: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (call $exit (i32.const 3))))"#;

/// Spins forever (only a deadline or a cancel ends it).
const LOOP: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "_start") (loop $l (br $l))))"#;

/// Spins for 3 s of wall time, then writes `done` to stdout.
const SLEEPER: &str = r#"(module
  (import "spear" "time_now_ms" (func $now (result i64)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "done\n")
  (func (export "_start") (local $until i64)
    (local.set $until (i64.add (call $now) (i64.const 3000)))
    (loop $l (br_if $l (i64.lt_s (call $now) (local.get $until))))
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 5))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

fn task(id: &str) -> serde_json::Value {
    json!({"task_id": id, "limits": {"deadline_ms": 120000}})
}

#[tokio::test]
async fn a_task_is_uploaded_submitted_and_read_back() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, None, &[]);

    let hello = node.upload(HELLO.as_bytes()).await;
    // The same bytes again are already stored: 200, not 201.
    let again = Node::send(
        node.request(Method::PUT, &format!("/v1/modules/{hello}"))
            .body(HELLO.as_bytes().to_vec()),
    )
    .await;
    assert_eq!(again.status, 200, "{again:?}");

    let id = node.submit_ok(&hello, task("greet")).await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(done.json["exit_code"], 0);
    assert_eq!(done.json["stdout"], "hello\n");
    assert_eq!(done.json["task_id"], "greet");
    assert_eq!(done.json["module"], hello.as_str());
    assert!(done.json["_spear"]["elapsed_ms"].is_u64(), "{done:?}");
    assert!(done.json["_spear"]["host_memory"]["peak_bytes"].as_u64() >= Some(6));

    // A guest's own exit status is a finished task, not a failed one.
    let exit3 = node.upload(EXIT3.as_bytes()).await;
    let id = node.submit_ok(&exit3, task("exit3")).await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(done.json["exit_code"], 3);

    // A deadline is a failure, with its kind.
    let looping = node.upload(LOOP.as_bytes()).await;
    let id = node
        .submit_ok(
            &looping,
            json!({"task_id": "short", "limits": {"deadline_ms": 200}}),
        )
        .await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "failed", "{done:?}");
    assert_eq!(done.json["exit_code"], 124);
    assert_eq!(done.json["_spear"]["failure"]["kind"], "deadline");

    let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json["ready"], true);
    assert!(node.stderr().contains("task accepted"), "{}", node.stderr());
}

#[tokio::test]
async fn cancel_ends_running_and_queued_tasks_at_once_and_frees_the_slot() {
    let registry = RegistryDir::new();
    let config = "[tasks]\nmax_concurrent = 1\n[serve]\nmax_tasks = 3\n";
    let node = Node::start(&registry, Some(config), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let hello = node.upload(HELLO.as_bytes()).await;

    let running = node.submit_ok(&looping, task("running")).await;
    let seen = node
        .wait_status(&running, "running", Duration::from_secs(60))
        .await;
    assert_eq!(seen.json["status"], "running", "{seen:?}");
    // The only slot is taken: these two wait.
    let queued = node.submit_ok(&looping, task("queued")).await;
    let third = node.submit_ok(&looping, task("third")).await;
    assert_eq!(node.task(&queued, 0).await.json["status"], "queued");

    // The node holds max_tasks = 3 tasks, none finished: one more is refused, retryably.
    let refused = node.submit(&hello, task("one-too-many")).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.code(), "too_many_tasks");
    assert!(refused.headers.contains_key("retry-after"));

    for id in [&queued, &third, &running] {
        let started = Instant::now();
        let cancelled = Node::send(node.request(Method::DELETE, &format!("/v1/tasks/{id}"))).await;
        assert_eq!(cancelled.status, 200, "{cancelled:?}");
        assert_eq!(cancelled.json["status"], "cancelled", "{cancelled:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    // It stays cancelled (the aborted run does not overwrite it) and says why.
    let after = node.task(&running, 0).await;
    assert_eq!(after.json["status"], "cancelled");
    assert_eq!(after.json["_spear"]["failure"]["kind"], "cancelled");

    // The slot is free again: with max_concurrent = 1 this task can only run if the
    // cancelled one gave its slot back. Finished tasks make room in the table.
    let id = node.submit_ok(&hello, task("after-cancel")).await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(done.json["stdout"], "hello\n");
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_field() {
    let registry = RegistryDir::new();
    let config = "[serve]\nmax_request_bytes = 4096\nmax_module_bytes = 1024\nbody_timeout_ms = 500\nheader_timeout_ms = 500\n";
    let node = Node::start(&registry, Some(config), &[]);
    let hello = node.upload(HELLO.as_bytes()).await;
    let put = |sha: &str, body: Vec<u8>| {
        node.request(Method::PUT, &format!("/v1/modules/{sha}"))
            .body(body)
    };
    let post = |body: Vec<u8>| {
        node.request(Method::POST, "/v1/tasks")
            .header("content-type", "application/json")
            .body(body)
    };

    // Modules.
    let other = sha256_hex(b"something else");
    let answer = Node::send(put(&other, HELLO.as_bytes().to_vec())).await;
    assert_eq!(
        (answer.status, answer.code(), answer.field()),
        (400, "hash_mismatch", "sha256"),
        "{answer:?}"
    );
    let answer = Node::send(put("not-a-hash", b"x".to_vec())).await;
    assert_eq!(
        (answer.status, answer.field()),
        (400, "sha256"),
        "{answer:?}"
    );
    let junk = b"this is not a module".to_vec();
    let answer = Node::send(put(&sha256_hex(&junk), junk)).await;
    assert_eq!(
        (answer.status, answer.code(), answer.field()),
        (422, "invalid_module", "body"),
        "{answer:?}"
    );
    let big = vec![b' '; 8 * 1024];
    let answer = Node::send(put(&sha256_hex(&big), big)).await;
    assert_eq!((answer.status, answer.field()), (413, "body"), "{answer:?}");

    // Tasks.
    let cases: Vec<(serde_json::Value, u16, &str)> = vec![
        (json!({"module": other, "task": task("t")}), 422, "module"),
        (json!({"module": "abc", "task": task("t")}), 400, "module"),
        (
            json!({"module": hello, "task": task("t"), "priority": 1}),
            400,
            "priority",
        ),
        (json!({"module": hello}), 400, "task"),
        (
            json!({"module": hello, "task": {"task_id": 5}}),
            400,
            "task.task_id",
        ),
        (
            json!({"module": hello, "task": {"task_id": "t", "limits": {"deadline": 5}}}),
            400,
            "task.limits.deadline",
        ),
        (
            json!({"module": hello, "task": {"task_id": "t", "limits": {"deadline_ms": 0}}}),
            400,
            "task.limits.deadline_ms",
        ),
        (
            json!({"module": hello, "task": {"task_id": " "}}),
            400,
            "task.task_id",
        ),
        (
            json!({"module": hello, "task": {"task_id": "t", "config": {"mcp.enabled": "maybe"}}}),
            400,
            "task.config.mcp.enabled",
        ),
        (
            json!({"module": hello, "task": {"task_id": "t", "preopens": [{"host": "/", "guest": "/"}]}}),
            400,
            "task.preopens",
        ),
        (
            json!({"module": hello, "task": {"task_id": "t", "inherit_stdin": true}}),
            400,
            "task.inherit_stdin",
        ),
    ];
    for (body, status, field) in cases {
        let answer = Node::send(post(body.to_string().into_bytes())).await;
        assert_eq!(
            (answer.status, answer.field()),
            (status, field),
            "{body}: {answer:?}"
        );
        assert!(
            !answer.json["error"]["message"]
                .as_str()
                .unwrap_or("")
                .is_empty()
        );
    }
    for raw in [
        &b"{not json"[..],
        &b"\xff\xfe\x00"[..],
        &b""[..],
        &b"[]"[..],
    ] {
        let answer = Node::send(post(raw.to_vec())).await;
        assert_eq!(
            (answer.status, answer.field()),
            (400, "body"),
            "{raw:?}: {answer:?}"
        );
    }
    let answer = Node::send(post(vec![b' '; 10 * 1024])).await;
    assert_eq!(
        (answer.status, answer.code()),
        (413, "body_too_large"),
        "{answer:?}"
    );

    // Ids, query parameters, methods, paths.
    for (path, status, field) in [
        ("/v1/tasks/nothex", 400, "id"),
        ("/v1/tasks/%FF%FE", 400, "id"),
        ("/v1/tasks/0123456789abcdef01234567", 404, "id"),
        ("/v1/tasks/0123456789abcdef01234567?wait=soon", 400, "wait"),
        ("/v1/tasks/0123456789abcdef01234567?wait=-1", 400, "wait"),
        ("/v1/tasks/0123456789abcdef01234567?limit=1", 400, "limit"),
        ("/v2/everything", 404, "path"),
    ] {
        let answer = Node::send(node.request(Method::GET, path)).await;
        assert_eq!(
            (answer.status, answer.field()),
            (status, field),
            "{path}: {answer:?}"
        );
    }
    let answer = Node::send(node.request(Method::PATCH, "/v1/tasks")).await;
    assert_eq!(
        (answer.status, answer.field()),
        (405, "method"),
        "{answer:?}"
    );

    // A body that never finishes arriving is cut off after body_timeout_ms.
    let addr = node.base.trim_start_matches("http://").to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        tcp.write_all(b"POST /v1/tasks HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mod")
            .expect("write");
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .expect("slow client");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");

    // Headers that never finish, or a connection that never sends one, are closed after
    // header_timeout_ms rather than held.
    for opening in [&b"GET /healthz HTTP/1.1\r\nHo"[..], &b""[..]] {
        let addr = node.base.trim_start_matches("http://").to_owned();
        let started = Instant::now();
        let closed = tokio::task::spawn_blocking(move || {
            let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
            tcp.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            tcp.write_all(opening).expect("write");
            let mut answer = Vec::new();
            tcp.read_to_end(&mut answer).is_ok()
        })
        .await
        .expect("slow client");
        assert!(closed, "the connection was held open");
        assert!(started.elapsed() < Duration::from_secs(25));
    }

    // The node is still fine.
    let id = node.submit_ok(&hello, task("still-fine")).await;
    assert_eq!(node.task(&id, 60).await.json["status"], "finished");
}

#[tokio::test]
async fn the_token_guards_everything_but_the_health_checks() {
    let registry = RegistryDir::new();
    let token = "s3cret-node-token-0123";
    let config = "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n";
    let node = Node::start(&registry, Some(config), &[("QUIVER_TEST_TOKEN", token)]);

    for (method, path) in [
        (Method::PUT, format!("/v1/modules/{}", sha256_hex(b"x"))),
        (Method::POST, "/v1/tasks".to_owned()),
        (Method::GET, "/v1/tasks/0123456789abcdef01234567".to_owned()),
        (
            Method::DELETE,
            "/v1/tasks/0123456789abcdef01234567".to_owned(),
        ),
    ] {
        let none = Node::send(node.anonymous(method.clone(), &path)).await;
        assert_eq!(none.status, 401, "{method} {path}: {none:?}");
        assert_eq!(none.field(), "Authorization");
        let challenge = none
            .headers
            .get("www-authenticate")
            .expect("WWW-Authenticate");
        assert!(challenge.to_str().unwrap_or("").starts_with("Bearer"));
        let wrong = Node::send(
            node.anonymous(method.clone(), &path)
                .bearer_auth("s3cret-node-token-0124"),
        )
        .await;
        assert_eq!(wrong.status, 401, "{method} {path}: {wrong:?}");
        let basic = Node::send(
            node.anonymous(method.clone(), &path)
                .basic_auth("u", Some(token)),
        )
        .await;
        assert_eq!(basic.status, 401, "{method} {path}: {basic:?}");
    }
    for path in ["/healthz", "/readyz"] {
        let answer = Node::send(node.anonymous(Method::GET, path)).await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
    }
    let hello = node.upload(HELLO.as_bytes()).await;
    let id = node.submit_ok(&hello, task("authorised")).await;
    assert_eq!(node.task(&id, 60).await.json["stdout"], "hello\n");
    assert!(!node.stderr().contains(token), "{}", node.stderr());
}

#[test]
fn a_node_refuses_to_start_unguarded_off_loopback_or_with_its_token_missing() {
    let registry = RegistryDir::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let Err((status, stderr)) = Node::spawn("0.0.0.0:0", &registry, None, &dir, &[]) else {
        panic!("a node without a token listened on 0.0.0.0");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("[serve] token_env"), "{stderr}");

    let config = "[serve]\ntoken_env = \"QUIVER_TEST_UNSET_TOKEN\"\n";
    let Err((status, stderr)) = Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &[])
    else {
        panic!("a node whose token variable is unset started");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("serve.token_env"), "{stderr}");
    assert!(stderr.contains("QUIVER_TEST_UNSET_TOKEN"), "{stderr}");

    let config = "[serve]\ndrain_grace = 5\n";
    let Err((_, stderr)) = Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &[]) else {
        panic!("a node with an unknown [serve] field started");
    };
    assert!(stderr.contains("serve.drain_grace"), "{stderr}");
}

#[tokio::test]
async fn sigterm_drains_running_tasks_refuses_new_ones_and_stops_the_mcp_servers() {
    let server = unique_id("drain");
    let registry = RegistryDir::new();
    registry.fixture(&server, &["echo"], "");
    let config = format!("[mcp]\nprewarm = [\"{server}\"]\n[serve]\ndrain_grace_ms = 60000\n");
    let mut node = Node::start(&registry, Some(&config), &[]);
    let started = Instant::now();
    while fixture_pids(&server).is_empty() && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let servers = fixture_pids(&server);
    assert!(
        !servers.is_empty(),
        "the prewarmed MCP server did not start"
    );

    let sleeper = node.upload(SLEEPER.as_bytes()).await;
    let hello = node.upload(HELLO.as_bytes()).await;
    let id = node.submit_ok(&sleeper, task("sleeper")).await;
    let seen = node
        .wait_status(&id, "running", Duration::from_secs(60))
        .await;
    assert_eq!(seen.json["status"], "running", "{seen:?}");
    let long_poll = tokio::spawn(Node::send(
        node.request(Method::GET, &format!("/v1/tasks/{id}?wait=60")),
    ));

    node.signal(libc::SIGTERM);
    let mut ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    let started = Instant::now();
    while ready.status == 200 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    }
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json["reasons"][0], "draining");
    let refused = node.submit(&hello, task("too-late")).await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "draining"),
        "{refused:?}"
    );
    assert!(refused.headers.contains_key("retry-after"));

    let done = long_poll.await.expect("long poll");
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(done.json["stdout"], "done\n");
    let status = node
        .wait_exit(Duration::from_secs(60))
        .expect("the node exits");
    assert_eq!(status.code(), Some(0), "{}", node.stderr());
    let left: Vec<u32> = servers
        .into_iter()
        .filter(|pid| !quiver_tests::wait_gone(*pid, Duration::from_secs(10)))
        .collect();
    assert!(left.is_empty(), "MCP servers left running: {left:?}");
}

#[tokio::test]
async fn a_task_past_the_drain_grace_is_cancelled_and_the_node_still_exits_0() {
    let registry = RegistryDir::new();
    let mut node = Node::start(&registry, Some("[serve]\ndrain_grace_ms = 300\n"), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let id = node.submit_ok(&looping, task("forever")).await;
    let seen = node
        .wait_status(&id, "running", Duration::from_secs(60))
        .await;
    assert_eq!(seen.json["status"], "running", "{seen:?}");
    let long_poll = tokio::spawn(Node::send(
        node.request(Method::GET, &format!("/v1/tasks/{id}?wait=60")),
    ));
    node.signal(libc::SIGTERM);
    let done = long_poll.await.expect("long poll");
    assert_eq!(done.json["status"], "cancelled", "{done:?}");
    let status = node
        .wait_exit(Duration::from_secs(30))
        .expect("the node exits");
    assert_eq!(status.code(), Some(0), "{}", node.stderr());
}
