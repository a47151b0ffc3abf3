//! Looking at one registry server from outside a task: a connection test
//! ([`Host::probe_server`]), its tool listing ([`Host::server_tools`]) and the tool list a
//! model would be offered ([`Host::preview_tools`]). The admin API and the CLI use these;
//! they are here, not in a handler, so every embedder gets the same answers. None of them
//! calls a tool: that goes through [`Host::call_tool`] and policy.
//!
//! A test connects afresh (beside the pooled connection, so it neither disturbs calls in
//! flight nor is fooled by a connection made under an older record) and always gives a
//! report: a failure is `ok: false` with the reason, redacted like every server error. The
//! preview goes through the pool (its cache and its connection), then applies the
//! registry's `allowed_tools` and names each tool as the chat capability does.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tracing::Instrument;

use super::Host;
use crate::chat::tools::mcp_model_name;
use crate::defaults;
use crate::mcp::{McpError, Tool};
use crate::observe::{PinChange, PinsChanged};
use crate::policy::{Denial, TaskMcpPolicy, ToolFilter, check_definition};
use crate::registry::{ServerEntry, tool_digest};
use crate::text::{cut, printable};

/// What a connection test found. New fields may be added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeReport {
    pub server_id: String,
    /// Whether the server started (or was reached), shook hands and listed its tools.
    pub ok: bool,
    pub elapsed_ms: u64,
    /// Tools listed (before the `allowed_tools` filter); `None` when the test failed.
    pub tool_count: Option<u64>,
    /// The first [`defaults::PROBE_TOOL_NAMES`] tool names, sorted.
    pub tools: Vec<String>,
    /// Why the test failed: redacted, cut to [`defaults::MAX_SERVER_ERROR_BYTES`], then
    /// made printable.
    pub error: Option<String>,
}

/// One tool a model would be offered, as [`Host::preview_tools`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolPreview {
    /// The MCP-native name.
    pub name: String,
    /// The name a model sees in a chat session (`mcp__<id>__<tool>` by default).
    pub model_name: String,
    pub description: Option<String>,
}

/// One tool's definition against the record's pin, as [`Host::pin_report`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PinStatus {
    pub name: String,
    /// The record's pin, if any.
    pub pinned: Option<String>,
    /// The digest of the definition the server lists now; `None` when it does not list
    /// the tool.
    pub current: Option<String>,
    /// Why the tool is refused (`tool_definition_drifted`, `pinned_tool_missing`,
    /// `tool_not_pinned`), with both digests in the detail; `None` when it passes.
    pub denied: Option<String>,
}

/// Why a preview has no list.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("no server `{0}` in the registry snapshot")]
    UnknownServer(String),
    /// The server could not be reached or did not list its tools.
    #[error(transparent)]
    Unavailable(McpError),
    /// A tool asked to be pinned that cannot be: not listed, or outside `allowed_tools`.
    #[error("{0}")]
    NotPinnable(String),
}

impl Host {
    /// Tests `server_id`'s record as the current snapshot has it: connects afresh, lists
    /// its tools, disconnects (a stdio server's process group is stopped). `None` if the
    /// snapshot has no such server. Bounded by the record's connect timeout (or the
    /// host's) plus its `tool_timeout_ms`.
    pub async fn probe_server(&self, server_id: &str) -> Option<ProbeReport> {
        let span = tracing::info_span!("probe_server", server_id);
        self.probe_server_inner(server_id).instrument(span).await
    }

    async fn probe_server_inner(&self, server_id: &str) -> Option<ProbeReport> {
        let registry = self.registry();
        let entry = registry.get(server_id)?;
        let started = Instant::now();
        let probed = self.inner.pool.probe(entry).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let report = match probed {
            Ok(tools) => {
                let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
                names.sort();
                names.truncate(defaults::PROBE_TOOL_NAMES);
                ProbeReport {
                    server_id: server_id.to_owned(),
                    ok: true,
                    elapsed_ms,
                    tool_count: Some(u64::try_from(tools.len()).unwrap_or(u64::MAX)),
                    tools: names,
                    error: None,
                }
            }
            Err(error) => ProbeReport {
                server_id: server_id.to_owned(),
                ok: false,
                elapsed_ms,
                tool_count: None,
                tools: Vec::new(),
                error: Some(printable(cut(
                    &error.message,
                    defaults::MAX_SERVER_ERROR_BYTES,
                ))),
            },
        };
        tracing::info!(
            server_id,
            ok = report.ok,
            elapsed_ms,
            "tested an MCP server"
        );
        Some(report)
    }

    /// Every tool `server_id` lists, before any filter, through the pool (its cache and its
    /// connection, which this makes if there is none, so the server's health shows the
    /// result). [`Host::preview_tools`] is this after the registry's `allowed_tools`.
    pub async fn server_tools(&self, server_id: &str) -> Result<Arc<[Tool]>, PreviewError> {
        self.server_tools_as(server_id, None).await
    }

