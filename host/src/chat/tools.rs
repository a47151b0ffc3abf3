//! The tools of one send: guest tools and MCP tools under model-facing names, the name map
//! that routes the model's calls, and how results are turned into `tool` messages.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::ChatSession;
use crate::mcp::{CallToolResult, McpError, McpErrorCode, McpTask, Tool};
use crate::policy::{self, Decision, Effective, Reason, SessionRequest};
use crate::registry::{Registry, ServerEntry};

/// A tool the guest registered with `cchat_write_fn`.
#[derive(Clone, Debug)]
pub(crate) struct GuestTool {
    pub(crate) name: String,
    /// `{"type": "function", "function": {...}}` as sent upstream.
    pub(crate) definition: Value,
    /// Index into the guest's funcref table.
    pub(crate) table_index: u32,
}

/// OpenAI's rule for function names.
pub(crate) fn is_valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl GuestTool {
    /// Checks an OpenAI tool definition from the guest.
    pub(crate) fn parse(table_index: u32, definition: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(definition).map_err(|e| format!("not JSON: {e}"))?;
        if value["type"] != "function" {
            return Err("`type` must be \"function\"".into());
        }
        let function = value["function"]
            .as_object()
            .ok_or("`function` must be an object")?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or("`function.name` must be a string")?;
        if !is_valid_function_name(name) {
            return Err(format!(
                "function name {name:?} must match ^[a-zA-Z0-9_-]{{1,64}}$"
            ));
        }
        if name.starts_with("mcp__") {
            return Err(format!(
                "function name {name:?}: the prefix mcp__ is reserved for MCP tools"
            ));
        }
        if let Some(parameters) = function.get("parameters")
            && !parameters.is_object()
        {
            return Err("`function.parameters` must be a JSON Schema object".into());
        }
        Ok(Self {
            name: name.to_owned(),
            definition: json!({"type": "function", "function": function}),
            table_index,
        })
    }
}

/// Where a model-facing tool name leads.
#[derive(Clone, Debug)]
pub(crate) enum Route {
    Guest {
        table_index: u32,
    },
    Mcp {
        entry: Arc<ServerEntry>,
        tool: String,
    },
}

/// How a name the model used resolves.
pub(crate) enum Resolution<'a> {
    Route(&'a Route),
    /// An MCP tool this session does not allow, and why.
    Denied {
        server_id: String,
        tool: String,
        why: String,
    },
    Unknown,
}

/// The tools offered in one send, and the name map used to route the model's calls.
pub(crate) struct ToolSet {
    pub(crate) definitions: Vec<Value>,
    routes: HashMap<String, Route>,
    /// (server id, MCP-native tool) → model-facing name.
    mcp_names: HashMap<(String, String), String>,
    /// `<tool_namespace>.<tool>` → model-facing name, for names written the dotted way.
    namespaced: HashMap<String, String>,
    registry_ids: HashSet<String>,
    /// MCP servers whose tools were offered.
    pub(crate) servers: Vec<String>,
    /// The decision log: every requested server and listed tool left out, and why.
    pub(crate) decisions: Vec<Decision>,
}

/// The name the model sees for `tool` of the server with `namespace` (its registry
/// `tool_namespace`, default `mcp.<server_id>`): the namespace with dots as `__`, then
/// `__<tool>`, so the default gives `mcp__<server_id>__<tool>`. It is made to fit
/// `^[a-zA-Z0-9_-]{1,64}$`; a name that had to be shortened, or that collides with one
/// already taken, gets a hash of (server, tool).
pub(crate) fn mcp_model_name(
    namespace: &str,
    server_id: &str,
    tool: &str,
    taken: &HashSet<String>,
) -> String {
    let clean: String = format!("{}__{tool}", namespace.replace('.', "__"))
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= 64 && !taken.contains(&clean) {
        return clean;
    }
    let digest = Sha256::digest(format!("{server_id}\0{tool}").as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let mut base = clean;
    base.truncate(64 - 9);
    format!("{base}_{hash}")
}

/// The session's request to the policy.
pub(crate) fn session_request(session: &ChatSession) -> SessionRequest<'_> {
    SessionRequest {
        enabled: session.mcp.enabled,
        server_ids: &session.mcp.server_ids,
        tool_allowlist: session.mcp.tool_allowlist.as_deref(),
        tool_denylist: &session.mcp.tool_denylist,
    }
}

