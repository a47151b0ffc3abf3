//! Who may use which MCP server and tool: the three-layer policy and its decision log.
//!
//! Policy is pure: it reads a registry snapshot, the task's MCP settings and a session's
//! request, and answers with what is granted and why everything else is not. It never does
//! I/O. Each layer only narrows the one above it:
//!
//! 1. the **registry** (platform): a server must be registered, and its `allowed_tools`
//!    bound every task (empty means deny all);
//! 2. the **task** (`task.json` config, optionally through a registry **profile**):
//!    `mcp.enabled`, the allowed and default servers, tool allow/deny lists;
//! 3. the **session** (a chat session's params, or the one server an `mcp_open` names).
//!
//! Effective servers = requested ∩ task-allowed ∩ registry; per server, the tool filter is
//! registry allowlist ∩ profile allowlist ∩ task allowlist ∩ session allowlist, and every
//! denylist is a final veto. [`effective`] is the one function every path goes through:
//! `mcp_open` and the registry views, chat tool injection, and the routing of every tool
//! call the model makes.

mod pattern;
mod report;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

pub use pattern::Pattern;
use pattern::any_match;
pub use report::PolicyReport;

use crate::registry::{ApprovalPolicy, Profile, Registry, ServerEntry};

/// The task layer, resolved against the registry (profiles applied).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMcpPolicy {
    /// `mcp.enabled`; without it the task can use no server at all.
    pub enabled: bool,
    /// `mcp.default_server_ids`: the servers a session starts with.
    pub default_server_ids: Vec<String>,
    /// `mcp.allowed_server_ids`: the ceiling; equals the defaults when absent.
    pub allowed_server_ids: Vec<String>,
    /// `mcp.tool_allowlist`; `None` leaves the other layers' lists in charge.
    pub tool_allowlist: Option<Vec<Pattern>>,
    /// `mcp.tool_denylist`: a veto over every allowlist.
    pub tool_denylist: Vec<Pattern>,
    /// The profile named by `mcp.profile`, if any.
    pub profile: Option<ProfileTools>,
}

/// What a profile adds to the tool filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileTools {
    pub name: String,
    pub tool_allowlist: Option<Vec<Pattern>>,
    pub tool_denylist: Vec<Pattern>,
}

/// The task's MCP config as written (`mcp.*` keys), before profiles are applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMcpConfig {
    pub enabled: bool,
    pub profile: Option<String>,
    pub default_server_ids: Option<Vec<String>>,
    pub allowed_server_ids: Option<Vec<String>>,
    pub tool_allowlist: Option<Vec<Pattern>>,
    pub tool_denylist: Vec<Pattern>,
}

/// A task config that does not fit the registry, naming the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("task config key `{key}`: {message}")]
pub struct TaskPolicyError {
    pub key: &'static str,
    pub message: String,
}

