//! ABI edge cases through small WAT guests, the real host and the real fixture server:
//! every hostile argument gets its errno, the buffer protocol never runs a tool twice, and
//! a looping, trapping or waiting guest ends at its deadline without hurting other tasks.

use std::time::{Duration, Instant};

use quiver::{TaskFailure, TaskSpec};
use quiver_tests::errno::{
    EACCES, EBADF, EFAULT, EINVAL, EIO, EMFILE, ENOENT, ENOMEM, ENOSPC, ENOTCONN,
};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, call_tool_text, host, host_builder, mcp_task};
use serde_json::Value;

const OK: i32 = 0;

/// Test data, at fixed addresses the WAT bodies refer to.
const DATA: &[(u32, &[u8])] = &[
    (1024, b"fixture"),
    (1040, b"nope"),
    (1056, &[0xff, 0xfe]),
    (1072, b"count"),
    (1088, b"{}"),
    (1100, b"echo"),
    (1120, br#"{"text":"hi"}"#),
    (1200, b"crash"),
    (1216, b"not json"),
    (1232, b"[1]"),
    (1248, b"other"),
    (1264, b"delete_file"),
    (1280, b"slow"),
    (1296, br#"{"ms":60000}"#),
    (1320, b"unset"),
    (1344, HIDDEN_ARRAY),
];

/// serde_json's reserved key: it would read the string as the JSON it holds (`[1]`).
const HIDDEN_ARRAY: &[u8] = br#"{"\u0024serde_json::private::RawValue":"[1]"}"#;

/// `(call $mcp_call_tool fd name args 16384 8192)` for data at the given addresses.
fn call(fd: &str, name: (u32, u32), args: (u32, u32)) -> String {
    format!(
        "(call $mcp_call_tool {fd} (i32.const {}) (i32.const {}) (i32.const {}) (i32.const {}) (i32.const 16384) (i32.const 8192))",
        name.0, name.1, args.0, args.1
    )
}

const COUNT: (u32, u32) = (1072, 5);
const EMPTY_OBJ: (u32, u32) = (1088, 2);
const ECHO: (u32, u32) = (1100, 4);
const HI: (u32, u32) = (1120, 13);

fn open_fixture() -> &'static str {
    "(local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))"
}

async fn run(registry: &RegistryDir, task: &TaskSpec, body: &str) -> WatRun {
    let host = host(registry);
    let run = wat::run(&host, &wat::guest(DATA, body), task).await;
    host.shutdown().await;
    assert!(
        run.outcome.failure.is_none(),
        "guest failed: {:?}",
        run.outcome.failure
    );
    run
}

fn registry() -> RegistryDir {
    let registry = RegistryDir::new();
    registry
        .fixture("fixture", &["*"], "")
        .fixture("other", &["*"], "");
    registry
}

fn text_of(result_json: &str) -> String {
    let value: Value = serde_json::from_str(result_json).expect("result is JSON");
    value["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn mcp_open_errors() {
    let body = r#"(func $main
      (call $out (call $mcp_open (i32.const 1040) (i32.const 4)))
      (call $out (call $mcp_open (i32.const 1248) (i32.const 5)))
      (call $out (call $mcp_open (i32.const 1056) (i32.const 2)))
      (call $out (call $mcp_open (i32.const 262140) (i32.const 60)))
      (call $out (call $mcp_open (i32.const 1024) (i32.const -1)))
      (call $out (call $mcp_open (i32.const -8) (i32.const 7)))
      (call $out (call $mcp_open (i32.const 1024) (i32.const 7))))"#;
    let run = run(&registry(), &mcp_task("open", &["fixture"]), body).await;
    assert_eq!(
        &run.results[..6],
        &[ENOENT, EACCES, EINVAL, EFAULT, EFAULT, EFAULT]
    );
    assert!(run.results[6] >= 0, "open fixture: {}", run.results[6]);

    let disabled = TaskSpec::new("disabled").with_config("mcp.default_server_ids", "fixture");
    let run = self::run(&registry(), &disabled, body).await;
    assert_eq!(
        run.results[6], EACCES,
        "a task without mcp.enabled can open nothing"
    );
}

#[tokio::test]
async fn enospc_reports_the_length_and_the_retry_does_not_run_the_tool_again() {
    let count = call("(local.get $fd)", COUNT, EMPTY_OBJ);
    let body = format!(
        r#"(func $main (local $fd i32)
      {open}
      (call $cap (i32.const 8192) (i32.const 4))
      (call $out {count})
      (call $out (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out {count})
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $out (call $mcp_call_tool (local.get $fd) (i32.const 1072) (i32.const 5) (i32.const 1088) (i32.const 2) (i32.const 16384) (i32.const 262142)))
      (call $cap (i32.const 8192) (i32.const 300000))
      (call $out {count})
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out {count})
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#,
        open = open_fixture()
    );
    let run = run(&registry(), &mcp_task("enospc", &["fixture"]), &body).await;
    let r = &run.results;
    assert_eq!(r[0], ENOSPC);
    assert!(r[1] > 4, "needed length {}", r[1]);
    assert_eq!(r[2], r[1], "the retry returns exactly the announced length");
    assert_eq!(
        text_of(&run.emitted[0]),
        "1",
        "the retry returned the first execution's result"
    );
    assert_eq!(r[3], EFAULT, "bad out_len_ptr");
    assert_eq!(r[4], EFAULT, "capacity past the end of memory");
    assert!(r[5] > 0);
    assert_eq!(
        text_of(&run.emitted[1]),
        "2",
        "the tool ran once for the ENOSPC+retry and never for the EFAULT calls"
    );
}

