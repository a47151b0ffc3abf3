//! Asking the host's approver about one call, with its timeout, as both tool-call paths do.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::{ApprovalRequest, Approver, ElicitationAnswer, ElicitationRequest};
use crate::defaults;
use crate::observe::{ApprovalDecided, ArgumentsSummary, Observers, Via};
use crate::policy::{Denial, Reason};
use crate::registry::{ApprovalPolicy, ServerEntry};
use crate::sandbox::Deadline;
use crate::text;

/// The host's approver, if it has one, and who answers servers' questions; cheap to clone.
#[derive(Clone, Default)]
pub struct Approvals {
    approver: Option<Arc<dyn Approver>>,
    /// `None` until set: the approver answers.
    elicitor: Option<Option<Arc<dyn Approver>>>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.approver {
            Some(_) => "Approvals(approver)",
            None => "Approvals(none)",
        })
    }
}

/// The call to ask about.
pub(crate) struct AskFor<'a> {
    pub(crate) task_id: &'a str,
    /// The task's observers: they name its principal and hear the decision.
    pub(crate) observers: &'a Observers,
    pub(crate) session_fd: Option<i32>,
    pub(crate) via: Via,
    pub(crate) entry: &'a ServerEntry,
    pub(crate) tool: &'a str,
    pub(crate) arguments: ArgumentsSummary,
    pub(crate) policy: ApprovalPolicy,
    /// The task's deadline: the wait ends there too, as a refusal the caller can report
    /// before the deadline traps the task.
    pub(crate) task_deadline: Deadline,
}

/// Why a call that needed approval may not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
}

/// Ids unique in this process; the random prefix keeps them apart across restarts.
pub(crate) fn next_id() -> String {
    static PREFIX: LazyLock<u64> =
        LazyLock::new(|| std::collections::hash_map::RandomState::new().hash_one(0u8));
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:08x}-{n:08x}", *PREFIX as u32)
}

/// `reason` cut to the cap at a character boundary, trimmed, and made printable (it ends
/// up in logs, guest results and model prompts).
pub(super) fn clean_reason(reason: &str) -> String {
    text::printable(text::cut(reason, defaults::MAX_APPROVAL_REASON_BYTES).trim())
}

impl Approvals {
    pub(crate) fn with_approver(self, approver: Arc<dyn Approver>) -> Self {
        Self {
            approver: Some(approver),
            ..self
        }
    }

    pub(crate) fn with_elicitor(self, elicitor: Option<Arc<dyn Approver>>) -> Self {
        Self {
            elicitor: Some(elicitor),
            ..self
        }
    }

    /// Asks whoever answers servers' questions about `request`, until `until` (the caller
    /// makes it the request's `expires_at`); `None` when nobody answers or the time passed.
    pub(crate) async fn elicit(
        &self,
        request: ElicitationRequest,
        until: tokio::time::Instant,
    ) -> Option<ElicitationAnswer> {
        let elicitor = match &self.elicitor {
            Some(elicitor) => elicitor.as_ref(),
            None => self.approver.as_ref(),
        }?;
        let id = request.id.clone();
        match tokio::time::timeout_at(until, elicitor.elicit(request)).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::info!(elicitation_id = %id, "no answer to the server's question in time");
                None
            }
        }
    }

    /// Whether the host has an approver (without one, calls needing approval are refused
    /// and their tools not offered to models).
    pub(crate) fn configured(&self) -> bool {
        self.approver.is_some()
    }

    /// Asks the approver about `call`, waiting at most the server's approval timeout and
    /// never past the task's deadline (either ends the wait as `approval_timeout`).
    pub(crate) async fn ask(&self, call: AskFor<'_>) -> Result<(), Refusal> {
        let Some(approver) = &self.approver else {
            return Err(Refusal {
                reason: Reason::ApprovalRequired,
                detail: Denial::ApprovalRequired(call.policy).to_string(),
            });
        };
        let timeout = timeout_of(call.entry);
        let requested_at = SystemTime::now();
        let shown = timeout.min(call.task_deadline.remaining());
        let request = ApprovalRequest {
            id: next_id(),
            task_id: call.task_id.into(),
            principal: call.observers.principal().cloned(),
            client: call.observers.client().cloned(),
            session_fd: call.session_fd,
            via: call.via,
            server_id: call.entry.server_id().to_owned(),
            tool: call.tool.to_owned(),
            arguments: call.arguments,
            requested_at,
            expires_at: requested_at.checked_add(shown).unwrap_or(requested_at),
        };
        let (id, task_id, principal, client) = (
            request.id.clone(),
            request.task_id.clone(),
            request.principal.clone(),
            request.client.clone(),
        );
        tracing::info!(task_id = call.task_id, server_id = call.entry.server_id(), tool = call.tool, approval_id = %id, "waiting for approval");
        let task_ends_first = shown < timeout;
        // The deadline's own instant, so this wait ends no later than the caller's
        // `before_deadline` around it, which polls it first and so sees the refusal.
        let until = if task_ends_first {
            call.task_deadline.instant()
        } else {
            tokio::time::Instant::now() + timeout
        };
        let decision = match tokio::time::timeout_at(until, approver.ask(request)).await {
            Ok(decision) => decision,
            Err(_) => {
                tracing::info!(approval_id = %id, task_ends_first, "approval timed out");
                let detail = if task_ends_first {
                    format!(
                        "the task's deadline ended the wait for approval after {} ms (limits.deadline_ms)",
                        shown.as_millis()
                    )
                } else {
                    format!(
                        "timed out after {} ms waiting for approval (approval_timeout_ms)",
                        timeout.as_millis()
                    )
                };
                return Err(Refusal {
                    reason: Reason::ApprovalTimeout,
                    detail,
                });
            }
        };
        let reason = decision.reason.as_deref().map(clean_reason);
        tracing::info!(approval_id = %id, approve = decision.approve, reason = reason.as_deref(), decided_by = decision.decided_by.as_deref(), "approval decided");
        call.observers.approval_decided(&ApprovalDecided {
            id,
            task_id,
            principal,
            client,
            via: call.via,
            server_id: call.entry.server_id().to_owned(),
            tool: call.tool.to_owned(),
            approved: decision.approve,
            reason: reason.clone(),
            decided_by: decision
                .decided_by
                .as_deref()
                .map(|who| text::printable(text::cut(who, defaults::MAX_APPROVAL_REASON_BYTES))),
            at: SystemTime::now(),
        });
        if decision.approve {
            return Ok(());
        }
        Err(Refusal {
            reason: Reason::ApprovalDenied,
            detail: match reason {
                Some(reason) if !reason.is_empty() => format!("denied by the approver: {reason}"),
                _ => "denied by the approver".to_owned(),
            },
        })
    }
}

/// How long a call of `entry`'s tools waits for its approval.
pub(crate) fn timeout_of(entry: &ServerEntry) -> Duration {
    entry
        .record
        .approval_timeout
        .unwrap_or(defaults::APPROVAL_TIMEOUT)
}
