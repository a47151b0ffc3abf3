//! The `quiver` commands, each a thin call into the library.
//!
//! Exit statuses: `serve` returns 0 after a drain; `run` returns the guest's own status (124 after a deadline, 134 after a
//! trap, 130 on Ctrl-C, 143 on SIGTERM); 2 means the command itself could not start (bad flags, an
//! unreadable task or module); other commands return 1 when they find a problem.

mod defaults;
mod login;
mod pin;
mod principal;
mod registry;
mod status;
mod table;
mod user_stream_stdio;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use std::sync::Arc;
use tracing::Instrument;

use quiver::config::{ConfigError, ConfigOrigin};
use quiver::registry::{Registry, RegistryStore, ServerEntry};
use quiver::telemetry::{self, LogFormat};
use quiver::{AcceptDefaults, AllowAll, ApprovalQueue, Approver, DirGrantStore, TerminalApprover};
use quiver::{Host, HostBuilder, StoreFollower, TaskSpec, ToolCallRequest};
use quiver_node::telemetry::{Telemetry, TelemetrySettings};
use quiver_node::{
    EtcdAccess, EtcdGrantStore, EtcdStore, Node, NodeConfig, NodeFileConfig, RegistrySource,
};

#[derive(Parser)]
#[command(
    name = "quiver",
    version,
    about = "Run sandboxed WebAssembly workloads with MCP tools"
)]
struct Cli {
    /// Host log filter: a level (error, warn, info, debug, trace) or a tracing filter.
    /// Default: `info` for `serve`, `warn` otherwise. A guest's `log` lines are its own
    /// output, shown on stderr whatever this says.
    #[arg(long, global = true, env = "QUIVER_LOG")]
    log_level: Option<String>,
    /// Log line format on stderr.
    #[arg(long, global = true, default_value = "text", value_parser = log_format())]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a wasm32-wasip1 module as one task.
    Run(RunArgs),
    /// Work with MCP servers of a registry.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Check a registry directory; list, read, write, delete and diff the records of a
    /// node (its admin API) or a store.
    #[command(subcommand)]
    Registry(registry::RegistryCommand),
    /// Run a node that takes modules and tasks over HTTP until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0 picks a free one). Anything but
    /// loopback needs `[serve] token_env` in the host config.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// MCP registry: a directory (one file per server), or a store shared by a fleet,
    /// `etcd://HOST:PORT/PREFIX`.
    #[arg(long, env = "QUIVER_REGISTRY", value_parser = RegistrySource::parse)]
    registry: RegistrySource,
    /// Host config (quiver.toml): backends, credentials, limits and `[serve]`.
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
    /// Directory for precompiled modules (default ~/.cache/quiver/modules).
    #[arg(long, env = "QUIVER_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Append one JSON line per tool call and policy denial to this file (created 0600).
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Do not reload a registry directory when its files change; SIGHUP still reloads it.
    /// (A store is always followed.)
    #[arg(long)]
    no_watch: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The guest module (.wasm, or .wat text).
    module: PathBuf,
    /// The task file (task.json). Without it the guest gets nothing but its args.
    #[arg(long)]
    task: Option<PathBuf>,
    /// MCP registry directory (one file per server).
    #[arg(long, env = "QUIVER_REGISTRY")]
    registry: Option<PathBuf>,
    /// Directory for precompiled modules (default ~/.cache/quiver/modules).
    #[arg(long, env = "QUIVER_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile in memory only; write nothing to the module cache.
    #[arg(long)]
    no_cache: bool,
    /// Host config (quiver.toml) naming the LLM backends. Without it the backend `openai`
    /// comes from OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL.
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
    /// Write every LLM exchange of the run to this replay transcript.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Append one JSON line per tool call and policy denial to this file (created 0600).
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Print the task's MCP policy decision log (to stderr) before running it.
    #[arg(long)]
    explain_policy: bool,
    /// Tool calls needing approval (registry `approval_policy`): ask on the terminal
    /// (/dev/tty), deny them (and offer no such tool to a model), or allow them.
    #[arg(long, value_enum, default_value = "deny")]
    approve: ApproveMode,
    /// Who the task acts for: its principal, in every audit line, observer event and
    /// approval request, and bound by the host config's `[principals]`. Default: the
    /// login name (USER, LOGNAME), else `local`.
    #[arg(long = "as", value_name = "NAME", value_parser = principal::parse)]
    principal: Option<String>,
    /// Environment variable holding a subject token from the platform this runs for (an
    /// OIDC ID token or an access token): exchanged for a token of each server whose
    /// credential is `kind = "oauth_token_exchange"`. Never printed.
    #[arg(long, value_name = "VAR")]
    subject_token_env: Option<String>,
    /// Binds user stream 0 (`user_stream_*`) to this terminal: each read of stdin reaches
    /// the guest as one SSF frame, and the data of each frame it writes goes to stdout.
    /// At the end of stdin, once the guest has read everything, the session closes.
    #[arg(long)]
    user_stream_stdio: bool,
    /// Guest arguments, replacing the task's `args`.
    #[arg(last = true)]
    args: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ApproveMode {
    Prompt,
    Deny,
    Allow,
}

impl ApproveMode {
    /// `deny` is no approver at all, not `DenyAll`: a host without one offers models no
    /// tool needing approval (an approver that refuses everything would have them offered
    /// and every call refused), and refuses calls as `approval_required`.
    fn approver(self) -> Option<Arc<dyn Approver>> {
        match self {
            ApproveMode::Prompt => Some(Arc::new(TerminalApprover::new())),
            ApproveMode::Deny => None,
            ApproveMode::Allow => Some(Arc::new(AllowAll)),
        }
    }
}

/// Who answers a server's questions (MCP elicitation) during `quiver mcp call`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ElicitMode {
    /// Decline every question.
    Decline,
    /// Accept a question whose form has a default for every required field, with the
    /// defaults; decline the others.
    Defaults,
}

