//! `quiver serve` against hostile and unlucky clients: the real binary, real HTTP (raw TCP
//! where the client must misbehave), real WAT guests. Drains racing slow requests, queued
//! tasks at drain start, tokens from files, one client hogging connections, a flood of
//! distinct module uploads, clients that leave while their upload compiles, and web pages
//! that try to drive the node (DNS rebinding, cross-site requests) or read its `/readyz`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use quiver_tests::node::{Answer, HELLO, LOOP, Node, sha256_hex, task_json};
use quiver_tests::{RegistryDir, workspace};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A module of its own for each `n` (its data differs), so each has its own hash.
fn distinct_module(n: usize) -> String {
    format!(
        r#"(module (memory (export "memory") 1) (data (i32.const 0) "module {n}") (func (export "_start")))"#
    )
}

fn addr(node: &Node) -> SocketAddr {
    node.base
        .trim_start_matches("http://")
        .parse()
        .expect("node address")
}

/// A connection to `to` from the loopback address `from`, so a test's raw connections
/// are counted apart from its HTTP client's (which come from 127.0.0.1).
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("from"))
        .expect("bind");
    socket.connect(to).await.expect("connect")
}

/// Polls `/readyz` until it names `draining`.
async fn wait_draining(node: &Node) {
    let started = Instant::now();
    loop {
        let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
        if ready.json["reasons"][0] == "draining" {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the node did not start draining: {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_submission_whose_body_ends_after_sigterm_is_refused_and_starts_nothing() {
    let registry = RegistryDir::new();
    let mut node = Node::start(&registry, Some("[serve]\ndrain_grace_ms = 60000\n"), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let hello = node.upload(HELLO.as_bytes()).await;
    // A running task keeps the node draining (and listening) while the slow body ends.
    let running = node
        .submit_running(&looping, task_json("keeps-draining"))
        .await;

    let body = json!({"module": hello, "task": task_json("too-late")}).to_string();
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    let mut slow = TcpStream::connect(addr(&node)).await.expect("connect");
    let head = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.expect("headers");
    slow.write_all(first).await.expect("half a body");
    // Let the handler pass its draining check and start reading the body.
    tokio::time::sleep(Duration::from_millis(300)).await;

    node.signal(libc::SIGTERM);
    wait_draining(&node).await;
    slow.write_all(rest).await.expect("the rest of the body");
    let mut answer = Vec::new();
    slow.read_to_end(&mut answer).await.expect("answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"draining\""), "{answer}");

    // Only the running task was ever accepted.
    assert_eq!(
        node.stderr().matches("task accepted").count(),
        1,
        "{}",
        node.stderr()
    );
    let cancelled = node.cancel(&running).await;
    assert_eq!(cancelled.json["status"], "cancelled", "{cancelled:?}");
    node.assert_exits_0(Duration::from_secs(60));
    assert!(!node.stderr().contains("too-late"), "{}", node.stderr());
}

#[tokio::test]
async fn queued_tasks_are_cancelled_when_the_drain_begins_and_running_ones_keep_going() {
    let registry = RegistryDir::new();
    let config = "[tasks]\nmax_concurrent = 1\n[serve]\ndrain_grace_ms = 60000\n";
    let mut node = Node::start(&registry, Some(config), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let hello = node.upload(HELLO.as_bytes()).await;
    let running = node.submit_running(&looping, task_json("running")).await;
    let queued = node.submit_ok(&hello, task_json("queued")).await;
    assert_eq!(node.task(&queued, 0).await.json["status"], "queued");

    node.signal(libc::SIGTERM);
    // Well inside the 60 s grace: the queued task ends now, not at the grace's end.
    let ended = node.task(&queued, 30).await;
    assert_eq!(ended.json["status"], "cancelled", "{ended:?}");
    assert_eq!(ended.json["_spear"]["failure"]["kind"], "cancelled");
    assert!(
        ended.json["_spear"]["failure"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("draining"),
        "{ended:?}"
    );
    assert_eq!(ended.json["stdout"], "", "the queued task never ran");
    let still = node.task(&running, 0).await;
    assert_eq!(still.json["status"], "running", "{still:?}");

    let cancelled = node.cancel(&running).await;
    assert_eq!(cancelled.json["status"], "cancelled", "{cancelled:?}");
    node.assert_exits_0(Duration::from_secs(60));
}

#[tokio::test]
async fn a_token_with_a_trailing_newline_works_and_the_scheme_is_case_insensitive() {
    let registry = RegistryDir::new();
    let config = "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n";
    // As `export QUIVER_TEST_TOKEN=$(cat token-file)` would not, but `read -r` or an
    // env file might: the newline stays.
    let node = Node::start(
        &registry,
        Some(config),
        &[("QUIVER_TEST_TOKEN", "n0de-token-42\n")],
    );
    let path = "/v1/tasks/0123456789abcdef01234567";
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let answer = Node::send(
            node.anonymous(Method::GET, path)
                .header("authorization", format!("{scheme} n0de-token-42")),
        )
        .await;
        // Past the guard: the task does not exist.
        assert_eq!(answer.status, 404, "{scheme}: {answer:?}");
    }
    for wrong in [
        "Bearer n0de-token-43",
        "Basic n0de-token-42",
        "Bearern0de-token-42",
    ] {
        let answer = Node::send(
            node.anonymous(Method::GET, path)
                .header("authorization", wrong),
        )
        .await;
        assert_eq!(answer.status, 401, "{wrong}: {answer:?}");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let Err((status, stderr)) = Node::spawn(
        "127.0.0.1:0",
        &registry,
        Some(config),
        &dir,
        &[("QUIVER_TEST_TOKEN", " \n")],
        &[],
    ) else {
        panic!("a node whose token is only whitespace started");
    };
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(stderr.contains("serve.token_env"), "{stderr}");
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_of_connections_and_idle_ones_close() {
    let registry = RegistryDir::new();
    let config = "[serve]\nmax_connections_per_ip = 3\nheader_timeout_ms = 2000\n";
    let node = Node::start(&registry, Some(config), &[]);
    let looping = node.upload(LOOP.as_bytes()).await;
    let id = node.submit_ok(&looping, task_json("held")).await;
    let to = addr(&node);

    // Three long polls from 127.0.0.2 take its whole share (the test's HTTP client
    // connects from 127.0.0.1, counted apart).
    let poll = format!("GET /v1/tasks/{id}?wait=20 HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut tcp = connect_from("127.0.0.2", to).await;
        tcp.write_all(poll.as_bytes()).await.expect("long poll");
        held.push(tcp);
    }
    let started = Instant::now();

    // A fourth from the same address is closed without an answer.
    let mut extra = connect_from("127.0.0.2", to).await;
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), extra.read_to_end(&mut answer))
        .await
        .expect("the extra connection was held open");
    assert!(
        read.is_err() || answer.is_empty(),
        "the extra connection was served: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "too slow to test while the long polls hold their connections"
    );
    // Other addresses are not held up by it.
    let ok = Node::send(node.anonymous(Method::GET, "/healthz")).await;
    assert_eq!(ok.status, 200, "{ok:?}");

    // After its answer each long poll's connection idles, kept alive, and is closed after
    // header_timeout_ms: the read ends instead of hanging.
    for mut tcp in held {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut answer))
            .await
            .expect("an idle kept-alive connection was not closed")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("\"running\""), "{answer}");
    }

    // With those closed, the address gets connections again.
    let mut again = connect_from("127.0.0.2", to).await;
    again
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    again.read_to_end(&mut answer).await.expect("read");
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test]
async fn module_uploads_stay_within_the_store_and_never_reach_the_host_cache_or_disk() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, Some("[serve]\nmax_modules = 3\n"), &[]);
    let disk = workspace().join("target").join("test-module-cache");
    let mut uploaded = Vec::new();
    for n in 0..8 {
        let module = distinct_module(n);
        let sha = node.upload(module.as_bytes()).await;
        uploaded.push((sha, module.len()));
        let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
        let modules = &ready.json["modules"];
        let stored = modules["stored"].as_u64().expect("modules.stored");
        assert_eq!(stored, (n as u64 + 1).min(3), "{ready:?}");
        assert_eq!(modules["host_cached"], 0, "{ready:?}");
        // Counted as compiled code, not just the bytes sent.
        let sent: usize = uploaded.iter().rev().take(3).map(|(_, len)| len).sum();
        assert!(modules["bytes"].as_u64() > Some(sent as u64), "{ready:?}");
    }
    let on_disk: Vec<String> = std::fs::read_dir(&disk)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for (sha, _) in &uploaded {
        assert!(
            !on_disk.iter().any(|name| name.starts_with(sha.as_str())),
            "upload {sha} was written to the disk cache"
        );
    }

    // The oldest were evicted: a task naming one is refused, the newest still runs.
    let evicted = node.submit(&uploaded[0].0, task_json("evicted")).await;
    assert_eq!(
        (evicted.status, evicted.code()),
        (422, "unknown_module"),
        "{evicted:?}"
    );
    let newest = &uploaded[7].0;
    let id = node.submit_ok(newest, task_json("newest")).await;
    assert_eq!(node.task(&id, 60).await.json["status"], "finished");

    // A module that alone takes more than the store holds is refused, not stored.
    let tiny = Node::start(
        &registry,
        Some("[serve]\nmax_module_store_bytes = 64\n"),
        &[],
    );
    let module = distinct_module(100);
    let answer = Node::send(
        tiny.request(
            Method::PUT,
            &format!("/v1/modules/{}", sha256_hex(module.as_bytes())),
        )
        .header("content-type", "application/wasm")
        .body(module.into_bytes()),
    )
    .await;
    assert_eq!(
        (answer.status, answer.code(), answer.field()),
        (413, "module_too_large", "body"),
        "{answer:?}"
    );
    let ready = Node::send(tiny.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(ready.json["modules"]["stored"], 0, "{ready:?}");
}

/// `request` as a browser that reached the node under `host` would send it (reqwest keeps
/// a `Host` header it is given).
fn from_host(request: reqwest::RequestBuilder, host: &str) -> reqwest::RequestBuilder {
    request.header("host", host)
}

fn message(answer: &Answer) -> &str {
    answer.json["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_web_page_cannot_drive_a_node_without_a_token() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, None, &[]);
    let port = addr(&node).port();
    let sha = sha256_hex(HELLO.as_bytes());
    let upload = |host: &str, kind: &str| {
        from_host(
            node.anonymous(Method::PUT, &format!("/v1/modules/{sha}")),
            host,
        )
        .header("content-type", kind)
        .body(HELLO)
    };

    // DNS rebinding: the attacker's own name, resolved to the node's address.
    let rebound = format!("attacker.example:{port}");
    for request in [
        from_host(node.anonymous(Method::GET, "/v1/registry"), &rebound),
        from_host(node.anonymous(Method::GET, "/v1/mcp/servers"), &rebound),
        upload(&rebound, "application/wasm"),
        from_host(node.anonymous(Method::GET, "/admin/"), &rebound),
    ] {
        let refused = Node::send(request).await;
        assert_eq!(
            (refused.status, refused.code(), refused.field()),
            (421, "host_not_allowed", "Host"),
            "{refused:?}"
        );
        assert!(
            message(&refused).contains("attacker.example")
                && message(&refused).contains("[serve] allowed_hosts"),
            "{refused:?}"
        );
    }
    let ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    assert_eq!(ready.json["modules"]["stored"], 0, "{ready:?}");

    // curl's `--data-binary` default type is a form's, which any page may post: refused.
    let own = format!("127.0.0.1:{port}");
    let form = Node::send(upload(&own, "application/x-www-form-urlencoded")).await;
    assert_eq!(
        (form.status, form.code(), form.field()),
        (415, "unsupported_media_type", "Content-Type"),
        "{form:?}"
    );
    assert!(message(&form).contains("application/wasm"), "{form:?}");
    let stored = Node::send(upload(&own, "application/octet-stream")).await;
    assert_eq!(stored.status, 201, "{stored:?}");

    // A cross-site "simple request" (text/plain needs no CORS preflight), and each of its
    // marks alone.
    let task = json!({"module": sha, "task": task_json("forged")}).to_string();
    let post = |kind: &str, marks: &[(&str, &str)]| {
        let mut request = node
            .anonymous(Method::POST, "/v1/tasks")
            .header("content-type", kind)
            .body(task.clone());
        for (name, value) in marks {
            request = request.header(*name, *value);
        }
        request
    };
    let foreign = ("origin", "http://attacker.example");
    let cross = ("sec-fetch-site", "cross-site");
    for (request, expected) in [
        (
            post("text/plain;charset=UTF-8", &[foreign, cross]),
            (403, "cross_origin", "Origin"),
        ),
        (
            post("text/plain;charset=UTF-8", &[]),
            (415, "unsupported_media_type", "Content-Type"),
        ),
        (
            post("application/json", &[foreign]),
            (403, "cross_origin", "Origin"),
        ),
        (
            post("application/json", &[("origin", "null")]),
            (403, "cross_origin", "Origin"),
        ),
        (
            post("application/json", &[cross]),
            (403, "cross_site", "Sec-Fetch-Site"),
        ),
    ] {
        let refused = Node::send(request).await;
        assert_eq!(
            (refused.status, refused.code(), refused.field()),
            expected,
            "{refused:?}"
        );
    }
    let read = Node::send(
        node.anonymous(Method::GET, "/v1/registry")
            .header(foreign.0, foreign.1),
    )
    .await;
    assert_eq!(
        (read.status, read.code()),
        (403, "cross_origin"),
        "{read:?}"
    );
    assert!(
        !node.stderr().contains("task accepted"),
        "{}",
        node.stderr()
    );

    // The node's own names, and a request from its own origin (as its admin page sends).
    for host in [
        format!("localhost:{port}"),
        own.clone(),
        format!("[::1]:{port}"),
    ] {
        let read = Node::send(from_host(
            node.anonymous(Method::GET, "/v1/registry"),
            &host,
        ))
        .await;
        assert_eq!(read.status, 200, "{host}: {read:?}");
    }
    let same = Node::send(post(
        "application/json",
        &[
            ("origin", &format!("http://{own}")),
            ("sec-fetch-site", "same-origin"),
        ],
    ))
    .await;
    assert_eq!(same.status, 202, "{same:?}");
}

#[tokio::test]
async fn configured_names_and_origins_are_served_and_any_name_needs_a_token() {
    let registry = RegistryDir::new();
    let config = "[serve]\nallowed_hosts = [\"Node.Internal\"]\nallowed_origins = [\"https://quiver.example.com\"]\n";
    let node = Node::start(&registry, Some(config), &[]);
    let port = addr(&node).port();
    let named = format!("node.internal:{port}");
    let read = Node::send(from_host(
        node.anonymous(Method::GET, "/v1/registry"),
        &named,
    ))
    .await;
    assert_eq!(read.status, 200, "{read:?}");
    let sha = sha256_hex(HELLO.as_bytes());
    let upload = Node::send(
        from_host(
            node.anonymous(Method::PUT, &format!("/v1/modules/{sha}")),
            &named,
        )
        .header("content-type", "application/wasm")
        .body(HELLO),
    )
    .await;
    assert_eq!(upload.status, 201, "{upload:?}");
    let other = Node::send(from_host(
        node.anonymous(Method::GET, "/v1/registry"),
        "other.internal",
    ))
    .await;
    assert_eq!(other.status, 421, "{other:?}");

    // The origin a proxy serves the node under, with the Host it forwards.
    let submit = |origin: &str| {
        node.anonymous(Method::POST, "/v1/tasks")
            .header("origin", origin)
            .json(&json!({"module": sha, "task": task_json("proxied")}))
    };
    let proxied = Node::send(submit("https://quiver.example.com")).await;
    assert_eq!(proxied.status, 202, "{proxied:?}");
    let evil = Node::send(submit("https://evil.example.com")).await;
    assert_eq!(
        (evil.status, evil.code()),
        (403, "cross_origin"),
        "{evil:?}"
    );

    // Any name, the operator's override, only with a token; a bad entry is named.
    let dir = tempfile::tempdir().expect("tempdir");
    for (config, needle) in [
        ("[serve]\nallowed_hosts = [\"*\"]\n", "token_env"),
        (
            "[serve]\nallowed_hosts = [\"https://node.internal\"]\n",
            "no scheme",
        ),
        (
            "[serve]\nallowed_origins = [\"quiver.example.com\"]\n",
            "serve.allowed_origins",
        ),
    ] {
        let Err((status, stderr)) =
            Node::spawn("127.0.0.1:0", &registry, Some(config), &dir, &[], &[])
        else {
            panic!("a node started with {config}");
        };
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
        assert!(
            stderr.contains(needle) && stderr.contains("allowed_"),
            "{config}: {stderr}"
        );
    }
    let any = Node::start(
        &registry,
        Some("[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\nallowed_hosts = [\"*\"]\n"),
        &[("QUIVER_TEST_TOKEN", "any-host-token")],
    );
    let read = Node::send(from_host(
        any.request(Method::GET, "/v1/registry"),
        "attacker.example",
    ))
    .await;
    assert_eq!(read.status, 200, "{read:?}");
    let foreign = Node::send(
        any.request(Method::GET, "/v1/registry")
            .header("origin", "http://attacker.example"),
    )
    .await;
    assert_eq!(foreign.status, 403, "{foreign:?}");
}

#[tokio::test]
async fn readyz_without_a_token_says_only_whether_the_node_is_ready() {
    let registry = RegistryDir::new();
    let config = "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\ndrain_grace_ms = 60000\n[admin]\ntoken_env = \"QUIVER_TEST_ADMIN\"\n";
    let mut node = Node::start(
        &registry,
        Some(config),
        &[
            ("QUIVER_TEST_TOKEN", "ready-token"),
            ("QUIVER_TEST_ADMIN", "ready-admin"),
        ],
    );
    let path = registry.path().display().to_string();
    for (token, detail) in [
        (None, false),
        (Some("wrong-token"), false),
        (Some("ready-token"), true),
        (Some("ready-admin"), true),
    ] {
        let mut request = node.anonymous(Method::GET, "/readyz");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let ready = Node::send(request).await;
        assert_eq!(ready.status, 200, "{token:?}: {ready:?}");
        if detail {
            assert!(
                ready.json["registry"]["source"]
                    .as_str()
                    .is_some_and(|s| s.contains(&path)),
                "{token:?}: {ready:?}"
            );
            assert!(ready.json["modules"]["stored"].is_u64(), "{ready:?}");
            assert_eq!(ready.json["uploads"]["limit"], 2, "{ready:?}");
        } else {
            assert_eq!(ready.json, json!({"ready": true}), "{token:?}: {ready:?}");
        }
    }

    // Not ready: still no reason without the token.
    let looping = node.upload(LOOP.as_bytes()).await;
    let running = node.submit_running(&looping, task_json("holds")).await;
    node.signal(libc::SIGTERM);
    let started = Instant::now();
    let mut ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    while ready.status == 200 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = Node::send(node.anonymous(Method::GET, "/readyz")).await;
    }
    assert_eq!(
        (ready.status, &ready.json),
        (503, &json!({"ready": false})),
        "{ready:?}"
    );
    let detail = Node::send(node.request(Method::GET, "/readyz")).await;
    assert_eq!(detail.json["reasons"][0], "draining", "{detail:?}");
    node.cancel(&running).await;
    node.assert_exits_0(Duration::from_secs(60));
}

/// A module that takes the node a while to compile: `funcs` functions of long arithmetic,
/// its own for each `n`.
fn heavy_module(n: usize, funcs: usize) -> String {
    let mut wat = format!(
        "(module (memory (export \"memory\") 1) (data (i32.const 0) \"heavy {n}\") (func (export \"_start\"))\n"
    );
    for f in 0..funcs {
        wat.push_str("(func (param i32) (result i32) local.get 0\n");
        for k in 0..400 {
            let c = f * 7 + k;
            wat.push_str(&format!(
                "i32.const {c} i32.add local.get 0 i32.mul i32.const {k} i32.xor\n"
            ));
        }
        wat.push_str(")\n");
    }
    wat.push(')');
    wat
}

/// `uploads` of the node's `/readyz`.
async fn uploads(base: &str) -> serde_json::Value {
    let answer = reqwest::get(format!("{base}/readyz"))
        .await
        .expect("readyz");
    let json: serde_json::Value = answer.json().await.expect("readyz JSON");
    json["uploads"].clone()
}

#[tokio::test]
async fn an_upload_keeps_its_place_until_its_compile_ends_though_its_client_left() {
    let registry = RegistryDir::new();
    let node = Node::start(&registry, None, &[]);
    let limit = uploads(&node.base).await["limit"]
        .as_u64()
        .expect("uploads.limit");
    let modules: Vec<String> = (0..=limit as usize)
        .map(|n| heavy_module(n, HEAVY_FUNCS))
        .collect();

    // Watches the compiles all along: never more than the limit at once.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = tokio::spawn({
        let (base, watching) = (node.base.clone(), watching.clone());
        async move {
            let mut peak = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let compiling = uploads(&base).await["compiling"].as_u64().unwrap_or(0);
                peak = peak.max(compiling);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peak
        }
    });

    // `limit` clients send their whole module, then leave while it compiles.
    let mut clients = Vec::new();
    for module in &modules[..limit as usize] {
        let mut tcp = TcpStream::connect(addr(&node)).await.expect("connect");
        let head = format!(
            "PUT /v1/modules/{} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/wasm\r\nContent-Length: {}\r\n\r\n",
            sha256_hex(module.as_bytes()),
            module.len()
        );
        tcp.write_all(head.as_bytes()).await.expect("head");
        tcp.write_all(module.as_bytes()).await.expect("body");
        clients.push(tcp);
    }
    let started = Instant::now();
    while uploads(&node.base).await["compiling"] != limit {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the uploads never all compiled at once: {}",
            uploads(&node.base).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(clients);
    // Time for the node to see them gone (and, before the fix, free their places).
    tokio::time::sleep(Duration::from_millis(200)).await;

    let last = &modules[limit as usize];
    let put = || {
        node.request(
            Method::PUT,
            &format!("/v1/modules/{}", sha256_hex(last.as_bytes())),
        )
        .header("content-type", "application/wasm")
        .body(last.clone())
    };
    let before = uploads(&node.base).await;
    assert_eq!(
        before["compiling"], limit,
        "compiles ended too soon to test: {before}"
    );
    // Their compiles still hold every place.
    let refused = Node::send(put()).await;
    assert_eq!(
        (refused.status, refused.code()),
        (429, "too_many_uploads"),
        "{refused:?}"
    );

    // The compiles end, and what they compiled is stored though nobody waited for it.
    let started = Instant::now();
    while uploads(&node.base).await["in_progress"] != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the compiles never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for module in &modules[..limit as usize] {
        let again = Node::send(
            node.request(
                Method::PUT,
                &format!("/v1/modules/{}", sha256_hex(module.as_bytes())),
            )
            .header("content-type", "application/wasm")
            .body(module.clone()),
        )
        .await;
        assert_eq!(again.status, 200, "already stored: {again:?}");
    }
    let stored = Node::send(put()).await;
    assert_eq!(stored.status, 201, "{stored:?}");

    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = watcher.await.expect("watcher");
    assert_eq!(peak, limit, "compiles at once, at most");
}

/// Functions of [`heavy_module`]: enough for a compile of a few seconds.
const HEAVY_FUNCS: usize = 150;