#[tokio::test]
async fn closed_and_bogus_fds_are_ebadf() {
    let body = format!(
        r#"(func $main (local $fd i32)
      {open}
      (call $out (call $mcp_close (local.get $fd)))
      (call $out (call $mcp_close (local.get $fd)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $out {bogus})
      (call $out (call $mcp_list_tools (i32.const -1) (i32.const 16384) (i32.const 8192)))
      (call $out (call $mcp_close (i32.const 0))))"#,
        open = open_fixture(),
        bogus = call("(i32.const 12345)", ECHO, HI)
    );
    let run = run(&registry(), &mcp_task("ebadf", &["fixture"]), &body).await;
    assert_eq!(run.results, [OK, EBADF, EBADF, EBADF, EBADF, EBADF]);
}

#[tokio::test]
async fn tools_outside_the_filters_are_hidden_and_eacces() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "count", "delete_*"], "");
    let task = mcp_task("filters", &["fixture"]).with_config("mcp.tool_denylist", "delete_*");
    let body = format!(
        r#"(func $main (local $fd i32)
      {open}
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out {crash})
      (call $out {delete})
      (call $out {echo})
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#,
        open = open_fixture(),
        crash = call("(local.get $fd)", (1200, 5), EMPTY_OBJ),
        delete = call("(local.get $fd)", (1264, 11), EMPTY_OBJ),
        echo = call("(local.get $fd)", ECHO, HI),
    );
    let run = run(&registry, &task, &body).await;
    assert_eq!(
        run.results[0], EACCES,
        "crash is outside the registry's allowed_tools"
    );
    assert_eq!(
        run.results[1], EACCES,
        "delete_file matches the task's denylist"
    );
    assert!(run.results[2] > 0);
    let listed: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(listed["server_id"], "fixture");
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["count", "echo"]);
    assert!(listed["tools"][1]["inputSchema"].is_object());
}

#[tokio::test]
async fn the_fd_cap_gives_emfile_and_close_makes_room() {
    let body = r#"(func $main (local $first i32)
      (local.set $first (call $mcp_open (i32.const 1024) (i32.const 7)))
      (call $out (local.get $first))
      (call $out (call $mcp_open (i32.const 1024) (i32.const 7)))
      (call $out (call $mcp_open (i32.const 1024) (i32.const 7)))
      (call $out (call $mcp_close (local.get $first)))
      (call $out (call $mcp_open (i32.const 1024) (i32.const 7))))"#;
    let run = run(
        &registry(),
        &mcp_task("emfile", &["fixture"]).with_max_fds(2),
        body,
    )
    .await;
    let r = &run.results;
    assert!(r[0] >= 0 && r[1] >= 0);
    assert_eq!(r[2], EMFILE);
    assert_eq!(r[3], 0);
    assert!(
        r[4] >= 0 && r[4] != r[0],
        "a new fd, never the closed one's number"
    );
}

