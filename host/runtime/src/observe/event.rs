//! The events observers get. Everything in them is safe to log: no secrets, no unbounded
//! strings a guest or model chose, and no argument values unless the server's record opts
//! in (`audit_arguments`), and then redacted and capped.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::defaults;
use crate::policy::Reason;
use crate::registry::{ServerEntry, redact_known};
use crate::text::cut;

/// Which path a tool call took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The guest called `mcp_call_tool` on an MCP session fd.
    McpCall,
    /// The chat loop ran a tool the model asked for (`cchat_send` with AUTO_TOOL_CALL).
    Chat,
    /// Library code called [`Host::call_tool`](crate::Host::call_tool) in a task's name;
    /// there is no guest fd.
    Library,
}

/// What kind of tool was called.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolKind {
    /// A tool of an MCP server in the registry.
    Mcp { server_id: String },
    /// A function the guest registered with its chat session.
    Guest,
}

/// The shape of a call's arguments: their top-level keys (in the order the caller wrote them)
/// and size, never their values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArgumentsSummary {
    pub keys: Vec<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub keys_omitted: usize,
    pub bytes: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ArgumentsSummary {
    /// The summary of a parsed JSON object of `bytes` bytes.
    pub fn of_object(object: &serde_json::Map<String, serde_json::Value>, bytes: u64) -> Self {
        let mut summary = Self {
            bytes,
            ..Self::default()
        };
        for key in object.keys() {
            summary.add_key(key);
        }
        summary
    }

    /// The summary of JSON text: its top-level keys if it is an object, none otherwise.
    /// Reads the text once without building it; values are skipped.
    pub fn of_json_text(text: &str) -> Self {
        let mut summary = Self {
            bytes: text.len() as u64,
            ..Self::default()
        };
        let mut de = serde_json::Deserializer::from_str(text);
        if KeyCollector(&mut summary).deserialize(&mut de).is_err() {
            summary.keys.clear();
            summary.keys_omitted = 0;
        }
        summary
    }

    fn add_key(&mut self, key: &str) {
        if self.keys.len() >= defaults::MAX_SUMMARY_KEYS {
            self.keys_omitted = self.keys_omitted.saturating_add(1);
            return;
        }
        self.keys
            .push(cut(key, defaults::MAX_SUMMARY_KEY_BYTES).to_owned());
    }
}

/// Collects the top-level keys of a JSON object into a summary, skipping values.
struct KeyCollector<'a>(&'a mut ArgumentsSummary);

impl<'de> DeserializeSeed<'de> for KeyCollector<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyCollector<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            self.0.add_key(&key);
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// One tool call, as reported before it runs and again with its end.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCall {
    pub task_id: Arc<str>,
    /// Who submitted the task ([`TaskSpec::principal`](crate::TaskSpec::principal)); set
    /// by the host for every event of the task.
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
    #[serde(flatten)]
    pub kind: ToolKind,
    /// The tool's name as its server or guest defines it (not the model-facing name).
    pub tool: String,
    pub arguments: ArgumentsSummary,
    /// The arguments' JSON text, only for a server whose record sets `audit_arguments`
    /// (see [`ToolCall::audited_arguments`]); serialised as the JSON it holds.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "json_text")]
    pub argument_values: Option<Arc<str>>,
    #[serde(serialize_with = "unix_seconds")]
    pub started_at: SystemTime,
}

impl ToolCall {
    /// What [`ToolCall::argument_values`] holds for a call of `entry`'s tool with `text`:
    /// nothing unless the record sets `audit_arguments` and the text is at most
    /// [`defaults::AUDIT_ARGUMENT_VALUES_MAX_BYTES`]; the record's secrets, and every other
    /// value a `${ENV:..}` reference resolved to in this process, cut out. Empty (or
    /// blank) text is what the call sends: `{}`.
    pub fn audited_arguments(entry: &ServerEntry, text: &str) -> Option<Arc<str>> {
        if !entry.record.audit_arguments || text.len() > defaults::AUDIT_ARGUMENT_VALUES_MAX_BYTES {
            return None;
        }
        if text.bytes().all(|b| b.is_ascii_whitespace()) {
            return Some("{}".into());
        }
        let own = entry.secrets().redact(text);
        Some(redact_known(&own).into())
    }

