//! MCP: the server registry, the connection pool and the per-fd session state.
//!
//! The registry says which servers exist and how to reach them; the pool owns one
//! long-lived rmcp connection per server, shared by every fd of every task; a session is
//! what one guest fd holds. Who may call what is decided in [`crate::policy`], not here.

mod auth;
mod egress;
mod error;
mod http;
mod pool;
mod session;

pub use auth::{ApiKeyConfig, AuthConfig, OAuthClientCredentialsConfig};
pub use egress::{EgressConfig, EgressPolicy};
pub use error::{McpError, McpErrorCode};
pub use http::ensure_tls_provider;
pub use pool::{McpPool, RemoteOptions, ServerStatus};
pub(crate) use session::{McpSession, PendingKey};

/// A tool as a server lists it (rmcp's model type: `name`, `description`, `inputSchema`, ...).
pub type Tool = rmcp::model::Tool;
/// The result of `tools/call`, in the MCP wire shape.
pub type CallToolResult = rmcp::model::CallToolResult;
