//! Prometheus metrics and MCP server health through the real host: WAT guests calling the
//! fixture MCP server over stdio, the scripted LLM server for the chat loop, and the real
//! `quiver` CLI. Each test makes real calls, then parses the host's OpenMetrics text and
//! asserts exact values and label sets.

use std::collections::BTreeSet;

use quiver::Host;
use quiver::registry::Registry;
use quiver::{ServerState, ServerStatus};
use quiver_tests::chat_wat::{ChatGuest, WEATHER, scripted_host};
use quiver_tests::errno::EACCES;
use quiver_tests::llm::{Reply, ScriptedLlm, expected_usage};
use quiver_tests::openmetrics::{Sample, find, get, parse};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, host, host_builder, mcp_task, quiver_cli};
use serde_json::{Value, json};

/// The samples of `host`'s metrics now.
fn scrape(host: &Host) -> Vec<Sample> {
    parse(&host.metrics().encode())
}

/// A WAT guest that opens servers and calls tools, emitting each result to stderr.
#[derive(Default)]
struct McpGuest {
    data: Vec<(u32, Vec<u8>)>,
    next: u32,
    body: String,
}

impl McpGuest {
    fn new() -> Self {
        Self {
            next: 1024,
            ..Self::default()
        }
    }

    fn bytes(&mut self, bytes: &[u8]) -> (u32, u32) {
        let at = self.next;
        self.data.push((at, bytes.to_vec()));
        self.next += (bytes.len() as u32).next_multiple_of(8) + 8;
        assert!(self.next < 4096, "test data overflows its region");
        (at, bytes.len() as u32)
    }

    /// Opens `server_id` as the current fd.
    fn open(mut self, server_id: &str) -> Self {
        let (p, l) = self.bytes(server_id.as_bytes());
        self.body.push_str(&format!(
            "(local.set $fd (call $mcp_open (i32.const {p}) (i32.const {l}))) (call $out (local.get $fd))\n"
        ));
        self
    }

    /// Calls `tool` with `args`; records the return value and emits the result.
    fn call(mut self, tool: &str, args: Value) -> Self {
        let (n, nl) = self.bytes(tool.as_bytes());
        let (a, al) = self.bytes(args.to_string().as_bytes());
        self.body.push_str(&format!(
            "(call $cap (i32.const 8192) (i32.const 65536))
             (local.set $r (call $mcp_call_tool (local.get $fd) (i32.const {n}) (i32.const {nl}) (i32.const {a}) (i32.const {al}) (i32.const 16384) (i32.const 8192)))
             (call $out (local.get $r))
             (if (i32.ge_s (local.get $r) (i32.const 0))
               (then (call $emit (i32.const 16384) (call $len (i32.const 8192))))
               (else (call $emit (i32.const 0) (i32.const 0))))\n"
        ));
        self
    }

    fn build(&self) -> String {
        let data: Vec<(u32, &[u8])> = self.data.iter().map(|(a, b)| (*a, b.as_slice())).collect();
        wat::guest(
            &data,
            &format!("(func $main (local $fd i32) (local $r i32)\n{})", self.body),
        )
    }
}

/// The text of the `i`-th emitted result.
fn result_text(run: &WatRun, i: usize) -> String {
    let result: Value = serde_json::from_str(&run.emitted[i])
        .unwrap_or_else(|e| panic!("result {i} is not JSON ({e}): {:?}", run.emitted));
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn server<'a>(servers: &'a [ServerStatus], id: &str) -> &'a ServerStatus {
    servers
        .iter()
        .find(|s| s.server_id == id)
        .unwrap_or_else(|| panic!("no server {id} in {servers:#?}"))
}