impl ToolSet {
    /// Guest tools plus the MCP tools the effective policy grants. Listing comes from the
    /// pool's cache; a server that cannot list is left out with its reason.
    pub(crate) async fn build(session: &ChatSession, mcp: &McpTask) -> Self {
        let effective = policy::effective(&mcp.registry, &mcp.policy, &session_request(session));
        let listings = futures::future::join_all(
            effective
                .servers
                .iter()
                .map(|grant| mcp.pool.list_tools(&grant.entry)),
        )
        .await;
        Self::assemble(session, &mcp.registry, effective, listings)
    }

    /// The pure part of [`build`](Self::build): names, definitions and the decision log from
    /// the effective policy and each granted server's listing (in grant order).
    pub(crate) fn assemble(
        session: &ChatSession,
        registry: &Registry,
        effective: Effective,
        listings: Vec<Result<Arc<[Tool]>, McpError>>,
    ) -> Self {
        let mut set = ToolSet {
            definitions: session
                .guest_tools
                .iter()
                .map(|t| t.definition.clone())
                .collect(),
            routes: session
                .guest_tools
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        Route::Guest {
                            table_index: t.table_index,
                        },
                    )
                })
                .collect(),
            mcp_names: HashMap::new(),
            namespaced: HashMap::new(),
            registry_ids: registry
                .servers()
                .map(|s| s.server_id().to_owned())
                .collect(),
            servers: Vec::new(),
            decisions: effective.decisions,
        };
        let mut taken: HashSet<String> = set.routes.keys().cloned().collect();
        for (grant, listed) in effective.servers.into_iter().zip(listings) {
            let server_id = grant.entry.server_id().to_owned();
            let tools = match listed {
                Ok(tools) => tools,
                Err(error) => {
                    let reason = if error.code == McpErrorCode::Timeout {
                        Reason::ListTimeout
                    } else {
                        Reason::ListFailed
                    };
                    tracing::warn!(server_id, %error, "leaving out an MCP server's tools");
                    set.decisions.push(Decision {
                        server_id,
                        tool: None,
                        reason,
                        detail: error.to_string(),
                    });
                    continue;
                }
            };
            let mut sorted: Vec<&Tool> = tools.iter().collect();
            sorted.sort_by(|a, b| a.name.cmp(&b.name));
            for tool in sorted {
                if let Err(denial) = grant.check_call(&tool.name) {
                    set.decisions.push(Decision {
                        server_id: server_id.clone(),
                        tool: Some(tool.name.to_string()),
                        reason: denial.reason(),
                        detail: denial.to_string(),
                    });
                    continue;
                }
                let namespace = &grant.entry.record.tool_namespace;
                let name = mcp_model_name(namespace, &server_id, &tool.name, &taken);
                taken.insert(name.clone());
                let mut function = json!({"name": name, "parameters": Value::Object((*tool.input_schema).clone())});
                if let Some(description) = &tool.description {
                    function["description"] = json!(description);
                }
                set.definitions
                    .push(json!({"type": "function", "function": function}));
                set.mcp_names
                    .insert((server_id.clone(), tool.name.to_string()), name.clone());
                set.namespaced
                    .insert(format!("{namespace}.{}", tool.name), name.clone());
                set.routes.insert(
                    name,
                    Route::Mcp {
                        entry: grant.entry.clone(),
                        tool: tool.name.to_string(),
                    },
                );
            }
            set.servers.push(server_id);
        }
        set
    }

    /// The offered name a name the model or guest used stands for: itself if offered, else
    /// the offered name of `<tool_namespace>.<tool>`, `mcp.<server_id>.<tool>` or
    /// `mcp__<server_id>__<tool>`.
    pub(crate) fn offered_name<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.routes.contains_key(name) {
            return Some(name);
        }
        if let Some(offered) = self.namespaced.get(name) {
            return Some(offered);
        }
        let (server_id, tool) = split_server_tool(name)?;
        self.mcp_names
            .get(&(server_id.to_owned(), tool.to_owned()))
            .map(String::as_str)
    }

    /// The model-facing names offered for `server_id`'s tools, sorted.
    pub(crate) fn offered_for(&self, server_id: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .mcp_names
            .iter()
            .filter(|((server, _), _)| server == server_id)
            .map(|(_, name)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// A forced `tool_choice` naming a tool the way a guest knows it (`mcp.<server>.<tool>`,
    /// the namespaced form, or the `mcp__` form) rewritten to the name actually offered;
    /// `None` when it needs no change.
    pub(crate) fn map_tool_choice(&self, choice: &Value) -> Option<Value> {
        let name = choice["function"]["name"].as_str()?;
        let offered = self.offered_name(name)?;
        (offered != name).then(|| {
            let mut mapped = choice.clone();
            mapped["function"]["name"] = json!(offered);
            mapped
        })
    }

    /// Routes a name the model used: an offered name, or one of the forms
    /// [`offered_name`](Self::offered_name) maps. Nothing else runs.
    pub(crate) fn resolve(&self, name: &str) -> Resolution<'_> {
        if let Some(offered) = self.offered_name(name) {
            return Resolution::Route(&self.routes[offered]);
        }
        let Some((server_id, tool)) = split_server_tool(name) else {
            return Resolution::Unknown;
        };
        if !self.registry_ids.contains(server_id) {
            return Resolution::Unknown;
        }
        let why = self
            .decisions
            .iter()
            .find(|d| d.server_id == server_id && d.tool.as_deref().is_none_or(|t| t == tool))
            .map_or_else(
                || "the session does not enable this server (mcp.server_ids)".to_owned(),
                |d| d.to_string(),
            );
        Resolution::Denied {
            server_id: server_id.to_owned(),
            tool: tool.to_owned(),
            why,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.definitions.is_empty()
    }
}

/// `(server_id, tool)` of `mcp.<server_id>.<tool>` or `mcp__<server_id>__<tool>`.
fn split_server_tool(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("mcp.")
        .and_then(|rest| rest.split_once('.'))
        .or_else(|| {
            name.strip_prefix("mcp__")
                .and_then(|rest| rest.split_once("__"))
        })
}

/// What kind of failure a tool call met: the `code` of its error result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolErrorCode {
    /// The model named a tool that was not offered.
    UnknownTool,
    /// A guest tool failed, or an MCP tool answered `isError`.
    ExecFailed,
    /// The host could not complete an MCP call (the codes of `mcp_call_tool`).
    Mcp(McpErrorCode),
}

