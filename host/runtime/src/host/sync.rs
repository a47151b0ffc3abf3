//! Following a registry store: list, build a snapshot, swap it in, watch from that
//! revision, and list again on any change.
//!
//! Every change, whatever it is, is answered with a fresh full listing rather than by
//! patching the snapshot with the event: a listing is one consistent revision of the
//! whole store, so cross-document rules (duplicate ids, shared namespaces, profiles
//! naming servers) are checked exactly as at startup, and a missed or reordered event
//! cannot leave the node on a state the store never had. Registries are small; the cost
//! is one listing per burst of changes.
//!
//! A watch that breaks or finds its revision compacted, and the poll
//! ([`defaults::REGISTRY_POLL_INTERVAL`], jittered) that covers a watch which silently
//! stopped, both lead to the same full listing. When the store cannot be listed the node
//! keeps serving its last snapshot and its [`RegistryHealth`](super::RegistryHealth) says
//! degraded with the reason, retrying every [`defaults::REGISTRY_STORE_RETRY`]; the next
//! listing that works clears it. Snapshots go through [`Host::install`], the path of every
//! reload: the pool retires changed and removed servers and metrics see the revision.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, watch};

use super::reload::Unreadable;
use super::{Host, HostError};
use crate::defaults;
use crate::registry::{DirStore, Registry, RegistryStore, StoreError};

/// Keeps a host following a store until dropped.
#[must_use = "the store is followed only while this lives"]
pub struct StoreFollower {
    task: tokio::task::JoinHandle<()>,
    resync: Arc<Notify>,
    synced: watch::Receiver<u64>,
}

impl std::fmt::Debug for StoreFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreFollower")
    }
}

impl Drop for StoreFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StoreFollower {
    /// Lists the store again now (SIGHUP), without waiting for a change or the poll.
    pub fn resync(&self) {
        self.resync.notify_one();
    }

    /// Waits until a listing has been read (and its snapshot swapped in or refused), at
    /// most `timeout`; whether one was. A host whose store is unreachable still serves,
    /// degraded, after this returns `false`.
    pub async fn first_sync(&self, timeout: Duration) -> bool {
        let mut synced = self.synced.clone();
        tokio::time::timeout(timeout, synced.wait_for(|n| *n > 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Host {
    /// Follows `store` from now on: its first listing replaces the snapshot, then every
    /// change in it does (docs/registry.md: watch, full resync, poll, degraded while
    /// unreachable); until the follower is dropped.
    /// Needs a Tokio runtime.
    pub fn follow_store(&self, store: Arc<dyn RegistryStore>) -> Result<StoreFollower, HostError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|e| HostError::RegistryWatch {
                dir: store.describe(),
                message: "following a store needs a Tokio runtime".into(),
                source: Some(e.into()),
            })?;
        let resync = Arc::new(Notify::new());
        let (synced_tx, synced) = watch::channel(0);
        let task = runtime.spawn(follow(
            self.clone(),
            store.clone(),
            resync.clone(),
            synced_tx,
        ));
        tracing::info!(store = %store.describe(), "following the registry store");
        Ok(StoreFollower {
            task,
            resync,
            synced,
        })
    }

    /// Where registry writes go: the store the host follows, or else its registry
    /// directory as a [`DirStore`]; `None` for a registry given in memory.
    pub fn writable_store(&self) -> Option<Arc<dyn RegistryStore>> {
        if let Some(store) = self.registry_store() {
            return Some(store);
        }
        let dir = self.inner.registry_dir.clone()?;
        Some(Arc::new(DirStore::new(dir)))
    }

    /// Brings the snapshot up to `store` now, after a write to it, so the next request
    /// sees the write without waiting for a watch or the poll. Reading files and building
    /// the registry run off the async workers.
    pub async fn sync_after_write(&self, store: &dyn RegistryStore) {
        if self.registry_store().is_some() {
            let _ = self.sync_from(store, &store.describe()).await;
        } else {
            let host = self.clone();
            // A refused reload is recorded in the registry health.
            let _ = tokio::task::spawn_blocking(move || host.reload_registry()).await;
        }
    }

    /// Lists `store` and installs the snapshot (or records why not); the revision listed.
    /// Listings are installed in the order they were taken: the next one starts only after
    /// this one is in.
    async fn sync_from(&self, store: &dyn RegistryStore, source: &str) -> Option<u64> {
        let _in_order = self.inner.store_sync.lock().await;
        let listed = tokio::time::timeout(defaults::REGISTRY_STORE_TIMEOUT, store.list())
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unreachable {
                    source: None,
                    store: source.to_owned(),
                    message: format!(
                        "no answer to a listing within {:?}",
                        defaults::REGISTRY_STORE_TIMEOUT
                    ),
                })
            });
        match listed {
            Ok(listing) => {
                let revision = listing.revision;
                let named = source.to_owned();
                let rules = self.inner.pool.rules();
                // Building a registry of up to REGISTRY_STORE_MAX_DOCS documents is CPU work.
                let fresh = tokio::task::spawn_blocking(move || {
                    let env = |name: &str| std::env::var(name).ok();
                    Registry::from_docs_under(listing.docs, &named, &env, &*rules)
                })
                .await
                .map_err(|e| Unreadable {
                    reason: format!("building the registry failed: {e}"),
                    cause: e.into(),
                });
                // A refused snapshot is logged and recorded in the health.
                let _ = self.install(fresh, Some(source), Some(revision));
                Some(revision)
            }
            Err(e) => {
                let _ = self.install(Err(e.into()), Some(source), None);
                None
            }
        }
    }
}

