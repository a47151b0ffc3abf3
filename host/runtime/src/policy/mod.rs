//! Who may use which MCP server and tool: the three-layer policy and its decision log.
//!
//! Policy is pure: it reads a registry snapshot, the task's MCP settings and a session's
//! request, and answers with what is granted and why everything else is not. It never does
//! I/O. Each layer only narrows the one above it:
//!
//! 0. the **principal** (operator, the host config's `[principals]`, see [`PrincipalRules`]):
//!    the servers and profiles the task's principal may use; absent, it narrows nothing;
//! 1. the **registry** (platform): a server must be registered, and its `allowed_tools`,
//!    `allowed_resources` and `allowed_prompts` bound every task (empty means deny all);
//! 2. the **task** (`task.json` config, optionally through a registry **profile**):
//!    `mcp.enabled`, the allowed and default servers, allow/deny lists of tools, resources
//!    and prompts;
//! 3. the **session** (a chat session's params, or an `mcp_open` fd's server and its
//!    `mcp_set_param` lists).
//!
//! Effective servers = requested ∩ task-allowed ∩ principal-allowed ∩ registry; per server, each of the tool,
//! resource and prompt filters is registry allowlist ∩ profile allowlist ∩ task allowlist ∩
//! session allowlist, and every denylist is a final veto. [`effective`] is the one function
//! every path goes through: `mcp_open` and the registry views, chat tool injection, and the
//! routing of every tool call the model makes.

mod filter;
mod pattern;
mod principal;
mod report;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

pub use filter::{Kind, ListKey, Lists, Narrowing, PromptFilter, ResourceFilter, ToolFilter};
pub use pattern::Pattern;
pub use principal::{PrincipalConfig, PrincipalConfigError, PrincipalLayer, PrincipalRules};
pub use report::PolicyReport;

use rmcp::model::Tool;

use crate::registry::{ApprovalPolicy, Registry, ServerEntry, ServerRecord, tool_digest};

/// The task layer, resolved against the registry (profiles applied).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMcpPolicy {
    /// `mcp.enabled`; without it the task can use no server at all.
    pub enabled: bool,
    /// `mcp.default_server_ids`: the servers a session starts with.
    pub default_server_ids: Vec<String>,
    /// `mcp.allowed_server_ids`: the ceiling; equals the defaults when absent.
    pub allowed_server_ids: Vec<String>,
    /// `mcp.{tool,resource,prompt}_{allowlist,denylist}`.
    pub narrowing: Narrowing,
    /// The profile named by `mcp.profile`, if any.
    pub profile: Option<TaskProfile>,
    /// The principal layer; `None` when the host config has no `[principals]`.
    pub principal: Option<PrincipalLayer>,
}

/// What a profile adds to the filters, as its own layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskProfile {
    pub name: String,
    pub narrowing: Narrowing,
}

/// The task's MCP config as written (`mcp.*` keys), before profiles are applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMcpConfig {
    pub enabled: bool,
    pub profile: Option<String>,
    pub default_server_ids: Option<Vec<String>>,
    pub allowed_server_ids: Option<Vec<String>>,
    pub narrowing: Narrowing,
}

/// A task config that does not fit the registry, naming the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("task config key `{key}`: {message}")]
pub struct TaskPolicyError {
    pub key: &'static str,
    pub message: String,
}

impl TaskMcpConfig {
    /// [`TaskMcpConfig::resolve`] under the principal layer (`None`: no `[principals]`):
    /// a profile the principal may not name is an error on `mcp.profile` saying so.
    pub fn resolve_for(
        self,
        registry: &Registry,
        principal: Option<PrincipalLayer>,
    ) -> Result<TaskMcpPolicy, TaskPolicyError> {
        if let (Some(layer), Some(name)) = (&principal, &self.profile) {
            layer
                .check_profile(name)
                .map_err(|message| TaskPolicyError {
                    key: "mcp.profile",
                    message,
                })?;
        }
        Ok(TaskMcpPolicy {
            principal,
            ..self.resolve(registry)?
        })
    }

