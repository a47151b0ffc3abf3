//! Hostile guests against the real host: floods of every kind of host state a guest can
//! grow end in `-ENOMEM` at the task's host memory budget (`limits.host_memory_bytes`), and
//! closing frees room; inputs past every bound get their errno; re-entrant guest tools,
//! loops, memory and stack bombs end only their task, with every charge given back, and the
//! host runs the next task. WAT guests (tests/support/wat.rs), the scripted LLM server and
//! the fixture MCP server are all real. (abi_edges.rs covers the MCP calls' bad pointers, a
//! looping `_start` and growing memory past its limit; chat.rs the chat calls' bad fds,
//! roles and params.)

use std::time::Duration;

use quiver::{Host, TaskFailure, TaskOutcome, TaskSpec};
use quiver_tests::chat_wat::scripted_host;
use quiver_tests::errno::{EBADF, EFAULT, EINVAL, ENOMEM, ENOSPC};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, mcp_task};
use serde_json::{Value, json};

/// WASI's errno for "not enough memory" (fd_write on captured output past the budget).
const WASI_ENOMEM: i32 = 48;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Where big payloads go (below the tool arena at 196608).
const BIG: u32 = 65_536;

/// Guest tools every guest here carries, and `$s`, the session they act on.
const TOOLS: &str = r#"
  (table (export "__indirect_function_table") 10 funcref)
  (elem (i32.const 1) $t_ok $t_send $t_close $t_deep $t_spin $t_grow $t_recurse $t_14k $t_17m)
  (global $s (mut i32) (i32.const -1))
  ;; 1: answers with nothing
  (func $t_ok (param i32 i32 i32) (param $ol i32) (result i32)
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  ;; 2: sends its own session again (one request), recording the response fd
  (func $t_send (param i32 i32 i32) (param $ol i32) (result i32)
    (call $out (call $cchat_send (global.get $s) (i32.const 0)))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  ;; 3: closes its own session
  (func $t_close (param i32 i32 i32) (param $ol i32) (result i32)
    (call $out (call $cchat_close (global.get $s)))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  ;; 4: sends its own session with AUTO_TOOL_CALL, which calls this tool again
  (func $t_deep (param i32 i32 i32) (param $ol i32) (result i32)
    (drop (call $cchat_send (global.get $s) (i32.const 2)))
    (i32.store (local.get $ol) (i32.const 0)) (i32.const 0))
  ;; 5: never returns
  (func $t_spin (param i32 i32 i32 i32) (result i32) (loop $l (br $l)) (i32.const 0))
  ;; 6: grows memory until it cannot
  (func $t_grow (param i32 i32 i32 i32) (result i32)
    (loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) (i32.const 0))
  ;; 7: recurses without end
  (func $t_recurse (param i32 i32 i32 i32) (result i32) (call $bottomless) (i32.const 0))
  (func $bottomless (call $bottomless))
  ;; 8: asks for 14 KiB with -ENOSPC, then answers with 14 KiB of whatever the buffer holds
  (func $t_14k (param i32 i32 i32) (param $ol i32) (result i32)
    (if (result i32) (i32.lt_u (i32.load (local.get $ol)) (i32.const 14336))
      (then (i32.store (local.get $ol) (i32.const 14336)) (i32.const -28))
      (else (i32.store (local.get $ol) (i32.const 14336)) (i32.const 0))))
  ;; 9: answers with 17 MiB of whatever the buffer holds
  (func $t_17m (param i32 i32 i32) (param $ol i32) (result i32)
    (i32.store (local.get $ol) (i32.const 17825792)) (i32.const 0))
"#;

/// A guest's data segments, placed from 1024 up (small) or at [`BIG`] (one large payload).
struct Data {
    segments: Vec<(u32, Vec<u8>)>,
    next: u32,
}

impl Data {
    fn new() -> Self {
        Self {
            segments: Vec::new(),
            next: 1024,
        }
    }

    fn put(&mut self, bytes: &[u8]) -> (u32, u32) {
        let at = self.next;
        self.next += (bytes.len() as u32).next_multiple_of(8) + 8;
        assert!(self.next <= 4096, "small data must stay below the results");
        self.segments.push((at, bytes.to_vec()));
        (at, bytes.len() as u32)
    }

    fn big(&mut self, bytes: &[u8]) -> (u32, u32) {
        assert!(bytes.len() <= 130_000);
        self.segments.push((BIG, bytes.to_vec()));
        (BIG, bytes.len() as u32)
    }

    fn module(&self, body: &str) -> String {
        let segments: Vec<(u32, &[u8])> = self
            .segments
            .iter()
            .map(|(at, bytes)| (*at, bytes.as_slice()))
            .collect();
        wat::guest(&segments, &format!("{TOOLS}\n{body}"))
    }
}

/// `(local.set $r CALL)` repeated while `ok` holds for `$r` (at most 2000 times), counting
/// successes in `$n` and keeping each `$r` at 20000 + 4n; then records `$n` and the `$r`
/// that stopped it.
fn flood(before: &str, call: &str, ok: &str) -> String {
    format!(
        r#"(local.set $n (i32.const 0))
      (block $stop (loop $more
        {before}
        (local.set $r {call})
        (br_if $stop (i32.eqz {ok}))
        (i32.store (i32.add (i32.const 20000) (i32.shl (local.get $n) (i32.const 2))) (local.get $r))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br_if $stop (i32.ge_u (local.get $n) (i32.const 2000)))
        (br $more)))
      (call $out (local.get $n)) (call $out (local.get $r))"#
    )
}

/// Calls `close` on every `$r` a [`flood`] kept.
fn close_kept(close: &str) -> String {
    format!(
        r#"(local.set $i (i32.const 0))
      (block $done (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call {close} (i32.load (i32.add (i32.const 20000) (i32.shl (local.get $i) (i32.const 2))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))"#
    )
}

/// Writes `n` as four letters a..p at `at` (a distinct name per flood step).
fn name_from_n(at: u32) -> String {
    (0..4)
        .map(|k| {
            format!(
                "(i32.store8 (i32.const {}) (i32.add (i32.const 97) (i32.and (i32.shr_u (local.get $n) (i32.const {})) (i32.const 15))))",
                at + k,
                4 * k
            )
        })
        .collect()
}

fn main_with(body: &str) -> String {
    format!("(func $main (local $n i32) (local $r i32) (local $i i32) (local $fd i32)\n{body})")
}

struct Setup {
    llm: ScriptedLlm,
    host: Host,
    _registry: RegistryDir,
}

async fn setup(script: Vec<Reply>) -> Setup {
    let llm = ScriptedLlm::start(script).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "count"], "");
    let host = scripted_host(&registry, &llm);
    Setup {
        llm,
        host,
        _registry: registry,
    }
}

fn budgeted(task_id: &str, limit: u64) -> TaskSpec {
    mcp_task(task_id, &["fixture"]).with_host_memory_limit(limit)
}

/// Every charge was within the budget and was given back.
fn assert_accounted(outcome: &TaskOutcome, limit: u64) {
    let memory = outcome.host_memory;
    assert_eq!(memory.limit_bytes, limit);
    assert!(memory.peak_bytes <= limit, "{memory:?}");
    assert_eq!(memory.unreleased_bytes, 0, "{memory:?}");
}

async fn run_ok(setup: &Setup, module: &str, task: &TaskSpec) -> WatRun {
    wat::run_ok(&setup.host, module, task).await
}

/// The host still runs a chat task to the end after whatever came before.
async fn assert_host_usable(setup: &Setup) {
    setup.llm.push(Reply::text("still here"));
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (hi, hi_len) = data.put(b"hi");
    let body = main_with(&format!(
        r#"(local.set $fd (call $cchat_create))
      (call $out (call $cchat_write_msg (local.get $fd) (i32.const {user}) (i32.const {user_len}) (i32.const {hi}) (i32.const {hi_len})))
      (local.set $r (call $cchat_send (local.get $fd) (i32.const 0)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_recv (local.get $r) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))"#
    ));
    let run = run_ok(setup, &data.module(&body), &budgeted("after", MIB)).await;
    assert_eq!(run.results[0], 0);
    assert!(run.results[1] > 0, "{:?}", run.results);
    let answer: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "still here");
    assert_accounted(&run.outcome, MIB);
}

#[tokio::test]
async fn a_flood_of_messages_hits_enomem_and_closing_the_session_frees_it() {
    let setup = setup(vec![]).await;
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (content, content_len) = (BIG, 64 * 1024);
    let write = |session: &str| {
        format!(
            "(call $cchat_write_msg {session} (i32.const {user}) (i32.const {user_len}) (i32.const {content}) (i32.const {content_len}))"
        )
    };
    let message =
        serde_json::to_vec(&json!({"role": "user", "content": "x".repeat(60_000)})).unwrap();
    let (big, big_len) = data.big(&message);
    let body = main_with(&format!(
        r#"(global.set $s (call $cchat_create))
      {write_flood}
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      (call $out (global.get $s))
      (call $out {write_one})
      (call $cap (i32.const 8192) (i32.const {big_len}))
      {add_flood}
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      (call $out (call $cchat_ctl (global.get $s) (i32.const 3) (i32.const {big}) (i32.const 8192)))"#,
        write_flood = flood("", &write("(global.get $s)"), "(i32.eqz (local.get $r))"),
        write_one = write("(global.get $s)"),
        add_flood = flood(
            "",
            &format!(
                "(call $cchat_ctl (global.get $s) (i32.const 3) (i32.const {big}) (i32.const 8192))"
            ),
            "(i32.eqz (local.get $r))"
        ),
    ));
    let task = budgeted("messages", MIB);
    let run = run_ok(&setup, &data.module(&body), &task).await;
    let r = &run.results;
    assert!((10..=16).contains(&r[0]), "64 KiB messages in 1 MiB: {r:?}");
    assert_eq!(r[1], ENOMEM, "cchat_write_msg at the budget");
    assert_eq!(r[2], 0, "close");
    assert!(r[3] >= 0 && r[4] == 0, "room again after the close: {r:?}");
    assert!((10..=16).contains(&r[5]), "ADD_MESSAGE of 60 KB: {r:?}");
    assert_eq!(r[6], ENOMEM, "ADD_MESSAGE at the budget");
    assert_eq!(r[7], 0);
    assert_eq!(r[8], 0, "room again after the close");
    assert_accounted(&run.outcome, MIB);
}

#[tokio::test]
async fn floods_of_tools_and_params_hit_enomem_and_replacing_one_does_not_add_up() {
    let setup = setup(vec![]).await;
    let mut data = Data::new();
    let tool = json!({"type": "function", "function": {"name": "taaaa", "description": "d".repeat(30_000)}});
    let tool = serde_json::to_vec(&tool).unwrap();
    let tool_name = BIG + find(&tool, b"taaaa") as u32 + 1;
    let param = serde_json::to_vec(&json!({"value": "v".repeat(30_000), "key": "kaaaa"})).unwrap();
    let mut both = tool.clone();
    both.resize(40_000, b' ');
    let param_at = BIG + 40_000;
    let param_key = param_at + find(&param, b"kaaaa") as u32 + 1;
    both.extend_from_slice(&param);
    data.big(&both);
    let (tool_len, param_len) = (tool.len(), param.len());
    let write_fn = format!(
        "(call $cchat_write_fn (global.get $s) (i32.const 1) (i32.const {BIG}) (i32.const {tool_len}))"
    );
    let set_param = format!(
        "(call $cchat_ctl (global.get $s) (i32.const 1) (i32.const {param_at}) (i32.const 8192))"
    );
    let same_again = |call: &str| {
        format!(
            r#"(local.set $i (i32.const 0)) (local.set $fd (i32.const 0))
      (block $done (loop $again
        (br_if $done (i32.ge_u (local.get $i) (i32.const 100)))
        (local.set $fd (i32.or (local.get $fd) {call}))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $again)))
      (call $out (local.get $fd))"#
        )
    };
    let body = main_with(&format!(
        r#"(global.set $s (call $cchat_create))
      {tool_flood}
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      {tool_again}
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      (call $cap (i32.const 8192) (i32.const {param_len}))
      {param_flood}
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      {param_again}"#,
        tool_flood = flood(
            &name_from_n(tool_name),
            &write_fn,
            "(i32.eqz (local.get $r))"
        ),
        tool_again = same_again(&write_fn),
        param_flood = flood(
            &name_from_n(param_key),
            &set_param,
            "(i32.eqz (local.get $r))"
        ),
        param_again = same_again(&set_param),
    ));
    let run = run_ok(&setup, &data.module(&body), &budgeted("tools", MIB)).await;
    let r = &run.results;
    assert!((15..=34).contains(&r[0]), "30 KB tools in 1 MiB: {r:?}");
    assert_eq!(r[1], ENOMEM, "cchat_write_fn at the budget");
    assert_eq!(r[2], 0);
    assert_eq!(r[3], 0, "registering one tool 100 times never runs out");
    assert_eq!(r[4], 0);
    assert!((15..=34).contains(&r[5]), "30 KB params in 1 MiB: {r:?}");
    assert_eq!(r[6], ENOMEM, "SET_PARAM at the budget");
    assert_eq!(r[7], 0);
    assert_eq!(r[8], 0, "setting one param 100 times never runs out");
    assert_accounted(&run.outcome, MIB);
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in haystack")
}

