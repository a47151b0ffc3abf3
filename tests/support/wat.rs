//! Small WAT guests for ABI edge cases.
//!
//! [`guest`] wraps a test's `$main` with every `spear` import and three helpers:
//! `(call $out X)` records an i32 result (all results go to stdout as little-endian i32s
//! when `$main` returns), `(call $emit PTR LEN)` writes bytes and a newline to stderr, and
//! `(call $cap PTR N)` / `(call $len PTR)` set and read a `u32` length slot.
//!
//! Memory layout (4 pages): 0..16 scratch, 1024..4096 test data, 4096..8192 results,
//! 8192..16384 length slots, 16384.. output buffers.

use quiver::{Host, TaskOutcome, TaskSpec};

const PRELUDE: &str = r#"
  (import "spear" "log" (func $log (param i32 i32 i32) (result i32)))
  (import "spear" "time_now_ms" (func $time_now_ms (result i64)))
  (import "spear" "mcp_open" (func $mcp_open (param i32 i32) (result i32)))
  (import "spear" "mcp_list_tools" (func $mcp_list_tools (param i32 i32 i32) (result i32)))
  (import "spear" "mcp_call_tool" (func $mcp_call_tool (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_close" (func $mcp_close (param i32) (result i32)))
  (import "spear" "mcp_registry_list" (func $mcp_registry_list (param i32 i32) (result i32)))
  (import "spear" "mcp_registry_get" (func $mcp_registry_get (param i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_list_resources" (func $mcp_list_resources (param i32 i32 i32) (result i32)))
  (import "spear" "mcp_list_resource_templates" (func $mcp_list_resource_templates (param i32 i32 i32) (result i32)))
  (import "spear" "mcp_read_resource" (func $mcp_read_resource (param i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_list_prompts" (func $mcp_list_prompts (param i32 i32 i32) (result i32)))
  (import "spear" "mcp_get_prompt" (func $mcp_get_prompt (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_set_param" (func $mcp_set_param (param i32 i32 i32) (result i32)))
  (import "spear" "mcp_call_start" (func $mcp_call_start (param i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "mcp_call_recv" (func $mcp_call_recv (param i32 i32 i32) (result i32)))
  (import "spear" "cchat_create" (func $cchat_create (result i32)))
  (import "spear" "cchat_write_msg" (func $cchat_write_msg (param i32 i32 i32 i32 i32) (result i32)))
  (import "spear" "cchat_write_fn" (func $cchat_write_fn (param i32 i32 i32 i32) (result i32)))
  (import "spear" "cchat_ctl" (func $cchat_ctl (param i32 i32 i32 i32) (result i32)))
  (import "spear" "cchat_send" (func $cchat_send (param i32 i32) (result i32)))
  (import "spear" "cchat_recv" (func $cchat_recv (param i32 i32 i32) (result i32)))
  (import "spear" "cchat_close" (func $cchat_close (param i32) (result i32)))
  (import "spear" "wall_time_s" (func $wall_time_s (result i64)))
  (import "spear" "sleep_ms" (func $sleep_ms (param i32)))
  (import "spear" "random_i64" (func $random_i64 (result i64)))
  (import "spear" "spear_epoll_create" (func $epoll_create (result i32)))
  (import "spear" "spear_epoll_ctl" (func $epoll_ctl (param i32 i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_wait" (func $epoll_wait (param i32 i32 i32 i32) (result i32)))
  (import "spear" "spear_epoll_close" (func $epoll_close (param i32) (result i32)))
  (import "spear" "spear_fd_ctl" (func $fd_ctl (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (global $n (mut i32) (i32.const 0))
  (func $out (param $v i32)
    (i32.store (i32.add (i32.const 4096) (i32.shl (global.get $n) (i32.const 2))) (local.get $v))
    (global.set $n (i32.add (global.get $n) (i32.const 1))))
  (func $emit (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store8 (i32.const 12) (i32.const 10))
    (i32.store (i32.const 0) (i32.const 12))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func $cap (param $ptr i32) (param $v i32) (i32.store (local.get $ptr) (local.get $v)))
  (func $len (param $ptr i32) (result i32) (i32.load (local.get $ptr)))
  (func (export "_start")
    (call $main)
    (i32.store (i32.const 0) (i32.const 4096))
    (i32.store (i32.const 4) (i32.shl (global.get $n) (i32.const 2)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
"#;

/// A guest module: `data` segments (address, bytes) and a body defining `(func $main)`.
pub fn guest(data: &[(u32, &[u8])], body: &str) -> String {
    let mut out = String::from("(module\n");
    out.push_str(PRELUDE);
    for (addr, bytes) in data {
        let escaped: String = bytes.iter().map(|b| format!("\\{b:02x}")).collect();
        out.push_str(&format!("  (data (i32.const {addr}) \"{escaped}\")\n"));
    }
    out.push_str(body);
    out.push_str("\n)\n");
    out
}

/// The i32 results a guest recorded with `$out`.
pub fn results(stdout: &[u8]) -> Vec<i32> {
    stdout
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// What a WAT guest run produced.
pub struct WatRun {
    pub results: Vec<i32>,
    /// Lines the guest wrote with `$emit`.
    pub emitted: Vec<String>,
    pub outcome: TaskOutcome,
}

/// Compiles and runs a WAT guest with captured output.
pub async fn run(host: &Host, wat: &str, task: &TaskSpec) -> WatRun {
    let module = host
        .load_module("test.wat", wat.as_bytes())
        .expect("WAT compiles");
    let task = task.clone().with_captured_output();
    let outcome = host.run_task(&module, &task).await.expect("task starts");
    WatRun {
        results: results(&outcome.stdout),
        emitted: outcome.stderr_text().lines().map(str::to_owned).collect(),
        outcome,
    }
}

/// [`run`], asserting that the task ended without a failure (the failure and the guest's
/// stderr are shown if not).
pub async fn run_ok(host: &Host, wat: &str, task: &TaskSpec) -> WatRun {
    let run = run(host, wat, task).await;
    assert!(
        run.outcome.failure.is_none(),
        "{:?}\n{}",
        run.outcome.failure,
        run.outcome.stderr_text()
    );
    run
}

/// A guest that, for each `(server_id, tool, arguments)`, opens the server, calls the tool
/// (recording the fd and `mcp_call_tool`'s return with `$out`), emits the JSON result of
/// each call that did not fail with an errno and closes the fd. `repeat` runs the whole list that many times.
pub fn mcp_calls(steps: &[(&str, &str, &str)], repeat: u32) -> String {
    let mut data: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut at = 1024u32;
    let mut place = |bytes: &[u8]| {
        let here = at;
        data.push((here, bytes.to_vec()));
        at += (bytes.len() as u32).next_multiple_of(8) + 8;
        assert!(at < 4096, "mcp_calls: steps do not fit the test data area");
        (here, bytes.len() as u32)
    };
    let mut body = String::new();
    for (server, tool, args) in steps {
        let (s, sl) = place(server.as_bytes());
        let (t, tl) = place(tool.as_bytes());
        let (a, al) = place(args.as_bytes());
        body.push_str(&format!(
            "(local.set $fd (call $mcp_open (i32.const {s}) (i32.const {sl}))) (call $out (local.get $fd))
             (call $cap (i32.const 8192) (i32.const 65536))
             (local.set $r (call $mcp_call_tool (local.get $fd) (i32.const {t}) (i32.const {tl}) (i32.const {a}) (i32.const {al}) (i32.const 16384) (i32.const 8192)))
             (call $out (local.get $r))
             (if (i32.ge_s (local.get $r) (i32.const 0)) (then (call $emit (i32.const 16384) (call $len (i32.const 8192)))))
             (drop (call $mcp_close (local.get $fd)))\n"
        ));
    }
    let data: Vec<(u32, &[u8])> = data.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    guest(
        &data,
        &format!(
            "(func $main (local $fd i32) (local $r i32) (local $i i32)
               (block $done (loop $again
                 (br_if $done (i32.ge_u (local.get $i) (i32.const {repeat})))
                 {body}
                 (local.set $i (i32.add (local.get $i) (i32.const 1)))
                 (br $again))))"
        ),
    )
}
