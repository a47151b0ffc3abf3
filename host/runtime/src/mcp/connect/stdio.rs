//! Starting a stdio server: a child process confined the way a third-party program should be.
//!
//! It gets only a minimal environment plus what its record grants (so host secrets do not
//! leak into it), runs as the leader of its own process group, which is always stopped as
//! a whole and dies with the host ([`super::process`]), and its stderr goes to the host log
//! under its server id, with the record's secrets cut out. Its stdin and stdout carry
//! JSON-RPC through our bounded [`LineTransport`] (rmcp's own stdio transport drops a line
//! it cannot read, so the request it answered waits for its timeout).

use std::collections::BTreeMap;

use tokio::io::AsyncBufReadExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::guard::Limits;
use super::lines::LineTransport;
use super::process::{self, ServerProcess, Spawned};
use super::unavailable;
use crate::defaults;
use crate::mcp::error::McpError;
use crate::registry::Secrets;
use crate::text;

/// Host variables a server process inherits; everything else must be granted by its
/// record's `env` / `env_from`, so host secrets do not leak into third-party servers.
const SERVER_BASE_ENV: [&str; 6] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR"];

/// The MCP byte stream of a stdio server: its stdout and stdin.
pub(super) type StdioTransport = LineTransport<ChildStdout, ChildStdin>;

/// Spawns `command` for the server `limits` are for; returns its transport and its
/// process group.
pub(super) fn spawn(
    limits: Limits,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&String>,
    secrets: &Secrets,
    permit: Option<OwnedSemaphorePermit>,
) -> Result<(StdioTransport, ServerProcess), McpError> {
    let server_id = limits.server_id.clone();
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args).env_clear();
    for name in SERVER_BASE_ENV {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.envs(env);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let Spawned {
        process,
        stdin,
        stdout,
        stderr,
    } = process::spawn(cmd, permit).map_err(|e| {
        unavailable(format!(
            "server `{server_id}`: cannot start `{command}`: {e}"
        ))
    })?;
    tokio::spawn(forward_stderr(
        server_id.to_string(),
        stderr,
        secrets.clone(),
    ));
    Ok((LineTransport::new(stdout, stdin, limits), process))
}

/// Logs the server's stderr line by line. A line is cut at
/// [`defaults::MAX_SERVER_STDERR_LINE_BYTES`] and the rest of it skipped, so a server
/// writing without newlines costs the host no more than one line. Secrets are cut out
/// before the line is, so one straddling the cut is still found whole; then what could
/// drive a terminal or disguise the line is escaped ([`text::printable`]).
async fn forward_stderr(server_id: String, stderr: tokio::process::ChildStderr, secrets: Secrets) {
    let span = tracing::info_span!("mcp_server_stderr", server_id = %server_id);
    let keep = defaults::MAX_SERVER_STDERR_LINE_BYTES.saturating_add(secrets.longest());
    async move {
        let log = |line: &[u8]| {
            let line = String::from_utf8_lossy(line);
            let line = secrets.redact(line.trim_end());
            let line = text::printable(text::cut(&line, defaults::MAX_SERVER_STDERR_LINE_BYTES));
            tracing::info!(target: "quiver::mcp::server", server_id = %server_id, "{line}");
        };
        let mut reader = tokio::io::BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            let buf = match reader.fill_buf().await {
                Ok(buf) if !buf.is_empty() => buf,
                _ => break,
            };
            let newline = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..newline.unwrap_or(buf.len())];
            let room = keep.saturating_sub(line.len());
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let used = newline.map_or(buf.len(), |i| i + 1);
            reader.consume(used);
            if newline.is_some() {
                log(&line);
                line.clear();
            }
        }
        if !line.is_empty() {
            log(&line);
        }
    }
    .instrument(span)
    .await
}
