//! Making one MCP connection: start or reach a server, then open the rmcp session.
//!
//! The pool decides *when* to connect (lazily, with backoff, one connection per server)
//! and when to close; this module decides *how*. The two transports differ only in how the
//! byte stream comes to be: [`stdio`] spawns a confined child process (whose process group
//! [`process`] owns until its last member is gone), [`remote`] resolves credentials and
//! builds an HTTP transport that goes through the egress-checked client. Everything after
//! that is the same for both and lives in one place, [`Connector::establish`]: the
//! notification handler, a span detached from the caller, the timed handshake in the mode
//! the record asks for, the error mapping, and the [`Connection`] handed to the pool.
//!
//! Every error and log line about a server passes through its launch's
//! [`Secrets`](crate::registry::Secrets): URLs, commands and library errors may carry what
//! a `${ENV:..}` reference resolved to.

mod answer;
mod direct;
mod guard;
mod lines;
mod probe;
mod process;
mod remote;
mod scan;
mod sse;
mod stdio;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[allow(deprecated)] // sampling (SEP-2577), which 2025-era servers still use
use rmcp::model::{
    CallToolResponse, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, FormElicitationCapability, ProtocolVersion,
    RequestMetaObject, SamplingCapability, ServerJsonRpcMessage,
};
use rmcp::service::{
    NotificationContext, RequestContext, RunningService, RunningServiceCancellationToken,
};
use rmcp::transport::{IntoTransport, Transport};
use rmcp::{
    ClientCacheConfig, ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt,
};
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tracing::Instrument;

use super::ServerRules;
use super::cache::ListCaches;
use super::error::{McpError, McpErrorCode, error_chain};
use super::http::{AuthRefusal, CommonStream, SseConnectError};
use super::input::InFlight;
use super::outbound::{ClientBuildError, OutboundClient};
use super::sampling::{Generation, busy, to_error_data};
use super::tool_headers::LeftOut;
use crate::defaults;
use crate::registry::{Launch, Lifecycle, ServerEntry, Transport as Wire};
pub(super) use direct::CallRound;
use direct::DirectCalls;
pub(super) use guard::{Guard, Guarded, Incoming, Kind, Limits, Problem};
use probe::{Probe, Probing};
use process::ServerProcess;
pub(super) use scan::IdScan;
pub(super) use sse::{SseEvent, SseReader};

/// Receives server notifications for one connection, and says who the client is.
#[derive(Clone)]
pub(super) struct ClientEvents {
    server_id: Arc<str>,
    tools_stale: Arc<AtomicBool>,
    /// The connection's other listings, dropped when the server says they changed.
    lists: Arc<ListCaches>,
    /// What `initialize` asks for: the record's `protocol_version`, else rmcp's newest
    /// version that has that handshake (rmcp's own default is its newest version, which
    /// has none, and the spec's `initialize` must name one that does).
    protocol_version: ProtocolVersion,
    /// The requests in flight, whose task answers the server's questions.
    in_flight: Arc<InFlight>,
    /// One question at a time: a server's flood of them is declined, not queued.
    asking: Arc<tokio::sync::Semaphore>,
    /// The record lets the server sample, so the client says it can.
    sampling: bool,
}

