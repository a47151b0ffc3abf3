//! Reloading the registry while tasks run: a new snapshot is swapped in whole, or not at all.
//!
//! A registry edit is made by hand, often in several saves; a half-written or mistyped file
//! must not take servers away from running or new tasks. So a reload whose load reports any
//! [`Severity::Error`] (bad TOML, a bad field, a duplicate server id) keeps the snapshot in
//! force and marks the registry degraded with the reasons; the next clean reload clears it.
//! Just before the swap the pool retires the servers that are gone or launch differently
//! (each stopped once no call uses it); the others keep their connection. Tasks keep the snapshot
//! they started with.

use std::error::Error;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::Serialize;

use super::{Host, HostError};
use crate::defaults;
use crate::observe::unix_seconds;
use crate::registry::{Registry, Severity};

/// The registry's state for health checks (`/readyz`, status pages).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegistryHealth {
    /// Where the registry comes from: `dir:PATH`, a store's description
    /// ([`RegistryStore::describe`](crate::registry::RegistryStore::describe)), or
    /// `(in code)`.
    pub source: String,
    /// The revision of the snapshot in force (a digest of its records).
    pub revision: String,
    /// For a host following a store: the store's revision (etcd's revision) of the last
    /// listing taken in force, unchanged ones included; `None` before one, or for a
    /// directory given to the host.
    pub store_revision: Option<u64>,
    /// Snapshots swapped in since the host was built (0: the one it was built with).
    pub generation: u64,
    /// When the snapshot in force was loaded, in Unix seconds.
    #[serde(serialize_with = "unix_seconds")]
    pub loaded_at: SystemTime,
    /// Why the last reload was refused or the store could not be read (or, before any
    /// reload, which files the startup load left out), naming each file and field; `None`
    /// once a reload succeeds.
    pub last_reload_error: Option<String>,
    /// The last reload was refused, the store is unreachable, or the startup load had
    /// errors: the registry in force may lack what the source asks for.
    pub degraded: bool,
    /// Reloads attempted, refused ones included.
    pub reloads: u64,
    pub failed_reloads: u64,
}

/// The reload bookkeeping of a host; its lock also keeps two reloads from interleaving.
pub(super) struct ReloadState(Mutex<RegistryHealth>);

