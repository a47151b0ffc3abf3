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
//! The watch runs on its own thread (reloads read files and are brief) and ends when the
//! [`RegistryWatcher`] is dropped.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread::JoinHandle;
use std::time::Instant;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use super::{Host, HostError};
use crate::defaults;

/// Reloads the host's registry whenever its directory changes, until dropped.
#[must_use = "the registry is watched only while this lives"]
pub struct RegistryWatcher {
    /// Dropped first: that closes the channel and ends the thread.
    watcher: Option<RecommendedWatcher>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RegistryWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryWatcher")
    }
}

impl Drop for RegistryWatcher {
    fn drop(&mut self) {
        drop(self.watcher.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the registry watcher thread panicked");
        }
    }
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
            });
        };
        let watch_error = |e: notify::Error| HostError::RegistryWatch {
            dir: dir.display().to_string(),
            message: e.to_string(),
        };
        let (events, changes) = channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Only the settled state matters; an event's details do not.
                match event {
                    Ok(event) if event.kind.is_access() => {}
                    Ok(_) => {
                        let _ = events.send(());
                    }
                    Err(e) => tracing::warn!(error = %e, "registry watch error"),
                }
            })
            .map_err(watch_error)?;
        watcher
            .watch(Path::new(&dir), RecursiveMode::Recursive)
            .map_err(watch_error)?;
        let host = self.clone();
        let thread = std::thread::Builder::new()
            .name("quiver-registry-watch".into())
            .spawn(move || follow(&host, &changes))
            .map_err(|e| HostError::RegistryWatch {
                dir: dir.display().to_string(),
                message: format!("cannot start the watcher thread: {e}"),
            })?;
        tracing::info!(dir = %dir.display(), "watching the registry for changes");
        Ok(RegistryWatcher {
            watcher: Some(watcher),
            thread: Some(thread),
        })
    }
}

/// Reloads after each settled burst of changes until the channel closes.
fn follow(host: &Host, changes: &Receiver<()>) {
    while changes.recv().is_ok() {
        let first = Instant::now();
        loop {
            let left = defaults::REGISTRY_RELOAD_MAX_DELAY.saturating_sub(first.elapsed());
            match changes.recv_timeout(defaults::REGISTRY_RELOAD_DEBOUNCE.min(left)) {
                Ok(()) if !left.is_zero() => continue,
                Ok(()) | Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        // A refused reload is logged and recorded in the registry's health.
        let _ = host.reload_registry();
    }
}
