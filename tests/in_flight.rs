//! Work in flight: MCP calls started with `mcp_call_start` against the real fixture server,
//! and nonblocking `cchat_send` against the scripted LLM server, waited for with
//! `spear_epoll_wait`; with the bounds, the hostile arguments and closing a call that runs.

use std::time::{Duration, Instant};

use quiver::{ToolCall, ToolCallEnd, ToolObserver, ToolOutcome};
use quiver_tests::chat_wat::{ChatGuest, WEATHER, scripted_host};
use quiver_tests::errno::{EACCES, EAGAIN, EBADF, EFAULT, EINVAL, ENOSPC};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, host, host_builder, mcp_task};
use serde_json::{Value, json};

const EPOLLIN: i32 = 0x001;

const DATA: &[(u32, &[u8])] = &[
    (1024, b"fixture"),
    (1040, b"slow"),
    (1056, br#"{"ms":300}"#),
    (1072, br#"{"ms":60000}"#),
    (1100, b"echo"),
    (1120, br#"{"text":"hi"}"#),
    (1140, b"crash"),
    (1160, b"not json"),
    (1180, br#"{"set":["O_NONBLOCK"]}"#),
];

/// `(call $mcp_call_start fd name args)` for data at the given addresses.
fn start(name: (u32, u32), args: (u32, u32)) -> String {
    format!(
        "(call $mcp_call_start (local.get $fd) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const {}))",
        name.0, name.1, args.0, args.1
    )
}

const SLOW: (u32, u32) = (1040, 4);
const MS_300: (u32, u32) = (1056, 10);
const MS_60000: (u32, u32) = (1072, 12);

/// Waits on `$ep` until every call fd of `$a`, `$b`, `$c` was reported readable once,
/// deleting each as it comes; records each wait's count.
const WAIT_ALL: &str = r#"
  (local.set $left (i32.const 3))
  (block $done (loop $more
    (br_if $done (i32.eqz (local.get $left)))
    (call $cap (i32.const 8192) (i32.const 64))
    (local.set $n (call $epoll_wait (local.get $ep) (i32.const 16384) (i32.const 8192) (i32.const -1)))
    (call $out (local.get $n))
    (local.set $i (i32.const 0))
    (block $seen (loop $each
      (br_if $seen (i32.ge_s (local.get $i) (local.get $n)))
      (drop (call $epoll_ctl (local.get $ep) (i32.const 3)
        (i32.load (i32.add (i32.const 16384) (i32.shl (local.get $i) (i32.const 3)))) (i32.const 0)))
      (local.set $left (i32.sub (local.get $left) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $each)))
    (br $more)))
"#;

async fn run_mcp(registry: &RegistryDir, body: &str) -> (WatRun, Duration) {
    let host = host(registry);
    let started = Instant::now();
    let run = wat::run(
        &host,
        &wat::guest(DATA, body),
        &mcp_task("in-flight", &["fixture"]),
    )
    .await;
    let took = started.elapsed();
    host.shutdown().await;
    assert!(
        run.outcome.failure.is_none(),
        "{:?}\n{}",
        run.outcome.failure,
        run.outcome.stderr_text()
    );
    (run, took)
}

fn text_of(json: &str) -> String {
    let value: Value = serde_json::from_str(json).expect("JSON");
    value["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn three_mcp_calls_in_flight_overlap_and_each_answer_reads_with_the_buffer_protocol() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "");
    // Warm the server up first, so its start does not count in the calls' time.
    let body = format!(
        r#"(func $main (local $fd i32) (local $ep i32) (local $a i32) (local $b i32) (local $c i32)
      (local $left i32) (local $n i32) (local $i i32) (local $t i64)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
  (call $cap (i32.const 8192) (i32.const 65536))
  (drop (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
  (local.set $t (call $time_now_ms))
  (local.set $a {start})
  (local.set $b {start})
  (local.set $c {start})
  (call $out (i32.wrap_i64 (i64.sub (call $time_now_ms) (local.get $t))))
  ;; Not there yet.
  (call $cap (i32.const 8192) (i32.const 65536))
  (call $out (call $mcp_call_recv (local.get $a) (i32.const 16384) (i32.const 8192)))
  (local.set $ep (call $epoll_create))
  (drop (call $epoll_ctl (local.get $ep) (i32.const 1) (local.get $a) (i32.const 1)))
  (drop (call $epoll_ctl (local.get $ep) (i32.const 1) (local.get $b) (i32.const 1)))
  (drop (call $epoll_ctl (local.get $ep) (i32.const 1) (local.get $c) (i32.const 1)))
  {wait_all}
  (call $out (i32.wrap_i64 (i64.sub (call $time_now_ms) (local.get $t))))
  ;; Each answer: too small a buffer first, then the same bytes twice.
  (call $cap (i32.const 8192) (i32.const 4))
  (call $out (call $mcp_call_recv (local.get $a) (i32.const 16384) (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 65536))
  (call $out (call $mcp_call_recv (local.get $a) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 65536))
  (call $out (call $mcp_call_recv (local.get $b) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  (call $cap (i32.const 8192) (i32.const 65536))
  (call $out (call $mcp_call_recv (local.get $c) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  ;; GET_KIND says what a call fd is; closing it frees it.
  (call $cap (i32.const 8192) (i32.const 256))
  (call $out (call $fd_ctl (local.get $a) (i32.const 3) (i32.const 16384) (i32.const 8192)))
  (call $emit (i32.const 16384) (call $len (i32.const 8192)))
  (call $out (call $mcp_close (local.get $a)))
  (call $out (call $mcp_call_recv (local.get $a) (i32.const 16384) (i32.const 8192))))"#,
        start = start(SLOW, MS_300),
        wait_all = WAIT_ALL,
    );
    let (run, _) = run_mcp(&registry, &body).await;
    let r = &run.results;
    assert!(r[0] < 100, "starting three calls took {} ms", r[0]);
    assert_eq!(r[1], EAGAIN);
    let waits = r.len() - 2 - 8;
    let total = r[2 + waits];
    assert!(
        (300..600).contains(&total),
        "three 300 ms calls took {total} ms in flight: they did not overlap ({r:?})"
    );
    let after = &r[3 + waits..];
    assert_eq!(after[0], ENOSPC);
    assert!(
        after[1] > 4 && after[1] == after[2] && after[2] == after[3],
        "{r:?}"
    );
    assert_eq!(&after[4..], &[18, 0, EBADF]);
    for answer in &run.emitted[..3] {
        assert_eq!(text_of(answer), "slept 300ms");
    }
    assert_eq!(run.emitted[3], r#"{"kind":"McpCall"}"#);
}

#[tokio::test]
async fn calls_in_flight_keep_policy_bounds_and_cancel_on_close() {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow", "echo"],
        // Room for the flood: the task's share of the server is more than 64.
        "[budgets]\ntool_timeout_ms = 120000\nmax_concurrency = 200\n",
    );
    let body = format!(
        r#"(func $main (local $fd i32) (local $i i32) (local $rc i32) (local $first i32)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
  ;; Policy first: a tool outside the registry's list is EACCES and starts nothing.
  (call $out {crash})
  ;; Hostile arguments: not an MCP fd, bad pointers, invalid JSON.
  (call $out (call $mcp_call_start (i32.const 4242) (i32.const 1040) (i32.const 4) (i32.const 1056) (i32.const 10)))
  (call $out (call $mcp_call_start (local.get $fd) (i32.const -1) (i32.const 4) (i32.const 1056) (i32.const 10)))
  (call $out (call $mcp_call_start (local.get $fd) (i32.const 1040) (i32.const 4) (i32.const 1056) (i32.const 999999)))
  (call $out (call $mcp_call_start (local.get $fd) (i32.const 1040) (i32.const 9999) (i32.const 1056) (i32.const 10)))
  (call $out {not_json})
  (call $cap (i32.const 8192) (i32.const 64))
  (call $out (call $mcp_call_recv (local.get $fd) (i32.const 16384) (i32.const 8192)))
  ;; A flood of slow calls: 64 run at once, the next is EAGAIN.
  (block $done (loop $more
    (local.set $rc {slow})
    (br_if $done (i32.lt_s (local.get $rc) (i32.const 0)))
    (if (i32.eqz (local.get $i)) (then (local.set $first (local.get $rc))))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br $more)))
  (call $out (local.get $i))
  (call $out (local.get $rc))
  ;; Closing a call that runs cancels it and frees its place.
  (call $out (call $mcp_close (local.get $first)))
  (local.set $rc {echo})
  (call $out (i32.ge_s (local.get $rc) (i32.const 0)))
  ;; Reading it with bad pointers is EFAULT, whether the answer is there or not.
  (call $cap (i32.const 8192) (i32.const 64))
  (call $out (call $mcp_call_recv (local.get $rc) (i32.const -1) (i32.const 8192)))
  (call $out (call $mcp_call_recv (local.get $rc) (i32.const 16384) (i32.const -1))))"#,
        crash = start((1140, 5), (1120, 13)),
        not_json = start(SLOW, (1160, 8)),
        slow = start(SLOW, MS_60000),
        echo = start((1100, 4), (1120, 13)),
    );
    let host = host(&registry);
    let started = Instant::now();
    let run = wat::run(
        &host,
        &wat::guest(DATA, &body),
        &mcp_task("flood", &["fixture"]).with_deadline(Duration::from_secs(30)),
    )
    .await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the task waited for its calls: {:?}",
        started.elapsed()
    );
    let r = &run.results;
    assert_eq!(r[0], EACCES, "{r:?}");
    assert_eq!(&r[1..5], &[EBADF, EFAULT, EFAULT, EINVAL], "{r:?}");
    assert_eq!(r[5], quiver_tests::errno::EIO, "{r:?}");
    assert_eq!(r[6], EBADF, "a session is not a call fd");
    assert_eq!(&r[7..], &[64, EAGAIN, 0, 1, EFAULT, EFAULT], "{r:?}");
}

#[tokio::test]
async fn a_nonblocking_send_returns_at_once_and_its_response_becomes_readable() {
    let llm = ScriptedLlm::start(vec![Reply::delayed(
        Duration::from_millis(300),
        Reply::text("Hello from afar"),
    )])
    .await;
    let registry = RegistryDir::new();
    let host = scripted_host(&registry, &llm);
    let mut guest = ChatGuest::new().msg("user", "hi");
    let (nb, nb_len) = guest.bytes(br#"{"set":["O_NONBLOCK"]}"#);
    let guest = guest
        .raw(&format!(
            "(call $cap (i32.const 8200) (i32.const {nb_len})) (call $out (call $fd_ctl (local.get $s) (i32.const 1) (i32.const {nb}) (i32.const 8200)))"
        ))
        .raw("(i64.store (i32.const 90000) (call $time_now_ms))")
        .send(0)
        .raw("(call $out (i32.wrap_i64 (i64.sub (call $time_now_ms) (i64.load (i32.const 90000)))))")
        // Not there yet: recv and GET_METRICS say so, and the fd is not readable.
        .recv()
        .metrics()
        .raw(&format!(
            "(i32.store (i32.const 90008) (call $epoll_create))
             (call $out (call $epoll_ctl (i32.load (i32.const 90008)) (i32.const 1) (local.get $r) (i32.const {EPOLLIN})))
             (call $cap (i32.const 8192) (i32.const 64))
             (call $out (call $epoll_wait (i32.load (i32.const 90008)) (i32.const 16384) (i32.const 8192) (i32.const 0)))
             (call $cap (i32.const 8192) (i32.const 64))
             (call $out (call $epoll_wait (i32.load (i32.const 90008)) (i32.const 16384) (i32.const 8192) (i32.const -1)))
             (call $out (i32.load (i32.const 16388)))"
        ))
        .recv()
        .metrics()
        // The session has the answer now.
        .raw("(call $cap (i32.const 8192) (i32.const 65536)) (call $out (call $cchat_ctl (local.get $s) (i32.const 4) (i32.const 16384) (i32.const 8192))) (call $emit (i32.const 16384) (call $len (i32.const 8192)))");
    let run = wat::run(&host, &guest.build(), &mcp_task("nb", &[])).await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    let r = &run.results;
    // session, write_msg, fd_ctl, send, time, recv, metrics, ctl, poll, wait, events, ...
    assert_eq!(&r[1..3], &[0, 0], "{r:?}");
    assert!(r[3] >= 0, "{r:?}");
    assert!(r[4] < 150, "the nonblocking send took {} ms", r[4]);
    assert_eq!(&r[5..7], &[EAGAIN, EAGAIN], "{r:?}");
    assert_eq!(&r[7..11], &[0, 0, 1, EPOLLIN], "{r:?}");
    assert!(r[11] > 0 && r[12] > 0, "{r:?}");
    let body: Value = serde_json::from_str(&run.emitted[2]).expect("a response");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        json!("Hello from afar")
    );
    let messages: Value = serde_json::from_str(&run.emitted[4]).expect("messages");
    assert_eq!(messages[1]["role"], "assistant", "{messages}");
    assert_eq!(llm.requests().len(), 1);
}

#[tokio::test]
async fn a_nonblocking_send_cannot_run_guest_tools() {
    let llm = ScriptedLlm::start(vec![]).await;
    let registry = RegistryDir::new();
    let host = scripted_host(&registry, &llm);
    let mut guest = ChatGuest::new()
        .msg("user", "weather?")
        .tool(WEATHER, "weather");
    let (nb, nb_len) = guest.bytes(br#"{"set":["O_NONBLOCK"]}"#);
    let guest = guest
        .raw(&format!(
            "(call $cap (i32.const 8200) (i32.const {nb_len})) (call $out (call $fd_ctl (local.get $s) (i32.const 1) (i32.const {nb}) (i32.const 8200)))"
        ))
        .send(2);
    let run = wat::run(&host, &guest.build(), &mcp_task("nb", &[])).await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    assert_eq!(run.results.last(), Some(&EINVAL), "{:?}", run.results);
    assert!(llm.requests().is_empty());
}

#[tokio::test]
async fn one_task_holds_at_most_half_a_servers_permits_with_calls_in_flight() {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow", "echo"],
        "[budgets]\ntool_timeout_ms = 120000\nmax_concurrency = 4\n",
    );
    let body = format!(
        r#"(func $main (local $fd i32) (local $a i32)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
  (local.set $a {slow})
  (call $out (i32.ge_s (local.get $a) (i32.const 0)))
  (call $out (i32.ge_s {slow} (i32.const 0)))
  ;; Two of the server's four permits: a third call, of any tool, waits for one to end.
  (call $out {slow})
  (call $out {echo})
  (call $out (call $mcp_close (local.get $a)))
  (call $out (i32.ge_s {echo} (i32.const 0))))"#,
        slow = start(SLOW, MS_60000),
        echo = start((1100, 4), (1120, 13)),
    );
    let host = host(&registry);
    let run = wat::run(
        &host,
        &wat::guest(DATA, &body),
        &mcp_task("share", &["fixture"]).with_deadline(Duration::from_secs(30)),
    )
    .await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    assert_eq!(run.results, [1, 1, EAGAIN, EAGAIN, 0, 1]);
}

/// A nonblocking chat session with the user message "hi": `$s` is the session.
fn nonblocking_chat() -> ChatGuest {
    let mut guest = ChatGuest::new().msg("user", "hi");
    let (nb, nb_len) = guest.bytes(br#"{"set":["O_NONBLOCK"]}"#);
    guest.raw(&format!(
        "(call $cap (i32.const 8200) (i32.const {nb_len})) (call $out (call $fd_ctl (local.get $s) (i32.const 1) (i32.const {nb}) (i32.const 8200)))"
    ))
}

/// Waits until the response `$r` is readable; records the wait's count.
const WAIT_FOR_R: &str = "(i32.store (i32.const 90008) (call $epoll_create))
  (drop (call $epoll_ctl (i32.load (i32.const 90008)) (i32.const 1) (local.get $r) (i32.const 1)))
  (call $cap (i32.const 8192) (i32.const 64))
  (call $out (call $epoll_wait (i32.load (i32.const 90008)) (i32.const 16384) (i32.const 8192) (i32.const -1)))";

#[tokio::test]
async fn a_session_has_one_nonblocking_send_in_flight_or_unread() {
    let llm = ScriptedLlm::start(vec![
        Reply::delayed(Duration::from_millis(200), Reply::text("first")),
        Reply::text("second"),
    ])
    .await;
    let registry = RegistryDir::new();
    let host = scripted_host(&registry, &llm);
    let guest = nonblocking_chat()
        .send(0)
        // In flight, then ended but unread: a second send would not see the first's turn.
        .raw("(call $out (call $cchat_send (local.get $s) (i32.const 0)))")
        .raw(WAIT_FOR_R)
        .raw("(call $out (call $cchat_send (local.get $s) (i32.const 0)))")
        .recv()
        // Read: the session has the first turn, and the next send starts from it.
        .send(0)
        .raw(WAIT_FOR_R)
        .recv()
        .raw("(call $cap (i32.const 8192) (i32.const 65536)) (call $out (call $cchat_ctl (local.get $s) (i32.const 4) (i32.const 16384) (i32.const 8192))) (call $emit (i32.const 16384) (call $len (i32.const 8192)))");
    let run = wat::run(&host, &guest.build(), &mcp_task("nb", &[])).await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    let r = &run.results;
    // session, write_msg, fd_ctl, send, send, wait, send, recv, send, wait, recv, messages
    assert!(r[3] >= 0, "{r:?}");
    assert_eq!(&r[4..7], &[EAGAIN, 1, EAGAIN], "{r:?}");
    assert!(r[7] > 0 && r[8] >= 0 && r[9] == 1 && r[10] > 0, "{r:?}");
    let messages: Value = serde_json::from_str(&run.emitted[2]).expect("messages");
    let contents: Vec<&str> = messages
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(contents, ["hi", "first", "second"], "{messages}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1]["messages"][1]["content"], "first",
        "the second send starts from the first one's turn"
    );
}

#[tokio::test]
async fn a_send_whose_end_was_seen_gives_its_slot_of_background_work_back() {
    let llm = ScriptedLlm::start(vec![Reply::text("done")]).await;
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow"],
        "[budgets]\ntool_timeout_ms = 120000\nmax_concurrency = 200\n",
    );
    let host = scripted_host(&registry, &llm);
    let mut guest = nonblocking_chat().send(0).raw(WAIT_FOR_R);
    let (server, server_len) = guest.bytes(b"fixture");
    let (slow, slow_len) = guest.bytes(b"slow");
    let (ms, ms_len) = guest.bytes(br#"{"ms":60000}"#);
    // The send ended and a wait saw it, unread: all 64 slots are free for calls.
    let guest = guest
        .raw(&format!(
            "(i32.store (i32.const 90100) (call $mcp_open (i32.const {server}) (i32.const {server_len})))
  (block $done (loop $more
    (i32.store (i32.const 90104) (call $mcp_call_start (i32.load (i32.const 90100))
      (i32.const {slow}) (i32.const {slow_len}) (i32.const {ms}) (i32.const {ms_len})))
    (br_if $done (i32.lt_s (i32.load (i32.const 90104)) (i32.const 0)))
    (i32.store (i32.const 90108) (i32.add (i32.load (i32.const 90108)) (i32.const 1)))
    (br $more)))
  (call $out (i32.load (i32.const 90108)))
  (call $out (i32.load (i32.const 90104)))"
        ))
        .recv();
    let run = wat::run(
        &host,
        &guest.build(),
        &mcp_task("slots", &["fixture"]).with_deadline(Duration::from_secs(30)),
    )
    .await;
    host.shutdown().await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    let r = &run.results;
    // session, write_msg, fd_ctl, send, wait, calls, last, recv
    assert_eq!(&r[4..7], &[1, 64, EAGAIN], "{r:?}");
    assert!(r[7] > 0, "the answer still reads: {r:?}");
}

#[tokio::test]
async fn the_rust_example_joins_three_calls_in_flight() {
    let guest = quiver_tests::example_guest("parallel-tools");
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["slow"], "");
    let host = host(&registry);
    let task = mcp_task("parallel-tools", &["fixture"]);
    // The first run starts the server; the second times the calls alone.
    quiver_tests::run(&host, &guest, &task).await;
    let out = quiver_tests::run(&host, &guest, &task).await;
    host.shutdown().await;
    assert!(out.success(), "{}{}", out.stdout_text(), out.stderr_text());
    let stdout = out.stdout_text();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(&lines[..3], &["slept 300ms"; 3], "{stdout}");
    let took: i64 = lines[3]
        .strip_prefix("3 calls in ")
        .and_then(|t| t.strip_suffix(" ms"))
        .and_then(|t| t.parse().ok())
        .expect("3 calls in N ms");
    assert!(
        (300..600).contains(&took),
        "three 300 ms calls took {took} ms: they did not overlap"
    );
}

/// Records each tool call's tool and how it ended.
#[derive(Default)]
struct Ends(std::sync::Mutex<Vec<(String, ToolOutcome)>>);

impl ToolObserver for Ends {
    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        self.0
            .lock()
            .unwrap()
            .push((call.tool.clone(), end.outcome));
    }
}

/// A guest that returns while a call it started still runs: ending the task aborts the
/// call, and `run_task` returns only once the aborted work is gone, so the observers were
/// already told the call was cancelled and the task's memory is all given back. Run on
/// worker threads, where the abort is handled on another thread than the task's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_left_running_is_cancelled_and_reported_before_its_task_ends() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "[budgets]\ntool_timeout_ms = 120000\n");
    let ends = std::sync::Arc::new(Ends::default());
    let host = host_builder(&registry)
        .with_tool_observer(ends.clone())
        .build()
        .unwrap();
    // The blocking echo after the start gives the started call time to reach the server.
    let body = format!(
        r#"(func $main (local $fd i32) (local $a i32)
  (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
  (local.set $a {start})
  (call $out (i32.gt_s (local.get $a) (i32.const 0)))
  (call $cap (i32.const 8192) (i32.const 65536))
  (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1100) (i32.const 4) (i32.const 1120) (i32.const 13) (i32.const 16384) (i32.const 8192))))"#,
        start = start(SLOW, MS_60000)
    );
    let module = wat::guest(DATA, &body);
    for round in 0..5 {
        ends.0.lock().unwrap().clear();
        let task = mcp_task(&format!("left-{round}"), &["fixture"]);
        let run = wat::run(&host, &module, &task).await;
        assert!(run.outcome.success(), "{:?}", run.outcome.failure);
        assert_eq!(run.results[0], 1, "round {round}: the call started");
        assert!(run.results[1] > 0, "round {round}: echo answered");
        assert_eq!(run.outcome.host_memory.unreleased_bytes, 0, "round {round}");
        let mut seen = ends.0.lock().unwrap().clone();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            seen,
            [
                ("echo".to_owned(), ToolOutcome::Ok),
                ("slow".to_owned(), ToolOutcome::Cancelled)
            ],
            "round {round}: both calls' ends are reported before the task's"
        );
    }
    host.shutdown().await;
}
