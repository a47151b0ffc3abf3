//! The wasmtime engine of a host: configuration, the linker, compiled modules, and the
//! epoch clock.
//!
//! One [`Engine`] serves the whole host, with the pooling allocator (instantiation in
//! microseconds) and epoch interruption (a ticker thread advances the epoch every
//! [`defaults::EPOCH_TICK`]; each tick a running guest checks its deadline and yields to
//! other tasks).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, InstancePre, Linker,
    PoolingAllocationConfig,
};

use super::SandboxView;
use super::cache::ModuleCache;
pub use super::cache::ModuleOrigin;
use crate::defaults;

/// The engine's tunables.
pub struct RuntimeOptions {
    pub cache_dir: Option<PathBuf>,
    pub max_concurrent_tasks: u32,
    pub max_task_memory: u64,
    /// Bytes of each slot's fiber stack and linear memory reset in place when a task ends,
    /// rather than given back to the kernel ([`defaults::TASK_KEEP_RESIDENT`]).
    pub keep_resident: usize,
}

/// The engine, the linker with every import, and the module cache, for store data `T`.
pub struct Runtime<T: 'static> {
    engine: Engine,
    linker: Linker<T>,
    cache: ModuleCache<T>,
    ticker_stop: Arc<AtomicBool>,
    pub max_task_memory: u64,
}

impl<T: SandboxView> Runtime<T> {
    /// `add_imports` registers the capabilities' imports; WASI and the sandbox's own come
    /// first.
    pub fn new(
        options: RuntimeOptions,
        add_imports: impl FnOnce(&mut Linker<T>) -> wasmtime::Result<()>,
    ) -> wasmtime::Result<Self> {
        let slots = options.max_concurrent_tasks.max(1);
        let mut pooling = PoolingAllocationConfig::default();
        // One instance, memory, table and fiber stack per running task. Admission control
        // (crate::host) never runs more tasks than `slots`, so the pool cannot run out.
        // Guest tool calls (a call back into the guest from an async hostcall runs on a
        // fresh fiber) take from a separate share of stacks the host hands out by permit.
        let stacks = slots.saturating_add(defaults::guest_tool_stacks(slots));
        pooling
            .total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .total_stacks(stacks)
            .max_memory_size(usize::try_from(options.max_task_memory).unwrap_or(usize::MAX))
            // A freed memory is given back to the kernel at once. Batching saved about 1 µs
            // per task here but keeps up to cores x (batch - 1) freed memories resident
            // until a flush; tasks run for seconds, so that is not worth it.
            .decommit_batch_size(1)
            // When a task ends, the top `keep_resident` bytes of its fiber stack (where a
            // stack is used first) are zeroed with memset and the rest is given back to the
            // kernel; see zeroing below. Giving back pages a task touched costs a TLB flush
            // on every core running a worker and a page fault per page in the next task,
            // about 4 µs for even an empty task; pages it never touched cost nothing.
            .async_stack_keep_resident(options.keep_resident)
            // Linear memory: the pages a task wrote within the first `keep_resident` bytes
            // are found with PAGEMAP_SCAN (Linux 6.7+) and reset in place; pages beyond
            // them are given back to the kernel. Without PAGEMAP_SCAN the first
            // `keep_resident` bytes are reset with memset.
            .linear_memory_keep_resident(options.keep_resident)
            .pagemap_scan(Enabled::Auto);
        let mut config = Config::new();
        // 4 GiB of address space per slot (all a 32-bit memory can address) plus a 32 MiB
        // guard lets compiled guests skip bounds checks. It is reserved, not committed:
        // the default 5000 slots take about 20 TiB of the 128 TiB x86-64 user address space
        // (so about six such hosts fit in one process) and no memory until a task touches
        // its pages. A host that does not fit fails to build with the setting to lower.
        config.memory_reservation(defaults::TASK_MEMORY_RESERVATION);
        config.memory_guard_size(defaults::TASK_MEMORY_GUARD);
        // Host code of async hostcalls runs on the task's fiber stack; only touched pages
        // are resident (about 30 KiB for a task waiting on an MCP call).
        config.async_stack_size(defaults::TASK_STACK_BYTES);
        // Zero each fiber stack when its task ends (memset of the top, the rest given back
        // to the kernel, see above): without it every stack keeps the deepest use it ever
        // had (up to the 512 KiB a guest may recurse into, times the slots) resident for
        // the life of the host, and one task's stack contents would be the next task's
        // starting stack.
        config.async_stack_zeroing(true);
        config.epoch_interruption(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        super::add_to_linker(&mut linker)?;
        add_imports(&mut linker)?;
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone())?;
        Ok(Self {
            cache: ModuleCache::new(&engine, options.cache_dir),
            engine,
            linker,
            ticker_stop,
            max_task_memory: options.max_task_memory,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or fetches from a cache) and links `bytes` (a wasm binary, or WAT text).
    pub fn prepare(&self, bytes: &[u8]) -> wasmtime::Result<(InstancePre<T>, ModuleOrigin)> {
        self.cache.get_or_prepare(&self.engine, bytes, |module| {
            self.linker.instantiate_pre(module)
        })
    }
}

impl<T: SandboxView> Runtime<T> {
    /// [`Runtime::prepare`] for modules whose caller keeps and drops them (a node's
    /// uploads): not kept in memory by the runtime, not written to the disk cache.
    pub fn prepare_uncached(
        &self,
        bytes: &[u8],
    ) -> wasmtime::Result<(InstancePre<T>, ModuleOrigin)> {
        self.cache.prepare_uncached(&self.engine, bytes, |module| {
            self.linker.instantiate_pre(module)
        })
    }

    /// Modules the runtime keeps in memory.
    pub fn cached_modules(&self) -> usize {
        self.cache.len()
    }
}

impl<T> Drop for Runtime<T> {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::SeqCst);
    }
}

/// The default on-disk cache: `$XDG_CACHE_HOME/quiver/modules` or `~/.cache/quiver/modules`.
pub fn default_cache_dir() -> Option<PathBuf> {
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
