//! Starting a stdio server: a child process confined the way a third-party program should be.
//!
//! It gets only a minimal environment plus what its record grants (so host secrets do not
//! leak into it), runs in its own process group (so killing it kills its children too),
//! dies with the host (`PR_SET_PDEATHSIG`, `KillOnDrop`), and its stderr goes to the host
//! log under its server id. Its stdin and stdout carry JSON-RPC through our bounded
//! [`LineTransport`] (rmcp's child-process transport reads stdout itself, without caps
//! that fail the request a bad line answers).

use std::collections::BTreeMap;
use std::process::Stdio;

use process_wrap::tokio::ChildWrapper;
use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::AsyncBufReadExt;
use tokio::process::{ChildStdin, ChildStdout};
use tracing::Instrument;

use super::guard::Limits;
use super::lines::LineTransport;
use super::unavailable;
use crate::defaults;
use crate::mcp::error::McpError;

/// Host variables a server process inherits; everything else must be granted by its
/// record's `env` / `env_from`, so host secrets do not leak into third-party servers.
const SERVER_BASE_ENV: [&str; 6] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR"];

/// Spawns `command` for `server_id`; returns its transport and its pid.
pub(super) fn spawn(
    limits: Limits,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&String>,
) -> Result<(StdioTransport, Option<u32>), McpError> {
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
    #[cfg(target_os = "linux")]
    // SAFETY: the closure only calls prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
    wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
    wrapped.wrap(process_wrap::tokio::KillOnDrop);
    let mut child = wrapped.spawn().map_err(|e| {
        unavailable(format!(
            "server `{server_id}`: cannot start `{command}`: {e}"
        ))
    })?;
    let pid = child.id();
    let (stdin, stdout) = match (child.stdin().take(), child.stdout().take()) {
        (Some(stdin), Some(stdout)) => (stdin, stdout),
        _ => {
            return Err(unavailable(format!(
                "server `{server_id}`: `{command}` started without piped stdin and stdout"
            )));
        }
    };
    if let Some(stderr) = child.stderr().take() {
        tokio::spawn(forward_stderr(server_id.to_string(), stderr));
    }
    let transport = StdioTransport {
        lines: LineTransport::new(stdout, stdin, limits),
        process: ServerProcess { child: Some(child) },
    };
    Ok((transport, pid))
}

/// A stdio server's JSON-RPC stream and its process, stopped when the connection closes.
pub(super) struct StdioTransport {
    lines: LineTransport<ChildStdout, ChildStdin>,
    process: ServerProcess,
}

impl Transport<RoleClient> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.lines.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.lines.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.lines.close_input().await;
        self.process.stop().await;
        Ok(())
    }
}

/// The server's process (group). Stopping it follows the MCP stdio shutdown: its stdin is
/// closed first, then it gets [`defaults::SHUTDOWN_GRACE`] to exit, then SIGTERM and the
/// same grace, then SIGKILL. Dropped without a stop, it is killed.
struct ServerProcess {
    child: Option<Box<dyn ChildWrapper>>,
}

impl ServerProcess {
    async fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if !exited_within_grace(child).await {
            if let Err(error) = child.signal(libc::SIGTERM) {
                tracing::warn!(%error, "cannot send SIGTERM to an MCP server");
            }
            if !exited_within_grace(child).await
                && let Err(error) = Box::into_pin(child.kill()).await
            {
                tracing::warn!(%error, "cannot kill an MCP server");
            }
        }
        self.child = None;
    }
}

async fn exited_within_grace(child: &mut Box<dyn ChildWrapper>) -> bool {
    matches!(
        tokio::time::timeout(defaults::SHUTDOWN_GRACE, child.wait()).await,
        Ok(Ok(_))
    )
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // kill() also reaps the process, so no zombie is left.
            runtime.spawn(async move {
                if let Err(error) = Box::into_pin(child.kill()).await {
                    tracing::warn!(%error, "cannot kill an MCP server");
                }
            });
        }
    }
}

async fn forward_stderr(server_id: String, stderr: tokio::process::ChildStderr) {
    let span = tracing::info_span!("mcp_server_stderr", server_id = %server_id);
    async move {
        let mut lines = tokio::io::BufReader::new(stderr).split(b'\n');
        while let Ok(Some(line)) = lines.next_segment().await {
            let cut = line.len().min(defaults::MAX_SERVER_STDERR_LINE_BYTES);
            let text = String::from_utf8_lossy(&line[..cut]);
            tracing::info!(target: "quiver::mcp::server", server_id = %server_id, "{}", text.trim_end());
        }
    }
    .instrument(span)
    .await
}