impl ClientHandler for ClientEvents {
    /// A 2025-protocol server's question during a call: answered for the task whose call
    /// it must be, as an `input_required` round's would be (see [`InFlight`]).
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        let decline = || Ok(ElicitResult::new(ElicitationAction::Decline));
        let Some(sole) = self.in_flight.sole() else {
            tracing::info!(server_id = %self.server_id, "declined a question that no single task's request can own");
            return decline();
        };
        let Ok(_one) = self.asking.try_acquire() else {
            tracing::info!(server_id = %self.server_id, "declined a question asked while another waits");
            return decline();
        };
        if !sole.may_ask() {
            tracing::info!(server_id = %self.server_id, "declined a question past the request's limit");
            return decline();
        }
        // The server may withdraw it; the request it came with may end first (then the
        // question has nobody to ask for).
        tokio::select! {
            result = sole.elicit(request) => Ok(result),
            () = context.ct.cancelled() => decline(),
            () = sole.ended.cancelled() => decline(),
        }
    }

    /// A 2025-protocol server's sampling request during a call: answered for the task
    /// whose call it must be, as an `input_required` round's would be; refused (a JSON-RPC
    /// error the server may handle) when its record does not allow it, over a budget, or
    /// when no single task's request owns it.
    #[allow(deprecated)] // sampling (SEP-2577), which 2025-era servers still use
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, rmcp::ErrorData> {
        let Some(sole) = self.in_flight.sole() else {
            tracing::info!(server_id = %self.server_id, "refused a sampling request that no single task's request can own");
            return Err(to_error_data(&busy(
                "no single request of a task is in flight on this connection",
            )));
        };
        let asked = sole.asked();
        let max_tokens = params.max_tokens;
        let refuse = |why: &str| {
            let refused = busy(why);
            sole.asker
                .report_refused(asked, Generation::Request, &refused, max_tokens);
            Err(to_error_data(&refused))
        };
        let Ok(_one) = self.asking.try_acquire() else {
            return refuse("another question or sampling request of this server is waiting");
        };
        if !sole.may_ask() {
            return refuse("the server asked too often during this request");
        }
        tokio::select! {
            sampled = sole.asker.sample(asked, Generation::Request, params) => {
                sampled.map_err(|refused| to_error_data(&refused))
            }
            () = context.ct.cancelled() => Err(to_error_data(&busy("the server cancelled it"))),
            () = sole.ended.cancelled() => Err(to_error_data(&busy("the request it came with has ended"))),
        }
    }

    /// A 2025-protocol server asks for the client's roots: the declared roots of the task
    /// whose request is the only one in flight on the connection, else none (the
    /// connection is shared: another task's roots must never reach the server for it).
    #[expect(
        deprecated,
        reason = "rmcp marks roots deprecated (SEP-2577); 2025 servers still ask"
    )]
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, rmcp::ErrorData> {
        let roots = match self.in_flight.sole() {
            Some(sole) => sole.list_roots(),
            None => serde_json::json!({"roots": []}),
        };
        serde_json::from_value(roots)
            .map_err(|e| rmcp::ErrorData::internal_error(format!("roots: {e}"), None))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "tools/list_changed: dropping cached tools");
        self.tools_stale.store(true, Ordering::SeqCst);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "resources/list_changed: dropping cached listings");
        self.lists.resources_changed();
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "prompts/list_changed: dropping cached prompts");
        self.lists.prompts_changed();
    }

    fn get_info(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        config.client_info.name = "quiver".into();
        config.client_info.version = env!("CARGO_PKG_VERSION").into();
        config.protocol_version = self.protocol_version.clone();
        // Questions are answered (or declined) for the task; roots are the task's (none).
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation =
            Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        capabilities.roots = Some(Default::default());
        // Long-running calls as tasks (SEP-2663): the pool follows them (`pool::tasks`).
        capabilities.extensions = Some(
            [(
                rmcp::model::TASKS_EXTENSION_ID.to_owned(),
                Default::default(),
            )]
            .into_iter()
            .collect(),
        );
        if self.sampling {
            // Tools in sampling (SEP-1577) are passed to the model as its tools.
            let mut sampling = SamplingCapability::default();
            sampling.tools = Some(Default::default());
            capabilities.sampling = Some(sampling);
        }
        config.capabilities = capabilities;
        config
    }
}

