//! End to end: the `mcp-explorer` example guest (and small WAT guests) through the real
//! host or the real `quiver` binary, against the fixture MCP server over real stdio.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use quiver::McpErrorCode;
use quiver::{Host, ModuleOrigin, TaskFailure};
use quiver_tests::{
    RegistryDir, call_tool_text, example_guest, fixture_pids, fixture_toml_with_args, host,
    mcp_task, quiver_cli, run, unique_id, wait_gone, wat,
};
use serde_json::{Value, json};

fn explorer() -> std::path::PathBuf {
    example_guest("mcp-explorer")
}

/// A task file enabling `servers`, written next to the registry.
fn task_file(dir: &Path, servers: &[&str]) -> std::path::PathBuf {
    let path = dir.join("task.json");
    let task = serde_json::json!({
        "task_id": "e2e",
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": serde_json::to_string(servers).unwrap()},
        "limits": {"deadline_ms": 60000}
    });
    std::fs::write(&path, task.to_string()).unwrap();
    path
}

/// `quiver [args] run MODULE --task TASK --registry DIR --no-cache`; callers add the rest.
fn quiver_run(args: &[&str], module: impl AsRef<Path>, task: &Path, registry: &Path) -> Command {
    let mut cmd = quiver(args);
    cmd.arg("run")
        .arg(module.as_ref())
        .arg("--task")
        .arg(task)
        .arg("--registry")
        .arg(registry)
        .arg("--no-cache");
    cmd
}

fn quiver(args: &[&str]) -> Command {
    let mut cmd = Command::new(quiver_cli());
    cmd.args(args)
        .env_remove("QUIVER_LOG")
        .env_remove("QUIVER_REGISTRY");
    cmd
}

#[test]
fn the_cli_runs_a_guest_that_lists_and_calls_tools() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "add"], "");
    let tasks = tempfile::tempdir().unwrap();
    let task = task_file(tasks.path(), &["fixture"]);
    let output = quiver_run(&[], explorer(), &task, registry.path())
        .args(["--", "fixture", "add", r#"{"a":2,"b":3}"#])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("tools on fixture:"), "{stdout}");
    assert!(
        stdout.contains("  add — ") && stdout.contains("  echo — "),
        "{stdout}"
    );
    assert!(
        !stdout.contains("crash"),
        "tools outside allowed_tools are not listed: {stdout}"
    );
    assert!(stdout.trim_end().ends_with("\n5"), "{stdout}");
}

#[test]
fn the_guest_exit_status_passes_through() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "");
    let tasks = tempfile::tempdir().unwrap();
    let task = task_file(tasks.path(), &["fixture"]);
    let output = quiver_run(&[], explorer(), &task, registry.path())
        .args(["--", "not-registered"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ENOENT"), "{stderr}");
}

#[tokio::test]
async fn one_server_process_serves_every_fd_and_every_task() {
    let name = unique_id("pooled");
    let registry = RegistryDir::new();
    registry.fixture(&name, &["pid"], "");
    let host = host(&registry);
    let task = mcp_task("pooled", &[&name]).with_args([name.as_str(), "pid"]);
    let guest = explorer();
    let (a, b) = tokio::join!(run(&host, &guest, &task), run(&host, &guest, &task));
    let c = run(&host, &guest, &task).await;
    let pid_of = |out: &quiver::TaskOutcome| {
        out.stdout_text()
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(a.success() && b.success() && c.success());
    assert_eq!(pid_of(&a), pid_of(&b));
    assert_eq!(pid_of(&a), pid_of(&c));
    assert_eq!(fixture_pids(&name).len(), 1, "exactly one server process");
    let status = host.status().mcp_servers;
    assert_eq!(status[0].connections, 1);
    assert_eq!(status[0].pid.map(|p| p.to_string()), Some(pid_of(&a)));
    host.shutdown().await;
    let pid: u32 = pid_of(&a).parse().unwrap();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "shutdown ends the server process"
    );
}

/// A WAT guest that calls `tool` with `{}` on fd-opened server "fixture" and emits the
/// result, once per name in `tools`.
fn calls_guest(tools: &[&str]) -> String {
    let mut data: Vec<(u32, Vec<u8>)> = vec![(1024, b"fixture".to_vec()), (1040, b"{}".to_vec())];
    let mut body = String::from(
        "(func $main (local $fd i32) (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))\n",
    );
    for (i, tool) in tools.iter().enumerate() {
        let addr = 1100 + 32 * i as u32;
        data.push((addr, tool.as_bytes().to_vec()));
        body.push_str(&format!(
            "(call $cap (i32.const 8192) (i32.const 65536))
             (call $out (call $mcp_call_tool (local.get $fd) (i32.const {addr}) (i32.const {}) (i32.const 1040) (i32.const 2) (i32.const 16384) (i32.const 8192)))
             (call $emit (i32.const 16384) (call $len (i32.const 8192)))\n",
            tool.len()
        ));
    }
    body.push(')');
    let data: Vec<(u32, &[u8])> = data.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    wat::guest(&data, &body)
}

#[tokio::test]
async fn a_server_that_crashes_mid_call_is_restarted_by_the_next_call() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["crash", "pid"], "");
    let host = host(&registry);
    let run = wat::run(
        &host,
        &calls_guest(&["pid", "crash", "pid"]),
        &mcp_task("crash", &["fixture"]),
    )
    .await;
    assert!(run.outcome.success(), "{:?}", run.outcome.failure);
    let results: Vec<Value> = run
        .emitted
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        results[1]["error"]["code"], "mcp_unavailable",
        "{}",
        results[1]
    );
    assert_eq!(results[1]["error"]["retryable"], true);
    let first = results[0]["content"][0]["text"].as_str().unwrap();
    let second = results[2]["content"][0]["text"].as_str().unwrap();
    assert_ne!(first, second, "the next call ran on a restarted server");
    assert_eq!(host.status().mcp_servers[0].connections, 2);
    host.shutdown().await;
}