impl ElicitMode {
    fn elicitor(self) -> Option<Arc<dyn Approver>> {
        match self {
            ElicitMode::Decline => None,
            ElicitMode::Defaults => Some(Arc::new(AcceptDefaults)),
        }
    }
}

#[derive(Subcommand)]
enum McpCommand {
    /// Connect to a server and list its tools after the registry's allowed_tools filter.
    Tools {
        server_id: String,
        /// Print one JSON object instead: `server_id`, `tools` (each tool as the server
        /// listed it, input and output schemas untouched) and `hidden` (names).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        identity: Identity,
        #[command(flatten)]
        source: ServerSource,
    },
    /// Call one tool of a server and print the result. The call is made as a task that
    /// enables only this server would make it: the registry's lists and approval policy
    /// apply, as for a guest.
    Call {
        server_id: String,
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Calls needing approval (registry `approval_policy`): ask on the terminal
        /// (/dev/tty), deny them, or allow them.
        #[arg(long, value_enum, default_value = "deny")]
        approve: ApproveMode,
        /// Questions the server asks during the call (MCP elicitation): decline them, or
        /// accept those whose form has defaults with the defaults. Default: `--approve
        /// prompt` offers the defaults on the terminal, else they are declined.
        #[arg(long, value_enum)]
        elicit: Option<ElicitMode>,
        /// Environment variable holding a subject token from the platform this runs for (an
        /// OIDC ID token or an access token): exchanged for a token of each server whose
        /// credential is `kind = "oauth_token_exchange"`. Never printed.
        #[arg(long, value_name = "VAR")]
        subject_token_env: Option<String>,
        #[command(flatten)]
        identity: Identity,
        #[command(flatten)]
        source: ServerSource,
    },
    /// Authorize a server that asks for a user's authorization (its credential is an
    /// `[auth.NAME]` with kind = "oauth_authorization_code") for a principal: prints the
    /// authorization URL (and opens it with --open-with), waits for the browser to come
    /// back to a loopback listener, and keeps the grant under the registry's `.grants/`
    /// (an etcd registry: in the fleet's etcd, sealed as the nodes seal it).
    Login {
        server_id: String,
        #[command(flatten)]
        identity: Identity,
        #[command(flatten)]
        source: GrantSource,
    },
    /// Forget a principal's authorization of a server (its tokens and client
    /// registration) and revoke its tokens at the authorization server when it offers
    /// that. Exits 1 if there was none.
    Logout {
        server_id: String,
        /// Whose authorization: default the OS login name.
        #[arg(long = "as", value_name = "NAME", value_parser = principal::parse)]
        principal: Option<String>,
        #[command(flatten)]
        source: GrantSource,
    },
    /// Connect to every server of a registry (listing its tools) and print each one's
    /// health; with --node, print a running node's instead. Exits 1 if a server is down.
    Status {
        /// MCP registry directory.
        #[arg(long, env = "QUIVER_REGISTRY", required_unless_present = "node")]
        registry: Option<PathBuf>,
        /// Host config (quiver.toml): credentials (`[auth.*]`) and the egress policy.
        #[arg(long, env = "QUIVER_CONFIG")]
        config: Option<PathBuf>,
        /// Base URL of a running `quiver serve` node to ask (GET /v1/mcp/servers) instead.
        #[arg(long)]
        node: Option<String>,
        /// Environment variable holding the node's API token (sent as a bearer token).
        #[arg(long, requires = "node")]
        token_env: Option<String>,
        /// Print the JSON array of server statuses instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Whom an `mcp` command acts for, and how a person is asked to authorize.
#[derive(clap::Args)]
struct Identity {
    /// The principal: picks its grant for a server with user authorization (default the
    /// OS login name).
    #[arg(long = "as", value_name = "NAME", value_parser = principal::parse)]
    principal: Option<String>,
    /// Opens the authorization URL with this command (run as `CMD URL`, e.g. `xdg-open`)
    /// when the server needs a person's authorization. On `call` and `tools`, only with
    /// this flag does a missing grant or a request for more scopes start the flow;
    /// without it they fail and say to run `quiver mcp login`.
    #[arg(long, value_name = "CMD")]
    open_with: Option<String>,
}

impl Identity {
    fn principal(&self) -> String {
        principal::or_login(self.principal.clone())
    }
}

#[derive(clap::Args)]
struct ServerSource {
    /// MCP registry directory.
    #[arg(long, env = "QUIVER_REGISTRY")]
    registry: PathBuf,
    /// Host config (quiver.toml): credentials (`[auth.*]`) and the egress policy.
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
}

/// Where `quiver mcp login` / `logout` find the server and keep the grant.
#[derive(clap::Args)]
struct GrantSource {
    /// MCP registry: a directory (grants under its `.grants/`), or
    /// `etcd://HOST:PORT/PREFIX` for a fleet's registry (grants in that etcd, sealed with
    /// the key `[etcd] grant_key_env` of --config names, as every node of the fleet does).
    #[arg(long, env = "QUIVER_REGISTRY", value_parser = RegistrySource::parse)]
    registry: RegistrySource,
    /// Host config (quiver.toml): credentials (`[auth.*]`), the egress policy and, for an
    /// etcd registry, `[etcd]` (how to reach it, and `grant_key_env`).
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
}

/// Reads `quiver.toml` as a node does, so one file serves every command: the host's
/// sections go to `builder`, the node's (`[serve]`, `[admin]`) come back.
pub(crate) fn with_config_file(
    builder: HostBuilder,
    path: &std::path::Path,
) -> Result<(HostBuilder, NodeFileConfig), ConfigError> {
    let config = NodeFileConfig::load(path)?;
    // Kept in the node's config too: `serve` asks it whether user authorization is on.
    let host = config.host.clone();
    Ok((
        builder.with_config_from(host, ConfigOrigin::file(path)),
        config,
    ))
}

/// Where traces go: `[telemetry]` of the host config at `config`, else the `OTEL_*`
/// variables; `None` when export is off. A config file that does not load is reported
/// when the command reads it, so here it only leaves the variables to decide.
fn trace_export(config: Option<&std::path::Path>) -> Result<Option<TelemetrySettings>, String> {
    let file = config.and_then(|path| Some((path, NodeFileConfig::load(path).ok()?)));
    match file {
        Some((path, config)) => config
            .telemetry
            .resolve()
            .map_err(|e| format!("{}: {e}", path.display())),
        None => quiver_node::telemetry::TelemetryConfig::default().resolve(),
    }
}

/// `--log-format`: one of [`LogFormat::NAMES`], listed in `--help`.
fn log_format() -> impl clap::builder::TypedValueParser<Value = LogFormat> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(LogFormat::NAMES)
        .try_map(|name| name.parse::<LogFormat>())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("quiver: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // Trace export, for the commands that run tasks: set up before the log, whose
    // subscriber carries its layer.
    let config = match &cli.command {
        Command::Run(args) => Some(args.config.as_deref()),
        Command::Serve(args) => Some(args.config.as_deref()),
        _ => None,
    };
    let exporter = match config.map(trace_export).transpose() {
        Ok(exporter) => exporter.flatten(),
        Err(e) => {
            eprintln!("quiver: {e}");
            return ExitCode::from(2);
        }
    };
    let (exporter, layer) = match exporter {
        Some(settings) => {
            let _runtime = runtime.enter();
            match Telemetry::start(&settings) {
                Ok((exporter, layer)) => (Some(exporter), Some(layer)),
                Err(e) => {
                    eprintln!("quiver: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => (None, None),
    };
    telemetry::init_with(
        cli.log_level.as_deref().unwrap_or(default_level),
        cli.log_format,
        layer,
    );
    let status = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Mcp(McpCommand::Tools {
                server_id,
                json,
                identity,
                source,
            }) => mcp_tools(&server_id, json, identity, source).await,
            Command::Mcp(McpCommand::Call {
                server_id,
                tool,
                args,
                approve,
                elicit,
                identity,
                subject_token_env,
                source,
            }) => {
                let call = McpCall {
                    server_id: &server_id,
                    tool: &tool,
                    args: &args,
                    subject_token_env: subject_token_env.as_deref(),
                    elicit,
                };
                mcp_call(call, approve, identity, source).await
            }
            Command::Mcp(McpCommand::Login {
                server_id,
                identity,
                source,
            }) => mcp_login(&server_id, identity, source).await,
            Command::Mcp(McpCommand::Logout {
                server_id,
                principal,
                source,
            }) => {
                let principal = principal::or_login(principal);
                mcp_logout(&server_id, &principal, source).await
            }
            Command::Mcp(McpCommand::Status {
                registry,
                config,
                node,
                token_env,
                json,
            }) => {
                let source = match (node, registry) {
                    (Some(url), _) => status::Source::Node { url, token_env },
                    (None, Some(registry)) => status::Source::Local { registry, config },
                    (None, None) => return fail("--registry or --node is required"),
                };
                status::status(source, json).await
            }
            Command::Registry(command) => registry::run(command).await,
            Command::Serve(args) => serve(args).await,
        }
    });
    if let Some(exporter) = exporter {
        runtime.block_on(exporter.shutdown(quiver_node::defaults::TELEMETRY_SHUTDOWN_TIMEOUT));
    }
    ExitCode::from(status.clamp(0, 255) as u8)
}

async fn run(args: RunArgs) -> i32 {
    let mut signals = Signals::listen();
    let task = match &args.task {
        Some(path) => match TaskSpec::from_file(path) {
            Ok(task) => task,
            Err(e) => return fail(e),
        },
        None => TaskSpec::new(
            args.module
                .file_stem()
                .map_or("task".into(), |s| s.to_string_lossy().into_owned()),
        ),
    };
    let mut task = if args.args.is_empty() {
        task
    } else {
        task.with_args(args.args)
    };
    task.principal = Some(principal::or_login(args.principal));
    task.subject_token = match subject_token(args.subject_token_env.as_deref()) {
        Ok(token) => token,
        Err(e) => return fail(e),
    };
    let mut builder = HostBuilder::default();
    if let Some(approver) = args.approve.approver() {
        builder = builder.with_approver(approver);
    }
    if let Some(dir) = args.registry {
        builder = builder.with_registry_dir(dir);
    }
    if let Some(dir) = args.cache_dir {
        builder = builder.with_cache_dir(dir);
    }
    if args.no_cache {
        builder = builder.without_disk_cache();
    }
    if let Some(path) = &args.config {
        builder = match with_config_file(builder, path) {
            Ok((builder, _)) => builder,
            Err(e) => return fail(e),
        };
    }
    if let Some(path) = args.record {
        builder = builder.with_recording(path);
    }
    if let Some(path) = args.audit_log {
        builder = builder.with_audit_log(path);
    }
    // One-shot: the registry is read once and not watched.
    let host = match builder.build() {
        Ok(host) => host,
        Err(e) => return fail(e),
    };
    if args.explain_policy {
        match host.explain_policy(&task).await {
            Ok(report) => eprint!("{report}"),
            Err(e) => {
                host.shutdown().await;
                return fail(e);
            }
        }
    }
    let module = match host.load_module_file(&args.module) {
        Ok(module) => module,
        Err(e) => return fail(e),
    };
    let stdio = if args.user_stream_stdio {
        if task.inherit_stdin {
            return fail(
                "--user-stream-stdio reads stdin, which the task's `inherit_stdin` also asks for; drop one",
            );
        }
        let streams = quiver::UserStreams::new();
        task.user_streams = Some(streams.clone());
        match streams.attach() {
            Ok(client) => Some(user_stream_stdio::start(client)),
            Err(e) => return fail(e),
        }
    } else {
        None
    };
    // On a worker thread, as `quiver serve` runs its tasks: there an MCP server's answer
    // wakes the task on the thread that read it, where on this `block_on` thread every
    // answer is one more thread switch (BENCHMARKS.md, issue 25).
    let mut running = tokio::spawn({
        let (host, module, task) = (host.clone(), module.clone(), task.clone());
        async move { host.run_task(&module, &task).await }.in_current_span()
    });
    let outcome = tokio::select! {
        ended = &mut running => match ended {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => return fail(format!("the task did not finish: {e}")),
        },
        signal = signals.next() => {
            eprintln!("quiver: {}; stopping the task and its MCP servers", signal.name);
            // The task stops at its next yield (epoch ticks interrupt a spinning guest)
            // and asks its calls in flight to stop; then the host stops its servers. A
            // second signal does not wait for a task stuck in a blocking write.
            running.abort();
            tokio::select! {
                _ = &mut running => stop(&host, &mut signals).await,
                again = signals.next() => {
                    eprintln!("quiver: {} again; killing the MCP servers", again.name);
                }
            }
            flush_guest_logs().await;
            return signal.status;
        }
    };
    if let Some(stdio) = stdio {
        stdio.finish().await;
    }
    stop(&host, &mut signals).await;
    flush_guest_logs().await;
    match outcome {
        Ok(outcome) => {
            if let Some(failure) = &outcome.failure {
                eprintln!("quiver: task `{}` failed: {failure}", task.task_id);
            }
            outcome.exit_code
        }
        Err(e) => fail(e),
    }
}

/// Lets the guest's last `log` lines and stderr writes reach stderr before the host says
/// more and exits; a stderr stuck longer loses them (saying so would block on the same stderr).
async fn flush_guest_logs() {
    let timeout = quiver::defaults::GUEST_STDERR_FLUSH_TIMEOUT;
    let _ =
        tokio::task::spawn_blocking(move || quiver::telemetry::flush_guest_stderr(timeout)).await;
}

/// `quiver serve`: the first Ctrl-C or SIGTERM drains the node, a second cancels what
/// still runs; either way the exit status is 0 once the node has stopped. SIGHUP, and
/// unless `--no-watch` any change in the registry directory, reloads the registry; a
/// refused reload keeps the old snapshot serving. A registry store is followed instead
/// (see `host::sync`); SIGHUP then lists it again.
async fn serve(args: ServeArgs) -> i32 {
    let mut signals = Signals::listen();
    // Listened for before anything else: SIGHUP's default action would end the node.
    let hangups = Hangups::listen();
    let approvals = Arc::new(ApprovalQueue::default());
    // Its admin API (and any shared store) lets others write records: without
    // `[mcp.launch]`, no record may run a command or read a host variable.
    let mut builder = HostBuilder::default()
        .with_approver(approvals.clone())
        .with_default_launch_rules(quiver::LaunchRules::default());
    if let Some(dir) = args.cache_dir {
        builder = builder.with_cache_dir(dir);
    }
    if let Some(path) = args.audit_log {
        builder = builder.with_audit_log(path);
    }
    let mut node_config = NodeConfig::new(args.listen);
    let mut etcd = EtcdAccess::default();
    let mut grant_key = None;
    if let Some(path) = &args.config {
        let config;
        (builder, config) = match with_config_file(builder, path) {
            Ok(read) => read,
            Err(e) => return fail(e),
        };
        node_config = match NodeConfig::from_serve_config(args.listen, &config.serve, path)
            .and_then(|node| node.with_admin_config(&config.admin, path))
            .and_then(|node| node.with_clients_config(&config.clients, path))
        {
            Ok(config) => config,
            Err(e) => return fail(e),
        };
        if matches!(args.registry, RegistrySource::Etcd { .. }) {
            etcd = match config.etcd.resolve(path) {
                Ok(etcd) => etcd,
                Err(e) => return fail(e),
            };
            // A fleet's grants go to etcd too, sealed with the key every node shares.
            grant_key = match config.etcd_grant_key(path) {
                Ok(key) => key,
                Err(e) => return fail(e),
            };
        }
    }
    builder = match &args.registry {
        RegistrySource::Dir(dir) => builder.with_registry_dir(dir),
        RegistrySource::Etcd { endpoints, prefix } => {
            match EtcdStore::connect_with_access(endpoints.clone(), prefix.clone(), &etcd).await {
                Ok(store) => {
                    if let Some(key) = grant_key {
                        builder =
                            builder.with_grant_store(Arc::new(EtcdGrantStore::new(&store, key)));
                    }
                    builder.with_registry_store(Arc::new(store))
                }
                Err(e) => return fail(e),
            }
        }
    };
    let host = match builder.build() {
        Ok(host) => host,
        Err(e) => return fail(e),
    };
    let follower = match host.registry_store() {
        Some(store) => match host.follow_store(store) {
            Ok(follower) => Some(Arc::new(follower)),
            Err(e) => {
                host.shutdown().await;
                return fail(e);
            }
        },
        None => None,
    };
    if let Some(follower) = &follower
        && !follower
            .first_sync(quiver::defaults::REGISTRY_STORE_TIMEOUT)
            .await
    {
        tracing::warn!("the registry store has not answered yet; serving degraded until it does");
    }
    let watcher = if args.no_watch || follower.is_some() {
        None
    } else {
        match host.watch_registry() {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                host.shutdown().await;
                return fail(format!(
                    "{e}; pass --no-watch to serve without watching (SIGHUP still reloads)"
                ));
            }
        }
    };
    let node = match Node::bind(host.clone(), node_config.with_approval_queue(approvals)).await {
        Ok(node) => node,
        Err(e) => {
            host.shutdown().await;
            return fail(e);
        }
    };
    // Scripts and tests read the address (the real port after `:0`) from this line.
    println!("listening on http://{}", node.local_addr());
    let control = node.control();
    tokio::spawn(async move {
        let signal = signals.next().await;
        eprintln!("quiver: {}; draining the node", signal.name);
        control.drain();
        let signal = signals.next().await;
        eprintln!(
            "quiver: {} again; cancelling the running tasks",
            signal.name
        );
        control.stop_now();
    });
    let reloader = tokio::spawn(hangups.reload_on_each(host.clone(), follower.clone()));
    node.run().await;
    reloader.abort();
    drop(watcher);
    drop(follower);
    0
}

/// SIGHUP, listened for from the start of `serve`.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signal = signal(SignalKind::hangup())
                .inspect_err(|e| eprintln!("quiver: cannot listen for SIGHUP: {e}"))
                .ok();
            Self { signal }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Reloads `host`'s registry on every SIGHUP (lists the store again when following
    /// one), logging the outcome.
    async fn reload_on_each(self, host: Host, follower: Option<Arc<StoreFollower>>) {
        #[cfg(unix)]
        {
            let Some(mut signal) = self.signal else {
                return;
            };
            while signal.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the registry");
                if let Some(follower) = &follower {
                    follower.resync();
                    continue;
                }
                let host = host.clone();
                // Reading the directory is blocking file I/O.
                match tokio::task::spawn_blocking(move || host.reload_registry()).await {
                    Ok(Ok(registry)) => {
                        tracing::info!(revision = registry.revision(), "registry reload done");
                    }
                    // reload_registry logged why; the old snapshot serves on.
                    Ok(Err(_)) => {}
                    Err(e) => tracing::error!(error = %e, "the registry reload failed"),
                }
            }
        }
        #[cfg(not(unix))]
        let _ = (host, follower);
    }
}

