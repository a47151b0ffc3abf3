//! Both MCP protocol generations with default records (no `lifecycle`): 2025-era servers
//! (the npm reference server, the fixture server answering `initialize` only, one that
//! ignores `server/discover`) and 2026-07-28 servers (the rmcp fixture server, and with
//! `--no-initialize` one that has no `initialize` at all), over stdio, Streamable HTTP and
//! legacy SSE; and the servers' cache hints (SEP-2549) driving the tools cache.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quiver::{Host, HostConfig, ToolCallRequest};
use quiver_tests::{
    FixtureHttp, RegistryDir, fixture_toml_with_args, host, host_builder, library_task, workspace,
};

/// Well under rmcp's 10 s `auto` fallback, well over a loaded machine's process start.
const NO_STALL: Duration = Duration::from_secs(7);

async fn call_text(host: &Host, server_id: &str, tool: &str, args: serde_json::Value) -> String {
    let request = ToolCallRequest::new(server_id, tool).with_arguments(args);
    let out = host
        .call_tool(&library_task(server_id), request)
        .await
        .unwrap_or_else(|e| panic!("{server_id}/{tool}: {e}"));
    out.result.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

/// Calls `tool` on `server_id` (connecting first) and says how long it took.
async fn timed_call(host: &Host, server_id: &str, tool: &str, args: serde_json::Value) -> String {
    let started = Instant::now();
    let text = call_text(host, server_id, tool, args).await;
    let took = started.elapsed();
    assert!(
        took < NO_STALL,
        "{server_id}: connecting and calling {tool} took {took:?}"
    );
    text
}

fn npm_bin(name: &str) -> PathBuf {
    let bin = workspace()
        .join("fixtures/npm/node_modules/.bin")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup.sh",
        bin.display()
    );
    bin
}

#[tokio::test]
async fn default_records_reach_both_generations_over_stdio_without_a_stall() {
    let registry = RegistryDir::new();
    registry
        // 2026-07-28 and older (rmcp 3.9's server): discovered, stateless.
        .fixture("dual", &["*"], "")
        // 2026-07-28 only: `initialize` would fail.
        .fixture_with_args("modern", &["*"], &["--no-initialize"], "")
        // An older server that never answers an unknown method: the probe's ping finds it.
        .fixture_with_args("deaf", &["*"], &["--ignore-discover"], "")
        .write(
            "deaf_auto.toml",
            &format!(
                "lifecycle = \"auto\"\n{}",
                fixture_toml_with_args("deaf_auto", &["*"], &["--ignore-discover"], "")
            ),
        )
        // An explicit `initialize` still never sends `server/discover`.
        .write(
            "pinned.toml",
            &format!(
                "lifecycle = \"initialize\"\n{}",
                fixture_toml_with_args("pinned", &["*"], &["--no-initialize"], "")
            ),
        );
    let everything = npm_bin("mcp-server-everything");
    registry.write(
        "everything.toml",
        &format!(
            "server_id = \"everything\"\ntransport = \"stdio\"\nallowed_tools = [\"echo\"]\n[stdio]\ncommand = {:?}\nargs = [\"stdio\"]\n",
            everything.display().to_string()
        ),
    );
    let host = host(&registry);
    for server in ["dual", "modern", "deaf", "deaf_auto"] {
        let text = timed_call(&host, server, "echo", serde_json::json!({"text": server})).await;
        assert_eq!(text, server);
    }
    let echoed = timed_call(
        &host,
        "everything",
        "echo",
        serde_json::json!({"message": "hi"}),
    )
    .await;
    assert!(echoed.contains("hi"), "{echoed}");
    let request =
        ToolCallRequest::new("pinned", "echo").with_arguments(serde_json::json!({"text": "x"}));
    let refused = host.call_tool(&library_task("pinned"), request).await;
    assert!(
        refused.is_err(),
        "lifecycle = \"initialize\" reached a server without initialize"
    );
    host.shutdown().await;
}

/// `mcp-server-everything streamableHttp` on a free loopback port, killed on drop.
struct NpmHttp {
    child: Child,
    url: String,
}

impl NpmHttp {
    fn spawn() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(npm_bin("mcp-server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "server-everything did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for NpmHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn default_records_reach_both_generations_over_http_and_legacy_sse() {
    let dual = FixtureHttp::spawn("http", &[]);
    let modern = FixtureHttp::spawn("http", &["--no-initialize"]);
    let sse = FixtureHttp::spawn("sse", &[]);
    let everything = NpmHttp::spawn();
    let registry = RegistryDir::new();
    let record = |id: &str, transport: &str, url: &str| {
        format!(
            "server_id = {id:?}\ntransport = {transport:?}\nallowed_tools = [\"*\"]\n[http]\nurl = {url:?}\n"
        )
    };
    registry
        .write("dual.toml", &record("dual", "streamable_http", dual.url()))
        .write(
            "modern.toml",
            &record("modern", "streamable_http", modern.url()),
        )
        .write("sse.toml", &record("sse", "http_sse_legacy", sse.url()))
        .write(
            "everything.toml",
            &record("everything", "streamable_http", &everything.url),
        );
    let config = HostConfig {
        egress: quiver::EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..quiver::EgressConfig::default()
        },
        ..HostConfig::default()
    };
    let host = host_builder(&registry)
        .with_config(config, ".")
        .build()
        .unwrap();
    for server in ["dual", "modern", "sse"] {
        let text = timed_call(&host, server, "echo", serde_json::json!({"text": server})).await;
        assert_eq!(text, server);
    }
    let echoed = timed_call(
        &host,
        "everything",
        "echo",
        serde_json::json!({"message": "over http"}),
    )
    .await;
    assert!(echoed.contains("over http"), "{echoed}");
    host.shutdown().await;
}

/// How many complete listings the fixture server behind `server_id` has served.
async fn listings(host: &Host, server_id: &str) -> u64 {
    call_text(host, server_id, "list_count", serde_json::json!({}))
        .await
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_servers_ttl_shortens_the_tools_cache_and_a_private_listing_stays_with_its_principal() {
    let registry = RegistryDir::new();
    registry
        .fixture("plain", &["*"], "")
        .fixture_with_args("fresh", &["*"], &["--tools-ttl-ms", "0"], "")
        .fixture_with_args(
            "private",
            &["*"],
            &["--tools-ttl-ms", "600000", "--tools-cache-scope", "private"],
            "",
        );
    let host = host(&registry);
    let list = |id: &'static str, principal: Option<&'static str>| {
        let host = &host;
        async move {
            let tools = host.server_tools_as(id, principal).await.unwrap();
            tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>()
        }
    };

    // The fixture's default hint (an hour, public) within the host's 5 minutes.
    let first = list("plain", None).await;
    assert_eq!(
        list("plain", None).await,
        first,
        "the server's order is kept"
    );
    assert_eq!(listings(&host, "plain").await, 1);

    // `ttlMs: 0`: stale at once, listed again on every use.
    list("fresh", None).await;
    list("fresh", None).await;
    list("fresh", None).await;
    assert_eq!(listings(&host, "fresh").await, 3);

    // `cacheScope: private`: reused for its principal, never served to another.
    list("private", Some("alice")).await;
    list("private", Some("alice")).await;
    assert_eq!(listings(&host, "private").await, 1);
    list("private", Some("bob")).await;
    assert_eq!(listings(&host, "private").await, 2);
    host.shutdown().await;
}