impl TaskMcpConfig {
    /// Applies the profile (if any) and checks the server sets. Without a profile, absent
    /// allowed servers equal the defaults. With one, the profile's servers are the
    /// ceiling: the task may narrow it, never widen it.
    pub fn resolve(&self, registry: &Registry) -> Result<TaskMcpPolicy, TaskPolicyError> {
        let (ceiling, profile) = match &self.profile {
            None => (None, None),
            Some(name) => {
                let profile = registry.profile(name).ok_or_else(|| TaskPolicyError {
                    key: "mcp.profile",
                    message: format!(
                        "no profile `{name}` in the registry (known: {})",
                        registry
                            .profiles()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
                (
                    Some(profile.servers(registry)),
                    Some(profile_tools(profile)),
                )
            }
        };
        let within = |key: &'static str, ids: &[String], bound: &[String], what: &str| match ids
            .iter()
            .find(|id| !bound.contains(id))
        {
            Some(outside) => Err(TaskPolicyError {
                key,
                message: format!("`{outside}` is not in {what}"),
            }),
            None => Ok(()),
        };
        let allowed = match (&self.allowed_server_ids, &ceiling) {
            (Some(allowed), Some(ceiling)) => {
                within(
                    "mcp.allowed_server_ids",
                    allowed,
                    ceiling,
                    "the profile's servers",
                )?;
                allowed.clone()
            }
            (Some(allowed), None) => allowed.clone(),
            (None, Some(ceiling)) => self
                .default_server_ids
                .clone()
                .unwrap_or_else(|| ceiling.clone()),
            (None, None) => self.default_server_ids.clone().unwrap_or_default(),
        };
        let defaults = self
            .default_server_ids
            .clone()
            .unwrap_or_else(|| allowed.clone());
        within(
            "mcp.default_server_ids",
            &defaults,
            &allowed,
            "mcp.allowed_server_ids (or the profile's servers)",
        )?;
        Ok(TaskMcpPolicy {
            enabled: self.enabled,
            default_server_ids: defaults,
            allowed_server_ids: allowed,
            tool_allowlist: self.tool_allowlist.clone(),
            tool_denylist: self.tool_denylist.clone(),
            profile,
        })
    }
}

fn profile_tools(profile: &Profile) -> ProfileTools {
    ProfileTools {
        name: profile.name.clone(),
        tool_allowlist: profile
            .tool_allowlist
            .as_ref()
            .map(|l| l.iter().map(Pattern::new).collect()),
        tool_denylist: profile.tool_denylist.iter().map(Pattern::new).collect(),
    }
}

impl TaskMcpPolicy {
    /// Configuration smells worth a warning (the task still runs).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.enabled && self.default_server_ids.is_empty() {
            warnings.push("mcp.enabled is true but mcp.default_server_ids is empty: sessions start with no MCP server".into());
        }
        if !self.enabled && (self.profile.is_some() || !self.allowed_server_ids.is_empty()) {
            warnings.push(
                "MCP servers are configured but mcp.enabled is not true: the task can use none"
                    .into(),
            );
        }
        warnings
    }
}

/// A policy layer, as named in decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Registry,
    Profile,
    Task,
    Session,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Registry => "registry",
            Layer::Profile => "profile",
            Layer::Task => "task",
            Layer::Session => "session",
        })
    }
}

/// Why a tool is not available.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// The layer's allowlist does not match the tool (the registry's may be empty).
    NotInAllowlist(Layer),
    /// A denylist pattern of the layer matches the tool.
    DeniedByPattern(Layer, Pattern),
    /// The server's `approval_policy` asks for an approval and this host has no approver.
    /// (Policy never says this itself: the capability does, when it has no approver.)
    ApprovalRequired(ApprovalPolicy),
    /// The registry's `allowed_resources` does not match the resource URI (or is empty).
    ResourceNotAllowed,
    /// The registry's `allowed_prompts` does not match the prompt name (or is empty).
    PromptNotAllowed,
}

impl Denial {
    pub fn reason(&self) -> Reason {
        match self {
            Denial::NotInAllowlist(_) | Denial::ResourceNotAllowed | Denial::PromptNotAllowed => {
                Reason::NotInAllowlist
            }
            Denial::DeniedByPattern(..) => Reason::DeniedByPattern,
            Denial::ApprovalRequired(_) => Reason::ApprovalRequired,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotInAllowlist(Layer::Registry) => {
                f.write_str("not in the registry's allowed_tools for this server")
            }
            Denial::NotInAllowlist(layer) => write!(f, "not in the {layer}'s tool allowlist"),
            Denial::DeniedByPattern(layer, p) => {
                write!(f, "matches the {layer}'s deny pattern `{p}`")
            }
            Denial::ResourceNotAllowed => {
                f.write_str("not in the registry's allowed_resources for this server")
            }
            Denial::PromptNotAllowed => {
                f.write_str("not in the registry's allowed_prompts for this server")
            }
            Denial::ApprovalRequired(policy) => write!(
                f,
                "the registry's approval_policy for this server is `{}` and this host has no approver (configure one: HostBuilder::with_approver, or `quiver run --approve prompt|allow`)",
                policy.as_str()
            ),
        }
    }
}

/// The tool filter of one server: every layer's allowlist must match, no denylist may.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFilter {
    allow: Vec<(Layer, Vec<Pattern>)>,
    deny: Vec<(Layer, Vec<Pattern>)>,
}

impl ToolFilter {
    /// Registry ∩ profile ∩ task.
    pub fn new(registry_allowed_tools: &[String], task: &TaskMcpPolicy) -> Self {
        let mut filter = Self {
            allow: vec![(
                Layer::Registry,
                registry_allowed_tools.iter().map(Pattern::new).collect(),
            )],
            deny: Vec::new(),
        };
        if let Some(profile) = &task.profile {
            if let Some(allow) = &profile.tool_allowlist {
                filter.allow.push((Layer::Profile, allow.clone()));
            }
            filter
                .deny
                .push((Layer::Profile, profile.tool_denylist.clone()));
        }
        if let Some(allow) = &task.tool_allowlist {
            filter.allow.push((Layer::Task, allow.clone()));
        }
        filter.deny.push((Layer::Task, task.tool_denylist.clone()));
        filter
    }

