//! The [`Host`]: what an embedding scheduler (or the CLI) builds once and runs tasks on.
//!
//! A host owns the engine and module cache, the registry snapshot and the MCP pool. Tasks
//! share those and nothing else: each gets a fresh store with its own fd table, WASI
//! context, memory limit and deadline, so one task trapping, looping or timing out ends
//! that task alone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tracing::Instrument;
use wasmtime::{InstancePre, Store, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::abi;
use crate::chat::ChatSession;
use crate::chat::tools::ToolSet;
use crate::defaults;
use crate::fd::FdTable;
use crate::llm::{Backends, ConfigError, HostConfig, Recorder};
use crate::mcp::{EgressPolicy, McpPool, RemoteOptions};
use crate::policy::{self, PolicyReport, SessionRequest, TaskMcpPolicy};
use crate::registry::{Registry, RegistryDirError, Severity};
pub use crate::runtime::ModuleOrigin;
use crate::runtime::{
    DeadlineExceeded, Runtime, RuntimeOptions, TaskContext, TaskState, default_cache_dir,
};
use crate::task::{TaskError, TaskSpec};

/// Guest output kept per stream when a task captures it.
const CAPTURE_LIMIT: usize = 16 * 1024 * 1024;

/// Something that stopped the host from starting or a task from starting.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Registry(#[from] RegistryDirError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
    #[error("{path}: cannot load the guest module: {message}")]
    Module { path: String, message: String },
    #[error("task `{task_id}`: {message}")]
    TaskSetup { task_id: String, message: String },
}

/// Builds a [`Host`]; every option has a sane default.
#[derive(Debug)]
#[must_use]
pub struct HostBuilder {
    registry_dir: Option<PathBuf>,
    registry: Option<Registry>,
    cache_dir: Option<PathBuf>,
    disk_cache: bool,
    max_concurrent_tasks: u32,
    max_task_memory: u64,
    tools_cache_ttl: Duration,
    connect_timeout: Duration,
    config: HostConfig,
    config_dir: PathBuf,
    record_to: Option<PathBuf>,
}

impl Default for HostBuilder {
    fn default() -> Self {
        Self {
            registry_dir: None,
            registry: None,
            cache_dir: None,
            disk_cache: true,
            max_concurrent_tasks: defaults::MAX_CONCURRENT_TASKS,
            max_task_memory: defaults::TASK_MEMORY_BYTES,
            tools_cache_ttl: defaults::TOOLS_CACHE_TTL,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            config: HostConfig::default(),
            config_dir: PathBuf::from("."),
            record_to: None,
        }
    }
}

impl HostBuilder {
    /// Loads MCP servers from this directory (one file per server). Without a registry
    /// every MCP use is denied.
    pub fn with_registry_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registry_dir = Some(dir.into());
        self
    }

    /// Uses an already loaded registry (e.g. one built with a custom env lookup).
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Keeps precompiled modules in `dir` (default `~/.cache/quiver/modules`).
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self.disk_cache = true;
        self
    }

    /// Compiles modules in memory only.
    pub fn without_disk_cache(mut self) -> Self {
        self.disk_cache = false;
        self
    }

    /// Tasks that can run at once (instance slots reserved by the pooling allocator).
    pub fn with_max_concurrent_tasks(mut self, tasks: u32) -> Self {
        self.max_concurrent_tasks = tasks.max(1);
        self
    }

    /// The most linear memory any task may ask for; a task's own limit is capped by it.
    pub fn with_max_task_memory(mut self, bytes: u64) -> Self {
        self.max_task_memory = bytes;
        self
    }

    pub fn with_tools_cache_ttl(mut self, ttl: Duration) -> Self {
        self.tools_cache_ttl = ttl;
        self
    }

    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reads LLM backends from a host config file (`quiver.toml`). Without one, the
    /// backend `openai` comes from `OPENAI_BASE_URL` / `OPENAI_API_KEY` / `OPENAI_MODEL`.
    pub fn with_config_file(mut self, path: impl AsRef<Path>) -> Result<Self, HostError> {
        let path = path.as_ref();
        self.config = HostConfig::load(path)?;
        self.config_dir = path
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(self)
    }

    /// Uses an already built host config; relative paths in it are relative to `dir`.
    pub fn with_config(mut self, config: HostConfig, dir: impl Into<PathBuf>) -> Self {
        self.config = config;
        self.config_dir = dir.into();
        self
    }

    /// Writes every LLM exchange to a replay transcript at `path`.
    pub fn with_recording(mut self, path: impl Into<PathBuf>) -> Self {
        self.record_to = Some(path.into());
        self
    }

    pub fn build(self) -> Result<Host, HostError> {
        let registry = match (self.registry, &self.registry_dir) {
            (Some(registry), _) => registry,
            (None, Some(dir)) => Registry::load_dir(dir)?,
            (None, None) => Registry::empty(),
        };
        log_problems(&registry);
        let cache_dir = if self.disk_cache {
            self.cache_dir.or_else(default_cache_dir)
        } else {
            None
        };
        let options = RuntimeOptions {
            cache_dir,
            max_concurrent_tasks: self.max_concurrent_tasks,
            max_task_memory: self.max_task_memory,
        };
        let egress = EgressPolicy::from_config(&self.config.egress)
            .map_err(|e| ConfigError::new(&self.config_dir.join("quiver.toml"), "egress", e))?;
        let remote = RemoteOptions {
            auth: self.config.auth.clone(),
            egress,
        };
        let recorder = self.record_to.map(|path| Arc::new(Recorder::new(path)));
        let backends = Backends::from_config(&self.config, &self.config_dir, recorder)?;
        let runtime = Runtime::new(options, abi::add_to_linker)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        Ok(Host {
            inner: Arc::new(HostInner {
                runtime,
                registry: RwLock::new(Arc::new(registry)),
                registry_dir: self.registry_dir,
                pool: Arc::new(McpPool::with_remote(
                    self.tools_cache_ttl,
                    self.connect_timeout,
                    remote,
                )),
                backends: Arc::new(backends),
            }),
        })
    }
}