    /// [`Host::server_tools`] as `principal` sees them: a server with user authorization
    /// lists with that principal's grant.
    pub async fn server_tools_as(
        &self,
        server_id: &str,
        principal: Option<&str>,
    ) -> Result<Arc<[Tool]>, PreviewError> {
        let span = tracing::info_span!("server_tools", server_id);
        let (_, tools) = self
            .server_tools_inner(server_id, principal)
            .instrument(span)
            .await?;
        Ok(tools)
    }

    /// The registry entry of `server_id` and the tools it lists as `principal` sees them.
    async fn server_tools_inner(
        &self,
        server_id: &str,
        principal: Option<&str>,
    ) -> Result<(Arc<ServerEntry>, Arc<[Tool]>), PreviewError> {
        let entry = self.server_entry(server_id)?;
        let tools = self
            .inner
            .pool
            .list_tools(&entry, principal)
            .await
            .map_err(PreviewError::Unavailable)?;
        Ok((entry, tools))
    }

    fn server_entry(&self, server_id: &str) -> Result<Arc<ServerEntry>, PreviewError> {
        self.registry()
            .get(server_id)
            .cloned()
            .ok_or_else(|| PreviewError::UnknownServer(server_id.to_owned()))
    }

    /// The tools of `server_id` a task could be offered: its listing (through the pool)
    /// after the registry's `allowed_tools`, sorted, each with its model-facing name.
    /// Profiles, task and session filters narrow this further per task.
    pub async fn preview_tools(&self, server_id: &str) -> Result<Vec<ToolPreview>, PreviewError> {
        self.preview_tools_as(server_id, None).await
    }

    /// [`Host::preview_tools`] as `principal` sees them (see [`Host::server_tools_as`]).
    pub async fn preview_tools_as(
        &self,
        server_id: &str,
        principal: Option<&str>,
    ) -> Result<Vec<ToolPreview>, PreviewError> {
        let span = tracing::info_span!("preview_tools", server_id);
        self.preview_tools_inner(server_id, principal)
            .instrument(span)
            .await
    }

    /// Every tool `server_id` lists that its `allowed_tools` lets through, and every tool its
    /// record pins, each with its pin, its current digest and whether the pins refuse it:
    /// what `quiver mcp tools` shows and `quiver registry pin` writes from.
    pub async fn pin_report_as(
        &self,
        server_id: &str,
        principal: Option<&str>,
    ) -> Result<Vec<PinStatus>, PreviewError> {
        let (entry, tools) = self.server_tools_inner(server_id, principal).await?;
        let record = &entry.record;
        let filter = ToolFilter::new(&record.allowed_tools, &TaskMcpPolicy::default());
        let status = |name: &str, listed: Option<&Tool>| PinStatus {
            name: name.to_owned(),
            pinned: record.pins.get(name).cloned(),
            current: listed.map(tool_digest),
            denied: check_definition(record, name, listed)
                .err()
                .map(|denial: Denial| denial.to_string()),
        };
        let mut report: Vec<PinStatus> = tools
            .iter()
            .filter(|t| filter.permits(&t.name))
            .map(|t| status(&t.name, Some(t)))
            .collect();
        for name in record.pins.keys() {
            if !tools.iter().any(|t| t.name == *name) {
                report.push(status(name, None));
            }
        }
        report.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(report)
    }

    /// The record's `pins` with `tools` (every listed tool `allowed_tools` lets through
    /// when empty) pinned to the definitions `server_id` lists now, through the pool as
    /// `principal` (the normal connection, its policy gate and credentials). Other pins
    /// are kept. Nothing is written: the caller stores the record, then reports the
    /// change with [`Host::report_pins_changed`].
    pub async fn pins_from_server(
        &self,
        server_id: &str,
        tools: &[String],
        principal: Option<&str>,
    ) -> Result<BTreeMap<String, String>, PreviewError> {
        let (entry, listed) = self.server_tools_inner(server_id, principal).await?;
        let record = &entry.record;
        let filter = ToolFilter::new(&record.allowed_tools, &TaskMcpPolicy::default());
        let mut pins = record.pins.clone();
        for name in tools {
            let name = printable(cut(name, defaults::MAX_TOOL_NAME_BYTES));
            if !listed.iter().any(|t| t.name == name) {
                return Err(PreviewError::NotPinnable(format!(
                    "server `{server_id}` does not list a tool `{name}`; `quiver mcp tools {server_id}` shows what it lists"
                )));
            }
            if !filter.permits(&name) {
                return Err(PreviewError::NotPinnable(format!(
                    "tool `{name}` is not in the record's allowed_tools, so no task can use it; allow it first"
                )));
            }
        }
        for tool in listed.iter().filter(|t| filter.permits(&t.name)) {
            if tools.is_empty() || tools.iter().any(|n| *n == tool.name) {
                pins.insert(tool.name.to_string(), tool_digest(tool));
            }
        }
        if pins.len() > defaults::MAX_TOOL_PINS {
            return Err(PreviewError::NotPinnable(format!(
                "{} pins, more than the {} a record may hold; name the tools to pin",
                pins.len(),
                defaults::MAX_TOOL_PINS
            )));
        }
        Ok(pins)
    }

