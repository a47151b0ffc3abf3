//! [`DirStore`]: a registry directory behind the [`RegistryStore`] trait, the embedded
//! default.
//!
//! The files stay the source of truth: a person may edit them by hand while the store
//! writes them, so every call reads the directory again. A directory has no revision of
//! its own, so the store keeps one: a number that moves forward whenever a listing's
//! content hash differs from the previous one. It starts at the clock (Unix milliseconds,
//! or the newest modification time in the directory if that is later) and then moves to
//! the clock again, or by 1 if that is not more. So it only grows, also across restarts:
//! an `If-Match` revision read before a restart, or from another process's store over the
//! same directory, does not come back and match different content. Each store counts on
//! its own, so revisions of two stores are not comparable. Documents carry the revision
//! of the listing they were read in (a directory does not say which file changed when).
//!
//! Writes are checked with the same parser as a load (nothing invalid is written), then
//! land atomically: a temporary file in the same directory (ignored by loads: hidden,
//! `.tmp`) renamed over `<name>.toml|json`, so a reader sees the old file or the new one,
//! never half of one. The check and the write hold the directory's write lock
//! ([`WRITE_LOCK_FILE`], an advisory `flock` that every writing node and `quiver registry`
//! command takes), so no other store writes between them; hand edits do not take it. A
//! checked write ([`RegistryStore::apply`]) also compares the revision under that lock;
//! its files land one by one (a directory has no transaction), so an error part-way names
//! what was written. The watch is notify on the directory; if the directory itself is
//! replaced its watch dies and the follower's poll picks the change up.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};

use super::{
    DocFormat, DocKind, Listing, RegistryStore, StoreError, StoreEvent, StoreFuture, StoredDoc,
    Write, check_change, check_changes,
};
use crate::Cause;
use crate::defaults;
use crate::registry::load::{FileDoc, read_dir_docs};

/// The write lock's file in a registry directory. Hidden, so loads skip it, and watches
/// ignore its events: taking the lock changes no record.
const WRITE_LOCK_FILE: &str = ".quiver-write.lock";

/// A registry directory as a store. Cheap to clone (clones share the revision).
#[derive(Clone, Debug)]
pub struct DirStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// The last listing's content hash and the revision it was given.
    seen: Mutex<([u8; 32], u64)>,
    /// This process's writes queue here first, so only one at a time polls the
    /// cross-process write lock.
    writes: tokio::sync::Mutex<()>,
    /// Longest a write waits for another process's write lock.
    lock_wait: Duration,
    /// Names temporary files apart.
    temp_seq: AtomicU64,
}