#[tokio::test]
async fn hostile_arguments_to_mcp_call_tool() {
    let body = format!(
        r#"(func $main (local $fd i32)
      {open}
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out {not_json})
      (call $out {array})
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $out {huge})
      (call $out {bad_name})
      (call $out {bad_args_utf8})
      (call $out {longest_name})
      (call $out {too_long_name})
      (call $out {hidden}))"#,
        open = open_fixture(),
        not_json = call("(local.get $fd)", ECHO, (1216, 8)),
        array = call("(local.get $fd)", ECHO, (1232, 3)),
        huge = call("(local.get $fd)", ECHO, (1120, 0x7fff_ffff)),
        bad_name = call("(local.get $fd)", (1056, 2), HI),
        bad_args_utf8 = call("(local.get $fd)", ECHO, (1056, 2)),
        // Zero bytes are valid UTF-8: only the length can make these wrong.
        longest_name = call("(local.get $fd)", (20000, 128), EMPTY_OBJ),
        too_long_name = call("(local.get $fd)", (20000, 129), EMPTY_OBJ),
        hidden = call("(local.get $fd)", ECHO, (1344, HIDDEN_ARRAY.len() as u32)),
    );
    let run = run(&registry(), &mcp_task("args", &["fixture"]), &body).await;
    let r = &run.results;
    assert_eq!(r[0], EIO, "arguments that are not JSON");
    assert!(r[1] > 0);
    let error: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(error["error"]["code"], "mcp_invalid_arguments");
    assert_eq!(error["error"]["retryable"], false);
    assert_eq!(r[2], EFAULT, "a length far past the end of memory");
    assert_eq!(r[3], EINVAL, "a tool name that is not UTF-8");
    assert_eq!(r[4], EINVAL, "arguments that are not UTF-8");
    assert_ne!(r[5], EINVAL, "a tool name of 128 bytes is allowed");
    assert_eq!(r[6], EINVAL, "a tool name over 128 bytes (the MCP limit)");
    assert_eq!(
        r[7], EIO,
        "structure hidden in a string with serde_json's reserved key"
    );
}

#[tokio::test]
async fn log_and_time() {
    let body = r#"(func $main
      (call $out (call $log (i32.const 9) (i32.const 1024) (i32.const 7)))
      (call $out (call $log (i32.const 2) (i32.const 1056) (i32.const 2)))
      (call $out (call $log (i32.const 2) (i32.const 1024) (i32.const 7)))
      (call $out (call $log (i32.const 2) (i32.const 262000) (i32.const 9999)))
      (call $out (i64.gt_s (call $time_now_ms) (i64.const 1700000000000))))"#;
    let run = run(&registry(), &mcp_task("log", &[]), body).await;
    assert_eq!(run.results, [EINVAL, EINVAL, 0, EFAULT, 1]);
}

/// A guest that logs "first\n", writes "emitted\n" to stderr, then logs a line with control
/// characters and a tab.
fn logging_guest() -> String {
    let data: &[(u32, &[u8])] = &[
        (2000, b"first\n"),
        (2016, b"bell\x07\x1b[2Jx\tt"),
        (2048, b"emitted"),
    ];
    wat::guest(
        data,
        r#"(func $main
      (call $out (call $log (i32.const 2) (i32.const 2000) (i32.const 6)))
      (call $emit (i32.const 2048) (i32.const 7))
      (call $out (call $log (i32.const 4) (i32.const 2016) (i32.const 12))))"#,
    )
}

#[tokio::test]
async fn log_lines_are_the_guests_own_stderr_unless_an_embedder_says_otherwise() {
    let host = host(&RegistryDir::new());
    let task = mcp_task("log-out", &[]);
    let run = wat::run_ok(&host, &logging_guest(), &task).await;
    assert_eq!(run.results, [OK, OK]);
    assert_eq!(
        run.outcome.stderr_text(),
        "first\nemitted\nbell\\x07\\x1b[2Jx\tt\n",
        "in order with the guest's stderr writes, one newline each, controls escaped"
    );
    assert!(run.outcome.stdout.len() == 8, "only the results on stdout");

    let task = task.with_guest_logs(quiver::GuestLogs::Tracing);
    let run = wat::run_ok(&host, &logging_guest(), &task).await;
    assert_eq!(run.results, [OK, OK]);
    assert_eq!(run.outcome.stderr_text(), "emitted\n");
    host.shutdown().await;
}

