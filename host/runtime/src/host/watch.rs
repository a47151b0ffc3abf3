//! Watching the registry directory: a change reloads it, once the edit has settled.
//!
//! Editors save in several steps (write a temporary file, rename it over the old one,
//! delete a backup), and tools copy directories file by file. Reloading on the first event
//! would see half an edit; so events only start a quiet period
//! ([`defaults::REGISTRY_RELOAD_DEBOUNCE`]) that every further event restarts, and the
//! reload runs when it ends (at the latest [`defaults::REGISTRY_RELOAD_MAX_DELAY`] after
//! the first event, so a directory that never stops changing is still followed). A reload
//! of a broken edit keeps the old snapshot ([`super::reload`]), so even a reload in the
//! middle of an edit does no harm; the next event reloads again.
//!
//! The directory itself may be replaced (`rm -rf reg && cp -r new reg`, a deploy that
//! renames a fresh copy into place); its watch dies with it. So the parent directory is
//! watched too, for the registry directory's own entry only, and any event on that entry
//! re-arms the watch on whatever directory now has the path. If the watch ends on its own
//! (notify's thread died), that is logged as an error: the registry is no longer followed.
//!
//! The watch runs on its own thread (reloads read files and are brief) and ends when the
//! [`RegistryWatcher`] is dropped.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use super::{Host, HostError};
use crate::defaults;
use crate::registry::DirStore;

/// The notify watcher, shared with the thread that re-arms it; `None` once stopped.
type Shared = Mutex<Option<RecommendedWatcher>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Option<RecommendedWatcher>> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reloads the host's registry whenever its directory changes, until dropped.
#[must_use = "the registry is watched only while this lives"]
pub struct RegistryWatcher {
    /// Taken and dropped first: that closes the channel and ends the thread.
    watcher: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RegistryWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryWatcher")
    }
}

impl Drop for RegistryWatcher {
    fn drop(&mut self) {
        drop(lock(&self.watcher).take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the registry watcher thread panicked");
        }
    }
}

/// What an event means for the watch.
enum Signal {
    /// Something under the registry directory changed.
    Changed,
    /// The registry directory's own entry changed (removed, created, renamed over): its
    /// watch must be set up again.
    Replaced,
}

impl Host {
    /// Watches the registry directory and reloads it on every settled change (see
    /// [`Host::reload_registry`]), logging each reload, until the watcher is dropped.
    /// A host built without a registry directory has nothing to watch.
    pub fn watch_registry(&self) -> Result<RegistryWatcher, HostError> {
        let Some(dir) = self.inner.registry_dir.clone() else {
            return Err(HostError::RegistryWatch {
                dir: "(none)".into(),
                message: "the host has no registry directory (HostBuilder::with_registry_dir)"
                    .into(),
                source: None,
            });
        };
        let watch_error = |message: &str, source: Box<dyn std::error::Error + Send + Sync>| {
            HostError::RegistryWatch {
                dir: dir.display().to_string(),
                message: message.to_owned(),
                source: Some(source),
            }
        };
        // Absolute, so the parent is known and event paths compare equal.
        let root =
            std::fs::canonicalize(&dir).map_err(|e| watch_error("cannot resolve it", e.into()))?;
        let (events, signals) = channel();
        let watched = root.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Only the settled state matters; an event's details do not.
                match event {
                    // Taking the write lock of a store writing the directory changes no
                    // record.
                    Ok(event) if !DirStore::is_registry_event(&event) => {}
                    Ok(event) => {
                        let signal = if event.paths.contains(&watched) {
                            Signal::Replaced
                        } else if event.need_rescan()
                            || event.paths.iter().any(|p| p.starts_with(&watched))
                        {
                            Signal::Changed
                        } else {
                            // Another entry of the parent directory.
                            return;
                        };
                        let _ = events.send(signal);
                    }
                    Err(e) => tracing::warn!(error = %e, "registry watch error"),
                }
            })
            .map_err(|e| watch_error("cannot start a watcher", e.into()))?;
        watcher
            .watch(&root, RecursiveMode::Recursive)
            .map_err(|e| watch_error("cannot watch it", e.into()))?;
        if let Some(parent) = root.parent() {
            watcher
                .watch(parent, RecursiveMode::NonRecursive)
                .map_err(|e| watch_error("cannot watch its parent directory", e.into()))?;
        }
        let watcher = Arc::new(Mutex::new(Some(watcher)));
        let host = self.clone();
        let shared = Arc::downgrade(&watcher);
        let thread = std::thread::Builder::new()
            .name("quiver-registry-watch".into())
            .spawn(move || follow(&host, &signals, &Rearm { shared, root }))
            .map_err(|e| watch_error("cannot start the watcher thread", e.into()))?;
        tracing::info!(dir = %dir.display(), "watching the registry for changes");
        Ok(RegistryWatcher {
            watcher,
            thread: Some(thread),
        })
    }
}

/// What the thread needs to set the watch up again.
struct Rearm {
    shared: Weak<Shared>,
    root: PathBuf,
}

impl Rearm {
    /// Watches whatever directory has the registry's path now. One that is not there yet
    /// is watched when its entry appears (the parent's event).
    fn rearm(&self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut watcher = lock(&shared);
        let Some(watcher) = watcher.as_mut() else {
            return;
        };
        // The old directory's watch may be gone already.
        let _ = watcher.unwatch(&self.root);
        match watcher.watch(&self.root, RecursiveMode::Recursive) {
            Ok(()) => {
                tracing::info!(dir = %self.root.display(), "the registry directory was replaced; watching the new one")
            }
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), error = %e, "the registry directory is gone; watching for it to come back")
            }
        }
    }

    /// Whether the watch was stopped on purpose (the [`RegistryWatcher`] dropped).
    fn stopped(&self) -> bool {
        self.shared
            .upgrade()
            .is_none_or(|shared| lock(&shared).is_none())
    }

    fn on(&self, signal: &Signal) {
        if let Signal::Replaced = signal {
            self.rearm();
        }
    }
}

/// Reloads after each settled burst of changes until the channel closes.
fn follow(host: &Host, signals: &Receiver<Signal>, rearm: &Rearm) {
    'bursts: while let Ok(signal) = signals.recv() {
        rearm.on(&signal);
        let first = Instant::now();
        loop {
            let left = defaults::REGISTRY_RELOAD_MAX_DELAY.saturating_sub(first.elapsed());
            match signals.recv_timeout(defaults::REGISTRY_RELOAD_DEBOUNCE.min(left)) {
                Ok(signal) => {
                    rearm.on(&signal);
                    if left.is_zero() {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break 'bursts,
            }
        }
        // A refused reload is logged and recorded in the registry's health.
        let _ = host.reload_registry();
    }
    if !rearm.stopped() {
        tracing::error!(
            dir = %rearm.root.display(),
            "the registry watch ended on its own; registry changes are no longer followed (reload by hand or restart)"
        );
    }
}
