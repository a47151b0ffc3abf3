//! What the pool reports of itself: each server's connection state and health, and the
//! use of the host-wide limits.

use super::McpPool;
use super::health::{Health, ServerState};
use super::slot::ServerSlot;

/// Connection state and health of one server, for diagnostics and `quiver mcp status`.
/// Counters cover the host's whole life, across restarts and registry changes. New fields
/// may be added.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    pub server_id: String,
    pub state: ServerState,
    /// The live server process, if connected over stdio.
    pub pid: Option<u32>,
    /// Connections made so far.
    pub connections: u64,
    /// Connections made after the previous one was lost (the process died, the transport
    /// broke); idle stops and evictions are not counted.
    pub reconnects: u64,
    /// The last server-side failure (connect, transport, timeout on the wire, JSON-RPC
    /// error other than "method not found"), with the server's secrets redacted, control
    /// characters removed and cut to
    /// [`MAX_SERVER_ERROR_BYTES`](crate::defaults::MAX_SERVER_ERROR_BYTES). A tool's own
    /// error result (`isError`) is an answer, not a failure.
    pub last_error: Option<String>,
    /// When the server last connected or answered (unix seconds).
    pub last_success: Option<u64>,
    /// Tools in its last `tools/list` (before any filter); `None` until listed.
    pub tool_count: Option<u64>,
    /// Latency percentiles of its last
    /// [`SERVER_LATENCY_WINDOW`](crate::defaults::SERVER_LATENCY_WINDOW) answered
    /// `tools/call`s (time on the wire, not waiting for permits); `None` before any.
    pub latency_p50_ms: Option<u64>,
    pub latency_p95_ms: Option<u64>,
    /// Calls (`tools/call`, `tools/list`) using the server now, those still waiting for a
    /// connection or a permit included.
    pub calls_in_flight: u32,
    /// Milliseconds since the server's last call ended; 0 while calls are in flight.
    pub idle_ms: u64,
}

/// The pool's use of its host-wide limits, for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Calls holding one of the host's call permits.
    pub calls_in_flight: usize,
    pub max_concurrent_calls: usize,
    /// Stdio server processes running (or still stopping).
    pub server_processes: usize,
    pub max_server_processes: usize,
}

impl ServerSlot {
    /// What `status()` shows of this slot. The connection is looked at only if no connect
    /// holds it; otherwise the health's own record stands.
    fn status(&self) -> ServerStatus {
        let seen = self
            .conn
            .try_lock()
            .ok()
            .map(|c| c.as_ref().filter(|c| c.is_alive()).map(|c| c.pid()));
        let alive = seen.map(|live| live.is_some());
        let mut status = status_of(self.entry.server_id(), &self.health, alive);
        status.pid = seen.flatten().flatten();
        let activity = self.activity();
        status.calls_in_flight = activity.in_flight;
        status.idle_ms = if activity.in_flight > 0 {
            0
        } else {
            u64::try_from(activity.last_used.elapsed().as_millis()).unwrap_or(u64::MAX)
        };
        status
    }
}

/// The status of a server from its health alone (no slot: no pid, nothing in flight).
fn status_of(server_id: &str, health: &Health, alive: Option<bool>) -> ServerStatus {
    let health = health.snapshot(alive);
    ServerStatus {
        server_id: server_id.to_owned(),
        state: health.state,
        pid: None,
        connections: health.connects,
        reconnects: health.reconnects,
        last_error: health.last_error,
        last_success: health.last_success,
        tool_count: health.tool_count,
        latency_p50_ms: health.latency_p50_ms,
        latency_p95_ms: health.latency_p95_ms,
        calls_in_flight: 0,
        idle_ms: 0,
    }
}

impl McpPool {
    /// The status of `server_id`: that of its slot if it has one, else what its health
    /// remembers, else an `idle` server with nothing counted (never used).
    pub(crate) fn server_status(&self, server_id: &str) -> ServerStatus {
        let slot = self.shared.slots().get(server_id).cloned();
        if let Some(slot) = slot {
            return slot.status();
        }
        let health = self.shared.health().get(server_id).cloned();
        status_of(server_id, &health.unwrap_or_default(), None)
    }

    /// Connection state of every server used so far.
    pub(crate) fn status(&self) -> Vec<ServerStatus> {
        let mut out: Vec<ServerStatus> = self
            .shared
            .slots()
            .values()
            .map(|slot| slot.status())
            .collect();
        out.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        // A server with per-principal connections shares one health: shown once.
        out.dedup_by(|a, b| a.server_id == b.server_id);
        out
    }

    /// How much of the host-wide limits is in use.
    pub(crate) fn usage(&self) -> PoolUsage {
        let limits = &self.shared.limits;
        PoolUsage {
            calls_in_flight: limits
                .max_concurrent_calls
                .saturating_sub(self.shared.calls.available_permits()),
            max_concurrent_calls: limits.max_concurrent_calls,
            server_processes: limits
                .max_server_processes
                .saturating_sub(self.shared.processes.available_permits()),
            max_server_processes: limits.max_server_processes,
        }
    }
}
