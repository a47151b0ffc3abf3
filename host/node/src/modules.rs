//! The node's compiled modules, by the SHA-256 of their bytes, bounded in count and in
//! bytes. A module past either bound pushes out the least recently used one; tasks that
//! already hold a module keep it (a [`GuestModule`] is reference-counted).
//!
//! The store is a module's only owner: the node loads uploads with
//! [`Host::load_module_uncached`](quiver::Host::load_module_uncached), which keeps nothing
//! in the host's cache nor on disk, so an eviction really frees the module. A module
//! counts as its compiled image plus its upload size (which covers the copy-on-write image
//! of its data and its metadata), the memory it really holds rather than the bytes sent.
//!
//! Uploads on their way into the store are bounded too ([`Uploads`]): a compile keeps
//! its upload's place until it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use quiver::GuestModule;

struct Stored {
    module: GuestModule,
    bytes: u64,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    modules: HashMap<String, Stored>,
    bytes: u64,
    clock: u64,
}

/// What the store holds, for `/readyz`.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct StoreStatus {
    pub(crate) stored: usize,
    /// Counted as described in the module docs.
    pub(crate) bytes: u64,
    pub(crate) max_modules: usize,
    pub(crate) max_bytes: u64,
}

/// A module that alone takes more than the store may hold; its counted size.
pub(crate) struct TooLarge(pub(crate) u64);

/// Compiled modules by hash (lowercase hex).
pub(crate) struct ModuleStore {
    inner: Mutex<Inner>,
    max_modules: usize,
    max_bytes: u64,
}

impl ModuleStore {
    pub(crate) fn new(max_modules: u32, max_bytes: u64) -> Self {
        Self {
            inner: Mutex::default(),
            max_modules: usize::try_from(max_modules).unwrap_or(usize::MAX).max(1),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `sha256` is stored; counts as a use.
    pub(crate) fn contains(&self, sha256: &str) -> bool {
        self.get(sha256).is_some()
    }

    /// The module stored as `sha256`; counts as a use.
    pub(crate) fn get(&self, sha256: &str) -> Option<GuestModule> {
        let mut inner = self.lock();
        inner.clock = inner.clock.saturating_add(1);
        let now = inner.clock;
        let stored = inner.modules.get_mut(sha256)?;
        stored.last_used = now;
        Some(stored.module.clone())
    }

    /// What the store holds now.
    pub(crate) fn status(&self) -> StoreStatus {
        let inner = self.lock();
        StoreStatus {
            stored: inner.modules.len(),
            bytes: inner.bytes,
            max_modules: self.max_modules,
            max_bytes: self.max_bytes,
        }
    }

    /// Stores `module` (uploaded as `upload_bytes`) as `sha256`, evicting the least
    /// recently used ones past the bounds. False when it was already stored.
    pub(crate) fn insert(
        &self,
        sha256: &str,
        module: GuestModule,
        upload_bytes: u64,
    ) -> Result<bool, TooLarge> {
        let bytes = upload_bytes.saturating_add(module.compiled_bytes());
        if bytes > self.max_bytes {
            return Err(TooLarge(bytes));
        }
        let mut inner = self.lock();
        if inner.modules.contains_key(sha256) {
            return Ok(false);
        }
        while !inner.modules.is_empty()
            && (inner.modules.len() >= self.max_modules
                || inner.bytes.saturating_add(bytes) > self.max_bytes)
        {
            let Some(oldest) = inner
                .modules
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(gone) = inner.modules.remove(&oldest) {
                inner.bytes = inner.bytes.saturating_sub(gone.bytes);
                tracing::info!(module = %oldest, "module evicted from the node's store");
            }
        }
        inner.clock = inner.clock.saturating_add(1);
        let last_used = inner.clock;
        inner.bytes = inner.bytes.saturating_add(bytes);
        inner.modules.insert(
            sha256.to_owned(),
            Stored {
                module,
                bytes,
                last_used,
            },
        );
        Ok(true)
    }
}

/// Module uploads read and compiled at once. An upload holds a permit from before its body
/// is read until its compile ends: the compile runs on a blocking thread that owns the
/// permit, so a client that disconnects meanwhile (which drops its request) cannot free
/// a place while its compile still takes a core and its memory.
pub(crate) struct Uploads {
    permits: Arc<Semaphore>,
    limit: usize,
    compiling: Arc<AtomicUsize>,
}

/// Uploads at work, for `/readyz`.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct UploadsStatus {
    /// Holding a permit: reading a body or compiling.
    pub(crate) in_progress: usize,
    pub(crate) compiling: usize,
    pub(crate) limit: usize,
}

/// One upload's place; see [`Uploads`].
pub(crate) struct UploadPermit {
    permit: OwnedSemaphorePermit,
    compiling: Arc<AtomicUsize>,
}

/// An upload's place while it compiles, counted in [`UploadsStatus::compiling`].
struct Compiling {
    _permit: OwnedSemaphorePermit,
    compiling: Arc<AtomicUsize>,
}

impl Drop for Compiling {
    fn drop(&mut self) {
        self.compiling.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Uploads {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            compiling: Arc::default(),
        }
    }

    /// A place for one more upload, unless all are taken.
    pub(crate) fn try_start(&self) -> Option<UploadPermit> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(UploadPermit {
            permit,
            compiling: self.compiling.clone(),
        })
    }

    pub(crate) fn status(&self) -> UploadsStatus {
        UploadsStatus {
            in_progress: self.limit.saturating_sub(self.permits.available_permits()),
            compiling: self.compiling.load(Ordering::Relaxed),
            limit: self.limit,
        }
    }
}

impl UploadPermit {
    /// Runs `compile` on a blocking thread that owns this place until it returns, however
    /// long the request that started it lasts; `None` if it panicked.
    pub(crate) async fn compile<T: Send + 'static>(
        self,
        compile: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        self.compiling.fetch_add(1, Ordering::Relaxed);
        let place = Compiling {
            _permit: self.permit,
            compiling: self.compiling,
        };
        tokio::task::spawn_blocking(move || {
            let _place = place;
            compile()
        })
        .await
        .ok()
    }
}