    /// Applies the profile (if any) and checks the server sets. Without a profile, absent
    /// allowed servers equal the defaults. With one, the profile's servers are the
    /// ceiling: the task may narrow it, never widen it.
    pub fn resolve(self, registry: &Registry) -> Result<TaskMcpPolicy, TaskPolicyError> {
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
                    Some(TaskProfile {
                        name: profile.name.clone(),
                        narrowing: Narrowing::of_profile(profile),
                    }),
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
        // Moved, not cloned: resolving runs at every task's start.
        let allowed = match (self.allowed_server_ids, ceiling) {
            (Some(allowed), Some(ceiling)) => {
                within(
                    "mcp.allowed_server_ids",
                    &allowed,
                    &ceiling,
                    "the profile's servers",
                )?;
                allowed
            }
            (Some(allowed), None) => allowed,
            // Defaults without an allowlist become the allowlist: under a profile they
            // are bounded by its servers like an allowlist would be.
            (None, Some(ceiling)) => match &self.default_server_ids {
                Some(defaults) => {
                    within(
                        "mcp.default_server_ids",
                        defaults,
                        &ceiling,
                        "the profile's servers",
                    )?;
                    defaults.clone()
                }
                None => ceiling,
            },
            (None, None) => self.default_server_ids.clone().unwrap_or_default(),
        };
        let defaults = match self.default_server_ids {
            Some(defaults) => defaults,
            None => allowed.clone(),
        };
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
            narrowing: self.narrowing,
            profile,
            principal: None,
        })
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
    Principal,
    Registry,
    Profile,
    Task,
    Session,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Principal => "principal",
            Layer::Registry => "registry",
            Layer::Profile => "profile",
            Layer::Task => "task",
            Layer::Session => "session",
        })
    }
}

/// Why a tool, resource or prompt is not available.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// The layer's allowlist does not match the name (the registry's may be empty).
    NotInAllowlist(Kind, Layer),
    /// A denylist pattern of the layer matches the name.
    DeniedByPattern(Kind, Layer, Pattern),
    /// The server's `approval_policy` asks for an approval and this host has no approver.
    /// (Policy never says this itself: the capability does, when it has no approver.)
    ApprovalRequired(ApprovalPolicy),
    /// The tool's listed definition no longer has the digest the record's `pins` holds.
    DefinitionDrifted { pinned: String, current: String },
    /// The record pins the tool, and the server does not list it.
    PinnedToolMissing { pinned: String },
    /// The record sets `pin_required` and has no pin for the tool.
    NotPinned,
}

impl Denial {
    pub fn reason(&self) -> Reason {
        match self {
            Denial::NotInAllowlist(..) => Reason::NotInAllowlist,
            Denial::DeniedByPattern(..) => Reason::DeniedByPattern,
            Denial::ApprovalRequired(_) => Reason::ApprovalRequired,
            Denial::DefinitionDrifted { .. } => Reason::ToolDefinitionDrifted,
            Denial::PinnedToolMissing { .. } => Reason::PinnedToolMissing,
            Denial::NotPinned => Reason::ToolNotPinned,
        }
    }

    /// The layer that refused, when a filter did.
    pub fn layer(&self) -> Option<Layer> {
        match self {
            Denial::NotInAllowlist(_, layer) | Denial::DeniedByPattern(_, layer, _) => Some(*layer),
            Denial::ApprovalRequired(_)
            | Denial::DefinitionDrifted { .. }
            | Denial::PinnedToolMissing { .. }
            | Denial::NotPinned => Some(Layer::Registry),
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotInAllowlist(kind, Layer::Registry) => write!(
                f,
                "not in the registry's {} for this server",
                kind.registry_field()
            ),
            Denial::NotInAllowlist(kind, layer) => {
                write!(f, "not in the {layer}'s {kind} allowlist")
            }
            // Tools keep their shorter wording, which logs and docs already quote.
            Denial::DeniedByPattern(Kind::Tool, layer, p) => {
                write!(f, "matches the {layer}'s deny pattern `{p}`")
            }
            Denial::DeniedByPattern(kind, layer, p) => {
                write!(f, "matches the {layer}'s {kind} deny pattern `{p}`")
            }
            Denial::ApprovalRequired(policy) => write!(
                f,
                "the registry's approval_policy for this server is `{}` and this host has no approver (configure one: HostBuilder::with_approver, or `quiver run --approve prompt|allow`)",
                policy.as_str()
            ),
            Denial::DefinitionDrifted { pinned, current } => write!(
                f,
                "the server's definition of the tool changed since it was pinned (pinned {pinned}, now {current}); review it, then accept it with `quiver registry pin` or the admin API's pin endpoint"
            ),
            Denial::PinnedToolMissing { pinned } => write!(
                f,
                "the registry pins this tool ({pinned}) and the server does not list it"
            ),
            Denial::NotPinned => f.write_str(
                "the registry's record sets pin_required and has no pin for this tool; pin it with `quiver registry pin`",
            ),
        }
    }
}

/// What a session asks for.
#[derive(Clone, Copy, Debug)]
pub struct SessionRequest<'a> {
    /// A chat session's `mcp.enabled`; an `mcp_open` always asks.
    pub enabled: bool,
    pub server_ids: &'a [String],
    /// The session's own lists (a chat session's params).
    pub narrowing: &'a Narrowing,
}

/// A session that narrows nothing.
static NO_NARROWING: Narrowing = Narrowing {
    tools: Lists {
        allow: None,
        deny: Vec::new(),
    },
    resources: Lists {
        allow: None,
        deny: Vec::new(),
    },
    prompts: Lists {
        allow: None,
        deny: Vec::new(),
    },
};

