//! Latency of one `echo` tool call, three ways:
//!
//! 1. **guest**: a WAT guest calling `mcp_call_tool` in a loop, through the whole host
//!    (ABI decode, fd table, policy, pool, rmcp, stdio, and back into guest memory);
//! 2. **native**: library code calling the same server on the same pooled connection
//!    (`Host::call_tool`: policy, observers, the pool's budgets and rmcp, no wasm);
//! 3. **spawn**: what a naive host does: a fresh server process, MCP handshake and call for
//!    every tool call.
//!
//! Against the fixture server (Rust, starts in milliseconds) over stdio and over Streamable
//! HTTP on loopback, and, when `scripts/setup.sh`
//! has installed it, the public reference server `@modelcontextprotocol/server-everything`
//! (Node.js, a typical server). Guest and native rounds alternate in one process so machine
//! noise hits both alike; each figure is the median over rounds of the mean per-call time
//! within a round (spawn: the median of single runs); guest / native is the median of the
//! per-round ratios, each round's pair having run back to back.
//!
//! Run: `cargo bench -p quiver-tests --bench mcp_call`. `QUIVER_BENCH_ROUNDS`,
//! `QUIVER_BENCH_CALLS` and `QUIVER_BENCH_SPAWNS` override the defaults.

use std::time::{Duration, Instant};

use quiver::EgressConfig;
use quiver::HostConfig;
use quiver::{GuestModule, Host, TaskSpec, ToolCallRequest};
use quiver_tests::{FixtureHttp, RegistryDir, wat, workspace};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Map, Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Target {
    server_id: &'static str,
    args: Map<String, Value>,
    /// How to start the server by hand, for the spawn-per-call figure (stdio servers).
    command: Option<Vec<String>>,
}

/// A guest that opens `server_id` and calls `echo` with `args` `calls` times.
fn guest_loop(target: &Target, calls: usize) -> String {
    let args = Value::Object(target.args.clone()).to_string();
    let body = format!(
        r#"(func $main (local $fd i32) (local $i i32)
          (local.set $fd (call $mcp_open (i32.const 1024) (i32.const {id_len})))
          (loop $again
            (call $cap (i32.const 8192) (i32.const 65536))
            (if (i32.lt_s (call $mcp_call_tool (local.get $fd) (i32.const 1100) (i32.const 4) (i32.const 1200) (i32.const {args_len}) (i32.const 16384) (i32.const 8192)) (i32.const 0))
              (then unreachable))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $again (i32.lt_s (local.get $i) (i32.const {calls})))))"#,
        id_len = target.server_id.len(),
        args_len = args.len(),
    );
    wat::guest(
        &[
            (1024, target.server_id.as_bytes()),
            (1100, b"echo"),
            (1200, args.as_bytes()),
        ],
        &body,
    )
}

async fn spawn_per_call(target: &Target) -> Duration {
    let started = Instant::now();
    let command = target.command.as_ref().expect("a stdio target");
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).stderr(std::process::Stdio::null());
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let params = CallToolRequestParams::new("echo").with_arguments(target.args.clone());
    client.call_tool(params).await.unwrap();
    client.cancel().await.unwrap();
    started.elapsed()
}

