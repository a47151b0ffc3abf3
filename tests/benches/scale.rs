//! How many tasks a host with default settings runs at once, at what rate and at what memory
//! cost per task, against bare wasmtime running the same module in the same process.
//!
//! 1. **Per-task overhead**: a task whose entry returns at once, run one after another
//!    through `Host::run_task`, against bare wasmtime (an `InstancePre` on an engine with the
//!    pooling allocator and epoch interruption) instantiating the same module and calling the
//!    same export: with wasmtime's default settings, and with the host's (zeroed stacks,
//!    `defaults::TASK_KEEP_RESIDENT` of each stack and memory reset in place). A second host
//!    and a third bare engine keep nothing resident (`with_keep_resident(0)`, the host before
//!    that setting). A module that also imports WASI (as every Rust or C guest does) runs on
//!    the host and on bare wasmtime with the host's settings and a WASI context per store.
//!    Each round runs all seven, in rotating order; each figure is the median
//!    over rounds of the mean per task, each ratio the median of per-round ratios.
//! 2. **Waiting tasks**: N tasks submitted at once, each calling the fixture server's `slow`
//!    tool over stdio (the guest waits on I/O for `QUIVER_BENCH_SLEEP_MS`). The host keeps
//!    its default capacity and queue, so tasks beyond the capacity queue; when N is larger,
//!    a second host with N slots runs them all at once, and (past 4096) a third with N slots
//!    and the host-wide MCP call cap of 4096 it had before the cap followed the slots. The
//!    bare baseline runs the same
//!    module with the MCP imports as host functions (the call sleeps as long), all N at once
//!    on a pool sized to N. Memory per task is the peak RSS during the run (`VmHWM` after
//!    resetting it through `/proc/self/clear_refs`, or sampled `VmRSS` where that is not
//!    allowed) minus the RSS before, divided by N. Halfway through the first wave,
//!    `/proc/self/smaps` splits what grew into fiber stacks, linear memory and the rest
//!    (heap), per running task. After each host run, `malloc_trim` hands the allocator's
//!    free pages back, so every run starts from the same heap and what the run kept shows.
//!
//!    Next to the blocking `mcp_call_tool` guest, the same host runs a guest that waits the
//!    other way (issue 23): it starts the call with `mcp_call_start`, adds the call's fd to
//!    an epoll set and blocks in `spear_epoll_wait`, then reads the answer.
//!
//! Run: `cargo bench -p quiver-tests --bench scale`. `QUIVER_BENCH_ROUNDS` (0 skips part 1),
//! `QUIVER_BENCH_TASKS` (tasks per overhead round), `QUIVER_BENCH_START_ROWS` (part 1's rows
//! to run, comma-separated, for profiling one: `host`, `host0`, `bare`, `bare_host`,
//! `bare0`, `host_wasi`, `bare_wasi`), `QUIVER_BENCH_SLEEP_MS` and `QUIVER_BENCH_WAITING`
//! (comma-separated N; empty skips part 2) override the defaults. `QUIVER_BENCH_ROWS` picks
//! part 2's rows (comma-separated, default all): `host` (defaults, blocking call), `epoll`
//! (defaults, the epoll wait), `slots` (N slots), `capped` (N slots, the old call cap) and
//! `bare`. `QUIVER_BENCH_KEEP_RESIDENT` (bytes) sets the default hosts'
//! `with_keep_resident`, to weigh that setting. The report leaves out the rows not run.

use quiver_tests::bench::{env_picks, env_usize, median};
use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quiver::{GuestModule, Host, TaskSpec, defaults};
use quiver_tests::RegistryDir;
use wasmtime::{
    Caller, Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, Store,
};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;

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

