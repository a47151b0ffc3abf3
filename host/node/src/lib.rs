//! `quiver serve`: a long-running node that keeps one [`Host`] and takes work over HTTP.
//!
//! Clients upload modules by hash (`PUT /v1/modules/{sha256}`), submit tasks that name one
//! (`POST /v1/tasks`), then read (`GET /v1/tasks/{id}?wait=SECONDS`) or cancel
//! (`DELETE /v1/tasks/{id}`) them; `/healthz` and `/readyz` serve orchestrators.
//! Operators watch it through `/metrics`, `/v1/mcp/servers` and `/v1/registry`, and decide
//! the tool calls waiting for approval at `/v1/approvals` (when the node was given the
//! host's [`ApprovalQueue`](quiver::ApprovalQueue), see
//! [`NodeConfig::with_approval_queue`]). The node is a thin layer: handlers ([`api`])
//! parse and check, the library runs. Everything a
//! client sends is bounded (body size and time, modules, tasks, kept output) and every
//! failure is one JSON error shape ([`error`]).
//!
//! Every request but the health checks and the page's static files is authorised by
//! [`Role`] in one place ([`auth`]): named clients (`[clients.NAME]`,
//! [`NodeConfig::with_client`]) each hold a token and one or more roles: `submit` (modules
//! and tasks), `registry` (the admin API, [`admin`]), `approve` (`/v1/approvals`) and
//! `observe` (metrics and status). No or an unknown token is `401`, a missing role `403`
//! naming it. `[serve] token_env` is the shorthand for a client `serve` with
//! [`SERVE_TOKEN_ROLES`] (never `approve`), `[admin] token_env` for a client `admin` with
//! [`ADMIN_TOKEN_ROLES`]. A task carries its submitter's name as its
//! [`principal`](quiver::TaskSpec::principal) into every audit line and approval request,
//! and an approval decision names the client that made it. A node where no client holds
//! `submit`, `approve` or `observe` only listens on loopback and gives those roles to
//! every request. The web admin page at `/admin/` ([`web`]) is a browser front end to the
//! admin API and the approvals, and offers what its token's roles allow.
//!
//! In front of everything, [`guard`] refuses what a web page could make a browser send: a
//! `Host` the node does not serve (DNS rebinding), a foreign `Origin`, a cross-site
//! request; bodies must say their JSON or wasm type ([`body`]). Without a token `/readyz`
//! says only whether the node is ready.
//!
//! Shutdown is a drain ([`NodeControl::drain`]): new work is refused and `/readyz` fails,
//! queued tasks are cancelled, running tasks get `drain_grace` to finish, the rest are
//! cancelled, then the HTTP server stops (no handler outlives it) and the MCP servers stop.
//!
//! ```no_run
//! # async fn demo(host: quiver::Host) -> Result<(), quiver_node::ServeError> {
//! use quiver_node::{Node, NodeConfig};
//!
//! let node = Node::bind(host, NodeConfig::new("127.0.0.1:0".parse().unwrap())).await?;
//! println!("listening on http://{}", node.local_addr());
//! let control = node.control();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     control.drain();
//! });
//! node.run().await;
//! # Ok(())
//! # }
//! ```

mod admin;
mod api;
mod auth;
mod authorize;
mod body;
mod config;
pub mod defaults;
mod error;
mod etcd;
mod etcd_access;
mod etcd_grants;
mod guard;
mod listen;
mod modules;
mod params;
mod source;
mod streams;
mod tasks;
pub mod telemetry;
mod web;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

pub use config::{
    ADMIN_TOKEN_ROLES, AdminConfig, ClientConfig, NodeConfig, NodeFileConfig, Role,
    SERVE_TOKEN_ROLES, ServeConfig,
};
pub use error::ServeError;
pub use etcd::{DocValidator, EtcdStore};
pub use etcd_access::{EtcdAccess, EtcdConfig};
pub use etcd_grants::{EtcdGrantStore, GrantSealKey};
pub use source::RegistrySource;

use modules::ModuleStore;
use quiver::Host;
use tasks::TaskTable;

/// Where the node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    /// Refusing new work, letting running tasks finish.
    Draining,
    /// Cancelling whatever still runs, now.
    Stopping,
}

pub(crate) struct NodeState {
    host: Host,
    config: NodeConfig,
    modules: ModuleStore,
    tasks: Arc<TaskTable>,
    uploads: modules::Uploads,
    phase: watch::Sender<Phase>,
    /// Where the admin API reads and writes records; `None` without an admin token.
    admin_store: Option<Arc<dyn quiver::registry::RegistryStore>>,
    /// User authorizations waiting for a person's browser.
    flows: Arc<authorize::Flows>,
}

impl NodeState {
    fn is_draining(&self) -> bool {
        *self.phase.borrow() != Phase::Serving
    }

    fn modules_status(&self) -> ModulesStatus {
        ModulesStatus {
            store: self.modules.status(),
            host_cached: self.host.cached_modules(),
        }
    }
}

