//! One way for tests (and benchmarks) to start the host, the fixture MCP server and real
//! guests, so each test reads like the scenario it checks.
//!
//! Everything here is real: guests are built from `examples/` for wasm32-wasip1 (or written
//! as WAT), the fixture server is the `fixture-mcp-server` binary over stdio, and the CLI is
//! the `quiver` binary.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use quiver::McpError;
use quiver::{Host, TaskOutcome, TaskSpec, ToolCallError, ToolCallRequest};
use tempfile::TempDir;

pub mod bench;
pub mod c;
pub mod chat_wat;
pub mod errno;
pub mod etcd;
pub mod group;
pub mod hostile_http;
pub mod llm;
pub mod node;
pub mod oauth;
pub mod openmetrics;
pub mod phoenix;
pub mod serve;
pub mod ssf;
pub mod wat;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

/// `target/<profile>/`, where cargo put this test's binaries.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_owned()
    } else {
        dir.to_owned()
    }
}

/// `[mcp.launch]` for a node that runs this workspace's fixture servers: their binaries
/// (and `/nonexistent/*`, which tests start to see a spawn fail), and the variables the
/// tests' records read (`QV_*`, `QUIVER_TEST_*`, `HOME`). A node without `[mcp.launch]`
/// runs no command at all.
pub fn fixture_launch_rules() -> String {
    format!(
        "\n[mcp.launch]\ncommands = [{:?}, \"/nonexistent/*\"]\nenv = [\"QV_*\", \"QUIVER_TEST_*\", \"HOME\"]\n",
        format!("{}/*", bin_dir().display())
    )
}

/// The same rules for a host built in code: the fixture binaries, nothing else.
pub fn fixture_rules() -> quiver::LaunchRules {
    let config = quiver::LaunchConfig {
        commands: vec![format!("{}/*", bin_dir().display())],
        ..Default::default()
    };
    quiver::LaunchRules::from_config(&config).expect("the fixture launch rules")
}

/// The fixture MCP server binary.
pub fn fixture_server() -> PathBuf {
    bin_dir().join("fixture-mcp-server")
}

/// The client the official MCP conformance suite runs (`fixtures/conformance-driver`).
pub fn conformance_driver() -> PathBuf {
    bin_dir().join("conformance-driver")
}

/// The hostile MCP server binary (`fixtures/hostile-mcp-server`), which misbehaves on purpose.
pub fn hostile_server() -> PathBuf {
    bin_dir().join("hostile-mcp-server")
}