impl ReloadState {
    /// The state of a host built with `registry` from `source`: degraded if its load had
    /// errors, as a reload of the same directory would be refused, or while `waiting` for
    /// a store's first listing.
    pub(super) fn new(registry: &Registry, source: String, waiting: Option<String>) -> Self {
        let errors = waiting.or_else(|| load_errors(registry));
        Self(Mutex::new(RegistryHealth {
            source,
            revision: registry.revision().to_owned(),
            store_revision: None,
            generation: 0,
            loaded_at: SystemTime::now(),
            degraded: errors.is_some(),
            last_reload_error: errors,
            reloads: 0,
            failed_reloads: 0,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, RegistryHealth> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn health(&self) -> RegistryHealth {
        self.lock().clone()
    }
}

/// What a reload changed, by server id.
#[derive(Debug, Default)]
struct Changes {
    added: Vec<String>,
    changed: Vec<String>,
    removed: Vec<String>,
}

impl Changes {
    fn between(old: &Registry, new: &Registry) -> Self {
        let mut changes = Self::default();
        for entry in new.servers() {
            match old.get(entry.server_id()) {
                None => changes.added.push(entry.server_id().to_owned()),
                Some(was) if was.record != entry.record || was.launch != entry.launch => {
                    changes.changed.push(entry.server_id().to_owned())
                }
                Some(_) => {}
            }
        }
        changes.removed = old
            .servers()
            .filter(|e| new.get(e.server_id()).is_none())
            .map(|e| e.server_id().to_owned())
            .collect();
        changes
    }
}

/// The errors of `registry`'s load, the first [`defaults::MAX_RELOAD_ERRORS_SHOWN`] named
/// and the rest counted; `None` if it had none.
fn load_errors(registry: &Registry) -> Option<String> {
    let errors = || {
        registry
            .problems()
            .iter()
            .filter(|p| p.severity == Severity::Error)
    };
    let shown: Vec<String> = errors()
        .take(defaults::MAX_RELOAD_ERRORS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if shown.is_empty() {
        return None;
    }
    let mut reason = shown.join("; ");
    let more = errors().count().saturating_sub(shown.len());
    if more > 0 {
        reason.push_str(&format!("; and {more} more"));
    }
    Some(reason)
}

/// Why a fresh registry could not be read: the text health and logs show, and its cause.
pub(super) struct Unreadable {
    pub(super) reason: String,
    pub(super) cause: Box<dyn Error + Send + Sync>,
}

impl<E: Error + Send + Sync + 'static> From<E> for Unreadable {
    fn from(error: E) -> Self {
        Self {
            reason: error.to_string(),
            cause: error.into(),
        }
    }
}

impl Host {
    /// Reads the registry directory again and swaps the new snapshot in; running tasks
    /// keep the snapshot they started with. A directory that cannot be read, or a load
    /// with any error, keeps the snapshot in force, marks the registry degraded (see
    /// [`Host::registry_health`]) and is [`HostError::RegistryRejected`]. Servers that are
    /// gone or launch differently are stopped once idle; the others keep their connection.
    /// Safe to call from several places at once (a watcher, SIGHUP).
    pub fn reload_registry(&self) -> Result<Arc<Registry>, HostError> {
        let Some(dir) = &self.inner.registry_dir else {
            return Ok(self.registry());
        };
        let env = |name: &str| std::env::var(name).ok();
        let fresh = Registry::load_dir_under(dir, &env, &*self.inner.pool.rules())
            .map_err(Unreadable::from);
        self.install(fresh, None, None)
    }

    /// Swaps `fresh` in, or refuses it (an `Err` is why it could not be read): the one
    /// path every reload and store sync takes. `source` replaces the health's source;
    /// `store_revision` is the store revision `fresh` was listed at.
    pub(super) fn install(
        &self,
        fresh: Result<Registry, Unreadable>,
        source: Option<&str>,
        store_revision: Option<u64>,
    ) -> Result<Arc<Registry>, HostError> {
        let mut health = self.inner.reload.lock();
        if let Some(source) = source {
            source.clone_into(&mut health.source);
        }
        health.reloads = health.reloads.saturating_add(1);
        let refused = |health: &mut RegistryHealth,
                       reason: String,
                       source: Option<Box<dyn Error + Send + Sync>>| {
            health.failed_reloads = health.failed_reloads.saturating_add(1);
            health.degraded = true;
            // A store that stays away is retried every second: say so once, not each time.
            if health.last_reload_error.as_ref() == Some(&reason) {
                tracing::debug!(source = %health.source, "registry reload refused again: {reason}");
            } else {
                tracing::error!(
                    kept_revision = %health.revision,
                    source = %health.source,
                    "registry reload refused; the previous snapshot stays in force: {reason}"
                );
            }
            health.last_reload_error = Some(reason.clone());
            HostError::RegistryRejected {
                kept_revision: health.revision.clone(),
                reason,
                source,
            }
        };
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(Unreadable { reason, cause }) => {
                return Err(refused(&mut health, reason, Some(cause)));
            }
        };
        if let Some(reason) = load_errors(&fresh) {
            return Err(refused(&mut health, reason, None));
        }
        let old = self.registry();
        if health.degraded {
            tracing::info!(
                revision = fresh.revision(),
                "registry reload succeeds again"
            );
        }
        health.degraded = false;
        health.last_reload_error = None;
        health.store_revision = store_revision;
        if fresh.revision() == old.revision() {
            tracing::debug!(revision = fresh.revision(), "registry unchanged");
            return Ok(old);
        }
        for problem in fresh.problems() {
            tracing::warn!("registry: {problem}");
        }
        let fresh = Arc::new(fresh);
        // The pool first: a task that starts before the swap is on the old snapshot, which
        // the pool then knows to be outdated; one that starts after finds the pool ready.
        let stopping = self.inner.pool.apply_registry(&fresh);
        *self
            .inner
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        self.inner.metrics.registry_loaded(fresh.revision());
        let changes = Changes::between(&old, &fresh);
        health.revision = fresh.revision().to_owned();
        health.generation = health.generation.saturating_add(1);
        health.loaded_at = SystemTime::now();
        tracing::info!(
            revision = fresh.revision(),
            generation = health.generation,
            added = ?changes.added,
            changed = ?changes.changed,
            removed = ?changes.removed,
            stopping = ?stopping,
            "registry reloaded"
        );
        Ok(fresh)
    }

    /// The registry's revision, reload counts and whether the last reload was refused.
    pub fn registry_health(&self) -> RegistryHealth {
        self.inner.reload.health()
    }
}
