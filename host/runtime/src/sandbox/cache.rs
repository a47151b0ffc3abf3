//! Compiled modules, kept in memory for the host's life and on disk across runs.
//!
//! That suits modules a host's operator chose. Modules from clients (`quiver serve`
//! uploads) go through [`ModuleCache::prepare_uncached`] instead, which neither keeps
//! them nor writes them out: their owner bounds and evicts them, and an upload cannot
//! fill memory or the disk.
//!
//! A precompiled artifact is native code that wasmtime maps and runs without re-checking
//! it, so loading one is only as safe as the directory it came from. The cache therefore
//! trusts a directory only if this user owns it and nobody else can write to it, and an
//! artifact only if this user owns it and it is not writable by others; anything else is
//! compiled afresh and not cached. Artifact names carry the module's SHA-256 and the
//! engine's compatibility hash, and wasmtime re-checks compatibility on load.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, InstancePre, Module};

/// Where a module's compiled code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// Compiled by Cranelift now.
    Compiled,
    /// Loaded from the on-disk cache of precompiled artifacts.
    DiskCache,
    /// Already prepared by this host.
    MemoryCache,
}

pub(super) struct ModuleCache<T: 'static> {
    dir: Option<PathBuf>,
    engine_tag: String,
    prepared: Mutex<HashMap<[u8; 32], InstancePre<T>>>,
}

impl<T: 'static> ModuleCache<T> {
    pub(super) fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self {
            dir,
            engine_tag: format!("{:016x}", hasher.finish()),
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// The linked module for `bytes`, from memory, disk, or compiled by `link` now.
    pub(super) fn get_or_prepare(
        &self,
        engine: &Engine,
        bytes: &[u8],
        link: impl FnOnce(&Module) -> wasmtime::Result<InstancePre<T>>,
    ) -> wasmtime::Result<(InstancePre<T>, ModuleOrigin)> {
        self.prepare(engine, bytes, link, true)
    }

    /// The linked module for `bytes`, reused from memory or read from disk if there, else
    /// compiled now; neither kept in memory nor written to disk.
    pub(super) fn prepare_uncached(
        &self,
        engine: &Engine,
        bytes: &[u8],
        link: impl FnOnce(&Module) -> wasmtime::Result<InstancePre<T>>,
    ) -> wasmtime::Result<(InstancePre<T>, ModuleOrigin)> {
        self.prepare(engine, bytes, link, false)
    }

    /// The linked module for `bytes`; a newly prepared one is kept in memory and on disk
    /// only when `keep`.
    fn prepare(
        &self,
        engine: &Engine,
        bytes: &[u8],
        link: impl FnOnce(&Module) -> wasmtime::Result<InstancePre<T>>,
        keep: bool,
    ) -> wasmtime::Result<(InstancePre<T>, ModuleOrigin)> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(pre) = self.lock().get(&digest) {
            return Ok((pre.clone(), ModuleOrigin::MemoryCache));
        }
        let (module, origin) = self.load_or_compile(engine, &digest, bytes, keep)?;
        let pre = link(&module)?;
        if keep {
            self.lock().insert(digest, pre.clone());
        }
        Ok((pre, origin))
    }

    /// Modules kept in memory.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], InstancePre<T>>> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn artifact_path(&self, digest: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        Some(
            self.dir
                .as_ref()?
                .join(format!("{hex}-{}.cwasm", self.engine_tag)),
        )
    }

    /// `bytes` compiled, or read from the disk cache; a compiled one is written there
    /// when `write`.
    fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &[u8; 32],
        bytes: &[u8],
        write: bool,
    ) -> wasmtime::Result<(Module, ModuleOrigin)> {
        let artifact = self.artifact_path(digest);
        if let Some(path) = artifact.as_deref().filter(|p| p.is_file()) {
            match read_trusted(path) {
                // SAFETY: `read_trusted` read these bytes from a file it opened without
                // following links and checked through that open handle: this user owns it
                // and its directory and no one else can write either, so it was written by
                // `Module::serialize` of this user's hosts (the file name carries the
                // engine's compatibility hash, which wasmtime checks again). Checking the
                // open handle, and deserialising what was read from it, leaves no window
                // for the file to be swapped. Tested in
                // `tests::untrusted_cache_directories_are_not_used`.
                Ok(artifact) => match unsafe { Module::deserialize(engine, &artifact) } {
                    Ok(module) => return Ok((module, ModuleOrigin::DiskCache)),
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "ignoring unusable precompiled module")
                    }
                },
                Err(why) => {
                    tracing::warn!(path = %path.display(), %why, "not loading a precompiled module from an untrusted place")
                }
            }
        }
        let started = std::time::Instant::now();
        let module = Module::new(engine, bytes)?;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled guest module"
        );
        if let Some(path) = artifact.filter(|_| write)
            && let Err(error) = write_artifact(&path, &module)
        {
            tracing::warn!(path = %path.display(), %error, "cannot cache the compiled module");
        }
        Ok((module, ModuleOrigin::Compiled))
    }
}

/// Why a place is not trusted to hold precompiled code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UntrustedPlace {
    #[error("no parent directory")]
    NoParent,
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is a symbolic link", path.display())]
    Symlink { path: PathBuf },
    #[error("{} belongs to uid {uid}", path.display())]
    NotMine { path: PathBuf, uid: u32 },
    #[error("{} is writable by other users (mode {mode:o})", path.display())]
    Writable { path: PathBuf, mode: u32 },
    #[cfg(not(unix))]
    #[error("{}: precompiled modules are only trusted on Unix", path.display())]
    NotUnix { path: PathBuf },
}