#[tokio::test]
async fn captured_log_lines_are_charged_and_refused_past_the_budget() {
    const LIMIT: u64 = 128 * 1024;
    let body = r#"(func $main (local $i i32)
      (memory.fill (i32.const 16384) (i32.const 65) (i32.const 16384))
      (loop $l
        (call $out (call $log (i32.const 2) (i32.const 16384) (i32.const 16384)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (i32.const 16))))
      (call $out (call $log (i32.const 2) (i32.const 16384) (i32.const 10))))"#;
    let task = mcp_task("log-flood", &[]).with_host_memory_limit(LIMIT);
    let host = host(&RegistryDir::new());
    let run = wat::run_ok(&host, &wat::guest(&[], body), &task).await;
    host.shutdown().await;
    let r = &run.results;
    assert_eq!(r.len(), 17);
    assert_eq!(r[0], OK);
    let refused = r[..16].iter().filter(|&&e| e == ENOMEM).count();
    assert!(
        refused >= 8,
        "16 lines of 16 KiB cannot fit in 128 KiB: {r:?}"
    );
    assert!(r[..16].iter().all(|&e| e == OK || e == ENOMEM), "{r:?}");
    let stderr = run.outcome.stderr_text();
    assert!(stderr.len() as u64 <= LIMIT, "{} bytes kept", stderr.len());
    assert_eq!(
        stderr.lines().count(),
        16 - refused + usize::from(r[16] == OK)
    );
    assert!(
        stderr
            .lines()
            .all(|l| l.len() == 16384 || l == "AAAAAAAAAA")
    );
}

/// `quiver run` of a WAT guest with no log settings, its stdout and stderr piped; the
/// directory holds the module.
fn quiver_run_command(wat: &str) -> (tempfile::TempDir, std::process::Command) {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("guest.wat");
    std::fs::write(&module, wat).unwrap();
    let mut command = std::process::Command::new(quiver_tests::quiver_cli());
    command
        .env_remove("QUIVER_LOG")
        .env_remove("RUST_LOG")
        .env_remove("QUIVER_REGISTRY")
        .args(["run", "--no-cache"])
        .arg(&module)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    (dir, command)
}

/// In `quiver run` the guest's `log` lines and its own stderr writes (WASI fd 2) come out
/// in the order it made them, on a stderr that is not captured. A `log` line starts a line
/// of its own: a write the guest left open is ended first, and what follows it goes on after.
#[test]
fn log_lines_and_stderr_writes_keep_the_guests_order_in_quiver_run() {
    const PAIRS: usize = 500;
    let data: &[(u32, &[u8])] = &[
        (1024, b"log-line"),
        (1040, b"wasi-line"),
        (1056, b"part"),
        (1064, b"x"),
        (1072, b"ial"),
    ];
    // `$emit` writes the text and its newline in two writes.
    let body = format!(
        r#"(func $main (local $i i32)
      (loop $l
        (call $out (call $log (i32.const 2) (i32.const 1024) (i32.const 8)))
        (call $emit (i32.const 1040) (i32.const 9))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (i32.const {PAIRS}))))
      (i32.store (i32.const 0) (i32.const 1056))
      (i32.store (i32.const 4) (i32.const 4))
      (call $out (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
      (call $out (call $log (i32.const 2) (i32.const 1064) (i32.const 1)))
      (call $emit (i32.const 1072) (i32.const 3)))"#
    );
    let guest = wat::guest(data, &body);
    let (_dir, mut command) = quiver_run_command(&guest);
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", output.status);
    assert_eq!(wat::results(&output.stdout), vec![OK; PAIRS + 2]);
    let expected = "log-line\nwasi-line\n".repeat(PAIRS) + "part\nx\nial\n";
    assert_same_text(&String::from_utf8_lossy(&output.stderr), &expected);

    // The host's own lines about the task come after the output that led to them.
    let trapping = guest.replace("(call $main)", "(call $main) unreachable");
    let (_dir, mut command) = quiver_run_command(&trapping);
    let output = command.output().unwrap();
    assert_eq!(output.status.code(), Some(134));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let host_lines = stderr.get(expected.len()..).unwrap_or_default();
    assert_same_text(stderr.get(..expected.len()).unwrap_or(&stderr), &expected);
    assert!(
        host_lines
            .lines()
            .next()
            .is_some_and(|l| l.contains("task failed")),
        "{host_lines}"
    );
}

