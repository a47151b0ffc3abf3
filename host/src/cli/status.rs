//! `quiver mcp status`: the health of every server of a registry, found by connecting to
//! each one now, or that of a running node (`GET /v1/mcp/servers`).
//!
//! Both print the same [`ServerStatus`](quiver::mcp::ServerStatus) JSON, as a table or
//! (`--json`) as the array itself, so scripts read one shape whichever source they ask.

use std::path::PathBuf;

use futures::StreamExt;
use serde_json::Value;

use quiver::registry::Registry;
use quiver::{Host, defaults};

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
) -> Result<Vec<Value>, String> {
    let loaded = Registry::load_dir(registry).map_err(|e| e.to_string())?;
    let mut builder = Host::builder().with_registry(loaded).without_disk_cache();
    if let Some(config) = config {
        builder = builder
            .with_config_file(config)
            .map_err(|e| e.to_string())?;
    }
    let host = builder.build().map_err(|e| e.to_string())?;
    let registry = host.registry();
    // Failures show in each server's health; the listing itself is not printed.
    let listing = registry
        .servers()
        .map(|entry| host.pool().list_tools(entry));
    futures::future::join_all(listing).await;
    let servers = host.mcp_servers();
    host.shutdown().await;
    Ok(servers
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect())
}

/// The `servers` of the node's `GET /v1/mcp/servers`.
async fn node(url: &str, token_env: Option<&str>) -> Result<Vec<Value>, String> {
    let token = match token_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            format!("--token-env {var}: the environment variable {var} is not set")
        })?),
        None => None,
    };
    quiver::mcp::ensure_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(defaults::CLI_NODE_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let endpoint = format!("{}/v1/mcp/servers", url.trim_end_matches('/'));
    let mut request = client.get(&endpoint);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
    let status = response.status();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("{endpoint}: {e}"))?;
        if body.len().saturating_add(chunk.len()) > defaults::CLI_NODE_MAX_RESPONSE_BYTES {
            return Err(format!(
                "{endpoint} answered more than {} bytes",
                defaults::CLI_NODE_MAX_RESPONSE_BYTES
            ));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(500).collect();
        return Err(format!("{endpoint} answered HTTP {status}: {text}"));
    }
    let mut answer: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{endpoint} did not answer JSON: {e}"))?;
    match answer.get_mut("servers").map(Value::take) {
        Some(Value::Array(servers)) => Ok(servers),
        _ => Err(format!(
            "{endpoint} answered no `servers` array (is it a quiver node?)"
        )),
    }
}

fn print_table(servers: &[Value]) {
    let rows: Vec<[String; 8]> = servers
        .iter()
        .map(|s| {
            let text = |field: &str| match &s[field] {
                Value::Null => "-".to_owned(),
                Value::String(text) => text.clone(),
                other => other.to_string(),
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
                text("last_error").replace('\n', " "),
            ]
        })
        .collect();
    let header = [
        "SERVER",
        "STATE",
        "TOOLS",
        "CONNECTS",
        "RECONNECTS",
        "P50",
        "P95",
        "LAST ERROR",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}
