//! The slots that hold each server's connection, counted in flight while calls use them,
//! and how they follow registry snapshots: a changed or removed server's slot is retired
//! (its server stopped once its last call ends), never reused for a current entry.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use super::connecting::Backoff;
use super::health::Health;
use super::{Connection, McpPool};
use crate::mcp::Tool;
use crate::registry::{Launch, Registry, ServerEntry};

pub(super) struct CachedTools {
    pub(super) fetched: Instant,
    pub(super) conn_serial: u64,
    /// How long the listing is fresh: the server's `ttlMs` (SEP-2549), at most the host's
    /// tools TTL; the host's TTL when the server sent none.
    pub(super) ttl: Duration,
    /// `Some(principal)` when the server marked the listing `cacheScope: private`: it is
    /// served to that principal only.
    pub(super) private_to: Option<Option<Arc<str>>>,
    pub(super) tools: Arc<[Tool]>,
    /// Tools the listing left out for invalid `x-mcp-header` declarations, with why.
    pub(super) left_out: ToolsLeftOut,
}

/// The tools a listing left out, each with why: a snapshot of the connection's
/// [`LeftOut`](crate::mcp::tool_headers::LeftOut) taken with the listing.
pub(crate) type ToolsLeftOut = Arc<[(String, String)]>;

impl CachedTools {
    /// Whether this listing may answer `principal` on connection `conn_serial` now.
    pub(super) fn serves(&self, conn_serial: u64, principal: Option<&str>) -> bool {
        self.conn_serial == conn_serial
            && self.fetched.elapsed() < self.ttl
            && self
                .private_to
                .as_ref()
                .is_none_or(|owner| owner.as_deref() == principal)
    }
}

pub(super) struct ServerSlot {
    pub(super) entry: Arc<ServerEntry>,
    /// Whom the connection acts for, when the server's credential is a user's grant
    /// (then each principal has a slot of its own); else `None`, one slot for all.
    pub(super) principal: Option<Arc<str>>,
    pub(super) conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    pub(super) permits: Semaphore,
    pub(super) tools: Mutex<Option<CachedTools>>,
    pub(super) connections: AtomicU64,
    /// Shared with every slot this server had and will have.
    pub(super) health: Arc<Health>,
    /// The health token of the slot's connection (see [`Health::connected`]).
    pub(super) health_token: AtomicU64,
    /// After failed connection attempts: when the next may start, and why the last failed.
    pub(super) backoff: Mutex<Option<Backoff>>,
    pub(super) activity: Mutex<Activity>,
    /// Replaced by a changed record: stop its server as soon as no call uses it.
    pub(super) retired: AtomicBool,
    /// Wakes the reaper (when a retired slot's last call ends).
    pub(super) reaper: Arc<Notify>,
}

/// Calls using a slot, and when its last call ended.
pub(super) struct Activity {
    pub(super) in_flight: u32,
    pub(super) last_used: Instant,
}

/// One call's use of a slot: counted in flight from before it connects until it is done
/// (or dropped), so no idle stop or eviction can take the server from under it.
pub(super) struct InFlight {
    pub(super) slot: Arc<ServerSlot>,
}

impl ServerSlot {
    /// The listing cached for `principal` on `conn`, if it is fresh and no `list_changed`
    /// outdated it, with the tools it left out.
    pub(super) fn fresh_tools(
        &self,
        conn: &Connection,
        principal: Option<&str>,
    ) -> Option<(Arc<[Tool]>, ToolsLeftOut)> {
        if conn.tools_stale.load(Ordering::SeqCst) {
            return None;
        }
        let cache = self.tools.lock().unwrap_or_else(|e| e.into_inner());
        let cached = cache
            .as_ref()
            .filter(|cached| cached.serves(conn.serial, principal))?;
        Some((cached.tools.clone(), cached.left_out.clone()))
    }