    /// Narrowed by a session's allow and deny lists.
    #[must_use]
    pub fn with_session(mut self, allow: Option<&[Pattern]>, deny: &[Pattern]) -> Self {
        if let Some(allow) = allow {
            self.allow.push((Layer::Session, allow.to_vec()));
        }
        self.deny.push((Layer::Session, deny.to_vec()));
        self
    }

    /// Whether `tool` (an MCP-native name) passes every layer; denylists are checked first.
    pub fn check(&self, tool: &str) -> Result<(), Denial> {
        for (layer, patterns) in &self.deny {
            if let Some(p) = any_match(patterns, tool) {
                return Err(Denial::DeniedByPattern(*layer, p));
            }
        }
        for (layer, patterns) in &self.allow {
            if any_match(patterns, tool).is_none() {
                return Err(Denial::NotInAllowlist(*layer));
            }
        }
        Ok(())
    }

    pub fn permits(&self, tool: &str) -> bool {
        self.check(tool).is_ok()
    }
}

/// What a session asks for.
#[derive(Clone, Copy, Debug)]
pub struct SessionRequest<'a> {
    /// A chat session's `mcp.enabled`; an `mcp_open` always asks.
    pub enabled: bool,
    pub server_ids: &'a [String],
    pub tool_allowlist: Option<&'a [Pattern]>,
    pub tool_denylist: &'a [Pattern],
}

impl<'a> SessionRequest<'a> {
    /// The request of an `mcp_open` (or a registry view) for one server.
    pub fn single(server_id: &'a [String]) -> Self {
        Self {
            enabled: true,
            server_ids: server_id,
            tool_allowlist: None,
            tool_denylist: &[],
        }
    }
}

/// Why something was left out, as recorded in the decision log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The registry has no such server.
    UnknownServer,
    /// The server is outside the task's `mcp.allowed_server_ids` (or profile).
    NotAllowedByTask,
    /// MCP is disabled by the task or the session.
    Disabled,
    /// The chat session does not enable the server (its `mcp.server_ids`).
    NotInSession,
    /// The server's `allowed_tools` is empty.
    DenyAllServer,
    /// A required `${ENV:..}` of the server is not set.
    EnvMissing,
    /// The server could not list its tools.
    ListFailed,
    /// The server did not list its tools in time.
    ListTimeout,
    /// A tool matches a deny pattern.
    DeniedByPattern,
    /// A tool is outside an allowlist.
    NotInAllowlist,
    /// Calls need an approval this host cannot give.
    ApprovalRequired,
    /// Offered, but each call waits for the host's approver (the one entry that leaves
    /// nothing out).
    NeedsApproval,
    /// The approver refused the call.
    ApprovalDenied,
    /// No decision came within the approval timeout.
    ApprovalTimeout,
}

/// One entry of the decision log: something left out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub server_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub reason: Reason,
    pub detail: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = serde_json::to_value(self.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        match &self.tool {
            Some(tool) => write!(f, "{}/{tool}: {reason} ({})", self.server_id, self.detail),
            None => write!(f, "{}: {reason} ({})", self.server_id, self.detail),
        }
    }
}

/// A server granted to a session, with its tool filter.
#[derive(Clone, Debug)]
pub struct Grant {
    pub entry: Arc<ServerEntry>,
    pub filter: ToolFilter,
}

/// Whether a call policy permits must first wait for an approval. Policy only says so;
/// the capability asks the host's approver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approval {
    NotNeeded,
    /// The server's `approval_policy` (`always`, or `policy` with a matching
    /// `approval_tools` pattern) makes the call wait.
    Needed(ApprovalPolicy),
}

