//! What a server record is made of: transports, lifecycle, approval, budgets, the record
//! as written, the loaded entry and the secret-free view guests see.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use rmcp::model::ProtocolVersion;
use serde::{Deserialize, Serialize};

use super::launch::{Launch, LaunchUnavailable};
use super::secrets::Secrets;

/// How the host talks to a server.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Stdio,
    StreamableHttp,
    HttpSseLegacy,
}

/// How the client opens an MCP session with the server.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// The `initialize` handshake only (protocol 2025-11-25 and earlier, or the record's
    /// `protocol_version`), for a server that mishandles `server/discover`.
    Initialize,
    /// `server/discover` with protocol 2026-07-28 only, for servers that dropped
    /// `initialize`.
    Discover,
    /// `server/discover` first, then `initialize` when the server answers it as an older
    /// server does: one extra round trip against an older server, none against a
    /// 2026-07-28 one. On stdio and legacy SSE a `ping` sent with it tells a server that
    /// ignores unknown methods from a slow one. The default.
    #[default]
    Auto,
}

/// Whether a tool call needs a human or programmatic approval first.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Calls run without approval.
    #[default]
    Never,
    /// Every call waits for the host's approver (refused when the host has none).
    Always,
    /// Calls of tools matching `approval_tools` wait for the approver; the rest run. With
    /// no patterns every call waits (fail closed).
    Policy,
}

impl ApprovalPolicy {
    /// The name as written in a registry file.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalPolicy::Never => "never",
            ApprovalPolicy::Always => "always",
            ApprovalPolicy::Policy => "policy",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StdioConfig {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host variables passed through unchanged: `["X"]` means `env.X = "${ENV:X}"`.
    #[serde(default)]
    pub env_from: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Stop the server after this long without a call (0: never); default
    /// [`defaults::SERVER_IDLE_TIMEOUT`](crate::defaults::SERVER_IDLE_TIMEOUT) or the
    /// host's setting. The next call starts it again.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Name of a credential defined in host configuration (used by remote transports).
    #[serde(default)]
    pub auth_ref: Option<String>,
}

/// `[sampling]` of a record: whether the server may have the task's model complete its
/// `sampling/createMessage` requests, and within what. Absent (or `allow = false`), every
/// sampling request of the server is refused: deny by default.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Let the server's sampling requests reach the task's model.
    #[serde(default)]
    pub allow: bool,
    /// The host backend (`[backends.NAME]`) that answers; absent: the host's default one.
    #[serde(default)]
    pub backend: Option<String>,
    /// The model asked for; absent: the backend's `default_model`. The server's
    /// `modelPreferences` are hints only and never choose another.
    #[serde(default)]
    pub model: Option<String>,
    /// Largest `maxTokens` a request may ask for; a larger one is refused
    /// ([`defaults::SAMPLING_MAX_TOKENS`](crate::defaults::SAMPLING_MAX_TOKENS)).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Sampling requests one task answers for this server
    /// ([`defaults::SAMPLING_MAX_REQUESTS`](crate::defaults::SAMPLING_MAX_REQUESTS)).
    #[serde(default)]
    pub max_requests: Option<u32>,
    /// Longest one request to the model may take (the backend's `request_timeout_ms`
    /// otherwise); never past the task's deadline.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Per-server budgets with the [`defaults`](crate::defaults) filled in; never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    pub tool_timeout: Duration,
    pub max_concurrency: u32,
    pub max_tool_output_bytes: u64,
    /// Total bytes of the tools' JSON over every `tools/list` page.
    pub max_tool_list_bytes: u64,
    /// Time to connect and finish the handshake; `None` means the host's connect timeout
    /// ([`defaults::CONNECT_TIMEOUT`](crate::defaults::CONNECT_TIMEOUT) unless the host
    /// sets another).
    pub connect_timeout: Option<Duration>,
}

/// One server as written in its file, with defaults applied and references unresolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRecord {
    pub server_id: String,
    pub display_name: String,
    pub transport: Transport,
    pub stdio: Option<StdioConfig>,
    pub http: Option<HttpConfig>,
    pub tool_namespace: String,
    pub allowed_tools: Vec<String>,
    /// The resource URIs (patterns as in `allowed_tools`) guests may list and read; empty
    /// means none.
    pub allowed_resources: Vec<String>,
    /// The prompt names (patterns as in `allowed_tools`) guests may list and get; empty
    /// means none.
    pub allowed_prompts: Vec<String>,
    pub approval_policy: ApprovalPolicy,
    /// With `approval_policy = "policy"`: the tools (patterns as in `allowed_tools`) whose
    /// calls wait for approval.
    pub approval_tools: Vec<String>,
    /// Longest wait for an approval; `None` means
    /// [`defaults::APPROVAL_TIMEOUT`](crate::defaults::APPROVAL_TIMEOUT).
    pub approval_timeout: Option<Duration>,
    pub budgets: Budgets,
    /// Labels profiles select servers by (e.g. `scm`, `search`).
    pub tags: Vec<String>,
    pub lifecycle: Lifecycle,
    /// The protocol version the `initialize` handshake asks for (with `lifecycle =
    /// "initialize"` and in `"auto"`'s fallback); `None` means
    /// [`ProtocolVersion::LATEST_WITH_INITIALIZE`]. For servers that accept only an older
    /// version. Always one of rmcp's known versions that has an `initialize` handshake.
    pub protocol_version: Option<ProtocolVersion>,
    /// Write the values of this server's call arguments to the audit log (redacted and
    /// size-capped); otherwise only their top-level keys and size are logged.
    pub audit_arguments: bool,
    /// Tool name → the pin of its approved definition ([`tool_digest`](super::tool_digest));
    /// a tool whose listed definition has another digest is neither offered nor called.
    pub pins: BTreeMap<String, String>,
    /// Refuse every tool without a pin (otherwise unpinned tools behave as if there were
    /// no pins at all).
    pub pin_required: bool,
    /// Whether and how the server's sampling requests are answered (default: refused).
    pub sampling: SamplingConfig,
}

