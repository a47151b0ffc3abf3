//! The host's cap on stdio server processes (`max_server_processes`): one permit per
//! running server, taken from the least recently used idle server when the cap is reached.

use tokio::sync::OwnedSemaphorePermit;

use super::slot::ServerSlot;
use super::{McpPool, reaper};
use crate::defaults;
use crate::mcp::{McpError, McpErrorCode};

impl McpPool {
    /// A permit to run one more server process. At the cap, stops the least recently used
    /// server no call is using. When none can be stopped but some permit is held by a
    /// server that is not serving (it died or is being stopped), waits for it to be gone,
    /// within `starting`'s `tool_timeout_ms`; fails at once when every one is busy.
    pub(super) async fn process_permit(
        &self,
        starting: &ServerSlot,
    ) -> Result<OwnedSemaphorePermit, McpError> {
        let max = self.shared.limits.max_server_processes;
        let wait = starting.entry.record.budgets.tool_timeout;
        // Each round either gets a permit or stops a server; a few rounds cover servers
        // that other starting calls take meanwhile.
        for _ in 0..=max {
            if let Ok(permit) = self.shared.processes.clone().try_acquire_owned() {
                return Ok(permit);
            }
            let Some((victim, conn)) = reaper::least_recently_used_idle(&self.shared, starting)
            else {
                if reaper::serving_processes(&self.shared, starting) >= max {
                    break;
                }
                let processes = self.shared.processes.clone();
                match tokio::time::timeout(wait, processes.acquire_owned()).await {
                    Ok(Ok(permit)) => return Ok(permit),
                    Ok(Err(_)) => break,
                    Err(_) => {
                        return Err(McpError::new(
                            McpErrorCode::Unavailable,
                            format!(
                                "cannot start server `{}`: the host's {max} MCP server processes (max_server_processes) were still stopping after {} ms (budgets.tool_timeout_ms)",
                                starting.entry.server_id(),
                                wait.as_millis()
                            ),
                        ));
                    }
                }
            };
            tracing::info!(
                server_id = victim.entry.server_id(),
                starting = starting.entry.server_id(),
                max_server_processes = max,
                "stopping the least recently used idle MCP server to start another"
            );
            conn.close(victim.entry.server_id(), defaults::SHUTDOWN_GRACE)
                .await;
        }
        Err(McpError::new(
            McpErrorCode::Unavailable,
            format!(
                "cannot start server `{}`: the host already runs {max} MCP server processes (its limit, max_server_processes) and every one has a call in flight; raise [mcp] max_server_processes in the host config or HostBuilder::with_max_server_processes",
                starting.entry.server_id()
            ),
        ))
    }
}
