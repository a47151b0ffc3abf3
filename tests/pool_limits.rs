//! The MCP pool's host-wide limits against real fixture servers over stdio: the host's
//! call cap, the process cap with its least-recently-used stop, idle stops, pre-warming,
//! and the `[mcp]` section of the host config.
//!
//! No assertion depends on how fast the machine is: calls are held open with the `slow`
//! tool and the tests wait (with a bound) for the state they need before going on.

use std::future::Future;
use std::time::{Duration, Instant};

use quiver::Host;
use quiver::{McpError, McpErrorCode, PoolLimits};
use quiver_tests::group::{ServerWithChild, group_gone, left_of};
use quiver_tests::{
    RegistryDir, call_tool_text, host_builder, init_logging, server_status, unique_id, until,
};
use serde_json::json;

/// Starts a call of `slow` for `ms` in the background.
fn slow_call(
    host: &Host,
    server_id: &str,
    ms: u64,
) -> tokio::task::JoinHandle<Result<String, McpError>> {
    let (host, server_id) = (host.clone(), server_id.to_owned());
    tokio::spawn(async move { call_tool_text(&host, &server_id, "slow", json!({"ms": ms})).await })
}

/// Awaits `f`, which must finish within 60 s.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("finished within 60 s")
}

fn pid_of(host: &Host, server_id: &str) -> Option<u32> {
    server_status(host, server_id).and_then(|s| s.pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_beyond_the_host_cap_waits_within_its_tool_timeout_and_names_the_cap() {
    init_logging();
    let (busy, quick) = (unique_id("busy"), unique_id("quick"));
    let registry = RegistryDir::new();
    registry.fixture(&busy, &["*"], "");
    registry.fixture(&quick, &["*"], "[budgets]\ntool_timeout_ms = 300\n");
    let host = host_builder(&registry)
        .with_max_concurrent_mcp_calls(1)
        .build()
        .unwrap();
    // Connected first: listing takes a host permit too.
    assert_eq!(
        call_tool_text(&host, &quick, "echo", json!({"text": "a"}))
            .await
            .unwrap(),
        "a"
    );
    let held = slow_call(&host, &busy, 3000);
    until("the slow call holds the host's only permit", || {
        host.mcp_usage().calls_in_flight == 1
            && server_status(&host, &busy).is_some_and(|s| s.calls_in_flight == 1 && s.idle_ms == 0)
    })
    .await;
    let error = call_tool_text(&host, &quick, "echo", json!({"text": "b"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Timeout, "{error}");
    assert!(
        error.message.contains("max_concurrent_calls") && error.message.contains("300 ms"),
        "{error}"
    );
    assert_eq!(bounded(held).await.unwrap().unwrap(), "slept 3000ms");
    assert_eq!(
        call_tool_text(&host, &quick, "echo", json!({"text": "c"}))
            .await
            .unwrap(),
        "c"
    );
    assert_eq!(host.mcp_usage().calls_in_flight, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_behind_a_busy_server_hold_no_host_permit() {
    init_logging();
    let (narrow, other) = (unique_id("narrow"), unique_id("other"));
    let registry = RegistryDir::new();
    registry.fixture(&narrow, &["*"], "[budgets]\nmax_concurrency = 1\n");
    registry.fixture(&other, &["*"], "");
    let host = host_builder(&registry)
        .with_max_concurrent_mcp_calls(2)
        .build()
        .unwrap();
    let first = slow_call(&host, &narrow, 3000);
    until("the first call runs", || {
        host.mcp_usage().calls_in_flight == 1
    })
    .await;
    let second = slow_call(&host, &narrow, 10);
    until("the second call waits for the server", || {
        server_status(&host, &narrow).is_some_and(|s| s.calls_in_flight == 2)
    })
    .await;
    assert_eq!(
        host.mcp_usage().calls_in_flight,
        1,
        "a call waiting for its server holds no host permit"
    );
    assert_eq!(
        call_tool_text(&host, &other, "echo", json!({"text": "through"}))
            .await
            .unwrap(),
        "through",
        "another server's call gets the host's second permit"
    );
    assert!(bounded(first).await.unwrap().is_ok());
    assert!(bounded(second).await.unwrap().is_ok());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_process_cap_the_least_recently_used_idle_server_is_stopped_whole() {
    init_logging();
    let registry = RegistryDir::new();
    let ids = [unique_id("lru-a"), unique_id("lru-b"), unique_id("lru-c")];
    let servers: Vec<ServerWithChild> = ids
        .iter()
        .map(|id| ServerWithChild::register(&registry, id, &[], "", ""))
        .collect();
    let host = host_builder(&registry)
        .with_max_server_processes(2)
        .build()
        .unwrap();
    let a: u32 = call_tool_text(&host, &ids[0], "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap();
    let a_child = servers[0].child_pid();
    let b: u32 = call_tool_text(&host, &ids[1], "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap();
    // `a` is now the least recently used; using `b` again keeps it that way.
    call_tool_text(&host, &ids[1], "pid", json!({}))
        .await
        .unwrap();
    assert_eq!(host.mcp_usage().server_processes, 2);
    let c: u32 = call_tool_text(&host, &ids[2], "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        left_of(a, &[a, a_child]),
        Vec::<u32>::new(),
        "the evicted server and its child are gone before the new one is used"
    );
    assert_eq!(pid_of(&host, &ids[0]), None);
    assert_eq!(pid_of(&host, &ids[1]), Some(b));
    assert_eq!(pid_of(&host, &ids[2]), Some(c));
    assert_eq!(host.mcp_usage().server_processes, 2);
    // The evicted server starts again on its next call (evicting `b` now).
    let again: u32 = call_tool_text(&host, &ids[0], "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(again, a);
    assert_eq!(server_status(&host, &ids[0]).unwrap().connections, 2);
    assert_eq!(pid_of(&host, &ids[1]), None);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_process_cap_with_every_server_busy_a_new_one_fails_at_once() {
    init_logging();
    let (busy, late) = (unique_id("busy"), unique_id("late"));
    let registry = RegistryDir::new();
    registry.fixture(&busy, &["*"], "");
    registry.fixture(&late, &["*"], "");
    let host = host_builder(&registry)
        .with_max_server_processes(1)
        .build()
        .unwrap();
    let held = slow_call(&host, &busy, 3000);
    until("the busy server runs a call", || {
        server_status(&host, &busy).is_some_and(|s| s.pid.is_some() && s.calls_in_flight == 1)
    })
    .await;
    let error = call_tool_text(&host, &late, "echo", json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, McpErrorCode::Unavailable, "{error}");
    assert!(
        error.message.contains("max_server_processes") && error.message.contains(&late),
        "the error names the cap and the option that raises it: {error}"
    );
    assert!(
        bounded(held).await.unwrap().is_ok(),
        "the busy server was not stopped"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_process_cap_a_crashed_server_is_started_again() {
    init_logging();
    let crashy = unique_id("crashy");
    let registry = RegistryDir::new();
    registry.fixture_with_args(&crashy, &["*"], &["--exit-after-calls", "1"], "");
    let host = host_builder(&registry)
        .with_max_server_processes(1)
        .build()
        .unwrap();
    // Each server exits after its first call. The next call comes as soon as the pool has
    // seen the exit, while the dead server may still hold the only process permit: it must
    // get one (at once, or once the dead group is gone), never "every one is busy".
    for round in 1..=3 {
        let text = bounded(call_tool_text(&host, &crashy, "echo", json!({"text": "x"})))
            .await
            .unwrap_or_else(|e| panic!("call {round}: {e}"));
        assert_eq!(text, "x");
        assert_eq!(
            server_status(&host, &crashy).map(|s| s.connections),
            Some(round)
        );
        until("the server exited", || pid_of(&host, &crashy).is_none()).await;
    }
    until("the last server's permit is back", || {
        host.mcp_usage().server_processes == 0
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_is_stopped_whole_but_never_during_a_call() {
    init_logging();
    let id = unique_id("idle");
    let registry = RegistryDir::new();
    let server = ServerWithChild::register(&registry, &id, &[], "", "");
    let host = host_builder(&registry)
        .with_server_idle_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert_eq!(
        call_tool_text(&host, &id, "slow", json!({"ms": 1500}))
            .await
            .unwrap(),
        "slept 1500ms",
        "a call longer than the idle timeout is not cut short"
    );
    let first = server_status(&host, &id).unwrap();
    assert_eq!(first.connections, 1);
    let pid = first.pid.unwrap();
    let child = server.child_pid();
    until("the idle server is stopped", || {
        pid_of(&host, &id).is_none()
    })
    .await;
    assert_eq!(
        group_gone(pid, &[pid, child], Duration::from_secs(20)).await,
        Vec::<u32>::new(),
        "no process of the idle server's group is left"
    );
    server.forget_child();
    let again: u32 = call_tool_text(&host, &id, "pid", json!({}))
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(again, pid, "the next call started it again");
    assert_eq!(server_status(&host, &id).unwrap().connections, 2);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_can_keep_its_server_up_when_idle() {
    init_logging();
    let (kept, reaped) = (unique_id("kept"), unique_id("reaped"));
    let registry = RegistryDir::new();
    ServerWithChild::register(&registry, &kept, &[], "idle_timeout_ms = 0", "");
    ServerWithChild::register(&registry, &reaped, &[], "", "");
    let host = host_builder(&registry)
        .with_server_idle_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    call_tool_text(&host, &kept, "pid", json!({}))
        .await
        .unwrap();
    let kept_pid = pid_of(&host, &kept).unwrap();
    call_tool_text(&host, &reaped, "pid", json!({}))
        .await
        .unwrap();
    until("the other server is stopped", || {
        pid_of(&host, &reaped).is_none()
    })
    .await;
    assert_eq!(
        pid_of(&host, &kept),
        Some(kept_pid),
        "idle as long, yet still up: its record says never"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_fails_to_build_starts_no_prewarmed_server() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let registry = RegistryDir::new();
    // Each server leaves a mark when it starts, and then waits for its stdin to close.
    for id in ["failed", "built"] {
        let mark = dir.path().join(id);
        registry.write(
            &format!("{id}.toml"),
            &format!(
                "server_id = {id:?}\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"touch \\\"$0\\\"; cat >/dev/null\", {:?}]\n",
                mark.display().to_string()
            ),
        );
    }
    let config = dir.path().join("quiver.toml");
    std::fs::write(&config, "default_backend = \"nope\"\n").unwrap();
    let failed = host_builder(&registry)
        .with_config_file(&config)
        .unwrap()
        .with_prewarm(["failed"])
        .build();
    assert!(failed.is_err(), "the config names no such backend");
    // A host built afterwards pre-warms its own server; had the failed build started
    // one, it would have started first.
    let host = host_builder(&registry)
        .with_prewarm(["built"])
        .build()
        .unwrap();
    until("the built host's server started", || {
        dir.path().join("built").exists()
    })
    .await;
    assert!(
        !dir.path().join("failed").exists(),
        "a failed build started a server"
    );
    // The server never answers `initialize`; shutdown does not wait out the 60 s connect
    // timeout of the pre-warm still connecting.
    let start = Instant::now();
    bounded(host.shutdown()).await;
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "shutdown waited for a connect: {:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewarmed_servers_start_with_the_host() {
    init_logging();
    let (warm, cold) = (unique_id("warm"), unique_id("cold"));
    let registry = RegistryDir::new();
    registry.fixture(&warm, &["*"], "");
    registry.fixture(&cold, &["*"], "");
    let host = host_builder(&registry)
        .with_prewarm([warm.as_str(), "not-in-the-registry"])
        .build()
        .unwrap();
    until("the pre-warmed server runs", || {
        pid_of(&host, &warm).is_some()
    })
    .await;
    assert!(
        server_status(&host, &cold).is_none(),
        "only named servers start"
    );
    host.server_tools(&warm).await.unwrap();
    assert_eq!(
        server_status(&host, &warm).unwrap().connections,
        1,
        "the first use finds it connected"
    );
    host.shutdown().await;
}

#[test]
fn the_host_config_sets_the_limits_and_builder_options_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quiver.toml");
    std::fs::write(
        &path,
        "[mcp]\nmax_concurrent_calls = 7\nmax_server_processes = 3\nserver_idle_timeout_ms = 1234\n",
    )
    .unwrap();
    let from_file = Host::builder()
        .without_disk_cache()
        .with_config_file(&path)
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(
        from_file.mcp_limits(),
        &PoolLimits {
            max_concurrent_calls: 7,
            max_server_processes: 3,
            server_idle_timeout: Duration::from_millis(1234),
        }
    );
    let overridden = Host::builder()
        .without_disk_cache()
        .with_config_file(&path)
        .unwrap()
        .with_max_server_processes(5)
        .build()
        .unwrap();
    assert_eq!(overridden.mcp_limits().max_server_processes, 5);
    assert_eq!(overridden.mcp_limits().max_concurrent_calls, 7);
    assert_eq!(
        Host::builder()
            .without_disk_cache()
            .build()
            .unwrap()
            .mcp_limits(),
        &PoolLimits {
            // The host-wide call cap follows the task slots when nothing sets it.
            max_concurrent_calls: quiver::defaults::max_concurrent_mcp_calls(
                quiver::defaults::MAX_CONCURRENT_TASKS
            ),
            ..PoolLimits::default()
        }
    );
    for (text, field) in [
        (
            "[mcp]\nmax_server_processes = 0\n",
            "mcp.max_server_processes",
        ),
        (
            "[mcp]\nmax_concurrent_calls = 0\n",
            "mcp.max_concurrent_calls",
        ),
        ("[mcp]\nprewarm = [\"not an id\"]\n", "mcp.prewarm"),
        ("[mcp]\nidle = 3\n", "idle"),
    ] {
        std::fs::write(&path, text).unwrap();
        let error = Host::builder()
            .with_config_file(&path)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&path.display().to_string()) && error.contains(field),
            "{text:?}: {error}"
        );
    }
}
