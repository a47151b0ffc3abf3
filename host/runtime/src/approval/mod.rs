//! Approvals: a tool call of a server whose `approval_policy` asks for one waits for a
//! decision from the [`Approver`] the embedder gave the host.
//!
//! Policy stays pure: [`Grant::check_call`](crate::policy::Grant::check_call) only says a
//! call needs approval; the capability (`mcp_call_tool`, the chat loop) asks here. A call
//! waits at most its server's `approval_timeout_ms` (default
//! [`defaults::APPROVAL_TIMEOUT`](crate::defaults::APPROVAL_TIMEOUT)) and never past the task's deadline; the host drops the
//! approver's future when either passes, or when the task ends, so an approver that holds
//! state (like [`ApprovalQueue`]) must clean up on drop. The approver sees the shape of the
//! arguments (keys and size), never their values; its reason is cut and cleaned, since it
//! may come from an HTTP client.
//!
//! The same approver answers the questions servers ask during a task's requests
//! ([`Approver::elicit`], MCP elicitation), unless the embedder gave the host another
//! ([`HostBuilder::with_elicitor`](crate::HostBuilder::with_elicitor)); an approver that
//! answers none leaves them declined.

mod elicit;
mod gate;
mod queue;
mod terminal;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

pub(crate) use elicit::check_answer;
pub use elicit::{ElicitationAnswer, ElicitationFuture, ElicitationRequest, accept_defaults};
pub use gate::Approvals;
pub(crate) use gate::{AskFor, Refusal, next_id, timeout_of};
pub use queue::{ApprovalError, ApprovalQueue};
pub use terminal::TerminalApprover;

use crate::observe::{ArgumentsSummary, Via, unix_seconds};

/// One tool call waiting for a decision: what an [`Approver`] is asked, and what
/// [`ApprovalQueue::pending`] lists (as JSON, `quiver serve`'s `GET /v1/approvals`).
#[derive(Clone, Debug, Serialize)]
pub struct ApprovalRequest {
    /// Unique within the process (and unlikely to repeat across restarts).
    pub id: String,
    pub task_id: Arc<str>,
    /// Who submitted the task ([`TaskSpec::principal`](crate::TaskSpec::principal)), so
    /// the approver sees whose call it decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    /// The client that submitted the task for its principal
    /// ([`TaskSpec::client`](crate::TaskSpec::client)): a node's client; set
    /// by the host like the principal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    /// The guest fd the call came through: the MCP session or the chat session; `None`
    /// (and absent from JSON) for a library call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_fd: Option<i32>,
    pub via: Via,
    pub server_id: String,
    /// The tool's MCP-native name.
    pub tool: String,
    /// The arguments' top-level keys and size; never their values.
    pub arguments: ArgumentsSummary,
    #[serde(serialize_with = "unix_seconds")]
    pub requested_at: SystemTime,
    /// When the call stops waiting and is denied as timed out: its server's approval
    /// timeout after `requested_at`, or the task's deadline if that comes first.
    #[serde(serialize_with = "unix_seconds")]
    pub expires_at: SystemTime,
}

/// An approver's answer. Deserialises from `{"approve": true|false, "reason": "..."}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub approve: bool,
    /// Why; shown to the guest or model with a denial (cut to
    /// [`defaults::MAX_APPROVAL_REASON_BYTES`](crate::defaults::MAX_APPROVAL_REASON_BYTES)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who decided (a node sets its authenticated client's name); goes into the
    /// [`ApprovalDecided`](crate::ApprovalDecided) event. Never read from JSON.
    #[serde(skip)]
    pub decided_by: Option<String>,
}

impl ApprovalDecision {
    pub fn approve() -> Self {
        Self {
            approve: true,
            reason: None,
            decided_by: None,
        }
    }

    pub fn deny(reason: impl Into<String>) -> Self {
        Self {
            approve: false,
            reason: Some(reason.into()),
            decided_by: None,
        }
    }

    /// The same decision, made by `who`.
    #[must_use]
    pub fn by(self, who: impl Into<String>) -> Self {
        Self {
            decided_by: Some(who.into()),
            ..self
        }
    }
}

/// The future of one decision; the host drops it when the call stops waiting.
pub type ApprovalFuture<'a> = Pin<Box<dyn Future<Output = ApprovalDecision> + Send + 'a>>;

/// Decides tool calls that need approval. Implemented by the embedder (or one of
/// [`AllowAll`], [`DenyAll`], [`ApprovalQueue`], [`TerminalApprover`]) and given to
/// [`HostBuilder::with_approver`](crate::HostBuilder::with_approver).
pub trait Approver: Send + Sync + 'static {
    /// Decides `request`. The host stops waiting at `request.expires_at` (and when the task
    /// ends) by dropping the future.
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_>;

    /// Answers a server's question (`elicitation/create`, form mode) asked during one of a
    /// task's requests; `None` (the default) answers none, and the host declines it. The
    /// host stops waiting at `request.expires_at` (and when the task ends) by dropping the
    /// future, and checks the answer against the form before sending it.
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        let _ = request;
        Box::pin(std::future::ready(None))
    }
}

/// Approves every call.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllowAll;

impl Approver for AllowAll {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::approve()))
    }
}

/// Accepts every question whose form gives a default for each required field, with the
/// defaults (`quiver mcp call --elicit defaults`); declines the others. Decides no call: as
/// an approver it denies every one.
#[derive(Clone, Copy, Debug, Default)]
pub struct AcceptDefaults;

impl Approver for AcceptDefaults {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::deny(
            "this approver only answers servers' questions",
        )))
    }

    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        Box::pin(std::future::ready(accept_defaults(
            &request.requested_schema,
        )))
    }
}

/// Denies every call, saying so.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenyAll;

impl Approver for DenyAll {
    fn ask(&self, _request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(std::future::ready(ApprovalDecision::deny(
            "this host denies every call that needs approval",
        )))
    }
}

#[cfg(test)]
mod tests;
