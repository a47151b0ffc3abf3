//! The requests the pool sends: `tools/list` (cached), `tools/call`, the resource and
//! prompt requests, a connection test and pre-warming. Each runs within its server's
//! `tool_timeout_ms` and a host call permit, counts its failures against the server's
//! health and leaves without the server's secrets.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::Instrument;

use rmcp::model::{
    CallToolResponse, GetPromptRequestParams, GetPromptResponse, JsonObject,
    PaginatedRequestParams, Prompt, ReadResourceRequestParams, ReadResourceResponse, Resource,
    ResourceTemplate,
};

use super::failure::{CallPhase, server_failure, service_failed, timed_out};
use super::paging::{Page, list_all_pages, list_pages};
use super::slot::{CachedTools, ServerSlot, ToolsLeftOut};
use super::tasks::TaskCall;
use super::{CallRound, Connection, McpPool};
use crate::defaults;
use crate::mcp::cache::{ListCache, ListCaches};
use crate::mcp::capped::encode_answer;
use crate::mcp::input::{Asked, Asker, Asking, Round, rounds, timeout_besides_questions};
use crate::mcp::spans;
use crate::mcp::{CallToolResult, McpError, McpErrorCode, Tool};
use crate::registry::{Launch, ServerEntry};
use crate::sandbox::off_stack;

/// A successful `tools/call`: the result and its JSON encoding (what guests receive). Its
/// `result` may be a tool's own error (`isError`).
#[derive(Clone, Debug)]
pub struct ToolCallOutput {
    pub result: CallToolResult,
    pub json: Vec<u8>,
}

impl McpPool {
    /// A host-wide call permit, or why not. Waits (within the caller's timeout).
    pub(super) async fn call_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, McpError> {
        self.shared
            .calls
            .acquire()
            .await
            .map_err(|_| McpError::new(McpErrorCode::Unavailable, "the MCP pool is closed"))
    }

