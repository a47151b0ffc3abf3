//! `quiver run --explain-policy`: the decision log of a task, as a person reads it.

use std::fmt;

use super::{Decision, Kind, Lists, Reason, TaskMcpPolicy};

/// What a task's chat sessions start with, and why everything else is left out.
#[derive(Clone, Debug)]
pub struct PolicyReport {
    pub task_id: String,
    pub registry_revision: String,
    pub task: TaskMcpPolicy,
    pub warnings: Vec<String>,
    /// Servers a session starts with, and the model-facing tool names they offer.
    pub offered: Vec<(String, Vec<String>)>,
    /// Servers the task allows that are not defaults (a session may enable them).
    pub allowed_not_default: Vec<String>,
    /// Every server and tool left out, with the reason, and every offered tool whose calls
    /// wait for an approval ([`Reason::NeedsApproval`]).
    pub decisions: Vec<Decision>,
}

fn list(items: &[impl fmt::Display]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for PolicyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.task;
        writeln!(
            f,
            "MCP policy for task `{}` (registry revision {})",
            self.task_id, self.registry_revision
        )?;
        let lists = |kind: Kind| {
            let lists = t.narrowing.lists(kind);
            let allow = lists
                .allow
                .as_ref()
                .map_or("none (other layers decide)".to_owned(), |l| {
                    format!("[{}]", list(l))
                });
            format!(
                "{kind}_allowlist={allow} {kind}_denylist=[{}]",
                list(&lists.deny)
            )
        };
        write!(
            f,
            "  task: mcp.enabled={} profile={} allowed=[{}] defaults=[{}] {}",
            t.enabled,
            t.profile.as_ref().map_or("none", |p| p.name.as_str()),
            list(&t.allowed_server_ids),
            list(&t.default_server_ids),
            lists(Kind::Tool),
        )?;
        // Resource and prompt lists only when the task sets them: most tasks use neither.
        for kind in [Kind::Resource, Kind::Prompt] {
            if *t.narrowing.lists(kind) != Lists::default() {
                write!(f, " {}", lists(kind))?;
            }
        }
        writeln!(f)?;
        for warning in &self.warnings {
            writeln!(f, "  warning: {warning}")?;
        }
        for (server, tools) in &self.offered {
            writeln!(
                f,
                "  offered  {server}: {} tools: {}",
                tools.len(),
                list(tools)
            )?;
        }
        for server in &self.allowed_not_default {
            writeln!(
                f,
                "  allowed  {server}: not a default; a session may enable it with mcp.server_ids"
            )?;
        }
        for decision in &self.decisions {
            let label = match decision.reason {
                Reason::NeedsApproval => "approval",
                _ => "excluded",
            };
            writeln!(f, "  {label} {decision}")?;
        }
        Ok(())
    }
}