/// The node's modules in `/readyz`: its store, and the host's own cache, which uploads
/// never enter (so it stays at what the host loaded itself).
#[derive(serde::Serialize)]
struct ModulesStatus {
    #[serde(flatten)]
    store: modules::StoreStatus,
    host_cached: usize,
}

/// A node bound to its address, not yet serving.
pub struct Node {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    state: Arc<NodeState>,
}

/// Starts the end of a running [`Node`]; cheap to clone.
#[derive(Clone)]
pub struct NodeControl {
    state: Arc<NodeState>,
}

impl NodeControl {
    /// Stops taking work, cancels the tasks still queued, and lets running tasks finish
    /// within the drain grace.
    pub fn drain(&self) {
        let began = self.state.phase.send_if_modified(|phase| {
            let serving = *phase == Phase::Serving;
            if serving {
                *phase = Phase::Draining;
            }
            serving
        });
        if began {
            let cancelled = self
                .state
                .tasks
                .close("the node is draining; queued tasks do not start");
            tracing::info!(cancelled, "draining: queued tasks cancelled");
        }
    }

    /// Cancels every task now (a second signal during a drain).
    pub fn stop_now(&self) {
        self.state.phase.send_replace(Phase::Stopping);
        self.state.tasks.cancel_all("the node is stopping now");
    }
}

impl Node {
    /// Binds `config.listen` for `host`. A non-loopback address needs a token.
    pub async fn bind(host: Host, config: NodeConfig) -> Result<Self, ServeError> {
        config.check_clients()?;
        let open = !auth::open_roles(&config).is_empty();
        if open && config.browsers.any_host() {
            return Err(ServeError::AnyHostWithoutToken);
        }
        if open && !config.listen.ip().is_loopback() {
            return Err(ServeError::NoToken {
                addr: config.listen,
            });
        }
        let redirect_uri = match &config.public_url {
            Some((url, origin)) => {
                let uri =
                    authorize::redirect_uri(url).map_err(|message| ServeError::PublicUrl {
                        origin: origin.clone(),
                        message,
                    })?;
                // The authorization server sends browsers there: the node must serve the name.
                let host = authorize::redirect_host(&uri).unwrap_or_default();
                if !config.browsers.serves(&host) {
                    return Err(ServeError::PublicUrl {
                        origin: origin.clone(),
                        message: format!(
                            "the node does not answer to `{host}`, so browsers sent back there would be refused; add it to `[serve] allowed_hosts`"
                        ),
                    });
                }
                Some(uri)
            }
            None => None,
        };
        let bind_error = |source| ServeError::Bind {
            addr: config.listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let state = Arc::new(NodeState {
            modules: ModuleStore::new(config.max_modules, config.max_module_store_bytes),
            tasks: Arc::new(TaskTable::new(
                config.max_tasks,
                config.max_output_bytes,
                config.finished_ttl,
            )),
            uploads: modules::Uploads::new(defaults::SERVE_CONCURRENT_UPLOADS),
            phase: watch::channel(Phase::Serving).0,
            flows: Arc::new(authorize::Flows::new(
                redirect_uri,
                config.authorization_timeout,
            )),
            admin_store: config
                .has_role(Role::Registry)
                .then(|| host.writable_store())
                .flatten(),
            host,
            config,
        });
        Ok(Self {
            listener,
            addr,
            state,
        })
    }

    /// The address the node listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The handle that drains or stops the node.
    pub fn control(&self) -> NodeControl {
        NodeControl {
            state: self.state.clone(),
        }
    }

    /// Serves until drained (see [`NodeControl`]), then stops the MCP servers.
    pub async fn run(self) {
        let Node {
            listener,
            addr,
            state,
        } = self;
        let clients: Vec<&str> = state.config.clients.iter().map(|c| &*c.name).collect();
        tracing::info!(%addr, ?clients, "node listening");
        let (stop_http, http_stopped) = tokio::sync::oneshot::channel();
        let limits = listen::Limits {
            max_connections: state.config.max_connections,
            max_per_ip: state.config.max_connections_per_ip,
            header_timeout: state.config.header_timeout,
        };
        let server = tokio::spawn(listen::serve(
            listener,
            api::router(state.clone()),
            limits,
            http_stopped,
        ));
        let mut phase = state.phase.subscribe();
        let _ = phase.wait_for(|p| *p != Phase::Serving).await;
        let grace = state.config.drain_grace;
        tracing::info!(
            active = state.tasks.active(),
            grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            "draining: taking no new tasks"
        );
        tokio::select! {
            () = state.tasks.all_ended() => {}
            () = tokio::time::sleep(grace) => {
                tracing::warn!("drain grace over; cancelling the tasks still running");
            }
            _ = phase.wait_for(|p| *p == Phase::Stopping) => {
                tracing::warn!("stopping now; cancelling the tasks still running");
            }
        }
        state.tasks.cancel_all("the node is shutting down");
        state.flows.cancel_all();
        let _ = stop_http.send(());
        let _ = server.await;
        state.host.shutdown().await;
        tracing::info!("node stopped");
    }
}