/// A poll interval moved by up to [`defaults::REGISTRY_POLL_JITTER_PERCENT`] either way.
fn jittered(interval: Duration) -> Duration {
    let span = u64::from(defaults::REGISTRY_POLL_JITTER_PERCENT.min(100)) * 2 + 1;
    // A fresh RandomState is seeded randomly: enough randomness for spreading polls.
    let roll = RandomState::new().hash_one(std::time::SystemTime::now()) % span;
    let percent = 100 - u64::from(defaults::REGISTRY_POLL_JITTER_PERCENT.min(100)) + roll;
    let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(millis / 100 * percent)
}

/// Waits `delay`, or less if a resync is asked for.
async fn pause(delay: Duration, resync: &Notify) {
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        () = resync.notified() => {}
    }
}

async fn follow(
    host: Host,
    store: Arc<dyn RegistryStore>,
    resync: Arc<Notify>,
    synced: watch::Sender<u64>,
) {
    let source = store.describe();
    loop {
        let listed = host.sync_from(&*store, &source).await;
        if listed.is_some() {
            synced.send_modify(|n| *n = n.saturating_add(1));
        }
        let Some(since) = listed else {
            pause(defaults::REGISTRY_STORE_RETRY, &resync).await;
            continue;
        };
        let poll = jittered(defaults::REGISTRY_POLL_INTERVAL);
        let opened =
            tokio::time::timeout(defaults::REGISTRY_STORE_TIMEOUT, store.watch(since)).await;
        let mut events = match opened {
            Ok(Ok(events)) => events,
            Ok(Err(e)) => {
                tracing::warn!(store = %source, error = %e, "cannot watch the registry store; listing again");
                pause(defaults::REGISTRY_STORE_RETRY, &resync).await;
                continue;
            }
            Err(_) => {
                tracing::warn!(store = %source, "opening a watch timed out; listing again");
                pause(defaults::REGISTRY_STORE_RETRY, &resync).await;
                continue;
            }
        };
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => tracing::debug!(store = %source, ?event, "registry store changed"),
                Some(Err(e)) => {
                    tracing::warn!(store = %source, error = %e, "the registry watch broke; listing again");
                    pause(defaults::REGISTRY_STORE_RETRY, &resync).await;
                }
                None => {
                    tracing::warn!(store = %source, "the registry watch ended; listing again");
                    pause(defaults::REGISTRY_STORE_RETRY, &resync).await;
                }
            },
            () = tokio::time::sleep(poll) => tracing::debug!(store = %source, "polling the registry store"),
            () = resync.notified() => tracing::info!(store = %source, "resync asked for"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::stream::BoxStream;

    use super::*;
    use crate::registry::{DocFormat, DocKind, Listing, StoreEvent, StoreFuture, StoredDoc, Write};

    /// A store whose first listing is slow and old, and whose later ones are quick and new:
    /// a write's resync racing an earlier, slower listing.
    #[derive(Debug, Default)]
    struct RacingStore {
        lists: AtomicUsize,
    }

    fn server(id: &str) -> StoredDoc {
        StoredDoc {
            kind: DocKind::Server,
            name: id.into(),
            format: DocFormat::Toml,
            body: format!(
                "server_id = \"{id}\"\ntransport = \"stdio\"\nstdio = {{ command = \"x\" }}\n"
            )
            .into_bytes(),
            revision: 1,
            updated_at: None,
        }
    }

    impl RegistryStore for RacingStore {
        fn describe(&self) -> String {
            "racing".into()
        }
        fn list(&self) -> StoreFuture<'_, Listing> {
            let first = self.lists.fetch_add(1, Ordering::SeqCst) == 0;
            Box::pin(async move {
                if first {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    return Ok(Listing {
                        revision: 1,
                        docs: vec![server("a")],
                    });
                }
                Ok(Listing {
                    revision: 2,
                    docs: vec![server("a"), server("b")],
                })
            })
        }
        fn get(&self, _: DocKind, _: &str) -> StoreFuture<'_, Option<StoredDoc>> {
            Box::pin(async { Ok(None) })
        }
        fn upsert(&self, _: DocKind, _: &str, _: DocFormat, _: Vec<u8>) -> StoreFuture<'_, u64> {
            Box::pin(async { Ok(2) })
        }
        fn apply(&self, _: Vec<Write>, _: u64) -> StoreFuture<'_, u64> {
            Box::pin(async { Ok(2) })
        }
        fn delete(&self, _: DocKind, _: &str) -> StoreFuture<'_, Option<u64>> {
            Box::pin(async { Ok(None) })
        }
        fn watch(
            &self,
            _: u64,
        ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>> {
            Box::pin(async { Ok(futures::stream::pending().boxed()) })
        }
    }

    #[tokio::test]
    async fn a_slow_old_listing_is_never_installed_over_a_newer_one() {
        let store: Arc<dyn RegistryStore> = Arc::new(RacingStore::default());
        // Its records are stdio ones, which a store-following host runs only when told.
        let host = Host::builder()
            .with_registry_store(store.clone())
            .with_launch_rules(crate::LaunchRules::unrestricted())
            .build()
            .unwrap();
        let slow = tokio::spawn({
            let (host, store) = (host.clone(), store.clone());
            async move { host.sync_after_write(&*store).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        host.sync_after_write(&*store).await;
        slow.await.unwrap();
        assert!(
            host.registry().get("b").is_some(),
            "the newer listing (revision 2) must be the one in force"
        );
        assert_eq!(host.registry_health().store_revision, Some(2));
    }

    #[test]
    fn the_poll_interval_stays_within_its_jitter() {
        let base = Duration::from_secs(30);
        for _ in 0..200 {
            let d = jittered(base);
            assert!(
                d >= Duration::from_secs(24) && d <= Duration::from_secs(36),
                "{d:?}"
            );
        }
    }
}
