//! Latency of one `echo` tool call, three ways:
//!
//! 1. **guest**: a WAT guest calling `mcp_call_tool` in a loop, through the whole host
//!    (ABI decode, fd table, policy, pool, rmcp, stdio, and back into guest memory);
//! 2. **native**: library code calling the same server on the same pooled connection
//!    (`Host::call_tool`: policy, observers, the pool's budgets and rmcp, no wasm);
//! 3. **spawn**: what a naive host does: a fresh server process, MCP handshake and call for
//!    every tool call.
//!
//! Two baselines outside the host, for stdio servers, in the same rounds:
//!
//! - **TS SDK**: the official TypeScript SDK's `Client` over `StdioClientTransport`
//!   (`ts_client.mjs`, a long-lived Node.js process connected once), the client the issue's
//!   target compares against;
//! - **floor**: a blocking line client on `std::process` pipes (a hand-written `initialize`,
//!   then one `tools/call` line and one `read_line` per call, no JSON parse): the pipe round
//!   trip plus the server's own time, the least any client can take;
//! - **floor, the host's lines**: the same client writing the lines the host writes (for a
//!   server that echoes a request's `_meta`: the fixture's `request_meta` tool). At
//!   2026-07-28 every request carries the client's context in `_meta` and there is no
//!   `initialize`, so the server parses a line four times as long per call: its own time
//!   for the host's request, which the first floor leaves out.
//!
//! The guest also runs **spawned** (`tokio::spawn`, as `quiver serve` runs tasks) beside
//! the run on the `block_on` thread. Each row prints the voluntary context switches per
//! call of the process doing the calling (this one, or the Node.js client's), summed over
//! its threads from `/proc/PID/task/*/status`: a count of wakeups that a noisy machine does
//! not blur as it does times. Beside it, the CPU time per call of that process's threads
//! (`/proc/PID/task/*/schedstat`): the client's own work, apart from the server's and the
//! waits.
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
//! `QUIVER_BENCH_CALLS` and `QUIVER_BENCH_SPAWNS` override the defaults;
//! `QUIVER_BENCH_ONLY=everything` (a server id) measures one server only, and
//! `QUIVER_BENCH_ROWS=guest,spawned` (of guest, spawned, native, ts, floor, floor-wire) only
//! those rows,
//! for a profile of them.

