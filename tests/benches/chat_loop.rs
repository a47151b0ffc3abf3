//! Host-side overhead of one tool-call loop iteration: a model turn that calls a guest tool
//! and an MCP tool, followed by the final answer, against a local scripted OpenAI-wire
//! server and the fixture MCP server.
//!
//! Each round, a WAT guest makes `SENDS` AUTO_TOOL_CALL sends (each: 2 LLM requests, 1 guest
//! tool, 1 MCP call). The baseline, in the same process and round, makes the same HTTP
//! requests with the same bodies directly (reqwest) and the same MCP call on the same pooled
//! connection. Their difference, per send, is what the host adds: the ABI, building the
//! tool set, request bodies, routing, the guest tool call through the funcref table and the
//! tool arena, and the bookkeeping. The figure is the median over rounds of each round's
//! difference. The runs of a round take turns at going first (see `main`).
//!
//! Each round also runs the guest once more with OpenTelemetry export on (the node's
//! exporter, `quiver_node::telemetry`, sending to a local OTLP sink that answers 200), so
//! the cost of tracing shows as the ratio of the two, in the same process and round. The
//! export layer is installed once and switched by a flag its filter reads.
//!
//! The guest and the baseline also run once each in `tokio::spawn`, on a worker thread, as
//! `quiver run` and `quiver serve` run tasks ("on a worker").
//!
//! Each side's heap allocations per send are counted too (`CountingAllocator`, every thread
//! but the in-process servers'): a figure the machine's noise does not blur. So is the
//! instruction count that `scripts/bench-instructions.sh` takes with callgrind.
//!
//! Run: `cargo bench -p quiver-tests --bench chat_loop` (`QUIVER_BENCH_ROUNDS`,
//! `QUIVER_BENCH_SENDS` override the defaults; `QUIVER_BENCH_PROFILE=host`, `baseline`,
//! `host-on-worker` or `baseline-on-worker` runs only that side's sends, with no report, to
//! profile it; `QUIVER_BENCH_TASK_SLOTS` shrinks the task pool, for Valgrind).

