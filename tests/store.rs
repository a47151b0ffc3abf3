//! A host following a registry store (issue 11): changes made through the store API reach
//! tasks, deletes stop servers, invalid writes are refused with nothing written, and a
//! store that stops answering leaves the last snapshot serving, degraded with the reason,
//! until it answers again. Real files, real fixture servers, real WAT guests.
//!
//! Nothing waits a fixed time for something to happen: every wait polls for the state it
//! needs, with a generous bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use quiver::registry::{
    DirStore, DocFormat, DocKind, Listing, RegistryStore, StoreError, StoreEvent, StoreFuture,
    StoredDoc, Write,
};
use quiver::{Host, StoreFollower};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{
    RegistryDir, fixture_rules, fixture_toml, host_builder, init_logging, mcp_task, unique_id,
    until, wait_gone,
};
use serde_json::Value;

/// A host following `store`, after its first listing.
async fn following(registry: &RegistryDir, store: Arc<dyn RegistryStore>) -> (Host, StoreFollower) {
    init_logging();
    // The test writes the store itself, so it allows the fixture binaries it records.
    let host = host_builder(registry)
        .with_registry_store(store.clone())
        .with_launch_rules(fixture_rules())
        .build()
        .expect("host");
    assert_eq!(host.registry_health().source, store.describe());
    let follower = host.follow_store(store).expect("follow");
    assert!(
        follower.first_sync(Duration::from_secs(30)).await,
        "no first listing"
    );
    (host, follower)
}

/// Calls `server`'s `pid` tool in one task; the server's process id.
async fn pid_of(host: &Host, server: &str) -> u32 {
    let run: WatRun = wat::run_ok(
        host,
        &wat::mcp_calls(&[(server, "pid", "{}")], 1),
        &mcp_task("pid", &[server]),
    )
    .await;
    assert!(
        run.results.iter().all(|&r| r >= 0),
        "{:?} {:?}",
        run.results,
        run.emitted
    );
    let result: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    result["content"][0]["text"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_and_deletes_through_the_store_reach_tasks_and_stop_servers() {
    let registry = RegistryDir::new();
    let store = Arc::new(DirStore::new(registry.path()));
    let (host, _follower) = following(&registry, store.clone()).await;
    let server = unique_id("stored");
    assert!(host.registry().get(&server).is_none());

    store
        .upsert(
            DocKind::Server,
            &server,
            DocFormat::Toml,
            fixture_toml(&server, &["*"], "").into_bytes(),
        )
        .await
        .expect("upsert");
    until("the follower picks the upsert up", || {
        host.registry().get(&server).is_some()
    })
    .await;
    let pid = pid_of(&host, &server).await;
    assert!(
        !host.registry_health().degraded,
        "{:?}",
        host.registry_health()
    );

    // Invalid: refused naming the field, nothing written, the snapshot unchanged.
    let other = unique_id("invalid");
    let bad = fixture_toml(&other, &["*"], "")
        .replace("allowed_tools = [\"*\"]", "allowed_tools = [\" \"]");
    let err = store
        .upsert(DocKind::Server, &other, DocFormat::Toml, bad.into_bytes())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(m) if m.contains("allowed_tools[0]") && m.contains("remove it")),
        "{err:?}"
    );
    assert!(!registry.path().join(format!("{other}.toml")).exists());
    assert!(store.get(DocKind::Server, &other).await.unwrap().is_none());

    let revision = host.registry().revision().to_owned();
    store
        .delete(DocKind::Server, &server)
        .await
        .expect("delete")
        .expect("was there");
    until("the follower drops the deleted server", || {
        host.registry().get(&server).is_none()
    })
    .await;
    assert_ne!(host.registry().revision(), revision);
    assert!(
        wait_gone(pid, Duration::from_secs(30)),
        "the deleted server's process {pid} still runs"
    );
    // A task asking for it now is not offered it: the registry has no such server.
    let report = host
        .explain_policy(&mcp_task("gone", &[&server]))
        .await
        .expect("report");
    assert!(report.offered.is_empty(), "{report:?}");
    assert!(
        report
            .decisions
            .iter()
            .any(|d| d.server_id == server && d.detail.contains("no such server")),
        "{report:?}"
    );
    host.shutdown().await;
}

/// A store that answers like its directory until told to fail, then is unreachable.
#[derive(Debug)]
struct Flaky {
    inner: DirStore,
    failing: AtomicBool,
}

impl Flaky {
    fn check(&self) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unreachable {
                store: self.describe(),
                message: "connection refused (test)".into(),
                source: None,
            });
        }
        Ok(())
    }
}

impl RegistryStore for Flaky {
    fn describe(&self) -> String {
        "flaky://test".into()
    }

    fn list(&self) -> StoreFuture<'_, Listing> {
        Box::pin(async move {
            self.check()?;
            self.inner.list().await
        })
    }

    fn get(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<StoredDoc>> {
        self.inner.get(kind, name)
    }

    fn upsert(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> StoreFuture<'_, u64> {
        self.inner.upsert(kind, name, format, body)
    }

    fn apply(&self, writes: Vec<Write>, listed_at: u64) -> StoreFuture<'_, u64> {
        self.inner.apply(writes, listed_at)
    }

    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>> {
        self.inner.delete(kind, name)
    }

    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>> {
        Box::pin(async move {
            self.check()?;
            self.inner.watch(since).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_keeps_the_last_snapshot_serving_degraded_until_it_answers() {
    let registry = RegistryDir::new();
    let server = unique_id("kept");
    registry.fixture(&server, &["*"], "");
    let flaky = Arc::new(Flaky {
        inner: DirStore::new(registry.path()),
        failing: AtomicBool::new(false),
    });
    let (host, follower) = following(&registry, flaky.clone()).await;
    let health = host.registry_health();
    assert!(
        !health.degraded && health.last_reload_error.is_none(),
        "{health:?}"
    );
    let revision = health.revision.clone();

    flaky.failing.store(true, Ordering::SeqCst);
    follower.resync();
    until("the follower reports the store unreachable", || {
        host.registry_health().degraded
    })
    .await;
    let health = host.registry_health();
    let reason = health.last_reload_error.clone().unwrap_or_default();
    assert!(
        reason.contains("flaky://test") && reason.contains("connection refused"),
        "{health:?}"
    );
    assert_eq!(
        (health.source.as_str(), health.revision.as_str()),
        ("flaky://test", revision.as_str())
    );
    // The last snapshot still serves tasks.
    pid_of(&host, &server).await;

    flaky.failing.store(false, Ordering::SeqCst);
    until("the follower recovers", || !host.registry_health().degraded).await;
    let health = host.registry_health();
    assert!(health.last_reload_error.is_none(), "{health:?}");
    assert_eq!(
        health.revision, revision,
        "nothing changed in the store meanwhile"
    );
    drop(follower);
    host.shutdown().await;
}
