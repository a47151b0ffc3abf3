//! Quiver: a WebAssembly host runtime that gives sandboxed workloads MCP tools (and, later,
//! an LLM).
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
//! Data flows one way through the modules: a hostcall enters at [`abi`](crate::abi), meets
//! the fd table, the MCP session, the [`policy`] and the MCP pool, in that order.

mod abi;
mod chat;
pub mod defaults;
mod fd;
mod host;
pub mod llm;
pub mod mcp;
pub mod policy;
pub mod registry;
mod runtime;
pub mod task;
pub mod telemetry;

pub use abi::Errno;
pub use host::{GuestModule, Host, HostBuilder, ModuleOrigin, TaskFailure, TaskOutcome};
pub use task::{TaskError, TaskSpec};
