//! Starting a stdio server: a child process confined the way a third-party program should be.
//!
//! It gets only a minimal environment plus what its record grants (so host secrets do not
//! leak into it), runs in its own process group (so killing it kills its children too),
//! dies with the host (`PR_SET_PDEATHSIG`, `KillOnDrop`), and its stderr goes to the host
//! log under its server id.

use std::collections::BTreeMap;
use std::process::Stdio;

use rmcp::transport::TokioChildProcess;
use tokio::io::AsyncBufReadExt;
use tracing::Instrument;

use super::unavailable;
use crate::defaults;
use crate::mcp::error::McpError;

/// Host variables a server process inherits; everything else must be granted by its
/// record's `env` / `env_from`, so host secrets do not leak into third-party servers.
const SERVER_BASE_ENV: [&str; 6] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR"];

/// Spawns `command` for `server_id`; returns its transport and its pid.
pub(super) fn spawn(
    server_id: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&String>,
) -> Result<(TokioChildProcess, Option<u32>), McpError> {
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
    let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
    wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
    wrapped.wrap(process_wrap::tokio::KillOnDrop);
    let (transport, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            unavailable(format!(
                "server `{server_id}`: cannot start `{command}`: {e}"
            ))
        })?;
    let pid = transport.id();
    if let Some(stderr) = stderr {
        tokio::spawn(forward_stderr(server_id.to_owned(), stderr));
    }
    Ok((transport, pid))
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