/// The example embedder (examples/embedder), which `cargo test` at the workspace root
/// builds beside these tests (its own tests in examples/embedder/tests make cargo build it).
pub fn embedder() -> PathBuf {
    let bin = bin_dir().join("quiver-embedder");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` at the workspace root, or `cargo build -p quiver-embedder` first",
        bin.display()
    );
    bin
}

/// The `quiver` command-line binary. `cargo test` at the workspace root builds it with the
/// host package (whose own CLI tests need it) into the same directory as these tests; it
/// is looked up there rather than linked a second time into this package. A binary older
/// than the host's sources (e.g. after `cargo test -p quiver-tests` alone) is refused, so
/// no test runs a stale CLI.
pub fn quiver_cli() -> PathBuf {
    let bin = bin_dir().join("quiver");
    let fix = "run the tests with `cargo test` at the workspace root, or `cargo build -p quiver-cli` first";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {fix}", bin.display()));
    let sources = workspace().join("host");
    if let Some(newer) = newest_file(&sources).filter(|(time, _)| *time > built) {
        panic!(
            "{} is older than {}: {fix}",
            bin.display(),
            newer.1.display()
        );
    }
    bin
}

/// The most recently modified file below `dir`, with its time.
fn newest_file(dir: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                newest_file(&path)
            } else {
                Some((meta.modified().ok()?, path))
            }
        })
        .max_by_key(|(time, _)| *time)
}

/// Builds an example guest for wasm32-wasip1 (once per test process) and returns its path.
/// Guests get their own target dir: the outer `cargo test` holds the main one.
pub fn example_guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    let target_dir = workspace().join("target").join("guests");
    if !built.iter().any(|b| b == name) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--quiet",
                "--release",
                "--target",
                "wasm32-wasip1",
                "-p",
                name,
                "--target-dir",
            ])
            .arg(&target_dir)
            .status()
            .expect("run cargo to build the guest");
        assert!(
            status.success(),
            "building guest {name} failed (is the wasm32-wasip1 target installed? run scripts/setup.sh)"
        );
        built.push(name.to_owned());
    }
    target_dir
        .join("wasm32-wasip1")
        .join("release")
        .join(format!("{name}.wasm"))
}

/// A temporary registry directory.
pub struct RegistryDir {
    dir: TempDir,
}

impl Default for RegistryDir {
    fn default() -> Self {
        Self::new()
    }
}

impl RegistryDir {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `file` with `contents`.
    pub fn write(&self, file: &str, contents: &str) -> &Self {
        std::fs::write(self.dir.path().join(file), contents).expect("write registry file");
        self
    }

    /// Registers the fixture server as `server_id`, allowing `allowed_tools`, with extra
    /// TOML (e.g. a `[budgets]` table) appended.
    pub fn fixture(&self, server_id: &str, allowed_tools: &[&str], extra: &str) -> &Self {
        self.write(
            &format!("{server_id}.toml"),
            &fixture_toml(server_id, allowed_tools, extra),
        )
    }

    /// [`RegistryDir::fixture`] with more arguments for the fixture server.
    pub fn fixture_with_args(
        &self,
        server_id: &str,
        allowed_tools: &[&str],
        args: &[&str],
        extra: &str,
    ) -> &Self {
        self.write(
            &format!("{server_id}.toml"),
            &fixture_toml_with_args(server_id, allowed_tools, args, extra),
        )
    }
}

impl RegistryDir {
    /// Registers the fixture server as `server_id` carrying `tags`.
    pub fn fixture_tagged(&self, server_id: &str, allowed_tools: &[&str], tags: &[&str]) -> &Self {
        let tags: Vec<String> = tags.iter().map(|t| format!("{t:?}")).collect();
        let record = format!(
            "tags = [{}]\n{}",
            tags.join(", "),
            fixture_toml(server_id, allowed_tools, "")
        );
        self.write(&format!("{server_id}.toml"), &record)
    }
}

/// A registry record for the fixture server.
pub fn fixture_toml(server_id: &str, allowed_tools: &[&str], extra: &str) -> String {
    fixture_toml_with_args(server_id, allowed_tools, &[], extra)
}

/// [`fixture_toml`] with more arguments for the fixture server (e.g.
/// `["--fail-calls-with", "message"]`).
pub fn fixture_toml_with_args(
    server_id: &str,
    allowed_tools: &[&str],
    args: &[&str],
    extra: &str,
) -> String {
    let quoted = |items: &[&str]| items.iter().map(|t| format!(", {t:?}")).collect::<String>();
    format!(
        "server_id = {server_id:?}\ntransport = \"stdio\"\nallowed_tools = [{}]\n\n[stdio]\ncommand = {:?}\nargs = [\"--name\", {server_id:?}{}]\n\n{extra}\n",
        quoted(allowed_tools).trim_start_matches(", "),
        fixture_server().display().to_string(),
        quoted(args),
    )
}

/// A host on `registry`. Compiled modules are shared through one cache directory, so each
/// guest is compiled once per test run rather than once per test.
pub fn host(registry: &RegistryDir) -> Host {
    init_logging();
    host_builder(registry).build().expect("host")
}

/// The builder behind [`host`], for tests that add options.
pub fn host_builder(registry: &RegistryDir) -> quiver::HostBuilder {
    Host::builder()
        .with_registry_dir(registry.path())
        .with_cache_dir(workspace().join("target").join("test-module-cache"))
}

/// Logs to the test's captured output when `RUST_LOG` is set.
pub fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    }
}

/// A task that enables MCP with `servers` as defaults, capturing output.
pub fn mcp_task(task_id: &str, servers: &[&str]) -> TaskSpec {
    TaskSpec::new(task_id)
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", serde_json::json!(servers))
        .with_deadline(Duration::from_secs(60))
        .with_captured_output()
}

/// Loads `module` and runs `task` on `host`.
pub async fn run(host: &Host, module: &Path, task: &TaskSpec) -> TaskOutcome {
    let module = host.load_module_file(module).expect("load guest");
    host.run_task(&module, task).await.expect("task starts")
}

/// Whether a process is alive (a zombie counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Waits up to `within` for `pid` to be gone.
pub fn wait_gone(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !pid_alive(pid)
}

/// Pids of running fixture servers whose `--name` is `name`.
pub fn fixture_pids(name: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_fixture = args
            .first()
            .is_some_and(|a| a.ends_with(b"fixture-mcp-server"));
        let named = args
            .windows(2)
            .any(|w| w[0] == b"--name" && w[1] == name.as_bytes());
        if is_fixture && named && pid_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Calls `tool` of `server_id` as library code does ([`Host::call_tool`], in the name of a
/// task that may use that server); the result's first text block, or the error of a call
/// that was made and failed. A call that policy or the approver refused fails the test.
pub async fn call_tool_text(
    host: &Host,
    server_id: &str,
    tool: &str,
    args: serde_json::Value,
) -> Result<String, McpError> {
    let request = ToolCallRequest::new(server_id, tool).with_arguments(args);
    let out = match host.call_tool(&library_task(server_id), request).await {
        Ok(out) => out,
        Err(ToolCallError::Failed(error) | ToolCallError::Timeout(error)) => return Err(error),
        Err(refused) => panic!("{server_id}/{tool} was not called: {refused}"),
    };
    Ok(out.result.content[0]
        .as_text()
        .expect("a text block")
        .text
        .clone())
}

/// The task [`call_tool_text`] calls in: it may use `server_id` and nothing else.
pub fn library_task(server_id: &str) -> TaskSpec {
    TaskSpec::new("library")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", serde_json::json!([server_id]))
}

/// `server_id`'s entry in the host's MCP status, if its pool has one.
pub fn server_status(host: &Host, server_id: &str) -> Option<quiver::ServerStatus> {
    host.status()
        .mcp_servers
        .into_iter()
        .find(|s| s.server_id == server_id)
}

/// Polls `done` every 20 ms for up to 30 s, failing the test with `what` after that.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server id unique to this test process and call, so concurrent tests can find their
/// own fixture processes.
pub fn unique_id(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Everything `child` writes to its piped stderr, collected as it comes (and echoed when
/// `RUST_LOG` is set) for failure messages.
pub fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("piped stderr");
    let sink = stderr.clone();
    std::thread::spawn(move || {
        let echo = std::env::var_os("RUST_LOG").is_some();
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]);
            if echo {
                eprint!("{text}");
            }
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&text);
        }
    });
    stderr
}

/// The first line `child` prints on its piped stdout (where servers announce their
/// address), waited for up to `within`; the rest of stdout is drained so the child never
/// blocks on a full pipe. Says what went wrong when there is no line.
pub fn first_stdout_line(child: &mut Child, within: Duration) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next());
        for _ in lines {}
    });
    match rx.recv_timeout(within) {
        Ok(Some(Ok(line))) => Ok(line),
        Ok(Some(Err(e))) => Err(format!("reading stdout: {e}")),
        Ok(None) => Err("stdout closed".to_owned()),
        Err(_) => Err(format!("no line within {within:?}")),
    }
}

/// The fixture server serving MCP over HTTP on `127.0.0.1:<random port>`: Streamable HTTP
/// (`"http"`, at `/mcp`) or the legacy HTTP+SSE transport (`"sse"`, stream at `/sse`). The
/// process is killed when this is dropped.
pub struct FixtureHttp {
    child: Child,
    base: String,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl FixtureHttp {
    /// Starts `fixture-mcp-server --http 127.0.0.1:0` (mode `"http"`) or `--sse 127.0.0.1:0`
    /// (mode `"sse"`) with `extra_args` (e.g. `["--bearer-introspect", url]`), and waits up to
    /// 10 s for it to print its `listening on` line.
    pub fn spawn(mode: &str, extra_args: &[&str]) -> FixtureHttp {
        let (flag, path) = match mode {
            "http" => ("--http", "/mcp"),
            "sse" => ("--sse", "/sse"),
            other => {
                panic!("FixtureHttp::spawn: unknown mode {other:?} (want \"http\" or \"sse\")")
            }
        };
        let mut child = Command::new(fixture_server())
            .arg(flag)
            .arg("127.0.0.1:0")
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", fixture_server().display()));

        let stderr = collect_stderr(&mut child);
        let line = match first_stdout_line(&mut child, Duration::from_secs(10)) {
            Ok(line) => line,
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(50));
                panic!(
                    "fixture server ({mode}) did not announce its address: {why}; stderr:\n{}",
                    stderr.lock().unwrap_or_else(|e| e.into_inner())
                );
            }
        };
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from the fixture server: {line:?}"))
            .to_owned();
        FixtureHttp {
            child,
            url: format!("{base}{path}"),
            base,
            stderr,
        }
    }

    /// `http://127.0.0.1:PORT/mcp` (Streamable HTTP) or `http://127.0.0.1:PORT/sse` (SSE).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Kills the server and reaps it (idempotent).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FixtureHttp {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for FixtureHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixtureHttp")
            .field("url", &self.url)
            .field("pid", &self.child.id())
            .finish()
    }
}
