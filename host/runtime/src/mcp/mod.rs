//! The MCP capability: the connection pool and its transports, credentials and egress,
//! the `mcp_*` hostcalls, and each task's MCP state.
//!
//! The [`registry`](crate::registry) says which servers exist and how to reach them; the
//! pool owns one long-lived rmcp connection per server, shared by every fd of every task;
//! an [`McpSession`] is what one guest fd holds and an [`McpTask`] what one task is bound
//! by. Who may call what is decided by [`crate::policy`] (pure), asked once per hostcall.
//! The pool is the crate's own: every tool call reaches it through one gate (`call`), from
//! a guest's `mcp_call_tool` or from [`Host::call_tool`](crate::Host::call_tool).

mod auth;
mod cache;
pub(crate) mod call;
mod capped;
mod connect;
mod egress;
mod error;
mod guest_answers;
mod hostcalls;
mod http;
mod http_post;
mod in_flight;
pub(crate) mod input;
mod launch;
mod outbound;
mod pool;
mod rules;
mod sampling;
mod session;
mod spans;
mod tool_headers;

pub(crate) use auth::misplaced_dpop;
pub use auth::{
    ApiKeyConfig, AuthConfig, AuthSet, AuthorizationPrompt, AuthorizeError, DirGrantStore, Grant,
    GrantKey, GrantStatus, GrantStore, GrantStoreError, MemoryGrantStore,
    OAuthAuthorizationCodeConfig, OAuthClientCredentialsConfig, OAuthEnterpriseManagedConfig,
    OAuthJwtBearerConfig, OAuthTokenExchangeConfig, REGISTRY_GRANTS_DIR, Registration, SigningAlg,
    SubjectToken, SubjectTokenError, TokenEndpointAuth, TokenType, UserAuthorizer,
};
pub use egress::{EgressConfig, EgressPolicy};
pub use error::{McpError, McpErrorCode};
pub use hostcalls::add_to_linker;
pub use http::ensure_tls_provider;
pub use in_flight::McpCall;
pub use launch::{LaunchConfig, LaunchRules};
pub use pool::{McpHostConfig, PoolLimits, PoolUsage, ServerState, ServerStatus, ToolCallOutput};
pub(crate) use pool::{McpPool, RemoteOptions, ToolsLeftOut};
pub(crate) use rules::ServerRules;
pub(crate) use sampling::{Sampled, SamplingRefused, TaskSampler};
pub use session::{McpSession, McpTask, McpView};

/// A tool as a server lists it (rmcp's model type: `name`, `description`, `inputSchema`, ...).
pub type Tool = rmcp::model::Tool;
/// The result of `tools/call`, in the MCP wire shape.
pub type CallToolResult = rmcp::model::CallToolResult;
