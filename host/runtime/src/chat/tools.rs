//! The tools of one send: guest tools and MCP tools under model-facing names, and the name
//! map that routes the model's calls. Only tools whose [`Grant::check_call`] passes are
//! offered; a name the map does not know runs nothing. A tool whose calls need approval is
//! offered when the host has an approver (its route says so, and the decision log lists it
//! as `needs_approval`), and left out as `approval_required` when it has none.
//!
//! [`Grant::check_call`]: crate::policy::Grant::check_call

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::{ChatSession, GuestTool};
use crate::approval;
use crate::mcp::{McpError, McpErrorCode, McpTask, Tool, ToolsLeftOut};
use crate::policy::{
    self, Approval, Decision, Denial, Effective, Narrowing, Reason, SessionRequest,
};
use crate::registry::{Registry, ServerEntry};
use crate::sandbox::{Charge, MemoryBudget, heap};

/// Where a model-facing tool name leads.
#[derive(Clone, Debug)]
pub(crate) enum Route {
    Guest {
        table_index: u32,
    },
    Mcp {
        entry: Arc<ServerEntry>,
        tool: String,
        approval: Approval,
    },
}

/// How a name the model used resolves.
pub(crate) enum Resolution<'a> {
    Route(&'a Route),
    /// An MCP tool this session does not allow, and why.
    Denied {
        server_id: String,
        tool: String,
        reason: Reason,
        why: String,
    },
    Unknown,
}

/// The tools offered in one send, and the name map used to route the model's calls: the
/// session's guest tools (borrowed) and the MCP half, which a task reuses from send to send
/// while nothing it was built from changes ([`McpTools`]).
pub(crate) struct ToolSet<'s> {
    guest: &'s [GuestTool],
    guest_routes: Vec<(&'s str, Route)>,
    mcp: Arc<McpTools>,
}

/// The MCP half of a send's tool set: each granted server's offered tools, their routes and
/// the decision log, built from the registry snapshot, the task's and the session's policy,
/// each server's listing, the guest tools' names (which MCP names must not take) and
/// whether the host has an approver. [`ToolSet::build`] reuses it only while all of these
/// are the same, so a tool the policy no longer offers is never served from it.
pub(crate) struct McpTools {
    key: McpKey,
    /// The offered tools' definitions as the JSON text each request copies.
    definitions: Vec<Box<RawValue>>,
    routes: HashMap<String, Route>,
    /// (server id, MCP-native tool) → model-facing name.
    mcp_names: HashMap<(String, String), String>,
    /// `<tool_namespace>.<tool>` → model-facing name, for names written the dotted way.
    namespaced: HashMap<String, String>,
    /// MCP servers whose tools were offered.
    servers: Vec<String>,
    /// The decision log: every requested server and listed tool left out, and why.
    decisions: Vec<Decision>,
    /// What the names, routes and decisions above hold (the schemas are the listing's).
    held: u64,
    /// What the definitions take as JSON values, for a backend that translates a body.
    value_cost: u64,
    /// The scratch buffer reading the longest definition's text back needs.
    value_scratch: u64,
    /// Every granted server listed: worth keeping for the next send (a failure is retried).
    reusable: bool,
}

/// What an [`McpTools`] was built from. The registry and the listings are kept (not just
/// their addresses), so a new snapshot or listing can never reuse an old one's address.
struct McpKey {
    registry: Arc<Registry>,
    enabled: bool,
    server_ids: Vec<String>,
    narrowing: Narrowing,
    guest_names: Vec<String>,
    approver: bool,
    /// The granted servers, in grant order, with the listing each was offered from and the
    /// tools that listing left out.
    entries: Vec<Arc<ServerEntry>>,
    listings: Vec<Arc<[Tool]>>,
    left_out: Vec<ToolsLeftOut>,
}

impl McpKey {
    /// Whether the policy side (registry, session, guest names, approver) is the same, so
    /// the grants are too.
    fn asks_like(&self, session: &ChatSession, mcp: &McpTask, approver: bool) -> bool {
        Arc::ptr_eq(&self.registry, &mcp.registry)
            && self.approver == approver
            && self.enabled == session.mcp.enabled
            && self.server_ids == session.mcp.server_ids
            && self.narrowing == session.mcp.narrowing
            && self
                .guest_names
                .iter()
                .map(String::as_str)
                .eq(session.guest_tools.iter().map(|t| t.name.as_str()))
    }