impl ToolErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::ExecFailed => "tool_exec_failed",
            Self::Mcp(code) => code.as_str(),
        }
    }

    /// Whether trying the same call again later may succeed.
    pub(crate) fn retryable(self) -> bool {
        match self {
            Self::UnknownTool | Self::ExecFailed => false,
            Self::Mcp(code) => code.retryable(),
        }
    }
}

impl std::fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call that produced no result. The model sees it, serialised once by
/// [`to_content`](Self::to_content), as `{"error": {"code", "message", "retryable"}}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub(crate) struct ToolFailure {
    pub(crate) code: ToolErrorCode,
    pub(crate) message: String,
}

impl ToolFailure {
    pub(crate) fn new(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `tool_exec_failed`.
    pub(crate) fn exec(message: impl Into<String>) -> Self {
        Self::new(ToolErrorCode::ExecFailed, message)
    }

    /// The text of the `tool` message.
    pub(crate) fn to_content(&self) -> String {
        json!({"error": {
            "code": self.code.as_str(),
            "message": self.message,
            "retryable": self.code.retryable(),
        }})
        .to_string()
    }
}

impl From<McpError> for ToolFailure {
    fn from(error: McpError) -> Self {
        Self::new(ToolErrorCode::Mcp(error.code), error.message)
    }
}

/// The text of an MCP result for a `tool` message: its text parts, and a short note for
/// each part chat tool messages cannot carry (images, audio, resources). A result the
/// server marked `isError` is a `tool_exec_failed` failure carrying that text.
pub(crate) fn mcp_result_text(result: &CallToolResult) -> Result<String, ToolFailure> {
    let content = serde_json::to_value(&result.content).unwrap_or(Value::Null);
    let mut parts = Vec::new();
    for part in content.as_array().into_iter().flatten() {
        let size = |field: &str| human_size(part[field].as_str().map_or(0, |d| d.len() * 3 / 4));
        let mime = part["mimeType"].as_str().unwrap_or("unknown type");
        let note = match part["type"].as_str() {
            Some("text") => part["text"].as_str().unwrap_or_default().to_owned(),
            Some("image") => format!("[image: {mime}, {}]", size("data")),
            Some("audio") => format!("[audio: {mime}, {}]", size("data")),
            Some("resource_link") => {
                format!("[resource link: {}]", part["uri"].as_str().unwrap_or("?"))
            }
            Some("resource") => match part["resource"]["text"].as_str() {
                Some(text) => text.to_owned(),
                None => format!(
                    "[embedded resource: {}]",
                    part["resource"]["uri"].as_str().unwrap_or("?")
                ),
            },
            other => format!("[{} content]", other.unwrap_or("unknown")),
        };
        parts.push(note);
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        Err(ToolFailure::exec(text))
    } else {
        Ok(text)
    }
}

fn human_size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

fn cut_at_boundary(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Cuts `text` to at most `max` bytes at a UTF-8 boundary with an explicit marker. JSON
/// stays JSON: it becomes `{"truncated": true, "original_bytes": N, "prefix": "..."}`.
pub(crate) fn truncate_output(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let original = text.len();
    if serde_json::from_str::<Value>(&text).is_ok() {
        let mut budget = max.saturating_sub(64);
        loop {
            let wrapped = json!({"truncated": true, "original_bytes": original, "prefix": cut_at_boundary(&text, budget)}).to_string();
            if wrapped.len() <= max || budget == 0 {
                return wrapped;
            }
            budget = budget.saturating_sub(wrapped.len() - max).min(budget - 1);
        }
    }
    let mut marker = format!(
        "\n[truncated: output was {original} bytes; the limit is max_tool_output_bytes = {max}]"
    );
    if marker.len() >= max {
        marker = "…[truncated]".to_owned();
    }
    if marker.len() > max {
        return cut_at_boundary(&text, max).to_owned();
    }
    let keep = cut_at_boundary(&text, max - marker.len());
    format!("{keep}{marker}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_fit_openai_and_stay_stable() {
        let taken = HashSet::new();
        assert_eq!(
            mcp_model_name("mcp.fs", "fs", "read_text", &taken),
            "mcp__fs__read_text"
        );
        assert_eq!(
            mcp_model_name("mcp.fs", "fs", "read.text/v2", &taken),
            "mcp__fs__read_text_v2"
        );
        assert_eq!(
            mcp_model_name("acme.gh", "github", "create_issue", &taken),
            "acme__gh__create_issue"
        );
        let long = "x".repeat(80);
        let name = mcp_model_name("mcp.fs", "fs", &long, &taken);
        assert_eq!(name.len(), 64);
        assert_eq!(
            name,
            mcp_model_name("mcp.fs", "fs", &long, &taken),
            "stable"
        );
        let taken = HashSet::from(["mcp__fs__read_text_v2".to_owned()]);
        let second = mcp_model_name("mcp.fs", "fs", "read text v2", &taken);
        assert_ne!(second, "mcp__fs__read_text_v2");
        assert!(is_valid_function_name(&second) && is_valid_function_name(&name));
    }

    #[test]
    fn truncation_respects_utf8_and_json() {
        let text = "é".repeat(100); // 200 bytes of 2-byte chars
        let cut = truncate_output(text.clone(), 150);
        assert!(
            cut.len() <= 150 && cut.contains("[truncated: output was 200 bytes"),
            "{cut}"
        );
        assert!(cut.starts_with('é'));
        let json_text = serde_json::to_string(&json!({"items": vec!["ü"; 200]})).unwrap();
        let cut = truncate_output(json_text.clone(), 300);
        assert!(cut.len() <= 300, "{}", cut.len());
        let parsed: Value = serde_json::from_str(&cut).expect("still JSON");
        assert_eq!(parsed["truncated"], true);
        assert_eq!(parsed["original_bytes"], json_text.len());
        assert_eq!(truncate_output("short".into(), 300), "short");
        let tiny = truncate_output("x".repeat(100), 20);
        assert!(tiny.len() <= 20 && tiny.ends_with("[truncated]"), "{tiny}");
        assert_eq!(truncate_output("x".repeat(100), 5), "xxxxx");
    }

    #[test]
    fn tool_failures_serialise_as_before() {
        let unknown = ToolFailure::new(ToolErrorCode::UnknownTool, "no tool named `x`");
        assert_eq!(
            unknown.to_content(),
            r#"{"error":{"code":"unknown_tool","message":"no tool named `x`","retryable":false}}"#
        );
        let timeout: ToolFailure = McpError::new(McpErrorCode::Timeout, "slow").into();
        assert_eq!(timeout.code.as_str(), "mcp_timeout");
        assert_eq!(
            serde_json::from_str::<Value>(&timeout.to_content()).unwrap(),
            McpError::new(McpErrorCode::Timeout, "slow").to_json(),
            "the same JSON as mcp_call_tool's error results"
        );
        assert_eq!(
            ToolFailure::exec("boom").to_string(),
            "tool_exec_failed: boom"
        );
    }

    #[test]
    fn guest_tool_definitions_are_checked() {
        let ok = GuestTool::parse(3, r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}"#).unwrap();
        assert_eq!(ok.name, "get_weather");
        assert_eq!(ok.table_index, 3);
        for bad in [
            "not json",
            r#"{"type":"function"}"#,
            r#"{"type":"other","function":{"name":"x"}}"#,
            r#"{"type":"function","function":{"name":"has space"}}"#,
            r#"{"type":"function","function":{"name":"mcp__fs__x"}}"#,
            r#"{"type":"function","function":{"name":"x","parameters":"nope"}}"#,
        ] {
            assert!(GuestTool::parse(0, bad).is_err(), "{bad}");
        }
    }
}
