//! How many tasks a host with default settings runs at once, at what rate and at what memory
//! cost per task, against bare wasmtime running the same module in the same process.
//!
//! 1. **Per-task overhead**: a task whose entry returns at once, run one after another
//!    through `Host::run_task`, against bare wasmtime (an `InstancePre` on an engine with the
//!    pooling allocator and epoch interruption) instantiating the same module and calling the
//!    same export, with wasmtime's default stack handling and with the host's zeroed stacks.
//!    Each round runs all three, in rotating order; each figure is the median over rounds of
//!    the mean per task, each ratio the median of per-round ratios.
//! 2. **Waiting tasks**: N tasks submitted at once, each calling the fixture server's `slow`
//!    tool over stdio (the guest waits on I/O for `QUIVER_BENCH_SLEEP_MS`). The host keeps
//!    its default capacity and queue, so tasks beyond the capacity queue; when N is larger,
//!    a second host with N slots runs them all at once. The bare baseline runs the same
//!    module with the MCP imports as host functions (the call sleeps as long), all N at once
//!    on a pool sized to N. Memory per task is the peak RSS during the run (`VmHWM` after
//!    resetting it through `/proc/self/clear_refs`, or sampled `VmRSS` where that is not
//!    allowed) minus the RSS before, divided by N. After each host run, `malloc_trim` hands
//!    the allocator's free pages back, so every run starts from the same heap and what the
//!    run kept shows.
//!
//! Run: `cargo bench -p quiver-tests --bench scale`. `QUIVER_BENCH_ROUNDS`,
//! `QUIVER_BENCH_TASKS` (tasks per overhead round), `QUIVER_BENCH_SLEEP_MS` and
//! `QUIVER_BENCH_WAITING` (comma-separated N) override the defaults.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quiver::{GuestModule, Host, TaskSpec, defaults};
use quiver_tests::RegistryDir;
use wasmtime::{
    Caller, Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, Store,
};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The guest of both scenarios: `_start` opens `fixture` and calls `slow` with `ms`; `noop`
/// returns at once.
fn guest(sleep_ms: u64) -> String {
    let args = format!(r#"{{"ms":{sleep_ms}}}"#);
    let escaped: String = args.bytes().map(|b| format!("\\{b:02x}")).collect();
    format!(
        r#"(module
  (import "spear" "mcp_open" (func $mcp_open (param i32 i32) (result i32)))
  (import "spear" "mcp_call_tool" (func $mcp_call_tool (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "fixture")
  (data (i32.const 1100) "slow")
  (data (i32.const 1200) "{escaped}")
  (func (export "_start") (local $fd i32)
    (i32.store (i32.const 8192) (i32.const 4096))
    (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
    (if (i32.lt_s (local.get $fd) (i32.const 0)) (then unreachable))
    (if (i32.lt_s (call $mcp_call_tool (local.get $fd) (i32.const 1100) (i32.const 4) (i32.const 1200) (i32.const {len}) (i32.const 16384) (i32.const 8192)) (i32.const 0))
      (then unreachable)))
  (func (export "noop")))"#,
        len = args.len()
    )
}

/// Bare wasmtime: the module on an engine with the pooling allocator (`slots` slots) and
/// epoch interruption, the MCP imports as plain host functions. `zeroed_stacks` adds the
/// one engine setting in which the host departs from wasmtime's defaults.
struct Bare {
    engine: Engine,
    pre: InstancePre<()>,
}

impl Bare {
    fn new(wat: &str, slots: u32, sleep: Duration, zeroed_stacks: bool) -> Bare {
        let mut pooling = PoolingAllocationConfig::default();
        pooling
            .total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(slots);
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.async_stack_zeroing(zeroed_stacks);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config).unwrap();
        let module = Module::new(&engine, wat).unwrap();
        let mut linker = Linker::new(&engine);
        linker
            .func_wrap("spear", "mcp_open", |_: Caller<'_, ()>, _: i32, _: i32| 3)
            .unwrap();
        linker
            .func_wrap_async(
                "spear",
                "mcp_call_tool",
                move |_: Caller<'_, ()>, _: (i32, i32, i32, i32, i32, i32, i32)| {
                    Box::new(async move {
                        tokio::time::sleep(sleep).await;
                        0i32
                    })
                },
            )
            .unwrap();
        let pre = linker.instantiate_pre(&module).unwrap();
        Bare { engine, pre }
    }

    async fn run(&self, entry: &str) {
        let mut store = Store::new(&self.engine, ());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let func = instance
            .get_typed_func::<(), ()>(&mut store, entry)
            .unwrap();
        func.call_async(&mut store, ()).await.unwrap();
    }
}

/// A field of `/proc/self/status`, in bytes.
fn proc_status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Peak RSS while `run` runs, as a delta over the RSS before it.
struct PeakRss {
    before: u64,
    hwm_reset: bool,
    sampled: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl PeakRss {
    fn start() -> PeakRss {
        // Writing 5 resets VmHWM to the current RSS (Linux 4.0+).
        let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before = proc_status("VmRSS");
        let sampled = Arc::new(AtomicU64::new(before));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = (!hwm_reset).then(|| {
            let (sampled, stop) = (sampled.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    sampled.fetch_max(proc_status("VmRSS"), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        });
        PeakRss {
            before,
            hwm_reset,
            sampled,
            stop,
            sampler,
        }
    }

    /// Peak minus before, and now minus before, in bytes.
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(sampler) = self.sampler.take() {
            sampler.join().unwrap();
        }
        let peak = if self.hwm_reset {
            proc_status("VmHWM")
        } else {
            self.sampled.load(Ordering::SeqCst)
        };
        (
            peak.saturating_sub(self.before),
            proc_status("VmRSS").saturating_sub(self.before),
        )
    }
}

fn kib(bytes: u64, per: usize) -> f64 {
    bytes as f64 / 1024.0 / per as f64
}

/// Mean time per task over `tasks` sequential runs of `one`.
async fn per_task<F: std::future::Future<Output = ()>>(tasks: usize, one: impl Fn() -> F) -> f64 {
    let started = Instant::now();
    for _ in 0..tasks {
        one().await;
    }
    started.elapsed().as_secs_f64() / tasks as f64
}

async fn overhead(host: &Host, module: &GuestModule, wat: &str, rounds: usize, tasks: usize) {
    let task = TaskSpec::new("noop")
        .with_entry("noop")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "fixture");
    let slots = defaults::MAX_CONCURRENT_TASKS;
    let bare = Bare::new(wat, slots, Duration::ZERO, false);
    let bare_zeroed = Bare::new(wat, slots, Duration::ZERO, true);
    let on_host = || async {
        let outcome = host.run_task(module, &task).await.unwrap();
        assert!(outcome.success(), "{:?}", outcome.failure);
    };
    // Columns: host, bare, bare with zeroed stacks.
    let mut samples: [Vec<f64>; 3] = Default::default();
    let mut ratios: [Vec<f64>; 2] = Default::default();
    for round in 0..=rounds {
        eprint!("\roverhead: round {round}/{rounds}");
        let mut row = [0.0; 3];
        // Rotate the order, so no variant always runs on a warmer machine.
        for k in 0..3 {
            let which = (round + k) % 3;
            row[which] = match which {
                0 => per_task(tasks, on_host).await,
                1 => per_task(tasks, || bare.run("noop")).await,
                _ => per_task(tasks, || bare_zeroed.run("noop")).await,
            };
        }
        // Round 0 warms up.
        if round > 0 {
            for (column, value) in samples.iter_mut().zip(row) {
                column.push(value);
            }
            ratios[0].push(row[0] / row[1]);
            ratios[1].push(row[0] / row[2]);
        }
    }
    eprintln!();
    let [h, b, z] = samples.map(median);
    let us = |s: f64| s * 1e6;
    println!(
        "per-task overhead: a task that returns at once, median of {rounds} rounds x {tasks} tasks"
    );
    println!(
        "  host (Host::run_task)                              {:>7.1} µs/task",
        us(h)
    );
    println!(
        "  bare (instantiate + call, same module)             {:>7.1} µs/task",
        us(b)
    );
    println!(
        "  bare with the host's stack zeroing                 {:>7.1} µs/task",
        us(z)
    );
    println!(
        "  host / bare: {:.2}x ({:+.1} µs); host / bare with stack zeroing: {:.2}x ({:+.1} µs)",
        median(ratios[0].clone()),
        us(h - b),
        median(ratios[1].clone()),
        us(h - z)
    );
}

/// Runs `n` waiting tasks on the host, all submitted at once; returns the time they took,
/// the peak RSS over the RSS before, and the RSS kept after they ended: as the process
/// holds it, and after `malloc_trim` gives the allocator's free pages back.
async fn waiting_on_host(
    host: &Host,
    module: &GuestModule,
    n: usize,
) -> (Duration, u64, (u64, u64)) {
    let task = TaskSpec::new("wait")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "fixture");
    let rss = PeakRss::start();
    let rss_before = rss.before;
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (host, module, task) = (host.clone(), module.clone(), task.clone());
        running.spawn(async move { host.run_task(&module, &task).await });
    }
    let mut failed = Vec::new();
    while let Some(done) = running.join_next().await {
        match done.unwrap() {
            Ok(outcome) if outcome.success() => {}
            Ok(outcome) => failed.push(format!("{:?}", outcome.failure)),
            Err(error) => failed.push(error.to_string()),
        }
    }
    let elapsed = started.elapsed();
    let (peak, kept) = rss.finish();
    assert!(
        failed.is_empty(),
        "{} of {n} failed, first: {}",
        failed.len(),
        failed[0]
    );
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    let trimmed = proc_status("VmRSS").saturating_sub(rss_before);
    (elapsed, peak, (kept, trimmed))
}

async fn waiting_on_bare(bare: Arc<Bare>, n: usize) -> (Duration, u64) {
    let rss = PeakRss::start();
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..n {
        let bare = bare.clone();
        running.spawn(async move { bare.run("_start").await });
    }
    while let Some(done) = running.join_next().await {
        done.unwrap();
    }
    (started.elapsed(), rss.finish().0)
}

#[tokio::main]
async fn main() {
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 11);
    let tasks = env_usize("QUIVER_BENCH_TASKS", 2000);
    let sleep_ms = env_usize("QUIVER_BENCH_SLEEP_MS", 2000) as u64;
    let sleep = Duration::from_millis(sleep_ms);
    let waiting: Vec<usize> = std::env::var("QUIVER_BENCH_WAITING")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();

    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow"],
        "[budgets]\nmax_concurrency = 100000\ntool_timeout_ms = 600000\n",
    );
    let vm_before = proc_status("VmSize");
    let built = Instant::now();
    let host = quiver_tests::host_builder(&registry).build().unwrap();
    println!(
        "host with default settings: built in {:.1} ms, {:.2} TiB of address space reserved",
        built.elapsed().as_secs_f64() * 1e3,
        (proc_status("VmSize") - vm_before) as f64 / (1u64 << 40) as f64
    );
    let wat = guest(sleep_ms);
    let module = host.load_module("scale.wat", wat.as_bytes()).unwrap();
    let capacity = host.status().tasks.capacity;
    assert_eq!(capacity, defaults::MAX_CONCURRENT_TASKS);

    overhead(&host, &module, &wat, rounds, tasks).await;

    // Connect the server and fill caches before measuring.
    waiting_on_host(&host, &module, 8).await;
    println!(
        "waiting tasks: each waits {sleep_ms} ms on a tool call; host with default settings \
         ({capacity} running, queue {}), bare with all at once",
        host.status().tasks.queue_capacity
    );
    for &n in &waiting {
        let (h_elapsed, h_rss, h_kept) = waiting_on_host(&host, &module, n).await;
        // Beyond the default capacity, also a host whose capacity is raised to N: what the
        // queue costs against running everything at once.
        let raised = if n > capacity as usize {
            let slots = u32::try_from(n).unwrap();
            let raised = quiver_tests::host_builder(&registry)
                .with_max_concurrent_tasks(slots)
                .build()
                .unwrap();
            let module = raised.load_module("scale.wat", wat.as_bytes()).unwrap();
            waiting_on_host(&raised, &module, 8).await;
            let (elapsed, peak, _) = waiting_on_host(&raised, &module, n).await;
            raised.shutdown().await;
            Some((elapsed, peak))
        } else {
            None
        };
        let bare = Arc::new(Bare::new(&wat, u32::try_from(n).unwrap(), sleep, false));
        let (b_elapsed, b_rss) = waiting_on_bare(bare, n).await;
        let waves = n.div_ceil(capacity as usize);
        let row = |what: &str, elapsed: Duration, rss: u64, waves: usize| {
            let ideal = sleep * waves as u32;
            println!(
                "    {what:<22} {:>6.2} s  {:>6.0} tasks/s  {:>5.2}x the ideal {:>4.1} s ({waves} waves)  {:>6.1} KiB/task",
                elapsed.as_secs_f64(),
                n as f64 / elapsed.as_secs_f64(),
                elapsed.as_secs_f64() / ideal.as_secs_f64(),
                ideal.as_secs_f64(),
                kib(rss, n),
            );
        };
        let ratio = |what: &str, elapsed: Duration, rss: u64| {
            println!(
                "    {what} / bare: {:.2}x the time, {:.2}x the memory per task",
                elapsed.as_secs_f64() / b_elapsed.as_secs_f64(),
                rss as f64 / b_rss.max(1) as f64
            );
        };
        println!("  {n} tasks:");
        row("host (defaults)", h_elapsed, h_rss, waves);
        if let Some((elapsed, rss)) = raised {
            row(&format!("host ({n} slots)"), elapsed, rss, 1);
        }
        row("bare", b_elapsed, b_rss, 1);
        ratio("host (defaults)", h_elapsed, h_rss);
        if let Some((elapsed, rss)) = raised {
            ratio(&format!("host ({n} slots)"), elapsed, rss);
        }
        println!(
            "    kept after the default host's run: {:.1} KiB/task, {:.1} KiB/task after malloc_trim",
            kib(h_kept.0, n),
            kib(h_kept.1, n)
        );
    }
    host.shutdown().await;
}