#[tokio::test]
async fn a_flood_of_kept_outputs_and_fds_hits_enomem_and_closing_frees_it() {
    let setup = setup(vec![]).await;
    let mut data = Data::new();
    let (fixture, fixture_len) = data.put(b"fixture");
    let open = format!("(call $mcp_open (i32.const {fixture}) (i32.const {fixture_len}))");
    // Each fd lists the tools into a zero-size buffer, so the host keeps the list on it.
    let open_and_keep = format!(
        r#"(block $kept (result i32)
          (local.set $fd {open})
          (if (i32.lt_s (local.get $fd) (i32.const 0)) (then (br $kept (local.get $fd))))
          (call $cap (i32.const 8192) (i32.const 0))
          (local.set $r (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
          (if (i32.ne (local.get $r) (i32.const {ENOSPC})) (then (drop (call $mcp_close (local.get $fd)))))
          (select (local.get $fd) (local.get $r) (i32.eq (local.get $r) (i32.const {ENOSPC}))))"#
    );
    let body = main_with(&format!(
        r#"{kept_flood}
      (call $out (call $len (i32.const 8192)))
      {close_all}
      (local.set $fd {open})
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $out (call $mcp_close (local.get $fd)))
      {fd_flood}
      {close_chats}
      (call $out (call $cchat_create))"#,
        kept_flood = flood(
            "",
            &open_and_keep,
            "(i32.ge_s (local.get $r) (i32.const 0))"
        ),
        close_all = close_kept("$mcp_close"),
        fd_flood = flood(
            "",
            "(call $cchat_create)",
            "(i32.ge_s (local.get $r) (i32.const 0))"
        ),
        close_chats = close_kept("$cchat_close"),
    ));
    let limit = 256 * KIB;
    let run = run_ok(&setup, &data.module(&body), &budgeted("kept", limit)).await;
    let r = &run.results;
    assert!((10..=200).contains(&r[0]), "fds keeping a tool list: {r:?}");
    assert_eq!(r[1], ENOMEM, "mcp_open or the kept list at the budget");
    assert!(r[2] > 100, "an ENOMEM list still reports its length: {r:?}");
    assert!(r[3] > 100, "closing the fds made room: {r:?}");
    assert_eq!(r[4], 0);
    assert!(r[5] > 50, "empty chat sessions, one fd each: {r:?}");
    assert_eq!(
        r[6], ENOMEM,
        "cchat_create at the budget, before the fd cap"
    );
    assert!(r[7] >= 0, "closing made room again: {r:?}");
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn a_kept_result_is_handed_back_even_when_the_budget_is_spent() {
    let setup = setup(vec![]).await;
    let mut data = Data::new();
    let (fixture, fixture_len) = data.put(b"fixture");
    let (user, user_len) = data.put(b"user");
    let (echo, echo_len) = data.put(b"echo");
    let args = serde_json::to_vec(&json!({"text": "e".repeat(20_000)})).unwrap();
    let (args_at, args_len) = data.big(&args);
    let call = format!(
        "(call $mcp_call_tool (local.get $fd) (i32.const {echo}) (i32.const {echo_len}) (i32.const {args_at}) (i32.const {args_len}) (i32.const 100000) (i32.const 8192))"
    );
    let body = main_with(&format!(
        r#"(local.set $fd (call $mcp_open (i32.const {fixture}) (i32.const {fixture_len})))
      (call $cap (i32.const 8192) (i32.const 0))
      (call $out {call})
      (global.set $s (call $cchat_create))
      {fill}
      (call $cap (i32.const 8192) (i32.const 60000))
      (call $out {call})"#,
        fill = flood(
            "",
            &format!(
                "(call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {BIG}) (i32.const 4000))"
            ),
            "(i32.eqz (local.get $r))"
        ),
    ));
    let limit = 256 * KIB;
    let run = run_ok(&setup, &data.module(&body), &budgeted("retry", limit)).await;
    let r = &run.results;
    assert_eq!(r[0], ENOSPC);
    assert_eq!(r[2], ENOMEM, "the budget is spent: {r:?}");
    assert!(r[3] > 20_000, "the retry gets the kept result: {r:?}");
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn a_flood_of_responses_hits_enomem_and_closing_them_frees_it() {
    let answers = (0..40).map(|_| Reply::text("a".repeat(100_000))).collect();
    let setup = setup(answers).await;
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (hi, hi_len) = data.put(b"hi");
    let send_one = format!(
        r#"(block $sent (result i32)
          (global.set $s (call $cchat_create))
          (drop (call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {hi}) (i32.const {hi_len})))
          (local.set $fd (call $cchat_send (global.get $s) (i32.const 0)))
          (drop (call $cchat_close (global.get $s)))
          (local.get $fd))"#
    );
    let body = main_with(&format!(
        r#"{responses}
      {close_all}
      (call $out {send_one})"#,
        responses = flood("", &send_one, "(i32.ge_s (local.get $r) (i32.const 0))"),
        close_all = close_kept("$cchat_close"),
    ));
    let limit = MIB;
    let run = run_ok(&setup, &data.module(&body), &budgeted("responses", limit)).await;
    let r = &run.results;
    assert!(
        (4..=10).contains(&r[0]),
        "100 KB answers kept in 1 MiB: {r:?}"
    );
    assert_eq!(r[1], ENOMEM, "cchat_send at the budget");
    assert!(r[2] >= 0, "closing the responses made room: {r:?}");
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn a_send_whose_copies_do_not_fit_is_enomem_and_sends_nothing() {
    let setup = setup(vec![Reply::text("small")]).await;
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    // Printable text: a session holds a message as the JSON text it is sent as, and a
    // control byte is six bytes there.
    let (content, _) = data.big(&[b'x'; 70_000]);
    let write = |len: u32| {
        format!(
            "(call $out (call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {content}) (i32.const {len})))"
        )
    };
    let body = main_with(&format!(
        r#"(global.set $s (call $cchat_create))
      {w1} {w2}
      (call $out (call $cchat_send (global.get $s) (i32.const 0)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_ctl (global.get $s) (i32.const 4) (i32.const 16384) (i32.const 8192)))
      (call $out (call $cchat_close (global.get $s)))
      (global.set $s (call $cchat_create))
      {w3}
      (call $out (call $cchat_send (global.get $s) (i32.const 0)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_ctl (global.get $s) (i32.const 4) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))"#,
        w1 = write(70_000),
        w2 = write(70_000),
        w3 = write(10),
    ));
    let limit = 256 * KIB;
    let run = run_ok(&setup, &data.module(&body), &budgeted("copies", limit)).await;
    let r = &run.results;
    assert_eq!(&r[..2], [0, 0]);
    assert_eq!(r[2], ENOMEM, "the request copy does not fit: {r:?}");
    assert_eq!(r[3], ENOMEM, "nor does a GET_MESSAGES copy");
    assert_eq!(setup.llm.request_count(), 1, "only the small send went out");
    assert!(r[6] >= 0 && r[7] > 0, "{r:?}");
    let messages: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(messages.as_array().unwrap().len(), 2, "user + the answer");
    assert_accounted(&run.outcome, limit);
}

/// A model's answer is charged as it is read and then for what it parses to: one larger
/// than the budget, one that would grow past it once parsed (a short text of empty
/// objects), or the same cut off before its end (a parse builds the objects before it
/// fails) is `-ENOMEM` for the send, and the next send works.
#[tokio::test]
async fn a_model_answer_past_the_budget_is_enomem_and_the_next_send_works() {
    let big = Reply::text("x".repeat(1536 * KIB as usize));
    let objects = vec![json!({}); 60_000];
    let amplified = Reply::Json(json!({
        "id": "chatcmpl-amplified",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "pad": objects,
    }));
    let cut_off = Reply::Garbage(format!(
        r#"{{"id":"chatcmpl-cut","object":"chat.completion","model":"scripted","choices":[{{"index":0,"finish_reason":"stop","message":{{"role":"assistant","content":"ok"}}}}],"pad":[{}"#,
        "{},".repeat(60_000)
    ));
    let setup = setup(vec![big, amplified, cut_off]).await;
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (hi, hi_len) = data.put(b"hi");
    let send = format!(
        r#"(local.set $fd (call $cchat_create))
      (call $out (call $cchat_write_msg (local.get $fd) (i32.const {user}) (i32.const {user_len}) (i32.const {hi}) (i32.const {hi_len})))
      (call $out (call $cchat_send (local.get $fd) (i32.const 0)))
      (call $out (call $cchat_close (local.get $fd)))"#
    );
    let body = main_with(&format!("{send}\n{send}\n{send}"));
    let run = run_ok(&setup, &data.module(&body), &budgeted("answers", MIB)).await;
    let r = &run.results;
    assert_eq!(r[1], ENOMEM, "an answer larger than the budget: {r:?}");
    assert_eq!(r[4], ENOMEM, "an answer that parses past the budget: {r:?}");
    assert_eq!(r[7], ENOMEM, "the same answer cut off: {r:?}");
    assert_eq!(setup.llm.request_count(), 3, "none is retried");
    assert_accounted(&run.outcome, MIB);
    assert_host_usable(&setup).await;
}

#[tokio::test]
async fn captured_output_past_the_budget_fails_the_write_not_the_task() {
    let setup = setup(vec![]).await;
    let body = main_with(&format!(
        r#"(i32.store (i32.const 0) (i32.const {BIG}))
      (i32.store (i32.const 4) (i32.const 65536))
      (block $full (loop $more
        (local.set $r (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
        (br_if $full (local.get $r))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br_if $full (i32.ge_u (local.get $n) (i32.const 1000)))
        (br $more)))
      (if (i32.ne (local.get $r) (i32.const {WASI_ENOMEM})) (then unreachable))"#
    ));
    let limit = MIB;
    let run = run_ok(
        &setup,
        &Data::new().module(&body),
        &budgeted("stdout", limit),
    )
    .await;
    let kept = run.outcome.stdout.len() as u64;
    assert!(
        (limit - 128 * KIB..=limit).contains(&kept),
        "{kept} bytes of stdout kept"
    );
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn inputs_past_every_bound_get_their_errno() {
    let setup = setup(vec![]).await;
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (bad, bad_len) = data.put(&[0xff, 0xfe]);
    let (fixture, fixture_len) = data.put(b"fixture");
    let (echo, echo_len) = data.put(b"echo");
    let over = 16 * 1024 * 1024 + 1;
    let huge_input = [
        format!(
            "(call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const 0) (i32.const {over}))"
        ),
        format!(
            "(call $cchat_write_fn (global.get $s) (i32.const 1) (i32.const 0) (i32.const {over}))"
        ),
        "(call $cap (i32.const 8192) (i32.const 16777217))".to_owned()
            + "(call $out (call $cchat_ctl (global.get $s) (i32.const 1) (i32.const 0) (i32.const 8192)))",
        "(call $cchat_ctl (global.get $s) (i32.const 3) (i32.const 0) (i32.const 8192))".to_owned(),
        format!(
            "(call $mcp_call_tool (local.get $fd) (i32.const {echo}) (i32.const {echo_len}) (i32.const 0) (i32.const {over}) (i32.const 16384) (i32.const 8192))"
        ),
        format!("(call $mcp_open (i32.const 0) (i32.const {over}))"),
    ];
    let outside = [
        format!(
            "(call $cchat_write_msg (global.get $s) (i32.const -4) (i32.const 4) (i32.const {user}) (i32.const 1))"
        ),
        format!(
            "(call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const 100) (i32.const -1))"
        ),
        "(call $cchat_write_fn (global.get $s) (i32.const 1) (i32.const 2147483647) (i32.const 2))"
            .to_owned(),
        "(call $cchat_ctl (global.get $s) (i32.const 1) (i32.const 0) (i32.const -4))".to_owned(),
        "(call $cchat_ctl (global.get $s) (i32.const 4) (i32.const 0) (i32.const 2147483647))"
            .to_owned(),
        "(call $cchat_recv (local.get $r) (i32.const -1) (i32.const 8192))".to_owned(),
    ];
    let not_utf8 = [
        format!(
            "(call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {bad}) (i32.const {bad_len}))"
        ),
        format!(
            "(call $cchat_write_msg (global.get $s) (i32.const {bad}) (i32.const {bad_len}) (i32.const {user}) (i32.const {user_len}))"
        ),
        format!(
            "(call $cchat_write_fn (global.get $s) (i32.const 1) (i32.const {bad}) (i32.const {bad_len}))"
        ),
    ];
    let record = |calls: &[String]| -> String {
        calls
            .iter()
            .map(|c| {
                if c.contains("$out") {
                    c.clone()
                } else {
                    format!("(call $out {c})")
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    setup.llm.push(Reply::text("ok"));
    let body = main_with(&format!(
        r#"(global.set $s (call $cchat_create))
      (local.set $fd (call $mcp_open (i32.const {fixture}) (i32.const {fixture_len})))
      (drop (call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {user}) (i32.const {user_len})))
      (local.set $r (call $cchat_send (global.get $s) (i32.const 0)))
      ;; room for an input over 16 MiB (17 MiB more)
      (call $out (i32.ge_s (memory.grow (i32.const 272)) (i32.const 0)))
      {huge}
      {outside}
      {not_utf8}
      (call $cap (i32.const 8192) (i32.const 2147483647))
      (call $out (call $cchat_recv (local.get $r) (i32.const 16384) (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_ctl (global.get $s) (i32.const 2) (i32.const 16384) (i32.const 8192)))
      (call $out (call $cchat_recv (global.get $s) (i32.const 16384) (i32.const 8192)))
      (call $out (call $cchat_send (local.get $r) (i32.const 0)))
      (call $out (call $mcp_close (global.get $s)))
      (call $out (call $cchat_close (local.get $fd)))"#,
        huge = record(&huge_input),
        outside = record(&outside),
        not_utf8 = record(&not_utf8),
    ));
    let run = run_ok(
        &setup,
        &data.module(&body),
        &mcp_task("bounds", &["fixture"]),
    )
    .await;
    let r = &run.results;
    assert_eq!(r[0], 1, "memory grew");
    assert_eq!(&r[1..6], [ENOMEM; 5], "inputs over 16 MiB");
    assert_eq!(r[6], EINVAL, "a server id is refused past 64 bytes");
    assert_eq!(
        &r[7..13],
        [EFAULT; 6],
        "pointers and lengths outside memory"
    );
    assert_eq!(&r[13..16], [EINVAL; 3], "text that is not UTF-8");
    assert_eq!(
        &r[16..],
        [EFAULT, EBADF, EBADF, EBADF, EBADF, EBADF],
        "a capacity past memory; fds of the wrong kind"
    );
}

/// A chat guest: a session in `$s` with one user message, the tool arena, `max_iterations`
/// 2, and the guest tools `tools` (name, table index) registered; then `rest`.
fn chat_guest(tools: &[(&str, u32)], rest: &str) -> String {
    chat_guest_with(&[], tools, rest)
}

/// [`chat_guest`] that also sets the session params `params`.
fn chat_guest_with(params: &[(&str, u64)], tools: &[(&str, u32)], rest: &str) -> String {
    let mut data = Data::new();
    let (user, user_len) = data.put(b"user");
    let (hi, hi_len) = data.put(b"hi");
    let mut setup = format!(
        r#"(global.set $s (call $cchat_create))
      (call $out (call $cchat_write_msg (global.get $s) (i32.const {user}) (i32.const {user_len}) (i32.const {hi}) (i32.const {hi_len})))"#
    );
    let arena = [
        ("tool_arena_ptr", 196_608),
        ("tool_arena_len", 16_384),
        ("max_iterations", 2),
    ];
    for &(key, value) in arena.iter().chain(params) {
        let (at, len) = data.put(json!({"key": key, "value": value}).to_string().as_bytes());
        setup.push_str(&format!(
            "\n(call $cap (i32.const 8192) (i32.const {len})) (call $out (call $cchat_ctl (global.get $s) (i32.const 1) (i32.const {at}) (i32.const 8192)))"
        ));
    }
    for (name, index) in tools {
        let definition = json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
        let (at, len) = data.put(definition.to_string().as_bytes());
        setup.push_str(&format!(
            "\n(call $out (call $cchat_write_fn (global.get $s) (i32.const {index}) (i32.const {at}) (i32.const {len})))"
        ));
    }
    data.module(&main_with(&format!("{setup}\n{rest}")))
}

const GET_MESSAGES: &str = r#"(call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_ctl (global.get $s) (i32.const 4) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))"#;

#[tokio::test]
async fn a_guest_tool_may_send_or_close_its_own_session_during_the_send() {
    let setup = setup(vec![
        Reply::tool_call("c1", "resend", json!({})),
        Reply::text("inner answer"),
        Reply::text("outer answer"),
        Reply::tool_call("c2", "closer", json!({})),
        Reply::text("answer to a closed session"),
    ])
    .await;
    let send =
        format!("(call $out (call $cchat_send (global.get $s) (i32.const 2)))\n{GET_MESSAGES}");
    let guest = chat_guest(&[("resend", 2), ("closer", 3)], &format!("{send}\n{send}"));
    let limit = MIB;
    let run = run_ok(&setup, &guest, &budgeted("reenter", limit)).await;
    let r = &run.results;
    assert!(r[..6].iter().all(|&v| v == 0), "setup: {r:?}");
    let (inner, outer) = (r[6], r[7]);
    assert!(inner > 0 && outer > 0 && inner != outer, "{r:?}");
    assert!(r[8] > 0, "GET_MESSAGES");
    let messages: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    let shape: Vec<(String, String)> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or_default().to_owned();
            let what = match (&m["content"], &m["tool_calls"]) {
                (Value::String(text), _) if role != "tool" => text.clone(),
                (_, Value::Array(calls)) => format!("calls {}", calls[0]["function"]["name"]),
                _ => "result".to_owned(),
            };
            (role, what)
        })
        .collect();
    let pairs: Vec<(&str, &str)> = shape
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("user", "hi"),
            ("assistant", "inner answer"),
            ("assistant", "calls \"resend\""),
            ("tool", "result"),
            ("assistant", "outer answer"),
        ],
        "what the inner send added comes first; the outer send's own messages follow"
    );
    // The second send's tool closed the session; the send still answers.
    assert_eq!(r[9], 0, "cchat_close from inside the tool");
    assert!(
        r[10] > 0,
        "the send that lost its session still has a response"
    );
    assert_eq!(r[11], EBADF, "the session is gone");
    assert_eq!(setup.llm.request_count(), 5);
    assert_accounted(&run.outcome, limit);
    assert_host_usable(&setup).await;
}

#[tokio::test]
async fn bottomless_reentrant_sends_end_the_task_and_the_host_carries_on() {
    let script = (0..400)
        .map(|i| Reply::tool_call(format!("d{i}"), "deeper", json!({})))
        .collect();
    let setup = setup(script).await;
    let guest = chat_guest(
        &[("deeper", 4)],
        "(call $out (call $cchat_send (global.get $s) (i32.const 2)))",
    );
    let limit = MIB;
    let run = run_ok(&setup, &guest, &budgeted("deep", limit)).await;
    // Each level would hold a fiber stack of the host's shared pool; past the nesting
    // bound the tool fails, the model is told, and every send unwinds with an answer.
    assert!(
        run.results.last().is_some_and(|&fd| fd > 0),
        "{:?}",
        run.results
    );
    let nested_error = setup.llm.requests().iter().any(|request| {
        quiver_tests::llm::tool_results(request)
            .iter()
            .any(|(_, content)| content.contains("at most 4 deep"))
    });
    assert!(nested_error, "the model was told why the tool failed");
    setup.llm.clear_script();
    assert_accounted(&run.outcome, limit);
    assert_host_usable(&setup).await;
}

/// Guest tool calls take their fiber stacks from the host's own share (a quarter of the
/// running slots), so a task nesting them can never take the stack a newly admitted task
/// needs: on a host with 8 slots (2 such stacks), the third nested call fails alone and
/// the model is told why.
#[tokio::test]
async fn guest_tools_draw_on_the_hosts_share_of_stacks_and_fail_alone_past_it() {
    let script = (0..10)
        .map(|i| Reply::tool_call(format!("d{i}"), "deeper", json!({})))
        .collect();
    let llm = ScriptedLlm::start(script).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "count"], "");
    let host = quiver_tests::chat_wat::scripted_host_builder(&registry, &llm)
        .with_max_concurrent_tasks(8)
        .build()
        .expect("host");
    let setup = Setup {
        llm,
        host,
        _registry: registry,
    };
    let guest = chat_guest(
        &[("deeper", 4)],
        "(call $out (call $cchat_send (global.get $s) (i32.const 2)))",
    );
    let run = run_ok(&setup, &guest, &budgeted("stacks", MIB)).await;
    assert!(
        run.results.last().is_some_and(|&fd| fd > 0),
        "{:?}",
        run.results
    );
    let refused = setup.llm.requests().iter().any(|request| {
        quiver_tests::llm::tool_results(request)
            .iter()
            .any(|(_, content)| content.contains("stacks for guest tool calls are all in use"))
    });
    assert!(refused, "the third nested call is refused with the reason");
    setup.llm.clear_script();
    assert_host_usable(&setup).await;
}

#[tokio::test]
async fn loops_and_bombs_inside_a_guest_tool_end_only_their_task() {
    let setup = setup(vec![]).await;
    for (tool, index, task) in [
        (
            "spin",
            5,
            budgeted("spin", MIB).with_deadline(Duration::from_millis(500)),
        ),
        ("grow", 6, budgeted("grow", MIB).with_memory_limit(8 * MIB)),
        ("recurse", 7, budgeted("recurse", MIB)),
    ] {
        setup.llm.push(Reply::tool_call("b", tool, json!({})));
        let guest = chat_guest(
            &[(tool, index)],
            "(call $out (call $cchat_send (global.get $s) (i32.const 2)))",
        );
        let run = wat::run(&setup.host, &guest, &task).await;
        match (tool, &run.outcome.failure) {
            ("spin", Some(TaskFailure::Deadline(after))) => {
                assert_eq!(*after, Duration::from_millis(500));
                assert_eq!(run.outcome.exit_code, 124);
            }
            ("grow" | "recurse", Some(TaskFailure::Trap(_))) => {
                assert_eq!(run.outcome.exit_code, 134)
            }
            (_, other) => panic!("{tool}: {other:?}"),
        }
        assert_accounted(&run.outcome, MIB);
        assert_host_usable(&setup).await;
    }
}

#[tokio::test]
async fn a_stack_bomb_and_a_memory_bomb_in_the_guest_itself_end_only_their_task() {
    let setup = setup(vec![]).await;
    let stack = Data::new().module(&main_with("(call $bottomless)"));
    let run = wat::run(&setup.host, &stack, &budgeted("stack", MIB)).await;
    assert!(
        matches!(&run.outcome.failure, Some(TaskFailure::Trap(m)) if m.contains("call stack exhausted")),
        "{:?}",
        run.outcome.failure
    );
    assert_accounted(&run.outcome, MIB);
    // Memory grown one page at a time until the limit; the host's cap holds even for a
    // task asking for all the memory there is.
    let memory = Data::new().module(&main_with(
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))",
    ));
    let greedy = budgeted("greedy", MIB).with_memory_limit(u64::MAX);
    let run = wat::run(&setup.host, &memory, &greedy).await;
    assert!(
        matches!(&run.outcome.failure, Some(TaskFailure::Trap(_))),
        "{:?}",
        run.outcome.failure
    );
    assert_accounted(&run.outcome, MIB);
    assert_host_usable(&setup).await;
}

