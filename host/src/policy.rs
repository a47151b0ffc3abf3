//! Who may use which MCP server and tool: patterns and the task-level decisions.
//!
//! Policy is pure: it reads registry records and the task's MCP settings and answers yes or
//! no with a reason, and never does I/O. Each layer can only narrow what the one above it
//! allows: the registry's `allowed_tools` (empty means deny all), then the task's
//! `mcp.allowed_server_ids` and tool allow/deny lists. A denylist entry is a final veto.

use std::fmt;

/// A tool-name pattern: `*` matches any run of characters, `?` exactly one; everything else
/// matches itself. Patterns apply to MCP-native tool names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn new(pattern: impl Into<String>) -> Self {
        Self(pattern.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches; linear-time backtracking on the last `*`, so a hostile
    /// pattern cannot blow up.
    pub fn matches(&self, name: &str) -> bool {
        let pattern: Vec<char> = self.0.chars().collect();
        let text: Vec<char> = name.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
                p += 1;
                t += 1;
            } else if p < pattern.len() && pattern[p] == '*' {
                star = Some((p, t));
                p += 1;
            } else if let Some((star_p, star_t)) = star {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            } else {
                return false;
            }
        }
        pattern[p..].iter().all(|&c| c == '*')
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn any_match(patterns: &[Pattern], name: &str) -> Option<Pattern> {
    patterns.iter().find(|p| p.matches(name)).cloned()
}

/// The task layer's MCP settings, parsed from the task's `config` by [`crate::task`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMcpPolicy {
    /// `mcp.enabled`; without it the task can open no server at all.
    pub enabled: bool,
    /// `mcp.default_server_ids`: the servers a session starts with.
    pub default_server_ids: Vec<String>,
    /// `mcp.allowed_server_ids`: the ceiling; equals the defaults when absent.
    pub allowed_server_ids: Vec<String>,
    /// `mcp.tool_allowlist`; `None` leaves the registry's list as the only allowlist.
    pub tool_allowlist: Option<Vec<Pattern>>,
    /// `mcp.tool_denylist`: a veto over every allowlist.
    pub tool_denylist: Vec<Pattern>,
}

/// Why a server or tool is not available to a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// The task does not set `mcp.enabled`.
    McpDisabled,
    /// The server is not in the task's `mcp.allowed_server_ids`.
    NotAllowedByTask,
    /// The registry record's `allowed_tools` does not match the tool (or is empty).
    NotInRegistryAllowlist,
    /// The task's `mcp.tool_allowlist` does not match the tool.
    NotInTaskAllowlist,
    /// The chat session's `mcp.tool_allowlist` does not match the tool.
    NotInSessionAllowlist,
    /// The chat session did not enable this server (or MCP at all).
    NotEnabledBySession,
    /// A denylist pattern matches the tool.
    DeniedByPattern(Pattern),
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::McpDisabled => f.write_str("the task does not enable MCP (mcp.enabled)"),
            Denial::NotAllowedByTask => {
                f.write_str("the server is not in the task's mcp.allowed_server_ids")
            }
            Denial::NotInRegistryAllowlist => {
                f.write_str("the tool is not in the registry's allowed_tools for this server")
            }
            Denial::NotInTaskAllowlist => {
                f.write_str("the tool is not in the task's mcp.tool_allowlist")
            }
            Denial::NotInSessionAllowlist => {
                f.write_str("the tool is not in the session's mcp.tool_allowlist")
            }
            Denial::NotEnabledBySession => {
                f.write_str("the chat session does not enable this server (mcp.server_ids)")
            }
            Denial::DeniedByPattern(p) => write!(f, "the tool matches deny pattern `{p}`"),
        }
    }
}

impl TaskMcpPolicy {
    /// Whether the task may open `server_id` (a server the registry knows).
    pub fn may_open(&self, server_id: &str) -> Result<(), Denial> {
        if !self.enabled {
            return Err(Denial::McpDisabled);
        }
        if !self.allowed_server_ids.iter().any(|id| id == server_id) {
            return Err(Denial::NotAllowedByTask);
        }
        Ok(())
    }
}

/// The tool filter of one server: registry allowlist ∩ task allowlist (∩ session
/// allowlist), minus every denylist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFilter {
    registry_allow: Vec<Pattern>,
    task_allow: Option<Vec<Pattern>>,
    session_allow: Option<Vec<Pattern>>,
    deny: Vec<Pattern>,
}

