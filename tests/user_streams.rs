//! User streams (SPEAR's `user_stream_*`, SSF v1 frames) with SPEAR's own C sample
//! `samples/wasm-c/user_stream_echo.c` (fixtures/spear-samples, unchanged) built against
//! `guest-sdk/c/spear.h`: echoing through a real WebSocket client on a real `quiver serve`
//! for the task's submitter only, hostile frames refused with the reason, the library's
//! queues bounded against a client that never reads, and `quiver run --user-stream-stdio`
//! on the real binary.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use quiver::{Host, TaskSpec, UserStreams};
use quiver_tests::c::c_guest;
use quiver_tests::node::{Node, sha256_hex};
use quiver_tests::ssf::data_frame;
use quiver_tests::{RegistryDir, quiver_cli};
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

const ALICE: &str = "alice-token-0023-streams";
const BOB: &str = "bob-token-0023-streams";

/// Alice submits; Bob submits and observes every task, but may not attach to Alice's.
const CONFIG: &str = r#"
[clients.alice]
token_env = "ALICE_TOKEN"
roles = ["submit"]
[clients.bob]
token_env = "BOB_TOKEN"
roles = ["submit", "observe"]
"#;

fn echo_guest() -> PathBuf {
    c_guest(
        "fixtures/spear-samples/user_stream_echo.c",
        "spear_user_stream_echo",
        &[],
    )
}

struct Fixture {
    node: Node,
    module: String,
    _registry: RegistryDir,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Fixture {
    async fn start() -> Self {
        Self::start_with("").await
    }

    /// A node with `extra` appended to [`CONFIG`].
    async fn start_with(extra: &str) -> Self {
        let registry = RegistryDir::new();
        let config = format!("{CONFIG}{extra}");
        let node = Node::start(
            &registry,
            Some(&config),
            &[("ALICE_TOKEN", ALICE), ("BOB_TOKEN", BOB)],
        );
        let wasm = std::fs::read(echo_guest()).expect("read the guest");
        let sha = sha256_hex(&wasm);
        let answer = Node::send(
            node.anonymous(Method::PUT, &format!("/v1/modules/{sha}"))
                .bearer_auth(ALICE)
                .header("content-type", "application/wasm")
                .body(wasm),
        )
        .await;
        assert!(matches!(answer.status, 200 | 201), "{answer:?}");
        Fixture {
            node,
            module: sha,
            _registry: registry,
        }
    }

    /// Alice's task running the echo guest; its id.
    async fn submit(&self, name: &str) -> String {
        let answer = Node::send(
            self.node
                .anonymous(Method::POST, "/v1/tasks")
                .bearer_auth(ALICE)
                .json(&json!({"module": self.module, "task": {"task_id": name, "limits": {"deadline_ms": 60000}}})),
        )
        .await;
        assert_eq!(answer.status, 202, "{answer:?}");
        answer.json["id"].as_str().expect("id").to_owned()
    }

    async fn connect(
        &self,
        id: &str,
        token: &str,
        subprotocol: Option<&str>,
    ) -> Result<Socket, WsError> {
        let url = format!(
            "{}/v1/tasks/{id}/streams",
            self.node.base.replacen("http", "ws", 1)
        );
        let mut request = url.into_client_request().expect("request");
        let headers = request.headers_mut();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        if let Some(protocol) = subprotocol {
            headers.insert(
                "sec-websocket-protocol",
                HeaderValue::from_str(protocol).unwrap(),
            );
        }
        let (socket, response) = tokio_tungstenite::connect_async(request).await?;
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "spear.stream.v1"
        );
        Ok(socket)
    }

    async fn attach(&self, id: &str) -> Socket {
        self.connect(id, ALICE, Some("spear.stream.v1"))
            .await
            .expect("the submitter attaches")
    }

    /// The task's view once it has ended (60 s at most).
    async fn ended(&self, id: &str) -> serde_json::Value {
        let answer = Node::send(
            self.node
                .anonymous(Method::GET, &format!("/v1/tasks/{id}?wait=60"))
                .bearer_auth(ALICE),
        )
        .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.json
    }
}

