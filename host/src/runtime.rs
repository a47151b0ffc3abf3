//! The wasmtime side: engine configuration, the compiled-module cache, per-task store state
//! and deadlines. Knows no hostcall; the ABI layer hands it a linker.
//!
//! One [`Engine`] serves the whole host, with the pooling allocator (instantiation in
//! microseconds) and epoch interruption (a ticker thread advances the epoch every
//! [`defaults::EPOCH_TICK`]; each tick a running guest checks its deadline and yields to
//! other tasks). Compiled modules are kept in memory and on disk as precompiled artifacts
//! keyed by the module's SHA-256 and the engine's compatibility hash, so a second
//! `quiver run` of a module skips Cranelift.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Memory, Module,
    PoolingAllocationConfig, StoreLimits, Table,
};
use wasmtime_wasi::p1::WasiP1Ctx;

use crate::defaults;
use crate::fd::FdTable;
use crate::llm::Backends;
use crate::mcp::McpPool;
use crate::policy::TaskMcpPolicy;
use crate::registry::Registry;

/// What a task's hostcalls may read: fixed for the whole run.
pub(crate) struct TaskContext {
    pub(crate) task_id: String,
    pub(crate) deadline: tokio::time::Instant,
    pub(crate) deadline_after: Duration,
    pub(crate) mcp_policy: TaskMcpPolicy,
    /// The registry snapshot the task started with.
    pub(crate) registry: Arc<Registry>,
    pub(crate) pool: Arc<McpPool>,
    pub(crate) backends: Arc<Backends>,
}

/// The store data of one task.
pub(crate) struct TaskState {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) limits: StoreLimits,
    pub(crate) fds: FdTable,
    /// The guest's exported memory, looked up once after instantiation.
    pub(crate) memory: Option<Memory>,
    /// The guest's funcref table (for guest tools), looked up once after instantiation.
    pub(crate) table: Option<Table>,
    pub(crate) ctx: Arc<TaskContext>,
}

/// The trap that ends a task at its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the task's deadline of {} ms passed", after.as_millis())]
pub(crate) struct DeadlineExceeded {
    pub(crate) after: Duration,
}

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

pub(crate) struct RuntimeOptions {
    pub(crate) cache_dir: Option<PathBuf>,
    pub(crate) max_concurrent_tasks: u32,
    pub(crate) max_task_memory: u64,
}

pub(crate) struct Runtime {
    engine: Engine,
    linker: Linker<TaskState>,
    cache_dir: Option<PathBuf>,
    engine_tag: String,
    prepared: Mutex<HashMap<[u8; 32], InstancePre<TaskState>>>,
    ticker_stop: Arc<AtomicBool>,
    pub(crate) max_task_memory: u64,
}

impl Runtime {
    pub(crate) fn new(
        options: RuntimeOptions,
        add_imports: impl FnOnce(&mut Linker<TaskState>) -> wasmtime::Result<()>,
    ) -> wasmtime::Result<Self> {
        let mut pooling = PoolingAllocationConfig::default();
        let slots = options.max_concurrent_tasks.max(1);
        pooling
            .total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(slots)
            .max_memory_size(options.max_task_memory as usize);
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut linker, |state: &mut TaskState| {
            &mut state.wasi
        })?;
        add_imports(&mut linker)?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_tag = format!("{:016x}", hasher.finish());
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone())?;
        Ok(Self {
            engine,
            linker,
            cache_dir: options.cache_dir,
            engine_tag,
            prepared: Mutex::new(HashMap::new()),
            ticker_stop,
            max_task_memory: options.max_task_memory,
        })
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or fetches from a cache) and links `bytes` (a wasm binary, or WAT text).
    pub(crate) fn prepare(
        &self,
        bytes: &[u8],
    ) -> wasmtime::Result<(InstancePre<TaskState>, ModuleOrigin)> {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(pre) = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&digest)
        {
            return Ok((pre.clone(), ModuleOrigin::MemoryCache));
        }
        let (module, origin) = self.load_or_compile(&digest, bytes)?;
        let pre = self.linker.instantiate_pre(&module)?;
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(digest, pre.clone());
        Ok((pre, origin))
    }

    fn artifact_path(&self, digest: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        Some(
            self.cache_dir
                .as_ref()?
                .join(format!("{hex}-{}.cwasm", self.engine_tag)),
        )
    }

    fn load_or_compile(
        &self,
        digest: &[u8; 32],
        bytes: &[u8],
    ) -> wasmtime::Result<(Module, ModuleOrigin)> {
        let artifact = self.artifact_path(digest);
        if let Some(path) = artifact.as_deref().filter(|p| p.is_file()) {
            // SAFETY: the artifact was written by `Module::serialize` of this same engine
            // configuration (the file name carries its compatibility hash) into a cache
            // directory created private to this user; wasmtime re-checks compatibility.
            match unsafe { Module::deserialize_file(&self.engine, path) } {
                Ok(module) => return Ok((module, ModuleOrigin::DiskCache)),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "ignoring unusable precompiled module")
                }
            }
        }
        let started = std::time::Instant::now();
        let module = Module::new(&self.engine, bytes)?;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled guest module"
        );
        if let Some(path) = artifact
            && let Err(error) = write_artifact(&path, &module)
        {
            tracing::warn!(path = %path.display(), %error, "cannot cache the compiled module");
        }
        Ok((module, ModuleOrigin::Compiled))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::SeqCst);
    }
}

fn write_artifact(path: &Path, module: &Module) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .expect("artifact paths are inside the cache dir");
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    let bytes = module.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The default on-disk cache: `$XDG_CACHE_HOME/quiver/modules` or `~/.cache/quiver/modules`.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("quiver").join("modules"))
}

fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("quiver-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(defaults::EPOCH_TICK);
                engine.increment_epoch();
            }
        })?;
    Ok(())
}