/// Asserts `text` is `expected`, showing where they part.
fn assert_same_text(text: &str, expected: &str) {
    if text == expected {
        return;
    }
    let at = text
        .bytes()
        .zip(expected.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(text.len().min(expected.len()));
    let from = at.saturating_sub(40);
    panic!(
        "text differs at byte {at}: got {:?}, want {:?}",
        text.get(from..(at + 40).min(text.len())),
        expected.get(from..(at + 40).min(expected.len()))
    );
}

/// A value a registry record's `${ENV:..}` resolves to, so a secret of the process.
const LOG_SECRET: &str = "guest-log-secret-7f3a9c";

/// A guest that logs [`LOG_SECRET`].
fn secret_logging_guest() -> String {
    let line = format!("key={LOG_SECRET};");
    let body = format!(
        "(func $main (call $out (call $log (i32.const 2) (i32.const 2000) (i32.const {}))))",
        line.len()
    );
    wat::guest(&[(2000, line.as_bytes())], &body)
}

/// A `log` line is cut of every secret the process resolved wherever it goes: in captured
/// output (`quiver serve`) as on the host's stderr (below).
#[tokio::test]
async fn captured_log_lines_are_redacted_like_those_on_stderr() {
    // What reading a record that resolves the secret does (the next test does it for real).
    let _secrets = quiver::registry::Secrets::new([LOG_SECRET]);
    let host = host(&RegistryDir::new());
    let run = wat::run_ok(&host, &secret_logging_guest(), &mcp_task("log-secret", &[])).await;
    host.shutdown().await;
    assert_eq!(run.results, [OK]);
    assert_eq!(run.outcome.stderr_text(), "key=[redacted];\n");
}

#[test]
fn log_lines_on_quiver_runs_stderr_are_redacted() {
    let registry = RegistryDir::new();
    registry.write(
        "secret.toml",
        &quiver_tests::fixture_toml("secret", &["*"], "").replace(
            "[stdio]\n",
            "[stdio]\nenv = { API_TOKEN = \"${ENV:QV_LOG_SECRET}\" }\n",
        ),
    );
    let (_dir, mut command) = quiver_run_command(&secret_logging_guest());
    let output = command
        .env("QV_LOG_SECRET", LOG_SECRET)
        .arg("--registry")
        .arg(registry.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", output.status);
    assert_eq!(wat::results(&output.stdout), [OK]);
    assert_eq!(String::from_utf8_lossy(&output.stderr), "key=[redacted];\n");
}

/// A guest flooding its log while nobody reads the host's stderr still ends, and so does
/// `quiver run`: lines wait in a bounded queue and are dropped past it, never waited for,
/// and the count dropped is reported once stderr is read again.
#[test]
fn a_stuck_stderr_does_not_hold_the_guest_or_the_run() {
    const LINES: usize = 256;
    // 4 MiB of lines against a pipe nobody reads (64 KiB) and a 1 MiB queue.
    let body = format!(
        r#"(func $main (local $i i32)
      (memory.fill (i32.const 16384) (i32.const 66) (i32.const 16384))
      (loop $l
        (drop (call $log (i32.const 2) (i32.const 16384) (i32.const 16384)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (i32.const {LINES}))))
      (call $out (i32.const 7)))"#
    );
    let guest = wat::guest(&[], &body);

    // Nobody reads stderr at all: the run still ends.
    let (_dir, mut command) = quiver_run_command(&guest);
    let mut child = command.spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("quiver run waited on its stderr");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(
        wat::results(&output.stdout),
        [7],
        "the guest ran to its end"
    );

    // Stderr is read only once the guest has ended (its results are on stdout): every
    // line is either shown whole or counted in a notice.
    let (_dir, mut command) = quiver_run_command(&guest);
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (sender, results) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = [0u8; 4];
        let read = std::io::Read::read_exact(&mut stdout, &mut bytes);
        let _ = sender.send(read.map(|()| bytes));
    });
    let Ok(read) = results.recv_timeout(Duration::from_secs(120)) else {
        child.kill().unwrap();
        panic!("the guest waited on a stderr nobody reads");
    };
    assert_eq!(
        wat::results(&read.unwrap()),
        [7],
        "the guest ran to its end"
    );
    let mut shown = Vec::new();
    std::io::Read::read_to_end(&mut stderr, &mut shown).unwrap();
    assert!(child.wait().unwrap().success());
    let shown = String::from_utf8(shown).unwrap();
    let whole = "B".repeat(16384);
    let mut lines = 0;
    let mut dropped = 0;
    for line in shown.lines() {
        if line == whole {
            lines += 1;
        } else if let Some(count) = line
            .strip_prefix("quiver: ")
            .and_then(|l| l.strip_suffix(" guest log line(s) dropped: stderr did not keep up"))
        {
            dropped += count.parse::<usize>().unwrap();
        } else {
            panic!("unexpected line on stderr: {:?}", line.get(..80));
        }
    }
    assert!(dropped > 0, "4 MiB cannot wait in 1 MiB");
    assert_eq!(lines + dropped, LINES, "each line shown or counted dropped");
}

