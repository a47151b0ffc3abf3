//! What one task's MCP use is bound by, and what one `mcp_open` fd holds.

use std::sync::Arc;

use quiver_abi::Errno;

use super::{McpPool, TaskSampler};
use crate::approval::Approvals;
use crate::observe::{Observers, PolicyDenial};
use crate::policy::{
    self, Decision, Grant, ListKey, Narrowing, Pattern, Reason, SessionRequest, TaskMcpPolicy,
};
use crate::registry::Registry;
use crate::sandbox::{Charge, FdKindOf, MemoryBudget, SandboxView, heap};

/// The MCP side of one task: its policy layer, the registry snapshot it started with, and
/// the host's pool. Fixed for the whole run.
pub struct McpTask {
    pub policy: TaskMcpPolicy,
    pub registry: Arc<Registry>,
    pub(crate) pool: Arc<McpPool>,
    /// Told about every tool call and policy denial of the task.
    pub observers: Observers,
    /// Asked about every call that needs approval.
    pub approvals: Approvals,
    /// The task's MCP calls in flight, per server.
    pub(crate) in_flight: super::in_flight::PerServer,
    /// Answers the sampling requests of the task's servers, within the task's budget.
    pub(crate) sampler: Arc<dyn TaskSampler>,
    /// The roots the task declares to its servers (`roots/list`), none by default.
    pub(crate) roots: Arc<[crate::TaskRoot]>,
    /// Fiber stacks for calls back into the guest (the host's share for guest tools,
    /// shared with the chat loop's), taken by a guest's elicitation callback.
    pub(crate) guest_callbacks: Arc<tokio::sync::Semaphore>,
    /// The task's subject token, registered for token exchange while the task runs.
    pub(crate) _subject: Option<crate::mcp::auth::SubjectRegistration>,
}

/// Store data through which the `mcp_*` hostcalls reach their task state and fds.
pub trait McpView: SandboxView<Fd: FdKindOf<McpSession> + FdKindOf<super::McpCall>> {
    fn mcp(&self) -> &Arc<McpTask>;
}

impl McpTask {
    /// Whom the task acts for: the connection to a server with user authorization is
    /// that principal's.
    pub(crate) fn principal(&self) -> Option<&str> {
        self.observers.principal().map(|p| &**p)
    }

    /// The one decision of `mcp_open` and `mcp_registry_get`: may this task use
    /// `server_id`, and with which tool filter? Unknown `-ENOENT`, a required env variable
    /// missing `-ENOTCONN`, anything else `-EACCES`; every denial is logged with its reason
    /// and reported to the observers.
    pub fn decide_server(
        &self,
        task_id: &str,
        hostcall: &'static str,
        server_id: &str,
    ) -> Result<Grant, Errno> {
        let decision = match self.grant(server_id) {
            Ok(grant) => return Ok(grant),
            Err(None) => return Err(Errno::EACCES),
            Err(Some(decision)) => decision,
        };
        tracing::info!(task_id, hostcall, server_id, reason = ?decision.reason, detail = %decision.detail, "denied by policy");
        self.observers.policy_denied(&PolicyDenial {
            task_id: task_id.into(),
            // Set by the observers from the task's.
            principal: None,
            client: None,
            session_fd: None,
            action: hostcall,
            via: None,
            // Hostcalls refuse longer ids first; cut anyway, it goes into every observer.
            server_id: crate::text::cut(server_id, crate::defaults::MAX_SERVER_ID_BYTES).to_owned(),
            tool: None,
            reason: decision.reason,
            detail: decision.detail,
            at: std::time::SystemTime::now(),
        });
        Err(errno_of(decision.reason))
    }

    /// Whether `mcp_registry_list` shows `server_id` to this task: the servers it may use,
    /// and those only missing a required env variable. A listing filters; it refuses
    /// nothing the guest asked for, so nothing is logged or reported.
    pub fn lists(&self, server_id: &str) -> bool {
        match self.grant(server_id) {
            Ok(_) => true,
            Err(decision) => decision.is_some_and(|d| errno_of(d.reason) == Errno::ENOTCONN),
        }
    }

