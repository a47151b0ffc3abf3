//! Registry reload against real fixture servers and WAT guests: a changed record restarts
//! its server, an unchanged one keeps its process, a removed one is stopped, a broken edit
//! keeps the old snapshot (degraded, naming the file) until fixed, a task running on the
//! old snapshot finishes, and the watcher follows file edits on its own.
//!
//! Nothing waits a fixed time for something to happen: every wait polls for the state it
//! needs, with a generous bound.

use std::time::Duration;

use quiver::ServerState;
use quiver::{Host, HostError, RegistryHealth};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{
    RegistryDir, fixture_toml, host, init_logging, mcp_task, pid_alive, server_status, unique_id,
    until, wait_gone,
};
use serde_json::Value;

/// The text of the `i`th tool result the guest emitted.
fn text(run: &WatRun, i: usize) -> String {
    let result: Value =
        serde_json::from_str(&run.emitted[i]).unwrap_or_else(|e| panic!("{e}: {:?}", run.emitted));
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {result}"))
        .to_owned()
}

/// Runs one task calling `pid` on each server; their pids, in order.
async fn pids(host: &Host, servers: &[&str]) -> Vec<u32> {
    let steps: Vec<(&str, &str, &str)> = servers.iter().map(|s| (*s, "pid", "{}")).collect();
    let run = wat::run_ok(host, &wat::mcp_calls(&steps, 1), &mcp_task("pids", servers)).await;
    assert!(run.results.iter().all(|&r| r >= 0), "{:?}", run.results);
    (0..servers.len())
        .map(|i| text(&run, i).parse().expect("a pid"))
        .collect()
}