    pub fn server_id(&self) -> Option<&str> {
        match &self.kind {
            ToolKind::Mcp { server_id } => Some(server_id),
            ToolKind::Guest => None,
        }
    }
}

/// How a tool call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "error", rename_all = "snake_case")]
pub enum ToolOutcome {
    /// A result, not marked as an error.
    Ok,
    /// The tool answered with an error result (MCP `isError`, a guest tool's failure).
    ToolError,
    /// The server or host failed the call (its `error.code`).
    Failed(&'static str),
    /// The call ran past its `tool_timeout_ms`.
    Timeout,
    /// The call never finished: the task ended (deadline, trap) or dropped it.
    Cancelled,
}

impl ToolOutcome {
    /// A short, fixed label (for metrics).
    pub fn label(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::ToolError => "tool_error",
            ToolOutcome::Failed(_) => "error",
            ToolOutcome::Timeout => "timeout",
            ToolOutcome::Cancelled => "cancelled",
        }
    }
}

/// The end of a tool call.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallEnd {
    #[serde(flatten)]
    pub outcome: ToolOutcome,
    #[serde(serialize_with = "millis")]
    pub duration: Duration,
    /// Bytes of the result as the guest or model receives it (before any truncation).
    pub output_bytes: u64,
}

/// Policy refused a server or a tool.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyDenial {
    pub task_id: Arc<str>,
    /// Who submitted the task; set by the host for every event of the task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    /// The client that submitted the task for its principal
    /// ([`TaskSpec::client`](crate::TaskSpec::client)): a node's client; set
    /// by the host like the principal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    /// The guest fd involved, when there is one (`mcp_open` has none yet, nor has a
    /// library call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_fd: Option<i32>,
    /// What was refused: `mcp_open`, `mcp_call_tool` (a guest's or a library's direct
    /// call of an MCP tool), `cchat_send`, ...
    pub action: &'static str,
    /// The path a refused tool call took; absent when no tool call was refused (a server,
    /// a resource, a prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
    pub server_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub reason: Reason,
    pub detail: String,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

impl PolicyDenial {
    /// Policy refused `tool` of `server_id` to a call through `action`. A tool name or
    /// server id longer than any the registry may hold (it came from a model) is cut.
    pub fn of_tool(
        task_id: Arc<str>,
        session_fd: i32,
        action: &'static str,
        (server_id, tool): (&str, &str),
        reason: Reason,
        detail: String,
    ) -> Self {
        Self {
            task_id,
            principal: None,
            client: None,
            session_fd: Some(session_fd),
            action,
            via: None,
            server_id: cut(server_id, defaults::MAX_SERVER_ID_BYTES).to_owned(),
            tool: Some(cut(tool, defaults::MAX_TOOL_NAME_BYTES).to_owned()),
            reason,
            detail,
            at: SystemTime::now(),
        }
    }

    /// The same denial, of a tool call that took `via`.
    #[must_use]
    pub fn with_via(self, via: Via) -> Self {
        Self {
            via: Some(via),
            ..self
        }
    }
}

/// An operator pinned a server's tool definitions (`quiver registry pin`, the admin API):
/// each tool whose pin changed, with the old and the new digest.
#[derive(Clone, Debug, Serialize)]
pub struct PinsChanged {
    pub server_id: String,
    /// Who pinned: the admin API's caller, or `cli`.
    pub by: String,
    pub changes: Vec<PinChange>,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// One tool's pin before and after (`None`: there was none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PinChange {
    pub tool: String,
    pub old: Option<String>,
    pub new: String,
}

