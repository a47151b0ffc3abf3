//! What the pool remembers of each server's health: connects and reconnects, the last error
//! and success, the tool count, and the latencies of recent calls.
//!
//! It is kept per server id, not per connection or slot, so counters only grow (metrics
//! read them as Prometheus counters) across restarts, registry changes and shutdowns. Whether
//! the server is up follows only its newest connection: each connection gets a token when
//! made, and a stop or loss of an older one (a slot replaced by a registry change, stopped
//! once its last call ends) leaves the newer one up. A tool's own error result (`isError`)
//! is an answer, not a server failure: it counts as a success here, and only failures of
//! the server or its transport (it could not be started or reached, went away, timed out on
//! the wire, answered a JSON-RPC error other than "method not found") are failures.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::defaults;
use crate::text::{cut, printable};

/// A server's state, as health reports show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// Connected, and no server-side failure in the last
    /// [`SERVER_DEGRADED_FOR`](defaults::SERVER_DEGRADED_FOR).
    Connected,
    /// Connected, but a server-side failure (a lost connection, a timeout on the wire, a
    /// JSON-RPC error) happened within the last [`SERVER_DEGRADED_FOR`](defaults::SERVER_DEGRADED_FOR).
    Degraded,
    /// Not connected because something failed: the last connection attempt failed (calls
    /// fail fast during the reconnect backoff), or the connection was lost (the process
    /// died, the transport broke) and no call has reconnected it yet.
    Down,
    /// Not connected, and nothing failed: never used, or stopped while idle, evicted for
    /// another server, or shut down. The next call connects it.
    Idle,
}

/// One server's health, shared by the slots that serve it over time.
#[derive(Default)]
pub(super) struct Health(Mutex<State>);

#[derive(Default)]
struct State {
    connects: u64,
    reconnects: u64,
    /// The token of the connection that is up (made and not since lost or stopped).
    up: Option<u64>,
    /// The last connection attempt failed.
    connect_failed: bool,
    /// The last connection was lost: the next connect is a reconnect.
    lost: bool,
    last_error: Option<String>,
    last_failure: Option<Instant>,
    last_success: Option<SystemTime>,
    tool_count: Option<u64>,
    /// Milliseconds of recent answered calls, oldest first.
    latencies: VecDeque<u32>,
}

/// A copy of a server's health for a status report.
pub(super) struct Snapshot {
    pub(super) state: ServerState,
    pub(super) connects: u64,
    pub(super) reconnects: u64,
    pub(super) last_error: Option<String>,
    pub(super) last_success: Option<u64>,
    pub(super) tool_count: Option<u64>,
    pub(super) latency_p50_ms: Option<u64>,
    pub(super) latency_p95_ms: Option<u64>,
}

impl Health {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection was made; returns its token, for [`lost`](Self::lost) and
    /// [`stopped`](Self::stopped). It is now the server's connection, unless it serves a
    /// retired slot (a task on an older registry snapshot): that one is counted, but its
    /// stop or loss says nothing of the current connection (its token is 0, never up).
    pub(super) fn connected(&self, retired: bool) -> u64 {
        let mut state = self.state();
        state.connects = state.connects.saturating_add(1);
        if retired {
            return 0;
        }
        if state.lost {
            state.reconnects = state.reconnects.saturating_add(1);
        }
        state.lost = false;
        state.connect_failed = false;
        state.up = Some(state.connects);
        state.last_success = Some(SystemTime::now());
        state.connects
    }

    /// A connection attempt failed with `error` (already redacted). A connection made
    /// since (by another slot) stays up.
    pub(super) fn connect_failed(&self, error: &str) {
        let mut state = self.state();
        state.connect_failed = true;
        state.fail(error);
    }

    /// The connection `token` was lost (found dead, or its transport failed a call). An
    /// older connection's loss changes nothing: the server's state is its newest one's.
    pub(super) fn lost(&self, token: u64) {
        let mut state = self.state();
        if state.up == Some(token) {
            state.lost = true;
            state.up = None;
            state.last_failure = Some(Instant::now());
        }
    }

    /// The connection `token` was stopped on purpose (idle, evicted, replaced, shut down).
    pub(super) fn stopped(&self, token: u64) {
        let mut state = self.state();
        if state.up == Some(token) {
            state.up = None;
        }
    }

    /// The server answered a call (a tool error included) after `latency`.
    pub(super) fn answered(&self, latency: Duration) {
        let mut state = self.state();
        state.last_success = Some(SystemTime::now());
        if state.latencies.len() >= defaults::SERVER_LATENCY_WINDOW {
            state.latencies.pop_front();
        }
        let ms = u32::try_from(latency.as_millis()).unwrap_or(u32::MAX);
        state.latencies.push_back(ms);
    }

