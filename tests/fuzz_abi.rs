//! A fuzz test over the whole ABI: random hostcall sequences with random arguments (pointers
//! and lengths in and out of bounds, random and valid-ish JSON, random fds, ctl commands and
//! flags) against the real host, a real fixture MCP server and a scripted LLM server whose
//! answers are random too (text, tool calls of guest and MCP tools, junk).
//!
//! Each case is one task running an interpreter guest (compiled once) over a script passed
//! in its args. For every case it checks that the host did not panic, that every hostcall
//! returned success or an errno `docs/abi.md` documents for it, that the task's memory
//! budget never went past its limit and was all given back, and that the host's real heap
//! (counted by this binary's global allocator) grew by at most the budget plus a fixed
//! slack while the task ran.
//!
//! It runs for `QUIVER_FUZZ_SECS` (default 3) seconds from the seed `QUIVER_FUZZ_SEED`
//! (default: from the clock); the seed is printed first, so a failure can be replayed:
//! `QUIVER_FUZZ_SEED=<seed> cargo test -p quiver-tests --test fuzz_abi -- --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use quiver::{GuestModule, Host, TaskFailure, TaskSpec};
use quiver_tests::chat_wat::scripted_host;
use quiver_tests::errno::{
    EACCES, EBADF, EFAULT, EINVAL, EIO, EMFILE, ENOENT, ENOMEM, ENOSPC, ENOTCONN, EPERM, ETIMEDOUT,
};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::{RegistryDir, serve};
use serde_json::{Value, json};

// ---- the host's heap, counted -------------------------------------------------------------

/// Counts live heap bytes of every thread but the in-process test servers' own.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn count(delta: isize) {
    if serve::on_server_thread() {
        return;
    }
    let live = LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting allocates
// nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests of this binary measure the heap, so they take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `work`, returning what it returns and how far the heap grew above where it started.
async fn heap_growth<F: Future>(work: F) -> (F::Output, isize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let output = work.await;
    (output, PEAK.load(Ordering::SeqCst) - base)
}

/// What a task may take beyond its budget: its store, instance and WASI context, its args
/// (the script), spans and the like; a fixed amount, whatever the guest does (about 90 KB
/// when this was written).
const SLACK: isize = 1024 * 1024;

// ---- a deterministic random source ---------------------------------------------------------

/// SplitMix64: small, fast, and the same everywhere for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0..n
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// true with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A length: mostly small, sometimes large.
    fn len(&mut self, max: u64) -> u64 {
        match self.below(10) {
            0..=5 => self.below(64.min(max) + 1),
            6..=8 => self.below(4096.min(max) + 1),
            _ => self.below(max + 1),
        }
    }
}

// ---- the interpreter guest -----------------------------------------------------------------

const PAGES: u32 = 8;
const MEMORY: u32 = PAGES * 65_536;
/// WASI args land here (the hex script).
const ARGS: u32 = 1024;
const ARGS_MAX: u32 = 98_304;
const SCRIPT: u32 = 102_400;
const RESULTS: u32 = 155_648;
/// Everything the script may point the host at for writing; below it the interpreter keeps
/// its script and results, which no hostcall of the script can reach.
const ARENA: u32 = 196_608;
const RECORD: u32 = 36;

const OPS: [&str; 22] = [
    "poke",
    "log",
    "time_now_ms",
    "mcp_open",
    "mcp_list_tools",
    "mcp_call_tool",
    "mcp_close",
    "mcp_registry_list",
    "mcp_registry_get",
    "mcp_list_resources",
    "mcp_list_resource_templates",
    "mcp_read_resource",
    "mcp_list_prompts",
    "mcp_get_prompt",
    "mcp_set_param",
    "cchat_create",
    "cchat_write_msg",
    "cchat_write_fn",
    "cchat_ctl",
    "cchat_send",
    "cchat_recv",
    "cchat_close",
];

/// The errnos docs/abi.md gives each op (the index into [`OPS`]).
fn documented(op: usize) -> &'static [i32] {
    match OPS[op] {
        "poke" => &[EPERM],
        "log" => &[EINVAL, EFAULT, ENOMEM],
        "time_now_ms" => &[],
        "mcp_open" => &[ENOENT, EACCES, ENOTCONN, EMFILE, EINVAL, EFAULT, ENOMEM],
        "mcp_list_tools" => &[EBADF, EFAULT, ENOSPC, ENOTCONN, ETIMEDOUT, EIO, ENOMEM],
        "mcp_call_tool" => &[EACCES, EIO, EINVAL, EBADF, EFAULT, ENOMEM, ENOSPC],
        "mcp_close" => &[EBADF],
        "mcp_registry_list" => &[EFAULT, ENOSPC],
        "mcp_registry_get" => &[ENOENT, EACCES, EINVAL, EFAULT, ENOSPC, ENOMEM],
        "mcp_list_resources" | "mcp_list_resource_templates" => {
            &[EBADF, EFAULT, ENOSPC, ENOTCONN, ETIMEDOUT, EIO, ENOMEM]
        }
        "mcp_read_resource" => &[EACCES, EINVAL, EBADF, EFAULT, ENOMEM, ENOSPC],
        "mcp_list_prompts" => &[EBADF, EFAULT, ENOSPC, ENOTCONN, ETIMEDOUT, EIO, ENOMEM],
        "mcp_get_prompt" => &[EACCES, EIO, EINVAL, EBADF, EFAULT, ENOMEM, ENOSPC],
        "mcp_set_param" => &[EINVAL, EIO, EBADF, EFAULT, ENOMEM],
        "cchat_create" => &[EMFILE, ENOMEM],
        "cchat_write_msg" => &[EBADF, EINVAL, EFAULT, ENOMEM],
        "cchat_write_fn" => &[EINVAL, EBADF, EFAULT, ENOMEM],
        "cchat_ctl" => &[EINVAL, EIO, EBADF, EFAULT, EACCES, ENOSPC, ENOMEM],
        "cchat_send" => &[EBADF, EINVAL, EMFILE, ENOMEM],
        "cchat_recv" => &[EBADF, EFAULT, ENOSPC],
        "cchat_close" => &[EBADF],
        _ => &[],
    }
}

