//! `GET /v1/tasks/{id}/streams`: a task's user streams over a WebSocket (subprotocol
//! `spear.stream.v1`, one SSF v1 frame per binary message, SPEAR's design), for the client
//! that submitted the task and nobody else (not even `observe`: the streams are the task's
//! conversation with its submitter).
//!
//! The upgrade goes through the node's own listener, guard and token check. The session
//! is bounded: a message is at most one frame ([`quiver::defaults::USER_STREAM_MAX_FRAME_BYTES`]),
//! at most [`defaults::STREAM_MAX_FRAMES_PER_SEC`] messages a second are taken (pings
//! included), a session idle for [`defaults::STREAM_IDLE_TIMEOUT`] is closed (pings do not
//! count; a send stuck that long is idle), a session outlives its task by at most
//! [`defaults::STREAM_DRAIN_TIMEOUT`], and one client at a time may hold a task's streams
//! (so sessions are bounded by the node's tasks). A session keeps the place of the
//! connection it upgraded (the node's `max_connections` and the client address's share
//! count it until it closes), and the node's stop closes it with 1001. Backpressure is the
//! library's: while the guest's inbound queue is full the socket is not read, and while the
//! client does not read, the guest's writes wait in its bounded queue. A frame the library
//! refuses (not SSF v1, too many streams) closes the socket with 1008 and the reason, and
//! the guest sees EPOLLERR besides EPOLLHUP.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::rejection::PathRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use quiver::{AttachError, StreamClient};

use super::NodeState;
use super::auth::Caller;
use super::error::ApiError;
use super::listen::Connection;
use super::params::hex_param;
use crate::defaults;

/// Upgrades to the task's stream session, after the checks an HTTP request gets.
pub(crate) async fn attach(
    State(state): State<Arc<NodeState>>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let id = hex_param(id, "id", 24)?;
    let streams = state
        .tasks
        .streams(&id, caller.client.as_deref())
        .ok_or_else(|| ApiError::not_found("task", "id"))?;
    let ws = ws.map_err(|rejection| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_required",
            format!(
                "this endpoint is a WebSocket (subprotocol {}): {rejection}",
                defaults::STREAM_SUBPROTOCOL
            ),
        )
        .with_field("Upgrade")
    })?;
    let offered = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == defaults::STREAM_SUBPROTOCOL);
    if !offered {
        return Err(ApiError::bad(
            "Sec-WebSocket-Protocol",
            format!("offer the subprotocol {}", defaults::STREAM_SUBPROTOCOL),
        ));
    }
    let Some(streams) = streams else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "task_ended",
            "the task has ended; its streams are closed",
        )
        .with_field("id"));
    };
    let client = streams.attach().map_err(|e| {
        let code = match e {
            AttachError::Busy => "stream_busy",
            AttachError::Over => "stream_over",
        };
        ApiError::new(StatusCode::CONFLICT, code, e.to_string()).with_field("id")
    })?;
    tracing::info!(id, client = caller.name(), "stream client attached");
    let frame = quiver::defaults::USER_STREAM_MAX_FRAME_BYTES;
    Ok(ws
        .protocols([defaults::STREAM_SUBPROTOCOL])
        .max_message_size(frame)
        .max_frame_size(frame)
        .write_buffer_size(0)
        .max_write_buffer_size(defaults::STREAM_WRITE_BUFFER_BYTES.max(frame * 2))
        .on_upgrade(move |socket| session(socket, client, id, connection)))
}

/// How a session ends.
enum End {
    /// The client closed it, or its connection went.
    Client,
    /// The task ended.
    Task,
    Idle,
    /// The node stops serving.
    NodeStopping,
    /// The client broke a rule; the reason goes into the close frame.
    Refused(String),
}

async fn session(socket: WebSocket, client: StreamClient, id: String, connection: Connection) {
    let (mut tx, mut rx) = socket.split();
    let started = Instant::now();
    let idle = defaults::STREAM_IDLE_TIMEOUT;
    // Milliseconds since `started` of the last frame either way, for the idle timeout.
    // Pings and pongs do not count: they would keep a silent session forever.
    let last = AtomicU64::new(0);
    let touch = || {
        let now = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(now, Ordering::Relaxed);
    };
    let idle_left = || {
        let since = started
            .elapsed()
            .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
        idle.saturating_sub(since)
    };
    let inbound = async {
        let mut window = (Instant::now(), 0u32);
        loop {
            let left = idle_left();
            if left.is_zero() {
                return End::Idle;
            }
            let message = match tokio::time::timeout(left, rx.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(_) => return End::Client,
                Err(_) => continue,
            };
            if window.0.elapsed() >= Duration::from_secs(1) {
                window = (Instant::now(), 0);
            }
            window.1 += 1;
            if window.1 > defaults::STREAM_MAX_FRAMES_PER_SEC {
                return End::Refused(format!(
                    "more than {} frames a second",
                    defaults::STREAM_MAX_FRAMES_PER_SEC
                ));
            }
            let frame = match message {
                Message::Binary(frame) => frame,
                Message::Close(_) => return End::Client,
                Message::Ping(_) | Message::Pong(_) => continue,
                Message::Text(_) => {
                    return End::Refused("binary SSF v1 frames only".into());
                }
            };
            touch();
            // A guest that never reads (or a task that never starts) must not hold the
            // session: the wait for room is an idle time too.
            match tokio::time::timeout(idle, client.send(frame.into())).await {
                Ok(Ok(())) => {}
                Ok(Err(quiver::SendError::Ended)) => return End::Task,
                Ok(Err(e)) => return End::Refused(e.to_string()),
                Err(_) => return End::Idle,
            }
        }
    };
    let outbound = async {
        while let Some(frame) = client.recv().await {
            touch();
            // A client that does not read stalls this send; it may not hold the session.
            match tokio::time::timeout(idle, tx.send(Message::Binary(frame.into()))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return End::Client,
                Err(_) => return End::Idle,
            }
        }
        End::Task
    };
    // Once the task has ended, what it wrote has a short while to reach the client; then
    // the session ends whether or not the client read it.
    let drained = async {
        client.ended().await;
        tokio::time::sleep(defaults::STREAM_DRAIN_TIMEOUT).await;
        End::Task
    };
    let end = tokio::select! {
        end = inbound => end,
        end = outbound => end,
        end = drained => end,
        () = connection.stopping() => End::NodeStopping,
    };
    let (code, reason) = match &end {
        End::Client => (close_code::NORMAL, String::new()),
        End::Task => (close_code::NORMAL, "the task ended".to_owned()),
        End::Idle => (close_code::AWAY, "idle".to_owned()),
        End::NodeStopping => (close_code::AWAY, "the node is stopping".to_owned()),
        End::Refused(reason) => (close_code::POLICY, reason.clone()),
    };
    match end {
        End::Refused(_) => {
            tracing::info!(id, reason, "stream client refused");
            client.fail();
        }
        _ => {
            tracing::info!(id, reason, "stream session ended");
            drop(client);
        }
    }
    // A close reason holds at most 123 bytes.
    let mut reason = reason;
    while reason.len() > 123 {
        reason.pop();
    }
    let close = Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    // The closing handshake: read (and drop) what the client still sends until its close
    // reply. Dropping the socket with unread bytes makes the kernel answer with a reset,
    // and a client that is still writing (a flood) would lose the close frame and reason.
    // When the client closed first, the send fails and the library has queued the reply
    // instead: the next read writes it out and ends.
    let _ = tokio::time::timeout(defaults::STREAM_CLOSE_TIMEOUT, async {
        let _ = tx.send(close).await;
        while let Some(Ok(message)) = rx.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}