/// An ok call, an `isError` result, a timeout and a policy denial, each counted once under
/// its own outcome or reason; the host's task, server and registry series are exact, and a
/// registry server never used is shown `idle` with nothing counted.
#[tokio::test]
async fn mcp_calls_are_counted_by_outcome_and_denials_by_reason() {
    let registry = RegistryDir::new();
    registry
        .fixture(
            "fixture",
            &["echo", "read_text", "slow"],
            "[budgets]\ntool_timeout_ms = 2000\n",
        )
        .fixture("spare", &["echo"], "");
    let host = host(&registry);
    let guest = McpGuest::new()
        .open("fixture")
        .call("echo", json!({"text": "hi"}))
        .call("read_text", json!({"path": "/nonexistent/metrics-test"}))
        .call("slow", json!({"ms": 60000}))
        .call("count", json!({}));
    let run = wat::run_ok(&host, &guest.build(), &mcp_task("metrics", &["fixture"])).await;
    assert_eq!(result_text(&run, 0), "hi");
    assert_eq!(run.results[4], EACCES, "count is outside allowed_tools");

    let samples = scrape(&host);
    let calls = "quiver_mcp_tool_calls_total";
    let labels = |tool, outcome| {
        [
            ("server_id", "fixture"),
            ("tool", tool),
            ("outcome", outcome),
        ]
    };
    assert_eq!(get(&samples, calls, &labels("echo", "ok")), 1.0);
    assert_eq!(
        get(&samples, calls, &labels("read_text", "tool_error")),
        1.0,
        "an isError result is a tool error, not ok"
    );
    assert_eq!(get(&samples, calls, &labels("slow", "timeout")), 1.0);
    assert_eq!(
        samples.iter().filter(|s| s.name == calls).count(),
        3,
        "the denied call ran nothing"
    );
    for sample in samples.iter().filter(|s| s.name == calls) {
        let keys: BTreeSet<&str> = sample.labels.keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["server_id", "tool", "outcome"]));
    }
    assert_eq!(
        get(
            &samples,
            "quiver_policy_denials_total",
            &[("reason", "not_in_allowlist")]
        ),
        1.0
    );
    let series = [("server_id", "fixture"), ("tool", "slow")];
    assert_eq!(
        get(
            &samples,
            "quiver_mcp_tool_call_duration_seconds_count",
            &series
        ),
        1.0
    );
    assert!(
        get(
            &samples,
            "quiver_mcp_tool_call_duration_seconds_sum",
            &series
        ) >= 2.0,
        "the timeout took its 2 s"
    );
    let echo = [("server_id", "fixture"), ("tool", "echo")];
    assert_eq!(
        get(&samples, "quiver_mcp_tool_output_bytes_count", &echo),
        1.0
    );
    let echoed = get(&samples, "quiver_mcp_tool_output_bytes_sum", &echo);
    assert!((20.0..200.0).contains(&echoed), "{echoed}");
    assert_eq!(
        get(&samples, "quiver_tasks_total", &[("outcome", "ok")]),
        1.0
    );
    assert_eq!(get(&samples, "quiver_tasks_running", &[]), 0.0);
    assert_eq!(get(&samples, "quiver_tasks_queued", &[]), 0.0);
    // The task's linear memory went back when it ended.
    assert_eq!(get(&samples, "quiver_guest_memory_bytes", &[]), 0.0);
    assert!(get(&samples, "quiver_guest_memory_limit_bytes", &[]) > 0.0);
    let fixture = [("server_id", "fixture")];
    assert_eq!(get(&samples, "quiver_mcp_server_up", &fixture), 1.0);
    assert_eq!(
        get(&samples, "quiver_mcp_server_connects_total", &fixture),
        1.0
    );
    assert_eq!(
        get(&samples, "quiver_mcp_server_restarts_total", &fixture),
        0.0
    );
    assert_eq!(
        get(&samples, "quiver_mcp_server_up", &[("server_id", "spare")]),
        0.0
    );
    let revision = host.registry().revision().to_owned();
    assert_eq!(
        get(
            &samples,
            "quiver_registry_revision",
            &[("revision", &revision)]
        ),
        1.0
    );

    let servers = host.mcp_servers();
    assert_eq!(servers.len(), 2, "every registry server: {servers:#?}");
    let fixture = server(&servers, "fixture");
    assert_eq!(
        fixture.state,
        ServerState::Degraded,
        "the timeout was a minute ago at most"
    );
    assert!(
        fixture
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("did not answer")),
        "{fixture:#?}"
    );
    assert!(fixture.last_success.is_some() && fixture.latency_p50_ms.is_some());
    let spare = server(&servers, "spare");
    assert_eq!(
        (spare.state, spare.connections, spare.last_success),
        (ServerState::Idle, 0, None)
    );
    host.shutdown().await;
}