impl DirStore {
    /// A store over `dir`, which must exist (it is not created: a mistyped path should
    /// fail, not start an empty registry).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: dir.into(),
                seen: Mutex::new(([0; 32], 0)),
                writes: tokio::sync::Mutex::new(()),
                lock_wait: defaults::REGISTRY_DIR_LOCK_WAIT,
                temp_seq: AtomicU64::new(0),
            }),
        }
    }

    /// A fresh store over the same directory whose writes wait at most `wait` for the
    /// write lock.
    #[cfg(test)]
    #[must_use]
    fn with_lock_wait(self, wait: Duration) -> Self {
        let mut store = Self::new(self.inner.dir.clone());
        Arc::get_mut(&mut store.inner)
            .expect("a new store is not shared yet")
            .lock_wait = wait;
        store
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Sends on `signal` whenever the directory may have changed: on each file event with
    /// the `watch` feature, else every [`defaults::REGISTRY_DIR_POLL_INTERVAL`]. Wake-ups
    /// stop when the returned guard is dropped.
    #[cfg(feature = "watch")]
    fn wake_on_changes(
        &self,
        signal: tokio::sync::mpsc::Sender<()>,
    ) -> Result<impl Send + 'static, StoreError> {
        use notify::{RecursiveMode, Watcher};
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok_and(|e| Self::is_registry_event(&e)) {
                    // A full channel already holds a wake-up: that one covers this.
                    let _ = signal.try_send(());
                }
            })
            .map_err(|e| self.inner.failed("cannot watch: ", e))?;
        watcher
            .watch(&self.inner.dir, RecursiveMode::Recursive)
            .map_err(|e| self.inner.failed("cannot watch: ", e))?;
        Ok(watcher)
    }

    #[cfg(not(feature = "watch"))]
    fn wake_on_changes(
        &self,
        signal: tokio::sync::mpsc::Sender<()>,
    ) -> Result<impl Send + 'static, StoreError> {
        /// Stops the polling task with the watch.
        struct Polling(tokio::task::JoinHandle<()>);
        impl Drop for Polling {
            fn drop(&mut self) {
                self.0.abort();
            }
        }
        Ok(Polling(tokio::spawn(async move {
            let mut tick = tokio::time::interval(defaults::REGISTRY_DIR_POLL_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                // A full channel already holds a wake-up: that one covers this.
                let _ = signal.try_send(());
            }
        })))
    }

    /// Whether a watch event on a registry directory can change what it holds: one only
    /// about the write lock's file (created by the first write, opened by each) cannot.
    #[cfg(feature = "watch")]
    pub(crate) fn is_registry_event(event: &notify::Event) -> bool {
        // The write lock, and user grants (refreshed tokens), change no record.
        let not_records = !event.paths.is_empty()
            && event.paths.iter().all(|p| {
                p.file_name().is_some_and(|n| n == WRITE_LOCK_FILE)
                    || p.components()
                        .any(|c| c.as_os_str() == crate::registry::REGISTRY_GRANTS_DIR)
            });
        !event.kind.is_access() && !not_records
    }

    /// Checks and writes one document under the write lock; with `expected`, only while
    /// the listing is still at that revision.
    async fn put(
        &self,
        kind: DocKind,
        name: String,
        format: DocFormat,
        body: Vec<u8>,
        expected: Option<u64>,
    ) -> Result<u64, StoreError> {
        let _queued = self.inner.writes.lock().await;
        blocking(&self.inner, move |inner| {
            let _locked = inner.write_lock()?;
            let current = inner.list()?;
            if let Some(expected) = expected {
                let at = current
                    .docs
                    .iter()
                    .find(|d| d.kind == kind && d.name == name)
                    .map_or(0, |d| d.revision);
                if at != expected {
                    return Err(StoreError::Conflict {
                        kind,
                        name,
                        current: at,
                    });
                }
            }
            check_change(
                &current.docs,
                &inner.describe(),
                kind,
                &name,
                Some((format, &body)),
            )?;
            inner.write_doc(kind, &name, format, &body)?;
            Ok(inner.list()?.revision)
        })
        .await
    }

    /// [`RegistryStore::apply`]: under the write lock, the listing must still be at
    /// `listed_at` (the revision moves with any change of content, hand edits included);
    /// the set is checked again, then written file by file.
    async fn apply_writes(&self, writes: Vec<Write>, listed_at: u64) -> Result<u64, StoreError> {
        let _one_writer = self.inner.writes.lock().await;
        blocking(&self.inner, move |inner| {
            let _locked = inner.write_lock()?;
            let current = inner.list()?;
            if current.revision != listed_at {
                return Err(StoreError::Changed {
                    store: inner.describe(),
                });
            }
            check_changes(&current.docs, &inner.describe(), &writes)?;
            let (puts, deletes): (Vec<_>, Vec<_>) =
                writes.iter().partition(|w| matches!(w, Write::Put(_)));
            let mut done: Vec<String> = Vec::new();
            for write in puts.into_iter().chain(deletes) {
                let written = match write {
                    Write::Put(doc) => inner.write_doc(doc.kind, &doc.name, doc.format, &doc.body),
                    Write::Delete { kind, name } => inner
                        .remove(*kind, name)
                        .map(|_| ())
                        .map_err(|e| inner.failed("", e)),
                };
                if let Err(error) = written {
                    return Err(partly_written(error, &done));
                }
                let (kind, name) = write.key();
                done.push(format!("{}/{name}", kind_dir(kind)));
            }
            Ok(inner.list()?.revision)
        })
        .await
    }
}

/// `error` for a write that failed after `done` were written: the message names them, so
/// an operator knows what landed (a directory has no transaction to undo them).
fn partly_written(error: StoreError, done: &[String]) -> StoreError {
    if done.is_empty() {
        return error;
    }
    let written = format!("; written before the failure: {}", done.join(", "));
    error.map_message(|message| message + &written)
}

fn kind_dir(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "servers",
        DocKind::Profile => "profiles",
    }
}