/// Stops every MCP server of `host` gracefully. A second Ctrl-C or SIGTERM cuts that
/// short: the servers' process groups are then killed when the host is dropped, or by
/// their watchdogs when this process exits.
async fn stop(host: &Host, signals: &mut Signals) {
    tokio::select! {
        () = host.shutdown() => {}
        signal = signals.next() => {
            eprintln!("quiver: {} again; killing the MCP servers", signal.name);
        }
    }
}

/// A signal that ends `quiver run`, and the exit status it gives (128 + its number).
struct Interrupted {
    name: &'static str,
    status: i32,
}

/// Ctrl-C and SIGTERM, listened for from the start of `run` so that neither can kill the
/// process before it has stopped its servers.
struct Signals {
    #[cfg(unix)]
    listening: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listening = match (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) {
                (Ok(int), Ok(term)) => Some((int, term)),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("quiver: cannot listen for Ctrl-C and SIGTERM: {e}");
                    None
                }
            };
            Self { listening }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next Ctrl-C or SIGTERM.
    async fn next(&mut self) -> Interrupted {
        const INT: Interrupted = Interrupted {
            name: "interrupted",
            status: 130,
        };
        #[cfg(unix)]
        {
            let Some((int, term)) = &mut self.listening else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = int.recv() => INT,
                _ = term.recv() => Interrupted { name: "terminated", status: 143 },
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            INT
        }
    }
}