#[tokio::test]
async fn a_slow_tool_fails_with_mcp_timeout_and_the_server_stays_usable() {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["slow", "echo"],
        "[budgets]\ntool_timeout_ms = 300\n",
    );
    let host = host(&registry);
    let task = mcp_task("slow", &["fixture"]).with_args(["fixture", "slow", r#"{"ms":5000}"#]);
    let module = host.load_module_file(explorer()).unwrap();
    let started = Instant::now();
    let out = host.run_task(&module, &task).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        out.stdout_text().contains("error mcp_timeout:"),
        "{}",
        out.stdout_text()
    );
    let task =
        mcp_task("after", &["fixture"]).with_args(["fixture", "echo", r#"{"text":"still here"}"#]);
    let out = run(&host, &explorer(), &task).await;
    assert!(
        out.stdout_text().trim_end().ends_with("still here"),
        "{}",
        out.stdout_text()
    );
    assert_eq!(
        host.status().mcp_servers[0].connections,
        1,
        "a timeout does not restart the server"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn oversized_results_are_refused_with_mcp_output_too_large() {
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["big"],
        "[budgets]\nmax_tool_output_bytes = 1000\n",
    );
    let host = host(&registry);
    let task = mcp_task("big", &["fixture"]).with_args(["fixture", "big", r#"{"bytes":5000}"#]);
    let out = run(&host, &explorer(), &task).await;
    assert!(
        out.stdout_text().contains("error mcp_output_too_large:"),
        "{}",
        out.stdout_text()
    );
    host.shutdown().await;
}

#[test]
fn no_server_process_outlives_quiver_run_even_after_a_trap() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["pid"], "");
    let tasks = tempfile::tempdir().unwrap();
    let task = task_file(tasks.path(), &["fixture"]);

    let output = quiver_run(&[], explorer(), &task, registry.path())
        .args(["--", "fixture", "pid"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let pid: u32 = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "server {pid} outlived quiver run"
    );

    let trapping = calls_guest(&["pid"]).replace("(call $main)", "(call $main) unreachable");
    let module = tasks.path().join("trap.wat");
    std::fs::write(&module, trapping).unwrap();
    let output = quiver_run(&[], &module, &task, registry.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(134));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("trapped"), "{stderr}");
    let result: Value = serde_json::from_str(stderr.lines().next().unwrap()).unwrap();
    let pid: u32 = result["content"][0]["text"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "server {pid} outlived a trapped task"
    );
}

/// Starts `quiver run` on a guest that learns its server's pid and then waits in a slow
/// tool call; returns the child, its stderr and the server's pid.
fn quiver_waiting_in_a_tool_call(
    registry: &RegistryDir,
    tasks: &Path,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStderr>,
    u32,
) {
    registry.fixture(
        "fixture",
        &["pid", "slow"],
        "[budgets]\ntool_timeout_ms = 120000\n",
    );
    let task = task_file(tasks, &["fixture"]);
    let guest = calls_guest(&["pid", "slow"])
        .replace(r#"\7b\7d"#, r#"\7b\22\6d\73\22\3a\36\30\30\30\30\7d"#);
    let guest = guest.replace(
        "(i32.const 1040) (i32.const 2)",
        "(i32.const 1040) (i32.const 12)",
    );
    let module = tasks.join("wait.wat");
    std::fs::write(&module, guest).unwrap();
    let mut child = quiver_run(&[], &module, &task, registry.path())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let result: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let pid: u32 = result["content"][0]["text"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    (child, stderr, pid)
}

#[test]
fn ctrl_c_stops_the_task_and_its_servers() {
    let registry = RegistryDir::new();
    let tasks = tempfile::tempdir().unwrap();
    let (mut child, mut stderr, pid) = quiver_waiting_in_a_tool_call(&registry, tasks.path());
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "quiver did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(rest.contains("interrupted"), "{rest}");
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "server {pid} outlived Ctrl-C"
    );
}

/// The pid of a process whose command line is exactly `argv`, if one is running.
fn pid_of(argv: &[&str]) -> Option<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            (std::fs::read(entry.path().join("cmdline")).ok()? == wanted).then_some(pid)
        })
}

/// The safety argument of the pool's `pre_exec` (it only asks the kernel for
/// `PR_SET_PDEATHSIG`): a host killed outright, with no chance to clean up, still takes
/// its server processes along, even one that ignores its closed stdin.
#[test]
fn a_host_killed_with_sigkill_takes_its_servers_along() {
    let registry = RegistryDir::new();
    let marker = format!("600.{}", std::process::id());
    registry.write(
        "fixture.toml",
        &format!(
            "server_id = \"fixture\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = \"sleep\"\nargs = [{marker:?}]\n"
        ),
    );
    let tasks = tempfile::tempdir().unwrap();
    let task = task_file(tasks.path(), &["fixture"]);
    let module = tasks.path().join("call.wat");
    std::fs::write(&module, calls_guest(&["anything"])).unwrap();
    let mut child = quiver_run(&[], &module, &task, registry.path())
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let server = loop {
        if let Some(pid) = pid_of(&["sleep", &marker]) {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the host never started the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_gone(server, Duration::from_secs(5)),
        "server {server} outlived a SIGKILLed host"
    );
}

#[test]
fn server_stderr_goes_to_the_host_log_under_its_server_id() {
    let registry = RegistryDir::new();
    registry.fixture("noisy", &["stderr"], "");
    let tasks = tempfile::tempdir().unwrap();
    let task = task_file(tasks.path(), &["noisy"]);
    let output = quiver_run(&["--log-level", "info"], explorer(), &task, registry.path())
        .args(["--", "noisy", "stderr", r#"{"text":"marker-7f3a"}"#])
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let logged = stderr
        .lines()
        .find(|l| l.contains("marker-7f3a"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(logged.contains("server_id=noisy"), "{logged}");
    assert!(
        stdout.trim_end().ends_with("ok"),
        "the protocol stream was not disturbed: {stdout}"
    );
}

#[tokio::test]
async fn compiled_modules_are_cached_in_memory_and_on_disk() {
    let cache = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(explorer()).unwrap();
    let first = Host::builder()
        .with_cache_dir(cache.path())
        .build()
        .unwrap();
    assert_eq!(
        first.load_module("explorer", &bytes).unwrap().origin(),
        ModuleOrigin::Compiled
    );
    assert_eq!(
        first.load_module("explorer", &bytes).unwrap().origin(),
        ModuleOrigin::MemoryCache
    );
    let second = Host::builder()
        .with_cache_dir(cache.path())
        .build()
        .unwrap();
    let module = second.load_module("explorer", &bytes).unwrap();
    assert_eq!(module.origin(), ModuleOrigin::DiskCache);
    let out = second
        .run_task(
            &module,
            &quiver::TaskSpec::new("cached").with_captured_output(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 2, "runs (and prints usage, having no args)");
    assert!(out.stderr_text().contains("usage"));
    // A corrupt artifact is ignored and replaced, not fatal. (Replaced by a new file: the
    // old one is still mapped by `second`, and the host itself only ever renames.)
    for entry in std::fs::read_dir(cache.path()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"garbage").unwrap();
    }
    let third = Host::builder()
        .with_cache_dir(cache.path())
        .build()
        .unwrap();
    assert_eq!(
        third.load_module("explorer", &bytes).unwrap().origin(),
        ModuleOrigin::Compiled
    );
}

#[tokio::test]
async fn a_task_deadline_reports_124_and_names_the_limit() {
    let registry = RegistryDir::new();
    let host = host(&registry);
    let module = host
        .load_module(
            "spin",
            b"(module (memory (export \"memory\") 1) (func (export \"_start\") (loop $l (br $l))))",
        )
        .unwrap();
    let task = quiver::TaskSpec::new("spin").with_deadline(Duration::from_millis(200));
    let out = host.run_task(&module, &task).await.unwrap();
    assert_eq!(out.exit_code, 124);
    let failure = out.failure.unwrap();
    assert_eq!(failure, TaskFailure::Deadline(Duration::from_millis(200)));
    assert!(failure.to_string().contains("limits.deadline_ms"));
}

#[tokio::test]
async fn rich_results_keep_their_image_parts() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["image"], "");
    let host = host(&registry);
    let run = wat::run(
        &host,
        &calls_guest(&["image"]),
        &mcp_task("image", &["fixture"]),
    )
    .await;
    let result: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(result["content"][0]["text"], "a 1x1 red pixel");
    assert_eq!(result["content"][1]["type"], "image");
    assert_eq!(result["content"][1]["mimeType"], "image/png");
    assert_eq!(result["isError"], false);
    host.shutdown().await;
}

#[tokio::test]
async fn tools_list_reads_every_page_and_is_cached_until_the_server_says_it_changed() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "");
    let host = host(&registry);
    let count = |tool: &'static str| {
        let host = &host;
        async move {
            call_tool_text(host, "fixture", tool, json!({}))
                .await
                .unwrap()
        }
    };
    let tools = host.server_tools("fixture").await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert!(
        names.len() > 8,
        "the fixture serves 4 tools per page; all pages are read: {names:?}"
    );
    assert!(
        names.contains(&"add") && names.contains(&"tools_changed"),
        "{names:?}"
    );
    host.server_tools("fixture").await.unwrap();
    host.server_tools("fixture").await.unwrap();
    assert_eq!(
        count("list_count").await,
        "1",
        "later listings come from the cache"
    );

    assert_eq!(count("tools_changed").await, "ok");
    // The notification travels on its own; give the client a moment to handle it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        host.server_tools("fixture").await.unwrap().len(),
        tools.len()
    );
    assert_eq!(
        count("list_count").await,
        "2",
        "list_changed dropped the cache"
    );
    host.shutdown().await;

    let short_ttl = Host::builder()
        .with_registry_dir(registry.path())
        .without_disk_cache()
        .with_tools_cache_ttl(Duration::from_millis(50))
        .build()
        .unwrap();
    short_ttl.server_tools("fixture").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    short_ttl.server_tools("fixture").await.unwrap();
    assert_eq!(
        call_tool_text(&short_ttl, "fixture", "list_count", json!({}))
            .await
            .unwrap(),
        "2",
        "the TTL expired the cache"
    );
    short_ttl.shutdown().await;
}