/// Starts a task `old` that makes the calls in `steps` on `server`, and waits until its
/// first call is in flight there.
async fn start_old_task(
    host: &Host,
    server: &str,
    steps: &[(&str, &str, &str)],
) -> tokio::task::JoinHandle<WatRun> {
    let guest = wat::mcp_calls(steps, 1);
    let task = mcp_task("old", &[server]);
    let running = {
        let host = host.clone();
        tokio::spawn(async move { wat::run(&host, &guest, &task).await })
    };
    until("the old task's call is in flight", || {
        server_status(host, server).is_some_and(|s| s.calls_in_flight == 1)
    })
    .await;
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_restarts_changed_servers_keeps_unchanged_ones_and_stops_removed_ones() {
    init_logging();
    let (changed, kept, removed) = (
        unique_id("changed"),
        unique_id("kept"),
        unique_id("removed"),
    );
    let registry = RegistryDir::new();
    for id in [&changed, &kept, &removed] {
        registry.fixture(id, &["*"], "");
    }
    let host = host(&registry);
    let before = pids(&host, &[&changed, &kept, &removed]).await;
    let initial = host.registry_health();
    assert_eq!((initial.generation, initial.degraded), (0, false));

    // A task on the current snapshot holds a call to `changed` across the reload, then calls
    // it again.
    let old_task = start_old_task(
        &host,
        &changed,
        &[
            (&changed, "slow", r#"{"ms":3000}"#),
            (&changed, "echo", r#"{"text":"still here"}"#),
        ],
    )
    .await;

    registry.fixture(&changed, &["*"], "env = { RELOADED = \"1\" }");
    std::fs::remove_file(registry.path().join(format!("{removed}.toml"))).unwrap();
    let fresh = host.reload_registry().expect("reload");
    assert!(fresh.get(&removed).is_none());
    let health = host.registry_health();
    assert_eq!(health.revision, fresh.revision());
    assert_ne!(health.revision, initial.revision);
    assert_eq!(
        (health.generation, health.reloads, health.failed_reloads),
        (1, 1, 0)
    );
    assert!(!health.degraded && health.last_reload_error.is_none());

    assert!(
        wait_gone(before[2], Duration::from_secs(30)),
        "the removed server's process {} is still running",
        before[2]
    );
    let after = pids(&host, &[&kept, &changed]).await;
    assert_eq!(after[0], before[1], "the unchanged server kept its process");
    assert_ne!(after[1], before[0], "the changed server runs a new process");

    let old = old_task.await.unwrap();
    assert!(old.outcome.failure.is_none(), "{:?}", old.outcome.failure);
    assert!(old.results.iter().all(|&r| r >= 0), "{:?}", old.results);
    assert_eq!(text(&old, 0), "slept 3000ms");
    assert_eq!(text(&old, 1), "still here");
    assert!(
        wait_gone(before[0], Duration::from_secs(30)),
        "the changed server's old process {} is still running",
        before[0]
    );
    let status = host
        .mcp_servers()
        .into_iter()
        .find(|s| s.server_id == changed)
        .unwrap();
    assert_eq!(
        (status.state, status.pid),
        (ServerState::Connected, Some(after[1])),
        "stopping the replaced process leaves the new connection's health up: {status:?}"
    );
    assert!(
        pid_alive(after[0]) && pid_alive(after[1]),
        "the current servers {after:?} outlive the old snapshot's task"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_edit_keeps_the_old_snapshot_marked_degraded_until_fixed() {
    init_logging();
    let server = unique_id("steady");
    let registry = RegistryDir::new();
    registry.fixture(&server, &["*"], "");
    let file = format!("{server}.toml");
    let good = fixture_toml(&server, &["*"], "");
    let host = host(&registry);
    let pid = pids(&host, &[&server]).await[0];
    let revision = host.registry().revision().to_owned();

    let broken = [
        (file.clone(), "server_id = [".to_owned(), "invalid TOML"),
        (
            file.clone(),
            format!("alowed_tools = []\n{good}"),
            "alowed_tools",
        ),
        ("zz-duplicate.toml".to_owned(), good.clone(), "server_id"),
    ];
    for (i, (name, contents, named)) in broken.iter().enumerate() {
        registry.write(&file, &good);
        registry.write(name, contents);
        let error = host
            .reload_registry()
            .expect_err("a broken edit is refused");
        assert!(
            matches!(&error, HostError::RegistryRejected { kept_revision, .. } if *kept_revision == revision),
            "{error}"
        );
        let health: RegistryHealth = host.registry_health();
        let reason = health.last_reload_error.clone().unwrap_or_default();
        assert!(
            health.degraded && reason.contains(name.as_str()) && reason.contains(named),
            "{health:?}"
        );
        assert_eq!(health.failed_reloads, i as u64 + 1);
        assert_eq!(
            (health.generation, health.revision.as_str()),
            (0, revision.as_str())
        );
        assert_eq!(
            host.registry().revision(),
            revision,
            "the old snapshot stays"
        );
        assert_eq!(
            pids(&host, &[&server]).await,
            [pid],
            "the server keeps running as before"
        );
    }

    std::fs::remove_file(registry.path().join("zz-duplicate.toml")).unwrap();
    registry.write(&file, &good);
    host.reload_registry().expect("the fixed registry loads");
    let health = host.registry_health();
    assert!(
        !health.degraded && health.last_reload_error.is_none(),
        "{health:?}"
    );
    assert_eq!((health.reloads, health.failed_reloads), (4, 3));
    assert_eq!(pids(&host, &[&server]).await, [pid]);
    let shown = serde_json::to_value(&health).unwrap();
    assert_eq!(shown["degraded"], false);
    assert!(shown["loaded_at"].as_f64().unwrap() > 0.0, "{shown}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_follows_edits_without_a_reload_call() {
    init_logging();
    let (first, second) = (unique_id("watched"), unique_id("added"));
    let registry = RegistryDir::new();
    registry.fixture(&first, &["*"], "");
    let host = host(&registry);
    let watcher = host.watch_registry().expect("watch");

    // An editor's save: the new text goes to a temporary file renamed over the target, in
    // two writes; a backup file comes and goes.
    let target = registry.path().join(format!("{second}.toml"));
    let temp = registry.path().join(format!(".{second}.toml.tmp"));
    let text = fixture_toml(&second, &["*"], "");
    let (head, tail) = text.split_at(text.len() / 2);
    std::fs::write(&temp, head).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&temp)
            .unwrap();
        f.write_all(tail.as_bytes()).unwrap();
    }
    std::fs::write(registry.path().join(format!("{second}.toml~")), "backup").unwrap();
    std::fs::rename(&temp, &target).unwrap();
    std::fs::remove_file(registry.path().join(format!("{second}.toml~"))).unwrap();
    until("the watcher reloads the new server", || {
        host.registry().get(&second).is_some()
    })
    .await;
    let health = host.registry_health();
    assert_eq!(
        (health.generation, health.failed_reloads),
        (1, 0),
        "{health:?}"
    );
    assert_eq!(pids(&host, &[&second]).await.len(), 1);

    registry.write(&format!("{first}.toml"), "transport = ");
    until("the watcher marks the registry degraded", || {
        host.registry_health().degraded
    })
    .await;
    assert!(
        host.registry().get(&first).is_some(),
        "the old snapshot stays"
    );
    registry.fixture(&first, &["*"], "");
    until("the fix clears degraded", || {
        !host.registry_health().degraded
    })
    .await;

    drop(watcher);
    let reloads = host.registry_health().reloads;
    std::fs::remove_file(&target).unwrap();
    // Nothing may happen now; give a (stopped) watcher more than its debounce to show it.
    tokio::time::sleep(quiver::defaults::REGISTRY_RELOAD_MAX_DELAY).await;
    assert_eq!(
        host.registry_health().reloads,
        reloads,
        "the watcher stopped"
    );
    assert!(host.registry().get(&second).is_some());
    host.shutdown().await;
}

/// The registry changes and changes back while a task on the first snapshot holds its
/// server: a task on the current snapshot gets a server of its own (not the retired one,
/// which stops when the old task is done), and that server keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_changed_back_gives_current_tasks_their_own_server() {
    init_logging();
    let server = unique_id("flip");
    let registry = RegistryDir::new();
    registry.fixture(&server, &["*"], "");
    let host = host(&registry);
    let old_pid = pids(&host, &[&server]).await[0];
    let old_task = start_old_task(&host, &server, &[(&server, "slow", r#"{"ms":5000}"#)]).await;

    registry.fixture(&server, &["*"], "env = { RELOADED = \"1\" }");
    host.reload_registry().expect("reload");
    registry.fixture(&server, &["*"], "");
    host.reload_registry().expect("reload back");
    let new_pid = pids(&host, &[&server]).await[0];
    assert_ne!(new_pid, old_pid, "a current task ran on the retired server");

    let old = old_task.await.unwrap();
    assert!(old.outcome.failure.is_none(), "{:?}", old.outcome.failure);
    assert_eq!(text(&old, 0), "slept 5000ms");
    assert!(
        wait_gone(old_pid, Duration::from_secs(30)),
        "the retired server {old_pid} is still running"
    );
    assert_eq!(
        pids(&host, &[&server]).await,
        [new_pid],
        "the current server outlives the retired one"
    );
    host.shutdown().await;
}

/// A host started on a directory with a broken file is degraded from the start, naming the
/// file, as a reload of the same directory says; fixing the file clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_registry_with_errors_starts_degraded() {
    init_logging();
    let (good, broken) = (unique_id("good"), unique_id("broken"));
    let registry = RegistryDir::new();
    registry.fixture(&good, &["*"], "");
    registry.write(&format!("{broken}.toml"), "server_id = [");
    let host = host(&registry);
    let health = host.registry_health();
    let reason = health.last_reload_error.clone().unwrap_or_default();
    assert!(
        health.degraded && reason.contains(&format!("{broken}.toml")),
        "{health:?}"
    );
    assert!(host.registry().get(&good).is_some());

    host.reload_registry()
        .expect_err("a reload of the same directory is refused");
    let again = host.registry_health();
    assert!(again.degraded, "{again:?}");
    assert_eq!(again.last_reload_error, health.last_reload_error);

    registry.fixture(&broken, &["*"], "");
    host.reload_registry().expect("the fixed registry loads");
    let health = host.registry_health();
    assert!(
        !health.degraded && health.last_reload_error.is_none(),
        "{health:?}"
    );
    assert!(host.registry().get(&broken).is_some());
    host.shutdown().await;
}

/// A store writing the directory (a node's admin API, `quiver registry put`) takes its
/// write lock, `.quiver-write.lock`: events on that file are no edit, so the watcher does
/// not reload for them, and still follows the edits that come after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_does_not_reload_for_the_write_lock_file() {
    init_logging();
    let (first, second) = (unique_id("locked"), unique_id("after-lock"));
    let registry = RegistryDir::new();
    registry.fixture(&first, &["*"], "");
    let host = host(&registry);
    let watcher = host.watch_registry().expect("watch");

    let lock = registry.path().join(".quiver-write.lock");
    for _ in 0..2 {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .unwrap();
        file.lock().unwrap();
        drop(file);
        std::fs::remove_file(&lock).unwrap();
    }
    // Well past the watcher's quiet period (300 ms), so a reload would have run.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let health = host.registry_health();
    assert_eq!((health.reloads, health.generation), (0, 0), "{health:?}");

    registry.fixture(&second, &["*"], "");
    until("the watcher follows the next edit", || {
        host.registry().get(&second).is_some()
    })
    .await;
    drop(watcher);
    host.shutdown().await;
}

/// The registry directory replaced whole (`rm -rf reg && mkdir reg && cp ...`): the watcher
/// reloads the new directory and follows later edits in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_follows_a_replaced_directory() {
    init_logging();
    let (first, second, third) = (
        unique_id("before"),
        unique_id("replaced"),
        unique_id("later"),
    );
    let registry = RegistryDir::new();
    registry.fixture(&first, &["*"], "");
    let host = host(&registry);
    let watcher = host.watch_registry().expect("watch");

    std::fs::remove_dir_all(registry.path()).unwrap();
    std::fs::create_dir(registry.path()).unwrap();
    registry.fixture(&second, &["*"], "");
    until("the watcher reloads the replaced directory", || {
        let now = host.registry();
        now.get(&second).is_some() && now.get(&first).is_none()
    })
    .await;

    registry.fixture(&third, &["*"], "");
    until("the watcher follows an edit in the new directory", || {
        host.registry().get(&third).is_some()
    })
    .await;
    assert!(!host.registry_health().degraded);
    drop(watcher);
    host.shutdown().await;
}