/// Sends with AUTO_TOOL_CALL, then emits the response body.
const SEND_AND_RECV: &str = r#"(local.set $r (call $cchat_send (global.get $s) (i32.const 2)))
      (call $out (local.get $r))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $cchat_recv (local.get $r) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))"#;

#[tokio::test]
async fn each_mcp_result_of_a_turn_is_charged_as_it_arrives_and_one_past_the_budget_fails_alone() {
    // Twelve parallel 256 KiB results cannot all be held in 2 MiB: the ones that do not
    // fit fail as tool results the model sees; the send still answers.
    let calls = (0..12).map(|i| {
        (
            format!("b{i}"),
            "mcp__fixture__big",
            json!({"bytes": 256 * KIB}),
        )
    });
    let llm = ScriptedLlm::start(vec![Reply::tool_calls(calls), Reply::text("done")]).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["big"], "");
    let host = scripted_host(&registry, &llm);
    let guest = chat_guest_with(&[("max_tool_output_bytes", 1024)], &[], SEND_AND_RECV);
    let limit = 2 * MIB;
    let run = wat::run_ok(&host, &guest, &budgeted("turn", limit)).await;
    let r = &run.results;
    assert!(
        r[r.len() - 2] > 0,
        "the send answers rather than -ENOMEM: {r:?}"
    );
    let answer: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "done",
        "{answer}"
    );
    let results = quiver_tests::llm::tool_results(&llm.request(1));
    assert_eq!(results.len(), 12);
    let refused = results
        .iter()
        .filter(|(_, content)| {
            content
                .contains("host memory budget of the task is exhausted (limits.host_memory_bytes)")
        })
        .count();
    assert!(refused > 0 && refused < 12, "{refused} of 12 refused");
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn a_turn_past_the_host_cap_on_tool_calls_ends_the_send_whatever_the_session_allows() {
    let calls = (0..129).map(|i| (format!("c{i}"), "nothing", json!({})));
    let setup = setup(vec![Reply::tool_calls(calls), Reply::text("never asked")]).await;
    let guest = chat_guest_with(
        &[("max_total_tool_calls", 4_000_000_000)],
        &[],
        SEND_AND_RECV,
    );
    let run = run_ok(&setup, &guest, &budgeted("per-turn", 4 * MIB)).await;
    let answer: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(answer["error"]["code"], "tool_call_limit", "{answer}");
    assert_eq!(answer["error"]["limit"], "max_tool_calls_per_turn");
    assert_eq!(answer["error"]["value"], 128);
    assert_eq!(
        setup.llm.request_count(),
        1,
        "no tool ran and nothing more was asked"
    );
    setup.llm.clear_script();
    assert_accounted(&run.outcome, 4 * MIB);
}