fn log_problems(registry: &Registry) {
    for problem in registry.problems() {
        match problem.severity {
            Severity::Error => tracing::error!("registry: {problem}"),
            Severity::Warning => tracing::warn!("registry: {problem}"),
        }
    }
    tracing::debug!(
        revision = registry.revision(),
        servers = registry.servers().count(),
        "registry loaded"
    );
}

struct HostInner {
    runtime: Runtime,
    registry: RwLock<Arc<Registry>>,
    registry_dir: Option<PathBuf>,
    pool: Arc<McpPool>,
    backends: Arc<Backends>,
}

/// A runtime for many concurrent tasks. Clones share everything.
#[derive(Clone)]
pub struct Host {
    inner: Arc<HostInner>,
}

/// A guest module compiled and linked for this host; cheap to clone and reuse.
#[derive(Clone)]
pub struct GuestModule {
    pre: InstancePre<TaskState>,
    origin: ModuleOrigin,
    name: String,
}

impl GuestModule {
    /// Where the compiled code came from (compiled now, disk cache, memory cache).
    pub fn origin(&self) -> ModuleOrigin {
        self.origin
    }

    /// The name guests see as argv[0].
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a task ended without a normal exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskFailure {
    /// The guest trapped (including a memory-limit trap); the message has the backtrace.
    Trap(String),
    /// The task's wall-clock deadline passed.
    Deadline(Duration),
}

impl std::fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskFailure::Trap(message) => write!(f, "the guest trapped: {message}"),
            TaskFailure::Deadline(after) => {
                write!(
                    f,
                    "the task's deadline of {} ms passed (limits.deadline_ms)",
                    after.as_millis()
                )
            }
        }
    }
}

