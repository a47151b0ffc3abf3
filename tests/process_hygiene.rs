//! No process a stdio server started outlives its stop, however the stop comes: host
//! shutdown, dropping the host, restart after a crash, the end of `quiver run`, SIGTERM to
//! it, or the host being SIGKILLed.
//!
//! Every server here is the fixture server behind `sh`, which leaves a `sleep` child in
//! the server's process group ([`ServerWithChild`]): the server itself exits when its stdin
//! closes, the child does not, so only a stop of the whole group passes. Processes are
//! checked through /proc with a bounded wait, never a fixed sleep.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use quiver::Host;
use quiver_tests::group::{ServerWithChild, group_gone, group_members, left_of, wait_group_gone};
use quiver_tests::{
    RegistryDir, call_tool_text, example_guest, fixture_pids, host, pid_alive, quiver_cli,
    server_status, unique_id,
};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(20);

async fn server_pid(host: &Host, server_id: &str) -> u32 {
    call_tool_text(host, server_id, "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap()
}

/// A host on a registry with one server that has a child; the server started, its pid and
/// its child's pid.
async fn started() -> (RegistryDir, ServerWithChild, Host, u32, u32) {
    let registry = RegistryDir::new();
    let server = ServerWithChild::register(&registry, &unique_id("grp"), &[], "", "");
    let host = host(&registry);
    let pid = server_pid(&host, &server.server_id).await;
    let child = server.child_pid();
    assert!(pid_alive(child));
    let mut members = group_members(pid);
    members.sort_unstable();
    let mut expected = vec![pid, child];
    expected.sort_unstable();
    assert_eq!(members, expected, "the server and its child share a group");
    (registry, server, host, pid, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_shutdown_stops_the_server_and_every_process_it_started() {
    let (_registry, _server, host, pid, child) = started().await;
    host.shutdown().await;
    assert_eq!(
        left_of(pid, &[pid, child]),
        Vec::<u32>::new(),
        "shutdown returns once the whole group is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_host_without_shutdown_kills_the_whole_group() {
    let (_registry, _server, host, pid, child) = started().await;
    drop(host);
    assert_eq!(
        group_gone(pid, &[pid, child], WITHIN).await,
        Vec::<u32>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_is_restarted_without_leaving_its_child_behind() {
    let registry = RegistryDir::new();
    let id = unique_id("crashy");
    let server = ServerWithChild::register(&registry, &id, &["--exit-after-calls", "1"], "", "");
    let host = host(&registry);
    let first = server_pid(&host, &id).await;
    let child = server.child_pid();
    let start = Instant::now();
    while status_pid(&host, &id).is_some() {
        assert!(
            start.elapsed() < WITHIN,
            "the pool never saw the server exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!pid_alive(first), "the server exited after its first call");
    // No call comes: the host stops the rest of the group as soon as the leader exits,
    // and gives its process permit back.
    assert_eq!(
        group_gone(first, &[child], WITHIN).await,
        Vec::<u32>::new(),
        "the crashed server's group was stopped without another call"
    );
    let start = Instant::now();
    while host.mcp_usage().server_processes != 0 {
        assert!(
            start.elapsed() < WITHIN,
            "the process permit was never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.forget_child();
    let second = server_pid(&host, &id).await;
    assert_ne!(second, first, "the next call started the server again");
    let second_child = server.child_pid();
    host.shutdown().await;
    assert_eq!(left_of(second, &[second, second_child]), Vec::<u32>::new());
}

fn status_pid(host: &Host, server_id: &str) -> Option<u32> {
    server_status(host, server_id).and_then(|s| s.pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_fails_at_once_when_its_server_dies_even_if_a_child_keeps_its_stdout_open() {
    let (_registry, server, host, pid, child) = started().await;
    // `crash` exits without replying; the `sleep` child still holds the server's stdout, so
    // no EOF tells the host. Without noticing the exit itself the call would wait for its
    // whole tool timeout.
    let error = call_tool_text(&host, &server.server_id, "crash", json!({}))
        .await
        .unwrap_err();
    assert_eq!(error.code, quiver::McpErrorCode::Unavailable, "{error}");
    assert_eq!(
        group_gone(pid, &[pid, child], WITHIN).await,
        Vec::<u32>::new(),
        "the dead server's group was stopped"
    );
    host.shutdown().await;
}

/// A task file enabling `server_id` and the `quiver run` command for `args`.
fn quiver_run(dir: &Path, registry: &RegistryDir, server_id: &str, args: &[&str]) -> Command {
    let task = dir.join("task.json");
    let spec = json!({
        "task_id": "hygiene",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!([server_id]).to_string()},
        "limits": {"deadline_ms": 120000}
    });
    std::fs::write(&task, spec.to_string()).unwrap();
    let mut cmd = Command::new(quiver_cli());
    cmd.env_remove("QUIVER_LOG")
        .env_remove("QUIVER_REGISTRY")
        .arg("run")
        .arg(example_guest("mcp-explorer"))
        .arg("--task")
        .arg(&task)
        .arg("--registry")
        .arg(registry.path())
        .arg("--no-cache")
        .arg("--")
        .arg(server_id)
        .args(args);
    cmd
}

/// `quiver run` calling `slow` for a minute: returns the CLI process, the server's pid and
/// its child's pid once both run, and the registry (which holds the child's pid file).
fn quiver_in_a_long_call(dir: &Path) -> (std::process::Child, u32, u32, RegistryDir) {
    let registry = RegistryDir::new();
    let id = unique_id("cli");
    let server = ServerWithChild::register(
        &registry,
        &id,
        &[],
        "",
        "[budgets]\ntool_timeout_ms = 120000\n",
    );
    let cli = quiver_run(dir, &registry, &id, &["slow", r#"{"ms":60000}"#])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = server.child_pid();
    let start = Instant::now();
    let pid = loop {
        if let Some(&pid) = fixture_pids(&id).first() {
            break pid;
        }
        assert!(start.elapsed() < WITHIN, "the server never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    (cli, pid, child, registry)
}

/// Waits for `cli` to exit; its status code.
fn exit_code(cli: &mut std::process::Child) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = cli.try_wait().unwrap() {
            return status.code();
        }
        assert!(start.elapsed() < WITHIN, "quiver did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn quiver_run_leaves_no_process_of_its_servers_behind() {
    let registry = RegistryDir::new();
    let id = unique_id("cli");
    let server = ServerWithChild::register(&registry, &id, &[], "", "");
    let dir = tempfile::tempdir().unwrap();
    let output = quiver_run(dir.path(), &registry, &id, &["pid"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let pid: u32 = stdout.lines().last().unwrap().trim().parse().unwrap();
    let child = server.child_pid();
    assert_eq!(
        wait_group_gone(pid, &[pid, child], WITHIN),
        Vec::<u32>::new()
    );
}

#[test]
fn sigterm_to_quiver_run_stops_its_servers_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cli, pid, child, _registry) = quiver_in_a_long_call(dir.path());
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(cli.id() as i32, libc::SIGTERM) };
    assert_eq!(exit_code(&mut cli), Some(143));
    assert_eq!(
        wait_group_gone(pid, &[pid, child], WITHIN),
        Vec::<u32>::new()
    );
}

#[test]
fn a_host_killed_with_sigkill_takes_its_servers_children_along() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cli, pid, child, _registry) = quiver_in_a_long_call(dir.path());
    cli.kill().unwrap();
    cli.wait().unwrap();
    assert_eq!(
        wait_group_gone(pid, &[pid, child], WITHIN),
        Vec::<u32>::new(),
        "the watchdog kills the group the host could not stop"
    );
}