impl ServerRecord {
    /// Whether tool definitions are checked for this server at all.
    pub fn pins_apply(&self) -> bool {
        self.pin_required || !self.pins.is_empty()
    }
}

#[cfg(test)]
impl ServerRecord {
    /// A stdio record for unit tests: named `id` throughout, every tool allowed, no
    /// approval, one-byte output caps, no launch settings.
    pub(crate) fn for_tests(id: &str) -> Self {
        ServerRecord {
            server_id: id.into(),
            display_name: id.into(),
            transport: Transport::Stdio,
            stdio: None,
            http: None,
            tool_namespace: format!("mcp.{id}"),
            allowed_tools: vec!["*".into()],
            allowed_resources: vec![],
            allowed_prompts: vec![],
            approval_policy: ApprovalPolicy::Never,
            approval_tools: vec![],
            approval_timeout: None,
            budgets: Budgets {
                tool_timeout: crate::defaults::TOOL_TIMEOUT,
                max_concurrency: 1,
                max_tool_output_bytes: 1,
                max_tool_list_bytes: 1,
                connect_timeout: None,
            },
            tags: vec![],
            lifecycle: Default::default(),
            protocol_version: None,
            audit_arguments: false,
            pins: BTreeMap::new(),
            pin_required: false,
            sampling: SamplingConfig::default(),
        }
    }
}

/// A loaded server: its record, where it came from, and how to launch it (or why not).
#[derive(Debug)]
pub struct ServerEntry {
    pub record: ServerRecord,
    pub source: PathBuf,
    pub launch: Result<Launch, LaunchUnavailable>,
}

impl ServerEntry {
    pub fn server_id(&self) -> &str {
        &self.record.server_id
    }

    /// What the record's `${ENV:..}` references resolved to (none when it cannot launch):
    /// to be cut out of every error and log line about this server.
    pub fn secrets(&self) -> &Secrets {
        static NONE: std::sync::LazyLock<Secrets> = std::sync::LazyLock::new(Secrets::default);
        self.launch.as_ref().map_or(&NONE, Launch::secrets)
    }

    /// Whether `other` connects the same way: same resolved launch, transport settings,
    /// handshake and concurrency. Only then may a reload keep this server's connection;
    /// policy fields (allowed tools, namespace, tags, timeouts, caps) apply per call.
    pub fn connects_like(&self, other: &ServerEntry) -> bool {
        let (a, b) = (&self.record, &other.record);
        self.launch == other.launch
            && a.transport == b.transport
            && a.stdio == b.stdio
            && a.http == b.http
            && a.lifecycle == b.lifecycle
            && a.protocol_version == b.protocol_version
            && a.budgets.connect_timeout == b.budgets.connect_timeout
            && a.budgets.max_concurrency == b.budgets.max_concurrency
    }

    /// What a guest may see of this server: no command line, env, URL or headers.
    pub fn view(&self) -> ServerView {
        let r = &self.record;
        ServerView {
            server_id: r.server_id.clone(),
            display_name: r.display_name.clone(),
            transport: r.transport,
            tool_namespace: r.tool_namespace.clone(),
            allowed_tools: r.allowed_tools.clone(),
            allowed_resources: r.allowed_resources.clone(),
            allowed_prompts: r.allowed_prompts.clone(),
            approval_policy: r.approval_policy,
            approval_tools: r.approval_tools.clone(),
            tags: r.tags.clone(),
            budgets: BudgetsView {
                tool_timeout_ms: r.budgets.tool_timeout.as_millis() as u64,
                max_concurrency: r.budgets.max_concurrency,
                max_tool_output_bytes: r.budgets.max_tool_output_bytes,
                max_tool_list_bytes: r.budgets.max_tool_list_bytes,
                connect_timeout_ms: r.budgets.connect_timeout.map(|t| t.as_millis() as u64),
            },
            available: self.launch.is_ok(),
            unavailable_reason: self.launch.as_ref().err().map(ToString::to_string),
        }
    }
}

/// The secret-free, guest-visible view of a server (`mcp_registry_list` / `_get`).
#[derive(Clone, Debug, Serialize)]
pub struct ServerView {
    pub server_id: String,
    pub display_name: String,
    pub transport: Transport,
    pub tool_namespace: String,
    pub allowed_tools: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_resources: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_prompts: Vec<String>,
    pub approval_policy: ApprovalPolicy,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approval_tools: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    pub budgets: BudgetsView,
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BudgetsView {
    pub tool_timeout_ms: u64,
    pub max_concurrency: u32,
    pub max_tool_output_bytes: u64,
    pub max_tool_list_bytes: u64,
    /// Only when the record sets it; otherwise the host's connect timeout applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
}

/// A server id is 1..=[`defaults::MAX_SERVER_ID_BYTES`] of `[A-Za-z0-9_-]`: safe in file
/// names, log fields and the model-facing names `mcp__<id>__<tool>` / `mcp.<id>.<tool>`.
pub fn is_valid_server_id(id: &str) -> bool {
    (1..=crate::defaults::MAX_SERVER_ID_BYTES).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