impl Inner {
    fn seen(&self) -> MutexGuard<'_, ([u8; 32], u64)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn describe(&self) -> String {
        format!("dir:{}", self.dir.display())
    }

    fn unreachable(&self, message: String) -> StoreError {
        StoreError::Unreachable {
            store: self.describe(),
            message,
            source: None,
        }
    }

    /// [`Inner::unreachable`] for a typed failure: `context`, then `error`, kept as source.
    fn failed(
        &self,
        context: &str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Unreachable {
            store: self.describe(),
            message: format!("{context}{error}"),
            source: Some(Cause::new(error)),
        }
    }

    /// Takes the directory's write lock, waiting up to `lock_wait` for another process to
    /// let go; held until the file is dropped. The kernel releases it if the holder dies,
    /// so a leftover lock file never blocks anyone.
    fn write_lock(&self) -> Result<std::fs::File, StoreError> {
        let path = self.dir.join(WRITE_LOCK_FILE);
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path).map_err(|e| {
            self.unreachable(format!(
                "cannot open the write lock {}: {e}; the directory must be writable by this user",
                path.display()
            ))
        })?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(self.unreachable(format!(
                        "cannot lock {}: {e}; the filesystem must support file locks",
                        path.display()
                    )));
                }
            }
            if started.elapsed() >= self.lock_wait {
                return Err(self.unreachable(format!(
                    "another writer (a node or `quiver registry` on this directory) held the \
                     write lock {} for over {:?}; try again, and if it stays held, look for a \
                     stuck process that has the file open",
                    path.display(),
                    self.lock_wait
                )));
            }
            std::thread::sleep(defaults::REGISTRY_DIR_LOCK_RETRY);
        }
    }

    /// Reads every document; the revision moves on if the content changed since the
    /// last listing.
    fn list(&self) -> Result<Listing, StoreError> {
        let (files, _problems) = read_dir_docs(&self.dir).map_err(|e| self.failed("", e))?;
        let mut hasher = Sha256::new();
        for doc in &files {
            let kind: &[u8] = match doc.kind {
                DocKind::Server => b"s",
                DocKind::Profile => b"p",
            };
            hasher.update(kind);
            for part in [
                doc.name.as_bytes(),
                format_ext(doc.format).as_bytes(),
                &doc.body,
            ] {
                hasher.update((part.len() as u64).to_le_bytes());
                hasher.update(part);
            }
        }
        let hash: [u8; 32] = hasher.finalize().into();
        let modified: Vec<Option<u64>> = files.iter().map(|d| modified_ms(&d.path)).collect();
        let revision = {
            let mut seen = self.seen();
            if seen.1 == 0 {
                // A deletion leaves no file behind, but moves its directory's mtime.
                let dirs = [self.dir.clone(), self.dir.join("profiles")];
                let newest = modified
                    .iter()
                    .copied()
                    .chain(dirs.iter().map(|d| modified_ms(d)))
                    .flatten()
                    .max();
                *seen = (hash, now_ms().max(newest.unwrap_or(0)).max(1));
            } else if seen.0 != hash {
                *seen = (hash, now_ms().max(seen.1.saturating_add(1)));
            }
            seen.1
        };
        let docs = files
            .into_iter()
            .zip(modified)
            .map(
                |(
                    FileDoc {
                        kind,
                        name,
                        format,
                        body,
                        path: _,
                    },
                    modified,
                )| StoredDoc {
                    kind,
                    name,
                    format,
                    body,
                    revision,
                    updated_at: modified.map(|ms| ms / 1000),
                },
            )
            .collect();
        Ok(Listing { revision, docs })
    }

    /// Where a document lives (`name` is checked to be a plain name first).
    fn path(&self, kind: DocKind, name: &str, format: DocFormat) -> PathBuf {
        let dir = match kind {
            DocKind::Server => self.dir.clone(),
            DocKind::Profile => self.dir.join("profiles"),
        };
        dir.join(format!("{name}.{}", format_ext(format)))
    }

    /// Writes one document atomically and removes its file in the other format (one
    /// document per name: that file would be a duplicate).
    fn write_doc(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: &[u8],
    ) -> Result<(), StoreError> {
        let path = self.path(kind, name, format);
        self.write_atomically(&path, body)
            .map_err(|e| self.failed(&format!("cannot write {}: ", path.display()), e))?;
        let other = match format {
            DocFormat::Toml => DocFormat::Json,
            DocFormat::Json => DocFormat::Toml,
        };
        match std::fs::remove_file(self.path(kind, name, other)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.failed("", e)),
        }
    }

    /// Writes `body` to a temporary file beside `path` and renames it over `path`.
    fn write_atomically(&self, path: &Path, body: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)?;
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".quiver-write-{}-{seq}.tmp", std::process::id()));
        let written = (|| {
            let mut file = std::fs::File::create(&temp)?;
            file.write_all(body)?;
            file.sync_all()?;
            std::fs::rename(&temp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }

    /// Removes the document in either format; whether there was one.
    fn remove(&self, kind: DocKind, name: &str) -> std::io::Result<bool> {
        let mut removed = false;
        for format in [DocFormat::Toml, DocFormat::Json] {
            match std::fs::remove_file(self.path(kind, name, format)) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }
}

/// A file's modification time in Unix milliseconds; `None` where the filesystem keeps
/// none (or the file is gone).
fn modified_ms(path: &Path) -> Option<u64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    unix_ms(modified)
}

fn now_ms() -> u64 {
    unix_ms(SystemTime::now()).unwrap_or(0)
}

fn unix_ms(time: SystemTime) -> Option<u64> {
    u64::try_from(time.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()
}

fn format_ext(format: DocFormat) -> &'static str {
    match format {
        DocFormat::Toml => "toml",
        DocFormat::Json => "json",
    }
}

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    inner: &Arc<Inner>,
    work: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let moved = inner.clone();
    tokio::task::spawn_blocking(move || work(&moved))
        .await
        .map_err(|e| inner.failed("the file worker failed: ", e))?
}

