//! [`HostBuilder`]: every option of a host with its default, and how the capabilities are
//! built from them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::admission::{Admission, BusyReason};
use super::config::HostConfig;
use super::task_state::{self, TaskState};
use super::{Host, HostInner, ReloadState};
use crate::approval::{Approvals, Approver};
use crate::chat::llm::{Backends, Recorder};
use crate::config::{ConfigError, ConfigOrigin};
use crate::defaults;
use crate::mcp::{
    AuthSet, DirGrantStore, EgressPolicy, GrantStore, LaunchRules, McpPool, PoolLimits,
    RemoteOptions, ServerState, UserAuthorizer,
};
use crate::observe::{AuditLog, LiveStatus, Metrics, Observers, ServerGauges, ToolObserver};
use crate::registry::{Registry, RegistryDirError, RegistryStore, ServerEntry, Severity};
use crate::sandbox::{
    GuestMemoryTotal, HostMemory, Runtime, RuntimeOptions, SandboxSetupError, default_cache_dir,
};
use crate::task::TaskError;

/// Why a guest module could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// Not a valid module, or one this host cannot link.
    #[error("{0:#}")]
    Compile(#[source] wasmtime::Error),
}

/// `": cause"`, or nothing when there is none.
fn cause_suffix(source: Option<&(dyn std::error::Error + Send + Sync)>) -> String {
    source.map(|e| format!(": {e}")).unwrap_or_default()
}

/// Something that stopped the host from starting or a task from starting.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Registry(#[from] RegistryDirError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The engine could not be built with these limits; `fix` names the settings.
    #[error("cannot set up the WebAssembly engine: {source:#} ({fix})")]
    Engine {
        fix: String,
        #[source]
        source: wasmtime::Error,
    },
    #[error("{path}: cannot load the guest module: {source}")]
    Module {
        path: String,
        #[source]
        source: ModuleError,
    },
    /// The task's sandbox could not be set up, or its module not instantiated.
    #[error("task `{task_id}`: {module}{source}")]
    TaskSetup {
        task_id: String,
        /// `"NAME: "` when the module was at fault, else empty.
        module: String,
        #[source]
        source: SandboxSetupError,
    },
    /// A registry reload found errors; the snapshot of `kept_revision` stays in force.
    #[error(
        "registry reload refused, revision {kept_revision} stays in force: {reason} (fix the file and reload again)"
    )]
    RegistryRejected {
        kept_revision: String,
        reason: String,
        /// The error that kept the registry from being read; `None` when it was read but
        /// held errors (`reason` lists them).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The registry cannot be watched or followed; `source` is the cause, if any.
    #[error("cannot watch the registry {dir}: {message}{}", cause_suffix(.source.as_deref()))]
    RegistryWatch {
        dir: String,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("cannot open the audit log {path}: {source} (pass a writable file to --audit-log)")]
    AuditLog {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The task was not started: every running slot was taken and the queue was full, or
    /// its wait for a slot or for room in the host's total of guest linear memory ran out.
    /// Nothing of the task ran; retrying later is safe.
    #[error(
        "task `{task_id}` cannot start, the host is busy: {reason} ({capacity} running slots, {queue_capacity} queue places); {}",
        .reason.fix()
    )]
    Busy {
        task_id: String,
        capacity: u32,
        queue_capacity: u32,
        reason: BusyReason,
    },
}

/// Where user grants go and who asks a person ([`HostBuilder::with_grant_store`],
/// [`HostBuilder::with_user_authorizer`]).
#[derive(Clone, Default)]
struct UserAuthSetup {
    grant_store: Option<Arc<dyn GrantStore>>,
    authorizer: Option<Arc<dyn UserAuthorizer>>,
}

impl std::fmt::Debug for UserAuthSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserAuthSetup")
            .field("grant_store", &self.grant_store.is_some())
            .field("authorizer", &self.authorizer.is_some())
            .finish()
    }
}

