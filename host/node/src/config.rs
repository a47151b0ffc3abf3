//! The node's settings: the `[serve]`, `[admin]` and `[clients.NAME]` tables of
//! `quiver.toml` as written ([`ServeConfig`], [`AdminConfig`], [`ClientConfig`]), and the
//! resolved [`NodeConfig`] a [`Node`](super::Node) starts with, which holds each client's
//! token itself (read from the variable its `token_env` names) and never prints it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use quiver::ApprovalQueue;
use quiver::HostConfig;
use quiver::Pattern;
use quiver::config::{ConfigError, read_section};

use super::ServeError;
use crate::{EtcdConfig, GrantSealKey};
use crate::{defaults, guard};

/// `[serve]` in `quiver.toml`: the node's API token and limits. Unset fields take their
/// `defaults::SERVE_*`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Name of the environment variable holding the API token (never the token itself).
    pub token_env: Option<String>,
    /// [`defaults::SERVE_DRAIN_GRACE`].
    pub drain_grace_ms: Option<u64>,
    /// [`defaults::SERVE_MAX_MODULE_BYTES`].
    pub max_module_bytes: Option<u64>,
    /// [`defaults::SERVE_MAX_MODULES`].
    pub max_modules: Option<u32>,
    /// [`defaults::SERVE_MAX_MODULE_STORE_BYTES`].
    pub max_module_store_bytes: Option<u64>,
    /// [`defaults::SERVE_MAX_REQUEST_BYTES`].
    pub max_request_bytes: Option<u64>,
    /// [`defaults::SERVE_MAX_TASKS`].
    pub max_tasks: Option<u32>,
    /// [`defaults::SERVE_MAX_OUTPUT_BYTES`].
    pub max_output_bytes: Option<u64>,
    /// [`defaults::SERVE_FINISHED_TTL`].
    pub finished_ttl_ms: Option<u64>,
    /// [`defaults::SERVE_MAX_WAIT`].
    pub max_wait_ms: Option<u64>,
    /// [`defaults::SERVE_BODY_TIMEOUT`].
    pub body_timeout_ms: Option<u64>,
    /// [`defaults::SERVE_HEADER_TIMEOUT`].
    pub header_timeout_ms: Option<u64>,
    /// [`defaults::SERVE_MAX_CONNECTIONS`].
    pub max_connections: Option<u32>,
    /// [`defaults::SERVE_MAX_CONNECTIONS_PER_IP`].
    pub max_connections_per_ip: Option<u32>,
    /// Host names the node answers to besides `localhost` and IP addresses (e.g.
    /// `["node.internal"]`), or `["*"]` for any (only with a token); see docs/security.md.
    pub allowed_hosts: Option<Vec<String>>,
    /// Origins a browser may send requests from besides the node's own, e.g. the
    /// `"https://quiver.example.com"` a proxy serves the node under.
    pub allowed_origins: Option<Vec<String>>,
    /// The URL browsers reach the node at (e.g. `"https://quiver.example.com"`): user
    /// authorization through the node sends people back to `{public_url}/oauth/callback`.
    /// `https`, or `http` on a loopback host only. Without it the node starts no flow.
    pub public_url: Option<String>,
    /// [`defaults::AUTHORIZATION_TIMEOUT`].
    pub authorization_timeout_ms: Option<u64>,
}

impl ServeConfig {
    /// The field at fault and the fix, for a value no node can use.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        let positive: [(&'static str, Option<u64>); 13] = [
            ("serve.header_timeout_ms", self.header_timeout_ms),
            ("serve.max_connections", self.max_connections.map(u64::from)),
            (
                "serve.max_connections_per_ip",
                self.max_connections_per_ip.map(u64::from),
            ),
            ("serve.max_module_bytes", self.max_module_bytes),
            ("serve.max_modules", self.max_modules.map(u64::from)),
            ("serve.max_module_store_bytes", self.max_module_store_bytes),
            ("serve.max_request_bytes", self.max_request_bytes),
            ("serve.max_tasks", self.max_tasks.map(u64::from)),
            ("serve.finished_ttl_ms", self.finished_ttl_ms),
            ("serve.max_wait_ms", self.max_wait_ms),
            ("serve.body_timeout_ms", self.body_timeout_ms),
            ("serve.max_output_bytes", self.max_output_bytes),
            (
                "serve.authorization_timeout_ms",
                self.authorization_timeout_ms,
            ),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| *v == Some(0)) {
            return Err((field, "must be greater than 0; omit it for the default"));
        }
        if self
            .token_env
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err((
                "serve.token_env",
                "must name an environment variable, e.g. \"QUIVER_TOKEN\"; omit it for no token (loopback only)",
            ));
        }
        self.browsers().map(drop)
    }

    /// What browsers may send, from `allowed_hosts` and `allowed_origins`.
    fn browsers(&self) -> Result<guard::Rules, (&'static str, &'static str)> {
        guard::Rules::new(
            self.allowed_hosts.as_deref(),
            self.allowed_origins.as_deref(),
        )
    }
}