/// What changed from `old` to `new`, as watch events.
fn diff(old: &Listing, new: &Listing) -> Vec<StoreEvent> {
    let key = |d: &StoredDoc| (d.kind, d.name.clone(), d.format as u8);
    let before: BTreeMap<_, &StoredDoc> = old.docs.iter().map(|d| (key(d), d)).collect();
    let after: BTreeMap<_, &StoredDoc> = new.docs.iter().map(|d| (key(d), d)).collect();
    let mut events: Vec<StoreEvent> = after
        .iter()
        .filter(|(k, d)| before.get(*k).is_none_or(|was| was.body != d.body))
        .map(|(_, d)| StoreEvent::Put((*d).clone()))
        .collect();
    events.extend(
        before
            .iter()
            .filter(|(k, _)| !after.contains_key(*k))
            .map(|(_, d)| StoreEvent::Deleted {
                kind: d.kind,
                name: d.name.clone(),
                revision: new.revision,
            }),
    );
    events
}

impl RegistryStore for DirStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn list(&self) -> StoreFuture<'_, Listing> {
        Box::pin(blocking(&self.inner, Inner::list))
    }

    fn get(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<StoredDoc>> {
        let name = name.to_owned();
        Box::pin(async move {
            let listing = self.list().await?;
            Ok(listing
                .docs
                .into_iter()
                .find(|d| d.kind == kind && d.name == name))
        })
    }

    fn upsert(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> StoreFuture<'_, u64> {
        Box::pin(self.put(kind, name.to_owned(), format, body, None))
    }

    /// A document's revision is its listing's here, so a write on a stale read fails
    /// when any file changed since, not only this one.
    fn upsert_if(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
        expected: u64,
    ) -> StoreFuture<'_, u64> {
        Box::pin(self.put(kind, name.to_owned(), format, body, Some(expected)))
    }

    fn apply(&self, writes: Vec<Write>, listed_at: u64) -> StoreFuture<'_, u64> {
        Box::pin(self.apply_writes(writes, listed_at))
    }

    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>> {
        let name = name.to_owned();
        Box::pin(async move {
            if !crate::registry::is_valid_server_id(&name) {
                return Ok(None);
            }
            let _queued = self.inner.writes.lock().await;
            blocking(&self.inner, move |inner| {
                let _locked = inner.write_lock()?;
                let current = inner.list()?;
                if !current
                    .docs
                    .iter()
                    .any(|d| d.kind == kind && d.name == name)
                {
                    return Ok(None);
                }
                check_change(&current.docs, &inner.describe(), kind, &name, None)?;
                if !inner.remove(kind, &name).map_err(|e| inner.failed("", e))? {
                    return Ok(None);
                }
                Ok(Some(inner.list()?.revision))
            })
            .await
        })
    }

    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>> {
        Box::pin(async move {
            let (signal, signals) = tokio::sync::mpsc::channel::<()>(1);
            let watcher = self.wake_on_changes(signal)?;
            let baseline = self.list().await?;
            // The directory keeps no history: a change between `since` and now shows as
            // every document put again.
            let first: Vec<StoreEvent> = if baseline.revision > since {
                baseline.docs.iter().cloned().map(StoreEvent::Put).collect()
            } else {
                Vec::new()
            };
            let state = (watcher, signals, baseline, self.inner.clone());
            let later =
                futures::stream::unfold(state, |(watcher, mut signals, last, inner)| async move {
                    loop {
                        signals.recv().await?;
                        // Let an editor's save (write, rename, delete a backup) settle.
                        tokio::time::sleep(defaults::REGISTRY_RELOAD_DEBOUNCE).await;
                        while signals.try_recv().is_ok() {}
                        let now = match blocking(&inner, Inner::list).await {
                            Ok(now) => now,
                            Err(e) => return Some((vec![Err(e)], (watcher, signals, last, inner))),
                        };
                        let events = diff(&last, &now);
                        if !events.is_empty() {
                            return Some((
                                events.into_iter().map(Ok).collect(),
                                (watcher, signals, now, inner),
                            ));
                        }
                    }
                })
                .flat_map(futures::stream::iter);
            let stream = futures::stream::iter(first.into_iter().map(Ok)).chain(later);
            Ok(stream.boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A fresh directory under the system's temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static SEQ: AtomicU64 = AtomicU64::new(0);
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "quiver-dirstore-{tag}-{}-{seq}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn server(id: &str) -> Vec<u8> {
        format!(
            "server_id = \"{id}\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n[stdio]\ncommand = \"true\"\n"
        )
        .into_bytes()
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn upsert_get_list_delete_move_the_revision_only_on_change() {
        let dir = TempDir::new("crud");
        let store = DirStore::new(&dir.0);
        let empty = store.list().await.unwrap();
        assert_eq!(store.list().await.unwrap().revision, empty.revision);

        let put = store
            .upsert(DocKind::Server, "alpha", DocFormat::Toml, server("alpha"))
            .await
            .unwrap();
        assert!(put > empty.revision);
        assert_eq!(
            files(&dir.0),
            [WRITE_LOCK_FILE, "alpha.toml"],
            "no temporary file is left"
        );
        let doc = store.get(DocKind::Server, "alpha").await.unwrap().unwrap();
        assert_eq!((doc.body, doc.format), (server("alpha"), DocFormat::Toml));
        assert_eq!(store.list().await.unwrap().revision, put, "unchanged");

        let profile = b"name = \"team\"\nserver_ids = [\"alpha\"]\n".to_vec();
        let with_profile = store
            .upsert(DocKind::Profile, "team", DocFormat::Toml, profile)
            .await
            .unwrap();
        assert!(with_profile > put);
        assert!(dir.0.join("profiles/team.toml").is_file());
        let registry = crate::registry::Registry::load_dir(&dir.0).unwrap();
        assert!(registry.get("alpha").is_some() && registry.profile("team").is_some());

        // The same id in JSON replaces the TOML file rather than duplicating it.
        let json = br#"{"server_id":"alpha","transport":"stdio","stdio":{"command":"false"}}"#;
        store
            .upsert(DocKind::Server, "alpha", DocFormat::Json, json.to_vec())
            .await
            .unwrap();
        assert_eq!(files(&dir.0), [WRITE_LOCK_FILE, "alpha.json", "profiles"]);
        // A profile in JSON too: written as `profiles/team.json`, read back and loaded.
        let profile = br#"{"name":"team","server_ids":["alpha"]}"#;
        store
            .upsert(DocKind::Profile, "team", DocFormat::Json, profile.to_vec())
            .await
            .unwrap();
        assert_eq!(files(&dir.0.join("profiles")), ["team.json"]);
        let doc = store.get(DocKind::Profile, "team").await.unwrap().unwrap();
        assert_eq!((doc.body, doc.format), (profile.to_vec(), DocFormat::Json));
        let registry = crate::registry::Registry::load_dir(&dir.0).unwrap();
        assert!(
            registry.profile("team").is_some(),
            "{:?}",
            registry.problems()
        );

        assert_eq!(store.delete(DocKind::Server, "nope").await.unwrap(), None);
        assert_eq!(store.delete(DocKind::Server, "../x").await.unwrap(), None);
        let err = store.delete(DocKind::Server, "alpha").await.unwrap_err();
        assert!(
            err.to_string().contains("team") && err.to_string().contains("alpha"),
            "{err}"
        );
        store
            .delete(DocKind::Profile, "team")
            .await
            .unwrap()
            .unwrap();
        let deleted = store
            .delete(DocKind::Server, "alpha")
            .await
            .unwrap()
            .unwrap();
        assert!(deleted > with_profile);
        assert!(store.get(DocKind::Server, "alpha").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_conditional_write_on_a_stale_revision_conflicts_and_docs_carry_their_mtime() {
        let dir = TempDir::new("ifmatch");
        let store = DirStore::new(&dir.0);
        let first = store
            .upsert(DocKind::Server, "a", DocFormat::Toml, server("a"))
            .await
            .unwrap();
        let doc = store.get(DocKind::Server, "a").await.unwrap().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            doc.updated_at.is_some_and(|t| t.abs_diff(now) < 120),
            "{doc:?}"
        );
        let changed = b"server_id = \"a\"\ntransport = \"stdio\"\nallowed_tools = [\"x\"]\n[stdio]\ncommand = \"true\"\n";
        let second = store
            .upsert_if(
                DocKind::Server,
                "a",
                DocFormat::Toml,
                changed.to_vec(),
                first,
            )
            .await
            .unwrap_or_else(|e| panic!("at revision {first}: {e}"));
        assert!(second > first);
        let stale = store
            .upsert_if(DocKind::Server, "a", DocFormat::Toml, server("a"), first)
            .await;
        assert_eq!(
            stale,
            Err(StoreError::Conflict {
                kind: DocKind::Server,
                name: "a".into(),
                current: second
            })
        );
        let kept = store.get(DocKind::Server, "a").await.unwrap().unwrap();
        assert_eq!(kept.body, changed, "the stale write changed nothing");
    }

    /// A restart (or a `quiver registry` run, each its own process) makes a new store
    /// over the same directory: its revisions go on above the old ones, so an `If-Match`
    /// revision read before cannot match again after a few writes.
    #[tokio::test]
    async fn revisions_keep_growing_in_a_new_store_so_an_old_one_never_matches() {
        let dir = TempDir::new("restart");
        let before = now_ms();
        let first = DirStore::new(&dir.0);
        let mut old = vec![first.list().await.unwrap().revision];
        for id in ["a", "b"] {
            old.push(
                first
                    .upsert(DocKind::Server, id, DocFormat::Toml, server(id))
                    .await
                    .unwrap(),
            );
        }
        assert!(old[0] >= before, "starts at the clock: {old:?} vs {before}");
        // Several changes within one millisecond may run ahead of the clock; a restart
        // takes longer than that.
        std::thread::sleep(Duration::from_millis(20));

        let second = DirStore::new(&dir.0);
        let mut new = vec![second.list().await.unwrap().revision];
        for id in ["c", "d", "e"] {
            new.push(
                second
                    .upsert(DocKind::Server, id, DocFormat::Toml, server(id))
                    .await
                    .unwrap(),
            );
        }
        assert!(new.windows(2).all(|w| w[0] < w[1]), "{new:?}");
        assert!(new[0] > old[2], "{old:?} then {new:?}");
        let changed = b"server_id = \"a\"\ntransport = \"stdio\"\nallowed_tools = [\"x\"]\n[stdio]\ncommand = \"true\"\n";
        for stale in old {
            let write = second
                .upsert_if(
                    DocKind::Server,
                    "a",
                    DocFormat::Toml,
                    changed.to_vec(),
                    stale,
                )
                .await;
            assert!(
                matches!(write, Err(StoreError::Conflict { current, .. }) if current == new[3]),
                "If-Match {stale}: {write:?}"
            );
        }
        let kept = second.get(DocKind::Server, "a").await.unwrap().unwrap();
        assert_eq!(kept.body, server("a"));

        // A deletion alone also starts a later store above the last revision.
        let gone = second.delete(DocKind::Server, "e").await.unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let third = DirStore::new(&dir.0).list().await.unwrap().revision;
        assert!(third > gone, "{gone} then {third}");
    }

    /// Another writer holding the lock through the real file (a second open file
    /// description conflicts exactly as another process's does).
    fn hold_lock(dir: &Path) -> std::fs::File {
        let holder = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(WRITE_LOCK_FILE))
            .unwrap();
        holder.lock().unwrap();
        holder
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_waits_for_another_writers_lock_or_gives_up_naming_it() {
        let dir = TempDir::new("lock");
        let store = DirStore::new(&dir.0);
        store
            .upsert(DocKind::Server, "a", DocFormat::Toml, server("a"))
            .await
            .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.0.join(WRITE_LOCK_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        let listed = store.list().await.unwrap();
        assert_eq!(listed.docs.len(), 1, "loads skip the lock file");
        let loaded = crate::registry::Registry::load_dir(&dir.0).unwrap();
        assert!(loaded.problems().is_empty(), "{:?}", loaded.problems());

        let holder = hold_lock(&dir.0);
        let patient = DirStore::new(&dir.0).with_lock_wait(Duration::from_secs(120));
        let waiting = tokio::spawn(async move {
            patient
                .upsert(DocKind::Server, "b", DocFormat::Toml, server("b"))
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "the write waits for the lock");
        assert!(!dir.0.join("b.toml").exists());
        drop(holder);
        let written = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .expect("the write goes on once the lock is free")
            .unwrap();
        assert!(
            written.as_ref().is_ok_and(|r| *r > listed.revision),
            "{written:?}"
        );
        assert!(dir.0.join("b.toml").is_file());

        let _holder = hold_lock(&dir.0);
        let impatient = DirStore::new(&dir.0).with_lock_wait(Duration::from_millis(200));
        let put = impatient
            .upsert(DocKind::Server, "c", DocFormat::Toml, server("c"))
            .await;
        let deleted = impatient.delete(DocKind::Server, "a").await;
        for result in [put.map(Some), deleted] {
            let Err(StoreError::Unreachable { message, .. }) = &result else {
                panic!("{result:?}")
            };
            assert!(
                message.contains(WRITE_LOCK_FILE) && message.contains("try again"),
                "{message}"
            );
        }
        assert!(!dir.0.join("c.toml").exists() && dir.0.join("a.toml").is_file());
    }

    #[cfg(feature = "watch")]
    #[test]
    fn watch_events_about_the_lock_file_alone_change_nothing() {
        use notify::event::{AccessKind, CreateKind, EventKind, ModifyKind, RenameMode};
        let dir = Path::new("/reg");
        let event = |kind, paths: &[&str]| {
            paths
                .iter()
                .fold(notify::Event::new(kind), |e, p| e.add_path(dir.join(p)))
        };
        let create = EventKind::Create(CreateKind::File);
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        for (event, counts) in [
            (event(create, &[WRITE_LOCK_FILE]), false),
            (
                event(
                    EventKind::Remove(notify::event::RemoveKind::File),
                    &[WRITE_LOCK_FILE],
                ),
                false,
            ),
            (event(create, &["a.toml"]), true),
            (event(renamed, &[".quiver-write-1-0.tmp", "a.toml"]), true),
            (event(renamed, &[WRITE_LOCK_FILE, "a.toml"]), true),
            (
                event(EventKind::Access(AccessKind::Any), &["a.toml"]),
                false,
            ),
            (event(EventKind::Other, &[]), true),
        ] {
            assert_eq!(DirStore::is_registry_event(&event), counts, "{event:?}");
        }
    }

    fn put(kind: DocKind, name: &str, body: Vec<u8>) -> Write {
        Write::Put(StoredDoc {
            kind,
            name: name.into(),
            format: DocFormat::Toml,
            body,
            revision: 0,
            updated_at: None,
        })
    }

    #[tokio::test]
    async fn a_checked_write_lands_only_on_the_listing_it_was_checked_against() {
        let dir = TempDir::new("apply");
        let store = DirStore::new(&dir.0);
        let listed = store.list().await.unwrap();
        // A hand edit after the listing: the write made on it is refused, nothing written.
        std::fs::write(dir.0.join("s.toml"), server("s")).unwrap();
        let err = store
            .apply(
                vec![put(DocKind::Server, "a", server("a"))],
                listed.revision,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Changed { .. }), "{err:?}");
        assert_eq!(files(&dir.0), [WRITE_LOCK_FILE, "s.toml"]);

        // Two writers check against one listing: one deletes `s`, the other adds a
        // profile naming it. Each is valid alone; only the first lands.
        let both = store.list().await.unwrap();
        let profile = b"name = \"p\"\nserver_ids = [\"s\"]\n".to_vec();
        let delete = Write::Delete {
            kind: DocKind::Server,
            name: "s".into(),
        };
        let add = put(DocKind::Profile, "p", profile);
        for write in [&delete, &add] {
            check_changes(&both.docs, "dir", std::slice::from_ref(write)).unwrap();
        }
        let deleted = store.apply(vec![delete], both.revision).await.unwrap();
        assert!(deleted > both.revision);
        let err = store.apply(vec![add], both.revision).await.unwrap_err();
        assert!(err.to_string().contains("changed meanwhile"), "{err}");
        assert!(store.list().await.unwrap().docs.is_empty());
    }

    #[tokio::test]
    async fn a_checked_write_that_fails_part_way_names_what_it_wrote() {
        let dir = TempDir::new("partial");
        let store = DirStore::new(&dir.0);
        // `profiles` is a file, so the profile cannot be written after the server was.
        std::fs::write(dir.0.join("profiles"), "not a directory").unwrap();
        let listed = store.list().await.unwrap();
        let writes = vec![
            put(DocKind::Server, "a", server("a")),
            put(
                DocKind::Profile,
                "p",
                b"name = \"p\"\nserver_ids = [\"a\"]\n".to_vec(),
            ),
        ];
        let err = store.apply(writes, listed.revision).await.unwrap_err();
        assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("written before the failure: servers/a"),
            "{err}"
        );
        let cause = std::error::Error::source(&err);
        assert!(
            cause.is_some_and(|e| e.downcast_ref::<std::io::Error>().is_some()),
            "the I/O error stays the source: {err:?}"
        );
        assert_eq!(files(&dir.0), [WRITE_LOCK_FILE, "a.toml", "profiles"]);
    }

    #[tokio::test]
    async fn an_invalid_upsert_names_the_field_and_writes_nothing() {
        let dir = TempDir::new("invalid");
        let store = DirStore::new(&dir.0);
        let bad = b"server_id = \"beta\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"\"\n";
        let err = store
            .upsert(DocKind::Server, "beta", DocFormat::Toml, bad.to_vec())
            .await
            .unwrap_err();
        let StoreError::Invalid(message) = &err else {
            panic!("{err:?}")
        };
        assert!(
            message.contains("stdio.command") && message.contains("must not be empty"),
            "{message}"
        );
        let err = store
            .upsert(DocKind::Server, "gamma", DocFormat::Toml, server("beta"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("server_id"), "{err}");
        let err = store
            .upsert(DocKind::Server, "../etc", DocFormat::Toml, server("etc"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
        let err = store
            .upsert(
                DocKind::Profile,
                "p",
                DocFormat::Toml,
                b"name = \"p\"\nserver_ids = [\"ghost\"]\n".to_vec(),
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("server_ids") && err.to_string().contains("ghost"),
            "{err}"
        );
        assert_eq!(files(&dir.0), [WRITE_LOCK_FILE], "only the lock was taken");
    }

    #[tokio::test]
    async fn from_docs_names_the_store_document_in_problems() {
        let docs = vec![StoredDoc {
            kind: DocKind::Server,
            name: "broken".into(),
            format: DocFormat::Toml,
            body: b"server_id = 3".to_vec(),
            revision: 1,
            updated_at: None,
        }];
        let registry = crate::registry::Registry::from_docs(docs, "etcd://h:1/p", &|_: &str| None);
        let problem = &registry.problems()[0];
        assert_eq!(problem.path, PathBuf::from("etcd://h:1/p/servers/broken"));
        assert_eq!(problem.field.as_deref(), Some("server_id"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_yields_changes_made_after_its_revision() {
        let dir = TempDir::new("watch");
        let store = DirStore::new(&dir.0);
        let since = store.list().await.unwrap().revision;
        let mut events = store.watch(since).await.unwrap();
        std::fs::write(dir.0.join("hand.toml"), server("hand")).unwrap();
        let event = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("an event within 30 s")
            .expect("the stream goes on")
            .unwrap();
        let StoreEvent::Put(doc) = event else {
            panic!("{event:?}")
        };
        assert_eq!((doc.kind, doc.name.as_str()), (DocKind::Server, "hand"));
        assert!(doc.revision > since);

        // A watch from an old revision first replays what is there now.
        let mut replay = store.watch(since).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), replay.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            matches!(first, StoreEvent::Put(ref d) if d.name == "hand"),
            "{first:?}"
        );
    }
}