    /// Whether each server lists, and leaves out, what it did when this was built.
    fn lists_like(&self, listings: &[Listed]) -> bool {
        self.listings.len() == listings.len()
            && self.listings.iter().zip(&self.left_out).zip(listings).all(
                |((listing, left_out), (now, now_left_out))| {
                    now.as_ref().is_ok_and(|now| Arc::ptr_eq(listing, now))
                        && (Arc::ptr_eq(left_out, now_left_out) || left_out[..] == now_left_out[..])
                },
            )
    }
}

/// A task's last [`McpTools`], kept in its [`ChatTask`](super::ChatTask) for the next send.
#[derive(Default)]
pub(crate) struct ToolCache(Mutex<Option<(Arc<McpTools>, Charge)>>);

impl ToolCache {
    fn get(&self) -> Option<Arc<McpTools>> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.as_ref().map(|(tools, _)| tools.clone())
    }

    /// Keeps `tools` between sends, charged to `budget` for what they hold (their
    /// definitions' text above all); not kept when the budget cannot hold them.
    fn set(&self, tools: Arc<McpTools>, budget: &MemoryBudget) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // The one kept before is given back first.
        *kept = None;
        if let Ok(charge) = budget.charge("chat tool cache", tools.held) {
            *kept = Some((tools, charge));
        }
    }
}

/// A server's listing (from the pool's cache) and what it left out.
type Listed = (Result<Arc<[Tool]>, McpError>, ToolsLeftOut);

/// An offered MCP tool's definition, `{"type": "function", "function": {"name",
/// "parameters", "description"?}}` when serialised; its schema is the listing's, shared.
struct McpDefinition {
    name: String,
    parameters: Arc<Map<String, Value>>,
    description: Option<Cow<'static, str>>,
}

impl Serialize for McpDefinition {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Function<'a>(&'a McpDefinition);
        impl Serialize for Function<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let d = self.0;
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("name", &d.name)?;
                map.serialize_entry("parameters", &*d.parameters)?;
                if let Some(description) = &d.description {
                    map.serialize_entry("description", description)?;
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry("function", &Function(self))?;
        map.end()
    }
}

impl McpDefinition {
    /// What [`Self`] takes as a JSON value (its slot in the `tools` array included).
    fn value_cost(&self) -> u64 {
        let strings = |lens: &[usize]| {
            lens.iter().fold(0u64, |sum, len| {
                sum.saturating_add(heap::string(*len as u64))
            })
        };
        let description = self.description.as_ref().map_or(0, |d| d.len());
        heap::vec_slot::<Value>()
            .saturating_add(heap::object(2).saturating_mul(2))
            .saturating_add(strings(&[4, 8, 8, 4, self.name.len(), 10, 11, description]))
            .saturating_add(heap::map(&self.parameters))
    }
}

/// The `tools` of a request: the guest tools' definitions, then the MCP tools'.
#[derive(Clone, Copy)]
pub(crate) struct Definitions<'a> {
    pub(super) guest: &'a [GuestTool],
    mcp: &'a [Box<RawValue>],
}

impl Definitions<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.guest.is_empty() && self.mcp.is_empty()
    }
}

impl<'a> From<&'a [GuestTool]> for Definitions<'a> {
    fn from(guest: &'a [GuestTool]) -> Self {
        Self { guest, mcp: &[] }
    }
}

impl Serialize for Definitions<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.guest.len() + self.mcp.len()))?;
        for tool in self.guest {
            seq.serialize_element(&*tool.definition)?;
        }
        for definition in self.mcp {
            seq.serialize_element(&**definition)?;
        }
        seq.end()
    }
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
        narrowing: &session.mcp.narrowing,
    }
}