/// How a task ended.
#[derive(Clone, Debug)]
pub struct TaskOutcome {
    /// The guest's exit status; 124 after a deadline and 134 after a trap, as shells do.
    pub exit_code: i32,
    pub failure: Option<TaskFailure>,
    pub elapsed: Duration,
    /// Guest stdout/stderr when the task asked for capture, else empty.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl TaskOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == 0 && self.failure.is_none()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl Host {
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// The current registry snapshot.
    pub fn registry(&self) -> Arc<Registry> {
        self.inner
            .registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the registry directory again. Running tasks keep the snapshot they started
    /// with; servers whose launch configuration changed get a new connection on next use.
    pub fn reload_registry(&self) -> Result<Arc<Registry>, HostError> {
        let Some(dir) = &self.inner.registry_dir else {
            return Ok(self.registry());
        };
        let fresh = Arc::new(Registry::load_dir(dir)?);
        log_problems(&fresh);
        *self
            .inner
            .registry
            .write()
            .unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// The MCP connection pool shared by all tasks.
    pub fn pool(&self) -> &Arc<McpPool> {
        &self.inner.pool
    }

    /// Compiles (or loads from cache) a module file.
    pub fn load_module_file(&self, path: impl AsRef<Path>) -> Result<GuestModule, HostError> {
        let path = path.as_ref();
        let module_error = |message: String| HostError::Module {
            path: path.display().to_string(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| module_error(e.to_string()))?;
        let name = path
            .file_name()
            .map_or_else(|| "guest.wasm".into(), |n| n.to_string_lossy().into_owned());
        self.load_module(&name, &bytes).map_err(|e| match e {
            HostError::Module { message, .. } => module_error(message),
            other => other,
        })
    }

    /// Compiles (or loads from cache) module bytes, wasm or WAT; `name` becomes argv[0].
    pub fn load_module(&self, name: &str, bytes: &[u8]) -> Result<GuestModule, HostError> {
        let (pre, origin) = self
            .inner
            .runtime
            .prepare(bytes)
            .map_err(|e| HostError::Module {
                path: name.to_owned(),
                message: format!("{e:#}"),
            })?;
        tracing::debug!(module = name, ?origin, "module ready");
        Ok(GuestModule {
            pre,
            origin,
            name: name.to_owned(),
        })
    }

    /// Runs one task to completion. A guest failure is reported in the outcome; an error
    /// here means the task could not start.
    pub async fn run_task(
        &self,
        module: &GuestModule,
        task: &TaskSpec,
    ) -> Result<TaskOutcome, HostError> {
        let started = Instant::now();
        let setup_error = |message: String| HostError::TaskSetup {
            task_id: task.task_id.clone(),
            message,
        };
        let registry = self.registry();
        let mcp_policy = task_policy(task, &registry)?;
        for warning in mcp_policy.warnings() {
            tracing::warn!(task_id = %task.task_id, "{warning}");
        }
        let deadline_after = task.deadline();
        let deadline = tokio::time::Instant::now() + deadline_after;

        let mut wasi = WasiCtxBuilder::new();
        let mut argv = vec![module.name.clone()];
        argv.extend(task.args.iter().cloned());
        wasi.args(&argv);
        for (key, value) in &task.env {
            wasi.env(key, value);
        }
        for preopen in &task.preopens {
            let perms = if preopen.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            wasi.preopened_dir(&preopen.host, &preopen.guest, perms)
                .map_err(|e| {
                    setup_error(format!(
                        "preopens: cannot open {}: {e}",
                        preopen.host.display()
                    ))
                })?;
        }
        if task.inherit_stdin {
            wasi.inherit_stdin();
        }
        let captured = task.capture_output.then(|| {
            (
                MemoryOutputPipe::new(CAPTURE_LIMIT),
                MemoryOutputPipe::new(CAPTURE_LIMIT),
            )
        });
        match &captured {
            Some((out, err)) => {
                wasi.stdout(out.clone());
                wasi.stderr(err.clone());
            }
            None => {
                wasi.inherit_stdout();
                wasi.inherit_stderr();
            }
        }

        let memory_limit = task.memory_limit().min(self.inner.runtime.max_task_memory);
        let ctx = Arc::new(TaskContext {
            task_id: task.task_id.clone(),
            deadline,
            deadline_after,
            mcp_policy,
            registry,
            pool: self.inner.pool.clone(),
            backends: self.inner.backends.clone(),
        });
        let state = TaskState {
            wasi: wasi.build_p1(),
            limits: StoreLimitsBuilder::new()
                .memory_size(memory_limit as usize)
                .instances(1)
                .trap_on_grow_failure(true)
                .build(),
            fds: FdTable::new(task.max_fds()),
            memory: None,
            table: None,
            ctx,
        };
        let mut store = Store::new(self.inner.runtime.engine(), state);
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(1);
        let wall_deadline = Instant::now() + deadline_after;
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= wall_deadline {
                Err(wasmtime::Error::new(DeadlineExceeded {
                    after: deadline_after,
                }))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });

        let span = tracing::info_span!("task", task_id = %task.task_id);
        let entry = task.entry.as_deref().unwrap_or("_start");
        let instance = module
            .pre
            .instantiate_async(&mut store)
            .instrument(span.clone())
            .await
            .map_err(|e| setup_error(format!("cannot instantiate {}: {e:#}", module.name)))?;
        store.data_mut().memory = instance.get_memory(&mut store, "memory");
        store.data_mut().table = funcref_table(&instance, &mut store);
        let func = instance
            .get_typed_func::<(), ()>(&mut store, entry)
            .map_err(|e| {
                setup_error(format!(
                    "the module has no export `{entry}` of type () -> (): {e:#}"
                ))
            })?;
        // Epochs and hostcall races stop the task at its deadline; this outer bound only
        // matters if something between them never yields.
        let grace = defaults::EPOCH_TICK * 50;
        let run = func.call_async(&mut store, ()).instrument(span);
        let result = tokio::time::timeout_at(deadline + grace, run).await;
        let (exit_code, failure) = match result {
            Ok(Ok(())) => (0, None),
            Ok(Err(error)) => classify(error),
            Err(_) => (124, Some(TaskFailure::Deadline(deadline_after))),
        };
        let (stdout, stderr) = match captured {
            Some((out, err)) => (out.contents().to_vec(), err.contents().to_vec()),
            None => (Vec::new(), Vec::new()),
        };
        let outcome = TaskOutcome {
            exit_code,
            failure,
            elapsed: started.elapsed(),
            stdout,
            stderr,
        };
        match &outcome.failure {
            None => {
                tracing::info!(task_id = %task.task_id, exit_code, elapsed_ms = outcome.elapsed.as_millis() as u64, "task finished")
            }
            Some(failure) => {
                tracing::warn!(task_id = %task.task_id, exit_code, ?failure, "task failed")
            }
        }
        Ok(outcome)
    }

    /// The decision log of `task`: what its chat sessions start with (listing each server's
    /// tools, so servers may be started), what they may enable, and why everything else
    /// in the registry is left out.
    pub async fn explain_policy(&self, task: &TaskSpec) -> Result<PolicyReport, HostError> {
        let registry = self.registry();
        let policy = task_policy(task, &registry)?;
        let session = ChatSession::new(&policy);
        let tools = ToolSet::build(&session, &policy, &registry, &self.inner.pool).await;
        let offered = tools
            .servers
            .iter()
            .map(|server| {
                let prefix = format!("mcp__{server}__");
                let names = tools
                    .definitions
                    .iter()
                    .filter_map(|d| d["function"]["name"].as_str())
                    .filter(|name| name.starts_with(&prefix))
                    .map(str::to_owned)
                    .collect();
                (server.clone(), names)
            })
            .collect();
        let mut decisions = tools.decisions;
        let mut allowed_not_default = Vec::new();
        for entry in registry
            .servers()
            .filter(|e| !policy.default_server_ids.iter().any(|d| d == e.server_id()))
        {
            let requested = [entry.server_id().to_owned()];
            let single = policy::effective(&registry, &policy, &SessionRequest::single(&requested));
            match single.grant(entry.server_id()) {
                Some(_) => allowed_not_default.push(entry.server_id().to_owned()),
                None => decisions.extend(single.decisions),
            }
        }
        Ok(PolicyReport {
            task_id: task.task_id.clone(),
            registry_revision: registry.revision().to_owned(),
            warnings: policy.warnings(),
            task: policy,
            offered,
            allowed_not_default,
            decisions,
        })
    }

    /// Closes every MCP connection and ends every server process.
    pub async fn shutdown(&self) {
        self.inner.pool.shutdown().await;
    }
}

/// The task layer of MCP policy, with profiles resolved against `registry`.
fn task_policy(task: &TaskSpec, registry: &Registry) -> Result<TaskMcpPolicy, HostError> {
    let config = task.mcp_config()?;
    let policy = config.resolve(registry).map_err(|e| TaskError::Config {
        key: e.key.into(),
        message: e.message,
    })?;
    Ok(policy)
}

/// The table guest tools are called through: `__indirect_function_table`, else `table`,
/// else the first exported table.
fn funcref_table(
    instance: &wasmtime::Instance,
    store: &mut Store<TaskState>,
) -> Option<wasmtime::Table> {
    for name in ["__indirect_function_table", "table"] {
        if let Some(table) = instance.get_table(&mut *store, name) {
            return Some(table);
        }
    }
    let exports: Vec<_> = instance
        .exports(&mut *store)
        .filter_map(|e| e.into_table())
        .collect();
    exports.into_iter().next()
}

fn classify(error: wasmtime::Error) -> (i32, Option<TaskFailure>) {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return (exit.0, None);
    }
    if let Some(deadline) = error.downcast_ref::<DeadlineExceeded>() {
        return (124, Some(TaskFailure::Deadline(deadline.after)));
    }
    (134, Some(TaskFailure::Trap(format!("{error:?}"))))
}
