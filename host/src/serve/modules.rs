//! The node's compiled modules, by the SHA-256 of their bytes, bounded in count and in
//! bytes. A module past either bound pushes out the least recently used one; tasks that
//! already hold a module keep it (a [`GuestModule`] is reference-counted).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::GuestModule;

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

    /// Stores `module` (`bytes` long) as `sha256`, evicting the least recently used ones
    /// past the bounds. False when it was already stored.
    pub(crate) fn insert(&self, sha256: &str, module: GuestModule, bytes: u64) -> bool {
        let mut inner = self.lock();
        if inner.modules.contains_key(sha256) {
            return false;
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
        true
    }
}
