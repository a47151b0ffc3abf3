//! Watching what tasks do with tools: one event before and one after every tool call (MCP
//! tools called directly or by the chat loop, and guest tools), and one per policy denial.
//!
//! The host's [`Metrics`] (always its first observer), the [`AuditLog`] (`--audit-log` or
//! [`HostBuilder::with_audit_log`](crate::HostBuilder::with_audit_log): one JSON line per
//! finished call and per denial, written by its own thread) and an embedder's own hooks
//! all read the same events, so they cannot disagree about what happened. Observers are
//! called inline on the task's path: they must be cheap and must not block (queue work
//! elsewhere if it is slow, as the audit log does). A call is reported as finished exactly
//! once, whatever ends it: dropped unfinished (a deadline, a trap, a dropped task) it is
//! reported as `cancelled`.

mod audit;
mod event;
mod metrics;

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

pub use audit::AuditLog;
pub(crate) use event::unix_seconds;
pub use event::{
    ApprovalDecided, ArgumentsSummary, InputAnswered, InputRound, McpTaskStatus, PinChange,
    PinsChanged, PolicyDenial, SamplingDone, ToolCall, ToolCallEnd, ToolKind, ToolOutcome, Via,
};
pub use metrics::Metrics;
pub(crate) use metrics::{LiveStatus, ServerGauges};

/// Called around every tool call and on every policy denial. Every method has an empty
/// default, so an observer implements only what it needs.
pub trait ToolObserver: Send + Sync + 'static {
    /// Before the call is sent (after policy allowed it).
    fn before_tool_call(&self, _call: &ToolCall) {}
    /// After it ended, once, whatever the outcome.
    fn after_tool_call(&self, _call: &ToolCall, _end: &ToolCallEnd) {}
    /// Policy refused a server or a tool to a task.
    fn policy_denied(&self, _denial: &PolicyDenial) {}
    /// The approver decided a call that waited for approval (not a timeout).
    fn approval_decided(&self, _decision: &ApprovalDecided) {}
    /// An operator accepted tool definitions by pinning them.
    fn pins_changed(&self, _event: &PinsChanged) {}
    /// A server answered one of a task's requests with `input_required`, and the host
    /// answered its input requests (or refused them).
    fn input_round(&self, _round: &InputRound) {}
    /// A server's task running one of a task's tool calls changed its status or message.
    fn mcp_task_status(&self, _status: &McpTaskStatus) {}

    /// A server's sampling request was answered by the task's model, or refused.
    fn sampling(&self, _event: &SamplingDone) {}
}

/// The observers of one host, or of one task (then every event carries the task's
/// principal); cheap to clone.
#[derive(Clone, Default)]
pub struct Observers {
    all: Arc<[Arc<dyn ToolObserver>]>,
    /// Stamped on every event, so no emitting site can leave it out.
    principal: Option<Arc<str>>,
    /// The client that submitted the task, stamped beside it.
    client: Option<Arc<str>>,
}

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Observers({})", self.all.len())
    }
}

impl Observers {
    pub fn new(observers: Vec<Arc<dyn ToolObserver>>) -> Self {
        Self {
            all: observers.into(),
            principal: None,
            client: None,
        }
    }

    /// These observers for one task of `principal`, submitted by `client`: each event
    /// they get names both.
    #[must_use]
    pub(crate) fn for_principal(&self, principal: Option<&str>, client: Option<&str>) -> Self {
        Self {
            all: self.all.clone(),
            principal: principal.map(Arc::from),
            client: client.map(Arc::from),
        }
    }

    /// The principal stamped on every event.
    pub(crate) fn principal(&self) -> Option<&Arc<str>> {
        self.principal.as_ref()
    }

    /// The submitting client stamped on every event.
    pub(crate) fn client(&self) -> Option<&Arc<str>> {
        self.client.as_ref()
    }

    /// `observer` and then these observers.
    #[must_use]
    pub fn preceded_by(&self, observer: Arc<dyn ToolObserver>) -> Self {
        let mut all = vec![observer];
        all.extend(self.all.iter().cloned());
        Self::new(all)
    }

    /// These observers and then `observer`.
    #[must_use]
    pub fn with(&self, observer: Arc<dyn ToolObserver>) -> Self {
        let mut all = self.all.to_vec();
        all.push(observer);
        Self::new(all)
    }

    /// Reports `call` as started; the returned guard reports its end.
    pub(crate) fn start(&self, mut call: ToolCall) -> ObservedCall {
        call.principal = self.principal.clone();
        call.client = self.client.clone();
        for observer in self.all.iter() {
            observer.before_tool_call(&call);
        }
        ObservedCall {
            observers: self.clone(),
            call,
            started: Instant::now(),
            finished: false,
        }
    }

    pub fn policy_denied(&self, denial: &PolicyDenial) {
        let stamped;
        let denial = if self.principal.is_some() || self.client.is_some() {
            stamped = PolicyDenial {
                principal: self.principal.clone(),
                client: self.client.clone(),
                ..denial.clone()
            };
            &stamped
        } else {
            denial
        };
        for observer in self.all.iter() {
            observer.policy_denied(denial);
        }
    }

    pub(crate) fn approval_decided(&self, decision: &ApprovalDecided) {
        for observer in self.all.iter() {
            observer.approval_decided(decision);
        }
    }

    pub(crate) fn input_round(&self, round: &InputRound) {
        let stamped = InputRound {
            principal: self.principal.clone(),
            client: self.client.clone(),
            ..round.clone()
        };
        for observer in self.all.iter() {
            observer.input_round(&stamped);
        }
    }

    pub(crate) fn mcp_task_status(&self, status: &McpTaskStatus) {
        let stamped = McpTaskStatus {
            principal: self.principal.clone(),
            client: self.client.clone(),
            ..status.clone()
        };
        for observer in self.all.iter() {
            observer.mcp_task_status(&stamped);
        }
    }

    pub(crate) fn sampling(&self, event: &SamplingDone) {
        let stamped = SamplingDone {
            principal: self.principal.clone(),
            client: self.client.clone(),
            ..event.clone()
        };
        for observer in self.all.iter() {
            observer.sampling(&stamped);
        }
    }

    pub(crate) fn pins_changed(&self, event: &PinsChanged) {
        for observer in self.all.iter() {
            observer.pins_changed(event);
        }
    }
}

/// A tool call in progress. Finish it with its outcome; dropped unfinished it is reported
/// as [`ToolOutcome::Cancelled`].
#[must_use = "a call reports its end when finished or dropped"]
pub(crate) struct ObservedCall {
    observers: Observers,
    call: ToolCall,
    started: Instant,
    finished: bool,
}

impl ObservedCall {
    pub(crate) fn finish(mut self, outcome: ToolOutcome, output_bytes: u64) {
        self.report(outcome, output_bytes);
    }

    fn report(&mut self, outcome: ToolOutcome, output_bytes: u64) {
        self.finished = true;
        let end = ToolCallEnd {
            outcome,
            duration: self.started.elapsed(),
            output_bytes,
        };
        for observer in self.observers.all.iter() {
            observer.after_tool_call(&self.call, &end);
        }
    }
}

impl Drop for ObservedCall {
    fn drop(&mut self) {
        if !self.finished {
            self.report(ToolOutcome::Cancelled, 0);
        }
    }
}

#[cfg(test)]
mod tests;