use quiver_tests::bench::{context_switches, env_picks, env_usize, median, process_cpu_time};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use quiver::EgressConfig;
use quiver::HostConfig;
use quiver::{GuestModule, Host, TaskSpec, ToolCallRequest};
use quiver_tests::{FixtureHttp, RegistryDir, wat, workspace};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Map, Value, json};

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Target {
    server_id: &'static str,
    args: Map<String, Value>,
    /// How to start the server by hand, for the spawn-per-call figure (stdio servers).
    command: Option<Vec<String>>,
    /// A tool that answers with the `_meta` of its request, to learn the host's lines.
    meta_tool: Option<&'static str>,
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

/// The `_meta` the host sends with a request to `server_id` (its client context, at
/// 2026-07-28), as `tool` reports receiving it, without the per-request progress token.
async fn host_meta(
    host: &Host,
    task: &TaskSpec,
    server_id: &str,
    tool: &str,
) -> Map<String, Value> {
    let output = host
        .call_tool(task, ToolCallRequest::new(server_id, tool))
        .await
        .unwrap();
    let text = output.result.content[0].as_text().expect("a text block");
    let mut meta: Map<String, Value> = serde_json::from_str(&text.text).unwrap();
    meta.remove("progressToken");
    meta
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

/// The MCP handshake and `tools/call` lines written by hand on blocking pipes: the pipe
/// round trip plus the server's own time, with nothing of a client's own.
struct FloorClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: String,
    next_id: u64,
    /// A call's line is `{head}{id}{mid}`, or `{head}{id}{mid}{id}{tail}` when the id is
    /// also the progress token.
    head: &'static str,
    mid: String,
    tail: Option<String>,
}

/// The lines a [`FloorClient`] writes.
enum FloorWire<'a> {
    /// `initialize` at 2025-06-18, then bare `tools/call` lines.
    Handshake,
    /// The host's own: no `initialize` (2026-07-28), and every request with this `_meta`
    /// (the client's context) and a progress token equal to its id, as the host sends it.
    Host(&'a Map<String, Value>),
}

impl FloorClient {
    fn start(command: &[String], tool: &str, args: &Map<String, Value>, wire: FloorWire) -> Self {
        let mut child = std::process::Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        // `"name":..,"arguments":..}}`: the params' last keys and the line's end.
        let rest = format!(r#""name":{},"arguments":{}}}}}"#, json!(tool), json!(args));
        let initialize = matches!(wire, FloorWire::Handshake);
        let (mid, tail, handshake) = match wire {
            FloorWire::Handshake => (
                format!(r#","method":"tools/call","params":{{{rest}"#),
                None,
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"floor","version":"1.0.0"}}}"#.to_owned(),
            ),
            FloorWire::Host(meta) => {
                let entries = Value::Object(meta.clone()).to_string();
                let entries = &entries[1..entries.len() - 1];
                let comma = if entries.is_empty() { "" } else { "," };
                (
                    format!(r#","method":"tools/call","params":{{"_meta":{{{entries}{comma}"progressToken":"#),
                    Some(format!("}},{rest}")),
                    json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": meta}}).to_string(),
                )
            }
        };
        let mut client = Self {
            child,
            stdin,
            stdout,
            line: String::new(),
            next_id: 1,
            head: r#"{"jsonrpc":"2.0","id":"#,
            mid,
            tail,
        };
        client.send(&handshake);
        client.answer();
        if initialize {
            client.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        }
        client
    }

    /// One write per line, as the host writes (two would wake the server twice).
    fn send(&mut self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.stdin.write_all(&bytes).unwrap();
    }

    /// Reads lines until an answer (skipping the server's notifications and requests).
    fn answer(&mut self) {
        loop {
            self.line.clear();
            assert!(
                self.stdout.read_line(&mut self.line).unwrap() > 0,
                "the server exited"
            );
            if self.line.contains("\"result\"") && !self.line.contains("\"method\"") {
                return;
            }
            assert!(!self.line.contains("\"error\""), "{}", self.line);
        }
    }

    fn round(&mut self, calls: usize) -> Duration {
        let started = Instant::now();
        for _ in 0..calls {
            let id = self.next_id;
            let line = match &self.tail {
                Some(tail) => format!("{}{id}{}{id}{tail}", self.head, self.mid),
                None => format!("{}{id}{}", self.head, self.mid),
            };
            self.next_id += 1;
            self.send(&line);
            self.answer();
        }
        started.elapsed() / calls as u32
    }
}

impl Drop for FloorClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The official TypeScript SDK client (`ts_client.mjs`) connected to the server, driven a
/// round at a time over its stdin.
struct TsClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl TsClient {
    /// `None` without Node.js or the SDK (run `scripts/setup.sh`).
    fn start(command: &[String], tool: &str, args: &Map<String, Value>) -> Option<Self> {
        let node_modules = workspace().join("fixtures/npm/node_modules");
        if !node_modules.join("@modelcontextprotocol/sdk").exists() {
            return None;
        }
        let script = workspace().join("tests/benches/ts_client.mjs");
        let mut child = std::process::Command::new("node")
            .arg(script)
            .arg(node_modules)
            .arg(tool)
            .arg(Value::Object(args.clone()).to_string())
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).ok()?;
        (ready.trim() == "ready").then_some(Self {
            child,
            stdin,
            stdout,
        })
    }

    fn round(&mut self, calls: usize) -> Duration {
        writeln!(self.stdin, "{calls}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let micros: f64 = line.trim().parse().expect("µs per call");
        Duration::from_secs_f64(micros / 1e6)
    }
}

impl Drop for TsClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One way of calling, its per-round means, context switches and CPU time per call.
#[derive(Clone, Copy, PartialEq)]
enum Row {
    Guest,
    Spawned,
    Native,
    Ts,
    Floor,
    FloorWire,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Guest => "guest",
            Row::Spawned => "spawned",
            Row::Native => "native",
            Row::Ts => "ts",
            Row::Floor => "floor",
            Row::FloorWire => "floor-wire",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Row::Guest => "guest  (wasm -> host -> pool, block_on)",
            Row::Spawned => "guest  (same, in tokio::spawn)",
            Row::Native => "native (Host::call_tool, same conn)",
            Row::Ts => "TS SDK (Client + StdioClientTransport)",
            Row::Floor => "floor  (blocking pipe line client)",
            Row::FloorWire => "floor  (same, writing the host's lines)",
        }
    }
}

