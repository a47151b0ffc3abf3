//! The [`Host`]: what an embedding scheduler (or the CLI) builds once and runs tasks on.
//!
//! A host only composes: the sandbox's runtime (engine, module cache), the registry
//! snapshot, the MCP capability (its pool) and the chat capability (its backends). Tasks
//! share those and nothing else: each gets a fresh store with its own sandbox (fd table,
//! WASI context, memory limit, deadline) and its own capability state, so one task
//! trapping, looping or timing out ends that task alone. Admission control
//! ([`admission`]) caps how many run at once and what their linear memories hold together;
//! the rest wait in a bounded queue.

mod admission;
mod builder;
mod call;
mod config;
mod probe;
mod reload;
mod sync;
mod task_state;
#[cfg(feature = "watch")]
mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::{InstancePre, Store};

use crate::approval::Approvals;
use crate::chat::llm::Backends;
use crate::chat::tools::ToolSet;
use crate::chat::{ChatSession, ChatTask};
use crate::defaults;
use crate::mcp::{McpPool, McpTask, PoolLimits, PoolUsage, ServerStatus};
use crate::observe::{AuditLog, Metrics, Observers};
use crate::policy::{self, PolicyReport, PrincipalRules, SessionRequest};
use crate::registry::{Registry, RegistryStore};
use crate::sandbox::{
    CapturedOutput, GuestMemoryHold, HostMemory, MemoryBudget, Runtime, Sandbox, SandboxSetupError,
};
pub use crate::sandbox::{
    GuestMemoryExhausted, GuestMemoryStatus, HostMemoryStatus, HostMemoryUse, ModuleOrigin,
    TaskFailure,
};
use crate::task::{TaskError, TaskSpec};
use crate::text::cut;
use admission::Admission;
pub use admission::{BusyReason, TaskStatus};
pub use builder::{HostBuilder, HostError, ModuleError};
pub use call::{CallRefusal, ToolCallError, ToolCallRequest};
pub use config::{HostConfig, TasksConfig};
pub use probe::{PinStatus, PreviewError, ProbeReport, ToolPreview};
pub use reload::RegistryHealth;
use reload::ReloadState;
pub use sync::StoreFollower;
use task_state::TaskState;
#[cfg(feature = "watch")]
pub use watch::RegistryWatcher;

/// Bytes of a wasm page, the unit of `ResourcesRequired::max_initial_memory_size`.
const WASM_PAGE: u64 = 64 * 1024;

struct HostInner {
    runtime: Runtime<TaskState>,
    admission: Admission,
    registry: RwLock<Arc<Registry>>,
    registry_dir: Option<PathBuf>,
    registry_store: Option<Arc<dyn RegistryStore>>,
    /// One store listing-and-install at a time: a slow listing must not be installed over
    /// a newer one (a write's resync racing the follow loop).
    store_sync: tokio::sync::Mutex<()>,
    reload: ReloadState,
    task_host_memory: u64,
    host_memory: HostMemory,
    guest_tool_stacks: Arc<tokio::sync::Semaphore>,
    pool: Arc<McpPool>,
    backends: Arc<Backends>,
    observers: Observers,
    approvals: Approvals,
    metrics: Metrics,
    audit: Option<Arc<AuditLog>>,
    /// The host config's `[principals]`, the policy layer of every task's principal.
    principals: Option<Arc<PrincipalRules>>,
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
    /// `sha256:` and the hex SHA-256 of the module's bytes, as the node names modules.
    digest: Arc<str>,
    /// Linear memory instantiation needs, reserved from the host's total at admission.
    initial_memory: u64,
    /// Whether it imports from a `wasi…` module (the host links `wasi_snapshot_preview1`); a
    /// task of a module that does not gets no WASI context.
    imports_wasi: bool,
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

    /// `sha256:` and the hex SHA-256 of the module's bytes (on each task's span).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Bytes of compiled code and data this module keeps mapped (its wasmtime image).
    pub fn compiled_bytes(&self) -> u64 {
        let image = self.pre.module().image_range();
        u64::try_from(image.end.addr().saturating_sub(image.start.addr())).unwrap_or(u64::MAX)
    }
}

