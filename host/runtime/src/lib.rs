//! Quiver: a WebAssembly host runtime that gives sandboxed workloads an LLM and MCP tools.
//!
//! Guests are `wasm32-wasip1` modules. They reach the host through fd-based hostcalls in the
//! `spear` import module (see `docs/abi.md`); the host owns every connection, credential and
//! policy decision, so a guest can only use what the registry, its task and its session allow.
//!
//! The crate is a library first. An embedding scheduler builds one [`Host`] and runs many
//! tasks on it concurrently; the `quiver` binary is a thin command line over the same API.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use quiver::{Host, TaskSpec};
//!
//! let host = Host::builder().with_registry_dir("fixtures/registry").build()?;
//! let module = host.load_module_file("mcp-explorer.wasm")?;
//! let task = TaskSpec::from_file("fixtures/tasks/explorer.json")?;
//! let outcome = host.run_task(&module, &task).await?;
//! println!("guest exited with {}", outcome.exit_code);
//! host.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The crate is shaped as capabilities composed by the [`Host`] (see
//! `docs/architecture.md`): the [`sandbox`] (engine, store, limits, fd table, WASI), the
//! [`mcp`] capability (pool, transports, `mcp_*` hostcalls) and the [`chat`] capability
//! (sessions, the tool-call loop, LLM backends, `cchat_*` hostcalls). The [`registry`] and
//! the pure [`policy`] are what the capabilities decide with; a call policy marks as needing
//! approval waits for the embedder's [`approval::Approver`]. A hostcall enters at its
//! capability's glue, meets that capability's task state, its one policy decision, then its
//! shared services, and its answer walks back the same way.

pub mod approval;
pub mod chat;
pub mod config;
pub mod defaults;
mod host;
pub mod mcp;
pub mod observe;
pub mod policy;
pub mod registry;
pub mod sandbox;
pub mod task;
pub mod telemetry;
pub mod text;

pub use chat::llm;
pub use host::{
    BusyReason, GuestModule, Host, HostBuilder, HostConfig, HostError, HostMemoryStatus,
    HostMemoryUse, HostStatus, ModuleOrigin, PreviewError, ProbeReport, RegistryHealth,
    RegistryWatcher, StoreFollower, TaskFailure, TaskOutcome, TaskStatus, TasksConfig, ToolPreview,
};
pub use quiver_abi::Errno;
pub use task::{GuestLogs, TaskError, TaskSpec};