#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    switches: Vec<f64>,
    cpu: Vec<Duration>,
}

/// The median over rounds of `a / b`, each round's pair having run in the same round.
fn paired(a: &Samples, b: &Samples) -> f64 {
    let mut ratios: Vec<f64> = a
        .times
        .iter()
        .zip(&b.times)
        .map(|(a, b)| micros(*a) / micros(*b))
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

/// Prints the figures of `target` and returns its median guest latency (zero without the
/// `guest` row).
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
    let mut ts = target
        .command
        .as_ref()
        .and_then(|command| TsClient::start(command, "echo", &target.args));
    let floor = target
        .command
        .as_ref()
        .map(|command| FloorClient::start(command, "echo", &target.args, FloorWire::Handshake));
    let host_meta = match target.meta_tool {
        Some(tool) => Some(host_meta(host, &task, target.server_id, tool).await),
        None => None,
    };
    let floor_wire = target
        .command
        .as_ref()
        .zip(host_meta.as_ref())
        .map(|(command, meta)| {
            FloorClient::start(command, "echo", &target.args, FloorWire::Host(meta))
        });
    let mut floors = [floor, floor_wire];
    let me = std::process::id();
    let run = async |row: Row, ts: &mut Option<TsClient>, floors: &mut [Option<FloorClient>; 2]| {
        let pid = match (row, &ts) {
            (Row::Ts, Some(ts)) => ts.child.id(),
            _ => me,
        };
        let (switches, cpu) = (context_switches(pid), process_cpu_time(pid));
        let elapsed = match row {
            Row::Guest => {
                let started = Instant::now();
                let outcome = host.run_task(&module, &task).await.unwrap();
                assert!(outcome.success(), "{:?}", outcome.failure);
                started.elapsed() / calls as u32
            }
            Row::Spawned => {
                let (host, module, task) = (host.clone(), module.clone(), task.clone());
                let started = Instant::now();
                let outcome = tokio::spawn(async move { host.run_task(&module, &task).await })
                    .await
                    .unwrap()
                    .unwrap();
                assert!(outcome.success(), "{:?}", outcome.failure);
                started.elapsed() / calls as u32
            }
            Row::Native => {
                let started = Instant::now();
                for _ in 0..calls {
                    let request = ToolCallRequest::new(target.server_id, "echo")
                        .with_arguments(Value::Object(target.args.clone()));
                    host.call_tool(&task, request).await.unwrap();
                }
                started.elapsed() / calls as u32
            }
            Row::Ts => tokio::task::block_in_place(|| ts.as_mut().unwrap().round(calls)),
            Row::Floor | Row::FloorWire => {
                let floor = floors[usize::from(row == Row::FloorWire)].as_mut().unwrap();
                tokio::task::block_in_place(|| floor.round(calls))
            }
        };
        let switches = context_switches(pid).saturating_sub(switches) as f64 / calls as f64;
        let cpu = process_cpu_time(pid).saturating_sub(cpu) / calls as u32;
        (elapsed, switches, cpu)
    };
    // `QUIVER_BENCH_ROWS=guest,spawned` (say) runs only those, for a profile of them.
    let picked = env_picks("QUIVER_BENCH_ROWS");
    let rows: Vec<Row> = [
        Row::Guest,
        Row::Spawned,
        Row::Native,
        Row::Ts,
        Row::Floor,
        Row::FloorWire,
    ]
    .into_iter()
    .filter(|row| match row {
        Row::Ts => ts.is_some(),
        Row::Floor => floors[0].is_some(),
        Row::FloorWire => floors[1].is_some(),
        _ => true,
    })
    .filter(|row| picked(row.name()))
    .collect();
    // Warm up: connect the server, fill caches, let the CPU settle.
    for &row in &rows {
        run(row, &mut ts, &mut floors).await;
    }
    let mut samples: Vec<Samples> = rows.iter().map(|_| Samples::default()).collect();
    for round in 0..rounds {
        eprint!("\r{}: round {}/{rounds}", target.server_id, round + 1);
        // Rotate which row goes first, so none always runs on a warmer machine.
        for i in 0..rows.len() {
            let at = (i + round) % rows.len();
            let (elapsed, switches, cpu) = run(rows[at], &mut ts, &mut floors).await;
            samples[at].times.push(elapsed);
            samples[at].switches.push(switches);
            samples[at].cpu.push(cpu);
        }
    }
    drop((ts, floors));
    let mut spawned = Vec::new();
    for run in 0..if target.command.is_some() { spawns } else { 0 } {
        eprint!("\r{}: spawn {}/{spawns}   ", target.server_id, run + 1);
        spawned.push(spawn_per_call(target).await);
    }
    eprintln!();
    let of = |row: Row| rows.iter().position(|r| *r == row).map(|at| &samples[at]);
    println!(
        "{} echo: median of {rounds} rounds x {calls} calls",
        target.server_id
    );
    for (row, samples) in rows.iter().zip(&samples) {
        let mut switches = samples.switches.clone();
        switches.sort_by(f64::total_cmp);
        println!(
            "  {:<42} {:>8.1} µs/call {:>6.2} ctx switches/call {:>6.1} µs CPU/call",
            row.label(),
            micros(median(samples.times.clone())),
            switches[switches.len() / 2],
            micros(median(samples.cpu.clone())),
        );
    }
    // Each ratio for whichever guest rows ran ("-" for one left out).
    let (guest, spawned_guest) = (of(Row::Guest), of(Row::Spawned));
    if let (Some(guest), Some(native)) = (guest, of(Row::Native)) {
        println!(
            "  guest / native (median of round pairs)     {:>10.3}x",
            paired(guest, native)
        );
    }
    for (name, baseline) in [
        ("TS SDK", of(Row::Ts)),
        ("floor", of(Row::Floor)),
        ("floor, the host's lines", of(Row::FloorWire)),
    ] {
        let Some(baseline) = baseline else { continue };
        let ratio = |side: Option<&Samples>| {
            side.map_or("-".to_owned(), |side| {
                format!("{:.3}x", paired(side, baseline))
            })
        };
        if guest.is_some() || spawned_guest.is_some() {
            let label = format!("guest / {name} (block_on; spawned)");
            println!(
                "  {label:<42} {:>7} {:>7}",
                ratio(guest),
                ratio(spawned_guest)
            );
        }
    }
    let Some(guest) = guest else {
        return Duration::ZERO;
    };
    let guest = median(guest.times.clone());
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
    registry.fixture("fixture", &["echo", "request_meta"], "");
    let fixture = Target {
        server_id: "fixture",
        args: json!({"text": "hi"}).as_object().unwrap().clone(),
        command: Some(vec![env!("CARGO_BIN_EXE_fixture-mcp-server").to_owned()]),
        meta_tool: Some("request_meta"),
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
        meta_tool: None,
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
            meta_tool: None,
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
    let only = std::env::var("QUIVER_BENCH_ONLY").ok();
    let wanted = |target: &Target| only.as_deref().is_none_or(|id| id == target.server_id);
    if wanted(&fixture) && wanted(&fixture_http) {
        let stdio = measure(&host, &fixture, rounds, calls, spawns).await;
        let http = measure(&host, &fixture_http, rounds, calls, spawns).await;
        // Zero when the `guest` row was left out.
        if !stdio.is_zero() && !http.is_zero() {
            println!(
                "fixture over Streamable HTTP / over stdio (guest path): {:.2}x",
                micros(http) / micros(stdio)
            );
        }
    } else {
        for target in [&fixture, &fixture_http].into_iter().filter(|t| wanted(t)) {
            measure(&host, target, rounds, calls, spawns).await;
        }
    }
    match &everything {
        Some(target) if wanted(target) => {
            measure(&host, target, rounds, calls / 4, spawns).await;
        }
        Some(_) => {}
        None => println!(
            "(server-everything not installed: run scripts/setup.sh for the Node.js figures)"
        ),
    }
    host.shutdown().await;
}