impl<'a> SessionRequest<'a> {
    /// The request of an `mcp_open` (or a registry view) for one server; the fd's own
    /// lists come later ([`Grant::with_session`]).
    pub fn single(server_id: &'a [String]) -> Self {
        Self {
            enabled: true,
            server_ids: server_id,
            narrowing: &NO_NARROWING,
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
    /// The host config's `[principals]` does not let the task's principal use the server.
    NotAllowedForPrincipal,
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
    /// The server listed the tool with invalid `x-mcp-header` declarations (SEP-2243), so
    /// it is left out of the listing.
    InvalidToolHeaders,
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
    /// The tool's definition differs from the record's pin (both digests in the detail).
    ToolDefinitionDrifted,
    /// The record pins a tool the server does not list.
    PinnedToolMissing,
    /// The record sets `pin_required` and does not pin the tool.
    ToolNotPinned,
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

/// A server granted to a session, with its tool, resource and prompt filters.
#[derive(Clone, Debug)]
pub struct Grant {
    pub entry: Arc<ServerEntry>,
    pub tools: ToolFilter,
    pub resources: ResourceFilter,
    pub prompts: PromptFilter,
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
    /// `entry` under the registry, profile and task layers, narrowed by `session`.
    pub fn new(entry: Arc<ServerEntry>, task: &TaskMcpPolicy, session: &Narrowing) -> Self {
        let record = &entry.record;
        Self {
            tools: ToolFilter::new(&record.allowed_tools, task).with_session(session),
            resources: ResourceFilter::new(&record.allowed_resources, task).with_session(session),
            prompts: PromptFilter::new(&record.allowed_prompts, task).with_session(session),
            entry,
        }
    }

    /// Narrowed by `session`'s lists instead of the session lists it had.
    #[must_use]
    pub fn with_session(self, session: &Narrowing) -> Self {
        Self {
            entry: self.entry,
            tools: self.tools.with_session(session),
            resources: self.resources.with_session(session),
            prompts: self.prompts.with_session(session),
        }
    }

    /// The one decision on calling (or offering) `tool`: the tool filter of every layer,
    /// then whether the server's approval policy makes the call wait. Nothing else may run
    /// a tool without it.
    pub fn check_call(&self, tool: &str) -> Result<Approval, Denial> {
        self.tools.check(tool)?;
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

/// Whether `tool`'s definition, as the server listed it (`None`: not listed), matches the
/// record's `pins`. An unpinned tool passes unless the record sets `pin_required`; a
/// record without pins checks nothing.
pub fn check_definition(
    record: &ServerRecord,
    name: &str,
    listed: Option<&Tool>,
) -> Result<(), Denial> {
    match (record.pins.get(name), listed) {
        (Some(pinned), Some(tool)) => {
            let current = tool_digest(tool);
            if &current == pinned {
                Ok(())
            } else {
                Err(Denial::DefinitionDrifted {
                    pinned: pinned.clone(),
                    current,
                })
            }
        }
        (Some(pinned), None) => Err(Denial::PinnedToolMissing {
            pinned: pinned.clone(),
        }),
        (None, _) if record.pin_required => Err(Denial::NotPinned),
        (None, _) => Ok(()),
    }
}

impl Grant {
    /// [`check_definition`] under this grant's record.
    pub fn check_definition(&self, tool: &Tool) -> Result<(), Denial> {
        check_definition(&self.entry.record, &tool.name, Some(tool))
    }

    /// Whether a guest may see or read the resource at `uri`: the registry's
    /// `allowed_resources` (URI patterns; empty allows none), then every layer's resource
    /// lists.
    pub fn check_resource(&self, uri: &str) -> Result<(), Denial> {
        self.resources.check(uri)
    }

    /// Whether a resource template's `uri_template` is listed: a template is shown when the
    /// resource filter passes the template text itself (e.g. `demo://x/*` matches
    /// `demo://x/{id}`); reads of its URIs are still checked one by one.
    pub fn permits_template(&self, uri_template: &str) -> bool {
        self.resources.permits(uri_template)
    }

    /// Whether a guest may see or get the prompt `name`: the registry's `allowed_prompts`
    /// (name patterns; empty allows none), then every layer's prompt lists.
    pub fn check_prompt(&self, name: &str) -> Result<(), Denial> {
        self.prompts.check(name)
    }
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

/// The effective policy of one session: requested ∩ task-allowed ∩ principal-allowed ∩
/// registry, each server
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
        if let Some(Err(detail)) = task.principal.as_ref().map(|p| p.check_server(id)) {
            out.decisions
                .push(deny(Reason::NotAllowedForPrincipal, detail));
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
        out.servers
            .push(Grant::new(entry.clone(), task, session.narrowing));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