#[tokio::test]
async fn registry_views_show_only_permitted_servers_and_no_secrets() {
    let registry = registry();
    registry.write(
        "secret.toml",
        &quiver_tests::fixture_toml("secret", &["*"], "").replace(
            "[stdio]\n",
            "[stdio]\nenv = { API_TOKEN = \"${ENV:QUIVER_TEST_TOKEN:-hunter2}\" }\n",
        ),
    );
    let task = mcp_task("views", &["fixture", "secret"]);
    let body = r#"(func $main
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $mcp_registry_list (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $out (call $mcp_registry_get (i32.const 1040) (i32.const 4) (i32.const 16384) (i32.const 8192)))
      (call $out (call $mcp_registry_get (i32.const 1248) (i32.const 5) (i32.const 16384) (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 3))
      (call $out (call $mcp_registry_get (i32.const 1024) (i32.const 7) (i32.const 16384) (i32.const 8192)))
      (call $out (call $len (i32.const 8192))))"#;
    let run = run(&registry, &task, body).await;
    let listing = &run.emitted[0];
    let value: Value = serde_json::from_str(listing).unwrap();
    let ids: Vec<&str> = value["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["fixture", "secret"],
        "`other` is not allowed for this task"
    );
    assert!(value["revision"].is_string());
    assert_eq!(value["servers"][0]["budgets"]["tool_timeout_ms"], 8000);
    for secret in ["hunter2", "API_TOKEN", "fixture-mcp-server", "command"] {
        assert!(
            !listing.contains(secret),
            "registry view leaks {secret}: {listing}"
        );
    }
    assert_eq!(run.results[1], ENOENT);
    assert_eq!(run.results[2], EACCES);
    assert_eq!(run.results[3], ENOSPC);
    assert!(run.results[4] > 3);
}

#[tokio::test]
async fn a_server_with_a_missing_env_var_is_unavailable_not_fatal() {
    let registry = registry();
    registry.write(
        "unset.toml",
        "server_id = \"unset\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"${ENV:QUIVER_TEST_SURELY_UNSET}\"\n",
    );
    let body = r#"(func $main
      (call $out (call $mcp_open (i32.const 1320) (i32.const 5)))
      (call $out (call $mcp_open (i32.const 1024) (i32.const 7))))"#;
    let run = run(&registry, &mcp_task("unset", &["unset", "fixture"]), body).await;
    assert_eq!(run.results[0], ENOTCONN);
    assert!(run.results[1] >= 0, "other servers still work");
}

