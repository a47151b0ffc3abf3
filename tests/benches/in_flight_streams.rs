//! Issue 23's substrate under load: MCP calls in flight against one call, and a user-stream
//! echo over the node's WebSocket against a plain WebSocket echo, each pair measured in
//! alternating rounds of one process.
//!
//! 1. **Calls in flight**: the `parallel-tools` example guest (Rust SDK, `rt::join_all`
//!    over `spear_epoll_wait`) starts 8 `mcp_call_start` calls of the fixture server's
//!    `slow` tool, 50 to 200 ms apart in steps, and waits for all; the same guest then makes
//!    one call of 200 ms, the slowest of the eight. Perfect overlap makes the ratio 1.0.
//!    Each run's time is the guest's own (from before the first start to after the last
//!    answer) and the task's (`Host::run_task`, instantiation and `mcp_open` included).
//!    The fixture's record raises `budgets.max_concurrency` to 16: a task may hold half of
//!    a server's permits in flight, and the default 8 would refuse the fifth call.
//! 2. **User-stream echo**: a real `quiver_node::Node` in this process runs an echo guest
//!    (WAT, below) that waits on user stream 0 with `spear_epoll_wait` and writes back each
//!    frame it reads. A `tokio-tungstenite` client attaches to `/v1/tasks/{id}/streams`
//!    (subprotocol `spear.stream.v1`) and sends SSF v1 frames one at a time, timing each
//!    round trip. The baseline is an axum WebSocket echo on loopback in the same process,
//!    the same client crate and the same frames. Each round takes a fresh task and socket
//!    (the node takes at most 500 frames a second per socket) and one untimed frame first.
//!
//! Run: `cargo bench -p quiver-tests --bench in_flight_streams`. `QUIVER_BENCH_ONLY`
//! (`calls` or `streams`), `QUIVER_BENCH_ROUNDS` (default 21) and
//! `QUIVER_BENCH_MESSAGES` (round trips per round and size, default 200, at most 450)
//! narrow or widen a run. No figure is asserted; a wrong answer panics.

use quiver_tests::bench::{env_usize, median};
use quiver_tests::ssf::data_frame;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message as AxumMessage, WebSocketUpgrade};
use axum::routing::get;
use axum::serve::ListenerExt;
use futures::{SinkExt, StreamExt};
use quiver::{GuestModule, Host, TaskSpec};
use quiver_node::{Node, NodeConfig, Role};
use quiver_tests::RegistryDir;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

fn percentile(mut samples: Vec<f64>, p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[at]
}

// ---------------------------------------------------------------------------------------
// 1. Calls in flight.

/// The slowest call, in ms: the eight run 50 ms to this, the single call this long.
const SLOWEST_MS: u64 = 200;
const CALLS: u64 = 8;

