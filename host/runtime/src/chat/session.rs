//! One task's chat state, and what the `cchat_*` fds hold.
//!
//! A session's content (messages, params, guest tools) is charged to the task's memory
//! budget as it grows and given back when the session is closed. A send works on a
//! snapshot that shares the content instead of copying it; should the session be written
//! while a send runs (a guest tool may do that), the write copies the content first and the
//! copy is charged too.

use std::ops::Deref;
use std::sync::Arc;

use quiver_abi::Errno;
use serde_json::{Map, Value};

use super::llm::Backends;
use super::message::Message;
use super::pending::PendingSend;
use super::{GuestTool, Metrics, ParamError, SessionMcp, Settings};
use crate::mcp::McpView;
use crate::policy::TaskMcpPolicy;
use crate::sandbox::{Charge, FdKindOf, MemoryBudget, heap};

/// Roles `cchat_write_msg` accepts.
pub(crate) const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The chat side of one task: the host's LLM backends. (Its MCP side is the task's
/// [`McpTask`](crate::mcp::McpTask), which chat asks for tools.)
pub struct ChatTask {
    pub backends: Arc<Backends>,
    /// The host's fiber stacks for guest tool calls, shared by all its tasks.
    pub guest_tool_stacks: Arc<tokio::sync::Semaphore>,
    /// The host's metrics, which the chat loop adds LLM use and budget hits to.
    pub metrics: crate::observe::Metrics,
    /// The last guest tool definition the task wrote, parsed and checked.
    pub(crate) last_tool: super::guest_tools::LastTool,
    /// The MCP half of the last send's tool set, reused while it is still current.
    pub(crate) tool_cache: super::tools::ToolCache,
}

/// Store data through which the `cchat_*` hostcalls reach their task state and fds.
pub trait ChatView: McpView<Fd: FdKindOf<ChatSession> + FdKindOf<ChatResponse>> {
    fn chat(&self) -> &Arc<ChatTask>;
}

/// One chat session (`cchat_create`); reads go to its [`SessionContent`].
pub struct ChatSession {
    content: Arc<SessionContent>,
    /// The response fd of the session's last nonblocking send, which may still be in
    /// flight or unread (see [`super::pending::unread`]).
    pub(crate) sending: Option<i32>,
}

/// What a session holds.
pub struct SessionContent {
    pub(crate) messages: Vec<Message>,
    /// Params forwarded upstream as given.
    pub(crate) upstream: Map<String, Value>,
    pub(crate) settings: Settings,
    pub(crate) mcp: SessionMcp,
    pub(crate) guest_tools: Vec<GuestTool>,
    /// Everything above, charged as a guest grew it.
    charge: Charge,
}

/// Why a SET_PARAM failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SetParamError {
    Param(ParamError),
    /// The task's memory budget cannot hold the value.
    Budget(Errno),
}

impl Deref for ChatSession {
    type Target = SessionContent;
    fn deref(&self) -> &SessionContent {
        &self.content
    }
}

impl SessionContent {
    /// Bytes charged for the session: messages, params and guest tools.
    pub(crate) fn charged_bytes(&self) -> u64 {
        self.charge.bytes()
    }

    /// A copy, charged as much again.
    fn try_clone(&self) -> Result<Self, Errno> {
        Ok(Self {
            charge: self.charge.try_clone()?,
            messages: self.messages.clone(),
            upstream: self.upstream.clone(),
            settings: self.settings.clone(),
            mcp: self.mcp.clone(),
            guest_tools: self.guest_tools.clone(),
        })
    }
}

impl ChatSession {
    /// A session starting from the task's MCP defaults, charging `budget` as it grows.
    pub(crate) fn new(task: &TaskMcpPolicy, budget: &MemoryBudget) -> Self {
        Self {
            content: Arc::new(SessionContent {
                messages: Vec::new(),
                upstream: Map::new(),
                settings: Settings::default(),
                mcp: SessionMcp::from_task(task),
                guest_tools: Vec::new(),
                charge: budget.empty("chat session"),
            }),
            sending: None,
        }
    }

    /// A read-only view of the session as it is now, for a send; it shares the content.
    pub(crate) fn snapshot(&self) -> ChatSession {
        Self {
            content: self.content.clone(),
            sending: None,
        }
    }

    /// The content, copied first if a snapshot shares it.
    fn content_mut(&mut self) -> Result<&mut SessionContent, Errno> {
        if Arc::get_mut(&mut self.content).is_none() {
            self.content = Arc::new(self.content.try_clone()?);
        }
        // Unshared now: the copy above has no other owner.
        Arc::get_mut(&mut self.content).ok_or(Errno::ENOMEM)
    }