    /// The grant of `server_id` (registry ∩ profile ∩ task), or the decision that denies
    /// it (`None`: denied without one); nothing is reported.
    pub(crate) fn grant(&self, server_id: &str) -> Result<Grant, Option<Decision>> {
        let requested = [server_id.to_owned()];
        let effective = policy::effective(
            &self.registry,
            &self.policy,
            &SessionRequest::single(&requested),
        );
        if let Some(grant) = effective.grant(server_id) {
            return Ok(grant.clone());
        }
        Err(effective.decision(server_id).cloned())
    }
}

fn errno_of(reason: Reason) -> Errno {
    match reason {
        Reason::UnknownServer => Errno::ENOENT,
        Reason::EnvMissing => Errno::ENOTCONN,
        _ => Errno::EACCES,
    }
}

/// What an fd request does; the `mcp_*` hostcall it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    ListTools,
    CallTool,
    ListResources,
    ListResourceTemplates,
    ReadResource,
    ListPrompts,
    GetPrompt,
}

/// Identifies a request whose output did not fit the guest's buffer, so that the retry
/// with a bigger buffer gets the same bytes instead of running the work again: the op, its
/// name (tool, URI or prompt; empty for a listing) and its argument bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PendingKey {
    pub(crate) op: Op,
    pub(crate) name: String,
    pub(crate) args: Vec<u8>,
}

impl PendingKey {
    pub(crate) fn new(op: Op, name: &str, args: &[u8]) -> Self {
        Self {
            op,
            name: name.to_owned(),
            args: args.to_vec(),
        }
    }

    /// Whether this is the key of `op` on `name` with `args`.
    pub(crate) fn is(&self, op: Op, name: &str, args: &[u8]) -> bool {
        self.op == op && self.name == name && self.args == args
    }

    /// What the key holds on the heap.
    pub(crate) fn cost(&self) -> u64 {
        heap::string(self.name.len() as u64)
            .saturating_add(heap::alloc(self.args.capacity() as u64))
    }
}

/// Output kept for a retry, charged to the task's memory budget.
struct Pending {
    key: PendingKey,
    bytes: Vec<u8>,
    _charge: Charge,
}

/// One `mcp_open` fd: the server granted (registry ∩ profile ∩ task, fixed at open,
/// narrowed by the fd's own lists) and the output kept for a retry.
pub struct McpSession {
    pub(crate) grant: Arc<Grant>,
    /// The fd's own lists (`mcp_set_param`), the session layer of its filters, with what
    /// they hold (twice: here and in the grant's filters). Boxed: most fds have none.
    lists: Option<Box<(Narrowing, Charge)>>,
    pending: Option<Pending>,
    /// The guest's own answerer of the server's questions (`mcp_elicit_fn`), if it opted in.
    pub(crate) answerer: Option<super::guest_answers::Answerer>,
}

impl McpSession {
    pub(crate) fn new(grant: Grant) -> Self {
        Self {
            grant: Arc::new(grant),
            lists: None,
            pending: None,
            answerer: None,
        }
    }

    /// Sets the fd's list `key` to `patterns`, replacing its earlier one; the layers above
    /// still bound it. `-ENOMEM` (and nothing changed) when the budget cannot hold it. A
    /// kept answer is dropped: it was filtered by the old lists.
    pub(crate) fn narrow(
        &mut self,
        key: ListKey,
        patterns: Vec<Pattern>,
        budget: &MemoryBudget,
    ) -> Result<(), Errno> {
        let mut narrowing = self
            .lists
            .as_ref()
            .map_or_else(Narrowing::default, |lists| lists.0.clone());
        narrowing.set(key, patterns);
        let all: Vec<&str> = narrowing.patterns().map(Pattern::as_str).collect();
        let held = heap::strings(all.into_iter());
        let charge = budget.charge("mcp_set_param lists", held.saturating_mul(2))?;
        self.grant = Arc::new(Grant::clone(&self.grant).with_session(&narrowing));
        self.lists = Some(Box::new((narrowing, charge)));
        self.clear_output();
        Ok(())
    }