/// One `input_required` round (SEP-2322) of a task's request: what the server asked and
/// how each question was answered, before the request is sent again (or failed).
#[derive(Clone, Debug, Serialize)]
pub struct InputRound {
    pub task_id: Arc<str>,
    /// Set by the observers from the task's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_fd: Option<i32>,
    pub via: Via,
    pub server_id: String,
    /// `tools/call`, `prompts/get` or `resources/read`.
    pub method: &'static str,
    /// The tool, prompt or resource URI (cut).
    pub name: String,
    /// 1 for the server's first `input_required` answer.
    pub round: u32,
    /// Each request of the round, in the server's key order.
    pub inputs: Vec<InputAnswered>,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// A server's sampling request during one of a task's requests, and what became of it:
/// the model that answered and the tokens it used, or why it was refused. It holds no
/// prompt or answer text.
#[derive(Clone, Debug, Serialize)]
pub struct SamplingDone {
    pub task_id: Arc<str>,
    /// Set by the observers from the task's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_fd: Option<i32>,
    pub via: Via,
    pub server_id: String,
    /// The task's request it came with: `tools/call`, `prompts/get` or `resources/read`.
    pub method: &'static str,
    /// The tool, prompt or resource URI (cut).
    pub name: String,
    /// `input_required` (SEP-2322) or `request` (a 2025-era server's own request).
    pub generation: &'static str,
    /// `answered` or `refused`.
    pub outcome: &'static str,
    /// Why it was refused: `not_allowed` (the record does not allow sampling),
    /// `max_tokens`, `max_requests`, `task_budget`, `too_large`, `unsupported` (content or
    /// audio the backend does not take), `no_backend`, `timeout`, `llm_error`, `busy`
    /// (another request of the connection owns it, or it came too often).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// What the server was told, for a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The request's `maxTokens`.
    pub max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    pub duration_ms: u64,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// One input request of a round and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InputAnswered {
    /// The server's key for it (cut).
    pub key: String,
    /// `elicitation`, `sampling` or `roots`.
    pub kind: &'static str,
    /// `accept`, `decline` or `cancel` (a question), `answered` (roots, sampling), `refused` (the
    /// request fails: nothing may answer it).
    pub outcome: &'static str,
    /// Who answered: `guest` (its `mcp_elicit_fn` callback), `approver`, `host` (a decline
    /// nobody else gave, the roots, a refusal), `model` (sampling; its [`SamplingDone`]
    /// event says more).
    pub by: &'static str,
}

/// A status of a server's task (the MCP tasks extension, SEP-2663) running one of a task's
/// tool calls, as the host saw it when it polled: reported when the status or its message
/// changes, at most [`MAX_TASK_STATUS_REPORTS`](crate::defaults::MAX_TASK_STATUS_REPORTS)
/// times per server task.
#[derive(Clone, Debug, Serialize)]
pub struct McpTaskStatus {
    pub task_id: Arc<str>,
    /// Set by the observers from the task's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_fd: Option<i32>,
    pub via: Via,
    pub server_id: String,
    pub tool: String,
    /// The server's id of its task (printable).
    pub server_task_id: String,
    /// `working`, `input_required`, `completed`, `failed` or `cancelled`.
    pub status: &'static str,
    /// The server's `statusMessage`, cut, made printable and without the server's
    /// secrets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// A decision on a tool call that waited for approval, as the host's approver gave it.
#[derive(Clone, Debug, Serialize)]
pub struct ApprovalDecided {
    /// The request's id, as [`ApprovalRequest::id`](crate::ApprovalRequest::id).
    pub id: String,
    pub task_id: Arc<str>,
    /// Who submitted the task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    /// The client that submitted the task for its principal
    /// ([`TaskSpec::client`](crate::TaskSpec::client)): a node's client; set
    /// by the host like the principal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    pub via: Via,
    pub server_id: String,
    pub tool: String,
    pub approved: bool,
    /// The approver's reason, cut and made printable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who decided ([`ApprovalDecision::decided_by`](crate::ApprovalDecision::decided_by),
    /// e.g. the node's client); absent when the approver itself did (a terminal prompt,
    /// [`DenyAll`](crate::approval::DenyAll), a full queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(serialize_with = "unix_seconds")]
    pub at: SystemTime,
}

/// Serialises a time as unix seconds (a float; 0 before 1970), the one time format of
/// every JSON the host writes.
pub(crate) fn unix_seconds<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    s.serialize_f64(secs)
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// JSON text as the JSON it holds; as a string if it is not JSON (a cut secret can break
/// it), so a line always parses.
fn json_text<S: serde::Serializer>(text: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    let text = text.as_deref().unwrap_or("null");
    match crate::json::from_str::<serde_json::Value>(text) {
        Ok(value) => value.serialize(s),
        Err(_) => s.serialize_str(text),
    }
}