    /// Every tool the server lists (all pages), from the cache when fresh.
    /// `principal` is whom the call is made for (see [`Self::call_tool`]).
    pub(crate) async fn list_tools(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
    ) -> Result<Arc<[Tool]>, McpError> {
        let in_flight = self.enter(entry, principal);
        let slot = &in_flight.slot;
        let secrets = entry.secrets();
        let conn = self.connect(slot).await?;
        if let Some((tools, _)) = slot.fresh_tools(&conn, principal) {
            return Ok(tools);
        }
        let server_id = entry.server_id();
        let _listing = conn.in_flight.enter_unowned();
        // The listing `list_changed` outdated is served to nobody while this one is made.
        if conn.tools_stale.swap(false, Ordering::SeqCst) {
            *slot.tools.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let timeout = entry.record.budgets.tool_timeout;
        let cap = entry.record.budgets.max_tool_list_bytes;
        let phase = CallPhase::new(CallPhase::WAITING_FOR_HOST);
        let listing = async {
            let _permit = self.call_permit().await?;
            phase.set(CallPhase::ON_WIRE);
            list_all_pages(&conn, server_id, cap, &phase).await
        };
        let listed = match tokio::time::timeout(timeout, listing).await {
            Ok(listed) => listed,
            Err(_) => {
                let error = self.call_timed_out(slot, "tools/list", timeout, &phase);
                if phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                return Err(error);
            }
        };
        let listed = listed.map_err(|error| error.redacted(secrets));
        let (tools, hint): (Arc<[Tool]>, _) = match listed {
            Ok((tools, hint)) => (tools.into(), hint),
            Err(error) => {
                if error.code == McpErrorCode::Unavailable {
                    self.discard(slot, &conn).await;
                }
                if server_failure(error.code) && phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                return Err(error);
            }
        };
        slot.health.listed(tools.len());
        let left_out: ToolsLeftOut = conn.left_out.missing_from(&tools).into();
        for (tool, reason) in left_out.iter() {
            tracing::warn!(
                server_id,
                tool,
                reason = "invalid_tool_headers",
                detail = %reason,
                "left out of the server's tools: invalid x-mcp-header declarations (SEP-2243)"
            );
        }
        *slot.tools.lock().unwrap_or_else(|e| e.into_inner()) = Some(CachedTools {
            fetched: Instant::now(),
            conn_serial: conn.serial,
            ttl: hint.ttl(self.tools_ttl),
            private_to: hint.private.then(|| principal.map(Arc::from)),
            tools: tools.clone(),
            left_out,
        });
        Ok(tools)
    }

    /// Before a call on a connection that mirrors tool parameters into `Mcp-Param-*`
    /// headers (SEP-2243: Streamable HTTP at 2026-07-28), the tools listed on it: rmcp
    /// takes each tool's `x-mcp-header` declarations from the listing, and leaves out of
    /// it a tool whose declarations are invalid. A tool not among them is refused, so no
    /// call goes out without the headers its declaration asks for. A listing on this
    /// connection is reused whatever its age; a tool missing from it lists again once.
    async fn check_listed(
        &self,
        entry: &Arc<ServerEntry>,
        slot: &ServerSlot,
        conn: &Connection,
        name: &str,
        principal: Option<&str>,
    ) -> Result<(), McpError> {
        if !conn.mirrors_headers() {
            return Ok(());
        }
        let known = {
            let cache = slot.tools.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .as_ref()
                .filter(|cached| cached.conn_serial == conn.serial)
                .map(|cached| cached.tools.iter().any(|tool| tool.name == name))
        };
        if known == Some(true) {
            return Ok(());
        }
        // Off the stack: listing is rare here and its future large (see `off_stack`).
        let tools = off_stack(|| self.list_tools(entry, principal)).await?;
        if tools.iter().any(|tool| tool.name == name) {
            return Ok(());
        }
        Err(McpError::new(
            McpErrorCode::PolicyDenied,
            format!(
                "tool `{name}` is not among the tools server `{}` lists, so it is not called (a tool whose x-mcp-header declarations are invalid is left out of the listing; the log names why)",
                entry.server_id()
            ),
        ))
    }

    /// Calls `name` on the server within its budgets. `arguments` is the JSON object sent.
    /// The caller has decided policy ([`Grant::check_call`](crate::policy::Grant::check_call)).
    /// `principal` is whom the call is made for: a server whose credential is a user's
    /// grant is reached over that principal's own connection, with its token. A server
    /// that asks for input (SEP-2322) is answered for `asker`'s task, and each round is
    /// one request with its own `tool_timeout_ms` (see [`crate::mcp::input`]). A server
    /// that runs the call as a task (SEP-2663) is followed until the task ends, within
    /// the same `tool_timeout_ms` (see [`super::tasks`]).
    pub(crate) async fn call_tool(
        &self,
        entry: &Arc<ServerEntry>,
        name: &str,
        arguments: JsonObject,
        principal: Option<&str>,
        asker: &Asker,
    ) -> Result<ToolCallOutput, McpError> {
        let server_id = entry.server_id();
        let record = &entry.record;
        let asked = Asked {
            entry,
            method: "tools/call",
            name,
        };
        let arguments = &arguments;
        let result = rounds(asker, asked, |input_responses, request_state| {
            let round = CallRound {
                input_responses,
                request_state,
                ..CallRound::new(name, arguments)
            };
            off_stack(move || self.call_round(entry, round, principal, asker))
        })
        .await?;
        // The transport capped the answer as it was read; the guest gets it re-encoded,
        // which is checked again while it is written, so no more than the cap is buffered.
        let cap = record.budgets.max_tool_output_bytes;
        let json = encode_answer(&result, cap, format_args!("tool `{name}`"), server_id)?;
        Ok(ToolCallOutput { result, json })
    }

    /// One `tools/call` request of [`Self::call_tool`], within the server's budgets.
    async fn call_round(
        &self,
        entry: &Arc<ServerEntry>,
        mut round: CallRound<'_>,
        principal: Option<&str>,
        asker: &Asker,
    ) -> Result<Round<CallToolResult>, McpError> {
        let server_id = entry.server_id();
        let name = round.name;
        let in_flight = self.enter(entry, principal);
        let slot = &in_flight.slot;
        let conn = self.connect(slot).await?;
        self.check_listed(entry, slot, &conn, name, principal)
            .await?;
        conn.common_stream_ready().await;
        let timeout = entry.record.budgets.tool_timeout;
        let span = spans::request(entry, "tools/call", Some(name));
        if let Some(trace) = spans::trace_meta(&span) {
            round.meta.get_or_insert_default().extend(trace);
        }
        spans::record_peer(&span, conn.service.peer_info().as_deref());
        let phase = CallPhase::new(CallPhase::WAITING_FOR_SERVER);
        let asking = Arc::<Asking>::default();
        // Built (not sent: nothing runs until it is polled, with the permits held) and boxed
        // here: the call block holds a pointer, not another copy of the params, and rmcp's
        // request future is large (see `off_stack`). A call queued for permits holds it.
        let request = off_stack(|| conn.call_tool_once(round));
        let call = async {
            let _permit = slot.permits.acquire().await.map_err(|_| {
                McpError::new(
                    McpErrorCode::Unavailable,
                    format!("server `{server_id}` is shutting down"),
                )
            })?;
            phase.set(CallPhase::WAITING_FOR_HOST);
            let _host_permit = self.call_permit().await?;
            // In flight once it holds its permits: calls still queued for them are not
            // on the wire, so they do not make a question's owner ambiguous.
            let entered = conn
                .in_flight
                .enter(asker, entry, ("tools/call", name), &asking);
            phase.set(CallPhase::ON_WIRE);
            let sent = tokio::time::Instant::now();
            let result = request
                .await
                .map_err(|e| service_failed(server_id, name, e, &phase))?;
            Ok((result, sent, _permit, entered))
        };
        let outcome = match timeout_besides_questions(timeout, &asking, call)
            .instrument(span.clone())
            .await
        {
            Ok(outcome) => outcome,
            Err(_) => Err(self.call_timed_out(slot, name, timeout, &phase)),
        };
        let outcome = match outcome {
            // The call stays in flight (its questions and sampling requests are its own)
            // while the server runs it as a task, too.
            Ok((response, sent, _permit, _entered)) => {
                // An `isError` result is an answer too: the server is fine.
                slot.health.answered(sent.elapsed());
                match response {
                    CallToolResponse::Complete(result) => Ok(Round::Complete(result)),
                    CallToolResponse::InputRequired(input) => Ok(Round::InputRequired(input)),
                    // The server's permit stays held: the task is this call, still running.
                    CallToolResponse::Task(created) => {
                        let call = TaskCall {
                            entry,
                            conn: &conn,
                            tool: name,
                            asker,
                            sent,
                            phase: &phase,
                        };
                        off_stack(|| self.follow_task(call, created))
                            .instrument(span.clone())
                            .await
                            .map(Round::Complete)
                    }
                    _ => Err(McpError::new(
                        McpErrorCode::ToolExecFailed,
                        format!(
                            "server `{server_id}` answered tool `{name}` with an unknown result"
                        ),
                    )),
                }
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(round) => {
                if let Round::Complete(result) = &round
                    && result.is_error == Some(true)
                {
                    spans::record_tool_error(&span);
                }
                Ok(round)
            }
            Err(error) => {
                spans::record_error(&span, &error);
                let mut error = error.redacted(entry.secrets());
                if error.code == McpErrorCode::Unavailable {
                    self.discard(slot, &conn).await;
                    // The session ended because its grant was revoked or refused: say so,
                    // not "went away", and do not hold it against the server.
                    if let Some(refusal) = conn.auth_refusal.take() {
                        error = refusal;
                    }
                }
                if server_failure(error.code) && phase.on_wire() {
                    slot.health.failed(&error.message);
                }
                Err(error)
            }
        }
    }

    /// Every resource the server lists (all pages, at most `budgets.max_tool_list_bytes`),
    /// from the connection's cache while the server's hints keep it
    /// ([`crate::mcp::cache`]).
    pub(crate) async fn list_resources(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
    ) -> Result<Vec<Resource>, McpError> {
        let cache: fn(&ListCaches) -> &ListCache<_> = |lists| &lists.resources;
        self.list_cached(
            entry,
            principal,
            "resources/list",
            cache,
            |conn, params| async move {
                let page = conn.service.list_resources(Some(params)).await?;
                Ok(Page {
                    items: page.resources,
                    next: page.next_cursor,
                    ttl_ms: page.ttl_ms,
                    scope: page.cache_scope,
                })
            },
        )
        .await
    }

    /// Every resource template the server lists, bounded and cached like
    /// [`Self::list_resources`].
    pub(crate) async fn list_resource_templates(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
    ) -> Result<Vec<ResourceTemplate>, McpError> {
        let cache: fn(&ListCaches) -> &ListCache<_> = |lists| &lists.templates;
        let what = "resources/templates/list";
        self.list_cached(entry, principal, what, cache, |conn, params| async move {
            let page = conn.service.list_resource_templates(Some(params)).await?;
            Ok(Page {
                items: page.resource_templates,
                next: page.next_cursor,
                ttl_ms: page.ttl_ms,
                scope: page.cache_scope,
            })
        })
        .await
    }

    /// One listing other than tools: the connection's kept one while fresh, else every
    /// page read through `page`, kept as the pages' hints allow (at most the host's tools
    /// TTL).
    async fn list_cached<T, F, Fut>(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
        what: &'static str,
        cache: fn(&ListCaches) -> &ListCache<T>,
        page: F,
    ) -> Result<Vec<T>, McpError>
    where
        T: Clone + serde::Serialize,
        F: Fn(Arc<Connection>, PaginatedRequestParams) -> Fut,
        Fut: Future<Output = Result<Page<T>, rmcp::ServiceError>>,
    {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_list_bytes;
        let host_max = self.tools_ttl;
        self.request(entry, principal, what, None, |conn, phase, _| async move {
            let cache = cache(&conn.lists);
            let miss = match cache.fresh(principal) {
                Ok(items) => return Ok(items),
                Err(miss) => miss,
            };
            let _listing = conn.in_flight.enter_unowned();
            let (items, hint) = list_pages(server_id, what, cap, &phase, |cursor| {
                page(
                    conn.clone(),
                    PaginatedRequestParams::default().with_cursor(cursor),
                )
            })
            .await?;
            let ttl = hint.given_ttl(host_max);
            cache.keep(miss, ttl, hint.private, principal, &items);
            Ok(items)
        })
        .await
    }

    /// Reads `uri`; the result's JSON, at most `budgets.max_tool_output_bytes`. The caller
    /// has decided policy ([`Grant::check_resource`](crate::policy::Grant::check_resource)).
    /// Input the server asks for is answered for `asker`'s task, as for a tool call.
    pub(crate) async fn read_resource(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
        uri: &str,
        asker: &Asker,
    ) -> Result<Vec<u8>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_output_bytes;
        let what = "resources/read";
        let asked = Asked {
            entry,
            method: what,
            name: uri,
        };
        let result = rounds(asker, asked, |responses, state| {
            let mut params = ReadResourceRequestParams::new(uri);
            params.input_responses = responses;
            params.request_state = state;
            self.request(
                entry,
                principal,
                what,
                None,
                move |conn, phase, asking| async move {
                    let mut params = params;
                    spans::propagate(&tracing::Span::current(), &mut params);
                    let _asking = conn.in_flight.enter(asker, entry, (what, uri), &asking);
                    conn.common_stream_ready().await;
                    match conn.service.read_resource_once(params).await {
                        Ok(ReadResourceResponse::Complete(result)) => Ok(Round::Complete(result)),
                        Ok(ReadResourceResponse::InputRequired(input)) => {
                            Ok(Round::InputRequired(input))
                        }
                        Ok(_) => Err(McpError::new(
                            McpErrorCode::ToolExecFailed,
                            format!("server `{server_id}` answered {what} with an unknown result"),
                        )),
                        Err(e) => Err(service_failed(server_id, what, e, &phase)),
                    }
                },
            )
        })
        .await?;
        encode_answer(&result, cap, format_args!("resource `{uri}`"), server_id)
    }

    /// Every prompt the server lists, bounded and cached like [`Self::list_resources`].
    pub(crate) async fn list_prompts(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
    ) -> Result<Vec<Prompt>, McpError> {
        let cache: fn(&ListCaches) -> &ListCache<_> = |lists| &lists.prompts;
        self.list_cached(
            entry,
            principal,
            "prompts/list",
            cache,
            |conn, params| async move {
                let page = conn.service.list_prompts(Some(params)).await?;
                Ok(Page {
                    items: page.prompts,
                    next: page.next_cursor,
                    ttl_ms: page.ttl_ms,
                    scope: page.cache_scope,
                })
            },
        )
        .await
    }

    /// Gets the prompt `name` with `arguments`; the result's JSON, at most
    /// `budgets.max_tool_output_bytes`. The caller has decided policy
    /// ([`Grant::check_prompt`](crate::policy::Grant::check_prompt)). Input the server asks
    /// for is answered for `asker`'s task, as for a tool call.
    pub(crate) async fn get_prompt(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
        name: &str,
        arguments: JsonObject,
        asker: &Asker,
    ) -> Result<Vec<u8>, McpError> {
        let server_id = entry.server_id();
        let cap = entry.record.budgets.max_tool_output_bytes;
        let what = "prompts/get";
        let asked = Asked {
            entry,
            method: what,
            name,
        };
        let params = GetPromptRequestParams::new(name).with_arguments(arguments);
        let result = rounds(asker, asked, |responses, state| {
            let mut params = params.clone();
            params.input_responses = responses;
            params.request_state = state;
            self.request(
                entry,
                principal,
                what,
                Some(name),
                move |conn, phase, asking| async move {
                    let mut params = params;
                    spans::propagate(&tracing::Span::current(), &mut params);
                    let _asking = conn.in_flight.enter(asker, entry, (what, name), &asking);
                    conn.common_stream_ready().await;
                    match conn.service.get_prompt_once(params).await {
                        Ok(GetPromptResponse::Complete(result)) => Ok(Round::Complete(result)),
                        Ok(GetPromptResponse::InputRequired(input)) => {
                            Ok(Round::InputRequired(input))
                        }
                        Ok(_) => Err(McpError::new(
                            McpErrorCode::ToolExecFailed,
                            format!("server `{server_id}` answered {what} with an unknown result"),
                        )),
                        Err(e) => Err(service_failed(server_id, what, e, &phase)),
                    }
                },
            )
        })
        .await?;
        encode_answer(&result, cap, format_args!("prompt `{name}`"), server_id)
    }

    /// Runs one request other than a tool call on `entry`'s server: within its
    /// `tool_timeout` and a host call permit, its failures counted to the server's health
    /// and redacted as `tools/list`'s are. `request` runs inside the request's span
    /// (named after `what` and its `target`, a prompt's name: never a resource URI, which
    /// may carry argument values), whose context it may propagate.
    async fn request<'a, T, F, Fut>(
        &self,
        entry: &'a Arc<ServerEntry>,
        principal: Option<&str>,
        what: &str,
        target: Option<&str>,
        request: F,
    ) -> Result<T, McpError>
    where
        F: FnOnce(Arc<Connection>, Arc<CallPhase>, Arc<Asking>) -> Fut,
        Fut: Future<Output = Result<T, McpError>> + 'a,
    {
        let in_flight = self.enter(entry, principal);
        let slot = &in_flight.slot;
        let conn = self.connect(slot).await?;
        let timeout = entry.record.budgets.tool_timeout;
        let phase = Arc::new(CallPhase::new(CallPhase::WAITING_FOR_HOST));
        let asking = Arc::<Asking>::default();
        let run = async {
            let _permit = self.call_permit().await?;
            phase.set(CallPhase::ON_WIRE);
            request(conn.clone(), phase.clone(), asking.clone()).await
        };
        let span = spans::request(entry, what, target);
        let result = match timeout_besides_questions(timeout, &asking, run)
            .instrument(span.clone())
            .await
        {
            Ok(result) => result.map_err(|error| error.redacted(entry.secrets())),
            Err(_) => Err(self.call_timed_out(slot, what, timeout, &phase)),
        };
        if let Err(error) = &result {
            spans::record_error(&span, error);
            if error.code == McpErrorCode::Unavailable {
                self.discard(slot, &conn).await;
            }
            if server_failure(error.code) && phase.on_wire() {
                slot.health.failed(&error.message);
            }
        }
        result
    }