/// Each server's listing from the pool's cache, and what it left out.
async fn list(entries: &[Arc<ServerEntry>], mcp: &McpTask) -> Vec<Listed> {
    // Most sends find every listing cached on a live connection: then nothing waits.
    let cached = entries
        .iter()
        .map(|entry| {
            let (tools, left_out) = mcp.pool.cached_tools(entry, mcp.principal())?;
            Some((Ok(tools), left_out))
        })
        .collect();
    if let Some(listed) = cached {
        return listed;
    }
    let listings = futures::future::join_all(
        entries
            .iter()
            .map(|entry| mcp.pool.list_tools(entry, mcp.principal())),
    )
    .await;
    listings
        .into_iter()
        .zip(entries)
        .map(|(listed, entry)| (listed, mcp.pool.left_out(entry, mcp.principal())))
        .collect()
}

impl<'s> ToolSet<'s> {
    /// Guest tools plus the MCP tools the effective policy grants. Listing comes from the
    /// pool's cache; a server that cannot list is left out with its reason. The MCP half is
    /// the task's last one (`cache`) when everything it depends on is the same.
    pub(crate) async fn build(
        session: &'s ChatSession,
        mcp: &McpTask,
        cache: Option<(&ToolCache, &MemoryBudget)>,
    ) -> Self {
        let approver = mcp.approvals.configured();
        if let Some(cached) = cache.and_then(|(cache, _)| cache.get())
            && cached.key.asks_like(session, mcp, approver)
            && cached.key.lists_like(&list(&cached.key.entries, mcp).await)
        {
            return Self::new(&session.guest_tools, cached);
        }
        let effective = policy::effective(&mcp.registry, &mcp.policy, &session_request(session));
        let entries: Vec<_> = effective.servers.iter().map(|g| g.entry.clone()).collect();
        let listed = list(&entries, mcp).await;
        let half = Arc::new(McpTools::assemble(
            session,
            &mcp.registry,
            effective,
            listed,
            approver,
        ));
        if let Some((cache, budget)) = cache
            && half.reusable
        {
            cache.set(half.clone(), budget);
        }
        Self::new(&session.guest_tools, half)
    }

    fn new(guest: &'s [GuestTool], mcp: Arc<McpTools>) -> Self {
        let guest_routes = guest
            .iter()
            .map(|t| {
                let route = Route::Guest {
                    table_index: t.table_index,
                };
                (t.name.as_str(), route)
            })
            .collect();
        Self {
            guest,
            guest_routes,
            mcp,
        }
    }

    /// [`McpTools::assemble`] with the session's guest tools.
    #[cfg(test)]
    pub(crate) fn assemble(
        session: &'s ChatSession,
        registry: &Arc<Registry>,
        effective: Effective,
        listings: Vec<Result<Arc<[Tool]>, McpError>>,
        approver: bool,
    ) -> Self {
        let listed = listings.into_iter().map(|l| (l, Arc::from([]))).collect();
        let half = McpTools::assemble(session, registry, effective, listed, approver);
        Self::new(&session.guest_tools, Arc::new(half))
    }