#[tokio::test]
async fn guest_tool_outputs_past_the_budget_fail_alone_and_are_never_copied() {
    // A hundred 14 KiB outputs cannot all be held in 1.5 MiB; the ones that do not fit fail
    // as tool results the model sees, and the send still answers.
    let calls = (0..100).map(|i| (format!("g{i}"), "fourteen", json!({})));
    let setup = setup(vec![Reply::tool_calls(calls), Reply::text("done")]).await;
    let guest = chat_guest_with(
        &[
            ("max_tool_output_bytes", 512),
            ("max_total_tool_calls", 200),
        ],
        &[("fourteen", 8)],
        SEND_AND_RECV,
    );
    let limit = MIB + MIB / 2;
    let run = run_ok(&setup, &guest, &budgeted("guest-turn", limit)).await;
    let r = &run.results;
    assert!(
        r[r.len() - 2] > 0,
        "the send answers rather than -ENOMEM: {r:?}"
    );
    let results = quiver_tests::llm::tool_results(&setup.llm.request(1));
    assert_eq!(results.len(), 100);
    let refused = results
        .iter()
        .filter(|(_, content)| {
            content
                .contains("host memory budget of the task is exhausted (limits.host_memory_bytes)")
        })
        .count();
    assert!(refused > 0 && refused < 100, "{refused} of 100 refused");
    assert_accounted(&run.outcome, limit);
}