    /// A timeout while doing `what` on `slot`'s server; names the cap whose permit the
    /// call was still waiting for, if it was.
    fn call_timed_out(
        &self,
        slot: &ServerSlot,
        what: &str,
        timeout: Duration,
        phase: &CallPhase,
    ) -> McpError {
        let server_id = slot.entry.server_id();
        let waited_for = match phase.get() {
            CallPhase::WAITING_FOR_SERVER => format!(
                "the server's {} call permits (budgets.max_concurrency)",
                slot.entry.record.budgets.max_concurrency
            ),
            CallPhase::WAITING_FOR_HOST => format!(
                "the host's {} MCP call permits (max_concurrent_calls)",
                self.shared.limits.max_concurrent_calls
            ),
            _ => return timed_out(server_id, what, timeout),
        };
        McpError::new(
            McpErrorCode::Timeout,
            format!(
                "{what} on server `{server_id}` waited {} ms (budgets.tool_timeout_ms) for one of {waited_for} without getting one",
                timeout.as_millis(),
            ),
        )
    }

    /// Connects to `entry`'s server afresh, beside its pooled connection (whose health,
    /// tools cache and process are untouched), lists every tool, and closes it again,
    /// stopping a stdio server's process group. The connect is bounded by the connect
    /// timeout, the listing by `tool_timeout_ms`. A stdio probe takes one of the host's
    /// `max_server_processes` permits without stopping another server for it: at the cap
    /// it fails at once. Errors carry none of the launch's secrets.
    pub(crate) async fn probe(&self, entry: &ServerEntry) -> Result<Vec<Tool>, McpError> {
        let server_id = entry.server_id();
        let permit = match entry.launch {
            Ok(Launch::Stdio { .. }) => Some(
                self.shared
                    .processes
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| {
                        McpError::new(
                            McpErrorCode::Unavailable,
                            format!(
                                "cannot start server `{server_id}` for a test: the host already runs {} MCP server processes (max_server_processes); try again when one is idle",
                                self.shared.limits.max_server_processes
                            ),
                        )
                    })?,
            ),
            _ => None,
        };
        let conn = Arc::new(self.connector.open(entry, 0, permit, None).await?);
        let timeout = entry.record.budgets.tool_timeout;
        let cap = entry.record.budgets.max_tool_list_bytes;
        let phase = CallPhase::new(CallPhase::ON_WIRE);
        let listed = tokio::time::timeout(timeout, list_all_pages(&conn, server_id, cap, &phase))
            .await
            .unwrap_or_else(|_| Err(timed_out(server_id, "tools/list", timeout)));
        conn.close(server_id, defaults::SHUTDOWN_GRACE).await;
        listed
            .map(|(tools, _)| tools)
            .map_err(|error| error.redacted(entry.secrets()))
    }

    /// Starts `entries`' servers now (connecting and listing their tools), so the first
    /// call does not wait for them. Failures are logged, not returned.
    pub(crate) async fn prewarm(&self, entries: &[Arc<ServerEntry>]) {
        let warming = entries.iter().map(|entry| async move {
            let started = Instant::now();
            let server_id = entry.server_id();
            match self.list_tools(entry, None).await {
                Ok(tools) => tracing::info!(
                    server_id,
                    tools = tools.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "pre-warmed MCP server"
                ),
                Err(error) => tracing::warn!(server_id, %error, "cannot pre-warm MCP server"),
            }
        });
        futures::future::join_all(warming).await;
    }
}
