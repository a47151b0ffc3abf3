//! The node's accept loop. `axum::serve` has no header timeout and no connection cap, so a
//! client could hold connections open forever by sending headers slowly, or open them
//! without end. Here each connection needs a permit (past the cap the kernel's backlog
//! waits), its headers must arrive within the header timeout, and a stop lets requests in
//! flight finish for a moment before the rest are cut. Connections are tasks of a
//! [`JoinSet`] that the stop aborts and awaits, so no handler outlives [`serve`] (and so
//! none runs after the node has shut its host down).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;

use crate::defaults;

/// Serves `router` on `listener` until `stop` fires (or its sender is dropped).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    header_timeout: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
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
        let (tcp, _) = tokio::select! {
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
        // Small JSON answers must not wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(defaults::SERVE_HTTP_SHUTDOWN_GRACE, graceful.shutdown())
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
