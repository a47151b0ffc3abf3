//! `quiver mcp status`: the health of every server of a registry, found by connecting to
//! each one now, or that of a running node (`GET /v1/mcp/servers`).
//!
//! Both print the same [`ServerStatus`](quiver::ServerStatus) JSON, as a table or
//! (`--json`) as the array itself, so scripts read one shape whichever source they ask. A
//! node's answer is untrusted: every table cell, and any error body quoted, is shown with
//! control and format characters removed, so nothing in it can drive the terminal.

use std::path::PathBuf;

use futures::StreamExt;
use serde_json::Value;

use quiver::registry::{Registry, RegistryDirError};
use quiver::text::printable;
use quiver::{Host, HostError};

use crate::defaults;

/// Why no health could be read.
#[derive(Debug, thiserror::Error)]
enum StatusError {
    #[error(transparent)]
    Registry(#[from] RegistryDirError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Config(#[from] quiver::config::ConfigError),
    #[error("--token-env {0}: the environment variable {0} is not set")]
    TokenEnv(String),
    #[error("cannot build an HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("cannot reach {endpoint}: {source}")]
    Unreachable {
        endpoint: String,
        source: reqwest::Error,
    },
    #[error("{endpoint} answered more than {max} bytes")]
    TooLarge { endpoint: String, max: usize },
    #[error("{endpoint} answered HTTP {status}: {body}")]
    Refused {
        endpoint: String,
        status: reqwest::StatusCode,
        /// Cut and made printable.
        body: String,
    },
    #[error("{endpoint} did not answer JSON: {source}")]
    NotJson {
        endpoint: String,
        source: serde_json::Error,
    },
    #[error("{endpoint} answered no `servers` array (is it a quiver node?)")]
    NoServers { endpoint: String },
}

/// Where the health comes from.
pub(super) enum Source {
    /// Connect to every server of this registry now.
    Local {
        registry: PathBuf,
        config: Option<PathBuf>,
    },
    /// Ask a running node at this base URL, with the token in this environment variable.
    Node {
        url: String,
        token_env: Option<String>,
    },
}

/// Prints the health; exits 1 when a server is down, 2 when none could be read.
pub(super) async fn status(source: Source, json: bool) -> i32 {
    let servers = match source {
        Source::Local { registry, config } => local(&registry, config.as_deref()).await,
        Source::Node { url, token_env } => node(&url, token_env.as_deref()).await,
    };
    let servers = match servers {
        Ok(servers) => servers,
        Err(message) => {
            eprintln!("quiver: {message}");
            return 2;
        }
    };
    if json {
        println!("{}", Value::Array(servers.clone()));
    } else {
        print_table(&servers);
    }
    i32::from(servers.iter().any(|s| s["state"] == "down"))
}

/// Lists every server's tools (connecting it), then reads the host's health of each.
async fn local(
    registry: &std::path::Path,
    config: Option<&std::path::Path>,
) -> Result<Vec<Value>, StatusError> {
    let loaded = Registry::load_dir(registry)?;
    let mut builder = Host::builder().with_registry(loaded).without_disk_cache();
    if let Some(config) = config {
        builder = crate::with_config_file(builder, config)?.0;
    }
    let host = builder.build()?;
    let registry = host.registry();
    // Failures show in each server's health; the listing itself is not printed.
    let listing = registry
        .servers()
        .map(|entry| host.server_tools(entry.server_id()));
    futures::future::join_all(listing).await;
    let servers = host.mcp_servers();
    host.shutdown().await;
    Ok(servers
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect())
}

/// The `servers` of the node's `GET /v1/mcp/servers`.
async fn node(url: &str, token_env: Option<&str>) -> Result<Vec<Value>, StatusError> {
    let token = match token_env {
        Some(var) => Some(std::env::var(var).map_err(|_| StatusError::TokenEnv(var.to_owned()))?),
        None => None,
    };
    quiver::ensure_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(defaults::CLI_NODE_TIMEOUT)
        .build()
        .map_err(StatusError::Client)?;
    let endpoint = format!("{}/v1/mcp/servers", url.trim_end_matches('/'));
    let mut request = client.get(&endpoint);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let unreachable = |source| StatusError::Unreachable {
        endpoint: endpoint.clone(),
        source,
    };
    let response = request.send().await.map_err(unreachable)?;
    let status = response.status();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(unreachable)?;
        if body.len().saturating_add(chunk.len()) > defaults::CLI_NODE_MAX_RESPONSE_BYTES {
            return Err(StatusError::TooLarge {
                endpoint,
                max: defaults::CLI_NODE_MAX_RESPONSE_BYTES,
            });
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let text: String = String::from_utf8_lossy(&body)
            .chars()
            .take(defaults::CLI_NODE_MAX_ERROR_CHARS)
            .collect();
        return Err(StatusError::Refused {
            endpoint,
            status,
            body: printable(&text),
        });
    }
    let mut answer: Value = match quiver::json::from_slice(&body) {
        Ok(answer) => answer,
        Err(source) => return Err(StatusError::NotJson { endpoint, source }),
    };
    match answer.get_mut("servers").map(Value::take) {
        Some(Value::Array(servers)) => Ok(servers),
        _ => Err(StatusError::NoServers { endpoint }),
    }
}

fn print_table(servers: &[Value]) {
    let rows: Vec<[String; 8]> = servers
        .iter()
        .map(|s| {
            let text = |field: &str| match &s[field] {
                Value::Null => "-".to_owned(),
                Value::String(text) => printable(text),
                other => printable(&other.to_string()),
            };
            let ms = |field: &str| match s[field].as_u64() {
                Some(ms) => format!("{ms}ms"),
                None => "-".to_owned(),
            };
            [
                text("server_id"),
                text("state"),
                text("tool_count"),
                text("connections"),
                text("reconnects"),
                ms("latency_p50_ms"),
                ms("latency_p95_ms"),
                text("last_error"),
            ]
        })
        .collect();
    super::table::print(
        [
            "SERVER",
            "STATE",
            "TOOLS",
            "CONNECTS",
            "RECONNECTS",
            "P50",
            "P95",
            "LAST ERROR",
        ],
        &rows,
    );
}