/// Why a compiled module was not written to the disk cache (the run goes on without it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheError {
    #[error("not caching into an untrusted directory: {0}")]
    Untrusted(#[source] UntrustedPlace),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Serialize(#[source] wasmtime::Error),
}

/// The bytes of `path`, if it and its directory are this user's and writable by no one
/// else. The file is opened without following a link and judged by its open handle.
#[cfg(unix)]
fn read_trusted(path: &Path) -> Result<Vec<u8>, UntrustedPlace> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    private_to_me(path.parent().ok_or(UntrustedPlace::NoParent)?)?;
    let unreadable = |source| UntrustedPlace::Unreadable {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    owned_and_private(path, &meta)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).map_err(unreadable)?;
    Ok(bytes)
}

#[cfg(not(unix))]
fn read_trusted(path: &Path) -> Result<Vec<u8>, UntrustedPlace> {
    Err(UntrustedPlace::NotUnix {
        path: path.to_owned(),
    })
}

/// `place` is no symlink, belongs to this user and is not group- or world-writable.
#[cfg(unix)]
fn private_to_me(place: &Path) -> Result<(), UntrustedPlace> {
    let meta = std::fs::symlink_metadata(place).map_err(|source| UntrustedPlace::Unreadable {
        path: place.to_owned(),
        source,
    })?;
    owned_and_private(place, &meta)
}

/// What `meta` (of `place`) says: no symlink, this user's, writable by no one else.
#[cfg(unix)]
fn owned_and_private(place: &Path, meta: &std::fs::Metadata) -> Result<(), UntrustedPlace> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let path = || place.to_owned();
    if meta.file_type().is_symlink() {
        return Err(UntrustedPlace::Symlink { path: path() });
    }
    if meta.uid() != me {
        return Err(UntrustedPlace::NotMine {
            path: path(),
            uid: meta.uid(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(UntrustedPlace::Writable {
            path: path(),
            mode: meta.mode() & 0o777,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn private_to_me(place: &Path) -> Result<(), UntrustedPlace> {
    Err(UntrustedPlace::NotUnix {
        path: place.to_owned(),
    })
}

fn write_artifact(path: &Path, module: &Module) -> Result<(), CacheError> {
    let dir = path
        .parent()
        .ok_or(CacheError::Untrusted(UntrustedPlace::NoParent))?;
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    private_to_me(dir).map_err(CacheError::Untrusted)?;
    let bytes = module.serialize().map_err(CacheError::Serialize)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const WAT: &str = "(module (func (export \"_start\")))";

    fn cache(dir: &Path) -> (Engine, ModuleCache<()>) {
        let engine = Engine::default();
        let cache = ModuleCache::new(&engine, Some(dir.to_owned()));
        (engine, cache)
    }

    fn origin(dir: &Path) -> ModuleOrigin {
        let (engine, cache) = cache(dir);
        let linker = wasmtime::Linker::<()>::new(&engine);
        cache
            .get_or_prepare(&engine, WAT.as_bytes(), |m| linker.instantiate_pre(m))
            .unwrap()
            .1
    }

    fn artifacts(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn uncached_modules_are_neither_kept_nor_written() {
        let root =
            std::env::temp_dir().join(format!("quiver-cache-uncached-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (engine, cache) = cache(&root);
        let linker = wasmtime::Linker::<()>::new(&engine);
        let (_, origin) = cache
            .prepare_uncached(&engine, WAT.as_bytes(), |m| linker.instantiate_pre(m))
            .unwrap();
        assert_eq!(origin, ModuleOrigin::Compiled);
        assert_eq!(cache.len(), 0, "nothing kept in memory");
        assert!(artifacts(&root).is_empty(), "nothing written to disk");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The safety argument of the `deserialize_file` above: only artifacts in a private
    /// directory of this user are loaded; a directory or file others can write is not.
    #[test]
    fn untrusted_cache_directories_are_not_used() {
        let root = std::env::temp_dir().join(format!("quiver-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("modules");
        assert_eq!(origin(&dir), ModuleOrigin::Compiled);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            origin(&dir),
            ModuleOrigin::DiskCache,
            "a private cache is used"
        );

        let artifact = artifacts(&dir).pop().expect("one artifact");
        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            origin(&dir),
            ModuleOrigin::Compiled,
            "a world-writable artifact is not loaded"
        );

        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            origin(&dir),
            ModuleOrigin::Compiled,
            "a world-writable directory is not trusted"
        );
        std::fs::remove_file(&artifact).unwrap();
        assert_eq!(origin(&dir), ModuleOrigin::Compiled);
        assert!(
            artifacts(&dir).is_empty(),
            "nothing is written into an untrusted directory"
        );

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(dir.join("garbage.cwasm"), b"not an artifact").unwrap();
        assert_eq!(origin(&dir), ModuleOrigin::Compiled);
        let artifact = artifacts(&dir)
            .into_iter()
            .find(|p| !p.ends_with("garbage.cwasm"))
            .unwrap();
        std::fs::write(&artifact, b"truncated").unwrap();
        assert_eq!(
            origin(&dir),
            ModuleOrigin::Compiled,
            "a corrupt artifact is recompiled"
        );
        assert_eq!(origin(&dir), ModuleOrigin::DiskCache);
        let elsewhere = root.join("elsewhere.cwasm");
        std::fs::rename(&artifact, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &artifact).unwrap();
        assert_eq!(
            origin(&dir),
            ModuleOrigin::Compiled,
            "an artifact reached through a link is not loaded"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