/// After `list_changed`, the outdated listing is served to nobody: a listing asked for
/// while the new one is still being fetched waits for a new one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_during_a_relisting_does_not_get_the_outdated_tools() {
    let dir = tempfile::tempdir().unwrap();
    let desc = dir.path().join("echo-description");
    std::fs::write(&desc, "old").unwrap();
    let registry = RegistryDir::new();
    let desc_arg = desc.display().to_string();
    registry.fixture_with_args(
        "fixture",
        &["*"],
        &[
            "--echo-description-file",
            &desc_arg,
            "--slow-list-ms",
            "100",
        ],
        "",
    );
    let host = host(&registry);
    let echo_description = |tools: &[quiver::Tool]| {
        let echo = tools
            .iter()
            .find(|t| t.name == "echo")
            .expect("echo is listed");
        echo.description.as_deref().unwrap_or_default().to_owned()
    };
    assert_eq!(
        echo_description(&host.server_tools("fixture").await.unwrap()),
        "old"
    );

    std::fs::write(&desc, "new").unwrap();
    assert_eq!(
        call_tool_text(&host, "fixture", "tools_changed", json!({}))
            .await
            .unwrap(),
        "ok"
    );
    // The notification travels on its own; give the client a moment to handle it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let relisting = host.server_tools("fixture");
    let meanwhile = async {
        // The first listing is under way (each page takes 100 ms).
        tokio::time::sleep(Duration::from_millis(50)).await;
        host.server_tools("fixture").await
    };
    let (relisted, meanwhile) = tokio::join!(relisting, meanwhile);
    assert_eq!(echo_description(&relisted.unwrap()), "new");
    assert_eq!(
        echo_description(&meanwhile.unwrap()),
        "new",
        "a listing asked for during the relisting was not served the outdated one"
    );
    host.shutdown().await;
}