use quiver_tests::bench::{
    CountingAllocator, allocations, context_switches, cpu_time, env_usize, median,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quiver::{TaskSpec, ToolCallRequest};
use quiver_tests::chat_wat::scripted_host_builder;
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::serve::{BackgroundServer, Bound};
use quiver_tests::{RegistryDir, wat};
use serde_json::{Value, json};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Whether spans go to the exporter (the "on" runs of each round).
static EXPORT: AtomicBool = AtomicBool::new(false);

/// A local OTLP/HTTP receiver that accepts every export (an empty
/// `ExportTraceServiceResponse`), and the exporter sending to it, switched by [`EXPORT`].
async fn export_on_switch() -> (BackgroundServer, quiver_node::telemetry::Telemetry) {
    let sink = Bound::new("otlp-sink").serve(
        "otlp-sink",
        axum::Router::new()
            .fallback(|| async { ([("content-type", "application/x-protobuf")], "") }),
    );
    let endpoint = format!("http://{}", sink.addr());
    let settings = quiver_node::telemetry::TelemetryConfig {
        endpoint: Some(endpoint),
        ..Default::default()
    }
    .resolve_with(|_| None)
    .unwrap()
    .unwrap();
    let (telemetry, layer) = quiver_node::telemetry::Telemetry::start(&settings).unwrap();
    let layer = layer.with_filter(tracing_subscriber::filter::filter_fn(|_| {
        EXPORT.load(Ordering::Relaxed)
    }));
    tracing_subscriber::registry().with(layer).init();
    (sink, telemetry)
}

fn guest(sends: usize) -> String {
    let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}).to_string();
    let arena_ptr = r#"{"key":"tool_arena_ptr","value":196608}"#;
    let arena_len = r#"{"key":"tool_arena_len","value":16384}"#;
    let body = format!(
        r#"
  (table (export "__indirect_function_table") 2 funcref)
  (elem (i32.const 1) $weather)
  (func $weather (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (memory.copy (local.get $o) (i32.const 99000) (i32.const 10))
    (i32.store (local.get $ol) (i32.const 10))
    (i32.const 0))
  (func $ctl (param $s i32) (param $p i32) (param $l i32)
    (call $cap (i32.const 8192) (local.get $l))
    (if (i32.lt_s (call $cchat_ctl (local.get $s) (i32.const 1) (local.get $p) (i32.const 8192)) (i32.const 0)) (then unreachable)))
  (func $main (local $s i32) (local $r i32) (local $i i32)
    (loop $again
      (local.set $s (call $cchat_create))
      (drop (call $cchat_write_msg (local.get $s) (i32.const 100000) (i32.const 4) (i32.const 100016) (i32.const 5)))
      (if (i32.lt_s (call $cchat_write_fn (local.get $s) (i32.const 1) (i32.const 100100) (i32.const {tool_len})) (i32.const 0)) (then unreachable))
      (call $ctl (local.get $s) (i32.const 100400) (i32.const {ptr_len}))
      (call $ctl (local.get $s) (i32.const 100500) (i32.const {len_len}))
      (local.set $r (call $cchat_send (local.get $s) (i32.const 2)))
      (if (i32.lt_s (local.get $r) (i32.const 0)) (then unreachable))
      (drop (call $cchat_close (local.get $r)))
      (drop (call $cchat_close (local.get $s)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_s (local.get $i) (i32.const {sends})))))"#,
        tool_len = tool.len(),
        ptr_len = arena_ptr.len(),
        len_len = arena_len.len(),
    );
    let data: Vec<(u32, &[u8])> = vec![
        (99_000, b"Sunny, 21C"),
        (100_000, b"user"),
        (100_016, b"hello"),
        (100_100, tool.as_bytes()),
        (100_400, arena_ptr.as_bytes()),
        (100_500, arena_len.as_bytes()),
    ];
    wat::guest(&data, &body)
}

/// The baseline's calls: the host's two request bodies sent with reqwest, and the MCP call.
#[derive(Clone)]
struct Direct {
    http: reqwest::Client,
    url: String,
    bodies: Vec<Value>,
    host: quiver::Host,
    task: TaskSpec,
    add: ToolCallRequest,
}

async fn baseline_sends(direct: &Direct, sends: usize) {
    for _ in 0..sends {
        for body in &direct.bodies {
            let reply: Value = direct
                .http
                .post(&direct.url)
                .json(body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(reply["choices"].is_array());
        }
        direct
            .host
            .call_tool(&direct.task, direct.add.clone())
            .await
            .unwrap();
    }
}

/// The guest run in `tokio::spawn`, on a worker thread, as `quiver run` and `quiver serve`
/// run tasks.
async fn host_on_worker(
    host: &quiver::Host,
    module: &quiver::GuestModule,
    task: &TaskSpec,
) -> quiver::TaskOutcome {
    let (host, module, task) = (host.clone(), module.clone(), task.clone());
    tokio::spawn(async move { host.run_task(&module, &task).await.unwrap() })
        .await
        .unwrap()
}

/// The baseline's sends in `tokio::spawn`, placed like [`host_on_worker`]'s guest.
async fn baseline_on_worker(direct: &Direct, sends: usize) {
    let direct = direct.clone();
    tokio::spawn(async move { baseline_sends(&direct, sends).await })
        .await
        .unwrap()
}

/// The ways a round runs the sends, in the order of its samples.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    /// The guest on the `block_on` thread, as an embedder may call `run_task`.
    Host,
    /// The same, with trace export on.
    HostExported,
    /// The same HTTP and MCP calls, direct, on the `block_on` thread.
    Baseline,
    HostOnWorker,
    BaselineOnWorker,
}