fn fail(error: impl std::fmt::Display) -> i32 {
    eprintln!("quiver: {error}");
    2
}

/// Who decides for a host: calls that need approval, and servers' questions (`None`: the
/// approver answers them).
#[derive(Default)]
struct Deciders {
    approver: Option<Arc<dyn Approver>>,
    elicitor: Option<Option<Arc<dyn Approver>>>,
}

/// A host on `source` for one server (asking `approver` about calls that need approval),
/// or the exit status to give up with.
async fn server_host(
    server_id: &str,
    source: &ServerSource,
    approver: Option<Arc<dyn Approver>>,
    ask_person: Option<Option<String>>,
) -> Result<(Host, Arc<ServerEntry>), i32> {
    let deciders = Deciders {
        approver,
        elicitor: None,
    };
    server_host_with(server_id, source, deciders, ask_person, None).await
}

/// [`server_host`] with its `deciders`, whose observers include the audit log at
/// `audit_log`.
async fn server_host_with(
    server_id: &str,
    source: &ServerSource,
    deciders: Deciders,
    ask_person: Option<Option<String>>,
    audit_log: Option<&std::path::Path>,
) -> Result<(Host, Arc<ServerEntry>), i32> {
    let registry = Registry::load_dir(&source.registry).map_err(fail)?;
    let Some(entry) = registry.get(server_id).cloned() else {
        let known: Vec<_> = registry
            .servers()
            .map(|s| s.server_id().to_owned())
            .collect();
        eprintln!(
            "quiver: no server `{server_id}` in {} (known: {})",
            source.registry.display(),
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        );
        return Err(1);
    };
    let mut builder = Host::builder()
        .with_registry(registry)
        .without_disk_cache()
        .with_grant_store(Arc::new(DirGrantStore::in_registry(&source.registry)));
    if let Some(open_with) = ask_person {
        let authorizer = login::LoopbackAuthorizer::start(open_with)
            .await
            .map_err(|e| fail(format!("cannot listen on loopback for the login: {e}")))?;
        builder = builder.with_user_authorizer(authorizer);
    }
    if let Some(config) = &source.config {
        builder = with_config_file(builder, config).map_err(fail)?.0;
    }
    if let Some(approver) = deciders.approver {
        builder = builder.with_approver(approver);
    }
    if let Some(elicitor) = deciders.elicitor {
        builder = builder.with_elicitor(elicitor);
    }
    if let Some(path) = audit_log {
        builder = builder.with_audit_log(path);
    }
    Ok((builder.build().map_err(fail)?, entry))
}