    /// Appends `message`, already charged by `charge`.
    pub(crate) fn push_message(&mut self, message: Message, charge: Charge) -> Result<(), Errno> {
        let content = self.content_mut()?;
        content.charge.absorb(charge);
        content.messages.push(message);
        Ok(())
    }

    /// Appends what a send added, already charged by `charge`.
    pub(crate) fn append_messages(
        &mut self,
        messages: Vec<Message>,
        charge: Charge,
    ) -> Result<(), Errno> {
        let content = self.content_mut()?;
        content.charge.absorb(charge);
        content.messages.extend(messages);
        Ok(())
    }

    /// Registers (or replaces) a guest tool.
    pub(crate) fn add_guest_tool(&mut self, tool: GuestTool) -> Result<(), Errno> {
        let content = self.content_mut()?;
        let cost = tool.cost();
        let replaced = content.guest_tools.iter().position(|t| t.name == tool.name);
        let freed = replaced.map_or(0, |i| content.guest_tools[i].cost());
        content.charge.grow(cost.saturating_sub(freed))?;
        content.charge.shrink(freed.saturating_sub(cost));
        match replaced {
            Some(i) => content.guest_tools[i] = tool,
            None => content.guest_tools.push(tool),
        }
        Ok(())
    }

    /// Applies one SET_PARAM, charging what the new value holds and giving back what the
    /// one it replaces held.
    pub(crate) fn set_param(
        &mut self,
        key: &str,
        value: Value,
        task: &TaskMcpPolicy,
    ) -> Result<(), SetParamError> {
        let content = self.content_mut().map_err(SetParamError::Budget)?;
        let old = content.param_cost(key);
        let bound = super::params::new_param_cost(key, &value);
        let reserved = bound.saturating_sub(old);
        content
            .charge
            .grow(reserved)
            .map_err(SetParamError::Budget)?;
        if let Err(error) = content.apply_param(key, value, task) {
            content.charge.shrink(reserved);
            return Err(SetParamError::Param(error));
        }
        let new = content.param_cost(key);
        // `new <= bound`: the charge ends up the old total, less the old slot, plus the new.
        content
            .charge
            .shrink(old.saturating_add(reserved).saturating_sub(new));
        Ok(())
    }

    /// Test access to the session layer of MCP policy.
    #[cfg(test)]
    pub(crate) fn mcp_mut(&mut self) -> &mut SessionMcp {
        match self.content_mut() {
            Ok(content) => &mut content.mcp,
            Err(errno) => panic!("an unlimited budget cannot be hit: {errno:?}"),
        }
    }
}

/// The answer to one `cchat_send` (a response fd).
#[derive(Debug)]
pub struct ChatResponse {
    pub(crate) body: Vec<u8>,
    /// Encoded only when the guest asks for them (GET_METRICS).
    pub(crate) metrics: Metrics,
    _charge: Charge,
    /// A nonblocking send still to be settled into this response.
    /// Boxed: the send's outcome holds a response in turn.
    pub(crate) pending: Option<Box<PendingSend>>,
}

impl ChatResponse {
    /// A response whose bytes are charged to `budget`; `-ENOMEM` if it cannot hold them.
    pub(crate) fn new(
        body: Vec<u8>,
        metrics: Metrics,
        budget: &MemoryBudget,
    ) -> Result<Self, Errno> {
        let bytes = heap::alloc(body.capacity() as u64);
        Ok(Self {
            _charge: budget.charge("chat response", bytes)?,
            body,
            metrics,
            pending: None,
        })
    }

    /// The response fd of a nonblocking send, empty until [`super::pending::settle`].
    pub(crate) fn pending(send: PendingSend, budget: &MemoryBudget) -> Self {
        Self {
            body: Vec::new(),
            metrics: Metrics::default(),
            _charge: budget.empty("chat response"),
            pending: Some(Box::new(send)),
        }
    }

    /// `epoll_events` bits: readable once the answer is there.
    pub(crate) fn readiness(&mut self) -> i32 {
        match &mut self.pending {
            Some(send) => send.readiness(),
            None => quiver_abi::epoll_events::IN,
        }
    }