#[tokio::test]
async fn a_looping_guest_stops_at_its_deadline_while_another_task_completes() {
    let registry = registry();
    let host = host(&registry);
    let spin = wat::guest(DATA, "(func $main (loop $forever (br $forever)))");
    let work = wat::guest(
        DATA,
        &format!(
            "(func $main (local $fd i32) {} (call $cap (i32.const 8192) (i32.const 65536)) (call $out {}))",
            open_fixture(),
            call("(local.get $fd)", ECHO, HI)
        ),
    );
    let started = Instant::now();
    let looping = mcp_task("spin", &[]).with_deadline(Duration::from_millis(300));
    let worker = mcp_task("work", &["fixture"]);
    let (spun, worked) = tokio::join!(wat::run(&host, &spin, &looping), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        wat::run(&host, &work, &worker).await
    });
    assert_eq!(
        spun.outcome.failure,
        Some(TaskFailure::Deadline(Duration::from_millis(300)))
    );
    assert_eq!(spun.outcome.exit_code, 124);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "deadline fired late: {:?}",
        started.elapsed()
    );
    assert!(worked.outcome.success(), "{:?}", worked.outcome.failure);
    assert!(worked.results[0] > 0);
    host.shutdown().await;
}

#[tokio::test]
async fn a_hostcall_waiting_on_a_slow_tool_is_cancelled_at_the_deadline() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "[budgets]\ntool_timeout_ms = 120000\n");
    let host = host(&registry);
    let body = format!(
        "(func $main (local $fd i32) {} (call $cap (i32.const 8192) (i32.const 65536)) (call $out {}))",
        open_fixture(),
        call("(local.get $fd)", (1280, 4), (1296, 12))
    );
    let task = mcp_task("waiting", &["fixture"]).with_deadline(Duration::from_millis(700));
    let started = Instant::now();
    let run = wat::run(&host, &wat::guest(DATA, &body), &task).await;
    assert_eq!(
        run.outcome.failure,
        Some(TaskFailure::Deadline(Duration::from_millis(700)))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_trap_ends_only_its_task_and_the_memory_limit_is_enforced() {
    let registry = registry();
    let host = host(&registry);
    let trap = wat::run(
        &host,
        &wat::guest(DATA, "(func $main unreachable)"),
        &mcp_task("trap", &[]),
    )
    .await;
    assert_eq!(trap.outcome.exit_code, 134);
    assert!(
        matches!(&trap.outcome.failure, Some(TaskFailure::Trap(m)) if m.contains("unreachable")),
        "{:?}",
        trap.outcome.failure
    );

    let grow = "(func $main (call $out (memory.grow (i32.const 64))))";
    let limited = mcp_task("grow", &[]).with_memory_limit(1024 * 1024);
    let grown = wat::run(&host, &wat::guest(DATA, grow), &limited).await;
    assert!(
        matches!(grown.outcome.failure, Some(TaskFailure::Trap(_))),
        "growing past 1 MiB must fail the task"
    );

    let fine = wat::run(
        &host,
        &wat::guest(DATA, "(func $main (call $out (i32.const 7)))"),
        &mcp_task("after", &[]),
    )
    .await;
    assert!(fine.outcome.success());
    assert_eq!(fine.results, [7]);
    host.shutdown().await;
}

#[tokio::test]
async fn a_call_needing_approval_is_refused_before_it_reaches_the_server() {
    let registry = RegistryDir::new();
    registry.write(
        "fixture.toml",
        &format!(
            "approval_policy = \"policy\"\n{}",
            quiver_tests::fixture_toml("fixture", &["*"], "")
        ),
    );
    let body = format!(
        r#"(func $main (local $fd i32)
      {open}
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out {count})
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 65536))
      (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192))))"#,
        open = open_fixture(),
        count = call("(local.get $fd)", COUNT, EMPTY_OBJ),
    );
    let host = host(&registry);
    let run = wat::run(
        &host,
        &wat::guest(DATA, &body),
        &mcp_task("approval", &["fixture"]),
    )
    .await;
    assert!(run.results[0] > 0, "{:?}", run.results);
    let error: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(error["error"]["code"], "mcp_policy_denied");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approval_policy"),
        "{error}"
    );
    assert!(run.results[1] > 0, "listing needs no approval");
    let status = host.status().mcp_servers;
    assert!(
        status
            .iter()
            .all(|s| s.server_id != "fixture" || s.connections <= 1),
        "{status:?}"
    );
    // Calls of the library wait for approval too: the record drops it (a change that keeps
    // the connection) so the same server process can say how many calls it got.
    registry.fixture("fixture", &["*"], "");
    host.reload_registry().unwrap();
    let count = call_tool_text(&host, "fixture", "count", serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(count, "1", "the refused call never reached the server");
    assert_eq!(
        host.status().mcp_servers[0].connections,
        1,
        "the same process"
    );
    host.shutdown().await;
}