/// Prints the figures of `target` and returns its median guest latency.
async fn measure(
    host: &Host,
    target: &Target,
    rounds: usize,
    calls: usize,
    spawns: usize,
) -> Duration {
    let module: GuestModule = host
        .load_module("bench.wat", guest_loop(target, calls).as_bytes())
        .unwrap();
    let task = TaskSpec::new("bench")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", target.server_id)
        .with_captured_output();
    let native_round = || async {
        let started = Instant::now();
        for _ in 0..calls {
            let request = ToolCallRequest::new(target.server_id, "echo")
                .with_arguments(Value::Object(target.args.clone()));
            host.call_tool(&task, request).await.unwrap();
        }
        started.elapsed() / calls as u32
    };
    let guest_round = || async {
        let started = Instant::now();
        let outcome = host.run_task(&module, &task).await.unwrap();
        assert!(outcome.success(), "{:?}", outcome.failure);
        started.elapsed() / calls as u32
    };
    // Warm up: connect the server, fill caches, let the CPU settle.
    guest_round().await;
    native_round().await;
    let (mut guest, mut native) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        eprint!("\r{}: round {}/{rounds}", target.server_id, round + 1);
        // Alternate which side goes first, so neither always runs on a warmer machine.
        if round % 2 == 0 {
            guest.push(guest_round().await);
            native.push(native_round().await);
        } else {
            native.push(native_round().await);
            guest.push(guest_round().await);
        }
    }
    let mut spawned = Vec::new();
    for run in 0..if target.command.is_some() { spawns } else { 0 } {
        eprint!("\r{}: spawn {}/{spawns}   ", target.server_id, run + 1);
        spawned.push(spawn_per_call(target).await);
    }
    eprintln!();
    let mut ratios: Vec<f64> = guest
        .iter()
        .zip(&native)
        .map(|(g, n)| micros(*g) / micros(*n))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let paired_ratio = ratios[ratios.len() / 2];
    let (guest, native) = (median(guest), median(native));
    println!(
        "{} echo: median of {rounds} rounds x {calls} calls",
        target.server_id
    );
    println!(
        "  guest  (wasm -> host -> pooled connection) {:>10.1} µs/call",
        micros(guest)
    );
    println!(
        "  native (pool.call_tool, same conn)         {:>10.1} µs/call",
        micros(native)
    );
    println!("  guest / native (median of round pairs)     {paired_ratio:>10.3}x");
    if !spawned.is_empty() {
        let spawned = median(spawned);
        println!(
            "  spawn  (process + handshake per call, {spawns} runs) {:>10.1} µs/call",
            micros(spawned)
        );
        println!(
            "  spawn / guest (pooling speed-up)           {:>10.0}x",
            micros(spawned) / micros(guest)
        );
    }
    guest
}

#[tokio::main]
async fn main() {
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 21);
    let calls = env_usize("QUIVER_BENCH_CALLS", 1000);
    let spawns = env_usize("QUIVER_BENCH_SPAWNS", 11);

    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo"], "");
    let fixture = Target {
        server_id: "fixture",
        args: json!({"text": "hi"}).as_object().unwrap().clone(),
        command: Some(vec![env!("CARGO_BIN_EXE_fixture-mcp-server").to_owned()]),
    };
    let http_server = FixtureHttp::spawn("http", &[]);
    registry.write(
        "fixture-http.toml",
        &format!("server_id = \"fixture-http\"\ntransport = \"streamable_http\"\nallowed_tools = [\"echo\"]\n[http]\nurl = {:?}\n", http_server.url()),
    );
    let fixture_http = Target {
        server_id: "fixture-http",
        args: json!({"text": "hi"}).as_object().unwrap().clone(),
        command: None,
    };
    let everything_bin = workspace().join("fixtures/npm/node_modules/.bin/mcp-server-everything");
    let everything = everything_bin.exists().then(|| {
        registry.write(
            "everything.toml",
            &format!(
                "server_id = \"everything\"\ntransport = \"stdio\"\nallowed_tools = [\"echo\"]\n[stdio]\ncommand = {:?}\n",
                everything_bin.display().to_string()
            ),
        );
        Target {
            server_id: "everything",
            args: json!({"message": "hi"}).as_object().unwrap().clone(),
            command: Some(vec![everything_bin.display().to_string()]),
        }
    });
    let config = HostConfig {
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        },
        ..HostConfig::default()
    };
    let host = quiver_tests::host_builder(&registry)
        .with_config(config, ".")
        .build()
        .unwrap();
    let stdio = measure(&host, &fixture, rounds, calls, spawns).await;
    let http = measure(&host, &fixture_http, rounds, calls, spawns).await;
    println!(
        "fixture over Streamable HTTP / over stdio (guest path): {:.2}x",
        micros(http) / micros(stdio)
    );
    match &everything {
        Some(target) => {
            measure(&host, target, rounds, calls / 4, spawns).await;
        }
        None => println!(
            "(server-everything not installed: run scripts/setup.sh for the Node.js figures)"
        ),
    }
    host.shutdown().await;
}
