//! `quiver serve` end to end: the real binary on an ephemeral port, real HTTP, real WAT
//! guests, and real fixture MCP servers for the drain, metrics, server health, the audit
//! log, approvals and registry reloads.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use quiver_tests::node::{Answer, HELLO, LOOP, Node, sha256_hex, task_json};
use quiver_tests::{RegistryDir, fixture_pids, fixture_toml, openmetrics, unique_id, wat};
use reqwest::Method;
use serde_json::json;

/// Exits with status 3.
const EXIT3: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (call $exit (i32.const 3))))"#;

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

/// Logs a line, then writes one to stderr.
const LOGGER: &str = r#"(module
  (import "spear" "log" (func $log (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "logged-7c1e\n")
  (data (i32.const 32) "written\n")
  (func (export "_start")
    (drop (call $log (i32.const 2) (i32.const 16) (i32.const 12)))
    (i32.store (i32.const 0) (i32.const 32))
    (i32.store (i32.const 4) (i32.const 8))
    (drop (call $w (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

#[tokio::test]
async fn a_task_is_uploaded_submitted_and_read_back() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, None, &[]);

    let hello = node.upload(HELLO.as_bytes()).await;
    // The same bytes again are already stored: 200, not 201.
    let again = Node::send(
        node.request(Method::PUT, &format!("/v1/modules/{hello}"))
            .header("content-type", "application/wasm")
            .body(HELLO.as_bytes().to_vec()),
    )
    .await;
    assert_eq!(again.status, 200, "{again:?}");

    let id = node.submit_ok(&hello, task_json("greet")).await;
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
    let id = node.submit_ok(&exit3, task_json("exit3")).await;
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

    // Log lines are the task's captured stderr, not the node's log.
    let logger = node.upload(LOGGER.as_bytes()).await;
    let id = node.submit_ok(&logger, task_json("logger")).await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["stderr"], "logged-7c1e\nwritten\n", "{done:?}");

    let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json["ready"], true);
    assert!(node.stderr().contains("task accepted"), "{}", node.stderr());
    assert!(!node.stderr().contains("logged-7c1e"), "{}", node.stderr());
}

#[tokio::test]
async fn cancel_ends_running_and_queued_tasks_at_once_and_frees_the_slot() {
    let registry = RegistryDir::new();
    let config = "[tasks]\nmax_concurrent = 1\n[serve]\nmax_tasks = 3\n";
    let node = Node::start(&registry, Some(config), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let hello = node.upload(HELLO.as_bytes()).await;

    let running = node.submit_running(&looping, task_json("running")).await;
    // The only slot is taken: these two wait.
    let queued = node.submit_ok(&looping, task_json("queued")).await;
    let third = node.submit_ok(&looping, task_json("third")).await;
    assert_eq!(node.task(&queued, 0).await.json["status"], "queued");

    // The node holds max_tasks = 3 tasks, none finished: one more is refused, retryably.
    let refused = node.submit(&hello, task_json("one-too-many")).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.code(), "too_many_tasks");
    assert!(refused.headers.contains_key("retry-after"));

    for id in [&queued, &third, &running] {
        let started = Instant::now();
        let cancelled = node.cancel(id).await;
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
    let id = node.submit_ok(&hello, task_json("after-cancel")).await;
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
            .header("content-type", "application/wasm")
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
        (
            json!({"module": other, "task": task_json("t")}),
            422,
            "module",
        ),
        (
            json!({"module": "abc", "task": task_json("t")}),
            400,
            "module",
        ),
        (
            json!({"module": hello, "task": task_json("t"), "priority": 1}),
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
        // serde_json would read the string as the object it holds.
        (
            json!({"module": hello, "task": {"task_id": "t", "config": {"$serde_json::private::RawValue": "{}"}}}),
            400,
            "body",
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
        tcp.write_all(b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mod")
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
    let id = node.submit_ok(&hello, task_json("still-fine")).await;
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
        (Method::GET, "/metrics".to_owned()),
        (Method::GET, "/v1/mcp/servers".to_owned()),
        (Method::GET, "/v1/registry".to_owned()),
        (Method::GET, "/v1/approvals".to_owned()),
        (Method::POST, "/v1/approvals/0000abcd-00000001".to_owned()),
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
    let id = node.submit_ok(&hello, task_json("authorised")).await;
    assert_eq!(node.task(&id, 60).await.json["stdout"], "hello\n");
    assert!(!node.stderr().contains(token), "{}", node.stderr());
}

/// Each role opens its endpoints and nothing else: 403 naming the missing role, 401
/// for no token or an unknown one; `/v1/whoami` tells a client its name and roles.
#[tokio::test]
async fn each_role_opens_its_endpoints_and_nothing_else() {
    let registry = RegistryDir::new();
    let config = "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n\
        [clients.reg]\ntoken_env = \"QV_REG\"\nroles = [\"registry\"]\n\
        [clients.ops]\ntoken_env = \"QV_OPS\"\nroles = [\"approve\"]\n\
        [clients.watch]\ntoken_env = \"QV_WATCH\"\nroles = [\"observe\"]\n";
    let clients = [
        ("serve", "role-serve-token", &["submit", "observe"][..]),
        ("reg", "role-reg-token", &["registry"][..]),
        ("ops", "role-ops-token", &["approve"][..]),
        ("watch", "role-watch-token", &["observe"][..]),
    ];
    let node = Node::start(
        &registry,
        Some(config),
        &[
            ("QUIVER_TEST_TOKEN", clients[0].1),
            ("QV_REG", clients[1].1),
            ("QV_OPS", clients[2].1),
            ("QV_WATCH", clients[3].1),
        ],
    );
    let task = "/v1/tasks/0123456789abcdef01234567";
    let endpoints = [
        (
            "submit",
            Method::PUT,
            format!("/v1/modules/{}", sha256_hex(b"x")),
        ),
        ("submit", Method::POST, "/v1/tasks".to_owned()),
        ("submit", Method::GET, task.to_owned()),
        ("submit", Method::DELETE, task.to_owned()),
        ("approve", Method::GET, "/v1/approvals".to_owned()),
        (
            "approve",
            Method::POST,
            "/v1/approvals/0000abcd-00000001".to_owned(),
        ),
        ("observe", Method::GET, "/metrics".to_owned()),
        ("observe", Method::GET, "/v1/mcp/servers".to_owned()),
        ("observe", Method::GET, "/v1/registry".to_owned()),
        ("registry", Method::GET, "/admin/api/mcp/servers".to_owned()),
        (
            "registry",
            Method::GET,
            "/admin/api/mcp/profiles".to_owned(),
        ),
    ];
    for (name, token, roles) in clients {
        let me = Node::send(node.anonymous(Method::GET, "/v1/whoami").bearer_auth(token)).await;
        assert_eq!(me.json, json!({"client": name, "roles": roles}), "{me:?}");
        for (role, method, path) in &endpoints {
            let answer = Node::send(
                node.anonymous(method.clone(), path)
                    .bearer_auth(token)
                    .json(&json!({})),
            )
            .await;
            if roles.contains(role) {
                assert!(
                    ![401, 403].contains(&answer.status),
                    "{name} may {method} {path}: {answer:?}"
                );
            } else {
                assert_eq!(
                    (answer.status, answer.code(), answer.field()),
                    (403, "forbidden", "Authorization"),
                    "{name} may not {method} {path}"
                );
                let message = answer.json["error"]["message"].as_str().unwrap_or("");
                assert!(message.contains(&format!("`{role}`")), "{message}");
            }
        }
    }
    // The observer reads the metrics, as text.
    let metrics = Node::send(
        node.anonymous(Method::GET, "/metrics")
            .bearer_auth(clients[3].1),
    )
    .await;
    assert_eq!(metrics.status, 200);
    for token in [None, Some("role-unknown-token")] {
        let mut request = node.anonymous(Method::GET, "/v1/whoami");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(Node::send(request).await.status, 401, "{token:?}");
    }
    let log = node.stderr();
    for (_, token, _) in clients {
        assert!(!log.contains(token), "a token in the log: {log}");
    }
}

/// A client table no node can use stops the node with its field named; two clients with
/// one token are refused naming both, and never show the token.
#[test]
fn bad_or_shared_client_tokens_stop_the_node_naming_the_field() {
    let registry = RegistryDir::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = "[clients.ci]\ntoken_env = \"QV_A\"\nroles = [\"submit\"]\n\
        [clients.ops]\ntoken_env = \"QV_B\"\nroles = [\"approve\"]\n";
    let env = [("QV_A", "one-shared-token"), ("QV_B", "one-shared-token")];
    let Err((status, stderr)) =
        Node::spawn("127.0.0.1:0", &registry, Some(shared), &dir, &env, &[])
    else {
        panic!("two clients with one token started");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(
        stderr.contains("clients.ci.token_env") && stderr.contains("clients.ops.token_env"),
        "{stderr}"
    );
    assert!(!stderr.contains("one-shared-token"), "{stderr}");
    for (config, field) in [
        (
            "[clients.ci]\ntoken_env = \"QV_A\"\nroles = [\"root\"]\n",
            "clients.ci.roles",
        ),
        (
            "[clients.ci]\ntoken_env = \"QV_A\"\nroles = []\n",
            "clients.ci.roles",
        ),
        (
            "[clients.ci]\ntoken_env = \"QV_UNSET_SURELY\"\nroles = [\"submit\"]\n",
            "clients.ci.token_env",
        ),
        (
            "[clients.ci]\ntoken = \"inline\"\nroles = [\"submit\"]\n",
            "clients.ci",
        ),
    ] {
        let Err((_, stderr)) =
            Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &env[..1], &[])
        else {
            panic!("{config} started");
        };
        assert!(stderr.contains(field), "{config}: {stderr}");
    }
}

#[test]
fn a_node_refuses_to_start_unguarded_off_loopback_or_with_its_token_missing() {
    let registry = RegistryDir::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let Err((status, stderr)) = Node::spawn("0.0.0.0:0", &registry, None, &dir, &[], &[]) else {
        panic!("a node without a token listened on 0.0.0.0");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("[serve] token_env"), "{stderr}");

    let config = "[serve]\ntoken_env = \"QUIVER_TEST_UNSET_TOKEN\"\n";
    let Err((status, stderr)) = Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &[], &[])
    else {
        panic!("a node whose token variable is unset started");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("serve.token_env"), "{stderr}");
    assert!(stderr.contains("QUIVER_TEST_UNSET_TOKEN"), "{stderr}");

    let config = "[serve]\ndrain_grace = 5\n";
    let Err((_, stderr)) = Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &[], &[])
    else {
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
    let id = node.submit_running(&sleeper, task_json("sleeper")).await;
    let long_poll = node.long_poll(&id);

    node.signal(libc::SIGTERM);
    let mut ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    let started = Instant::now();
    while ready.status == 200 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    }
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json["reasons"][0], "draining");
    let refused = node.submit(&hello, task_json("too-late")).await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "draining"),
        "{refused:?}"
    );
    assert!(refused.headers.contains_key("retry-after"));

    let done = long_poll.await.expect("long poll");
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(done.json["stdout"], "done\n");
    node.assert_exits_0(Duration::from_secs(60));
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
    let id = node.submit_running(&looping, task_json("forever")).await;
    let long_poll = node.long_poll(&id);
    node.signal(libc::SIGTERM);
    let done = long_poll.await.expect("long poll");
    assert_eq!(done.json["status"], "cancelled", "{done:?}");
    node.assert_exits_0(Duration::from_secs(30));
}

/// The audit log's lines once it holds at least `count` (waiting up to 30 s: its writer
/// runs off the task's path).
async fn audit_lines(path: &std::path::Path, count: usize) -> Vec<serde_json::Value> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= count || start.elapsed() > Duration::from_secs(30) {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task.json enabling MCP with `servers` as its defaults.
fn mcp_task(id: &str, servers: &[&str]) -> serde_json::Value {
    json!({
        "task_id": id,
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!(servers).to_string()},
        "limits": {"deadline_ms": 120000},
    })
}

/// A guest that opens `server` and writes its tool list to stderr.
fn list_tools_guest(server: &str) -> String {
    wat::guest(
        &[(1024, server.as_bytes())],
        &format!(
            "(func $main (local $fd i32)
               (local.set $fd (call $mcp_open (i32.const 1024) (i32.const {})))
               (call $cap (i32.const 8192) (i32.const 65536))
               (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
               (call $emit (i32.const 16384) (call $len (i32.const 8192))))",
            server.len()
        ),
    )
}

/// The tool results a [`wat::mcp_calls`] guest emitted to its stderr, parsed.
fn results(task: &Answer) -> Vec<serde_json::Value> {
    task.json["stderr"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn text(result: &serde_json::Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// An ok call and an `isError` one, seen by `GET /metrics` (parsed, exact values),
/// `GET /v1/mcp/servers` and the `--audit-log` file.
#[tokio::test]
async fn real_calls_show_in_metrics_server_health_and_the_audit_log() {
    let server = unique_id("observed");
    let registry = RegistryDir::new();
    registry.fixture(&server, &["echo", "read_text"], "");
    let logs = tempfile::tempdir().expect("tempdir");
    let audit = logs.path().join("audit.jsonl");
    let token = "metrics-node-token-0042";
    let node = Node::start_with_args(
        &registry,
        Some("[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n"),
        &[("QUIVER_TEST_TOKEN", token)],
        &["--audit-log".as_ref(), audit.as_os_str()],
    );
    let secret_value = "value-never-logged-7731";
    let echo_args = json!({"text": secret_value}).to_string();
    let guest = wat::mcp_calls(
        &[
            (&server, "echo", &echo_args),
            (
                &server,
                "read_text",
                r#"{"path":"/nonexistent/serve-metrics"}"#,
            ),
        ],
        1,
    );
    let module = node.upload(guest.as_bytes()).await;
    let id = node
        .submit_ok(&module, mcp_task("observed", &[&server]))
        .await;
    let done = node.task(&id, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    let results = results(&done);
    assert_eq!(text(&results[0]), secret_value, "{results:?}");
    assert_eq!(results[1]["isError"], true, "{results:?}");

    // The server's tool count is known once a task has listed its tools.
    let lister = node.upload(list_tools_guest(&server).as_bytes()).await;
    let id = node
        .submit_ok(&lister, mcp_task("lister", &[&server]))
        .await;
    let listed = node.task(&id, 60).await;
    assert_eq!(listed.json["status"], "finished", "{listed:?}");
    assert!(
        listed.json["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("\"echo\""),
        "{listed:?}"
    );

    let anonymous = Node::send(node.anonymous(Method::GET, "/metrics")).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let response = node
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        quiver::Metrics::CONTENT_TYPE
    );
    let samples = openmetrics::parse(&response.text().await.expect("metrics text"));
    let calls = "quiver_mcp_tool_calls_total";
    let labels = |tool, outcome| {
        [
            ("server_id", server.as_str()),
            ("tool", tool),
            ("outcome", outcome),
        ]
    };
    assert_eq!(
        openmetrics::get(&samples, calls, &labels("echo", "ok")),
        1.0
    );
    assert_eq!(
        openmetrics::get(&samples, calls, &labels("read_text", "tool_error")),
        1.0
    );
    assert_eq!(samples.iter().filter(|s| s.name == calls).count(), 2);
    assert_eq!(
        openmetrics::get(&samples, "quiver_tasks_total", &[("outcome", "ok")]),
        2.0
    );

    let servers = node.get_json("/v1/mcp/servers").await;
    let listed = servers["servers"].as_array().expect("servers array");
    assert_eq!(listed.len(), 1, "{servers}");
    let shown = &listed[0];
    assert_eq!(shown["server_id"], server.as_str());
    assert_eq!(shown["state"], "connected", "{shown}");
    assert!(shown["tool_count"].as_u64() >= Some(2), "{shown}");
    assert_eq!(shown["last_error"], serde_json::Value::Null, "{shown}");
    assert_eq!(shown["connections"], 1, "{shown}");
    for key in [
        "reconnects",
        "last_error",
        "last_success",
        "latency_p50_ms",
        "calls_in_flight",
    ] {
        assert!(shown.get(key).is_some(), "no {key}: {shown}");
    }
    assert!(shown.get("pid").is_none(), "a node shows no pids: {shown}");
    // `quiver mcp status --node` reads the same endpoint.
    let status = std::process::Command::new(quiver_tests::quiver_cli())
        .args([
            "mcp",
            "status",
            "--json",
            "--token-env",
            "QUIVER_TEST_TOKEN",
            "--node",
        ])
        .arg(&node.base)
        .env("QUIVER_TEST_TOKEN", token)
        .output()
        .expect("quiver mcp status");
    assert!(status.status.success(), "{status:?}");
    let printed: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let printed = &printed[0];
    for key in [
        "server_id",
        "state",
        "tool_count",
        "connections",
        "reconnects",
    ] {
        assert_eq!(printed[key], shown[key], "{key}: {printed}");
    }

    // The audit writer runs off the task path: wait for its two lines.
    let start = Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= 2 || start.elapsed() > Duration::from_secs(30) {
            assert!(
                !text.contains(secret_value),
                "an argument value was logged: {text}"
            );
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let seen: Vec<(&str, &str, &str, &str, &str)> = lines
        .iter()
        .map(|l| {
            let field = |k: &str| l[k].as_str().unwrap_or_default();
            (
                field("event"),
                field("task_id"),
                field("server_id"),
                field("tool"),
                field("outcome"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("tool_call", "observed", server.as_str(), "echo", "ok"),
            (
                "tool_call",
                "observed",
                server.as_str(),
                "read_text",
                "tool_error"
            ),
        ]
    );
    assert_eq!(lines[0]["arguments"]["keys"], json!(["text"]));
}

/// The calls of an `approval_policy = "always"` server wait for `POST /v1/approvals/{id}`
/// by a client holding `approve` (never the submitter's `[serve]` token): approved, the
/// guest gets the tool's result; denied, `mcp_policy_denied` with the reason. The request
/// names the submitting client, and each decision is an audit line naming the approver.
#[tokio::test]
async fn approvals_are_listed_and_decided_over_http() {
    let server = unique_id("guarded");
    let registry = RegistryDir::new();
    registry.write(
        &format!("{server}.toml"),
        &format!(
            "approval_policy = \"always\"\n{}",
            fixture_toml(&server, &["*"], "")
        ),
    );
    let token = "approvals-node-token-0042";
    let ops_token = "approvals-ops-token-0043";
    let scratch = tempfile::tempdir().expect("tempdir");
    let audit = scratch.path().join("audit.jsonl");
    let node = Node::start_with_args(
        &registry,
        Some(
            "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n\
             [clients.ops]\ntoken_env = \"QUIVER_TEST_OPS\"\nroles = [\"approve\"]\n",
        ),
        &[("QUIVER_TEST_TOKEN", token), ("QUIVER_TEST_OPS", ops_token)],
        &["--audit-log".as_ref(), audit.as_os_str()],
    );
    let ops = |method: Method, path: &str| node.anonymous(method, path).bearer_auth(ops_token);
    let value = "value-the-approver-never-sees";
    let args = json!({"text": value}).to_string();
    let module = node
        .upload(wat::mcp_calls(&[(&server, "echo", &args)], 1).as_bytes())
        .await;
    let wait_pending = async || {
        let start = Instant::now();
        loop {
            let listed = Node::send(ops(Method::GET, "/v1/approvals")).await;
            assert_eq!(listed.status, 200, "{listed:?}");
            if listed.json["approvals"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                break listed.json;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "nothing pending");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let decide = |id: &str, body: serde_json::Value| {
        Node::send(ops(Method::POST, &format!("/v1/approvals/{id}")).json(&body))
    };

    // Approved.
    let task = node
        .submit_ok(&module, mcp_task("approve-me", &[&server]))
        .await;
    let listed = wait_pending().await;
    let pending = &listed["approvals"][0];
    assert_eq!(pending["task_id"], "approve-me", "{listed}");
    assert_eq!(pending["principal"], "serve", "the submitter is named");
    assert_eq!(pending["server_id"], server.as_str());
    assert_eq!(pending["tool"], "echo");
    assert_eq!(pending["arguments"]["keys"], json!(["text"]));
    assert!(
        !listed.to_string().contains(value),
        "a value was shown: {listed}"
    );
    let approval = pending["id"].as_str().expect("id").to_owned();
    // The submitter can neither see nor decide its own calls.
    let own_list = Node::send(node.request(Method::GET, "/v1/approvals")).await;
    let own_decision = Node::send(
        node.request(Method::POST, &format!("/v1/approvals/{approval}"))
            .json(&json!({"approve": true})),
    )
    .await;
    for refused in [&own_list, &own_decision] {
        assert_eq!(
            (refused.status, refused.code(), refused.field()),
            (403, "forbidden", "Authorization"),
            "{refused:?}"
        );
        let message = refused.json["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("`serve`") && message.contains("`approve`"),
            "{message}"
        );
    }
    assert_eq!(node.task(&task, 0).await.json["status"], "running");
    let answer = decide(&approval, json!({"approve": true})).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json, json!({"id": approval, "approved": true}));
    let done = node.task(&task, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    assert_eq!(text(&results(&done)[0]), value);
    // Decided once only: the id is known, its call no longer waits.
    let again = decide(&approval, json!({"approve": true})).await;
    assert_eq!(
        (again.status, again.code(), again.field()),
        (409, "no_longer_waiting", "id"),
        "{again:?}"
    );

    // Denied, with a reason.
    let task = node
        .submit_ok(&module, mcp_task("deny-me", &[&server]))
        .await;
    let listed = wait_pending().await;
    let approval = listed["approvals"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(listed["approvals"][0]["task_id"], "deny-me");
    let answer = decide(
        &approval,
        json!({"approve": false, "reason": "not on a Friday"}),
    )
    .await;
    assert_eq!(
        answer.json,
        json!({"id": approval, "approved": false}),
        "{answer:?}"
    );
    let done = node.task(&task, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    let error = &results(&done)[0]["error"];
    assert_eq!(error["code"], "mcp_policy_denied", "{done:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not on a Friday"),
        "{error}"
    );
    let empty = Node::send(ops(Method::GET, "/v1/approvals")).await;
    assert_eq!(empty.json, json!({"approvals": [], "questions": []}));

    // Each decision is an audit line naming the approver and the submitter; the task's
    // tool call and denial name the submitter.
    let lines = audit_lines(&audit, 4).await;
    let decisions: Vec<_> = lines
        .iter()
        .filter(|l| l["event"] == "approval_decided")
        .map(|l| {
            (
                l["task_id"].as_str().unwrap_or(""),
                l["principal"].as_str().unwrap_or(""),
                l["decided_by"].as_str().unwrap_or(""),
                l["approved"].as_bool(),
                l["reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("approve-me", "serve", "ops", Some(true), None),
            (
                "deny-me",
                "serve",
                "ops",
                Some(false),
                Some("not on a Friday")
            ),
        ],
        "{lines:?}"
    );
    for event in ["tool_call", "policy_denied"] {
        let line = lines
            .iter()
            .find(|l| l["event"] == event)
            .unwrap_or_else(|| panic!("no {event} line: {lines:?}"));
        assert_eq!(line["principal"], "serve", "{line}");
    }

    // Unknown ids, malformed ids and bad bodies.
    let unknown = decide("0000abcd-00000001", json!({"approve": true})).await;
    assert_eq!(
        (unknown.status, unknown.field()),
        (404, "id"),
        "{unknown:?}"
    );
    let malformed = decide("not%20an%20id", json!({"approve": true})).await;
    assert_eq!(
        (malformed.status, malformed.field()),
        (400, "id"),
        "{malformed:?}"
    );
    for (body, field) in [
        (json!({"approve": "yes"}), "approve"),
        (json!({}), "approve"),
        (json!({"approve": true, "because": "x"}), "because"),
        (json!({"approve": false, "reason": 7}), "reason"),
        (json!([true]), "body"),
    ] {
        let answer = decide("0000abcd-00000001", body.clone()).await;
        assert_eq!(
            (answer.status, answer.field()),
            (400, field),
            "{body}: {answer:?}"
        );
    }
    let huge = json!({"approve": false, "reason": "x".repeat(64 * 1024)});
    let answer = decide("0000abcd-00000001", huge).await;
    assert_eq!(
        (answer.status, answer.code()),
        (413, "body_too_large"),
        "{answer:?}"
    );
    let anonymous = Node::send(node.anonymous(Method::GET, "/v1/approvals")).await;
    assert_eq!(anonymous.status, 401);
}

/// With `--no-watch`, each SIGHUP is one reload: a changed and a removed record while a
/// task runs on the old snapshot, then a broken file (degraded, the old snapshot kept,
/// the node still ready), then the fix.
#[tokio::test]
async fn sighup_reloads_the_registry_while_a_task_runs() {
    let (changed, removed) = (unique_id("changed"), unique_id("removed"));
    let registry = RegistryDir::new();
    registry
        .fixture(&changed, &["*"], "")
        .fixture(&removed, &["*"], "");
    let mut node = Node::start_with_args(&registry, None, &[], &["--no-watch".as_ref()]);
    let initial = node.get_json("/v1/registry").await;
    assert_eq!(
        (
            &initial["generation"],
            &initial["reloads"],
            &initial["degraded"]
        ),
        (&json!(0), &json!(0), &json!(false)),
        "{initial}"
    );
    let module = node
        .upload(
            wat::mcp_calls(
                &[
                    (&changed, "slow", r#"{"ms":4000}"#),
                    (&changed, "echo", r#"{"text":"still here"}"#),
                ],
                1,
            )
            .as_bytes(),
        )
        .await;
    let task = node.submit_ok(&module, mcp_task("old", &[&changed])).await;
    node.poll_json("/v1/mcp/servers", Duration::from_secs(60), |body| {
        body["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["server_id"] == changed.as_str() && s["calls_in_flight"] == 1)
    })
    .await;

    let reloads = |n: u64| move |body: &serde_json::Value| body["reloads"] == n;
    registry.fixture(&changed, &["*"], "env = { RELOADED = \"1\" }");
    std::fs::remove_file(registry.path().join(format!("{removed}.toml"))).expect("remove");
    node.signal(libc::SIGHUP);
    let health = node
        .poll_json("/v1/registry", Duration::from_secs(30), reloads(1))
        .await;
    assert_eq!(health["generation"], 1, "{health}");
    assert_eq!(health["degraded"], false, "{health}");
    assert_ne!(health["revision"], initial["revision"], "{health}");
    let revision = health["revision"].clone();
    let servers = node.get_json("/v1/mcp/servers").await;
    let ids: Vec<&str> = servers["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .filter_map(|s| s["server_id"].as_str())
        .collect();
    assert_eq!(ids, [changed.as_str()], "{servers}");

    registry.write("broken.toml", "server_id = [");
    node.signal(libc::SIGHUP);
    let health = node
        .poll_json("/v1/registry", Duration::from_secs(30), reloads(2))
        .await;
    assert_eq!(health["degraded"], true, "{health}");
    assert_eq!(health["failed_reloads"], 1, "{health}");
    assert_eq!(
        health["revision"], revision,
        "the old snapshot stays: {health}"
    );
    assert!(
        health["last_reload_error"]
            .as_str()
            .unwrap_or_default()
            .contains("broken.toml"),
        "{health}"
    );
    let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(
        ready.status, 200,
        "a degraded registry still serves: {ready:?}"
    );
    assert_eq!(ready.json["registry"]["degraded"], true, "{ready:?}");
    assert_eq!(ready.json["registry_revision"], revision);

    let done = node.task(&task, 60).await;
    assert_eq!(done.json["status"], "finished", "{done:?}");
    let results = results(&done);
    assert_eq!(
        results.iter().map(text).collect::<Vec<_>>(),
        ["slept 4000ms", "still here"],
        "{done:?}"
    );

    std::fs::remove_file(registry.path().join("broken.toml")).expect("remove");
    node.signal(libc::SIGHUP);
    let health = node
        .poll_json("/v1/registry", Duration::from_secs(30), reloads(3))
        .await;
    assert_eq!(
        (&health["degraded"], &health["last_reload_error"]),
        (&json!(false), &serde_json::Value::Null),
        "{health}"
    );
    assert!(node.stderr().contains("SIGHUP"), "{}", node.stderr());
    node.signal(libc::SIGTERM);
    node.assert_exits_0(Duration::from_secs(60));
}

/// By default the node watches its registry: a new file is served without a signal.
#[tokio::test]
async fn the_node_follows_registry_edits_on_its_own() {
    let (first, added) = (unique_id("first"), unique_id("added"));
    let registry = RegistryDir::new();
    registry.fixture(&first, &["*"], "");
    let node = Node::start(&registry, None, &[]);
    registry.fixture(&added, &["*"], "");
    node.poll_json("/v1/mcp/servers", Duration::from_secs(30), |body| {
        body["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["server_id"] == added.as_str())
    })
    .await;
    let health = node.get_json("/v1/registry").await;
    assert!(health["generation"].as_u64() >= Some(1), "{health}");
}