/// `[admin]` in `quiver.toml`: the token of the admin API (`/admin/api/...`), separate
/// from the task API token so a client that may run tasks cannot change the registry.
/// Without it the admin routes answer `404 admin_disabled`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Name of the environment variable holding the admin token (never the token itself).
    pub token_env: Option<String>,
}

impl AdminConfig {
    /// The field at fault and the fix, for a value no node can use.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self
            .token_env
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err((
                "admin.token_env",
                "must name an environment variable, e.g. \"QUIVER_ADMIN_TOKEN\"; omit it to turn the admin API off",
            ));
        }
        Ok(())
    }
}

/// What a client may do on a node; a client holds one or more.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Upload modules; submit, read and cancel tasks (`/v1/modules`, `/v1/tasks`).
    Submit,
    /// The admin API and page: server records, profiles, tests, previews (`/admin/api`).
    Registry,
    /// List and decide the tool calls waiting for approval (`/v1/approvals`).
    Approve,
    /// Read status: `/metrics`, `/v1/mcp/servers`, `/v1/registry`.
    Observe,
    /// Start, read and revoke user authorizations of MCP servers for the principals the
    /// client may act for (`/v1/authorizations`).
    Authorize,
}

impl Role {
    /// The name `quiver.toml` and the API use.
    pub fn name(self) -> &'static str {
        match self {
            Role::Submit => "submit",
            Role::Registry => "registry",
            Role::Approve => "approve",
            Role::Observe => "observe",
            Role::Authorize => "authorize",
        }
    }
}

/// The roles `[serve] token_env` (and [`NodeConfig::with_token`]) gives its client,
/// named `serve`: tasks and status, never approvals.
pub const SERVE_TOKEN_ROLES: [Role; 2] = [Role::Submit, Role::Observe];

/// The roles `[admin] token_env` (and [`NodeConfig::with_admin_token`]) gives its client,
/// named `admin`.
pub const ADMIN_TOKEN_ROLES: [Role; 1] = [Role::Registry];

/// `[clients.NAME]` in `quiver.toml`: a named client, its token and its roles. The name
/// goes into audit lines (as a task's `client`, its `principal` unless the client names an
/// end user, or who decided an approval).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// Name of the environment variable holding the client's token (never the token).
    pub token_env: String,
    /// One or more of `submit`, `registry`, `approve`, `observe`, `authorize`.
    pub roles: Vec<Role>,
    /// Patterns (`*`, `?`) of the end users the client may submit tasks for (the
    /// submission's `principal`); empty: its tasks act for the client itself.
    #[serde(default)]
    pub act_for: Vec<String>,
}

/// Why `patterns` cannot be a client's `act_for`: each 1 to `MAX_PATTERN_BYTES` bytes,
/// printable, at most `MAX_TASK_PATTERNS` of them.
fn check_act_for(patterns: &[String]) -> Result<(), String> {
    use quiver::defaults::{MAX_PATTERN_BYTES, MAX_TASK_PATTERNS};
    if patterns.len() > MAX_TASK_PATTERNS {
        return Err(format!(
            "{} patterns; at most {MAX_TASK_PATTERNS} are allowed (use `*` to cover many)",
            patterns.len()
        ));
    }
    for pattern in patterns {
        if pattern.is_empty()
            || pattern.len() > MAX_PATTERN_BYTES
            || quiver::text::printable(pattern) != *pattern
        {
            return Err(format!(
                "each pattern is 1 to {MAX_PATTERN_BYTES} printable bytes naming users, e.g. \"*@example.com\""
            ));
        }
    }
    Ok(())
}