/// The `parallel-tools` arguments for `durations`: one call per element.
fn calls_args(durations: &[u64]) -> Vec<String> {
    let each: Vec<String> = durations
        .iter()
        .map(|ms| format!(r#"{{"ms":{ms}}}"#))
        .collect();
    vec![
        "fixture".into(),
        "slow".into(),
        format!("[{}]", each.join(",")),
    ]
}

/// Runs the guest once; the guest's own time and the task's, in ms.
async fn run_calls(host: &Host, module: &GuestModule, task: &TaskSpec, calls: usize) -> (f64, f64) {
    let started = Instant::now();
    let outcome = host.run_task(module, task).await.expect("task starts");
    let task_ms = started.elapsed().as_secs_f64() * 1e3;
    let stdout = outcome.stdout_text();
    assert!(
        outcome.success(),
        "{:?}\n{stdout}{}",
        outcome.failure,
        outcome.stderr_text()
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), calls + 1, "{stdout}");
    assert!(
        lines[..calls].iter().all(|l| l.starts_with("slept ")),
        "{stdout}"
    );
    let guest_ms: f64 = lines[calls]
        .strip_prefix(&format!("{calls} calls in "))
        .and_then(|t| t.strip_suffix(" ms"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("`{calls} calls in N ms` in {stdout}"));
    (guest_ms, task_ms)
}

async fn calls_in_flight(rounds: usize) {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow"],
        "[budgets]\nmax_concurrency = 16\ntool_timeout_ms = 60000\n",
    );
    let host = quiver_tests::host_builder(&registry).build().unwrap();
    let guest = quiver_tests::example_guest("parallel-tools");
    let module = host.load_module_file(&guest).unwrap();
    // 50, 71, 93, ... 200 ms: different durations, the slowest equal to the single call.
    let durations: Vec<u64> = (0..CALLS)
        .map(|i| 50 + (SLOWEST_MS - 50) * i / (CALLS - 1))
        .collect();
    let task = |args: Vec<String>| {
        quiver_tests::mcp_task("in-flight", &["fixture"])
            .with_args(args)
            .with_deadline(Duration::from_secs(30))
    };
    let eight = task(calls_args(&durations));
    let one = task(calls_args(&[SLOWEST_MS]));
    let n = durations.len();
    // Warm up: the server starts, the module's code is loaded.
    run_calls(&host, &module, &eight, n).await;
    run_calls(&host, &module, &one, 1).await;

    let (mut guest8, mut guest1, mut task8, mut task1) = (vec![], vec![], vec![], vec![]);
    let (mut guest_ratio, mut task_ratio) = (vec![], vec![]);
    for round in 0..rounds {
        eprint!("\rcalls in flight: round {}/{rounds}", round + 1);
        // Alternate which goes first.
        let (e, o) = if round % 2 == 0 {
            let e = run_calls(&host, &module, &eight, n).await;
            (e, run_calls(&host, &module, &one, 1).await)
        } else {
            let o = run_calls(&host, &module, &one, 1).await;
            (run_calls(&host, &module, &eight, n).await, o)
        };
        guest8.push(e.0);
        guest1.push(o.0);
        task8.push(e.1);
        task1.push(o.1);
        guest_ratio.push(e.0 / o.0);
        task_ratio.push(e.1 / o.1);
    }
    eprintln!();
    host.shutdown().await;
    println!(
        "calls in flight: {n} `slow` calls ({:?} ms) against one of {SLOWEST_MS} ms, median of {rounds} rounds",
        durations
    );
    println!("  {:<24} {:>14} {:>14}", "", "guest's time", "task's time");
    println!(
        "  {:<24} {:>11.1} ms {:>11.1} ms",
        format!("{n} calls in flight"),
        median(guest8),
        median(task8)
    );
    println!(
        "  {:<24} {:>11.1} ms {:>11.1} ms",
        format!("one call of {SLOWEST_MS} ms"),
        median(guest1),
        median(task1)
    );
    println!(
        "  {:<24} {:>13.3}x {:>13.3}x   (target <= 1.2x; one after another would be {} ms)",
        format!("{n} in flight / one"),
        median(guest_ratio),
        median(task_ratio),
        durations.iter().sum::<u64>()
    );
}

// ---------------------------------------------------------------------------------------
// 2. User-stream echo.

const TOKEN: &str = "bench-token-0023-streams";

/// Echoes every frame of user stream 0 until the client goes away: one epoll set watching
/// the stream for EPOLLIN (not EPOLLOUT, which is level-triggered and would make every
/// wait return at once), read a frame, write it back.
const ECHO: &str = r#"(module
  (import "spear" "user_stream_open" (func $open (param i32 i32) (result i32)))
  (import "spear" "user_stream_read" (func $read (param i32 i32 i32) (result i32)))
  (import "spear" "user_stream_write" (func $write (param i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_create" (func $epoll_create (result i32)))
  (import "spear" "spear_epoll_ctl" (func $epoll_ctl (param i32 i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_wait" (func $epoll_wait (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 6)
  (func (export "_start") (local $fd i32) (local $ep i32) (local $n i32) (local $events i32)
    ;; Stream 0, both directions.
    (local.set $fd (call $open (i32.const 0) (i32.const 3)))
    (if (i32.lt_s (local.get $fd) (i32.const 0)) (then unreachable))
    (local.set $ep (call $epoll_create))
    (if (i32.lt_s (local.get $ep) (i32.const 0)) (then unreachable))
    (if (call $epoll_ctl (local.get $ep) (i32.const 1) (local.get $fd) (i32.const 1)) (then unreachable))
    (loop $next
      (i32.store (i32.const 16) (i32.const 64))
      (local.set $n (call $epoll_wait (local.get $ep) (i32.const 32) (i32.const 16) (i32.const -1)))
      (if (i32.ne (local.get $n) (i32.const 1)) (then unreachable))
      (local.set $events (i32.load (i32.const 36)))
      ;; IN: a frame (at most 256 KiB) to echo.
      (if (i32.and (local.get $events) (i32.const 1))
        (then
          (i32.store (i32.const 16) (i32.const 262144))
          (local.set $n (call $read (local.get $fd) (i32.const 65536) (i32.const 16)))
          (if (i32.lt_s (local.get $n) (i32.const 0)) (then unreachable))
          (if (call $write (local.get $fd) (i32.const 65536) (local.get $n)) (then unreachable))
          (br $next)))
      ;; HUP or ERR with nothing left to read: the client went away.
      (br_if $next (i32.eqz (i32.and (local.get $events) (i32.const 24)))))))"#;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects with `TCP_NODELAY`, as the node's and the baseline's listeners set it.
async fn connect(url: &str, token: Option<&str>) -> Socket {
    let mut request = url.into_client_request().expect("request");
    if let Some(token) = token {
        let headers = request.headers_mut();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("spear.stream.v1"),
        );
    }
    let (socket, _) = tokio_tungstenite::connect_async_with_config(request, None, true)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    socket
}

/// Sends `count` frames (after one untimed), one at a time; each round trip in µs.
async fn echo_round(socket: &mut Socket, payload: &[u8], count: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(count);
    for seq in 0..=count {
        let sent = data_frame(0, seq as u64, payload);
        let started = Instant::now();
        socket.send(Message::binary(sent.clone())).await.unwrap();
        let echoed = loop {
            match socket.next().await.expect("open").expect("a message") {
                Message::Binary(bytes) => break bytes,
                Message::Ping(_) | Message::Pong(_) => continue,
                other => panic!("expected the echo, got {other:?}"),
            }
        };
        let took = started.elapsed().as_secs_f64() * 1e6;
        assert_eq!(echoed.as_ref(), sent.as_slice(), "the echo differs");
        if seq > 0 {
            times.push(took);
        }
    }
    times
}

/// The in-process node, with one client that submits and attaches.
struct StreamNode {
    base: String,
    client: reqwest::Client,
    module: String,
    control: quiver_node::NodeControl,
    host: Host,
    _registry: RegistryDir,
}

impl StreamNode {
    async fn start() -> StreamNode {
        let registry = RegistryDir::new();
        let host = quiver_tests::host_builder(&registry).build().unwrap();
        let config = NodeConfig::new("127.0.0.1:0".parse::<SocketAddr>().unwrap()).with_client(
            "bench",
            TOKEN,
            &[Role::Submit],
        );
        let node = Node::bind(host.clone(), config).await.unwrap();
        let base = format!("http://{}", node.local_addr());
        let control = node.control();
        tokio::spawn(node.run());
        let client = reqwest::Client::new();
        let module = quiver_tests::node::sha256_hex(ECHO.as_bytes());
        let put = client
            .put(format!("{base}/v1/modules/{module}"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/wasm")
            .body(ECHO)
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "{put:?}");
        StreamNode {
            base,
            client,
            module,
            control,
            host,
            _registry: registry,
        }
    }

    /// A new echo task and a socket attached to its streams.
    async fn attach(&self, round: usize) -> (String, Socket) {
        let answer = self
            .client
            .post(format!("{}/v1/tasks", self.base))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({
                "module": self.module,
                "task": {"task_id": format!("echo-{round}"), "limits": {"deadline_ms": 120000}}
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 202);
        let view: serde_json::Value = answer.json().await.unwrap();
        let id = view["id"].as_str().expect("id").to_owned();
        let url = format!(
            "{}/v1/tasks/{id}/streams",
            self.base.replacen("http", "ws", 1)
        );
        (id, connect(&url, Some(TOKEN)).await)
    }

    /// Waits for the task to end and checks it ended well.
    async fn ended(&self, id: &str) {
        let view: serde_json::Value = self
            .client
            .get(format!("{}/v1/tasks/{id}?wait=30", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(view["status"], "finished", "{view}");
        assert_eq!(view["exit_code"], 0, "{view}");
    }
}

/// A plain WebSocket echo on loopback: axum (the node's WebSocket stack), `TCP_NODELAY`.
async fn plain_echo() -> String {
    let router = axum::Router::new().route(
        "/echo",
        get(|ws: WebSocketUpgrade| async move {
            ws.on_upgrade(|mut socket| async move {
                while let Some(Ok(message)) = socket.next().await {
                    let echo = match message {
                        AxumMessage::Binary(bytes) => AxumMessage::Binary(bytes),
                        AxumMessage::Close(_) => break,
                        _ => continue,
                    };
                    if socket.send(echo).await.is_err() {
                        break;
                    }
                }
            })
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("ws://{addr}/echo")
}

async fn user_streams(rounds: usize, messages: usize) {
    let node = StreamNode::start().await;
    let plain = plain_echo().await;
    println!(
        "user-stream echo: {messages} round trips per round, one frame at a time, median of {rounds} rounds"
    );
    for size in [16usize, 4096] {
        let payload = vec![0x5a; size];
        let (mut via_node, mut via_plain, mut ratios) = (vec![], vec![], vec![]);
        let (mut all_node, mut all_plain) = (vec![], vec![]);
        for round in 0..=rounds {
            eprint!("\rstreams, {size} B: round {round}/{rounds}");
            let node_round = async || {
                let (id, mut socket) = node.attach(round).await;
                let times = echo_round(&mut socket, &payload, messages).await;
                socket.close(None).await.unwrap();
                // The close reaches the guest as HUP, and it returns.
                node.ended(&id).await;
                times
            };
            let plain_round = async || {
                let mut socket = connect(&plain, None).await;
                let times = echo_round(&mut socket, &payload, messages).await;
                socket.close(None).await.unwrap();
                times
            };
            let (n, p) = if round % 2 == 0 {
                let n = node_round().await;
                (n, plain_round().await)
            } else {
                let p = plain_round().await;
                (node_round().await, p)
            };
            // Round 0 warms up.
            if round == 0 {
                continue;
            }
            let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len() as f64;
            via_node.push(mean(&n));
            via_plain.push(mean(&p));
            ratios.push(mean(&n) / mean(&p));
            all_node.extend(n);
            all_plain.extend(p);
        }
        eprintln!();
        println!("  payload {size} B ({} B frames):", size + 32);
        for (what, means, all) in [
            ("node, user stream 0 (guest echo)", via_node, all_node),
            ("plain axum WebSocket echo", via_plain, all_plain),
        ] {
            println!(
                "    {what:<34} {:>8.1} µs/round trip (median of round means; p50 {:.1}, p99 {:.1})",
                median(means),
                percentile(all.clone(), 0.5),
                percentile(all, 0.99)
            );
        }
        println!("    node / plain: {:.2}x", median(ratios));
    }
    node.control.drain();
    node.host.shutdown().await;
}

#[tokio::main]
async fn main() {
    let only = std::env::var("QUIVER_BENCH_ONLY").unwrap_or_default();
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 21).max(1);
    // The node takes at most 500 frames a second per socket; a round uses one socket.
    let messages = env_usize("QUIVER_BENCH_MESSAGES", 200).clamp(1, 450);
    if only.is_empty() || only == "calls" {
        calls_in_flight(rounds).await;
    }
    if only.is_empty() || only == "streams" {
        user_streams(rounds, messages).await;
    }
}