/// Builds a [`Host`]; every option has a sane default.
#[derive(Debug)]
#[must_use]
pub struct HostBuilder {
    registry_dir: Option<PathBuf>,
    registry: Option<Registry>,
    registry_store: Option<Arc<dyn RegistryStore>>,
    cache_dir: Option<PathBuf>,
    disk_cache: bool,
    max_concurrent_tasks: Option<u32>,
    task_queue_capacity: Option<u32>,
    task_queue_timeout: Option<Duration>,
    max_task_memory: u64,
    keep_resident: Option<usize>,
    task_host_memory: Option<u64>,
    host_memory_total: Option<u64>,
    guest_memory_total: Option<u64>,
    tools_cache_ttl: Duration,
    connect_timeout: Duration,
    config: HostConfig,
    config_origin: ConfigOrigin,
    record_to: Option<PathBuf>,
    max_concurrent_mcp_calls: Option<usize>,
    max_server_processes: Option<usize>,
    server_idle_timeout: Option<Duration>,
    prewarm: Option<Vec<String>>,
    user_auth: UserAuthSetup,
    observers: Observers,
    approvals: Approvals,
    max_metric_tool_series: usize,
    audit_log: Option<PathBuf>,
    launch_rules: Option<LaunchRules>,
    default_launch_rules: Option<LaunchRules>,
}