impl Grant {
    /// The one decision on calling (or offering) `tool`: the tool filter of every layer,
    /// then whether the server's approval policy makes the call wait. Nothing else may run
    /// a tool without it.
    pub fn check_call(&self, tool: &str) -> Result<Approval, Denial> {
        self.filter.check(tool)?;
        let record = &self.entry.record;
        Ok(match record.approval_policy {
            ApprovalPolicy::Never => Approval::NotNeeded,
            ApprovalPolicy::Always => Approval::Needed(ApprovalPolicy::Always),
            // No patterns: every tool waits (fail closed).
            ApprovalPolicy::Policy
                if record.approval_tools.is_empty()
                    || record
                        .approval_tools
                        .iter()
                        .any(|p| Pattern::new(p.as_str()).matches(tool)) =>
            {
                Approval::Needed(ApprovalPolicy::Policy)
            }
            ApprovalPolicy::Policy => Approval::NotNeeded,
        })
    }
}

impl Grant {
    /// Whether a guest may see or read the resource at `uri`: the registry's
    /// `allowed_resources` (URI patterns; empty allows none). Registry-level only: no task,
    /// profile or session layer narrows resources or prompts yet.
    pub fn check_resource(&self, uri: &str) -> Result<(), Denial> {
        let allowed = &self.entry.record.allowed_resources;
        any_match_str(allowed, uri).ok_or(Denial::ResourceNotAllowed)
    }

    /// Whether a resource template's `uri_template` is listed: a template is shown when an
    /// `allowed_resources` pattern matches the template text itself (e.g. `demo://x/*`
    /// matches `demo://x/{id}`); reads of its URIs are still checked one by one.
    pub fn permits_template(&self, uri_template: &str) -> bool {
        self.check_resource(uri_template).is_ok()
    }

    /// Whether a guest may see or get the prompt `name`: the registry's `allowed_prompts`
    /// (name patterns; empty allows none), registry-level only like resources.
    pub fn check_prompt(&self, name: &str) -> Result<(), Denial> {
        let allowed = &self.entry.record.allowed_prompts;
        any_match_str(allowed, name).ok_or(Denial::PromptNotAllowed)
    }
}

fn any_match_str(patterns: &[String], text: &str) -> Option<()> {
    patterns
        .iter()
        .any(|p| Pattern::new(p.as_str()).matches(text))
        .then_some(())
}

/// What the layers grant a session, and the decision log of what they do not.
#[derive(Clone, Debug, Default)]
pub struct Effective {
    pub servers: Vec<Grant>,
    pub decisions: Vec<Decision>,
}

impl Effective {
    pub fn grant(&self, server_id: &str) -> Option<&Grant> {
        self.servers
            .iter()
            .find(|g| g.entry.server_id() == server_id)
    }

    pub fn decision(&self, server_id: &str) -> Option<&Decision> {
        self.decisions
            .iter()
            .find(|d| d.server_id == server_id && d.tool.is_none())
    }
}

/// The effective policy of one session: requested ∩ task-allowed ∩ registry, each server
/// with its tool filter, and a decision for every requested server left out.
pub fn effective(
    registry: &Registry,
    task: &TaskMcpPolicy,
    session: &SessionRequest<'_>,
) -> Effective {
    let mut out = Effective::default();
    let mut seen = Vec::new();
    for id in session.server_ids {
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let deny = |reason: Reason, detail: String| Decision {
            server_id: id.clone(),
            tool: None,
            reason,
            detail,
        };
        let Some(entry) = registry.get(id) else {
            out.decisions.push(deny(
                Reason::UnknownServer,
                "the registry has no such server".into(),
            ));
            continue;
        };
        if !task.enabled {
            out.decisions.push(deny(
                Reason::Disabled,
                "the task does not set mcp.enabled".into(),
            ));
            continue;
        }
        if !session.enabled {
            out.decisions.push(deny(
                Reason::Disabled,
                "the session sets mcp.enabled to false".into(),
            ));
            continue;
        }
        if !task.allowed_server_ids.contains(id) {
            out.decisions.push(deny(
                Reason::NotAllowedByTask,
                "not in the task's mcp.allowed_server_ids".into(),
            ));
            continue;
        }
        if entry.record.allowed_tools.is_empty() {
            out.decisions.push(deny(
                Reason::DenyAllServer,
                "the registry's allowed_tools is empty".into(),
            ));
            continue;
        }
        if let Err(why) = &entry.launch {
            out.decisions
                .push(deny(Reason::EnvMissing, why.to_string()));
            continue;
        }
        let filter = ToolFilter::new(&entry.record.allowed_tools, task)
            .with_session(session.tool_allowlist, session.tool_denylist);
        out.servers.push(Grant {
            entry: entry.clone(),
            filter,
        });
    }
    out
}

#[cfg(test)]
mod tests;