/// One live MCP session, as the pool holds it.
pub(super) struct Connection {
    pub(super) service: RunningService<RoleClient, ClientEvents>,
    /// Which connection of its slot this is (1 + restarts); the tools cache is keyed by it.
    pub(super) serial: u64,
    /// The server's process group, for stdio servers; it holds the pool's process permit
    /// until the group is gone. Dropping the last reference kills the group.
    process: Option<Arc<ServerProcess>>,
    /// Set by a `tools/list_changed` notification.
    pub(super) tools_stale: Arc<AtomicBool>,
    /// The resource, template and prompt listings, as the server's hints allow.
    pub(in crate::mcp) lists: Arc<ListCaches>,
    /// Streamable HTTP, whose transport mirrors tool parameters into headers.
    streamable: bool,
    /// The listed tools the transport left out for invalid `x-mcp-header` declarations.
    pub(super) left_out: LeftOut,
    /// Set when the transport stops delivering (the server went away, or the guard closed
    /// the connection): rmcp's session stays open until its transport has closed, which
    /// for a stdio server can take the shutdown grace, and no call may go to it meanwhile.
    ended: Arc<Ended>,
    /// Why the session's requests were refused credentials, when only a person can fix it.
    pub(super) auth_refusal: AuthRefusal,
    /// The requests in flight, for the server's own questions (2025 protocol).
    pub(in crate::mcp) in_flight: Arc<InFlight>,
    /// A Streamable HTTP session's standalone GET stream (`None` for other transports).
    common_stream: Option<CommonStream>,
    /// A stdio session's own `tools/call` path, beside rmcp's loop.
    direct: Option<DirectCalls<tokio::process::ChildStdout, tokio::process::ChildStdin>>,
}

/// The end of a transport: a flag to read and a wake-up for whoever stops the server.
#[derive(Default)]
struct Ended {
    flag: AtomicBool,
    wake: Notify,
}