async fn mcp_tools(server_id: &str, json: bool, identity: Identity, source: ServerSource) -> i32 {
    let ask = identity.open_with.clone().map(Some);
    let (host, entry) = match server_host(server_id, &source, None, ask).await {
        Ok(found) => found,
        Err(status) => return status,
    };
    let principal = identity.principal();
    let principal = Some(principal.as_str());
    // What a task could be offered (after allowed_tools), and the whole listing, for
    // what the registry hides; the second answer comes from the pool's tools cache.
    let listed = match host.preview_tools_as(server_id, principal).await {
        Ok(visible) => match host.server_tools_as(server_id, principal).await {
            Ok(all) if entry.record.pins_apply() => host
                .pin_report_as(server_id, principal)
                .await
                .map(|pins| (visible, all, pins)),
            Ok(all) => Ok((visible, all, Vec::new())),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    host.shutdown().await;
    let (visible, all, pins) = match listed {
        Ok(listed) => listed,
        Err(e) => {
            eprintln!("quiver: {e}");
            return 1;
        }
    };
    let refused: Vec<_> = pins.iter().filter(|p| p.denied.is_some()).collect();
    let hidden: Vec<&str> = all
        .iter()
        .map(|t| t.name.as_ref())
        .filter(|name| !visible.iter().any(|v| v.name == *name))
        .filter(|name| !refused.iter().any(|p| p.name == *name))
        .collect();
    if json {
        // The full definitions, in the server's order, of the tools a task could use.
        let tools: Vec<&quiver::Tool> = all
            .iter()
            .filter(|t| visible.iter().any(|v| v.name == *t.name))
            .collect();
        let out = serde_json::json!({
            "server_id": entry.server_id(),
            "tools": tools,
            "hidden": hidden,
        });
        println!("{out}");
        return 0;
    }
    println!(
        "{} ({}): {} tools",
        entry.server_id(),
        entry.record.display_name,
        visible.len()
    );
    for tool in &visible {
        let description = tool
            .description
            .as_deref()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        println!("  {} — {}", tool.name, description);
    }
    if !hidden.is_empty() {
        println!("hidden by allowed_tools: {}", hidden.join(", "));
    }
    for status in refused {
        let why = status.denied.as_deref().unwrap_or_default();
        println!("refused by the record's pins: {}: {why}", status.name);
    }
    0
}

/// What `quiver mcp call` calls.
struct McpCall<'a> {
    server_id: &'a str,
    tool: &'a str,
    args: &'a str,
    subject_token_env: Option<&'a str>,
    elicit: Option<ElicitMode>,
}

/// The subject token in the variable `--subject-token-env` names, checked; its errors name
/// the variable and the rule, never the value.
fn subject_token(var: Option<&str>) -> Result<Option<quiver::SubjectToken>, String> {
    let Some(var) = var else {
        return Ok(None);
    };
    let value = std::env::var(var).map_err(|_| {
        format!("--subject-token-env: environment variable `{var}` is not set (or not UTF-8)")
    })?;
    quiver::SubjectToken::new(&value)
        .map(Some)
        .map_err(|e| format!("--subject-token-env {var}: {e}"))
}

async fn mcp_call(
    call: McpCall<'_>,
    approve: ApproveMode,
    identity: Identity,
    source: ServerSource,
) -> i32 {
    let McpCall {
        server_id,
        tool,
        args,
        subject_token_env,
        elicit,
    } = call;
    let subject_token = match subject_token(subject_token_env) {
        Ok(token) => token,
        Err(e) => return fail(e),
    };
    let arguments = match quiver::json::from_str::<serde_json::Value>(args) {
        Ok(arguments @ serde_json::Value::Object(_)) => arguments,
        _ => {
            eprintln!("quiver: --args must be a JSON object, got {args:?}");
            return 2;
        }
    };
    let ask = identity.open_with.clone().map(Some);
    let deciders = Deciders {
        approver: approve.approver(),
        elicitor: elicit.map(ElicitMode::elicitor),
    };
    let (host, _) = match server_host_with(server_id, &source, deciders, ask, None).await {
        Ok(found) => found,
        Err(status) => return status,
    };
    // A task of its own that may use this one server: every layer but the task's lists
    // (none) applies, as for a guest.
    let mut task = TaskSpec::new("quiver-mcp-call")
        .with_config("mcp.enabled", "true")
        .with_config("mcp.default_server_ids", serde_json::json!([server_id]));
    task.principal = Some(identity.principal());
    task.subject_token = subject_token;
    let request = ToolCallRequest::new(server_id, tool).with_arguments(arguments);
    let called = host.call_tool(&task, request).await;
    host.shutdown().await;
    match called {
        Ok(output) => {
            println!("{}", String::from_utf8_lossy(&output.json));
            i32::from(output.result.is_error == Some(true))
        }
        Err(e) => {
            eprintln!("quiver: {e}");
            1
        }
    }
}

/// A host for `quiver mcp login` / `logout` on `source` (asking a person through the
/// loopback listener when `ask_person` says so), and the follower of an etcd registry,
/// kept while the host is used.
async fn grant_host(
    server_id: &str,
    source: GrantSource,
    ask_person: Option<Option<String>>,
) -> Result<(Host, Option<StoreFollower>), i32> {
    let (endpoints, prefix) = match source.registry {
        RegistrySource::Dir(registry) => {
            let source = ServerSource {
                registry,
                config: source.config,
            };
            let (host, _) = server_host(server_id, &source, None, ask_person).await?;
            return Ok((host, None));
        }
        RegistrySource::Etcd { endpoints, prefix } => (endpoints, prefix),
    };
    // The same store, key and associated data as a node's, so every node of the fleet
    // uses (and can revoke) the grant; records under the node's default launch rules.
    let Some(path) = &source.config else {
        return Err(fail(
            "an etcd:// registry keeps grants in etcd, sealed with the key the fleet's nodes share: pass --config with their quiver.toml (its [etcd] grant_key_env, with that variable set)",
        ));
    };
    let builder = Host::builder()
        .without_disk_cache()
        .with_default_launch_rules(quiver::LaunchRules::default());
    let (mut builder, config) = with_config_file(builder, path).map_err(fail)?;
    let etcd = config.etcd.resolve(path).map_err(fail)?;
    let key = config.etcd_grant_key(path).map_err(fail)?.ok_or_else(|| {
        fail(format!(
            "{}: etcd.grant_key_env: not set, and no [auth.NAME] is kind = \"oauth_authorization_code\": there is no user authorization to keep in etcd",
            path.display()
        ))
    })?;
    let store = EtcdStore::connect_with_access(endpoints, prefix, &etcd)
        .await
        .map_err(fail)?;
    builder = builder.with_grant_store(Arc::new(EtcdGrantStore::new(&store, key)));
    let store: Arc<dyn RegistryStore> = Arc::new(store);
    builder = builder.with_registry_store(store.clone());
    if let Some(open_with) = ask_person {
        let authorizer = login::LoopbackAuthorizer::start(open_with)
            .await
            .map_err(|e| fail(format!("cannot listen on loopback for the login: {e}")))?;
        builder = builder.with_user_authorizer(authorizer);
    }
    let host = builder.build().map_err(fail)?;
    let follower = match host.follow_store(store.clone()) {
        Ok(follower) => follower,
        Err(e) => {
            host.shutdown().await;
            return Err(fail(e));
        }
    };
    if !follower
        .first_sync(quiver::defaults::REGISTRY_STORE_TIMEOUT)
        .await
    {
        host.shutdown().await;
        return Err(fail(format!(
            "{} did not answer within {} s",
            store.describe(),
            quiver::defaults::REGISTRY_STORE_TIMEOUT.as_secs()
        )));
    }
    Ok((host, Some(follower)))
}

async fn mcp_login(server_id: &str, identity: Identity, source: GrantSource) -> i32 {
    let (host, _follower) =
        match grant_host(server_id, source, Some(identity.open_with.clone())).await {
            Ok(found) => found,
            Err(status) => return status,
        };
    let principal = identity.principal();
    let authorized = host.authorize_server(server_id, &principal).await;
    host.shutdown().await;
    match authorized {
        Ok(()) => {
            eprintln!("quiver: `{principal}` authorized server `{server_id}`");
            0
        }
        Err(e) => {
            eprintln!("quiver: {e}");
            1
        }
    }
}

async fn mcp_logout(server_id: &str, principal: &str, source: GrantSource) -> i32 {
    let (host, _follower) = match grant_host(server_id, source, None).await {
        Ok(found) => found,
        Err(status) => return status,
    };
    let revoked = host.revoke_server(server_id, principal).await;
    host.shutdown().await;
    match revoked {
        Ok(true) => {
            eprintln!("quiver: forgot `{principal}`'s authorization of server `{server_id}`");
            0
        }
        Ok(false) => {
            eprintln!("quiver: `{principal}` had not authorized server `{server_id}`");
            1
        }
        Err(e) => {
            eprintln!("quiver: {e}");
            1
        }
    }
}
