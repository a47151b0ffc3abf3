//! Stopping stdio servers nobody uses: the background task that stops servers idle for
//! their idle timeout (and servers of replaced records once their last call ends), and
//! the choice of whom to stop when the process cap is reached. It also drops the
//! per-principal slots (user grants, token exchange) no call used for the idle timeout,
//! with their connections, so a host serving many users keeps only its active ones.
//!
//! The reaper sleeps until the earliest moment some server could have been idle long
//! enough, so it costs nothing between; a new server or the end of a replaced server's
//! last call wakes it to look again. It holds the pool only weakly and ends with it.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Connection, ServerSlot, Shared};
use crate::defaults;

pub(super) async fn run(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = match shared.upgrade() {
            Some(shared) => reap(&shared).await,
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Stops every server idle past its timeout and every replaced server no call uses;
/// returns when to look again (`None`: only when woken).
async fn reap(shared: &Shared) -> Option<Instant> {
    let host_default = shared.limits.server_idle_timeout;
    let mut stopping = Vec::new();
    let mut next = reap_principals(shared, host_default, &mut stopping);
    let slots: Vec<Arc<ServerSlot>> = shared
        .slots()
        .values()
        .filter(|slot| slot.principal.is_none())
        .cloned()
        .collect();
    for slot in slots {
        let Some(idle) = slot.idle_timeout(host_default) else {
            continue;
        };
        if let Some(conn) = slot.take_if_idle(Some(idle)) {
            stopping.push((slot, conn, "idle"));
            continue;
        }
        let due = match slot.conn.try_lock() {
            Ok(conn) if !conn.as_ref().is_some_and(|c| c.is_stdio()) => continue,
            Ok(_) => {
                let activity = slot.activity();
                // A slot in use is due no sooner than `idle` after its current calls end.
                let from = if activity.in_flight > 0 {
                    Instant::now()
                } else {
                    activity.last_used
                };
                from.checked_add(idle)
            }
            // Connecting or being used right now.
            Err(_) => Instant::now().checked_add(idle),
        };
        next = match (next, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    shared.retired().retain(|slot| {
        if let Some(conn) = slot.take_if_idle(None) {
            stopping.push((slot.clone(), conn, "replaced"));
            return false;
        }
        // Kept while a call uses it or its server may still run; its last call ending
        // wakes the reaper.
        if slot.activity().in_flight > 0 {
            return true;
        }
        match slot.conn.try_lock() {
            Ok(conn) => conn.as_ref().is_some_and(|c| c.is_stdio()),
            Err(_) => true,
        }
    });
    let closing = stopping.into_iter().map(|(slot, conn, why)| async move {
        let server_id = slot.entry.server_id();
        tracing::info!(
            server_id,
            why,
            idle_ms = idle_ms(&slot),
            "stopping an MCP server nobody uses"
        );
        conn.close(server_id, defaults::SHUTDOWN_GRACE).await;
    });
    futures::future::join_all(closing).await;
    next
}

/// Takes out of the pool every per-principal slot no call has used for its idle timeout,
/// adding its connection to `stopping`; returns when the next one could be due. Done
/// under the slot map's lock, which a call holds to enter a slot, so no call can enter a
/// slot being dropped (it gets a new one).
fn reap_principals(
    shared: &Shared,
    host_default: Duration,
    stopping: &mut Vec<(Arc<ServerSlot>, Arc<Connection>, &'static str)>,
) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    let mut due = |at: Option<Instant>| {
        next = match (next, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    };
    shared.slots().retain(|_, slot| {
        if slot.principal.is_none() {
            return true;
        }
        let Some(idle) = slot.idle_timeout(host_default) else {
            return true;
        };
        let activity = slot.activity();
        if activity.in_flight > 0 {
            due(Instant::now().checked_add(idle));
            return true;
        }
        if activity.last_used.elapsed() < idle {
            due(activity.last_used.checked_add(idle));
            return true;
        }
        drop(activity);
        // Connecting right now: looked at again later.
        let Ok(mut conn) = slot.conn.try_lock() else {
            due(Instant::now().checked_add(idle));
            return true;
        };
        if let Some(conn) = conn.take() {
            slot.health
                .stopped(slot.health_token.load(std::sync::atomic::Ordering::SeqCst));
            stopping.push((slot.clone(), conn, "idle principal"));
        }
        false
    });
    next
}

fn idle_ms(slot: &ServerSlot) -> u64 {
    let elapsed: Duration = slot.activity().last_used.elapsed();
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Takes the server process no call uses that was used least recently, other than
/// `starting`'s, out of service; replaced servers go first.
pub(super) fn least_recently_used_idle(
    shared: &Shared,
    starting: &ServerSlot,
) -> Option<(Arc<ServerSlot>, Arc<Connection>)> {
    let retired: Vec<Arc<ServerSlot>> = shared.retired().clone();
    let mut current: Vec<Arc<ServerSlot>> = shared.slots().values().cloned().collect();
    current.sort_by_key(|slot| slot.activity().last_used);
    retired
        .into_iter()
        .chain(current)
        .filter(|slot| !std::ptr::eq(slot.as_ref(), starting))
        .find_map(|slot| {
            let conn = slot.take_if_idle(None)?;
            Some((slot, conn))
        })
}

/// Server processes serving a slot now: live stdio connections, plus slots busy
/// connecting (which may hold a permit), other than `starting`. A held permit beyond these
/// belongs to a server that died or is being stopped, and comes back soon.
pub(super) fn serving_processes(shared: &Shared, starting: &ServerSlot) -> usize {
    let retired: Vec<Arc<ServerSlot>> = shared.retired().clone();
    let current: Vec<Arc<ServerSlot>> = shared.slots().values().cloned().collect();
    retired
        .iter()
        .chain(&current)
        .filter(|slot| !std::ptr::eq(slot.as_ref(), starting))
        .filter(|slot| match slot.conn.try_lock() {
            Ok(conn) => conn.as_ref().is_some_and(|c| c.is_stdio() && c.is_alive()),
            Err(_) => true,
        })
        .count()
}