/// The chat loop: LLM exchanges and tokens per backend, an MCP tool's `isError` result
/// failed in the metrics, `_spear.tool_calls[].ok` and GET_METRICS alike, a guest tool
/// counted with an empty server id, and a send stopped by `max_iterations` counted as a
/// budget hit.
#[tokio::test]
async fn chat_loop_counts_llm_use_tool_errors_and_budget_hits() {
    let read_missing = (
        "e1",
        "mcp__fixture__read_text",
        json!({"path": "/nonexistent/chat-metrics"}),
    );
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([
            read_missing.clone(),
            ("w1", "get_weather", json!({"city": "Oslo"})),
        ]),
        Reply::text("done"),
        Reply::tool_calls([read_missing]),
    ])
    .await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["read_text"], "");
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new()
        .msg("user", "go")
        .tool(WEATHER, "get_weather")
        .arena()
        .send(2)
        .recv()
        .metrics()
        .param("max_iterations", json!(1))
        .send(2)
        .recv();
    let run = wat::run_ok(&host, &guest.build(), &mcp_task("chat", &["fixture"])).await;
    let emitted = |i: usize| -> Value { serde_json::from_str(&run.emitted[i]).unwrap() };
    let summary = &emitted(0)["_spear"]["tool_calls"];
    assert_eq!(summary[0]["ok"], false, "{summary}");
    assert_eq!(summary[1]["ok"], true, "{summary}");
    assert_eq!(emitted(1)["tool_calls"]["failed"], 1);
    assert_eq!(emitted(2)["error"]["limit"], "max_iterations");

    let samples = scrape(&host);
    let scripted_ok = [("backend", "scripted"), ("outcome", "ok")];
    assert_eq!(
        get(&samples, "quiver_llm_requests_total", &scripted_ok),
        3.0
    );
    let (mut prompt, mut completion) = (0, 0);
    for i in 0..llm.request_count() {
        let messages = llm.request(i)["messages"].as_array().unwrap().len();
        let (p, c, _) = expected_usage(messages);
        prompt += p;
        completion += c;
    }
    let tokens = |kind| {
        get(
            &samples,
            "quiver_llm_tokens_total",
            &[("backend", "scripted"), ("kind", kind)],
        )
    };
    assert_eq!(tokens("prompt"), prompt as f64);
    assert_eq!(tokens("completion"), completion as f64);
    assert_eq!(
        get(
            &samples,
            "quiver_mcp_tool_calls_total",
            &[
                ("server_id", "fixture"),
                ("tool", "read_text"),
                ("outcome", "tool_error")
            ]
        ),
        1.0,
        "the over-budget turn ran no tool"
    );
    assert_eq!(
        get(
            &samples,
            "quiver_mcp_tool_calls_total",
            &[
                ("server_id", ""),
                ("tool", "get_weather"),
                ("outcome", "ok")
            ]
        ),
        1.0
    );
    assert_eq!(
        get(
            &samples,
            "quiver_chat_budget_hits_total",
            &[("budget", "max_iterations")]
        ),
        1.0
    );
    let servers = host.mcp_servers();
    let fixture = server(&servers, "fixture");
    assert_eq!(
        (fixture.state, fixture.last_error.as_deref()),
        (ServerState::Connected, None),
        "a tool's own error is not a server failure"
    );
    host.shutdown().await;
}

