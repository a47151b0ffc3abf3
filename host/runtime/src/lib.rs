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
//! Inside, the crate is capabilities composed by the [`Host`] (see `docs/architecture.md`):
//! the sandbox (engine, store, limits, fd table, WASI), the MCP capability (pool,
//! transports, `mcp_*` hostcalls) and the chat capability (sessions, the tool-call loop, LLM
//! backends, `cchat_*` hostcalls); the [`registry`] and the pure policy are what they decide
//! with. Those modules are private: everything an embedder uses is re-exported here, so
//! what is public is what is supported. A call policy marks as needing approval waits for
//! the embedder's [`Approver`]; every tool call and denial reaches the [`ToolObserver`]s.
//!
//! What an embedder finds here:
//! - running tasks: [`Host`], [`HostBuilder`], [`TaskSpec`], [`TaskOutcome`], [`HostError`];
//! - deciding and watching calls: [`Approver`], [`ApprovalQueue`], [`ToolObserver`] and its
//!   events, [`Metrics`], [`AuditLog`];
//! - the registry: [`registry`] (records, [`registry::RegistryStore`], the directory store);
//! - configuration: [`HostConfig`] and its sections, [`config`], [`llm`], [`defaults`];
//! - reading JSON from outside the host: [`json`];
//! - status: [`HostStatus`], [`ServerStatus`], [`RegistryHealth`], [`ProbeReport`].
//!
//! Cargo features: `watch` (on by default) reloads a registry directory on file events
//! (`Host::watch_registry`, on `notify`); without it a directory store is polled.

mod approval;
mod cause;
mod chat;
pub mod config;
pub mod defaults;
mod host;
mod identity;
pub mod json;
mod mcp;
mod observe;
mod policy;
pub mod registry;
mod sandbox;
mod stream;
mod sync;
mod task;
pub mod telemetry;
pub mod text;
mod trace;

/// LLM backends as `quiver.toml` names them (`[backends.NAME]`).
pub mod llm {
    pub use crate::chat::llm::{BackendConfig, BackendKind};
}

pub use approval::{
    AcceptDefaults, AllowAll, ApprovalDecision, ApprovalError, ApprovalFuture, ApprovalQueue,
    ApprovalRequest, Approver, DenyAll, ElicitationAnswer, ElicitationFuture, ElicitationRequest,
    TerminalApprover,
};
pub use cause::Cause;
#[cfg(feature = "watch")]
pub use host::RegistryWatcher;
pub use host::{
    BusyReason, CallRefusal, GuestMemoryExhausted, GuestMemoryStatus, GuestModule, Host,
    HostBuilder, HostConfig, HostError, HostMemoryStatus, HostMemoryUse, HostStatus, ModuleError,
    ModuleOrigin, PinStatus, PreviewError, ProbeReport, RegistryHealth, StoreFollower, TaskFailure,
    TaskOutcome, TaskStatus, TasksConfig, ToolCallError, ToolCallRequest, ToolPreview,
};
/// What a task is charged against its host memory budget for a JSON text its guest hands
/// the host (the parsed value's size, computed without parsing), for sizing
/// `limits.host_memory_bytes`; an error for text that is not JSON.
pub use sandbox::heap::json_text as json_charge;

pub use identity::check_principal;
pub use mcp::{
    ApiKeyConfig, AuthConfig, AuthorizationPrompt, AuthorizeError, DirGrantStore, EgressConfig,
    Grant, GrantKey, GrantStatus, GrantStore, GrantStoreError, LaunchConfig, LaunchRules, McpError,
    McpErrorCode, McpHostConfig, MemoryGrantStore, OAuthAuthorizationCodeConfig,
    OAuthClientCredentialsConfig, OAuthEnterpriseManagedConfig, OAuthJwtBearerConfig,
    OAuthTokenExchangeConfig, PoolLimits, PoolUsage, REGISTRY_GRANTS_DIR, Registration,
    ServerState, ServerStatus, SigningAlg, SubjectToken, SubjectTokenError, TokenEndpointAuth,
    TokenType, Tool, ToolCallOutput, UserAuthorizer, ensure_tls_provider,
};
pub use observe::{
    ApprovalDecided, ArgumentsSummary, AuditLog, InputAnswered, InputRound, McpTaskStatus, Metrics,
    PinChange, PinsChanged, PolicyDenial, SamplingDone, ToolCall, ToolCallEnd, ToolKind,
    ToolObserver, ToolOutcome, Via,
};
pub use policy::{Layer, Pattern, PolicyReport, PrincipalConfig, Reason};
pub use quiver_abi::Errno;
pub use sandbox::{GuestLogs, Preopen, SandboxSetupError};
pub use stream::{
    AttachError, FrameError, SendError, StreamClient, UserStreams, data_frame as ssf_data_frame,
    frame_data as ssf_frame_data,
};
pub use task::{TaskError, TaskRoot, TaskSpec};
pub use trace::TraceContext;