impl Default for HostBuilder {
    fn default() -> Self {
        Self {
            registry_dir: None,
            registry: None,
            registry_store: None,
            cache_dir: None,
            disk_cache: true,
            max_concurrent_tasks: None,
            task_queue_capacity: None,
            task_queue_timeout: None,
            max_task_memory: defaults::TASK_MEMORY_BYTES,
            keep_resident: None,
            task_host_memory: None,
            host_memory_total: None,
            guest_memory_total: None,
            tools_cache_ttl: defaults::TOOLS_CACHE_TTL,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            config: HostConfig::default(),
            config_origin: ConfigOrigin::in_code("."),
            record_to: None,
            max_concurrent_mcp_calls: None,
            max_server_processes: None,
            server_idle_timeout: None,
            prewarm: None,
            user_auth: UserAuthSetup::default(),
            observers: Observers::default(),
            approvals: Approvals::default(),
            max_metric_tool_series: defaults::MAX_METRIC_TOOL_SERIES,
            audit_log: None,
            launch_rules: None,
            default_launch_rules: None,
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

    /// Follows `store` for the registry: the host starts with no servers, degraded until
    /// [`Host::follow_store`] (called with [`Host::registry_store`]) has applied the
    /// store's first listing. Takes precedence over [`with_registry_dir`](Self::with_registry_dir).
    pub fn with_registry_store(mut self, store: Arc<dyn RegistryStore>) -> Self {
        self.registry_store = Some(store);
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

    /// Tasks that can run at once (instance slots reserved by the pooling allocator); more
    /// wait in the queue. Overrides `[tasks] max_concurrent` of the host config; default
    /// [`defaults::MAX_CONCURRENT_TASKS`].
    pub fn with_max_concurrent_tasks(mut self, tasks: u32) -> Self {
        self.max_concurrent_tasks = Some(tasks.max(1));
        self
    }

    /// Tasks that may wait for a running slot; one more is refused with
    /// [`HostError::Busy`], and 0 refuses every task that finds all slots taken. Overrides
    /// `[tasks] queue_capacity`; default [`defaults::TASK_QUEUE_CAPACITY`].
    pub fn with_task_queue_capacity(mut self, tasks: u32) -> Self {
        self.task_queue_capacity = Some(tasks);
        self
    }

    /// Longest wait in the queue before [`HostError::Busy`] (a task's own deadline bounds
    /// it too; the deadline itself starts when the task starts running). Overrides
    /// `[tasks] queue_timeout_ms`; default [`defaults::TASK_QUEUE_TIMEOUT`].
    pub fn with_task_queue_timeout(mut self, timeout: Duration) -> Self {
        self.task_queue_timeout = Some(timeout);
        self
    }

    /// The most linear memory any task may ask for; a task's own limit is capped by it.
    pub fn with_max_task_memory(mut self, bytes: u64) -> Self {
        self.max_task_memory = bytes;
        self
    }

    /// Bytes of each slot's fiber stack and linear memory reset in place when a task ends
    /// instead of given back to the kernel: faster task starts for up to this much memory
    /// kept per slot a task has used. Overrides `[tasks] keep_resident_bytes`; default
    /// [`defaults::TASK_KEEP_RESIDENT`]; 0 gives everything back.
    pub fn with_keep_resident(mut self, bytes: usize) -> Self {
        self.keep_resident = Some(bytes);
        self
    }

    /// The host memory budget of every task; a task's `limits.host_memory_bytes` may only
    /// lower it. Overrides `[tasks] host_memory_bytes`; default
    /// [`TASK_HOST_MEMORY_BYTES`](defaults::TASK_HOST_MEMORY_BYTES). 0 is taken as 1 (the
    /// config file rejects 0; a budget of nothing would fail every task's first hostcall).
    pub fn with_task_host_memory(mut self, bytes: u64) -> Self {
        self.task_host_memory = Some(bytes.max(1));
        self
    }

    /// Host memory all tasks may hold for their guests together; a charge that would pass
    /// it is `-ENOMEM` even when the task's own budget has room. Overrides
    /// `[tasks] host_memory_total_bytes`; default [`defaults::host_memory_total`] (half of
    /// the machine's memory).
    pub fn with_host_memory_total(mut self, bytes: u64) -> Self {
        self.host_memory_total = Some(bytes.max(1));
        self
    }

    /// Guest linear memory all running tasks may hold together. A task waits in the queue
    /// until its module's initial memory fits, and a `memory.grow` past the total traps
    /// the task. Overrides `[tasks] guest_memory_total_bytes`; default
    /// [`defaults::guest_memory_total`] (half of the machine's memory).
    pub fn with_guest_memory_total(mut self, bytes: u64) -> Self {
        self.guest_memory_total = Some(bytes);
        self
    }

    /// The longest a server's tools listing is reused, default 5 minutes
    /// ([`defaults::TOOLS_CACHE_TTL`]); a server's `ttlMs` only shortens it.
    pub fn with_tools_cache_ttl(mut self, ttl: Duration) -> Self {
        self.tools_cache_ttl = ttl;
        self
    }

    /// Time to start (or reach) an MCP server and finish its handshake, default 60 s; a
    /// registry record's `budgets.connect_timeout_ms` overrides it for that server.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reads LLM backends from a host config file (`quiver.toml`). Without one, the
    /// backend `openai` comes from `OPENAI_BASE_URL` / `OPENAI_API_KEY` / `OPENAI_MODEL`.
    pub fn with_config_file(mut self, path: impl AsRef<Path>) -> Result<Self, HostError> {
        let path = path.as_ref();
        self.config = HostConfig::load(path)?;
        self.config_origin = ConfigOrigin::file(path);
        Ok(self)
    }

    /// Uses an already built host config; relative paths in it are relative to `dir`.
    pub fn with_config(self, config: HostConfig, dir: impl Into<PathBuf>) -> Self {
        self.with_config_from(config, ConfigOrigin::in_code(dir))
    }

    /// Uses a host config read by a layer above (a node's file, with its own sections);
    /// errors name `origin.file`, relative paths resolve against `origin.dir`.
    pub fn with_config_from(mut self, config: HostConfig, origin: ConfigOrigin) -> Self {
        self.config = config;
        self.config_origin = origin;
        self
    }

    /// Writes every LLM exchange to a replay transcript at `path`.
    pub fn with_recording(mut self, path: impl Into<PathBuf>) -> Self {
        self.record_to = Some(path.into());
        self
    }

    /// MCP calls in flight at once across the host (default
    /// [`defaults::max_concurrent_mcp_calls`] of the task slots; overrides the host config's
    /// `mcp.max_concurrent_calls`). Waiting for one counts against a call's tool timeout.
    pub fn with_max_concurrent_mcp_calls(mut self, calls: usize) -> Self {
        self.max_concurrent_mcp_calls = Some(calls.max(1));
        self
    }

    /// Stdio MCP server processes running at once (default
    /// [`defaults::MAX_SERVER_PROCESSES`]; overrides `mcp.max_server_processes`). At the
    /// cap the least recently used idle server is stopped to start another.
    pub fn with_max_server_processes(mut self, processes: usize) -> Self {
        self.max_server_processes = Some(processes.max(1));
        self
    }

    /// How long a stdio server may go without a call before it is stopped; zero means
    /// never (default [`defaults::SERVER_IDLE_TIMEOUT`]; overrides
    /// `mcp.server_idle_timeout_ms`; a record's `stdio.idle_timeout_ms` overrides this).
    pub fn with_server_idle_timeout(mut self, idle: Duration) -> Self {
        self.server_idle_timeout = Some(idle);
        self
    }

    /// Starts these servers in the background when the host is built (inside a Tokio
    /// runtime), so the first call does not wait for them; overrides `mcp.prewarm`.
    /// Failures are logged, not fatal.
    pub fn with_prewarm<I, S>(mut self, server_ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.prewarm = Some(server_ids.into_iter().map(Into::into).collect());
        self
    }

    /// Adds an observer called around every tool call and on every policy denial of every
    /// task (see [`crate::observe`]); observers are called in the order added.
    pub fn with_tool_observer(mut self, observer: Arc<dyn ToolObserver>) -> Self {
        self.observers = self.observers.with(observer);
        self
    }

    /// Decides tool calls of servers whose `approval_policy` asks for approval (see
    /// [`crate::approval`]). Without one such calls are refused and their tools are not
    /// offered to models.
    /// It also answers the questions servers ask during a task's requests
    /// ([`Approver::elicit`]), unless [`Self::with_elicitor`] says who does.
    pub fn with_approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approvals = self.approvals.with_approver(approver);
        self
    }

    /// Who answers the questions servers ask during a task's requests (MCP elicitation)
    /// when the task's guest does not: `elicitor`'s [`Approver::elicit`] (its `ask` is never
    /// called), or nobody (`None`: every question is declined). By default the approver.
    pub fn with_elicitor(mut self, elicitor: Option<Arc<dyn Approver>>) -> Self {
        self.approvals = self.approvals.with_elicitor(elicitor);
        self
    }

    /// Keeps user authorizations (`kind = "oauth_authorization_code"` grants) in `store`;
    /// by default they are files under a registry directory's `.grants/`
    /// ([`DirGrantStore::in_registry`]), else in memory, ending with the host.
    pub fn with_grant_store(mut self, store: Arc<dyn GrantStore>) -> Self {
        self.user_auth.grant_store = Some(store);
        self
    }

    /// Lets a connection ask a person to authorize a server when its principal has no
    /// grant or the server wants more scopes. Without one, such a call fails with an error
    /// that says how to authorize ([`Host::authorize_server`]).
    pub fn with_user_authorizer(mut self, authorizer: Arc<dyn UserAuthorizer>) -> Self {
        self.user_auth.authorizer = Some(authorizer);
        self
    }

    /// Distinct tools per server id (guest tools counting as one more server) the
    /// tool-call metrics keep before counting the rest as `tool="_other"` (default
    /// [`defaults::MAX_METRIC_TOOL_SERIES`]).
    pub fn with_max_metric_tool_series(mut self, pairs: usize) -> Self {
        self.max_metric_tool_series = pairs;
        self
    }

    /// Writes one JSON line per tool call and per policy denial to `path` (see
    /// [`crate::observe::AuditLog`]): opened for appending at build, created with mode
    /// 0600. Added after the other observers.
    pub fn with_audit_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.audit_log = Some(path.into());
        self
    }

    /// What records may run and read, overriding `[mcp.launch]` of the host config
    /// ([`LaunchRules::unrestricted`] for any command and variable).
    pub fn with_launch_rules(mut self, rules: LaunchRules) -> Self {
        self.launch_rules = Some(rules);
        self
    }

    /// The launch rules when neither [`with_launch_rules`](Self::with_launch_rules) nor
    /// `[mcp.launch]` sets them. Without this, a host following a registry store allows
    /// no command and no variable ([`LaunchRules::default`]: others can write a store),
    /// and a host over a directory or an in-code registry allows any
    /// ([`LaunchRules::unrestricted`]: its operator writes it). `quiver serve` sets none
    /// allowed for every registry, since its admin API writes records.
    pub fn with_default_launch_rules(mut self, rules: LaunchRules) -> Self {
        self.default_launch_rules = Some(rules);
        self
    }

    /// The launch rules in force, by the order above; a bad `[mcp.launch]` names `file`.
    fn launch_rules(&self, file: &Path) -> Result<LaunchRules, ConfigError> {
        if let Some(rules) = &self.launch_rules {
            return Ok(rules.clone());
        }
        if let Some(config) = &self.config.mcp.launch {
            return LaunchRules::from_config(config)
                .map_err(|v| ConfigError::new(file, v.field, v.message));
        }
        Ok(match (&self.default_launch_rules, &self.registry_store) {
            (Some(rules), _) => rules.clone(),
            (None, Some(_)) => LaunchRules::default(),
            (None, None) => LaunchRules::unrestricted(),
        })
    }

    pub fn build(self) -> Result<Host, HostError> {
        let launch = self.launch_rules(&self.config_origin.file)?;
        let cache_dir = if self.disk_cache {
            self.cache_dir.or_else(default_cache_dir)
        } else {
            None
        };
        let tasks = &self.config.tasks;
        tasks.check().map_err(|(field, message)| {
            ConfigError::new(&self.config_origin.file, field, message)
        })?;
        let max_concurrent_tasks = self
            .max_concurrent_tasks
            .or(tasks.max_concurrent)
            .unwrap_or(defaults::MAX_CONCURRENT_TASKS);
        let admission = Admission::new(
            max_concurrent_tasks,
            self.task_queue_capacity
                .or(tasks.queue_capacity)
                .unwrap_or(defaults::TASK_QUEUE_CAPACITY),
            self.task_queue_timeout
                .or(tasks.queue_timeout_ms.map(Duration::from_millis))
                .unwrap_or(defaults::TASK_QUEUE_TIMEOUT)
                .min(defaults::TASK_DEADLINE_MAX),
            GuestMemoryTotal::new(
                self.guest_memory_total
                    .or(tasks.guest_memory_total_bytes)
                    .unwrap_or_else(defaults::guest_memory_total),
            ),
        );
        let options = RuntimeOptions {
            cache_dir,
            max_concurrent_tasks,
            max_task_memory: self.max_task_memory,
            keep_resident: self
                .keep_resident
                .or(tasks.keep_resident_bytes)
                .unwrap_or(defaults::TASK_KEEP_RESIDENT),
        };
        let file = &self.config_origin.file;
        let egress = EgressPolicy::from_config(&self.config.egress)
            .map_err(|e| ConfigError::new(file, "egress", e.to_string()).with_source(e))?;
        let mut auth = AuthSet::load(&self.config.auth, &self.config_origin.dir)
            .map_err(|e| e.in_file(file))?;
        // A registry directory keeps its grants beside its records.
        let grant_store = self.user_auth.grant_store.clone().or_else(|| {
            let dir = self.registry_dir.as_ref()?;
            Some(Arc::new(DirGrantStore::in_registry(dir)) as Arc<dyn GrantStore>)
        });
        if let Some(store) = grant_store {
            auth = auth.with_grant_store(store);
        }
        if let Some(authorizer) = self.user_auth.authorizer.clone() {
            auth = auth.with_authorizer(authorizer);
        }
        let remote = RemoteOptions {
            auth,
            egress,
            launch,
        };
        let mcp = &self.config.mcp;
        let limits = PoolLimits {
            max_concurrent_calls: self
                .max_concurrent_mcp_calls
                .or(mcp.max_concurrent_calls)
                .unwrap_or_else(|| defaults::max_concurrent_mcp_calls(max_concurrent_tasks)),
            max_server_processes: self
                .max_server_processes
                .or(mcp.max_server_processes)
                .unwrap_or(defaults::MAX_SERVER_PROCESSES),
            server_idle_timeout: self
                .server_idle_timeout
                .or(mcp.server_idle_timeout_ms.map(Duration::from_millis))
                .unwrap_or(defaults::SERVER_IDLE_TIMEOUT),
        };
        let prewarm = self.prewarm.unwrap_or_else(|| mcp.prewarm.clone());
        let pool = Arc::new(
            McpPool::with_remote(self.tools_cache_ttl, self.connect_timeout, remote)
                .with_limits(limits),
        );
        let (registry, source, waiting) =
            match (&self.registry_store, self.registry, &self.registry_dir) {
                (Some(store), _, _) => (
                    Registry::empty(),
                    store.describe(),
                    Some(format!(
                        "waiting for the first listing of {}",
                        store.describe()
                    )),
                ),
                (None, Some(registry), _) => (registry, "(in code)".to_owned(), None),
                (None, None, Some(dir)) => (
                    Registry::load_dir_under(
                        dir,
                        &|name: &str| std::env::var(name).ok(),
                        &*pool.rules(),
                    )?,
                    format!("dir:{}", dir.display()),
                    None,
                ),
                (None, None, None) => (Registry::empty(), "(in code)".to_owned(), None),
            };
        log_problems(&registry);
        let prewarm = prewarm_entries(&registry, &prewarm);
        let recorder = self.record_to.map(|path| Arc::new(Recorder::new(path)));
        let backends = Backends::from_config(
            self.config.default_backend.as_deref(),
            &self.config.backends,
            &self.config_origin,
            recorder,
        )?;
        let principals = self
            .config
            .principal_rules()
            .map_err(|e| ConfigError::new(file, e.field, e.message))?
            .map(Arc::new);
        let metrics = Metrics::new(
            self.max_metric_tool_series,
            principals
                .as_ref()
                .map(|rules| rules.names().map(str::to_owned).collect()),
        );
        metrics.registry_loaded(registry.revision());
        let runtime = Runtime::<TaskState>::new(options, task_state::add_to_linker).map_err(|e| {
            HostError::Engine {
                fix: format!(
                    "with {max_concurrent_tasks} task slots of up to {} bytes of linear memory each: HostBuilder::with_max_concurrent_tasks or [tasks] max_concurrent, and with_max_task_memory",
                    self.max_task_memory
                ),
                source: e,
            }
        })?;
        let audit = self
            .audit_log
            .as_deref()
            .map(|path| {
                AuditLog::open(path)
                    .map(Arc::new)
                    .map_err(|source| HostError::AuditLog {
                        path: path.display().to_string(),
                        source,
                    })
            })
            .transpose()?;
        let observers = match &audit {
            Some(audit) => self.observers.with(audit.clone()),
            None => self.observers,
        };
        let host = Host {
            inner: Arc::new(HostInner {
                runtime,
                admission,
                reload: ReloadState::new(&registry, source, waiting),
                registry: RwLock::new(Arc::new(registry)),
                registry_dir: self
                    .registry_store
                    .is_none()
                    .then_some(self.registry_dir)
                    .flatten(),
                registry_store: self.registry_store,
                store_sync: tokio::sync::Mutex::new(()),
                task_host_memory: self
                    .task_host_memory
                    .or(tasks.host_memory_bytes)
                    .unwrap_or(defaults::TASK_HOST_MEMORY_BYTES),
                guest_tool_stacks: Arc::new(tokio::sync::Semaphore::new(
                    defaults::guest_tool_stacks(max_concurrent_tasks) as usize,
                )),
                host_memory: HostMemory::new(
                    self.host_memory_total
                        .or(tasks.host_memory_total_bytes)
                        .unwrap_or_else(defaults::host_memory_total),
                ),
                pool,
                backends: Arc::new(backends),
                approvals: self.approvals,
                // The metrics see every event first, whatever an embedder's observer does.
                observers: observers.preceded_by(Arc::new(metrics.clone())),
                metrics,
                audit,
                principals,
            }),
        };
        let weak = Arc::downgrade(&host.inner);
        host.inner.metrics.watch(Box::new(move || {
            let host = Host {
                inner: weak.upgrade()?,
            };
            let tasks = host.inner.admission.status();
            let servers = host.mcp_servers().into_iter().map(|server| ServerGauges {
                up: matches!(server.state, ServerState::Connected | ServerState::Degraded),
                connections: server.connections,
                reconnects: server.reconnects,
                server_id: server.server_id,
            });
            Some(LiveStatus {
                servers: servers.collect(),
                tasks_running: tasks.running,
                tasks_queued: tasks.queued,
                guest_memory: host.inner.admission.guest_memory().status(),
                registry_degraded: host.registry_health().degraded,
            })
        }));
        // Only once nothing can fail any more: a failed build starts no server.
        start_prewarm(&host.inner.pool, prewarm);
        Ok(host)
    }
}

/// The registry entries of `server_ids` (unknown ids are logged).
fn prewarm_entries(registry: &Registry, server_ids: &[String]) -> Vec<Arc<ServerEntry>> {
    let mut entries = Vec::new();
    for id in server_ids {
        match registry.get(id) {
            Some(entry) => entries.push(entry.clone()),
            None => {
                tracing::warn!(server_id = %id, "cannot pre-warm: no such server in the registry")
            }
        }
    }
    entries
}

/// Starts `entries`' servers in the background; a missing runtime is logged.
fn start_prewarm(pool: &Arc<McpPool>, entries: Vec<Arc<ServerEntry>>) {
    if entries.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let pool = pool.clone();
            runtime.spawn(async move { pool.prewarm(&entries).await });
        }
        Err(_) => tracing::warn!(
            servers = ?entries.iter().map(|e| e.server_id()).collect::<Vec<_>>(),
            "cannot pre-warm MCP servers: the host was built outside a Tokio runtime"
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every config error found when the host is built names the file it came from, not a
    /// guessed `quiver.toml` or a placeholder.
    #[test]
    fn config_errors_name_the_real_file() {
        let dir = std::env::temp_dir().join(format!("quiver-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text, field) in [
            (
                "node-a.toml",
                "[backends.r]\nkind = \"replay\"\n",
                "backends.r.transcript",
            ),
            (
                "node-b.toml",
                "default_backend = \"nope\"\n[backends.r]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\n",
                "default_backend",
            ),
            (
                "node-c.toml",
                "[backends.r]\nkind = \"openai\"\nbase_url = \"ftp://x\"\n",
                "backends.r.base_url",
            ),
            (
                "node-c2.toml",
                "[backends.r]\nkind = \"openai\"\nbase_url = \"http://bad host\"\n",
                "backends.r.base_url",
            ),
            (
                "node-d.toml",
                "[tasks]\nmax_concurrent = 0\n",
                "tasks.max_concurrent",
            ),
            (
                "node-e.toml",
                "[tasks]\nqueue_timeout_ms = 0\n",
                "tasks.queue_timeout_ms",
            ),
            ("node-f.toml", "[tasks]\nqueue_size = 8\n", "queue_size"),
            (
                "node-h.toml",
                "[tasks]\nhost_memory_total_bytes = 0\n",
                "tasks.host_memory_total_bytes",
            ),
            (
                "node-g.toml",
                "[tasks]\nhost_memory_bytes = 0\n",
                "tasks.host_memory_bytes",
            ),
            (
                "node-i.toml",
                "[tasks]\nguest_memory_total_bytes = 65536\n",
                "tasks.guest_memory_total_bytes",
            ),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let error = Host::builder()
                .without_disk_cache()
                .with_config_file(&path)
                .and_then(HostBuilder::build)
                .err()
                .unwrap_or_else(|| panic!("{name} was accepted"));
            let message = error.to_string();
            assert!(
                message.contains(&path.display().to_string()) && message.contains(field),
                "{name}: {message}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `[tasks]` of the host config sizes admission control; a `HostBuilder` option set in
    /// code wins over the file, and what is set in neither takes its default.
    #[test]
    fn tasks_config_sizes_admission_and_builder_options_win() {
        let text = "[tasks]\nmax_concurrent = 3\nqueue_capacity = 7\nqueue_timeout_ms = 1234\n";
        let config: HostConfig = toml::from_str(text).unwrap();
        let status =
            |builder: HostBuilder| builder.without_disk_cache().build().unwrap().status().tasks;
        let from_file = status(Host::builder().with_config(config.clone(), "."));
        assert_eq!(
            (
                from_file.capacity,
                from_file.queue_capacity,
                from_file.queue_timeout_ms
            ),
            (3, 7, 1234)
        );
        let overridden = status(
            Host::builder()
                .with_config(config, ".")
                .with_max_concurrent_tasks(5)
                .with_task_queue_capacity(0),
        );
        assert_eq!(
            (
                overridden.capacity,
                overridden.queue_capacity,
                overridden.queue_timeout_ms
            ),
            (5, 0, 1234)
        );
        let defaults = status(Host::builder());
        assert_eq!(defaults.capacity, defaults::MAX_CONCURRENT_TASKS);
        assert_eq!(defaults.queue_capacity, defaults::TASK_QUEUE_CAPACITY);
        assert_eq!(
            u128::from(defaults.queue_timeout_ms),
            defaults::TASK_QUEUE_TIMEOUT.as_millis()
        );
        assert_eq!((defaults.running, defaults.queued), (0, 0));
    }

    /// The host-wide MCP call cap follows the slots unless set: a cap below them made
    /// the tasks past it wait in waves (BENCHMARKS.md, 10 000 tasks).
    #[test]
    fn the_mcp_call_cap_follows_the_task_slots_unless_set() {
        let cap = |builder: HostBuilder| {
            builder
                .without_disk_cache()
                .build()
                .unwrap()
                .inner
                .pool
                .limits()
                .max_concurrent_calls
        };
        assert_eq!(cap(Host::builder().with_max_concurrent_tasks(2000)), 8000);
        assert_eq!(
            cap(Host::builder().with_max_concurrent_tasks(10)),
            defaults::MAX_CONCURRENT_MCP_CALLS
        );
        assert_eq!(
            cap(Host::builder()
                .with_max_concurrent_tasks(2000)
                .with_max_concurrent_mcp_calls(7)),
            7
        );
    }

    #[test]
    fn tasks_config_sets_the_host_memory_budget_and_the_builder_wins() {
        let config: HostConfig = toml::from_str("[tasks]\nhost_memory_bytes = 4096\n").unwrap();
        let budget = |builder: HostBuilder| {
            builder
                .without_disk_cache()
                .build()
                .unwrap()
                .inner
                .task_host_memory
        };
        assert_eq!(
            budget(Host::builder().with_config(config.clone(), ".")),
            4096
        );
        assert_eq!(
            budget(
                Host::builder()
                    .with_config(config, ".")
                    .with_task_host_memory(8192)
            ),
            8192
        );
        assert_eq!(budget(Host::builder()), defaults::TASK_HOST_MEMORY_BYTES);
        // The config file rejects 0; the builder takes it as the smallest budget.
        assert_eq!(budget(Host::builder().with_task_host_memory(0)), 1);
    }

    /// `[tasks] guest_memory_total_bytes` sets the host's total of guest linear memory, the
    /// builder wins, and the default is the machine's half.
    #[test]
    fn the_guest_memory_total_comes_from_the_file_or_the_builder() {
        let config: HostConfig =
            toml::from_str("[tasks]\nguest_memory_total_bytes = 67108864\n").unwrap();
        let total = |builder: HostBuilder| {
            builder
                .without_disk_cache()
                .build()
                .unwrap()
                .status()
                .guest_memory
        };
        let from_file = total(Host::builder().with_config(config.clone(), "."));
        assert_eq!((from_file.limit_bytes, from_file.used_bytes), (64 << 20, 0));
        let overridden = total(
            Host::builder()
                .with_config(config, ".")
                .with_guest_memory_total(32 << 20),
        );
        assert_eq!(overridden.limit_bytes, 32 << 20);
        assert_eq!(
            total(Host::builder()).limit_bytes,
            defaults::guest_memory_total()
        );
    }
}