/// A server listing more tools than the series cap: the calls of tools past the cap count
/// under `tool="_other"`, so the series stay bounded and no call goes uncounted.
#[tokio::test]
async fn tool_series_past_the_cap_fold_into_other() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "");
    let host = host_builder(&registry)
        .with_max_metric_tool_series(3)
        .build()
        .expect("host");
    let tools = ["count", "pid", "list_count", "auth_rejections", "whoami"];
    let guest = tools
        .iter()
        .fold(McpGuest::new().open("fixture"), |guest, tool| {
            guest.call(tool, json!({}))
        });
    wat::run_ok(&host, &guest.build(), &mcp_task("cap", &["fixture"])).await;
    let listed = host.server_tools("fixture").await.unwrap();
    assert!(
        listed.len() > 3 * 4,
        "the fixture lists {} tools",
        listed.len()
    );

    let samples = scrape(&host);
    let calls: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "quiver_mcp_tool_calls_total")
        .collect();
    let named: BTreeSet<&str> = calls.iter().map(|s| s.labels["tool"].as_str()).collect();
    assert_eq!(
        named,
        BTreeSet::from(["count", "pid", "list_count", "_other"]),
        "{calls:#?}"
    );
    let other = [
        ("server_id", "fixture"),
        ("tool", "_other"),
        ("outcome", "ok"),
    ];
    assert_eq!(get(&samples, "quiver_mcp_tool_calls_total", &other), 2.0);
    assert_eq!(calls.iter().map(|s| s.value).sum::<f64>(), 5.0);
    let histograms = samples
        .iter()
        .filter(|s| s.name == "quiver_mcp_tool_call_duration_seconds_count")
        .count();
    assert_eq!(histograms, 4);
    host.shutdown().await;
}

/// With `[principals]` in the host config, the per-call counters carry a `principal` label:
/// the name of a listed principal, `other` for any other name (or none), so made-up names
/// add no series (the `*` entry lets them all call).
#[tokio::test]
async fn principal_labels_name_only_listed_principals() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["*"], "");
    let config: quiver::HostConfig = toml::from_str(
        "[principals.ann]\nservers = [\"*\"]\n[principals.\"*\"]\nservers = [\"fix*\"]\n",
    )
    .expect("config");
    let host = host_builder(&registry)
        .with_config(config, registry.path())
        .build()
        .expect("host");
    let guest = McpGuest::new()
        .open("fixture")
        .call("count", json!({}))
        .build();
    for principal in [Some("ann"), Some("made-up-1"), Some("made-up-2"), None] {
        let mut task = mcp_task("labelled", &["fixture"]);
        task.principal = principal.map(str::to_owned);
        wat::run_ok(&host, &guest, &task).await;
    }
    let samples = scrape(&host);
    let calls = |principal| {
        find(
            &samples,
            "quiver_mcp_tool_calls_total",
            &[
                ("server_id", "fixture"),
                ("tool", "count"),
                ("outcome", "ok"),
                ("principal", principal),
            ],
        )
    };
    assert_eq!(calls("ann"), Some(1.0));
    assert_eq!(calls("other"), Some(3.0));
    let text = host.metrics().encode();
    assert!(!text.contains("made-up"), "{text}");
    host.shutdown().await;
}

const SECRET: &str = "qv-metrics-secret-3141";