    /// Whether output is kept for a request `is_key` recognises.
    pub(crate) fn keeps_output_for(&self, is_key: impl FnOnce(&PendingKey) -> bool) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|pending| is_key(&pending.key))
    }

    /// The kept output (empty if there is none).
    pub(crate) fn kept_output(&self) -> &[u8] {
        self.pending.as_ref().map_or(&[], |pending| &pending.bytes)
    }

    /// Keeps `bytes` for the retry of `key`; `-ENOMEM` (and nothing kept) when the task's
    /// budget cannot hold them.
    pub(crate) fn keep_output(
        &mut self,
        key: PendingKey,
        bytes: Vec<u8>,
        budget: &MemoryBudget,
    ) -> Result<(), Errno> {
        self.pending = None;
        let cost = key
            .cost()
            .saturating_add(heap::alloc(bytes.capacity() as u64));
        let charge = budget.charge("kept MCP output", cost)?;
        self.pending = Some(Pending {
            key,
            bytes,
            _charge: charge,
        });
        Ok(())
    }

    pub(crate) fn clear_output(&mut self) {
        self.pending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Denial, Kind, Layer};
    use crate::registry::{ServerEntry, ServerRecord};

    fn session() -> McpSession {
        let mut record = ServerRecord::for_tests("docs");
        record.allowed_resources = vec!["demo://*".into()];
        let entry = Arc::new(ServerEntry {
            record,
            source: "docs.toml".into(),
            launch: Err(crate::registry::LaunchUnavailable::EnvRef {
                field: "stdio.command".into(),
                source: crate::registry::EnvRefError::Missing("X".into()),
            }),
        });
        McpSession::new(Grant::new(
            entry,
            &TaskMcpPolicy::default(),
            &Narrowing::default(),
        ))
    }

    fn patterns(list: &[&str]) -> Vec<Pattern> {
        list.iter().map(|p| Pattern::new(*p)).collect()
    }

    #[test]
    fn narrowing_replaces_the_fds_own_list_charges_it_and_drops_a_kept_answer() {
        let budget = MemoryBudget::new(Arc::from("t"), 4096);
        let mut session = session();
        let key = PendingKey::new(Op::ListResources, "", b"");
        session.keep_output(key, b"kept".to_vec(), &budget).unwrap();
        let allow = ListKey::allow(Kind::Resource);
        session
            .narrow(allow, patterns(&["demo://a*"]), &budget)
            .unwrap();
        assert!(
            session.kept_output().is_empty(),
            "filtered by the old lists"
        );
        let charged = budget.used();
        assert!(charged > 0);
        assert_eq!(
            session.grant.check_resource("demo://b"),
            Err(Denial::NotInAllowlist(Kind::Resource, Layer::Session))
        );
        // A second list of the same key replaces the first; others stay.
        session
            .narrow(ListKey::deny(Kind::Resource), patterns(&["*x"]), &budget)
            .unwrap();
        session
            .narrow(allow, patterns(&["demo://b*"]), &budget)
            .unwrap();
        assert_eq!(session.grant.check_resource("demo://b"), Ok(()));
        assert!(session.grant.check_resource("demo://bx").is_err());
        assert!(session.grant.check_resource("file:///b").is_err());
        // Past the budget: -ENOMEM and nothing changes.
        let long = vec![Pattern::new("p".repeat(256)); 64];
        assert_eq!(session.narrow(allow, long, &budget), Err(Errno::ENOMEM));
        assert_eq!(session.grant.check_resource("demo://b"), Ok(()));
        drop(session);
        assert_eq!(budget.used(), 0, "closing the fd gives the charge back");
    }
}