const RUNS: [Run; 5] = [
    Run::Host,
    Run::HostExported,
    Run::Baseline,
    Run::HostOnWorker,
    Run::BaselineOnWorker,
];

/// One run's figures, per send.
struct Sample {
    micros: f64,
    /// Voluntary context switches of this process: each is a wait handed to another
    /// thread and back, which the machine's noise does not blur.
    switches: f64,
    /// Heap allocations outside the scripted LLM server: a count, not a time.
    allocations: f64,
    /// CPU time of this process (the scripted LLM server included), and of the thread
    /// that ran the sends (for the runs on a worker, the `block_on` thread: not theirs).
    process_cpu: f64,
    thread_cpu: f64,
}

fn script_one_send(llm: &ScriptedLlm) {
    llm.push(Reply::tool_calls([
        ("w", "get_weather", json!({"city": "Paris"})),
        ("a", "mcp__fixture__add", json!({"a": 2, "b": 3})),
    ]));
    llm.push(Reply::text("done"));
}

#[tokio::main]
async fn main() {
    // Enough rounds that the median holds still: at 11 it spread from 7 to 66 µs on a worker
    // in one afternoon, at 41 from 39 to 46 (BENCHMARKS.md, twelfth look).
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 41);
    let sends = env_usize("QUIVER_BENCH_SENDS", 50);

    let (_sink, telemetry) = export_on_switch().await;
    let llm = ScriptedLlm::start(vec![]).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add"], "");
    // `QUIVER_BENCH_TASK_SLOTS` shrinks the pool's reservation (default 5000 slots), which
    // Valgrind cannot map: `valgrind --tool=callgrind` counts instructions, which the
    // machine's noise does not change.
    let slots = env_usize("QUIVER_BENCH_TASK_SLOTS", 0);
    let mut builder = scripted_host_builder(&registry, &llm);
    if slots > 0 {
        builder = builder.with_max_concurrent_tasks(slots as u32);
    }
    let host = builder.build().unwrap();
    let module = host
        .load_module("chat-bench.wat", guest(sends).as_bytes())
        .unwrap();
    let task = TaskSpec::new("bench")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "fixture")
        .with_captured_output();
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", llm.base_url());

    // Warm up, and capture the exact bodies the host sends, for the baseline.
    for _ in 0..sends {
        script_one_send(&llm);
    }
    let outcome = host.run_task(&module, &task).await.unwrap();
    assert!(
        outcome.success(),
        "{:?} {}",
        outcome.failure,
        outcome.stderr_text()
    );
    let bodies: Vec<Value> = llm.requests().into_iter().take(2).collect();
    let add = ToolCallRequest::new("fixture", "add").with_arguments(json!({"a": 2, "b": 3}));

    let direct = Direct {
        http,
        url,
        bodies,
        host: host.clone(),
        task: task.clone(),
        add,
    };
    // Profiling one side (`perf record` this): only its runs, and no report.
    if let Ok(side) = std::env::var("QUIVER_BENCH_PROFILE") {
        for _ in 0..rounds {
            for _ in 0..sends {
                script_one_send(&llm);
            }
            match side.as_str() {
                "host" => assert!(host.run_task(&module, &task).await.unwrap().success()),
                "host-on-worker" => assert!(host_on_worker(&host, &module, &task).await.success()),
                "baseline-on-worker" => baseline_on_worker(&direct, sends).await,
                _ => baseline_sends(&direct, sends).await,
            }
        }
        return;
    }

    // Each round runs the five ways in turn, starting one further along each round: the
    // first run of a round finds the caches and the parked workers as the last round's
    // last run left them, and no way should always pay for that.
    let mut samples: [Vec<Sample>; RUNS.len()] = Default::default();
    let pid = std::process::id();
    for round in 0..rounds {
        eprint!("\rround {}/{rounds}", round + 1);
        for k in 0..RUNS.len() {
            let at = (round + k) % RUNS.len();
            for _ in 0..sends {
                script_one_send(&llm);
            }
            let switches = context_switches(pid);
            let (process, thread, allocated) = (cpu_time(false), cpu_time(true), allocations());
            let started = Instant::now();
            match RUNS[at] {
                Run::Host | Run::HostExported => {
                    EXPORT.store(RUNS[at] == Run::HostExported, Ordering::Relaxed);
                    let outcome = host.run_task(&module, &task).await.unwrap();
                    EXPORT.store(false, Ordering::Relaxed);
                    assert!(outcome.success());
                }
                Run::Baseline => baseline_sends(&direct, sends).await,
                Run::HostOnWorker => assert!(host_on_worker(&host, &module, &task).await.success()),
                Run::BaselineOnWorker => baseline_on_worker(&direct, sends).await,
            }
            let per_send = |total: f64| total / sends as f64;
            samples[at].push(Sample {
                micros: per_send(started.elapsed().as_secs_f64() * 1e6),
                switches: per_send(context_switches(pid).saturating_sub(switches) as f64),
                allocations: per_send((allocations() - allocated) as f64),
                process_cpu: per_send((cpu_time(false) - process).as_secs_f64() * 1e6),
                thread_cpu: per_send((cpu_time(true) - thread).as_secs_f64() * 1e6),
            });
        }
    }
    eprintln!();
    host.shutdown().await;
    telemetry.shutdown(Duration::from_secs(3)).await;
    let [host_runs, exported, baseline, host_worker, baseline_worker] = &samples;
    let of = |runs: &[Sample], field: fn(&Sample) -> f64| median(runs.iter().map(field).collect());
    // Per round, one side minus the other: both ran in the same round.
    let overhead = |host: &[Sample], baseline: &[Sample]| {
        median(
            host.iter()
                .zip(baseline)
                .map(|(h, b)| h.micros - b.micros)
                .collect(),
        )
    };
    let micros = |s: &Sample| s.micros;
    println!(
        "chat loop, median of {rounds} rounds x {sends} sends (1 iteration with a guest tool and an MCP tool + the final answer)"
    );
    println!(
        "  through the host (guest send)            {:>10.1} µs/send",
        of(host_runs, micros)
    );
    println!(
        "  baseline (same HTTP + MCP calls direct)  {:>10.1} µs/send",
        of(baseline, micros)
    );
    println!(
        "  host-side overhead per iteration         {:>10.1} µs",
        overhead(host_runs, baseline)
    );
    println!(
        "  on a worker thread (tokio::spawn), host / baseline {:>6.1} / {:.1} µs/send",
        of(host_worker, micros),
        of(baseline_worker, micros)
    );
    println!(
        "  host-side overhead per iteration, on a worker {:>5.1} µs",
        overhead(host_worker, baseline_worker)
    );
    println!(
        "  context switches per send, host / baseline {:>6.1} / {:.1}",
        of(host_runs, |s| s.switches),
        of(baseline, |s| s.switches)
    );
    println!(
        "  heap allocations per send, host / baseline {:>6.1} / {:.1}",
        of(host_runs, |s| s.allocations),
        of(baseline, |s| s.allocations)
    );
    println!(
        "  CPU per send, host / baseline: process {:.1} / {:.1} µs, its thread {:.1} / {:.1} µs",
        of(host_runs, |s| s.process_cpu),
        of(baseline, |s| s.process_cpu),
        of(host_runs, |s| s.thread_cpu),
        of(baseline, |s| s.thread_cpu)
    );
    println!(
        "  through the host, trace export on        {:>10.1} µs/send",
        of(exported, micros)
    );
    println!(
        "  host-side overhead, export on            {:>10.1} µs",
        overhead(exported, baseline)
    );
    println!(
        "  export on / off per send                 {:>10.3}",
        median(
            exported
                .iter()
                .zip(host_runs)
                .map(|(on, off)| on.micros / off.micros)
                .collect()
        )
    );
}