/// A crash and a restart: the server gets a new process, one reconnect, a `degraded`
/// state and a last error; a server whose errors quote its secret shows them redacted in
/// its health and nowhere in the metrics.
#[tokio::test]
async fn server_health_after_a_crash_and_a_restart_and_redacted_errors() {
    let registry = RegistryDir::new();
    registry.fixture("crashy", &["pid", "crash"], "");
    registry.fixture_with_args(
        "echoing",
        &["*"],
        &[
            "--fail-calls-with",
            "upstream refused token ${ENV:QV_METRICS_SECRET}",
        ],
        "",
    );
    let env = |name: &str| (name == "QV_METRICS_SECRET").then(|| SECRET.to_owned());
    let loaded = Registry::load_dir_with_env(registry.path(), &env).expect("registry");
    let host = host_builder(&registry)
        .with_registry(loaded)
        .build()
        .expect("host");
    let guest = McpGuest::new()
        .open("crashy")
        .call("pid", json!({}))
        .call("crash", json!({}))
        .call("pid", json!({}))
        .open("echoing")
        .call("echo", json!({"text": "x"}));
    let run = wat::run_ok(
        &host,
        &guest.build(),
        &mcp_task("health", &["crashy", "echoing"]),
    )
    .await;
    let first: u32 = result_text(&run, 0).parse().expect("a pid");
    let second: u32 = result_text(&run, 2).parse().expect("a pid");
    assert_ne!(first, second, "the crashed server was started again");

    let servers = host.mcp_servers();
    let crashy = server(&servers, "crashy");
    assert_eq!(crashy.pid, Some(second));
    assert_eq!((crashy.connections, crashy.reconnects), (2, 1));
    assert_eq!(crashy.state, ServerState::Degraded);
    assert!(
        crashy
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("went away")),
        "{crashy:#?}"
    );
    let echoing = server(&servers, "echoing");
    let error = echoing.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("upstream refused token [redacted]") && !error.contains(SECRET),
        "{echoing:#?}"
    );
    assert_eq!(echoing.reconnects, 0, "a failed call is no restart");

    let text = host.metrics().encode();
    assert!(!text.contains(SECRET));
    let samples = parse(&text);
    let crashy = [("server_id", "crashy")];
    assert_eq!(
        get(&samples, "quiver_mcp_server_restarts_total", &crashy),
        1.0
    );
    assert_eq!(
        get(&samples, "quiver_mcp_server_connects_total", &crashy),
        2.0
    );
    assert_eq!(get(&samples, "quiver_mcp_server_up", &crashy), 1.0);
    let crash = [
        ("server_id", "crashy"),
        ("tool", "crash"),
        ("outcome", "error"),
    ];
    assert_eq!(get(&samples, "quiver_mcp_tool_calls_total", &crash), 1.0);
    host.shutdown().await;
}

/// `quiver mcp status --json` connects to every server and prints each one's health; a
/// server that cannot start is `down` with its error, and the exit status says so.
#[test]
fn mcp_status_prints_every_servers_health() {
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo"], "").write(
        "absent.toml",
        "server_id = \"absent\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"/nonexistent/quiver-status-test\"\n",
    );
    let output = std::process::Command::new(quiver_cli())
        .args(["mcp", "status", "--json", "--registry"])
        .arg(registry.path())
        .env("QUIVER_LOG", "error")
        .output()
        .expect("run quiver");
    assert_eq!(output.status.code(), Some(1), "a server is down");
    let servers: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let servers = servers.as_array().expect("an array");
    assert_eq!(servers.len(), 2);
    let by_id = |id: &str| {
        servers
            .iter()
            .find(|s| s["server_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {servers:?}"))
    };
    let fixture = by_id("fixture");
    assert_eq!(fixture["state"], "connected");
    assert!(fixture["tool_count"].as_u64().unwrap() > 10, "{fixture}");
    assert_eq!(fixture["connections"], 1);
    let absent = by_id("absent");
    assert_eq!(absent["state"], "down");
    assert!(
        absent["last_error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/quiver-status-test"),
        "{absent}"
    );

    let table = std::process::Command::new(quiver_cli())
        .args(["mcp", "status", "--registry"])
        .arg(registry.path())
        .env("QUIVER_LOG", "error")
        .output()
        .expect("run quiver");
    let table = String::from_utf8_lossy(&table.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("SERVER") && lines[0].contains("STATE"),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("fixture") && l.contains("connected")),
        "{table}"
    );
}