impl Ended {
    fn set(&self) {
        if !self.flag.swap(true, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

impl Connection {
    fn with_auth_refusal(mut self, refusal: AuthRefusal) -> Self {
        self.auth_refusal = refusal;
        self
    }

    fn with_common_stream(mut self, common_stream: CommonStream) -> Self {
        self.common_stream = Some(common_stream);
        self
    }

    /// Calls go through `direct` from now on. On a session without `initialize`
    /// (2026-07-28) each carries the client context rmcp puts in every request's `_meta`:
    /// the negotiated version, and the client's info and capabilities.
    fn with_direct_calls(
        mut self,
        direct: DirectCalls<tokio::process::ChildStdout, tokio::process::ChildStdin>,
    ) -> Self {
        let Some(version) = self
            .service
            .peer()
            .peer_info()
            .map(|peer| peer.protocol_version.clone())
        else {
            return self;
        };
        let meta = (!version.has_initialize()).then(|| {
            let client = self.service.service().get_info();
            RequestMetaObject::with_client_context(version, client.client_info, client.capabilities)
        });
        self.direct = Some(direct.with_meta(meta));
        self
    }

    /// One `tools/call`, as rmcp's `call_tool_once` does it: on a stdio session written by
    /// the caller itself ([`direct`]), elsewhere through rmcp.
    pub(super) async fn call_tool_once(
        &self,
        round: CallRound<'_>,
    ) -> Result<CallToolResponse, rmcp::ServiceError> {
        match &self.direct {
            Some(direct) => direct.call_tool(&round).await,
            None => self.service.call_tool_once(round.into_params()).await,
        }
    }

    /// Before a request on a Streamable HTTP session of the 2025 protocol: waits (at most
    /// [`defaults::COMMON_STREAM_WAIT`], once) for its standalone GET stream, where some
    /// servers send their questions during a call; a stateless 2026-07-28 session has none.
    pub(in crate::mcp) async fn common_stream_ready(&self) {
        let session = self
            .service
            .peer()
            .peer_info()
            .is_some_and(|info| info.protocol_version < ProtocolVersion::V_2026_07_28);
        if let Some(common_stream) = self
            .common_stream
            .as_ref()
            .filter(|_| self.streamable && session)
        {
            common_stream.wait(defaults::COMMON_STREAM_WAIT).await;
        }
    }

    /// Whether the session is open and, for a stdio server, its first process still runs:
    /// a child holding the server's stdout open would hide the server's death otherwise.
    pub(super) fn is_alive(&self) -> bool {
        !self.ended.is_set()
            && !self.service.is_closed()
            && !self.service.peer().is_transport_closed()
            && self
                .process
                .as_deref()
                .is_none_or(ServerProcess::leader_running)
    }

    /// Whether calls on this connection carry `Mcp-Param-*` headers taken from the tools
    /// listed on it (SEP-2243): Streamable HTTP at protocol 2026-07-28 or later.
    pub(super) fn mirrors_headers(&self) -> bool {
        self.streamable
            && self
                .service
                .peer()
                .peer_info()
                .is_some_and(|info| info.protocol_version >= ProtocolVersion::STANDARD_HEADERS)
    }

    /// The server process, if connected over stdio.
    pub(super) fn pid(&self) -> Option<u32> {
        self.process.as_deref().map(ServerProcess::pid)
    }

    /// Whether this connection runs a server process.
    pub(super) fn is_stdio(&self) -> bool {
        self.process.is_some()
    }

    /// Ends the session and, for a stdio server, its whole process group: stdin closes,
    /// then the group is stopped within `grace` per step. Calls still holding the
    /// connection fail with `mcp_unavailable`.
    pub(super) async fn close(self: Arc<Self>, server_id: &str, grace: Duration) {
        match Arc::try_unwrap(self) {
            Ok(conn) => {
                // Waits for the session task to end, which closes the server's stdin.
                if tokio::time::timeout(grace, conn.service.cancel())
                    .await
                    .is_err()
                {
                    tracing::debug!(server_id, "MCP session did not close in time");
                }
                if let Some(process) = &conn.process {
                    process.stop(server_id, grace).await;
                }
            }
            Err(shared) => {
                shared.service.cancellation_token().cancel();
                if let Some(process) = &shared.process {
                    process.stop(server_id, grace).await;
                }
            }
        }
    }
}

/// A transport that notes when it stops delivering (see [`Connection::is_alive`]).
struct Watched<T> {
    inner: T,
    ended: Arc<Ended>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Watched<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let message = self.inner.receive().await;
        if message.is_none() {
            self.ended.set();
        }
        message
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Where a connection goes, for its errors and its log line.
enum Peer<'a> {
    Process(Box<ServerProcess>),
    /// A remote server, and where its transport notes the tools it leaves out.
    Url(&'a str, LeftOut),
}

/// Opens connections: the connect timeout, and for remote servers the credentials and the
/// one HTTP client (which applies the egress policy to every request).
pub(super) struct Connector {
    timeout: Duration,
    /// The operator's rules: launch rules, egress, credentials.
    rules: Arc<ServerRules>,
    /// One client for every remote server (sharing connections); it checks every request
    /// against the egress policy.
    http: Result<OutboundClient, ClientBuildError>,
}

impl Connector {
    pub(super) fn new(timeout: Duration, rules: Arc<ServerRules>) -> Self {
        let http = OutboundClient::new(Arc::new(rules.egress.clone()), timeout);
        Self {
            timeout,
            rules,
            http,
        }
    }

    /// The rules records are held to (for building registries the same way).
    pub(super) fn rules(&self) -> &Arc<ServerRules> {
        &self.rules
    }

    /// A new connection to `entry`'s server, numbered `serial`. A stdio server's process
    /// holds `permit` until its group is gone. Its errors carry none of the launch's
    /// secrets.
    pub(super) async fn open(
        &self,
        entry: &ServerEntry,
        serial: u64,
        permit: Option<OwnedSemaphorePermit>,
        principal: Option<&str>,
    ) -> Result<Connection, McpError> {
        let server_id = entry.server_id();
        let launch = entry.launch.as_ref().map_err(|reason| {
            unavailable(format!("server `{server_id}` is unavailable: {reason}"))
        })?;
        let secrets = launch.secrets();
        let opened = match launch {
            Launch::Stdio {
                command,
                args,
                env,
                cwd,
                vars,
                secrets,
            } => {
                // The last line: whatever built this entry, nothing runs that the rules
                // do not allow.
                self.rules
                    .launch
                    .check_launch(command, cwd.as_deref(), vars)
                    .map_err(|v| {
                        unavailable(
                            secrets
                                .redact(&format!(
                                    "server `{server_id}` is refused by the launch rules: {v}"
                                ))
                                .into_owned(),
                        )
                    })?;
                let limits = Limits::of(entry);
                match stdio::spawn(limits, command, args, env, cwd.as_ref(), secrets, permit) {
                    Ok((transport, process)) => {
                        let peer = Peer::Process(Box::new(process));
                        let direct = transport.direct_calls();
                        self.establish(entry, serial, peer, async { Ok(transport) })
                            .await
                            .map(|conn| conn.with_direct_calls(direct))
                    }
                    Err(error) => Err(error),
                }
            }
            Launch::Http { url, headers, .. } => {
                self.open_remote(entry, url, headers, serial, principal)
                    .await
            }
        };
        opened.map_err(|error| error.redacted(secrets))
    }

    /// What both transports share: opens the MCP session over the transport `transport`
    /// yields, within the connect timeout, and returns the pool's [`Connection`].
    ///
    /// `transport` runs inside the timeout and the connection's span, so a transport that
    /// has to talk before the handshake (legacy SSE waits for its endpoint) is bounded and
    /// logged like the handshake itself.
    async fn establish<T, E, A>(
        &self,
        entry: &ServerEntry,
        serial: u64,
        peer: Peer<'_>,
        transport: impl Future<Output = Result<T, ConnectError>>,
    ) -> Result<Connection, McpError>
    where
        T: IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let server_id = entry.server_id();
        let (process, url, left_out) = match peer {
            Peer::Process(process) => (Some(Arc::new(*process)), None, LeftOut::default()),
            Peer::Url(url, left_out) => (None, Some(url), left_out),
        };
        let shown = match url {
            Some(url) => format!("server `{server_id}` ({url})"),
            None => format!("server `{server_id}`"),
        };
        let tools_stale = Arc::new(AtomicBool::new(false));
        let lists = Arc::new(ListCaches::default());
        let in_flight = Arc::new(InFlight::default());
        let ended = Arc::new(Ended::default());
        let watched = ended.clone();
        let events = ClientEvents {
            server_id: server_id.into(),
            tools_stale: tools_stale.clone(),
            lists: lists.clone(),
            protocol_version: entry
                .record
                .protocol_version
                .clone()
                .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE),
            in_flight: in_flight.clone(),
            asking: Arc::new(tokio::sync::Semaphore::new(1)),
            sampling: entry.record.sampling.allow,
        };
        // A connection outlives the task that happened to open it: detach it from the
        // caller's span so its logs are not filed under that task.
        let connection_span = tracing::info_span!(parent: None, "mcp_server", server_id);
        let lifecycle = entry.record.lifecycle;
        // Streamable HTTP answers every POST; on a message stream `auto` also pings.
        let probe = match (lifecycle, entry.record.transport) {
            (Lifecycle::Auto, Wire::StreamableHttp) => Probing::Answer,
            (Lifecycle::Auto, _) => Probing::AnswerAndPing,
            _ => Probing::Off,
        };
        // A failed handshake drops `process`, which kills the server's group.
        let connecting = async move {
            let transport = Watched {
                inner: Probe::new(transport.await?.into_transport(), probe),
                ended: watched,
            };
            handshake(events, transport, lifecycle).await
        };
        let (timeout, setting) = match entry.record.budgets.connect_timeout {
            Some(timeout) => (timeout, "budgets.connect_timeout_ms"),
            None => (self.timeout, "the host's connect timeout"),
        };
        let service = tokio::time::timeout(timeout, connecting.instrument(connection_span))
            .await
            .map_err(|_| {
                unavailable(format!(
                    "{shown} did not finish the MCP handshake within {} ms ({setting})",
                    timeout.as_millis()
                ))
            })?
            .map_err(|e| unavailable(format!("{shown}: cannot connect: {}", error_chain(&e))))?;
        // The pool keeps the one cache (tools, by the server's hints and per principal):
        // rmcp's own would serve a private answer to every principal sharing this
        // connection, and a stale one when the server fails.
        service
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        if let Some(process) = &process {
            tokio::spawn(stop_when_ended(
                server_id.to_owned(),
                serial,
                Arc::downgrade(process),
                ended.clone(),
                service.cancellation_token(),
            ));
        }
        let pid = process.as_deref().map(ServerProcess::pid);
        let url = url.map(|url| entry.secrets().redact(url).into_owned());
        tracing::info!(server_id, pid, url, serial, "MCP server connected");
        Ok(Connection {
            service,
            serial,
            process,
            tools_stale,
            lists,
            streamable: entry.record.transport == Wire::StreamableHttp,
            left_out,
            ended,
            auth_refusal: AuthRefusal::default(),
            in_flight,
            common_stream: None,
            direct: None,
        })
    }
}

/// Stops a stdio server's whole group as soon as its session ends by itself: the leader
/// exits (a child may keep its stdout open, so no EOF comes) or the transport stops (EOF,
/// or the guard closed it). The group's permit goes back once it is gone, so a new server
/// can start at once. Holds the process weakly: a dropped connection kills the group.
async fn stop_when_ended(
    server_id: String,
    serial: u64,
    process: Weak<ServerProcess>,
    ended: Arc<Ended>,
    session: RunningServiceCancellationToken,
) {
    let exited = process.upgrade().and_then(|p| p.exit_watch());
    let why = match exited {
        Some(exited) => tokio::select! {
            () = exited => "its process exited",
            () = ended.wake.notified() => "its transport ended",
        },
        None => {
            ended.wake.notified().await;
            "its transport ended"
        }
    };
    ended.set();
    tracing::debug!(
        server_id,
        serial,
        "{why}; stopping the server's process group"
    );
    session.cancel();
    if let Some(process) = process.upgrade() {
        process.stop(&server_id, defaults::SHUTDOWN_GRACE).await;
    }
}

fn unavailable(message: impl Into<String>) -> McpError {
    McpError::new(McpErrorCode::Unavailable, message)
}

/// Why a transport did not come up or its MCP handshake failed; the pool reports it as
/// `mcp_unavailable`, after the server's name.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    #[error("legacy SSE: {0}")]
    LegacySse(#[source] SseConnectError),
    #[error("MCP handshake failed: {0}")]
    Handshake(#[source] Box<rmcp::service::ClientInitializeError>),
    /// `auto` fell back to `initialize`, which failed too: what the older server said to
    /// `initialize` is what the operator can act on (rmcp's error shows neither).
    #[error("MCP handshake failed: initialize (after server/discover found an older server): {}", error_chain(.0.as_ref()))]
    Fallback(Box<rmcp::service::ClientInitializeError>),
}

/// Opens the MCP session over `transport` the way the record asks. `initialize` (also as
/// `auto`'s fallback) asks for the version `events` names.
async fn handshake<T, E, A>(
    events: ClientEvents,
    transport: T,
    lifecycle: Lifecycle,
) -> Result<RunningService<RoleClient, ClientEvents>, ConnectError>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let failed = |e| ConnectError::Handshake(Box::new(e));
    let mode = match lifecycle {
        Lifecycle::Initialize => return events.serve(transport).await.map_err(failed),
        Lifecycle::Discover => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        Lifecycle::Auto => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(events.protocol_version.clone()),
        },
    };
    events
        .serve_with_lifecycle(transport, mode)
        .await
        .map_err(|error| match error {
            rmcp::service::ClientInitializeError::LegacyFallbackFailed { fallback, .. } => {
                ConnectError::Fallback(fallback)
            }
            other => failed(other),
        })
}