/// A guest opening files in a loop through WASI is stopped after about `max_fds` of them
/// instead of using up the host's descriptors: wasmtime-wasi ends the task with a trap
/// naming its full table, and the next task on the host runs.
#[tokio::test]
async fn wasi_opens_are_bounded_like_the_task_fds() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("f"), b"x").unwrap();
    let mut task = TaskSpec::new("wasi-open-flood");
    task.limits.max_fds = Some(16);
    task.preopens.push(quiver::Preopen {
        host: files.path().to_owned(),
        guest: "/data".into(),
        read_only: true,
    });
    // Opens "f" under fd 3 (the preopen) `$limit` times (from argv length: none = 100 000),
    // then writes how many opened to stdout.
    let guest = |limit: u32| {
        format!(
            r#"(module
      (import "wasi_snapshot_preview1" "path_open"
        (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "fd_write"
        (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 100) "f")
      (func (export "_start") (local $n i32) (local $r i32)
        (block $done (loop $again
          (local.set $r (call $path_open (i32.const 3) (i32.const 0) (i32.const 100)
            (i32.const 1) (i32.const 0) (i64.const 2) (i64.const 2) (i32.const 0) (i32.const 200)))
          (br_if $done (i32.ne (local.get $r) (i32.const 0)))
          (local.set $n (i32.add (local.get $n) (i32.const 1)))
          (br_if $done (i32.ge_u (local.get $n) (i32.const {limit})))
          (br $again)))
        (i32.store (i32.const 0) (local.get $n))
        (i32.store (i32.const 4) (local.get $r))
        (i32.store (i32.const 16) (i32.const 0))
        (i32.store (i32.const 20) (i32.const 8))
        (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))))"#
        )
    };
    let registry = RegistryDir::new();
    let host = host(&registry);
    let flood = wat::run(&host, &guest(100_000), &task).await;
    match &flood.outcome.failure {
        Some(TaskFailure::Trap(message)) => {
            assert!(message.contains("resource table"), "{message}")
        }
        other => panic!(
            "the flood must end the task, got {other:?} after {:?}",
            flood.results
        ),
    }
    // Within the bound, opening works and the host is fine.
    let within = wat::run(&host, &guest(16), &task).await;
    assert!(within.outcome.success(), "{:?}", within.outcome);
    assert_eq!(within.results, [16, 0]);
}

/// Every task's budget draws on the host's total: with a host total far below the task's
/// own budget, the total is what stops a guest growing messages, and all of it comes back.
#[tokio::test]
async fn the_host_memory_total_bounds_every_task_together() {
    let registry = RegistryDir::new();
    let host = host_builder(&registry)
        .with_host_memory_total(256 * 1024)
        .build()
        .expect("host");
    let body = r#"
  (func $main (local $fd i32) (local $n i32) (local $r i32)
    (local.set $fd (call $cchat_create))
    (block $done (loop $again
      (local.set $r (call $cchat_write_msg (local.get $fd) (i32.const 1024) (i32.const 4)
        (i32.const 65536) (i32.const 8192)))
      (br_if $done (i32.ne (local.get $r) (i32.const 0)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br_if $done (i32.ge_u (local.get $n) (i32.const 10000)))
      (br $again)))
    (call $out (local.get $n))
    (call $out (local.get $r)))"#;
    let wat = wat::guest(&[(1024, b"user")], body);
    let task = TaskSpec::new("host-total");
    let run = wat::run(&host, &wat, &task).await;
    assert!(run.outcome.success(), "{:?}", run.outcome);
    let [written, errno] = run.results[..] else {
        panic!("two results expected: {:?}", run.results);
    };
    assert_eq!(errno, ENOMEM, "ENOMEM once the host total is reached");
    assert!(
        (1..32).contains(&written),
        "{written} messages of 8 KiB fit a 256 KiB host total"
    );
    assert!(
        run.outcome.host_memory.limit_bytes > 1 << 20,
        "the task's own budget had room"
    );
    let memory = host.status().host_memory;
    assert_eq!(memory.used_bytes, 0, "everything is given back");
    assert!(
        memory.peak_bytes <= 256 * 1024 && memory.peak_bytes > 0,
        "{memory:?}"
    );
}