/// Whether `name` may name a client: 1 to 64 letters, digits, `_`, `-` and `.`, so it is
/// safe in every log, audit line and page it appears in.
pub(crate) fn is_client_name(name: &str) -> bool {
    (1..=defaults::MAX_CLIENT_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The field at fault and the fix, for a `[clients]` table no node can use.
fn check_clients(clients: &BTreeMap<String, ClientConfig>) -> Result<(), (String, String)> {
    for (name, client) in clients {
        if !is_client_name(name) {
            return Err((
                format!(
                    "clients.{}",
                    quiver::text::printable(quiver::text::cut(name, 64))
                ),
                "a client's name is 1 to 64 letters, digits, `_`, `-` and `.`".to_owned(),
            ));
        }
        if client.token_env.trim().is_empty() {
            return Err((
                format!("clients.{name}.token_env"),
                "must name an environment variable holding the client's token, e.g. \"CI_TOKEN\""
                    .to_owned(),
            ));
        }
        if client.roles.is_empty() {
            return Err((
                format!("clients.{name}.roles"),
                "give the client one or more of \"submit\", \"registry\", \"approve\", \"observe\", \"authorize\""
                    .to_owned(),
            ));
        }
        check_act_for(&client.act_for)
            .map_err(|message| (format!("clients.{name}.act_for"), message))?;
    }
    Ok(())
}

/// `quiver.toml` as a node reads it: the host's sections ([`HostConfig`]) and the node's
/// own `[serve]`, `[admin]`, `[clients]`, `[etcd]` and `[telemetry]`, each checked, every error naming the file and
/// the field.
#[derive(Clone, Debug, Default)]
pub struct NodeFileConfig {
    pub host: HostConfig,
    pub serve: ServeConfig,
    pub admin: AdminConfig,
    /// How to reach an `etcd://` registry; resolve it with [`EtcdConfig::resolve`].
    pub etcd: EtcdConfig,
    /// `[clients.NAME]`, by name.
    pub clients: BTreeMap<String, ClientConfig>,
    /// `[telemetry]`: where traces go ([`crate::telemetry`]).
    pub telemetry: crate::telemetry::TelemetryConfig,
}

impl NodeFileConfig {
    /// The top-level tables of `quiver.toml` that belong to the node, not the host.
    pub const SECTIONS: [&'static str; 5] = ["serve", "admin", "clients", "etcd", "telemetry"];

    /// Reads `quiver.toml`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (host, mut sections) = HostConfig::load_with_sections(path, &Self::SECTIONS)?;
        let mut section = |name: &str| {
            sections
                .remove(name)
                .unwrap_or_else(|| toml::Value::Table(toml::Table::new()))
        };
        let serve: ServeConfig = read_section(path, "serve", section("serve"))?;
        let admin: AdminConfig = read_section(path, "admin", section("admin"))?;
        let etcd: EtcdConfig = read_section(path, "etcd", section("etcd"))?;
        let clients: BTreeMap<String, ClientConfig> =
            read_section(path, "clients", section("clients"))?;
        let telemetry: crate::telemetry::TelemetryConfig =
            read_section(path, "telemetry", section("telemetry"))?;
        let checked = serve.check().and_then(|()| admin.check());
        checked.map_err(|(field, message)| ConfigError::new(path, field, message))?;
        check_clients(&clients)
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        Ok(Self {
            host,
            serve,
            admin,
            etcd,
            clients,
            telemetry,
        })
    }
}

impl NodeFileConfig {
    /// The key grants are sealed with in etcd, read from the variable
    /// `[etcd] grant_key_env` names, for a node whose registry is in etcd. `None` when
    /// none is configured and no `[auth.NAME]` is user authorization (no grants to keep);
    /// a user authorization without one is refused, as is a variable unset or not a key.
    pub fn etcd_grant_key(&self, file: &Path) -> Result<Option<GrantSealKey>, ConfigError> {
        let field = "etcd.grant_key_env";
        let Some(var) = &self.etcd.grant_key_env else {
            let user_auth =
                self.host.auth.iter().find(|(_, auth)| {
                    matches!(auth, quiver::AuthConfig::OauthAuthorizationCode(_))
                });
            return match user_auth {
                Some((name, _)) => Err(ConfigError::new(
                    file,
                    field,
                    format!(
                        "[auth.{name}] is user authorization and the registry is in etcd, where grants are kept sealed with a key every node shares; set `grant_key_env` to the name of a variable holding 32 random bytes as 64 hex digits (`openssl rand -hex 32`)"
                    ),
                )),
                None => Ok(None),
            };
        };
        // Launched servers get only the variables `[mcp.launch]` lets records read: none of
        // those may be the key every grant of the fleet is sealed with.
        if let Some(launch) = &self.host.mcp.launch {
            let rule = if launch.unrestricted {
                Some((
                    "mcp.launch.unrestricted",
                    "`unrestricted = true`".to_owned(),
                ))
            } else {
                let matching = launch
                    .env
                    .iter()
                    .find(|p| Pattern::new(p.as_str()).matches(var));
                matching.map(|p| ("mcp.launch.env", format!("the pattern {p:?}")))
            };
            if let Some((field, rule)) = rule {
                return Err(ConfigError::new(
                    file,
                    field,
                    format!(
                        "{rule} lets a record pass `{var}`, the grant key of `[etcd] grant_key_env`, to a server it launches; list only the variables servers need in `[mcp.launch] env`, none matching `{var}`"
                    ),
                ));
            }
        }
        let text = std::env::var(var).map_err(|_| {
            ConfigError::new(
                file,
                field,
                format!("the variable `{var}` is not set; export the grant key in it"),
            )
        })?;
        GrantSealKey::from_hex(&text)
            .map(Some)
            .map_err(|rule| ConfigError::new(file, field, format!("the variable `{var}`: {rule}")))
    }
}

/// The API token, kept out of `Debug` output and logs.
#[derive(Clone)]
pub(crate) struct Token(pub(crate) String);

impl Token {
    /// `token` without surrounding whitespace, which no client can send (a header value
    /// is trimmed), so a token read from a file keeps working with its newline; `None`
    /// when nothing is left.
    fn trimmed(token: &str) -> Option<Self> {
        let token = token.trim();
        (!token.is_empty()).then(|| Self(token.to_owned()))
    }

    /// The token in the variable `var`; `None` when it is unset, not UTF-8 or blank.
    fn from_env(var: &str) -> Option<Self> {
        Self::trimmed(&std::env::var(var).ok()?)
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// One client of the node: its name, token and roles, and where it was configured (for
/// errors about it).
#[derive(Clone, Debug)]
pub(crate) struct Client {
    pub(crate) name: Arc<str>,
    pub(crate) token: Token,
    pub(crate) roles: Vec<Role>,
    /// The end users it may submit tasks for (`[clients.NAME] act_for`).
    pub(crate) act_for: Arc<[Pattern]>,
    /// The config field or builder that made it, e.g. `clients.ci.token_env`.
    pub(crate) source: String,
}
impl Client {
    fn shorthand(name: &str, token: Token, roles: &[Role], source: &str) -> Self {
        Self {
            name: name.into(),
            token,
            roles: roles.to_vec(),
            act_for: Arc::new([]),
            source: source.to_owned(),
        }
    }
}

/// Everything a [`Node`](super::Node) starts with.
#[derive(Clone, Debug)]
#[must_use]
pub struct NodeConfig {
    pub(crate) listen: SocketAddr,
    /// Who may call the node, each with its roles; checked (names and tokens unique, none
    /// blank) by [`Node::bind`](super::Node::bind).
    pub(crate) clients: Vec<Client>,
    pub(crate) drain_grace: Duration,
    pub(crate) max_module_bytes: u64,
    pub(crate) max_modules: u32,
    pub(crate) max_module_store_bytes: u64,
    pub(crate) max_request_bytes: u64,
    pub(crate) max_tasks: u32,
    pub(crate) max_output_bytes: u64,
    pub(crate) finished_ttl: Duration,
    pub(crate) max_wait: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) header_timeout: Duration,
    pub(crate) max_connections: usize,
    /// Listed at `GET /v1/approvals` and decided by `POST /v1/approvals/{id}`.
    pub(crate) approvals: Option<Arc<ApprovalQueue>>,
    pub(crate) max_connections_per_ip: usize,
    /// The `Host`, `Origin` and `Sec-Fetch-Site` a request may carry.
    pub(crate) browsers: guard::Rules,
    /// `[serve] public_url` as written, and where it was set (checked by `bind`).
    pub(crate) public_url: Option<(String, String)>,
    /// How long a user authorization waits for the person's browser to come back.
    pub(crate) authorization_timeout: Duration,
}

impl NodeConfig {
    /// A node on `listen` with no token and every default limit. Use port 0 for an
    /// ephemeral port ([`Node::local_addr`](super::Node::local_addr) tells which).
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            clients: Vec::new(),
            drain_grace: defaults::SERVE_DRAIN_GRACE,
            max_module_bytes: defaults::SERVE_MAX_MODULE_BYTES,
            max_modules: defaults::SERVE_MAX_MODULES,
            max_module_store_bytes: defaults::SERVE_MAX_MODULE_STORE_BYTES,
            max_request_bytes: defaults::SERVE_MAX_REQUEST_BYTES,
            max_tasks: defaults::SERVE_MAX_TASKS,
            max_output_bytes: defaults::SERVE_MAX_OUTPUT_BYTES,
            finished_ttl: defaults::SERVE_FINISHED_TTL,
            max_wait: defaults::SERVE_MAX_WAIT,
            body_timeout: defaults::SERVE_BODY_TIMEOUT,
            header_timeout: defaults::SERVE_HEADER_TIMEOUT,
            max_connections: defaults::SERVE_MAX_CONNECTIONS,
            approvals: None,
            max_connections_per_ip: defaults::SERVE_MAX_CONNECTIONS_PER_IP,
            browsers: guard::Rules::default(),
            public_url: None,
            authorization_timeout: defaults::AUTHORIZATION_TIMEOUT,
        }
    }

    /// A node on `listen` configured by `[serve]` of the host config at `file`; the token
    /// is read now from the variable `token_env` names.
    pub fn from_serve_config(
        listen: SocketAddr,
        config: &ServeConfig,
        file: &Path,
    ) -> Result<Self, ServeError> {
        let ms = Duration::from_millis;
        let mut node = Self::new(listen);
        if let Some(var) = &config.token_env {
            let token = Token::from_env(var).ok_or_else(|| ServeError::TokenEnv {
                file: file.to_owned(),
                field: "serve.token_env".into(),
                var: var.clone(),
            })?;
            node.clients.push(Client::shorthand(
                "serve",
                token,
                &SERVE_TOKEN_ROLES,
                "serve.token_env",
            ));
        }
        node.drain_grace = config.drain_grace_ms.map_or(node.drain_grace, ms);
        node.max_module_bytes = config.max_module_bytes.unwrap_or(node.max_module_bytes);
        node.max_modules = config.max_modules.unwrap_or(node.max_modules);
        node.max_module_store_bytes = config
            .max_module_store_bytes
            .unwrap_or(node.max_module_store_bytes);
        node.max_request_bytes = config.max_request_bytes.unwrap_or(node.max_request_bytes);
        node.max_tasks = config.max_tasks.unwrap_or(node.max_tasks);
        node.max_output_bytes = config.max_output_bytes.unwrap_or(node.max_output_bytes);
        node.finished_ttl = config.finished_ttl_ms.map_or(node.finished_ttl, ms);
        node.max_wait = config.max_wait_ms.map_or(node.max_wait, ms);
        node.body_timeout = config.body_timeout_ms.map_or(node.body_timeout, ms);
        node.header_timeout = config.header_timeout_ms.map_or(node.header_timeout, ms);
        if let Some(max) = config.max_connections {
            node.max_connections = usize::try_from(max).unwrap_or(usize::MAX);
        }
        if let Some(max) = config.max_connections_per_ip {
            node.max_connections_per_ip = usize::try_from(max).unwrap_or(usize::MAX);
        }
        node.public_url = config
            .public_url
            .clone()
            .map(|url| (url, format!("{}: serve.public_url", file.display())));
        node.authorization_timeout = config
            .authorization_timeout_ms
            .map_or(node.authorization_timeout, ms);
        node.browsers = config
            .browsers()
            .map_err(|(field, message)| ServeError::Field {
                file: file.to_owned(),
                field,
                message,
            })?;
        Ok(node)
    }

    /// The client `serve` with `token` and [`SERVE_TOKEN_ROLES`] (submit, observe), as
    /// `[serve] token_env` makes. Surrounding whitespace is dropped, as clients cannot
    /// send it; a blank token makes [`Node::bind`](super::Node::bind) fail.
    pub fn with_token(self, token: impl Into<String>) -> Self {
        self.with_shorthand(
            "serve",
            token.into(),
            &SERVE_TOKEN_ROLES,
            "NodeConfig::with_token",
        )
    }

    /// Turns the admin API on, guarded by the token read now from the variable
    /// `[admin] token_env` of the host config at `file` names (the client `admin`, with
    /// [`ADMIN_TOKEN_ROLES`]).
    pub fn with_admin_config(
        mut self,
        config: &AdminConfig,
        file: &Path,
    ) -> Result<Self, ServeError> {
        if let Some(var) = &config.token_env {
            let token = Token::from_env(var).ok_or_else(|| ServeError::AdminTokenEnv {
                file: file.to_owned(),
                var: var.clone(),
            })?;
            self.clients.push(Client::shorthand(
                "admin",
                token,
                &ADMIN_TOKEN_ROLES,
                "admin.token_env",
            ));
        }
        Ok(self)
    }

    /// The client `admin` with `token` and [`ADMIN_TOKEN_ROLES`] (registry), as
    /// `[admin] token_env` makes (surrounding whitespace dropped); a blank token makes
    /// [`Node::bind`](super::Node::bind) fail.
    pub fn with_admin_token(self, token: impl Into<String>) -> Self {
        self.with_shorthand(
            "admin",
            token.into(),
            &ADMIN_TOKEN_ROLES,
            "NodeConfig::with_admin_token",
        )
    }

    /// A client `name` holding `token` (surrounding whitespace dropped) with `roles`. A
    /// blank token, a name used twice, a token shared with another client or a name that
    /// is not 1 to 64 letters, digits, `_`, `-`, `.` makes [`Node::bind`](super::Node::bind)
    /// fail.
    pub fn with_client(mut self, name: &str, token: impl Into<String>, roles: &[Role]) -> Self {
        let token = Token::trimmed(&token.into()).unwrap_or(Token(String::new()));
        self.clients.push(Client {
            name: name.into(),
            token,
            roles: roles.to_vec(),
            act_for: Arc::new([]),
            source: format!("NodeConfig::with_client({name:?})"),
        });
        self
    }

    /// Lets the client `name` (added before) submit tasks for the end users `patterns`
    /// match, as `[clients.NAME] act_for` does. Naming no such client, or a pattern
    /// [`Node::bind`](super::Node::bind) would not take (empty, longer than
    /// `MAX_PATTERN_BYTES`, not printable), makes `bind` fail.
    pub fn with_act_for(mut self, name: &str, patterns: &[&str]) -> Self {
        let patterns: Arc<[Pattern]> = patterns.iter().map(|p| Pattern::new(*p)).collect();
        match self.clients.iter_mut().find(|c| &*c.name == name) {
            Some(client) => client.act_for = patterns,
            // A client without a token, so `bind` fails naming this call.
            None => self.clients.push(Client {
                name: name.into(),
                token: Token(String::new()),
                roles: Vec::new(),
                act_for: patterns,
                source: format!("NodeConfig::with_act_for({name:?}) without a client {name:?}"),
            }),
        }
        self
    }

    /// The clients of `[clients.NAME]`, their tokens read now from the variables their
    /// `token_env` name.
    pub fn with_clients_config(
        mut self,
        clients: &BTreeMap<String, ClientConfig>,
        file: &Path,
    ) -> Result<Self, ServeError> {
        for (name, client) in clients {
            let field = format!("clients.{name}.token_env");
            let token = Token::from_env(&client.token_env).ok_or_else(|| ServeError::TokenEnv {
                file: file.to_owned(),
                field: field.clone(),
                var: client.token_env.clone(),
            })?;
            self.clients.push(Client {
                name: name.as_str().into(),
                token,
                roles: client.roles.clone(),
                act_for: client
                    .act_for
                    .iter()
                    .map(|p| Pattern::new(p.as_str()))
                    .collect(),
                source: field,
            });
        }
        Ok(self)
    }

    fn with_shorthand(mut self, name: &str, token: String, roles: &[Role], source: &str) -> Self {
        let token = Token::trimmed(&token).unwrap_or(Token(String::new()));
        self.clients.retain(|c| &*c.name != name);
        self.clients
            .push(Client::shorthand(name, token, roles, source));
        self
    }

    /// Whether some client holds `role`.
    pub(crate) fn has_role(&self, role: Role) -> bool {
        self.clients.iter().any(|c| c.roles.contains(&role))
    }

    /// Why these clients cannot serve: a blank token or a bad name, a name or a token
    /// used twice (naming both clients).
    pub(crate) fn check_clients(&self) -> Result<(), ServeError> {
        for (i, client) in self.clients.iter().enumerate() {
            if client.token.0.is_empty() {
                return Err(ServeError::BlankToken {
                    origin: client.source.clone(),
                });
            }
            let act_for: Vec<String> = client
                .act_for
                .iter()
                .map(|p| p.as_str().to_owned())
                .collect();
            if !is_client_name(&client.name)
                || client.roles.is_empty()
                || check_act_for(&act_for).is_err()
            {
                return Err(ServeError::BadClient {
                    origin: client.source.clone(),
                });
            }
            for earlier in &self.clients[..i] {
                if earlier.name == client.name {
                    return Err(ServeError::DuplicateClient {
                        name: client.name.to_string(),
                        first: earlier.source.clone(),
                        second: client.source.clone(),
                    });
                }
                if earlier.token.0 == client.token.0 {
                    return Err(ServeError::SharedToken {
                        first: earlier.source.clone(),
                        second: client.source.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Time running tasks get to finish once the node drains.
    pub fn with_drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
        self
    }

    /// Tasks held at once, queued, running and finished together (at least 1).
    pub fn with_max_tasks(mut self, tasks: u32) -> Self {
        self.max_tasks = tasks.max(1);
        self
    }

    /// Serves `queue`'s pending approvals at `/v1/approvals`; give the same queue to
    /// [`HostBuilder::with_approver`](quiver::HostBuilder::with_approver). Without one those
    /// endpoints answer `404 approvals_disabled`.
    pub fn with_approval_queue(mut self, queue: Arc<ApprovalQueue>) -> Self {
        self.approvals = Some(queue);
        self
    }

    /// Lets the node run user authorizations, sending browsers back to
    /// `{url}/oauth/callback`, as `[serve] public_url` does. A URL that is not `https` (or
    /// `http` on a loopback host) makes [`Node::bind`](super::Node::bind) fail.
    pub fn with_public_url(mut self, url: &str) -> Self {
        self.public_url = Some((url.to_owned(), "NodeConfig::with_public_url".to_owned()));
        self
    }

    /// How long a user authorization started through the node waits for the browser
    /// (default [`defaults::AUTHORIZATION_TIMEOUT`]); its `state` expires with it.
    pub fn with_authorization_timeout(mut self, timeout: Duration) -> Self {
        self.authorization_timeout = timeout;
        self
    }

    /// Bytes of each of a task's stdout and stderr kept.
    pub fn with_max_output_bytes(mut self, bytes: u64) -> Self {
        self.max_output_bytes = bytes;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_table_names_its_field_and_refuses_unknown_ones() {
        let blank = AdminConfig {
            token_env: Some(" ".into()),
        };
        assert_eq!(blank.check().map_err(|e| e.0), Err("admin.token_env"));
        let typo = toml::from_str::<AdminConfig>("token = \"X\"").unwrap_err();
        assert!(typo.to_string().contains("unknown field `token`"), "{typo}");
        let unset = NodeConfig::new("127.0.0.1:0".parse().expect("addr")).with_admin_config(
            &AdminConfig {
                token_env: Some("QUIVER_TEST_SURELY_UNSET_ADMIN".into()),
            },
            Path::new("quiver.toml"),
        );
        let err = unset.expect_err("an unset variable is refused").to_string();
        assert!(
            err.contains("admin.token_env") && err.contains("quiver.toml"),
            "{err}"
        );
    }

    #[test]
    fn zero_limits_and_a_blank_token_variable_are_refused_by_name() {
        let zero = ServeConfig {
            max_tasks: Some(0),
            ..ServeConfig::default()
        };
        assert_eq!(zero.check().map_err(|e| e.0), Err("serve.max_tasks"));
        let blank = ServeConfig {
            token_env: Some(" ".into()),
            ..ServeConfig::default()
        };
        assert_eq!(blank.check().map_err(|e| e.0), Err("serve.token_env"));
        assert!(ServeConfig::default().check().is_ok());
    }

    #[test]
    fn a_token_from_a_file_loses_its_newline_and_a_blank_one_is_none() {
        assert_eq!(
            Token::trimmed("s3cret\n").map(|t| t.0).as_deref(),
            Some("s3cret")
        );
        assert!(Token::trimmed(" \r\n").is_none());
    }

    fn clients(toml: &str) -> Result<BTreeMap<String, ClientConfig>, String> {
        let file = format!(
            "{}/quiver-clients-{}.toml",
            std::env::temp_dir().display(),
            std::process::id()
        );
        std::fs::write(&file, toml).expect("write");
        let read = NodeFileConfig::load(Path::new(&file));
        let _ = std::fs::remove_file(&file);
        read.map(|c| c.clients).map_err(|e| e.to_string())
    }

    #[test]
    fn a_clients_table_names_the_field_at_fault() {
        let read = clients("[clients.ci]\ntoken_env = \"CI\"\nroles = [\"submit\", \"approve\"]\n")
            .expect("a good table");
        assert_eq!(read["ci"].roles, [Role::Submit, Role::Approve]);
        for (toml, field) in [
            (
                "[clients.ci]\ntoken_env = \"CI\"\nroles = [\"admin\"]\n",
                "clients.ci.roles",
            ),
            (
                "[clients.ci]\ntoken_env = \"CI\"\nroles = []\n",
                "clients.ci.roles",
            ),
            (
                "[clients.ci]\ntoken_env = \" \"\nroles = [\"submit\"]\n",
                "clients.ci.token_env",
            ),
            (
                "[clients.ci]\ntoken = \"x\"\nroles = [\"submit\"]\n",
                "clients.ci",
            ),
            (
                "[clients.\"a b\"]\ntoken_env = \"X\"\nroles = [\"submit\"]\n",
                "clients.a b",
            ),
            (
                "[clients.ci]\ntoken_env = \"CI\"\nroles = [\"submit\"]\nact_for = [\"\"]\n",
                "clients.ci.act_for",
            ),
            (
                "[clients.ci]\ntoken_env = \"CI\"\nroles = [\"submit\"]\nact_for = [\"a\\u0007\"]\n",
                "clients.ci.act_for",
            ),
            ("[principals.ci]\nserver = []\n", "principals.ci.server"),
            ("[principals.\" ci\"]\nservers = []\n", "principals. ci"),
            (
                "[principals.ci]\nservers = [\"\"]\n",
                "principals.ci.servers",
            ),
        ] {
            let err = clients(toml).expect_err(toml);
            assert!(err.contains(field), "{toml}: {err}");
        }
    }

    #[test]
    fn two_clients_with_one_token_or_one_name_are_refused_naming_both() {
        let shared = NodeConfig::new("127.0.0.1:0".parse().expect("addr"))
            .with_token("tok-8c1f")
            .with_client("ops", "tok-8c1f", &[Role::Approve]);
        let err = shared.check_clients().expect_err("shared").to_string();
        assert!(
            err.contains("NodeConfig::with_token") && err.contains("\"ops\""),
            "{err}"
        );
        assert!(!err.contains("tok-8c1f"), "never shows the token: {err}");
        let twice = NodeConfig::new("127.0.0.1:0".parse().expect("addr"))
            .with_client("ops", "a", &[Role::Approve])
            .with_client("ops", "b", &[Role::Observe]);
        let err = twice.check_clients().expect_err("twice").to_string();
        assert!(err.contains("`ops`"), "{err}");
        let blank = NodeConfig::new("127.0.0.1:0".parse().expect("addr")).with_client(
            "ops",
            " ",
            &[Role::Approve],
        );
        assert!(matches!(
            blank.check_clients(),
            Err(ServeError::BlankToken { .. })
        ));
    }

    fn grant_key(toml: &str) -> Result<bool, String> {
        let file = format!(
            "{}/quiver-grant-key-{}-{}.toml",
            std::env::temp_dir().display(),
            std::process::id(),
            toml.len()
        );
        std::fs::write(&file, toml).expect("write");
        let read = NodeFileConfig::load(Path::new(&file)).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&file);
        read?
            .etcd_grant_key(Path::new(&file))
            .map(|key| key.is_some())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn user_authorization_on_etcd_needs_a_grant_key_named_with_its_fix() {
        let user = "[auth.gh]\nkind = \"oauth_authorization_code\"\nservers = [\"gh\"]\n";
        let none = grant_key(user).expect_err("no key");
        assert!(
            none.contains("etcd.grant_key_env") && none.contains("openssl rand -hex 32"),
            "{none}"
        );
        let unset = grant_key(&format!(
            "{user}[etcd]\ngrant_key_env = \"QUIVER_TEST_SURELY_UNSET_GRANT_KEY\"\n"
        ))
        .expect_err("unset");
        assert!(unset.contains("is not set"), "{unset}");
        // A launch rule that lets records read the key variable.
        let key_env = format!("{user}[etcd]\ngrant_key_env = \"QUIVER_GRANT_KEY\"\n");
        for (launch, field) in [
            ("env = [\"GITHUB_TOKEN\", \"QUIVER_*\"]", "mcp.launch.env"),
            ("unrestricted = true", "mcp.launch.unrestricted"),
        ] {
            let passed = grant_key(&format!("{key_env}[mcp.launch]\n{launch}\n"))
                .expect_err("passes the key");
            assert!(
                passed.contains(field) && passed.contains("QUIVER_GRANT_KEY"),
                "{passed}"
            );
        }
        let narrow = grant_key(&format!("{key_env}[mcp.launch]\nenv = [\"GITHUB_*\"]\n"));
        assert!(narrow.expect_err("unset").contains("is not set"));
        // Nothing to seal without user authorization.
        assert_eq!(grant_key(""), Ok(false));
    }

    #[test]
    fn the_token_never_prints() {
        let config = NodeConfig::new("127.0.0.1:0".parse().expect("addr")).with_token("hunter2");
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