    /// The `tools` of a request.
    pub(crate) fn definitions(&self) -> Definitions<'_> {
        Definitions {
            guest: self.guest,
            mcp: &self.mcp.definitions,
        }
    }

    /// MCP servers whose tools were offered.
    pub(crate) fn servers(&self) -> &[String] {
        &self.mcp.servers
    }

    /// The decision log: every requested server and listed tool left out, and why.
    pub(crate) fn decisions(&self) -> &[Decision] {
        &self.mcp.decisions
    }

    /// What the send holds for its tool set beyond the session (the MCP half's names,
    /// routes and decisions; the guest tools are the session's).
    pub(crate) fn held(&self) -> u64 {
        self.mcp.held
    }

    /// What the MCP tools' definitions take as JSON values (the guest tools' are in the
    /// session's charge).
    pub(crate) fn mcp_value_cost(&self) -> u64 {
        self.mcp.value_cost.saturating_add(self.mcp.value_scratch)
    }

    fn route(&self, name: &str) -> Option<&Route> {
        self.guest_routes
            .iter()
            .find(|(guest, _)| *guest == name)
            .map(|(_, route)| route)
            .or_else(|| self.mcp.routes.get(name))
    }

    /// The offered name a name the model or guest used stands for: itself if offered, else
    /// the offered name of `<tool_namespace>.<tool>`, `mcp.<server_id>.<tool>` or
    /// `mcp__<server_id>__<tool>`.
    pub(crate) fn offered_name<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.route(name).is_some() {
            return Some(name);
        }
        if let Some((server_id, tool)) = split_server_tool(name)
            && let Some(offered) = self
                .mcp
                .mcp_names
                .get(&(server_id.to_owned(), tool.to_owned()))
        {
            return Some(offered);
        }
        self.mcp.namespaced.get(name).map(String::as_str)
    }

    /// The model-facing names offered for `server_id`'s tools, sorted.
    pub(crate) fn offered_for(&self, server_id: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .mcp
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
        if let Some(route) = self.offered_name(name).and_then(|o| self.route(o)) {
            return Resolution::Route(route);
        }
        let Some((server_id, tool)) = split_server_tool(name) else {
            return Resolution::Unknown;
        };
        if self.mcp.key.registry.get(server_id).is_none() {
            return Resolution::Unknown;
        }
        let (reason, why) = self
            .decisions()
            .iter()
            .find(|d| d.server_id == server_id && d.tool.as_deref().is_none_or(|t| t == tool))
            .map_or_else(
                || {
                    let why = "the session does not enable this server (mcp.server_ids)";
                    (Reason::NotInSession, why.to_owned())
                },
                |d| (d.reason, d.to_string()),
            );
        Resolution::Denied {
            server_id: server_id.to_owned(),
            tool: tool.to_owned(),
            reason,
            why,
        }
    }
}