/// The guest tools of the interpreter, by table index.
const TOOLS: [&str; 6] = ["ok", "echo", "resend", "closer", "writer", "boom"];

/// The interpreter: decodes the hex script of argv[1] into [`SCRIPT`], runs its records
/// (op, flags, seven args; flag bit i makes arg i the result of an earlier step), keeps each
/// result in [`RESULTS`], then closes every fd it saw and writes the results to stdout.
fn interpreter() -> String {
    let imports: String = [
        ("log", 3, "i32"),
        ("time_now_ms", 0, "i64"),
        ("mcp_open", 2, "i32"),
        ("mcp_list_tools", 3, "i32"),
        ("mcp_call_tool", 7, "i32"),
        ("mcp_close", 1, "i32"),
        ("mcp_registry_list", 2, "i32"),
        ("mcp_registry_get", 4, "i32"),
        ("mcp_list_resources", 3, "i32"),
        ("mcp_list_resource_templates", 3, "i32"),
        ("mcp_read_resource", 5, "i32"),
        ("mcp_list_prompts", 3, "i32"),
        ("mcp_get_prompt", 7, "i32"),
        ("mcp_set_param", 3, "i32"),
        ("cchat_create", 0, "i32"),
        ("cchat_write_msg", 5, "i32"),
        ("cchat_write_fn", 4, "i32"),
        ("cchat_ctl", 4, "i32"),
        ("cchat_send", 2, "i32"),
        ("cchat_recv", 3, "i32"),
        ("cchat_close", 1, "i32"),
    ]
    .iter()
    .map(|(name, params, result)| {
        let params = match params {
            0 => String::new(),
            n => format!(" (param{})", " i32".repeat(*n)),
        };
        format!("(import \"spear\" \"{name}\" (func ${name}{params} (result {result})))\n")
    })
    .collect();
    let arg = |i: usize| format!("(call $arg (local.get $b) (local.get $f) (i32.const {i}))");
    let args = |n: usize| (0..n).map(arg).collect::<Vec<_>>().join(" ");
    let mut exec = String::new();
    for (op, name) in OPS.iter().enumerate().skip(1) {
        let call = match *name {
            "time_now_ms" => "(drop (call $time_now_ms)) (i32.const 0)".to_owned(),
            "cchat_send" => format!(
                "(global.set $session {}) (call $cchat_send {})",
                arg(0),
                args(2)
            ),
            _ => {
                let params = match *name {
                    "mcp_call_tool" | "mcp_get_prompt" => 7,
                    "cchat_write_msg" | "mcp_read_resource" => 5,
                    "mcp_registry_get" | "cchat_write_fn" | "cchat_ctl" => 4,
                    "log"
                    | "mcp_set_param"
                    | "mcp_list_tools"
                    | "mcp_list_resources"
                    | "mcp_list_resource_templates"
                    | "mcp_list_prompts"
                    | "cchat_recv" => 3,
                    "mcp_open" | "mcp_registry_list" => 2,
                    "mcp_close" | "cchat_close" => 1,
                    _ => 0,
                };
                format!("(call ${name} {})", args(params))
            }
        };
        exec.push_str(&format!(
            "(if (i32.eq (local.get $op) (i32.const {op})) (then (return {call})))\n"
        ));
    }
    format!(
        r#"(module
  {imports}
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (memory (export "memory") {PAGES})
  (table (export "__indirect_function_table") 8 funcref)
  (elem (i32.const 1) $t_ok $t_echo $t_resend $t_closer $t_writer $t_trap)
  (global $session (mut i32) (i32.const -1))
  (data (i32.const 64) "user")

  (func $fits (param $p i32) (param $n i32) (result i32)
    (i64.le_u (i64.add (i64.extend_i32_u (local.get $p)) (i64.extend_i32_u (local.get $n)))
              (i64.shl (i64.extend_i32_u (memory.size)) (i64.const 16))))
  (func $t_ok (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (if (i32.lt_u (i32.load (local.get $ol)) (i32.const 2))
      (then (i32.store (local.get $ol) (i32.const 2)) (return (i32.const -28))))
    (if (i32.eqz (call $fits (local.get $o) (i32.const 2))) (then (return (i32.const -14))))
    (i32.store16 (local.get $o) (i32.const 0x6b6f))
    (i32.store (local.get $ol) (i32.const 2)) (i32.const 0))
  (func $t_echo (param $a i32) (param $al i32) (param $o i32) (param $ol i32) (result i32)
    (if (i32.lt_u (i32.load (local.get $ol)) (local.get $al))
      (then (i32.store (local.get $ol) (local.get $al)) (return (i32.const -28))))
    (if (i32.eqz (call $fits (local.get $o) (local.get $al))) (then (return (i32.const -14))))
    (memory.copy (local.get $o) (local.get $a) (local.get $al))
    (i32.store (local.get $ol) (local.get $al)) (i32.const 0))
  (func $t_resend (param i32 i32 i32) (param $ol i32) (result i32)
    (drop (call $cchat_close (call $cchat_send (global.get $session) (i32.const 0))))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  (func $t_closer (param i32 i32 i32) (param $ol i32) (result i32)
    (drop (call $cchat_close (global.get $session)))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  (func $t_writer (param $a i32) (param $al i32) (param i32) (param $ol i32) (result i32)
    (drop (call $cchat_write_msg (global.get $session) (i32.const 64) (i32.const 4) (local.get $a) (local.get $al)))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  (func $t_trap (param i32 i32 i32 i32) (result i32) unreachable)

  (func $nibble (param $c i32) (result i32)
    (if (result i32) (i32.le_u (local.get $c) (i32.const 57))
      (then (i32.sub (local.get $c) (i32.const 48)))
      (else (i32.sub (local.get $c) (i32.const 87)))))

  ;; Argument $i of the record at $b: a literal, or (flag bit $i) an earlier step's result.
  (func $arg (param $b i32) (param $f i32) (param $i i32) (result i32)
    (local $v i32)
    (local.set $v (i32.load (i32.add (local.get $b) (i32.add (i32.const 8) (i32.shl (local.get $i) (i32.const 2))))))
    (if (result i32) (i32.and (local.get $f) (i32.shl (i32.const 1) (local.get $i)))
      (then (i32.load (i32.add (i32.const {RESULTS}) (i32.shl (i32.and (local.get $v) (i32.const 8191)) (i32.const 2)))))
      (else (local.get $v))))

  (func $exec (param $op i32) (param $b i32) (param $f i32) (result i32)
    (local $addr i32) (local $len i32)
    (if (i32.eqz (local.get $op)) (then
      (local.set $addr {a0}) (local.set $len {a1})
      (if (i32.or (i32.lt_u (local.get $addr) (i32.const {ARENA}))
                  (i64.gt_u (i64.add (i64.extend_i32_u (local.get $addr)) (i64.extend_i32_u (local.get $len)))
                            (i64.const {MEMORY})))
        (then (return (i32.const -1))))
      (memory.copy (local.get $addr) (i32.add (local.get $b) (i32.const {RECORD})) (local.get $len))
      (return (i32.const 0))))
    {exec}
    (i32.const -1))

  (func (export "_start")
    (local $hex i32) (local $hexlen i32) (local $i i32) (local $end i32) (local $pc i32)
    (local $op i32) (local $step i32) (local $r i32)
    (drop (call $args_sizes_get (i32.const 96) (i32.const 100)))
    (if (i32.gt_u (i32.load (i32.const 100)) (i32.const {ARGS_MAX})) (then unreachable))
    (drop (call $args_get (i32.const 128) (i32.const {ARGS})))
    (local.set $hex (i32.load (i32.const 132)))
    (block $found (loop $scan
      (br_if $found (i32.eqz (i32.load8_u (i32.add (local.get $hex) (local.get $hexlen)))))
      (local.set $hexlen (i32.add (local.get $hexlen) (i32.const 1)))
      (br $scan)))
    (block $decoded (loop $decode
      (br_if $decoded (i32.ge_u (i32.add (local.get $i) (i32.const 1)) (local.get $hexlen)))
      (i32.store8 (i32.add (i32.const {SCRIPT}) (i32.shr_u (local.get $i) (i32.const 1)))
        (i32.or (i32.shl (call $nibble (i32.load8_u (i32.add (local.get $hex) (local.get $i)))) (i32.const 4))
                (call $nibble (i32.load8_u (i32.add (local.get $hex) (i32.add (local.get $i) (i32.const 1)))))))
      (local.set $i (i32.add (local.get $i) (i32.const 2)))
      (br $decode)))
    (local.set $end (i32.add (i32.const {SCRIPT}) (i32.shr_u (local.get $hexlen) (i32.const 1))))
    (local.set $pc (i32.const {SCRIPT}))
    (block $stop (loop $next
      (br_if $stop (i32.gt_u (i32.add (local.get $pc) (i32.const {RECORD})) (local.get $end)))
      (local.set $op (i32.load (local.get $pc)))
      (local.set $r (call $exec (local.get $op) (local.get $pc) (i32.load offset=4 (local.get $pc))))
      (i32.store (i32.add (i32.const {RESULTS}) (i32.shl (local.get $step) (i32.const 2))) (local.get $r))
      (local.set $step (i32.add (local.get $step) (i32.const 1)))
      (if (i32.eqz (local.get $op)) (then
        (local.set $pc (i32.add (local.get $pc)
          (i32.and (i32.add (i32.load offset=12 (local.get $pc)) (i32.const 3)) (i32.const -4))))))
      (local.set $pc (i32.add (local.get $pc) (i32.const {RECORD})))
      (br_if $stop (i32.ge_u (local.get $step) (i32.const 8192)))
      (br $next)))
    ;; Close whatever the script left open, so the results have room, then write them.
    (local.set $i (i32.const 0))
    (block $closed (loop $close
      (br_if $closed (i32.ge_u (local.get $i) (local.get $step)))
      (local.set $r (i32.load (i32.add (i32.const {RESULTS}) (i32.shl (local.get $i) (i32.const 2)))))
      (if (i32.gt_s (local.get $r) (i32.const 0)) (then
        (drop (call $cchat_close (local.get $r)))
        (drop (call $mcp_close (local.get $r)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $close)))
    (i32.store (i32.const 0) (i32.const {RESULTS}))
    (i32.store (i32.const 4) (i32.shl (local.get $step) (i32.const 2)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#,
        a0 = arg(0),
        a1 = arg(1),
    )
}

// ---- scripts -------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Other,
    McpFd,
    Session,
    Response,
}

#[derive(Clone, Copy)]
enum Arg {
    Lit(i32),
    /// The result of an earlier step.
    Ref(usize),
}

/// A script under construction, and what the checks need to know of it.
struct Script {
    bytes: Vec<u8>,
    ops: Vec<usize>,
    kinds: Vec<Kind>,
    next: u32,
}

/// Room left for the script itself (its hex form must fit [`ARGS_MAX`]).
const SCRIPT_MAX: usize = 46 * 1024;

impl Script {
    fn new() -> Self {
        Self {
            bytes: Vec::new(),
            ops: Vec::new(),
            kinds: Vec::new(),
            next: ARENA,
        }
    }

    fn full(&self) -> bool {
        self.bytes.len() > SCRIPT_MAX / 2
    }

    fn record(&mut self, op: usize, args: [Arg; 7], kind: Kind) -> usize {
        let mut flags = 0u32;
        let mut values = [0i32; 7];
        for (i, arg) in args.iter().enumerate() {
            match *arg {
                Arg::Lit(v) => values[i] = v,
                Arg::Ref(step) => {
                    flags |= 1 << i;
                    values[i] = step as i32;
                }
            }
        }
        self.bytes.extend_from_slice(&(op as u32).to_le_bytes());
        self.bytes.extend_from_slice(&flags.to_le_bytes());
        for v in values {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.ops.push(op);
        self.kinds.push(kind);
        self.ops.len() - 1
    }

    /// Room in the arena for `len` bytes.
    fn alloc(&mut self, len: u32) -> u32 {
        let at = self.next.next_multiple_of(4);
        if at + len > MEMORY {
            self.next = ARENA + len;
            return ARENA;
        }
        self.next = at + len;
        at
    }

    /// Copies `data` into the arena; returns where.
    fn poke(&mut self, data: &[u8]) -> u32 {
        let at = self.alloc(data.len() as u32);
        let mut args = [Arg::Lit(0); 7];
        args[0] = Arg::Lit(at as i32);
        args[1] = Arg::Lit(data.len() as i32);
        self.record(0, args, Kind::Other);
        self.bytes.extend_from_slice(data);
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
        at
    }

    fn hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Builds one random script.
struct Fuzzer<'a> {
    rng: &'a mut Rng,
    script: Script,
}

impl Fuzzer<'_> {
    /// An input: `data` poked into the arena, its (ptr, len) often honest, sometimes not.
    fn input(&mut self, data: &[u8]) -> (Arg, Arg) {
        let at = self.script.poke(data);
        let len = data.len() as i32;
        match self.rng.below(40) {
            0 => (Arg::Lit(-1), Arg::Lit(len)),
            1 => (Arg::Lit(at as i32), Arg::Lit(-1)),
            2 => (Arg::Lit(MEMORY as i32 - 2), Arg::Lit(len.max(3))),
            3 => (Arg::Lit(at as i32), Arg::Lit(16 * 1024 * 1024 + 1)),
            // Reading the interpreter's own memory is harmless.
            4 => (
                Arg::Lit(self.rng.below(ARENA as u64) as i32),
                Arg::Lit(self.rng.len(4096) as i32),
            ),
            _ => (Arg::Lit(at as i32), Arg::Lit(len)),
        }
    }

    /// An output buffer: (out_ptr, out_len_ptr), with its capacity poked into place.
    fn output(&mut self) -> (Arg, Arg) {
        let capacity: u32 = match self.rng.below(20) {
            0 | 1 => 0,
            2 | 3 => self.rng.below(16) as u32,
            4 => u32::MAX,
            5 => MEMORY,
            _ => self.rng.len(65_536) as u32,
        };
        let len_ptr = self.script.poke(&capacity.to_le_bytes());
        let out = self.script.alloc(capacity.min(65_536));
        match self.rng.below(40) {
            0 => (Arg::Lit(out as i32), Arg::Lit(-4)),
            1 => (Arg::Lit(out as i32), Arg::Lit(MEMORY as i32 - 2)),
            2 => (Arg::Lit(-1), Arg::Lit(len_ptr as i32)),
            _ => (Arg::Lit(out as i32), Arg::Lit(len_ptr as i32)),
        }
    }

    /// An fd: mostly an earlier step's result of the wanted kind.
    fn fd(&mut self, kind: Kind) -> Arg {
        let of_kind: Vec<usize> = (0..self.script.kinds.len())
            .filter(|&i| self.script.kinds[i] == kind)
            .collect();
        match self.rng.below(10) {
            0 => Arg::Lit(*self.rng.pick(&[0, -1, 1, 1024, 12345, i32::MIN, i32::MAX])),
            1 if !self.script.kinds.is_empty() => {
                Arg::Ref(self.rng.below(self.script.kinds.len() as u64) as usize)
            }
            _ if !of_kind.is_empty() => Arg::Ref(*self.rng.pick(&of_kind)),
            _ => Arg::Lit(self.rng.next() as i32),
        }
    }

    /// An MCP fd; often one opened honestly just before, as most opens of the script fail.
    fn mcp_fd(&mut self) -> Arg {
        if !self.rng.chance(40) {
            return self.fd(Kind::McpFd);
        }
        let at = self.script.poke(b"fixture");
        let mut args = [Arg::Lit(0); 7];
        args[0] = Arg::Lit(at as i32);
        args[1] = Arg::Lit(7);
        Arg::Ref(self.script.record(3, args, Kind::McpFd))
    }

    fn text(&mut self, max: u64) -> Vec<u8> {
        let len = self.rng.len(max) as usize;
        let mut text = Vec::with_capacity(len);
        let invalid = self.rng.chance(5);
        while text.len() < len {
            match self.rng.below(30) {
                0 => text.extend_from_slice("é".as_bytes()),
                1 => text.extend_from_slice("☃".as_bytes()),
                2 => text.push(0),
                3 if invalid => text.push(0xff),
                _ => text.push(b'a' + self.rng.below(26) as u8),
            }
        }
        text
    }

    fn string(&mut self, max: u64) -> String {
        String::from_utf8_lossy(&self.text(max)).into_owned()
    }

    fn value(&mut self, depth: u32) -> Value {
        match self.rng.below(if depth == 0 { 5 } else { 8 }) {
            0 => Value::Null,
            1 => json!(self.rng.chance(50)),
            2 => json!(self.rng.next() as i64 >> self.rng.below(64)),
            3 => json!(self.rng.next() as f64 / 7.0),
            4 => json!(self.string(200)),
            5 | 6 => {
                let n = self.rng.below(6);
                Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
            _ => {
                let n = self.rng.below(6);
                Value::Object(
                    (0..n)
                        .map(|_| (self.string(8), self.value(depth - 1)))
                        .collect(),
                )
            }
        }
    }

    /// JSON text: mostly `value`, sometimes broken.
    fn json(&mut self, value: Value) -> Vec<u8> {
        let mut text = serde_json::to_vec(&value).unwrap();
        match self.rng.below(20) {
            0 => text.truncate(self.rng.below(text.len() as u64) as usize),
            1 => text = self.text(100),
            2 => text.extend_from_slice(b" trailing"),
            _ => {}
        }
        text
    }

    fn role(&mut self) -> Vec<u8> {
        match self.rng.below(10) {
            0 => b"wizard".to_vec(),
            1 => vec![0xff, 0xfe],
            2 => Vec::new(),
            _ => self
                .rng
                .pick(&["system", "developer", "user", "assistant", "tool"])
                .as_bytes()
                .to_vec(),
        }
    }

    fn message(&mut self) -> Value {
        let role = String::from_utf8_lossy(&self.role()).into_owned();
        match self.rng.below(8) {
            0 => self.value(3),
            1 => json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": *self.rng.pick(&TOOLS), "arguments": "{}"}}]}),
            2 => json!({"role": "tool", "tool_call_id": "c1", "content": self.string(2000)}),
            _ => json!({"role": role, "content": self.string(8000)}),
        }
    }

    fn param(&mut self) -> Value {
        let key = *self.rng.pick(&[
            "model",
            "backend",
            "timeout_ms",
            "tool_arena_ptr",
            "tool_arena_len",
            "max_iterations",
            "max_total_tool_calls",
            "max_tool_output_bytes",
            "mcp.enabled",
            "mcp.server_ids",
            "mcp.tool_allowlist",
            "mcp.tool_denylist",
            "mcp.task_tool_allowlist",
            "temperature",
            "tool_choice",
            "stop",
            "stream",
            "messages",
            "x-random",
        ]);
        let value = match key {
            // The arena must stay in the arena: the host writes tool arguments there.
            "tool_arena_ptr" => json!(ARENA + self.rng.below((MEMORY - ARENA) as u64) as u32),
            "tool_arena_len" => json!(self.rng.len(70_000)),
            "max_iterations" => json!(1 + self.rng.below(3)),
            "max_total_tool_calls" => json!(1 + self.rng.below(6)),
            "timeout_ms" => json!(2_000 + self.rng.below(3_000)),
            "backend" => json!(*self.rng.pick(&["scripted", "nope"])),
            "mcp.server_ids" => json!([*self.rng.pick(&["fixture", "nope"])]),
            "mcp.tool_allowlist" | "mcp.tool_denylist" => {
                json!([*self.rng.pick(&["*", "echo", "e?ho"])])
            }
            "tool_choice" => json!(*self.rng.pick(&["auto", "none", "required"])),
            "mcp.enabled" => json!(self.rng.chance(50)),
            _ => self.value(3),
        };
        if self.rng.chance(10) {
            return self.value(2);
        }
        json!({"key": key, "value": value})
    }

    /// An `mcp_set_param` argument: mostly a list the fd takes, sometimes anything.
    fn mcp_param(&mut self) -> Value {
        let key = *self.rng.pick(&[
            "mcp.tool_allowlist",
            "mcp.tool_denylist",
            "mcp.resource_allowlist",
            "mcp.resource_denylist",
            "mcp.prompt_allowlist",
            "mcp.prompt_denylist",
            "mcp.server_ids",
            "x-random",
        ]);
        let value = match self.rng.below(4) {
            0 => self.value(3),
            _ => json!([*self.rng.pick(&["*", "echo", "e?ho", "fixture://*", "nope"])]),
        };
        if self.rng.chance(10) {
            return self.value(2);
        }
        json!({"key": key, "value": value})
    }

    fn tool_definition(&mut self) -> Value {
        let name = if self.rng.chance(85) {
            (*self.rng.pick(&TOOLS)).to_owned()
        } else {
            self.string(70)
        };
        if self.rng.chance(10) {
            return self.value(3);
        }
        json!({"type": "function", "function": {
            "name": name,
            "description": self.string(3000),
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}
        }})
    }

    /// One hostcall (with the pokes it needs).
    fn step(&mut self) {
        let op = 1 + self.rng.below(OPS.len() as u64 - 1) as usize;
        let lit = Arg::Lit(0);
        let mut args = [lit; 7];
        let mut kind = Kind::Other;
        match OPS[op] {
            "log" => {
                let text = self.text(2000);
                let (p, l) = self.input(&text);
                let level = if self.rng.chance(90) {
                    self.rng.below(5) as i32
                } else {
                    9
                };
                args[..3].copy_from_slice(&[Arg::Lit(level), p, l]);
            }
            "time_now_ms" | "cchat_create" => {
                if OPS[op] == "cchat_create" {
                    kind = Kind::Session;
                }
            }
            "mcp_open" | "mcp_registry_get" => {
                let ids: [&[u8]; 6] = [b"fixture", b"fixture", b"fixture", b"nope", b"", &[0xff]];
                let id = *self.rng.pick(&ids);
                let (p, l) = self.input(id);
                args[0] = p;
                args[1] = l;
                if OPS[op] == "mcp_open" {
                    kind = Kind::McpFd;
                } else {
                    let (o, ol) = self.output();
                    args[2] = o;
                    args[3] = ol;
                }
            }
            "mcp_list_tools"
            | "mcp_list_resources"
            | "mcp_list_resource_templates"
            | "mcp_list_prompts" => {
                args[0] = self.mcp_fd();
                let (o, ol) = self.output();
                args[1] = o;
                args[2] = ol;
            }
            "mcp_call_tool" | "mcp_get_prompt" => {
                args[0] = self.mcp_fd();
                let names: [&[u8]; 6] = [b"echo", b"echo", b"add", b"count", b"crash", b"nope"];
                let name = *self.rng.pick(&names);
                let (np, nl) = self.input(name);
                let arguments = match self.rng.below(5) {
                    0 => json!({"a": self.rng.below(100), "b": 2}),
                    1 => self.value(3),
                    _ => json!({"text": self.string(4000)}),
                };
                let arguments = self.json(arguments);
                let (ap, al) = self.input(&arguments);
                let (o, ol) = self.output();
                args = [args[0], np, nl, ap, al, o, ol];
            }
            "mcp_read_resource" => {
                args[0] = self.mcp_fd();
                let uris: [&[u8]; 4] = [b"fixture://a", b"", &[0xff], b"*"];
                let uri = *self.rng.pick(&uris);
                let (up, ul) = self.input(uri);
                let (o, ol) = self.output();
                args = [args[0], up, ul, o, ol, lit, lit];
            }
            "mcp_set_param" => {
                args[0] = self.mcp_fd();
                let param = self.mcp_param();
                let param = self.json(param);
                let (p, l) = self.input(&param);
                args[1] = p;
                args[2] = l;
            }
            "mcp_close" => args[0] = self.fd(Kind::McpFd),
            "mcp_registry_list" => {
                let (o, ol) = self.output();
                args[0] = o;
                args[1] = ol;
            }
            "cchat_write_msg" => {
                args[0] = self.fd(Kind::Session);
                let role = self.role();
                let (rp, rl) = self.input(&role);
                let content = self.text(8000);
                let (cp, cl) = self.input(&content);
                args[1..5].copy_from_slice(&[rp, rl, cp, cl]);
            }
            "cchat_write_fn" => {
                args[0] = self.fd(Kind::Session);
                args[1] = Arg::Lit(if self.rng.chance(85) {
                    1 + self.rng.below(TOOLS.len() as u64) as i32
                } else {
                    *self.rng.pick(&[0, 7, 100, -1])
                });
                let definition = self.tool_definition();
                let definition = self.json(definition);
                let (p, l) = self.input(&definition);
                args[2] = p;
                args[3] = l;
            }
            "cchat_ctl" => {
                let cmd = match self.rng.below(20) {
                    0..=6 => 1,
                    7..=12 => 3,
                    13..=14 => 4,
                    15..=16 => 2,
                    _ => *self.rng.pick(&[0, 5, -1, 99]),
                };
                args[0] = self.fd(if cmd == 2 {
                    Kind::Response
                } else {
                    Kind::Session
                });
                args[1] = Arg::Lit(cmd);
                match cmd {
                    1 | 3 => {
                        let value = if cmd == 1 {
                            self.param()
                        } else {
                            self.message()
                        };
                        let text = self.json(value);
                        let (p, l) = self.input(&text);
                        let len = match l {
                            Arg::Lit(len) => len as u32,
                            Arg::Ref(_) => 0,
                        };
                        let len_ptr = self.script.poke(&len.to_le_bytes());
                        args[2] = p;
                        args[3] = if self.rng.chance(5) {
                            Arg::Lit(-1)
                        } else {
                            Arg::Lit(len_ptr as i32)
                        };
                    }
                    _ => {
                        let (o, ol) = self.output();
                        args[2] = o;
                        args[3] = ol;
                    }
                }
            }
            "cchat_send" => {
                args[0] = self.fd(Kind::Session);
                args[1] = Arg::Lit(if self.rng.chance(90) {
                    self.rng.below(4) as i32
                } else {
                    *self.rng.pick(&[4, 8, -1, i32::MAX])
                });
                kind = Kind::Response;
            }
            "cchat_recv" => {
                args[0] = self.fd(Kind::Response);
                let (o, ol) = self.output();
                args[1] = o;
                args[2] = ol;
            }
            "cchat_close" => {
                let kind = if self.rng.chance(50) {
                    Kind::Session
                } else {
                    Kind::Response
                };
                args[0] = self.fd(kind);
            }
            other => unreachable!("{other}"),
        }
        let step = self.script.record(op, args, kind);
        if kind == Kind::Session && self.rng.chance(60) {
            self.equip(step);
        }
    }

    /// Lends the session of `step` a tool arena and registers some guest tools on it, so
    /// the model's tool calls reach the guest.
    fn equip(&mut self, step: usize) {
        let arena = ARENA + self.rng.below(64) as u32 * 4096;
        for param in [
            json!({"key": "tool_arena_ptr", "value": arena}),
            json!({"key": "tool_arena_len", "value": 16_384 + self.rng.below(65_536)}),
        ] {
            let text = serde_json::to_vec(&param).unwrap();
            let at = self.script.poke(&text);
            let len_ptr = self.script.poke(&(text.len() as u32).to_le_bytes());
            let args = [
                Arg::Ref(step),
                Arg::Lit(1),
                Arg::Lit(at as i32),
                Arg::Lit(len_ptr as i32),
                Arg::Lit(0),
                Arg::Lit(0),
                Arg::Lit(0),
            ];
            self.script.record(12, args, Kind::Other);
        }
        for _ in 0..1 + self.rng.below(4) {
            let index = 1 + self.rng.below(TOOLS.len() as u64) as usize;
            let definition = json!({"type": "function", "function": {"name": TOOLS[index - 1]}});
            let text = serde_json::to_vec(&definition).unwrap();
            let at = self.script.poke(&text);
            let args = [
                Arg::Ref(step),
                Arg::Lit(index as i32),
                Arg::Lit(at as i32),
                Arg::Lit(text.len() as i32),
                Arg::Lit(0),
                Arg::Lit(0),
                Arg::Lit(0),
            ];
            self.script.record(11, args, Kind::Other);
        }
    }

    fn reply(&mut self) -> Reply {
        match self.rng.below(20) {
            0..=7 => Reply::text(self.string(4000)),
            8..=14 => {
                let n = 1 + self.rng.below(3);
                let calls = (0..n)
                    .map(|i| {
                        let name = match self.rng.below(10) {
                            0..=5 => {
                                let tool = *self.rng.pick(&TOOLS);
                                if tool == "boom" && self.rng.chance(80) {
                                    "ok"
                                } else {
                                    tool
                                }
                            }
                            6 | 7 => "mcp__fixture__echo",
                            8 => "mcp__fixture__add",
                            _ => "made_up",
                        };
                        let arguments = if self.rng.chance(80) {
                            json!({"text": self.string(500), "a": 1, "b": 2}).to_string()
                        } else {
                            self.string(50)
                        };
                        (format!("call_{i}"), name.to_owned(), arguments)
                    })
                    .collect();
                Reply::ToolCalls(calls)
            }
            15 => Reply::Json(self.value(3)),
            16 => Reply::Garbage(self.string(100)),
            17 => Reply::error(400, "bad request"),
            _ => Reply::Json(
                json!({"choices": [{"message": self.value(2)}], "usage": self.value(1)}),
            ),
        }
    }
}

/// One case: a script, the model's answers for it, and the limits of its task.
struct Case {
    script: Script,
    replies: Vec<Reply>,
    budget: u64,
    max_fds: usize,
}

fn case(seed: u64) -> Case {
    let case = case_once(seed);
    if case.script.bytes.len() <= SCRIPT_MAX {
        return case;
    }
    // A last step of unlikely size: another script from the next seed.
    self::case(seed.wrapping_add(1))
}

fn case_once(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let mut fuzzer = Fuzzer {
        rng: &mut rng,
        script: Script::new(),
    };
    let steps = 10 + fuzzer.rng.below(200);
    for _ in 0..steps {
        if fuzzer.script.full() {
            break;
        }
        fuzzer.step();
    }
    let replies = (0..40).map(|_| fuzzer.reply()).collect();
    let budget = *fuzzer.rng.pick(&[64 * 1024, 256 * 1024, 1 << 20, 4 << 20]);
    let max_fds = *fuzzer.rng.pick(&[8, 64, 1024]);
    let script = std::mem::replace(&mut fuzzer.script, Script::new());
    Case {
        script,
        replies,
        budget,
        max_fds,
    }
}

// ---- running cases -------------------------------------------------------------------------

struct Rig {
    host: Host,
    llm: ScriptedLlm,
    module: GuestModule,
    _registry: RegistryDir,
}

async fn rig() -> Rig {
    let llm = ScriptedLlm::start(vec![]).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "add", "count"], "");
    let host = scripted_host(&registry, &llm);
    let module = host
        .load_module("fuzz.wat", interpreter().as_bytes())
        .expect("the interpreter compiles");
    Rig {
        host,
        llm,
        module,
        _registry: registry,
    }
}

/// How often each op returned what (success counted as 1), over a whole run.
type Coverage = std::collections::BTreeMap<(&'static str, i32), u64>;

/// Runs `case` and checks everything the module docs promise; an `Err` says what broke,
/// `Ok` how far the heap grew past the budget.
async fn run_case(
    rig: &Rig,
    case: &Case,
    name: &str,
    coverage: &mut Coverage,
) -> Result<isize, String> {
    // This case's answers only, and enough that no send waits on the retry path.
    rig.llm.clear_script();
    rig.llm.clear_recorded();
    while rig.llm.remaining() < 400 {
        for reply in &case.replies {
            rig.llm.push(reply.clone());
        }
    }
    let task = TaskSpec::new(name)
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", json!(["fixture"]))
        .with_args([case.script.hex()])
        .with_deadline(Duration::from_secs(30))
        .with_max_fds(case.max_fds)
        .with_host_memory_limit(case.budget)
        .with_captured_output();
    let (outcome, growth) = heap_growth(rig.host.run_task(&rig.module, &task)).await;
    let outcome = outcome.map_err(|e| format!("the task did not start: {e}"))?;
    let memory = outcome.host_memory;
    if memory.peak_bytes > case.budget || memory.unreleased_bytes != 0 {
        return Err(format!("budget {} broken: {memory:?}", case.budget));
    }
    if growth > case.budget as isize + SLACK {
        return Err(format!(
            "the host's heap grew by {growth} bytes for a budget of {} (slack {SLACK})",
            case.budget
        ));
    }
    match &outcome.failure {
        None => {}
        // The guest's own trapping tool (whatever name the script gave it): its task ends,
        // cleanly, and nothing is left to check.
        Some(TaskFailure::Trap(message)) if message.contains("t_trap") => {
            return Ok(growth - case.budget as isize);
        }
        Some(other) => return Err(format!("the task failed: {other}")),
    }
    let results: Vec<i32> = outcome
        .stdout
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if results.len() != case.script.ops.len() {
        return Err(format!(
            "{} results for {} steps",
            results.len(),
            case.script.ops.len()
        ));
    }
    for (step, (&op, &result)) in case.script.ops.iter().zip(&results).enumerate() {
        *coverage
            .entry((OPS[op], if result >= 0 { 1 } else { result }))
            .or_default() += 1;
        if result < 0 && !documented(op).contains(&result) {
            return Err(format!(
                "step {step}: {} returned {result}, which docs/abi.md does not give it",
                OPS[op]
            ));
        }
    }
    Ok(growth - case.budget as isize)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn random_hostcall_sequences_keep_the_host_whole() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = env_u64("QUIVER_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let secs = env_u64("QUIVER_FUZZ_SECS").unwrap_or(3);
    eprintln!(
        "fuzz_abi: seed {seed} for {secs} s; replay with QUIVER_FUZZ_SEED={seed} cargo test -p quiver-tests --test fuzz_abi"
    );
    quiver_tests::init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rig = rig().await;
        // The first task starts the MCP server and fills the host's caches; later growth is
        // the tasks' own.
        let mut warm = Rng(seed);
        let warm_up = case(warm.next());
        let mut coverage = Coverage::new();
        let _ = run_case(&rig, &warm_up, "warm-up", &mut coverage).await;
        let started = Instant::now();
        let mut cases = 0u64;
        let mut steps = 0usize;
        let mut beyond = isize::MIN;
        while cases == 0 || started.elapsed() < Duration::from_secs(secs) {
            let case_seed = seed ^ cases.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let case = case(case_seed);
            steps += case.script.ops.len();
            match run_case(&rig, &case, &format!("fuzz-{cases}"), &mut coverage).await {
                Ok(over) => beyond = beyond.max(over),
                Err(failure) => panic!(
                    "fuzz_abi: case {cases} of seed {seed} failed: {failure}\nreplay: QUIVER_FUZZ_SEED={seed} cargo test -p quiver-tests --test fuzz_abi"
                ),
            }
            cases += 1;
        }
        eprintln!(
            "fuzz_abi: {cases} cases, {steps} steps, no failure; the heap grew at most {beyond} bytes past a budget"
        );
        let covered: Vec<String> = coverage
            .iter()
            .filter(|((op, _), _)| *op != "poke")
            .map(|((op, result), n)| match result {
                1 => format!("{op} ok {n}"),
                errno => format!("{op} {errno} {n}"),
            })
            .collect();
        eprintln!("fuzz_abi: results: {}", covered.join(", "));
        rig.host.shutdown().await;
    });
}

/// The estimates the budget charges guest JSON with are upper bounds of what parsing it
/// really allocates, for the shapes that amplify most.
#[test]
fn charged_json_costs_cover_what_parsing_really_allocates() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let texts = [
        format!("[{}]", vec![r#"{"a":0}"#; 5000].join(",")),
        format!("[{}]", vec!["[]"; 20_000].join(",")),
        format!("[{}]", vec!["[1]"; 10_000].join(",")),
        format!("[{}]", vec![r#""x""#; 10_000].join(",")),
        format!(
            "{{{}}}",
            (0..5000)
                .map(|i| format!(r#""k{i}":{{}}"#))
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!("{}1{}", "[".repeat(120), "]".repeat(120)),
        json!({"role": "user", "content": "é".repeat(100_000)}).to_string(),
    ];
    for text in texts {
        let charged = quiver::json_charge(text.as_bytes()).unwrap() as isize;
        let (parsed, grown) = runtime.block_on(heap_growth(async {
            serde_json::from_slice::<Value>(text.as_bytes()).unwrap()
        }));
        drop(parsed);
        assert!(
            grown <= charged,
            "{}...: parsing took {grown} bytes, {charged} were charged",
            &text[..40.min(text.len())]
        );
    }
}