#[tokio::test]
async fn a_guest_tool_output_over_16_mib_is_reported_as_too_large() {
    let setup = setup(vec![
        Reply::tool_call("h", "huge", json!({})),
        Reply::text("done"),
    ])
    .await;
    let guest = chat_guest_with(
        &[
            ("tool_arena_len", 21 * MIB),
            ("max_tool_output_bytes", 32 * MIB),
        ],
        &[("huge", 9)],
        &format!("(drop (memory.grow (i32.const 400)))\n{SEND_AND_RECV}"),
    );
    let task = budgeted("huge", 4 * MIB).with_memory_limit(64 * MIB);
    let run = run_ok(&setup, &guest, &task).await;
    let results = quiver_tests::llm::tool_results(&setup.llm.request(1));
    assert_eq!(results.len(), 1);
    assert!(
        results[0].1.contains("is larger than the host takes"),
        "{results:?}"
    );
    assert_accounted(&run.outcome, 4 * MIB);
}

#[tokio::test]
async fn tool_arguments_whose_parsed_form_passes_the_budget_fail_that_call_alone() {
    // 450 KB of `[],` parse into far more than 3 MiB of values: charged before they are
    // built, they fail the call, and the model hears why.
    let pad = vec![json!([]); 150_000];
    let setup = setup(vec![
        Reply::tool_call("a", "mcp__fixture__echo", json!({"text": "x", "pad": pad})),
        Reply::text("done"),
    ])
    .await;
    let guest = chat_guest(&[], SEND_AND_RECV);
    let limit = 3 * MIB;
    let run = run_ok(&setup, &guest, &budgeted("args", limit)).await;
    let r = &run.results;
    assert!(r[r.len() - 2] > 0, "the send answers: {r:?}");
    let results = quiver_tests::llm::tool_results(&setup.llm.request(1));
    assert_eq!(results.len(), 1);
    assert!(
        results[0]
            .1
            .contains("host memory budget of the task is exhausted (limits.host_memory_bytes)"),
        "{results:?}"
    );
    assert_accounted(&run.outcome, limit);
}