/// What a host is doing now; cheap to take (atomics and one lock over the MCP servers).
#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    pub tasks: TaskStatus,
    /// Host memory the running tasks hold for their guests, against the host's total.
    pub host_memory: HostMemoryStatus,
    /// Linear memory the running tasks' guests hold, against the host's total of it.
    pub guest_memory: GuestMemoryStatus,
    /// Every MCP server used so far, by id.
    pub mcp_servers: Vec<ServerStatus>,
}

/// Ends a task's user streams when its run is over or dropped ([`UserStreams::end`]).
struct StreamsEnd<'a>(Option<&'a crate::UserStreams>);

impl Drop for StreamsEnd<'_> {
    fn drop(&mut self) {
        if let Some(streams) = self.0 {
            streams.end();
        }
    }
}

/// Counts a task in `quiver_tasks_total` once it ends: with its outcome, or `cancelled`
/// when its future is dropped first.
struct TaskCounted<'a> {
    metrics: &'a Metrics,
    outcome: &'static str,
}

impl Drop for TaskCounted<'_> {
    fn drop(&mut self) {
        self.metrics.task_finished(self.outcome);
    }
}

/// The root span of `task`'s trace (docs/telemetry.md): who it acts for and which module,
/// continuing the caller's trace if the task names one; the outcome is recorded at the end.
fn task_span(module: &GuestModule, task: &TaskSpec) -> tracing::Span {
    let span = tracing::info_span!(
        "task",
        task_id = %task.task_id,
        quiver.principal = task.principal.as_deref(),
        quiver.client = task.client.as_deref(),
        quiver.module.name = cut(&module.name, defaults::MAX_SPAN_ATTRIBUTE_BYTES),
        quiver.module.digest = &*module.digest,
        quiver.task.outcome = tracing::field::Empty,
        process.exit.code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if let Some(parent) = &task.trace_parent {
        crate::trace::continue_from(&span, parent);
    }
    span
}

/// How a task ended.
#[derive(Clone, Debug)]
pub struct TaskOutcome {
    /// The guest's exit status; 124 after a deadline and 134 after a trap, as shells do.
    pub exit_code: i32,
    pub failure: Option<TaskFailure>,
    /// Time waited in the queue for a running slot; not part of the task's deadline.
    pub queued: Duration,
    /// Time from getting a running slot to the end.
    pub elapsed: Duration,
    /// Guest stdout/stderr when the task asked for capture, else empty.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The task's host memory budget and the most of it the task used.
    pub host_memory: HostMemoryUse,
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

    /// The store the host was built to follow ([`HostBuilder::with_registry_store`]).
    pub fn registry_store(&self) -> Option<Arc<dyn RegistryStore>> {
        self.inner.registry_store.clone()
    }

    /// The operator's rules every record is held to: launch rules (`[mcp.launch]`),
    /// egress (`[egress]`) and credential bindings (`[auth.*]`). A layer that writes
    /// records checks them with these first
    /// ([`check_changes_under`](crate::registry::check_changes_under)).
    pub fn record_rules(&self) -> Arc<dyn crate::registry::RecordRules> {
        self.inner.pool.rules()
    }

    /// The host-wide limits of MCP calls and server processes in force.
    pub fn mcp_limits(&self) -> &PoolLimits {
        self.inner.pool.limits()
    }

    /// How much of the host-wide MCP limits is in use now.
    pub fn mcp_usage(&self) -> PoolUsage {
        self.inner.pool.usage()
    }

    /// The host's Prometheus metrics (see [`crate::observe`]'s `Metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The health of every server of the current registry, in id order; a server never
    /// used is `idle` with nothing counted.
    pub fn mcp_servers(&self) -> Vec<ServerStatus> {
        self.registry()
            .servers()
            .map(|entry| self.inner.pool.server_status(entry.server_id()))
            .collect()
    }

    /// Task capacity and use, and the state of every MCP server.
    pub fn status(&self) -> HostStatus {
        HostStatus {
            tasks: self.inner.admission.status(),
            host_memory: self.inner.host_memory.status(),
            guest_memory: self.inner.admission.guest_memory().status(),
            mcp_servers: self.inner.pool.status(),
        }
    }

    /// Compiles (or loads from cache) a module file.
    pub fn load_module_file(&self, path: impl AsRef<Path>) -> Result<GuestModule, HostError> {
        let path = path.as_ref();
        let module_error = |source: ModuleError| HostError::Module {
            path: path.display().to_string(),
            source,
        };
        let bytes = std::fs::read(path).map_err(|e| module_error(ModuleError::Read(e)))?;
        let name = path
            .file_name()
            .map_or_else(|| "guest.wasm".into(), |n| n.to_string_lossy().into_owned());
        self.load_module(&name, &bytes).map_err(|e| match e {
            HostError::Module { source, .. } => module_error(source),
            other => other,
        })
    }

    /// Compiles (or loads from cache) module bytes, wasm or WAT; `name` becomes argv[0].
    /// The host keeps it for its life and writes it to the disk cache.
    pub fn load_module(&self, name: &str, bytes: &[u8]) -> Result<GuestModule, HostError> {
        self.load(name, bytes, true)
    }

    /// [`Host::load_module`] for a module from a client: the host neither keeps it nor
    /// writes it to the disk cache, so it is gone once the caller (the node's bounded
    /// module store) and its tasks drop it.
    pub fn load_module_uncached(&self, name: &str, bytes: &[u8]) -> Result<GuestModule, HostError> {
        self.load(name, bytes, false)
    }

    /// Modules the host keeps compiled in memory (what [`Host::load_module`] loaded).
    pub fn cached_modules(&self) -> usize {
        self.inner.runtime.cached_modules()
    }

    fn load(&self, name: &str, bytes: &[u8], cache: bool) -> Result<GuestModule, HostError> {
        let runtime = &self.inner.runtime;
        let prepared = if cache {
            runtime.prepare(bytes)
        } else {
            runtime.prepare_uncached(bytes)
        };
        let (pre, origin) = prepared.map_err(|e| HostError::Module {
            path: name.to_owned(),
            source: ModuleError::Compile(e),
        })?;
        tracing::debug!(module = name, ?origin, "module ready");
        let needs = pre.module().resources_required();
        let initial_memory = u64::from(needs.num_memories)
            .saturating_mul(needs.max_initial_memory_size.unwrap_or(0))
            .saturating_mul(WASM_PAGE);
        let imports_wasi = pre
            .module()
            .imports()
            .any(|import| import.module().starts_with("wasi"));
        let digest: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(GuestModule {
            pre,
            origin,
            name: name.to_owned(),
            digest: format!("sha256:{digest}").into(),
            initial_memory,
            imports_wasi,
        })
    }

    /// Runs one task to completion. A guest failure is reported in the outcome; an error
    /// here means the task could not start.
    ///
    /// When every running slot is taken, or running tasks leave no room in the host's total
    /// of guest linear memory for the module's initial memory, the task waits in the queue,
    /// at most the queue timeout and at most its own deadline, which starts only when it
    /// gets a slot; a full queue or a wait that runs out is [`HostError::Busy`]. Dropping
    /// the future gives its queue place, slot and memory back.
    ///
    /// Await it inside a tokio task (`tokio::spawn`), as `quiver run` and `quiver serve`
    /// do: on a `block_on` thread every MCP answer is read on a worker and handed over, one
    /// thread switch more per call (BENCHMARKS.md, issue 25).
    pub async fn run_task(
        &self,
        module: &GuestModule,
        task: &TaskSpec,
    ) -> Result<TaskOutcome, HostError> {
        self.run_task_reporting(module, task, || {}).await
    }

    /// [`Host::run_task`], calling `admitted` once the task leaves the queue for a running
    /// slot (the node reports `queued` and `running` apart). Every task is counted in the
    /// metrics here, by how it ended.
    pub async fn run_task_reporting(
        &self,
        module: &GuestModule,
        task: &TaskSpec,
        admitted: impl FnOnce(),
    ) -> Result<TaskOutcome, HostError> {
        let mut counted = TaskCounted {
            metrics: &self.inner.metrics,
            outcome: "cancelled",
        };
        // However the run ends, even before it bound the streams (refused, failed setup,
        // dropped in the queue), a client waiting on them learns that it ended.
        let _streams_end = StreamsEnd(task.user_streams.as_ref());
        let span = task_span(module, task);
        let result = self.run_admitted(module, task, admitted, &span).await;
        counted.outcome = match &result {
            Ok(outcome) => match outcome.failure {
                None if outcome.exit_code == 0 => "ok",
                None => "exit_nonzero",
                Some(TaskFailure::Trap(_)) => "trapped",
                Some(TaskFailure::Deadline(_)) => "deadline",
            },
            Err(HostError::Busy { .. }) => "busy",
            Err(_) => "setup_failed",
        };
        span.record("quiver.task.outcome", counted.outcome);
        if let Ok(outcome) = &result {
            span.record("process.exit.code", outcome.exit_code);
        }
        if counted.outcome != "ok" {
            span.record("otel.status_code", "error");
            span.record("error.type", counted.outcome);
        }
        result
    }

    async fn run_admitted(
        &self,
        module: &GuestModule,
        task: &TaskSpec,
        admitted: impl FnOnce(),
        span: &tracing::Span,
    ) -> Result<TaskOutcome, HostError> {
        let setup_error = |module: String, source| HostError::TaskSetup {
            task_id: task.task_id.clone(),
            module,
            source,
        };
        let host_memory_limit = task.host_memory_limit(self.inner.task_host_memory);
        let budget = MemoryBudget::within(
            Arc::from(task.task_id.as_str()),
            host_memory_limit,
            &self.inner.host_memory,
        );
        let mcp = Arc::new(self.mcp_task(task, &budget)?);
        for warning in mcp.policy.warnings() {
            tracing::warn!(task_id = %task.task_id, "{warning}");
        }
        let arrived = Instant::now();
        let admission = &self.inner.admission;
        let held = admission
            .admit(task.deadline(), module.initial_memory)
            .await
            .map_err(|reason| {
                let status = admission.status();
                tracing::warn!(task_id = %task.task_id, %reason, "host busy, task refused");
                HostError::Busy {
                    task_id: task.task_id.clone(),
                    capacity: status.capacity,
                    queue_capacity: status.queue_capacity,
                    reason,
                }
            })?;
        admitted();
        let started = Instant::now();
        let (store, captured) = self
            .task_store(task, module, held.guest_memory.clone(), &budget, mcp)
            .map_err(|e| setup_error(String::new(), e))?;
        let entry = task.entry.as_deref().unwrap_or("_start");
        let work = store.data().sandbox.work.clone();
        let run = self
            .inner
            .runtime
            .run(&module.pre, store, entry, span.clone())
            .await;
        // The store is gone, with the fds that owned the task's background work.
        if !work.drained(crate::defaults::TASK_WORK_DRAIN).await {
            tracing::warn!(task_id = %task.task_id, "work the task started was still running when it ended");
        }
        let run = run.map_err(|e| setup_error(format!("{}: ", module.name), e))?;
        let (stdout, stderr) = captured.map(|c| c.take()).unwrap_or_default();
        let outcome = TaskOutcome {
            exit_code: run.exit_code,
            failure: run.failure,
            queued: started.duration_since(arrived),
            elapsed: started.elapsed(),
            stdout,
            stderr,
            host_memory: budget.usage(),
        };
        if outcome.host_memory.unreleased_bytes > 0 {
            tracing::error!(task_id = %task.task_id, unreleased = outcome.host_memory.unreleased_bytes, "host memory still charged after the task ended");
        }
        let exit_code = outcome.exit_code;
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

    /// The store `task` runs in, with its sandbox and each capability's state, and its
    /// captured output. Not async: what it builds goes straight into the store, never into
    /// the task's future.
    fn task_store(
        &self,
        task: &TaskSpec,
        module: &GuestModule,
        guest_memory: GuestMemoryHold,
        budget: &MemoryBudget,
        mcp: Arc<McpTask>,
    ) -> Result<(Store<TaskState>, Option<CapturedOutput>), SandboxSetupError> {
        let memory_limit = task.memory_limit().min(self.inner.runtime.max_task_memory);
        let (sandbox, captured) = Sandbox::for_task(
            &task.grants(),
            &module.name,
            module.imports_wasi,
            memory_limit,
            guest_memory,
            budget.clone(),
        )?;
        let streams = task.user_streams.as_ref().and_then(|streams| {
            let bound = streams.bind(sandbox.work.signal().clone(), budget.clone());
            if bound.is_none() {
                tracing::warn!(task_id = %task.task_id, "the task's user streams belong to another task run; its guest gets -ENOTCONN");
            }
            bound
        });
        let state = TaskState {
            sandbox,
            streams,
            mcp,
            chat: Arc::new(ChatTask {
                backends: self.inner.backends.clone(),
                guest_tool_stacks: self.inner.guest_tool_stacks.clone(),
                metrics: self.inner.metrics.clone(),
                last_tool: Default::default(),
                tool_cache: Default::default(),
            }),
        };
        Ok((self.inner.runtime.store(state), captured))
    }

    /// The decision log of `task`: what its chat sessions start with (listing each server's
    /// tools, so servers may be started), what they may enable, and why everything else
    /// in the registry is left out.
    pub async fn explain_policy(&self, task: &TaskSpec) -> Result<PolicyReport, HostError> {
        let mcp = self.mcp_task(task, &MemoryBudget::unlimited())?;
        let session = ChatSession::new(&mcp.policy, &MemoryBudget::unlimited());
        let tools = ToolSet::build(&session, &mcp, None).await;
        let McpTask {
            policy, registry, ..
        } = mcp;
        let offered = tools
            .servers()
            .iter()
            .map(|server| (server.clone(), tools.offered_for(server)))
            .collect();
        let mut decisions = tools.decisions().to_vec();
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

    /// The MCP side of `task`: the current registry snapshot, the task layer of policy
    /// resolved against it (profiles applied), and the pool; `budget` holds what its
    /// servers' sampling requests get back.
    fn mcp_task(&self, task: &TaskSpec, budget: &MemoryBudget) -> Result<McpTask, TaskError> {
        // An embedder's principal is checked as a node's or the CLI's is.
        for (field, name) in [("principal", &task.principal), ("client", &task.client)] {
            if let Some(name) = name {
                crate::identity::check_principal(name)
                    .map_err(|message| TaskError::Field { field, message })?;
            }
        }
        let registry = self.registry();
        let principal = self
            .inner
            .principals
            .as_ref()
            .map(|rules| rules.layer(task.principal.as_deref()));
        let policy = task
            .mcp_config()?
            .resolve_for(&registry, principal)
            .map_err(|e| TaskError::Config {
                key: e.key.into(),
                message: e.message,
                source: None,
            })?;
        Ok(McpTask {
            policy,
            registry,
            pool: self.inner.pool.clone(),
            observers: self
                .inner
                .observers
                .for_principal(task.principal.as_deref(), task.client.as_deref()),
            approvals: self.inner.approvals.clone(),
            in_flight: Default::default(),
            sampler: Arc::new(crate::chat::Sampler::new(
                self.inner.backends.clone(),
                self.inner.metrics.clone(),
                task.sampling_max_tokens()?,
                budget.clone(),
            )),
            guest_callbacks: self.inner.guest_tool_stacks.clone(),
            roots: task.roots.clone().into(),
            _subject: task.subject_token.clone().map(|token| {
                self.inner
                    .pool
                    .rules()
                    .auth
                    .register_subject(task.principal.as_deref(), token)
            }),
        })
    }

    /// Closes every MCP connection, ends every server process and writes out the audit
    /// log (within [`defaults::AUDIT_FLUSH_TIMEOUT`](crate::defaults::AUDIT_FLUSH_TIMEOUT)).
    pub async fn shutdown(&self) {
        self.inner.pool.shutdown().await;
        if let Some(audit) = self.inner.audit.clone() {
            // The writer thread does the writing; waiting for it must not hold a runtime
            // worker.
            let flushed = tokio::task::spawn_blocking(move || audit.flush()).await;
            if !matches!(flushed, Ok(true)) {
                tracing::warn!("the audit log was not written out in time at shutdown");
            }
        }
    }
}