/// The guest of the epoll row: `_start` opens `fixture`, starts `slow` with `ms` through
/// `mcp_call_start`, waits for the call's fd in `spear_epoll_wait` and reads the answer.
fn epoll_guest(sleep_ms: u64) -> String {
    let args = format!(r#"{{"ms":{sleep_ms}}}"#);
    let escaped: String = args.bytes().map(|b| format!("\\{b:02x}")).collect();
    format!(
        r#"(module
  (import "spear" "mcp_open" (func $mcp_open (param i32 i32) (result i32)))
  (import "spear" "mcp_call_start" (func $mcp_call_start (param i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_call_recv" (func $mcp_call_recv (param i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_create" (func $epoll_create (result i32)))
  (import "spear" "spear_epoll_ctl" (func $epoll_ctl (param i32 i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_wait" (func $epoll_wait (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "fixture")
  (data (i32.const 1100) "slow")
  (data (i32.const 1200) "{escaped}")
  (func (export "_start") (local $fd i32) (local $call i32) (local $ep i32)
    (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
    (if (i32.lt_s (local.get $fd) (i32.const 0)) (then unreachable))
    (local.set $call (call $mcp_call_start (local.get $fd) (i32.const 1100) (i32.const 4) (i32.const 1200) (i32.const {len})))
    (if (i32.lt_s (local.get $call) (i32.const 0)) (then unreachable))
    (local.set $ep (call $epoll_create))
    (if (i32.lt_s (local.get $ep) (i32.const 0)) (then unreachable))
    ;; ADD the call's fd for EPOLLIN, then wait without a timeout: one record, the call.
    (if (call $epoll_ctl (local.get $ep) (i32.const 1) (local.get $call) (i32.const 1)) (then unreachable))
    (i32.store (i32.const 8192) (i32.const 64))
    (if (i32.ne (call $epoll_wait (local.get $ep) (i32.const 8200) (i32.const 8192) (i32.const -1)) (i32.const 1))
      (then unreachable))
    (i32.store (i32.const 8192) (i32.const 4096))
    (if (i32.lt_s (call $mcp_call_recv (local.get $call) (i32.const 16384) (i32.const 8192)) (i32.const 0))
      (then unreachable))))"#,
        len = args.len()
    )
}

/// The engine settings of a [`Bare`] run, beyond the pooling allocator and epochs.
#[derive(Clone, Copy)]
enum Settings {
    /// wasmtime's defaults: stacks keep their contents, memories are given back whole.
    Wasmtime,
    /// The host's: stacks zeroed, `keep_resident` bytes of each stack and memory reset in
    /// place (memories through PAGEMAP_SCAN), the rest given back to the kernel.
    Host { keep_resident: usize },
}

/// Bare wasmtime: the module on an engine with the pooling allocator (`slots` slots) and
/// epoch interruption, the MCP imports as plain host functions; each store's data made by
/// `data` (a WASI context for a module that imports WASI).
struct Bare<T: 'static> {
    engine: Engine,
    pre: InstancePre<T>,
    data: fn() -> T,
}

impl Bare<()> {
    fn new(wat: &str, slots: u32, sleep: Duration, settings: Settings) -> Bare<()> {
        Bare::with_data(wat, slots, sleep, settings, || (), |_| Ok(()))
    }
}

impl Bare<WasiP1Ctx> {
    /// A WASI preview 1 context per store, as the host grants one by default: argv[0], the
    /// process's stdout and stderr.
    fn with_wasi(wat: &str, slots: u32, settings: Settings) -> Bare<WasiP1Ctx> {
        Bare::with_data(
            wat,
            slots,
            Duration::ZERO,
            settings,
            || {
                WasiCtxBuilder::new()
                    .arg("scale.wat")
                    .inherit_stdout()
                    .inherit_stderr()
                    .build_p1()
            },
            |linker| wasmtime_wasi::p1::add_to_linker_async(linker, |ctx| ctx),
        )
    }
}

impl<T: Send + 'static> Bare<T> {
    fn with_data(
        wat: &str,
        slots: u32,
        sleep: Duration,
        settings: Settings,
        data: fn() -> T,
        more_imports: impl FnOnce(&mut Linker<T>) -> wasmtime::Result<()>,
    ) -> Bare<T> {
        let mut pooling = PoolingAllocationConfig::default();
        pooling
            .total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(slots);
        let mut config = Config::new();
        config.epoch_interruption(true);
        if let Settings::Host { keep_resident } = settings {
            config.async_stack_zeroing(true);
            pooling
                .async_stack_keep_resident(keep_resident)
                .linear_memory_keep_resident(keep_resident)
                .pagemap_scan(wasmtime::Enabled::Auto);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config).unwrap();
        let module = Module::new(&engine, wat).unwrap();
        let mut linker = Linker::new(&engine);
        linker
            .func_wrap("spear", "mcp_open", |_: Caller<'_, T>, _: i32, _: i32| 3)
            .unwrap();
        linker
            .func_wrap_async(
                "spear",
                "mcp_call_tool",
                move |_: Caller<'_, T>, _: (i32, i32, i32, i32, i32, i32, i32)| {
                    Box::new(async move {
                        tokio::time::sleep(sleep).await;
                        0i32
                    })
                },
            )
            .unwrap();
        more_imports(&mut linker).unwrap();
        let pre = linker.instantiate_pre(&module).unwrap();
        Bare { engine, pre, data }
    }

    async fn run(&self, entry: &str) {
        let mut store = Store::new(&self.engine, (self.data)());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let func = instance
            .get_typed_func::<(), ()>(&mut store, entry)
            .unwrap();
        func.call_async(&mut store, ()).await.unwrap();
    }
}

/// `wat` importing one WASI function as well, as every Rust or C guest imports WASI.
fn with_wasi_import(wat: &str) -> String {
    wat.replacen(
        "(module",
        "(module\n  (import \"wasi_snapshot_preview1\" \"proc_exit\" (func (param i32)))",
        1,
    )
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

/// Resident memory by where it lives, from `/proc/self/smaps`, in bytes.
#[derive(Clone, Copy, Default)]
struct Resident {
    /// Fiber stacks: 2 MiB read-write mappings right above a 4 KiB guard page (each pooled
    /// stack is two mappings once its guard page is protected).
    stacks: u64,
    /// Linear memories: mappings inside a reservation of more than 64 GiB (the memory pool).
    memories: u64,
    /// Every other anonymous page: the heap (malloc arenas), thread stacks, tokio.
    heap: u64,
    /// Page tables (`VmPTE`): not part of RSS, counted separately.
    page_tables: u64,
}

impl Resident {
    fn now() -> Resident {
        struct Vma {
            start: u64,
            end: u64,
            guard: bool,
            writable: bool,
            rss: u64,
            anonymous: u64,
        }
        // Read line by line: read whole, the file (about 16 MB with a default host's 15 000
        // mappings) was itself most of the heap the run's peak RSS counted per task.
        let smaps = std::fs::File::open("/proc/self/smaps").map(std::io::BufReader::new);
        let kb = |v: &str| {
            v.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
                * 1024
        };
        let mut vmas: Vec<Vma> = Vec::new();
        for line in smaps
            .into_iter()
            .flat_map(|s| s.lines().map_while(Result::ok))
        {
            let line = line.as_str();
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or_default();
            if let Some((start, end)) = first.split_once('-')
                && let (Ok(start), Ok(end)) =
                    (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                let perms = words.next().unwrap_or_default();
                vmas.push(Vma {
                    start,
                    end,
                    guard: perms.starts_with("---"),
                    writable: perms.starts_with("rw"),
                    rss: 0,
                    anonymous: 0,
                });
            } else if let Some(vma) = vmas.last_mut() {
                if let Some(v) = line.strip_prefix("Rss:") {
                    vma.rss = kb(v);
                } else if let Some(v) = line.strip_prefix("Anonymous:") {
                    vma.anonymous = kb(v);
                }
            }
        }
        let mut resident = Resident {
            page_tables: proc_status("VmPTE"),
            ..Resident::default()
        };
        // Runs of adjacent mappings; a run spanning more than 64 GiB holds a memory pool.
        let mut run_start = 0;
        for i in 0..=vmas.len() {
            if i < vmas.len() && i > run_start && vmas[i].start == vmas[i - 1].end {
                continue;
            }
            if run_start < i {
                let run = &vmas[run_start..i];
                let span = run[run.len() - 1].end - run[0].start;
                let stack = |k: usize| {
                    let vma = &run[k];
                    vma.writable
                        && vma.end - vma.start == defaults::TASK_STACK_BYTES as u64
                        && k > 0
                        && run[k - 1].guard
                        && run[k - 1].end - run[k - 1].start == 4096
                };
                // A slot's linear memory is followed by the inaccessible rest of its slot
                // (gigabytes): malloc's thread arenas (64 MiB each) can sit right next to
                // the pool, in the same run, and are heap.
                let big_none = |k: usize| run[k].guard && run[k].end - run[k].start >= 1 << 30;
                let last_big_none = (0..run.len()).rev().find(|&k| big_none(k));
                let first_pool = (0..run.len()).find(|&k| big_none(k) || stack(k));
                for (k, vma) in run.iter().enumerate() {
                    // The stack pool may sit right next to the memory pool, in one run.
                    if stack(k) {
                        resident.stacks += vma.rss;
                    } else if span > 64 << 30
                        && first_pool.is_some_and(|first| first < k)
                        && last_big_none.is_some_and(|last| k < last)
                    {
                        resident.memories += vma.rss;
                    } else {
                        resident.heap += vma.anonymous;
                    }
                }
            }
            run_start = i;
        }
        resident
    }

    /// What grew since `before`, per task.
    fn line(&self, before: &Resident, n: usize) -> String {
        let per = |now: u64, was: u64| kib(now.saturating_sub(was), n);
        format!(
            "stacks {:.1}, linear memory {:.1}, other anonymous (heap) {:.1} KiB/task; page tables {:.1} KiB/task (not in RSS)",
            per(self.stacks, before.stacks),
            per(self.memories, before.memories),
            per(self.heap, before.heap),
            per(self.page_tables, before.page_tables),
        )
    }
}

/// Reads [`Resident`] `after` from now, in the middle of a run of waiting tasks.
fn resident_after(after: Duration) -> tokio::task::JoinHandle<Resident> {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        tokio::task::spawn_blocking(Resident::now).await.unwrap()
    })
}

/// Mean time per task over `tasks` sequential runs of `one`.
async fn per_task<F: std::future::Future<Output = ()>>(tasks: usize, one: impl Fn() -> F) -> f64 {
    let started = Instant::now();
    for _ in 0..tasks {
        one().await;
    }
    started.elapsed().as_secs_f64() / tasks as f64
}

async fn overhead(
    host: &Host,
    kept_nothing: &Host,
    module: &GuestModule,
    wat: &str,
    rounds: usize,
    tasks: usize,
) {
    let task = TaskSpec::new("noop")
        .with_entry("noop")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "fixture");
    let old_module = kept_nothing
        .load_module("scale.wat", wat.as_bytes())
        .unwrap();
    let wasi_wat = with_wasi_import(wat);
    let wasi_module = host
        .load_module("scale-wasi.wat", wasi_wat.as_bytes())
        .unwrap();
    let slots = defaults::MAX_CONCURRENT_TASKS;
    let keep_resident = defaults::TASK_KEEP_RESIDENT;
    let bare = Bare::new(wat, slots, Duration::ZERO, Settings::Wasmtime);
    let bare_host = Bare::new(wat, slots, Duration::ZERO, Settings::Host { keep_resident });
    let bare_nothing = Bare::new(
        wat,
        slots,
        Duration::ZERO,
        Settings::Host { keep_resident: 0 },
    );
    let bare_wasi = Bare::with_wasi(&wasi_wat, slots, Settings::Host { keep_resident });
    const VARIANTS: usize = 7;
    const VARIANT_NAMES: [&str; VARIANTS] = [
        "host",
        "host0",
        "bare",
        "bare_host",
        "bare0",
        "host_wasi",
        "bare_wasi",
    ];
    // Only some rows, to profile one; the report leaves the others out.
    let start_row_on = env_picks("QUIVER_BENCH_START_ROWS");
    let mut samples: [Vec<f64>; VARIANTS] = Default::default();
    // host / bare, host / bare with the host's settings, the same two kept nothing, and the
    // module importing WASI on both.
    let mut ratios: [Vec<f64>; 5] = Default::default();
    for round in 0..=rounds {
        eprint!("\roverhead: round {round}/{rounds}");
        let mut row = [0.0; VARIANTS];
        // Rotate the order, so no variant always runs on a warmer machine.
        for k in 0..VARIANTS {
            let which = (round + k) % VARIANTS;
            if !start_row_on(VARIANT_NAMES[which]) {
                continue;
            }
            row[which] = match which {
                // Borrowed, as bare's module is: a clone per task would be the bench's own cost.
                0 => per_task(tasks, || run_noop(host, module, &task)).await,
                1 => per_task(tasks, || run_noop(kept_nothing, &old_module, &task)).await,
                2 => per_task(tasks, || bare.run("noop")).await,
                3 => per_task(tasks, || bare_host.run("noop")).await,
                4 => per_task(tasks, || bare_nothing.run("noop")).await,
                5 => per_task(tasks, || run_noop(host, &wasi_module, &task)).await,
                _ => per_task(tasks, || bare_wasi.run("noop")).await,
            };
        }
        // Round 0 warms up.
        if round > 0 {
            for (column, value) in samples.iter_mut().zip(row) {
                column.push(value);
            }
            ratios[0].push(row[0] / row[2]);
            ratios[1].push(row[0] / row[3]);
            ratios[2].push(row[1] / row[2]);
            ratios[3].push(row[1] / row[4]);
            ratios[4].push(row[5] / row[6]);
        }
    }
    eprintln!();
    let medians = samples.map(median);
    let us = |s: f64| s * 1e6;
    println!(
        "per-task overhead: a task that returns at once, median of {rounds} rounds x {tasks} tasks"
    );
    let k = keep_resident / 1024;
    let labels: [String; VARIANTS] = [
        format!("host (Host::run_task), keeps {k} KiB"),
        "host with keep_resident 0".into(),
        "bare (instantiate + call, same module)".into(),
        format!("bare with the host's settings ({k} KiB)"),
        "bare with the host's settings, keeps 0".into(),
        "host, the module importing WASI".into(),
        "bare with the host's settings and a WASI context".into(),
    ];
    for (which, what) in labels.iter().enumerate() {
        if start_row_on(VARIANT_NAMES[which]) {
            println!("  {what:<50} {:>7.2} µs/task", us(medians[which]));
        }
    }
    // Each ratio only when both of its rows ran.
    let [r_b, r_bh, r0_b, r0_b0, r_w] = ratios.map(median);
    let ran = |a: usize, b: usize| start_row_on(VARIANT_NAMES[a]) && start_row_on(VARIANT_NAMES[b]);
    let ratio = |label: &str, r: f64, a: usize, b: usize| {
        ran(a, b).then(|| format!("{label}: {r:.2}x ({:+.2} µs)", us(medians[a] - medians[b])))
    };
    for (heading, parts) in [
        (
            "",
            [
                ratio("host / bare", r_b, 0, 2),
                ratio("host / bare with the host's settings", r_bh, 0, 3),
            ],
        ),
        (
            "keeping nothing: ",
            [
                ratio("host / bare", r0_b, 1, 2),
                ratio("host / bare keeping nothing", r0_b0, 1, 4),
            ],
        ),
        (
            "importing WASI: ",
            [
                ratio(
                    "host / bare with the host's settings and a WASI context",
                    r_w,
                    5,
                    6,
                ),
                None,
            ],
        ),
    ] {
        let parts: Vec<String> = parts.into_iter().flatten().collect();
        if !parts.is_empty() {
            println!("  {heading}{}", parts.join("; "));
        }
    }
}

async fn run_noop(host: &Host, module: &GuestModule, task: &TaskSpec) {
    let outcome = host.run_task(module, task).await.unwrap();
    assert!(outcome.success(), "{:?}", outcome.failure);
}

/// What a run of waiting tasks took.
struct Waited {
    elapsed: Duration,
    /// Peak RSS over the RSS before.
    peak: u64,
    /// RSS kept after the tasks ended: as the process holds it, and after `malloc_trim`
    /// gives the allocator's free pages back.
    kept: (u64, u64),
    /// Where memory was, halfway through the first wave, against before the run.
    midway: (Resident, Resident),
}

/// Runs `n` waiting tasks on the host, all submitted at once.
async fn waiting_on_host(host: &Host, module: &GuestModule, n: usize, sleep: Duration) -> Waited {
    let task = TaskSpec::new("wait")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", "fixture");
    let resident_before = Resident::now();
    let rss = PeakRss::start();
    let rss_before = rss.before;
    let midway = resident_after(sleep / 2);
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
    let midway = (midway.await.unwrap(), resident_before);
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    let trimmed = proc_status("VmRSS").saturating_sub(rss_before);
    Waited {
        elapsed,
        peak,
        kept: (kept, trimmed),
        midway,
    }
}

async fn waiting_on_bare(
    bare: Arc<Bare<()>>,
    n: usize,
    sleep: Duration,
) -> (Duration, u64, (Resident, Resident)) {
    let resident_before = Resident::now();
    let rss = PeakRss::start();
    let midway = resident_after(sleep / 2);
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..n {
        let bare = bare.clone();
        running.spawn(async move { bare.run("_start").await });
    }
    while let Some(done) = running.join_next().await {
        done.unwrap();
    }
    let elapsed = started.elapsed();
    let peak = rss.finish().0;
    (elapsed, peak, (midway.await.unwrap(), resident_before))
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
    let keep_resident = std::env::var("QUIVER_BENCH_KEEP_RESIDENT")
        .ok()
        .and_then(|bytes| bytes.parse().ok());
    let default_host = || {
        let builder = quiver_tests::host_builder(&registry);
        match keep_resident {
            Some(bytes) => builder.with_keep_resident(bytes),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let host = default_host();
    println!(
        "host with default settings: built in {:.1} ms, {:.2} TiB of address space reserved",
        built.elapsed().as_secs_f64() * 1e3,
        (proc_status("VmSize") - vm_before) as f64 / (1u64 << 40) as f64
    );
    let wat = guest(sleep_ms);
    let module = host.load_module("scale.wat", wat.as_bytes()).unwrap();
    let capacity = host.status().tasks.capacity;
    assert_eq!(capacity, defaults::MAX_CONCURRENT_TASKS);

    if rounds > 0 {
        // The same host keeping nothing resident: what tasks cost before keep_resident.
        let kept_nothing = quiver_tests::host_builder(&registry)
            .with_keep_resident(0)
            .build()
            .unwrap();
        overhead(&host, &kept_nothing, &module, &wat, rounds, tasks).await;
        kept_nothing.shutdown().await;
    }

    if waiting.is_empty() {
        host.shutdown().await;
        return;
    }
    // Connect the server and fill caches before measuring.
    let row_on = env_picks("QUIVER_BENCH_ROWS");
    let epoll_wat = epoll_guest(sleep_ms);
    waiting_on_host(&host, &module, 8, sleep).await;
    println!(
        "waiting tasks: each waits {sleep_ms} ms on a tool call; host with default settings \
         ({capacity} running, queue {}), bare with all at once",
        host.status().tasks.queue_capacity
    );
    for &n in &waiting {
        let on_host = if row_on("host") {
            Some(waiting_on_host(&host, &module, n, sleep).await)
        } else {
            None
        };
        // The same tasks waiting in `spear_epoll_wait` on a call started with
        // `mcp_call_start`, instead of in `mcp_call_tool`: on a host of its own with default
        // settings, warmed up as the first was, since slots a run used keep up to
        // `TASK_KEEP_RESIDENT` resident and would lower a second run's peak on the same host.
        let on_epoll = if row_on("epoll") {
            let fresh = default_host();
            let module = fresh
                .load_module("scale-epoll.wat", epoll_wat.as_bytes())
                .unwrap();
            waiting_on_host(&fresh, &module, 8, sleep).await;
            let waited = waiting_on_host(&fresh, &module, n, sleep).await;
            fresh.shutdown().await;
            Some(waited)
        } else {
            None
        };
        // Beyond the default capacity, also a host whose capacity is raised to N: what the
        // queue costs against running everything at once.
        let slots = u32::try_from(n).unwrap();
        let raised_host = |calls: Option<usize>| {
            let mut builder =
                quiver_tests::host_builder(&registry).with_max_concurrent_tasks(slots);
            if let Some(calls) = calls {
                builder = builder.with_max_concurrent_mcp_calls(calls);
            }
            let wat = &wat;
            async move {
                let raised = builder.build().unwrap();
                let module = raised.load_module("scale.wat", wat.as_bytes()).unwrap();
                waiting_on_host(&raised, &module, 8, sleep).await;
                let waited = waiting_on_host(&raised, &module, n, sleep).await;
                raised.shutdown().await;
                waited
            }
        };
        let raised = if n > capacity as usize && row_on("slots") {
            let waited = raised_host(None).await;
            Some((waited.elapsed, waited.peak, waited.midway))
        } else {
            None
        };
        // The host-wide MCP call cap before it followed the slots: calls past it wait, so
        // the tasks run in waves of it.
        let old_cap = defaults::MAX_CONCURRENT_MCP_CALLS;
        let capped = if n > old_cap && row_on("capped") {
            let waited = raised_host(Some(old_cap)).await;
            Some((waited.elapsed, waited.peak))
        } else {
            None
        };
        let bare = if row_on("bare") {
            let bare = Arc::new(Bare::new(
                &wat,
                u32::try_from(n).unwrap(),
                sleep,
                Settings::Wasmtime,
            ));
            Some(waiting_on_bare(bare, n, sleep).await)
        } else {
            None
        };
        let waves = n.div_ceil(capacity as usize);
        let row = |what: &str, elapsed: Duration, rss: u64, waves: usize| {
            let ideal = sleep * waves as u32;
            println!(
                "    {what:<30} {:>6.2} s  {:>6.0} tasks/s  {:>5.2}x the ideal {:>4.1} s ({waves} waves)  {:>6.1} KiB/task",
                elapsed.as_secs_f64(),
                n as f64 / elapsed.as_secs_f64(),
                elapsed.as_secs_f64() / ideal.as_secs_f64(),
                ideal.as_secs_f64(),
                kib(rss, n),
            );
        };
        let ratio = |what: &str, elapsed: Duration, rss: u64| {
            if let Some((b_elapsed, b_rss, _)) = &bare {
                println!(
                    "    {what} / bare: {:.2}x the time, {:.2}x the memory per task",
                    elapsed.as_secs_f64() / b_elapsed.as_secs_f64(),
                    rss as f64 / (*b_rss).max(1) as f64
                );
            }
        };
        println!("  {n} tasks:");
        if let Some(waited) = &on_host {
            row("host (defaults)", waited.elapsed, waited.peak, waves);
        }
        if let Some(waited) = &on_epoll {
            row(
                "host (defaults), epoll wait",
                waited.elapsed,
                waited.peak,
                waves,
            );
        }
        if let Some((elapsed, rss, _)) = raised {
            row(&format!("host ({n} slots)"), elapsed, rss, 1);
        }
        if let Some((elapsed, rss)) = capped {
            row(
                &format!("host ({n} slots, {old_cap} calls)"),
                elapsed,
                rss,
                n.div_ceil(old_cap),
            );
        }
        if let Some((elapsed, rss, _)) = &bare {
            row("bare", *elapsed, *rss, 1);
        }
        if let Some(waited) = &on_host {
            ratio("host (defaults)", waited.elapsed, waited.peak);
        }
        if let Some(waited) = &on_epoll {
            ratio("host (defaults), epoll wait", waited.elapsed, waited.peak);
        }
        if let (Some(blocking), Some(epoll)) = (&on_host, &on_epoll) {
            println!(
                "    epoll wait / blocking call: {:.2}x the time, {:.2}x the memory per task ({:+.1} KiB/task)",
                epoll.elapsed.as_secs_f64() / blocking.elapsed.as_secs_f64(),
                epoll.peak as f64 / blocking.peak.max(1) as f64,
                kib(epoll.peak, n) - kib(blocking.peak, n)
            );
        }
        if let Some((elapsed, rss, _)) = raised {
            ratio(&format!("host ({n} slots)"), elapsed, rss);
        }
        if let Some((elapsed, rss)) = capped {
            ratio(&format!("host ({n} slots, {old_cap} calls)"), elapsed, rss);
        }
        // Per task that was running halfway through the first wave.
        let running = n.min(capacity as usize);
        if let Some(waited) = &on_host {
            println!(
                "    halfway, host (defaults), per running task: {}",
                waited.midway.0.line(&waited.midway.1, running)
            );
        }
        if let Some(waited) = &on_epoll {
            println!(
                "    halfway, host (defaults), epoll wait, per running task: {}",
                waited.midway.0.line(&waited.midway.1, running)
            );
        }
        if let Some((_, _, (midway, before))) = raised {
            println!(
                "    halfway, host ({n} slots), per task: {}",
                midway.line(&before, n)
            );
        }
        if let Some((_, _, (midway, before))) = &bare {
            println!("    halfway, bare, per task: {}", midway.line(before, n));
        }
        for (what, waited) in [("default host", &on_host), ("epoll wait", &on_epoll)] {
            if let Some(waited) = waited {
                println!(
                    "    kept after the {what}'s run: {:.1} KiB/task, {:.1} KiB/task after malloc_trim",
                    kib(waited.kept.0, n),
                    kib(waited.kept.1, n)
                );
            }
        }
    }
    host.shutdown().await;
}