/// `initialize` asks for 2025-11-25 by default (a server that speaks only that accepts it),
/// and a record's `protocol_version` reaches a server that refuses everything but an older
/// version, which the default cannot.
#[tokio::test]
async fn protocol_version_reaches_a_server_that_speaks_only_an_older_version() {
    let registry = RegistryDir::new();
    let only = |server_id: &str, version: &str, record_field: &str| {
        let record =
            fixture_toml_with_args(server_id, &["add"], &["--protocol-version", version], "");
        registry.write(
            &format!("{server_id}.toml"),
            &format!("{record_field}\n{record}"),
        );
    };
    only("current", "2025-11-25", "");
    only("old", "2025-03-26", "protocol_version = \"2025-03-26\"");
    only("old-default", "2025-03-26", "");
    let host = host(&registry);
    let args = || serde_json::json!({"a": 2, "b": 3});
    for server_id in ["current", "old"] {
        let sum = call_tool_text(&host, server_id, "add", args()).await;
        assert_eq!(sum.as_deref().ok(), Some("5"), "{server_id}: {sum:?}");
    }
    let refused = call_tool_text(&host, "old-default", "add", args())
        .await
        .expect_err("an older server refuses the default version");
    assert_eq!(refused.code, McpErrorCode::Unavailable, "{refused}");
    assert!(
        refused.to_string().contains(
            "unsupported protocol version 2025-11-25; this server speaks only 2025-03-26"
        ),
        "{refused}"
    );
}