    pub(super) fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        let mut activity = self.activity();
        activity.in_flight = activity.in_flight.saturating_add(1);
        activity.last_used = Instant::now();
        InFlight { slot: self.clone() }
    }

    /// How long the server may sit unused before it is stopped; `None`: forever.
    pub(super) fn idle_timeout(&self, host_default: Duration) -> Option<Duration> {
        let own = self
            .entry
            .record
            .stdio
            .as_ref()
            .and_then(|stdio| stdio.idle_timeout_ms)
            .map(Duration::from_millis);
        Some(own.unwrap_or(host_default)).filter(|t| !t.is_zero())
    }

    /// Takes the slot's server process out of service if no call uses it and, with
    /// `min_idle`, none has for that long. Never waits: a slot that is busy connecting is
    /// not idle.
    pub(super) fn take_if_idle(&self, min_idle: Option<Duration>) -> Option<Arc<Connection>> {
        let mut conn = self.conn.try_lock().ok()?;
        if !conn.as_ref()?.is_stdio() {
            return None;
        }
        let activity = self.activity();
        let idle_enough = min_idle.is_none_or(|min| activity.last_used.elapsed() >= min);
        if activity.in_flight > 0 || !idle_enough {
            return None;
        }
        self.health
            .stopped(self.health_token.load(Ordering::SeqCst));
        conn.take()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut activity = self.slot.activity();
        activity.in_flight = activity.in_flight.saturating_sub(1);
        activity.last_used = Instant::now();
        if activity.in_flight == 0 && self.slot.retired.load(Ordering::SeqCst) {
            self.slot.reaper.notify_one();
        }
    }
}

/// The slot map's key: the server id, and the principal for a per-principal slot (after
/// a NUL, which neither may contain). Borrowed without a principal: the common lookup
/// allocates nothing.
pub(super) fn slot_key<'a>(server_id: &'a str, principal: Option<&str>) -> Cow<'a, str> {
    match principal {
        Some(principal) => Cow::Owned(format!("{server_id}\0{principal}")),
        None => Cow::Borrowed(server_id),
    }
}

impl McpPool {
    /// Enters the slot for `entry` (counted in flight until the guard drops). A changed
    /// launch config replaces the old slot, whose server is stopped once its last call is
    /// done. An entry from a registry snapshot older than the one the pool follows
    /// ([`apply_registry`](Self::apply_registry)) never replaces the current slot: it reuses
    /// a retired slot that launches the same way, or gets one of its own, retired from the
    /// start, so a task still on that snapshot is served without stopping anyone's server.
    /// A current entry never uses a retired slot (the registry may have changed back to
    /// it): its server would be stopped under the current snapshot's calls.
    pub(super) fn enter(&self, entry: &Arc<ServerEntry>, principal: Option<&str>) -> InFlight {
        let principal = principal.filter(|_| self.is_per_principal(entry));
        let key = slot_key(entry.server_id(), principal);
        let mut slots = self.shared.slots();
        let server_id = entry.server_id();
        if let Some(slot) = slots.get(&*key)
            && (Arc::ptr_eq(&slot.entry, entry) || slot.entry.connects_like(entry))
        {
            return slot.begin();
        }
        let outdated = self.is_outdated(entry);
        let mut retired = self.shared.retired();
        if outdated
            && let Some(slot) = retired.iter().find(|slot| {
                slot.entry.server_id() == server_id
                    && slot.principal.as_deref() == principal
                    && slot.entry.connects_like(entry)
            })
        {
            return slot.begin();
        }
        let slot = Arc::new(ServerSlot {
            entry: entry.clone(),
            principal: principal.map(Arc::from),
            conn: tokio::sync::Mutex::new(None),
            permits: Semaphore::new(entry.record.budgets.max_concurrency as usize),
            tools: Mutex::new(None),
            connections: AtomicU64::new(0),
            health: self
                .shared
                .health()
                .entry(server_id.to_owned())
                .or_default()
                .clone(),
            health_token: AtomicU64::new(0),
            backoff: Mutex::new(None),
            activity: Mutex::new(Activity {
                in_flight: 0,
                last_used: Instant::now(),
            }),
            retired: AtomicBool::new(false),
            reaper: self.shared.reaper_wake.clone(),
        });
        // Begun before anyone else can see the slot, so the reaper never drops it unused.
        let in_flight = slot.begin();
        if outdated {
            slot.retired.store(true, Ordering::SeqCst);
            retired.push(slot);
        } else if let Some(old) = slots.insert(key.into_owned(), slot) {
            old.retired.store(true, Ordering::SeqCst);
            retired.push(old);
            self.shared.reaper_wake.notify_one();
        }
        in_flight
    }