    /// Tells the host's observers (the audit log) that `by` replaced `server_id`'s pins
    /// `old` with `new`: one line with every tool whose pin changed, old and new digest.
    /// Nothing is reported when nothing changed.
    pub fn report_pins_changed(
        &self,
        server_id: &str,
        by: &str,
        old: &BTreeMap<String, String>,
        new: &BTreeMap<String, String>,
    ) -> Vec<PinChange> {
        let changes: Vec<PinChange> = new
            .iter()
            .filter(|(tool, pin)| old.get(*tool) != Some(*pin))
            .map(|(tool, pin)| PinChange {
                tool: tool.clone(),
                old: old.get(tool).cloned(),
                new: pin.clone(),
            })
            .collect();
        if !changes.is_empty() {
            tracing::info!(
                server_id,
                by,
                changed = changes.len(),
                "tool definitions pinned"
            );
            self.inner.observers.pins_changed(&PinsChanged {
                server_id: server_id.to_owned(),
                by: by.to_owned(),
                changes: changes.clone(),
                at: std::time::SystemTime::now(),
            });
        }
        changes
    }

    async fn preview_tools_inner(
        &self,
        server_id: &str,
        principal: Option<&str>,
    ) -> Result<Vec<ToolPreview>, PreviewError> {
        let (entry, tools) = self.server_tools_inner(server_id, principal).await?;
        let filter = ToolFilter::new(&entry.record.allowed_tools, &TaskMcpPolicy::default());
        // A tool that drifted from its pin is not offered either ([`Host::pin_report`] says why).
        let mut allowed: Vec<_> = tools
            .iter()
            .filter(|t| {
                filter.permits(&t.name) && check_definition(&entry.record, &t.name, Some(t)).is_ok()
            })
            .collect();
        // Named in the order a chat session names them, so collisions resolve alike.
        allowed.sort_by(|a, b| a.name.cmp(&b.name));
        let mut taken = HashSet::new();
        let namespace = &entry.record.tool_namespace;
        Ok(allowed
            .into_iter()
            .map(|tool| {
                let model_name = mcp_model_name(namespace, server_id, &tool.name, &taken);
                taken.insert(model_name.clone());
                ToolPreview {
                    name: tool.name.to_string(),
                    model_name,
                    description: tool.description.as_deref().map(str::to_owned),
                }
            })
            .collect())
    }
}

impl Host {
    /// Has a person authorize `server_id` for `principal` now (the server's `auth_ref`
    /// must be `kind = "oauth_authorization_code"`), through the host's
    /// [`UserAuthorizer`](crate::UserAuthorizer), and keeps the grant in its
    /// [`GrantStore`](crate::GrantStore). Replaces a grant the principal had.
    pub async fn authorize_server(
        &self,
        server_id: &str,
        principal: &str,
    ) -> Result<(), PreviewError> {
        self.authorize(server_id, principal, None).await
    }

    /// [`Host::authorize_server`] asking the person through `authorizer` for this flow
    /// only: e.g. a scheduler's web page that shows the URL to the user who asked and
    /// receives the redirect, while calls on this host never start a flow themselves.
    pub async fn authorize_server_with(
        &self,
        server_id: &str,
        principal: &str,
        authorizer: Arc<dyn crate::UserAuthorizer>,
    ) -> Result<(), PreviewError> {
        self.authorize(server_id, principal, Some(authorizer)).await
    }

    async fn authorize(
        &self,
        server_id: &str,
        principal: &str,
        authorizer: Option<Arc<dyn crate::UserAuthorizer>>,
    ) -> Result<(), PreviewError> {
        let span = tracing::info_span!("authorize_server", server_id, principal);
        async {
            let entry = self.server_entry(server_id)?;
            self.inner
                .pool
                .authorize(&entry, principal, authorizer)
                .await
                .map_err(PreviewError::Unavailable)
        }
        .instrument(span)
        .await
    }

    /// What `principal`'s grant for `server_id` holds (scopes, expiry), never a token;
    /// `None` when the principal has not authorized it. A server whose credential is not
    /// `kind = "oauth_authorization_code"` is refused.
    pub async fn grant_status(
        &self,
        server_id: &str,
        principal: &str,
    ) -> Result<Option<crate::GrantStatus>, PreviewError> {
        let entry = self.server_entry(server_id)?;
        self.inner
            .pool
            .grant_status(&entry, principal)
            .await
            .map_err(PreviewError::Unavailable)
    }

    /// Forgets `principal`'s grant for `server_id` (its tokens and registration) and
    /// closes the connection made with it; whether there was one.
    pub async fn revoke_server(
        &self,
        server_id: &str,
        principal: &str,
    ) -> Result<bool, PreviewError> {
        let span = tracing::info_span!("revoke_server", server_id, principal);
        async {
            let entry = self.server_entry(server_id)?;
            self.inner
                .pool
                .revoke(&entry, principal)
                .await
                .map_err(PreviewError::Unavailable)
        }
        .instrument(span)
        .await
    }
}