/// `quiver mcp status --node URL --token-env VAR` prints what a node's
/// `GET /v1/mcp/servers` answers, sending the token, with no terminal escapes from the
/// (untrusted) answer in the table or an error; a wrong token is an error.
#[test]
fn mcp_status_asks_a_node_with_its_token() {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;

    let node = quiver_tests::serve::Bound::new("fake node").serve(
        "fake node",
        axum::Router::new().route(
            "/v1/mcp/servers",
            get(|headers: HeaderMap| async move {
                let authorized = headers
                    .get("authorization")
                    .is_some_and(|v| v == "Bearer node-token-42");
                if !authorized {
                    return (
                        StatusCode::UNAUTHORIZED,
                        "{\"error\":\"token\u{1b}]0;owned\u{7}\"}".to_owned(),
                    );
                }
                let servers = json!({"servers": [{"server_id": "remote-one", "state": "degraded",
                    "tool_count": 7, "connections": 3, "reconnects": 2, "latency_p50_ms": 12,
                    "latency_p95_ms": 80, "last_error": "boom\u{1b}[2J\u{202e}gnp.exe"},
                    {"server_id": "evil\u{1b}[31m", "state": {"x": "\u{1b}[5m"}}]});
                (StatusCode::OK, servers.to_string())
            }),
        ),
    );
    let url = format!("http://{}", node.addr());
    let status = |token: &str, json: bool| {
        let mut command = std::process::Command::new(quiver_cli());
        command
            .args([
                "mcp",
                "status",
                "--node",
                &url,
                "--token-env",
                "QV_NODE_TOKEN",
            ])
            .env("QV_NODE_TOKEN", token)
            .env_remove("QUIVER_REGISTRY");
        if json {
            command.arg("--json");
        }
        command.output().expect("run quiver")
    };
    let output = status("node-token-42", true);
    assert_eq!(output.status.code(), Some(0));
    let servers: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(servers[0]["server_id"], "remote-one");
    assert_eq!(servers[0]["reconnects"], 2);
    let table = status("node-token-42", false);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("remote-one") && l.contains("degraded") && l.contains("80ms")),
        "{table}"
    );
    assert!(
        table.contains(r"boom\x1b[2J\u{202e}gnp.exe") && table.contains(r"evil\x1b[31m"),
        "{table}"
    );
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{202e}'),
        "no escapes reach the terminal: {table:?}"
    );
    let refused = status("wrong", true);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "{stderr:?}"
    );
}

/// Tasks are counted by how they end: a trap, a deadline, and one refused because the
/// host was busy.
#[tokio::test]
async fn tasks_are_counted_by_outcome() {
    let registry = RegistryDir::new();
    let host = host_builder(&registry)
        .with_max_concurrent_tasks(1)
        .with_task_queue_capacity(0)
        .build()
        .expect("host");
    let trap = wat::guest(&[], "(func $main unreachable)");
    let spin = wat::guest(&[], "(func $main (loop $l (br $l)))");
    let task = |id: &str, ms: u64| {
        quiver::TaskSpec::new(id).with_deadline(std::time::Duration::from_millis(ms))
    };
    wat::run(&host, &trap, &task("trap", 60_000)).await;
    let spinning = {
        let (host, spin) = (host.clone(), spin.clone());
        tokio::spawn(async move { wat::run(&host, &spin, &task("spin", 1_500)).await })
    };
    let waiting = std::time::Instant::now();
    while host.status().tasks.running == 0 {
        assert!(
            waiting.elapsed().as_secs() < 30,
            "the spinning task never ran"
        );
        assert!(!spinning.is_finished(), "the spinning task ended unseen");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let module = host.load_module("busy.wat", trap.as_bytes()).unwrap();
    let refused = host.run_task(&module, &task("busy", 60_000)).await;
    assert!(matches!(refused, Err(quiver::HostError::Busy { .. })));
    spinning.await.unwrap();

    let samples = scrape(&host);
    for outcome in ["trapped", "deadline", "busy"] {
        assert_eq!(
            get(&samples, "quiver_tasks_total", &[("outcome", outcome)]),
            1.0,
            "{outcome}"
        );
    }
    assert_eq!(
        find(&samples, "quiver_tasks_total", &[("outcome", "ok")]),
        None
    );
}