    /// The server's listing and what it left out, when the cache answers without a wait:
    /// the slot has a live connection nobody is opening, and a fresh listing for it that
    /// no `list_changed` made stale. Counts as a use of the server, as a listing does.
    /// `None`: ask [`Self::list_tools`], which connects and lists as needed.
    pub(crate) fn cached_tools(
        &self,
        entry: &Arc<ServerEntry>,
        principal: Option<&str>,
    ) -> Option<(Arc<[Tool]>, ToolsLeftOut)> {
        let slot = self
            .slot_of(entry, principal)
            .filter(|slot| Arc::ptr_eq(&slot.entry, entry) || slot.entry.connects_like(entry))?;
        self.rules()
            .auth
            .check_subject(&slot.entry, slot.principal.as_deref())
            .ok()?;
        let conn = slot
            .conn
            .try_lock()
            .ok()?
            .as_ref()
            .filter(|conn| conn.is_alive())?
            .clone();
        let listed = slot.fresh_tools(&conn, principal)?;
        slot.activity().last_used = Instant::now();
        Some(listed)
    }

    /// Whether the server's credential is a user's grant, so each principal connects
    /// with its own.
    /// The tools `entry`'s last listing (for `principal`) left out for invalid
    /// `x-mcp-header` declarations, each with the reason; empty before any listing.
    pub(crate) fn left_out(&self, entry: &ServerEntry, principal: Option<&str>) -> ToolsLeftOut {
        self.slot_of(entry, principal)
            .and_then(|slot| {
                let cache = slot.tools.lock().unwrap_or_else(|e| e.into_inner());
                cache.as_ref().map(|cached| cached.left_out.clone())
            })
            .unwrap_or_else(|| Arc::from([]))
    }

    /// The slot `entry` has now for `principal` (whose own slot, on a server with
    /// per-principal grants), if any.
    fn slot_of(&self, entry: &ServerEntry, principal: Option<&str>) -> Option<Arc<ServerSlot>> {
        let principal = principal.filter(|_| self.is_per_principal(entry));
        self.shared
            .slots()
            .get(&*slot_key(entry.server_id(), principal))
            .cloned()
    }

    fn is_per_principal(&self, entry: &ServerEntry) -> bool {
        entry
            .record
            .http
            .as_ref()
            .and_then(|h| h.auth_ref.as_deref())
            .is_some_and(|auth_ref| self.rules().auth.is_per_principal(auth_ref))
    }

    /// Whether `entry` is from an older registry snapshot than the pool follows: the
    /// current one lacks its server or launches it differently.
    fn is_outdated(&self, entry: &ServerEntry) -> bool {
        let registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        registry.as_ref().is_some_and(|registry| {
            registry
                .get(entry.server_id())
                .is_none_or(|current| !current.connects_like(entry))
        })
    }

    /// Follows a new registry snapshot: the servers `registry` no longer has, or now
    /// launches differently, are retired (each stopped once no call uses it); the others
    /// keep their connection. Returns the ids retired.
    pub(crate) fn apply_registry(&self, registry: &Arc<Registry>) -> Vec<String> {
        let mut slots = self.shared.slots();
        *self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(registry.clone());
        let stale: Vec<String> = slots
            .iter()
            .filter(|(_, slot)| {
                registry
                    .get(slot.entry.server_id())
                    .is_none_or(|entry| !slot.entry.connects_like(entry))
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut retired = self.shared.retired();
        for id in &stale {
            if let Some(old) = slots.remove(id) {
                old.retired.store(true, Ordering::SeqCst);
                // Only a server process needs stopping; a remote connection closes with
                // its last user. A stdio slot with a call in flight is kept even without
                // a connection: that call may be about to start its process. What it
                // launches is the entry's, whatever it holds now.
                let stdio = matches!(old.entry.launch, Ok(Launch::Stdio { .. }));
                let unused = old.activity().in_flight == 0
                    && old.conn.try_lock().is_ok_and(|conn| conn.is_none());
                if stdio && !unused {
                    retired.push(old);
                }
            }
        }
        drop((slots, retired));
        if !stale.is_empty() {
            self.shared.reaper_wake.notify_one();
        }
        stale
    }
}