    /// The server listed `count` tools.
    pub(super) fn listed(&self, count: usize) {
        let mut state = self.state();
        state.last_success = Some(SystemTime::now());
        state.tool_count = Some(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// A call failed on the server's side with `error` (already redacted).
    pub(super) fn failed(&self, error: &str) {
        self.state().fail(error);
    }

    /// The health now; `alive` is what the slot sees of its connection, when it can look.
    pub(super) fn snapshot(&self, alive: Option<bool>) -> Snapshot {
        let state = self.state();
        let up = state.up.is_some() && alive.unwrap_or(true);
        let recently_failed = state
            .last_failure
            .is_some_and(|at| at.elapsed() < defaults::SERVER_DEGRADED_FOR);
        let state_now = match (up, state.connect_failed || state.lost || state.up.is_some()) {
            (true, _) if recently_failed => ServerState::Degraded,
            (true, _) => ServerState::Connected,
            // `up` but no longer alive: the process died unnoticed so far.
            (false, true) => ServerState::Down,
            (false, false) => ServerState::Idle,
        };
        let (p50, p95) = percentiles(&state.latencies);
        Snapshot {
            state: state_now,
            connects: state.connects,
            reconnects: state.reconnects,
            last_error: state.last_error.clone(),
            last_success: state.last_success.map(|t| {
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            }),
            tool_count: state.tool_count,
            latency_p50_ms: p50,
            latency_p95_ms: p95,
        }
    }
}

impl State {
    fn fail(&mut self, error: &str) {
        self.last_failure = Some(Instant::now());
        // Shown on terminals (`quiver mcp status`): no escapes from what a server wrote.
        self.last_error = Some(printable(cut(error, defaults::MAX_SERVER_ERROR_BYTES)));
    }
}

/// The 50th and 95th percentiles (nearest rank) of `latencies`.
fn percentiles(latencies: &VecDeque<u32>) -> (Option<u64>, Option<u64>) {
    if latencies.is_empty() {
        return (None, None);
    }
    let mut sorted: Vec<u32> = latencies.iter().copied().collect();
    sorted.sort_unstable();
    let rank = |p: usize| {
        // Nearest rank: ceil(p/100 * n), 1-based.
        let index = (p * sorted.len()).div_ceil(100).saturating_sub(1);
        sorted.get(index).map(|&ms| u64::from(ms))
    };
    (rank(50), rank(95))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_makes_the_next_connect_a_reconnect_and_idle_stops_do_not() {
        let health = Health::default();
        assert_eq!(health.snapshot(None).state, ServerState::Idle);
        let first = health.connected(false);
        assert_eq!(health.snapshot(Some(true)).state, ServerState::Connected);
        assert_eq!(
            health.snapshot(Some(false)).state,
            ServerState::Down,
            "a dead process is down before anyone notices"
        );
        health.stopped(first);
        assert_eq!(health.snapshot(None).state, ServerState::Idle);
        let second = health.connected(false);
        health.lost(second);
        assert_eq!(health.snapshot(None).state, ServerState::Down);
        health.connect_failed("spawn failed");
        health.connected(false);
        let snapshot = health.snapshot(Some(true));
        assert_eq!((snapshot.connects, snapshot.reconnects), (3, 1));
        assert_eq!(snapshot.state, ServerState::Degraded, "failed a moment ago");
        assert_eq!(snapshot.last_error.as_deref(), Some("spawn failed"));
    }

    #[test]
    fn stopping_or_losing_an_older_connection_leaves_the_newer_one_up() {
        let health = Health::default();
        let old = health.connected(false);
        // A registry change: a new slot connects while a call still runs on the old one.
        let new = health.connected(false);
        health.stopped(old);
        assert_eq!(health.snapshot(Some(true)).state, ServerState::Connected);
        health.lost(old);
        let snapshot = health.snapshot(Some(true));
        assert_eq!(snapshot.state, ServerState::Connected);
        assert_eq!(snapshot.reconnects, 0, "the old one's loss is no reconnect");
        health.connect_failed("an old snapshot's slot could not start");
        assert_eq!(health.snapshot(Some(true)).state, ServerState::Degraded);
        health.stopped(new);
        assert_eq!(health.snapshot(None).state, ServerState::Down);
    }

    #[test]
    fn latencies_are_a_bounded_window_and_errors_are_cut() {
        let health = Health::default();
        assert_eq!(health.snapshot(None).latency_p50_ms, None);
        for ms in 1..=100 {
            health.answered(Duration::from_millis(ms));
        }
        let snapshot = health.snapshot(None);
        assert_eq!(
            (snapshot.latency_p50_ms, snapshot.latency_p95_ms),
            (Some(50), Some(95))
        );
        for _ in 0..defaults::SERVER_LATENCY_WINDOW {
            health.answered(Duration::from_millis(7));
        }
        let snapshot = health.snapshot(None);
        assert_eq!(
            (snapshot.latency_p50_ms, snapshot.latency_p95_ms),
            (Some(7), Some(7)),
            "the old calls left the window"
        );
        health.failed(&"é".repeat(defaults::MAX_SERVER_ERROR_BYTES));
        let error = health.snapshot(None).last_error.unwrap();
        assert!(error.len() <= defaults::MAX_SERVER_ERROR_BYTES && error.starts_with('é'));
        health.failed("boom\u{1b}[2J\nagain\u{202e}");
        assert_eq!(
            health.snapshot(None).last_error.as_deref(),
            Some(r"boom\x1b[2J\x0aagain\u{202e}"),
            "terminal escapes shown escaped"
        );
    }
}