impl ToolFilter {
    pub fn new(registry_allowed_tools: &[String], task: &TaskMcpPolicy) -> Self {
        Self {
            registry_allow: registry_allowed_tools.iter().map(Pattern::new).collect(),
            task_allow: task.tool_allowlist.clone(),
            session_allow: None,
            deny: task.tool_denylist.clone(),
        }
    }

    /// Narrows the filter by a chat session's allow and deny lists.
    #[must_use]
    pub fn with_session(mut self, allow: Option<&[Pattern]>, deny: &[Pattern]) -> Self {
        self.session_allow = allow.map(<[Pattern]>::to_vec);
        self.deny.extend_from_slice(deny);
        self
    }

    /// Whether `tool` (an MCP-native name) passes every layer.
    pub fn check(&self, tool: &str) -> Result<(), Denial> {
        if let Some(p) = any_match(&self.deny, tool) {
            return Err(Denial::DeniedByPattern(p));
        }
        if any_match(&self.registry_allow, tool).is_none() {
            return Err(Denial::NotInRegistryAllowlist);
        }
        if let Some(allow) = &self.task_allow
            && any_match(allow, tool).is_none()
        {
            return Err(Denial::NotInTaskAllowlist);
        }
        if let Some(allow) = &self.session_allow
            && any_match(allow, tool).is_none()
        {
            return Err(Denial::NotInSessionAllowlist);
        }
        Ok(())
    }

    pub fn permits(&self, tool: &str) -> bool {
        self.check(tool).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let cases = [
            ("*", "anything", true),
            ("*", "", true),
            ("read_*", "read_text", true),
            ("read_*", "write_text", false),
            ("re?d", "read", true),
            ("re?d", "reed_", false),
            ("*_file", "delete_file", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("echo", "echo", true),
            ("echo", "echo2", false),
            ("", "", true),
            ("", "x", false),
            ("?", "é", true),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(
                Pattern::new(pattern).matches(name),
                want,
                "{pattern} vs {name}"
            );
        }
    }

    #[test]
    fn hostile_pattern_is_fast() {
        let pattern = Pattern::new("*a*a*a*a*a*a*a*a*a*a*b");
        let name = "a".repeat(10_000);
        assert!(!pattern.matches(&name));
    }

    fn task(allow: Option<&[&str]>, deny: &[&str]) -> TaskMcpPolicy {
        TaskMcpPolicy {
            enabled: true,
            default_server_ids: vec!["fs".into()],
            allowed_server_ids: vec!["fs".into()],
            tool_allowlist: allow.map(|a| a.iter().map(|p| Pattern::new(*p)).collect()),
            tool_denylist: deny.iter().map(|p| Pattern::new(*p)).collect(),
        }
    }

    #[test]
    fn layers_only_narrow() {
        let registry = vec!["read_*".to_string(), "delete_*".to_string()];
        let filter = ToolFilter::new(&registry, &task(Some(&["*"]), &["delete_*"]));
        assert!(filter.permits("read_text"));
        assert_eq!(
            filter.check("delete_file"),
            Err(Denial::DeniedByPattern(Pattern::new("delete_*")))
        );
        // The task's `*` cannot widen the registry's list.
        assert_eq!(
            filter.check("write_text"),
            Err(Denial::NotInRegistryAllowlist)
        );
        let narrow = ToolFilter::new(&registry, &task(Some(&["read_a*"]), &[]));
        assert_eq!(narrow.check("read_text"), Err(Denial::NotInTaskAllowlist));
    }

    #[test]
    fn empty_registry_allowlist_denies_all() {
        let filter = ToolFilter::new(&[], &task(None, &[]));
        assert_eq!(filter.check("echo"), Err(Denial::NotInRegistryAllowlist));
    }

    #[test]
    fn servers_need_enabled_and_allowed() {
        let mut policy = task(None, &[]);
        assert!(policy.may_open("fs").is_ok());
        assert_eq!(policy.may_open("git"), Err(Denial::NotAllowedByTask));
        policy.enabled = false;
        assert_eq!(policy.may_open("fs"), Err(Denial::McpDisabled));
    }
}
