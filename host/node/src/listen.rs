//! The node's accept loop. `axum::serve` has no header timeout and no connection cap, so a
//! client could hold connections open forever by sending headers slowly, or open them
//! without end. Here each connection needs a permit (past the cap the kernel's backlog
//! waits), one client address may hold only a share of them (past it the connection is
//! closed at once), its headers (and, on a kept-alive connection, the next request's) must
//! arrive within the header timeout, its read buffer is small, and a stop lets requests in
//! flight finish for a moment before the rest are cut. A connection may upgrade to a
//! WebSocket (a task's user streams, [`crate::streams`]); the session then runs on its own
//! task and takes the connection's [`Connection`] with it: it keeps counting against the
//! node's connection cap and its client's share, and it ends when the node stops.
//! Connections are tasks of a [`JoinSet`] that the stop aborts and awaits, so no handler
//! outlives [`serve`] (and so none runs after the node has shut its host down); the stop
//! also waits, for the same grace, for upgraded sessions to close.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::task::JoinSet;
use tower_layer::Layer;

use crate::defaults;

/// What one connection, and one client, may hold.
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) max_per_ip: usize,
    pub(crate) header_timeout: Duration,
}

/// One open connection's places (a permit of the node's connection cap and one of its
/// client address's share) and the node's stop signal, in every request's extensions. The
/// places are given back when the connection and every session it upgraded to have ended.
#[derive(Clone)]
pub(crate) struct Connection(Arc<Held>);

struct Held {
    _permit: OwnedSemaphorePermit,
    _peer: PeerSlot,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    /// Resolves once the node stops serving.
    pub(crate) async fn stopping(&self) {
        let mut stopping = self.0.stopping.clone();
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }
}

/// Serves `router` on `listener` until `stop` fires (or its sender is dropped).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut stop: oneshot::Receiver<()>,
) {
    // hyper-util's GracefulShutdown cannot watch a connection that may upgrade, so each
    // connection task watches this instead.
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let max_connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max_connections));
    let peers = Peers::new(limits.max_per_ip);
    let mut connections = JoinSet::new();
    loop {
        // Reap ended connections so the set stays as small as the open ones.
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::debug!("accept failed: {e}");
                    tokio::time::sleep(defaults::SERVE_ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Some(peer_slot) = peers.admit(peer.ip()) else {
            tracing::debug!(peer = %peer.ip(), "connection closed: too many from this address");
            continue;
        };
        // Small JSON answers must not wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let held = Connection(Arc::new(Held {
            _permit: permit,
            _peer: peer_slot,
            stopping: stopping_rx.clone(),
        }));
        let service = axum::Extension(held.clone()).layer(router.clone());
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(defaults::SERVE_MAX_BUF_BYTES)
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service))
            // A task's user streams upgrade to a WebSocket (`streams`).
            .with_upgrades();
        let mut stopping = stopping_rx.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                _ = stopping.changed() => {
                    // Requests in flight finish; the connection is not kept alive.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!("connection ended: {e}");
            }
            drop(held);
        });
    }
    drop(listener);
    let _ = stopping_tx.send(true);
    // Every place back means every connection and upgraded session has ended.
    let all_places = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let finished = async {
        while connections.join_next().await.is_some() {}
        let _ = permits.acquire_many(all_places).await;
    };
    if tokio::time::timeout(defaults::SERVE_HTTP_SHUTDOWN_GRACE, finished)
        .await
        .is_err()
    {
        tracing::debug!(
            open = connections.len(),
            "requests still open after the shutdown grace were cut"
        );
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Open connections per client address.
#[derive(Clone)]
struct Peers {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One open connection of a client; dropping it gives the place back.
struct PeerSlot {
    peers: Peers,
    key: IpAddr,
}

impl Peers {
    fn new(max: usize) -> Self {
        Self {
            open: Arc::default(),
            max: max.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection from `ip`, unless it holds its share already.
    fn admit(&self, ip: IpAddr) -> Option<PeerSlot> {
        let key = client_key(ip);
        let mut open = self.lock();
        let count = open.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count = count.saturating_add(1);
        Some(PeerSlot {
            peers: self.clone(),
            key,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.lock();
        if let Some(count) = open.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The client `ip` counts as: itself for IPv4 (also when mapped into IPv6), its /64 for
/// IPv6, since one host usually holds a whole /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let [a, b, c, d, ..] = v6.segments();
            IpAddr::V6(Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_its_share_and_a_place_comes_back_when_closed() {
        let peers = Peers::new(2);
        let me: IpAddr = "10.0.0.1".parse().expect("ip");
        let first = peers.admit(me).expect("first");
        let _second = peers.admit(me).expect("second");
        assert!(peers.admit(me).is_none(), "a third is over the share");
        assert!(peers.admit("10.0.0.2".parse().expect("ip")).is_some());
        drop(first);
        assert!(
            peers.admit(me).is_some(),
            "a closed connection frees its place"
        );
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(
            client_key(a),
            client_key("2001:db8:1:3::1".parse().expect("ip"))
        );
        assert_eq!(
            client_key("::ffff:10.0.0.1".parse().expect("ip")),
            client_key("10.0.0.1".parse().expect("ip"))
        );
    }

    /// What an upgraded session does with its connection's place, without the upgrade: a
    /// handler hands the place to a task that outlives the request.
    #[tokio::test]
    async fn a_place_handed_on_counts_until_dropped_and_hears_the_stop() {
        use axum::routing::get;
        let (held_tx, held_rx) = tokio::sync::mpsc::unbounded_channel::<Connection>();
        let router = Router::new()
            .route(
                "/hold",
                get(move |axum::Extension(place): axum::Extension<Connection>| {
                    let held_tx = held_tx.clone();
                    async move {
                        let _ = held_tx.send(place);
                        "held"
                    }
                }),
            )
            .route("/ok", get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let limits = Limits {
            max_connections: 1,
            max_per_ip: 1,
            header_timeout: Duration::from_secs(5),
        };
        let (stop, stopped) = oneshot::channel();
        let server = tokio::spawn(serve(listener, router, limits, stopped));
        quiver::ensure_tls_provider();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("client");
        let answer = client
            .get(format!("{base}/hold"))
            .send()
            .await
            .expect("hold");
        assert_eq!(answer.text().await.expect("body"), "held");
        let mut held_rx = held_rx;
        let place = held_rx
            .recv()
            .await
            .expect("the handler handed its place on");
        // The connection has closed, yet its place is still taken.
        let waiting = client
            .get(format!("{base}/ok"))
            .timeout(Duration::from_millis(500))
            .send()
            .await;
        assert!(waiting.is_err(), "served past the cap: {waiting:?}");
        // The holder hears the stop; once it lets go, the server finishes.
        let holder = tokio::spawn(async move {
            place.stopping().await;
            drop(place);
        });
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), holder)
            .await
            .expect("the holder heard the stop")
            .expect("holder");
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stopped")
            .expect("server");
    }
}