    /// The metrics' JSON, once the answer is there.
    pub(crate) fn metrics(&self) -> Option<Vec<u8>> {
        self.pending
            .is_none()
            .then(|| serde_json::to_vec(&self.metrics).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::params::tests::task;

    fn budget(limit: u64) -> MemoryBudget {
        MemoryBudget::new(Arc::from("t"), limit)
    }

    /// A user message of `content`, and its charge.
    fn message(budget: &MemoryBudget, content: &str) -> (Message, Charge) {
        let mut charge = budget.empty("test");
        let message = Message::text("user", content, &mut charge).unwrap();
        (message, charge)
    }

    #[test]
    fn the_fixed_state_of_a_session_fits_its_fd_charge() {
        let arc_header = 2 * std::mem::size_of::<usize>();
        let fixed = std::mem::size_of::<SessionContent>() + arc_header;
        assert!(
            heap::alloc(fixed as u64) <= crate::sandbox::FD_STATE_BYTES,
            "{fixed}"
        );
    }

    #[test]
    fn content_is_charged_and_given_back_on_close() {
        let budget = budget(1 << 20);
        let mut session = ChatSession::new(&task(), &budget);
        let (message, charge) = message(&budget, &"x".repeat(1000));
        session.push_message(message, charge).unwrap();
        session
            .set_param("temperature", json!(0.5), &task())
            .unwrap();
        session
            .set_param("model", json!("m".repeat(500)), &task())
            .unwrap();
        let tool = GuestTool::parse(1, r#"{"type":"function","function":{"name":"t"}}"#).unwrap();
        session.add_guest_tool(tool).unwrap();
        assert_eq!(budget.used(), session.charged_bytes());
        assert!(budget.used() > 1500, "{}", budget.used());
        drop(session);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn replacing_a_param_or_a_tool_does_not_add_up() {
        let budget = budget(1 << 20);
        let mut session = ChatSession::new(&task(), &budget);
        for (key, value) in [
            ("stop", json!(["x".repeat(100_000), "y"])),
            ("mcp.tool_allowlist", json!(vec!["p".repeat(256); 64])),
            ("model", json!("z".repeat(100_000))),
        ] {
            for _ in 0..50 {
                session.set_param(key, value.clone(), &task()).unwrap();
            }
            let held = budget.used();
            assert!(held < 300_000, "{key}: {held}");
            session.set_param(key, json!(null), &task()).ok();
        }
        session.set_param("stop", json!(null), &task()).unwrap();
        session
            .set_param("mcp.tool_allowlist", json!([]), &task())
            .unwrap();
        session.set_param("model", json!("m"), &task()).unwrap();
        assert!(budget.used() < 1000, "{}", budget.used());
        for _ in 0..50 {
            let definition = format!(
                r#"{{"type":"function","function":{{"name":"t","description":"{}"}}}}"#,
                "d".repeat(50_000)
            );
            session
                .add_guest_tool(GuestTool::parse(1, &definition).unwrap())
                .unwrap();
        }
        assert!(budget.used() < 100_000, "{}", budget.used());
        assert_eq!(session.guest_tools.len(), 1, "replaced, not added");
    }

    #[test]
    fn a_refused_or_failed_param_changes_nothing() {
        let budget = budget(10_000);
        let mut session = ChatSession::new(&task(), &budget);
        assert_eq!(
            session.set_param("stop", json!("x".repeat(20_000)), &task()),
            Err(SetParamError::Budget(Errno::ENOMEM))
        );
        assert!(!session.upstream.contains_key("stop"));
        assert!(matches!(
            session.set_param("max_iterations", json!("many"), &task()),
            Err(SetParamError::Param(ParamError::Invalid(_)))
        ));
        assert!(matches!(
            session.set_param("mcp.server_ids", json!(["web", "x".repeat(100)]), &task()),
            Err(SetParamError::Param(ParamError::Denied(_)))
        ));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn writing_while_a_snapshot_is_out_copies_and_charges_the_copy() {
        let budget = budget(20_000);
        let mut session = ChatSession::new(&task(), &budget);
        let (six_thousand, charge) = message(&budget, &"x".repeat(6000));
        session.push_message(six_thousand, charge).unwrap();
        let one = budget.used();
        let snapshot = session.snapshot();
        assert_eq!(budget.used(), one, "a snapshot shares, and costs nothing");
        let (small, charge) = message(&budget, "y");
        session.push_message(small.clone(), charge).unwrap();
        assert!(budget.used() >= 2 * one, "the copy is charged");
        assert_eq!(snapshot.messages.len(), 1, "the snapshot did not change");
        assert_eq!(session.messages.len(), 2);
        drop(snapshot);
        assert_eq!(budget.used(), session.charged_bytes());
        // A copy that does not fit is refused, and the session stays as it was.
        let snapshot = session.snapshot();
        let _filler = budget
            .charge("filler", 20_000 - budget.used() - 100)
            .unwrap();
        assert_eq!(
            session.push_message(small, budget.empty("none")),
            Err(Errno::ENOMEM)
        );
        assert_eq!(session.messages.len(), 2);
        drop(snapshot);
    }
}