/// The HTTP status of a refused upgrade.
fn refused_status(result: Result<Socket, WsError>) -> u16 {
    match result {
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("not an HTTP refusal: {other}"),
        Ok(_) => panic!("the upgrade was accepted"),
    }
}

async fn next_binary(socket: &mut Socket) -> Vec<u8> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("an answer within 30 s")
            .expect("the socket is open")
            .expect("a message");
        match message {
            Message::Binary(bytes) => return bytes.to_vec(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a binary frame, got {other:?}"),
        }
    }
}

/// The close frame the node ends a session with (code and reason).
async fn close_of(socket: &mut Socket) -> (CloseCode, String) {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("the node closes within 30 s");
        match message {
            Some(Ok(Message::Close(Some(close)))) => {
                return (close.code, close.reason.to_string());
            }
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn spears_c_echo_answers_its_submitter_over_a_websocket_and_nobody_else() {
    let fixture = Fixture::start().await;
    let id = fixture.submit("echo").await;
    let other = fixture.submit("other").await;

    // Bob may see every task, but not talk to Alice's.
    let bob = fixture.connect(&id, BOB, Some("spear.stream.v1")).await;
    assert_eq!(refused_status(bob), 404);
    // The subprotocol is required.
    let plain = fixture.connect(&id, ALICE, None).await;
    assert_eq!(refused_status(plain), 400);
    // Without a token, nobody.
    let anonymous = fixture
        .connect(&id, "not-a-token", Some("spear.stream.v1"))
        .await;
    assert_eq!(refused_status(anonymous), 401);

    let mut socket = fixture.attach(&id).await;
    // One client at a time.
    let second = fixture.connect(&id, ALICE, Some("spear.stream.v1")).await;
    assert_eq!(refused_status(second), 409);

    for (stream_id, text) in [(1u32, "hello"), (2, "second stream"), (1, "again")] {
        let sent = data_frame(stream_id, 1, text.as_bytes());
        socket.send(Message::binary(sent.clone())).await.unwrap();
        assert_eq!(next_binary(&mut socket).await, sent, "{text}");
    }
    // A frame with metadata and a longer header comes back whole too.
    let mut long = data_frame(1, 9, b"");
    long[6..8].copy_from_slice(&40u16.to_le_bytes());
    long[24..28].copy_from_slice(&2u32.to_le_bytes());
    long[28..32].copy_from_slice(&3u32.to_le_bytes());
    long.extend_from_slice(&[0u8; 8]);
    long.extend_from_slice(b"{}abc");
    socket.send(Message::binary(long.clone())).await.unwrap();
    assert_eq!(next_binary(&mut socket).await, long);

    socket.close(None).await.unwrap();
    // The node answers the client's close: a clean close, not a dropped connection.
    let reply = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("the node answers the close");
    assert!(matches!(reply, Some(Ok(Message::Close(_)))), "{reply:?}");
    let view = fixture.ended(&id).await;
    assert_eq!(view["status"], "finished", "{view}");
    assert_eq!(view["exit_code"], 0, "{view}");
    let printed = view["stderr"].as_str().unwrap_or_default();
    for line in [
        "user_stream_echo started",
        "stream connected: stream_id=1",
        "stream connected: stream_id=2",
        "session closed",
    ] {
        assert!(printed.contains(line), "`{line}` not in:\n{printed}");
    }
    // Once the session is over, nobody attaches again.
    let again = fixture.connect(&id, ALICE, Some("spear.stream.v1")).await;
    assert!(matches!(refused_status(again), 404 | 409));

    // The other task is untouched: still waiting for its client.
    let view = Node::send(
        fixture
            .node
            .anonymous(Method::GET, &format!("/v1/tasks/{other}"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(view.json["status"], "running", "{view:?}");
}

#[tokio::test]
async fn hostile_frames_close_the_socket_with_the_reason_and_the_guest_sees_it() {
    let fixture = Fixture::start().await;
    let bad_magic = {
        let mut f = data_frame(1, 1, b"x");
        f[0] = b'X';
        f
    };
    let bad_lengths = {
        let mut f = data_frame(1, 1, b"x");
        f[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        f
    };
    let cases: Vec<(&str, Vec<Message>, &str)> = vec![
        ("magic", vec![Message::binary(bad_magic)], "magic"),
        (
            "lengths",
            vec![Message::binary(bad_lengths)],
            "meta_len + data_len",
        ),
        (
            "stream id",
            vec![Message::binary(data_frame(0x8000_0000, 1, b"x"))],
            "stream_id 2147483648",
        ),
        (
            "text",
            vec![Message::text("hello")],
            "binary SSF v1 frames only",
        ),
        (
            "too many streams",
            (0..17)
                .map(|s| Message::binary(data_frame(100 + s, 1, b"x")))
                .collect(),
            "16 user streams",
        ),
    ];
    for (what, messages, reason) in cases {
        let id = fixture.submit(what).await;
        let mut socket = fixture.attach(&id).await;
        for message in messages {
            // The node may close before the last is written.
            if socket.send(message).await.is_err() {
                break;
            }
        }
        let (code, said) = close_of(&mut socket).await;
        assert_eq!(code, CloseCode::Policy, "{what}: {said}");
        assert!(said.contains(reason), "{what}: {said}");
        let view = fixture.ended(&id).await;
        assert_eq!(view["status"], "finished", "{what}: {view}");
        assert_eq!(view["exit_code"], 0, "{what}: {view}");
    }

    // A frame over 256 KiB never reaches the guest: the node stops reading it.
    let id = fixture.submit("huge").await;
    let mut socket = fixture.attach(&id).await;
    let _ = socket
        .send(Message::binary(data_frame(1, 1, &vec![7u8; 300 * 1024])))
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Binary(_))) => panic!("a huge frame was echoed"),
                Some(Ok(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the node kept the socket open");
    let view = fixture.ended(&id).await;
    assert_eq!(view["exit_code"], 0, "{view}");

    // A flood past the frame rate is cut off, whatever the guest does with it.
    let id = fixture.submit("flood").await;
    let socket = fixture.attach(&id).await;
    let (mut sink, mut stream) = socket.split();
    let flood = tokio::spawn(async move {
        for seq in 0..5_000u64 {
            if sink
                .send(Message::binary(data_frame(1, seq, b"f")))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let close = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(message) = stream.next().await {
            if let Ok(Message::Close(Some(close))) = message {
                return Some((close.code, close.reason.to_string()));
            }
        }
        None
    })
    .await
    .expect("the flood is cut off within 30 s");
    flood.abort();
    let (code, reason) = close.expect("a close frame");
    assert_eq!(code, CloseCode::Policy);
    assert!(reason.contains("frames a second"), "{reason}");
    let view = fixture.ended(&id).await;
    assert_eq!(view["exit_code"], 0, "{view}");
    let health = fixture.node.get_json("/healthz").await;
    assert_eq!(health["status"], "ok");
}

/// A client attached to a task waiting in the queue is told when the task is cancelled
/// there (it never started, so never bound its streams): its session ends, not hangs.
/// An upgraded connection keeps its place under `[serve] max_connections`: while the one
/// place is a stream session, the next request waits; once the session closes, it is served.
#[tokio::test]
async fn a_stream_session_counts_against_the_connection_cap_until_it_closes() {
    let fixture = Fixture::start_with("[serve]\nmax_connections = 1\n").await;
    let id = fixture.submit("holds-the-place").await;
    let mut socket = fixture.attach(&id).await;
    let waiting = fixture
        .node
        .anonymous(Method::GET, &format!("/v1/tasks/{id}"))
        .bearer_auth(ALICE)
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(waiting.is_err(), "served past the cap: {waiting:?}");
    socket.close(None).await.expect("close");
    let view = fixture.ended(&id).await;
    assert_eq!(view["status"], "finished", "{view}");
}

#[tokio::test]
async fn a_client_of_a_task_cancelled_in_the_queue_has_its_session_ended() {
    let fixture = Fixture::start_with("[tasks]\nmax_concurrent = 1\n").await;
    // Holds the one slot: the echo guest waits for a client that never comes.
    let running = fixture.submit("holds-the-slot").await;
    let queued = fixture.submit("queued").await;
    let mut socket = fixture.attach(&queued).await;
    socket
        .send(Message::Binary(data_frame(1, 1, b"anyone?").into()))
        .await
        .expect("send");
    let answer = Node::send(
        fixture
            .node
            .anonymous(Method::DELETE, &format!("/v1/tasks/{queued}"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["status"], "cancelled", "{answer:?}");
    let (code, reason) = close_of(&mut socket).await;
    assert_eq!(code, CloseCode::Normal);
    assert_eq!(reason, "the task ended");
    for id in [&running, &queued] {
        let _ = Node::send(
            fixture
                .node
                .anonymous(Method::DELETE, &format!("/v1/tasks/{id}"))
                .bearer_auth(ALICE),
        )
        .await;
    }
}

/// The library's queues against a client that sends much and never reads: the guest's
/// writes wait in a bounded queue (it sees -EAGAIN), the client's sends wait for room, and
/// the task's host memory stays within the two queues however much is sent.
#[tokio::test]
async fn a_client_that_never_reads_costs_the_bounded_queues_not_what_it_sent() {
    let host = Host::builder().build().expect("host");
    let streams = UserStreams::new();
    let mut task = TaskSpec::new("never-reads").with_captured_output();
    task.limits.deadline_ms = Some(60_000);
    task.user_streams = Some(streams.clone());
    let client = streams.attach().expect("attach");
    let module = host.load_module_file(echo_guest()).expect("load");
    let run = tokio::spawn({
        let host = host.clone();
        async move { host.run_task(&module, &task).await.expect("task starts") }
    });
    // 24 MiB in 96 frames of 256 KiB, while nothing is read back.
    let chunk = vec![b'z'; 256 * 1024 - 32];
    for seq in 0..96u64 {
        tokio::time::timeout(
            Duration::from_secs(30),
            client.send(data_frame(1, seq, &chunk)),
        )
        .await
        .expect("the guest keeps reading")
        .expect("send");
    }
    client.drained().await;
    drop(client);
    let outcome = run.await.expect("join");
    assert!(outcome.success(), "{}", outcome.stderr_text());
    let peak = outcome.host_memory.peak_bytes;
    assert!(
        peak < 4 * 1024 * 1024,
        "24 MiB sent, {peak} bytes of host memory held"
    );
    host.shutdown().await;
}

#[test]
fn quiver_run_binds_stream_0_to_the_terminal() {
    let guest = echo_guest();
    let run = |flag: Option<&str>, input: &[u8]| {
        let mut command = Command::new(quiver_cli());
        command
            .env_remove("QUIVER_LOG")
            .env_remove("QUIVER_CONFIG")
            .env_remove("QUIVER_REGISTRY")
            .args(["run", "--no-cache"]);
        if let Some(flag) = flag {
            command.arg(flag);
        }
        let mut child = command
            .arg(&guest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run quiver");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().expect("quiver ends")
    };
    let output = run(Some("--user-stream-stdio"), b"hello\nworld\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello\nworld\n",
        "{stderr}"
    );
    assert!(stderr.contains("session closed"), "{stderr}");

    // Without the flag nobody could attach: the guest is told so at once.
    let output = run(None, b"ignored");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("user_stream_ctl_open failed: -107"),
        "{stderr}"
    );
}

/// The guest ends (its deadline) while stdin stays open: `quiver run` exits anyway, not
/// at the next line of input.
#[test]
fn quiver_run_exits_when_the_guest_ends_though_stdin_stays_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let task = dir.path().join("task.json");
    std::fs::write(
        &task,
        r#"{"task_id": "stdin-open", "limits": {"deadline_ms": 1500}}"#,
    )
    .expect("write task.json");
    let mut child = Command::new(quiver_cli())
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_CONFIG")
        .env_remove("QUIVER_REGISTRY")
        .args(["run", "--no-cache", "--user-stream-stdio", "--task"])
        .arg(&task)
        .arg(echo_guest())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run quiver");
    let stdin = child.stdin.take();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(stdin);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("quiver run still waits for stdin 30 s after its guest's 1.5 s deadline");
    }
}