impl McpTools {
    /// The pure part of [`ToolSet::build`]: names, definitions and the decision log from the
    /// effective policy and each granted server's listing and what it left out (in grant
    /// order); `approver`: whether the host can approve calls. It is reusable only when
    /// every server listed.
    fn assemble(
        session: &ChatSession,
        registry: &Arc<Registry>,
        mut effective: Effective,
        listed: Vec<Listed>,
        approver: bool,
    ) -> Self {
        let guest_names: Vec<String> = session.guest_tools.iter().map(|t| t.name.clone()).collect();
        let mut taken: HashSet<String> = guest_names.iter().cloned().collect();
        for (grant, (_, left_out)) in effective.servers.iter().zip(&listed) {
            let server_id = grant.entry.server_id();
            for (tool, detail) in left_out.iter() {
                effective.decisions.push(Decision {
                    server_id: server_id.to_owned(),
                    tool: Some(tool.clone()),
                    reason: Reason::InvalidToolHeaders,
                    detail: detail.clone(),
                });
            }
        }
        let mut set = McpTools {
            key: McpKey {
                registry: registry.clone(),
                enabled: session.mcp.enabled,
                server_ids: session.mcp.server_ids.clone(),
                narrowing: session.mcp.narrowing.clone(),
                guest_names,
                approver,
                entries: Vec::new(),
                listings: Vec::new(),
                left_out: Vec::new(),
            },
            definitions: Vec::new(),
            routes: HashMap::new(),
            mcp_names: HashMap::new(),
            namespaced: HashMap::new(),
            servers: Vec::new(),
            decisions: effective.decisions,
            held: 0,
            value_cost: 0,
            value_scratch: 0,
            reusable: true,
        };
        for (grant, (listed, left_out)) in effective.servers.into_iter().zip(listed) {
            let server_id = grant.entry.server_id().to_owned();
            let tools = match listed {
                Ok(tools) => tools,
                Err(error) => {
                    set.reusable = false;
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
                let decide = |reason, detail| Decision {
                    server_id: server_id.clone(),
                    tool: Some(tool.name.to_string()),
                    reason,
                    detail,
                };
                let approval = match grant
                    .check_call(&tool.name)
                    .and_then(|approval| grant.check_definition(tool).map(|()| approval))
                {
                    Err(denial) => {
                        set.decisions
                            .push(decide(denial.reason(), denial.to_string()));
                        continue;
                    }
                    Ok(Approval::Needed(policy)) if !approver => {
                        let denial = Denial::ApprovalRequired(policy);
                        set.decisions
                            .push(decide(denial.reason(), denial.to_string()));
                        continue;
                    }
                    Ok(approval @ Approval::Needed(policy)) => {
                        let detail = format!(
                            "offered; each call waits up to {} ms for the host's approver (approval_policy `{}`)",
                            approval::timeout_of(&grant.entry).as_millis(),
                            policy.as_str()
                        );
                        set.decisions.push(decide(Reason::NeedsApproval, detail));
                        approval
                    }
                    Ok(approval) => approval,
                };
                let namespace = &grant.entry.record.tool_namespace;
                let name = mcp_model_name(namespace, &server_id, &tool.name, &taken);
                taken.insert(name.clone());
                let definition = McpDefinition {
                    name: name.clone(),
                    parameters: tool.input_schema.clone(),
                    description: tool.description.clone(),
                };
                // Written once here, copied into each request while this set is reused.
                let Ok(text) = to_raw_value(&definition) else {
                    // Unreachable: a name, a map of values and a string.
                    tracing::warn!(server_id = %server_id, tool = %tool.name, "an MCP tool's definition could not be written; it is not offered");
                    continue;
                };
                set.value_cost = set.value_cost.saturating_add(definition.value_cost());
                // A wire that translates the body reads the text back, with a scratch
                // buffer as long as its longest escaped string (one at a time).
                let (_, scratch) = heap::json_text_parts(text.get().as_bytes());
                set.value_scratch = set.value_scratch.max(scratch);
                set.held = set.held.saturating_add(offered_cost(
                    &name,
                    &server_id,
                    namespace,
                    &tool.name,
                    text.get(),
                ));
                set.definitions.push(text);
                set.mcp_names
                    .insert((server_id.clone(), tool.name.to_string()), name.clone());
                set.namespaced
                    .insert(format!("{namespace}.{}", tool.name), name.clone());
                set.routes.insert(
                    name,
                    Route::Mcp {
                        entry: grant.entry.clone(),
                        tool: tool.name.to_string(),
                        approval,
                    },
                );
            }
            // A pinned tool the server no longer lists is reported, so the drift shows.
            for (name, pinned) in &grant.entry.record.pins {
                if grant.tools.permits(name) && !tools.iter().any(|t| t.name == *name) {
                    let denial = Denial::PinnedToolMissing {
                        pinned: pinned.clone(),
                    };
                    set.decisions.push(Decision {
                        server_id: server_id.clone(),
                        tool: Some(name.clone()),
                        reason: denial.reason(),
                        detail: denial.to_string(),
                    });
                }
            }
            set.key.entries.push(grant.entry);
            set.key.listings.push(tools);
            set.key.left_out.push(left_out);
            set.servers.push(server_id);
        }
        set.held = set
            .decisions
            .iter()
            .fold(set.held, |sum, d| sum.saturating_add(decision_cost(d)));
        set.held = set.servers.iter().fold(set.held, |sum, s| {
            sum.saturating_add(heap::string(s.len() as u64))
        });
        set
    }
}

/// A map entry of a name map (its slot, hash and index share), beyond its strings.
const MAP_ENTRY: u64 = 128;

/// What one offered MCP tool holds in the maps, and its definition's text.
fn offered_cost(name: &str, server_id: &str, namespace: &str, tool: &str, definition: &str) -> u64 {
    let namespaced = namespace.len() + 1 + tool.len();
    [name.len(); 3]
        .into_iter()
        .chain([tool.len(); 3])
        .chain([server_id.len(), namespaced, definition.len()])
        .fold(3 * MAP_ENTRY, |sum, len| {
            sum.saturating_add(heap::string(len as u64))
        })
        .saturating_add(heap::vec_slot::<Box<RawValue>>())
}

/// What one decision holds.
fn decision_cost(decision: &Decision) -> u64 {
    let tool = decision.tool.as_deref().map_or(0, str::len);
    heap::vec_slot::<Decision>()
        .saturating_add(heap::string(decision.server_id.len() as u64))
        .saturating_add(heap::string(tool as u64))
        .saturating_add(heap::string(decision.detail.len() as u64))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::guest_tools::is_valid_function_name;

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
}
