//! The tools of one send: guest tools and MCP tools under model-facing names, and the name
//! map that routes the model's calls. Only tools whose [`Grant::check_call`] passes are
//! offered; a name the map does not know runs nothing. A tool whose calls need approval is
//! offered when the host has an approver (its route says so, and the decision log lists it
//! as `needs_approval`), and left out as `approval_required` when it has none.
//!
//! [`Grant::check_call`]: crate::policy::Grant::check_call

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::ChatSession;
use crate::approval;
use crate::mcp::{McpError, McpErrorCode, McpTask, Tool};
use crate::policy::{self, Approval, Decision, Denial, Effective, Reason, SessionRequest};
use crate::registry::{Registry, ServerEntry};

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
        narrowing: &session.mcp.narrowing,
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
                .map(|grant| mcp.pool.list_tools(&grant.entry, mcp.principal())),
        )
        .await;
        let mut effective = effective;
        for grant in &effective.servers {
            let server_id = grant.entry.server_id();
            for (tool, detail) in mcp.pool.left_out(&grant.entry, mcp.principal()).iter() {
                effective.decisions.push(Decision {
                    server_id: server_id.to_owned(),
                    tool: Some(tool.clone()),
                    reason: Reason::InvalidToolHeaders,
                    detail: detail.clone(),
                });
            }
        }
        let approver = mcp.approvals.configured();
        Self::assemble(session, &mcp.registry, effective, listings, approver)
    }

    /// The pure part of [`build`](Self::build): names, definitions and the decision log from
    /// the effective policy and each granted server's listing (in grant order); `approver`:
    /// whether the host can approve calls.
    pub(crate) fn assemble(
        session: &ChatSession,
        registry: &Registry,
        effective: Effective,
        listings: Vec<Result<Arc<[Tool]>, McpError>>,
        approver: bool,
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
                // Built as values: `json!` would serialise the schema's clone, and then the
                // whole function, into further copies.
                let mut function = Map::from_iter([
                    ("name".to_owned(), Value::from(name.as_str())),
                    (
                        "parameters".to_owned(),
                        Value::Object((*tool.input_schema).clone()),
                    ),
                ]);
                if let Some(description) = &tool.description {
                    function.insert("description".into(), Value::from(description.as_ref()));
                }
                set.definitions.push(Value::Object(Map::from_iter([
                    ("type".to_owned(), Value::from("function")),
                    ("function".to_owned(), Value::Object(function)),
                ])));
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
        if let Some((server_id, tool)) = split_server_tool(name)
            && let Some(offered) = self.mcp_names.get(&(server_id.to_owned(), tool.to_owned()))
        {
            return Some(offered);
        }
        self.namespaced.get(name).map(String::as_str)
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
        let (reason, why) = self
            .decisions
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
