//! The `auto` lifecycle's probe: telling a pre-2026-07-28 server from a 2026-07-28 one at
//! once, whatever it does with a `server/discover` it does not know.
//!
//! rmcp's `auto` sends `server/discover` and falls back to `initialize` on the same
//! connection when the answer is a JSON-RPC error, or after 10 s of silence. Older servers
//! do two other things with an unknown method, and [`Probe`] turns each into the error
//! rmcp falls back on:
//!
//! - **They answer it with some other result** (the conformance suite's 2025 servers answer
//!   `{}`), or offer only versions that have `initialize` (an rmcp server limited to
//!   2025-11-25 answers an unsupported-version error naming them): rmcp would fail the
//!   connection. Either becomes a method-not-found error.
//! - **They never answer it** (servers that drop a request they cannot parse, or any
//!   request before `initialize`): rmcp would wait 10 s, and a slow start (an `npx`
//!   download) looks the same, so no shorter timeout is right. On message-stream
//!   transports (stdio, legacy SSE) a `ping` goes out right after `server/discover`: every
//!   earlier revision answers it, even before `initialize`. A server that answers the ping
//!   with a result before it answers `server/discover` ignored the latter, and rmcp gets a
//!   method-not-found error for it at once. (Streamable HTTP answers every POST.)
//!
//! The ping's own answer and a late answer to `server/discover` never reach rmcp, which
//! would take either for the answer to `initialize`. A 2026-07-28 server answers
//! `server/discover` first (and the ping with an error, that revision having no ping), and
//! nothing changes.

use rmcp::RoleClient;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorCode, ErrorData, NumberOrString, PingRequest,
    ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::Transport;

/// The ping's id: a string, so it can never collide with rmcp's numeric ids.
const PROBE_ID: &str = "quiver-discover-probe";

/// Where the probe stands.
enum State {
    /// Not used on this connection, or done.
    Off,
    /// Armed for the first `server/discover`; `ping`: also send the ping.
    Armed { ping: bool },
    /// `server/discover` sent with `id`; the ping goes out when rmcp starts waiting.
    Sent { id: RequestId, ping: bool },
    /// Waiting for the answer to `server/discover` (and to the ping, if `pinged`).
    Waiting { id: RequestId, pinged: bool },
    /// Decided; the next answer with this id (the ping's, or a late one to
    /// `server/discover`) is dropped.
    Dropping(RequestId),
}

/// A transport that watches the first `server/discover` it sends (see the module docs).
pub(super) struct Probe<T> {
    inner: T,
    state: State,
}

/// How the probe is used on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probing {
    /// Not at all: the lifecycle is not `auto`.
    Off,
    /// Check the answer to `server/discover` (Streamable HTTP).
    Answer,
    /// Check the answer, and send a `ping` beside it (stdio, legacy SSE).
    AnswerAndPing,
}

impl<T> Probe<T> {
    pub(super) fn new(inner: T, probing: Probing) -> Self {
        let state = match probing {
            Probing::Off => State::Off,
            Probing::Answer => State::Armed { ping: false },
            Probing::AnswerAndPing => State::Armed { ping: true },
        };
        Self { inner, state }
    }
}

fn probe_id() -> RequestId {
    NumberOrString::String(PROBE_ID.into())
}

/// The id an answer from the server carries, if it is one.
fn answer_id(message: &ServerJsonRpcMessage) -> Option<&RequestId> {
    match message {
        ServerJsonRpcMessage::Response(response) => Some(&response.id),
        ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    }
}

/// Whether an unsupported-version error's `data.supported` names 2026-07-28 (then rmcp
/// asks again with it).
fn offers_2026(data: Option<&serde_json::Value>) -> bool {
    data.and_then(|d| d.get("supported"))
        .and_then(|s| s.as_array())
        .is_some_and(|versions| {
            versions
                .iter()
                .any(|v| v.as_str() == Some(ProtocolVersion::V_2026_07_28.as_str()))
        })
}

/// The error rmcp falls back to `initialize` on, answering request `id`.
fn older_server(id: RequestId, why: &'static str) -> ServerJsonRpcMessage {
    tracing::debug!("{why}: an older server, falling back to initialize");
    ServerJsonRpcMessage::error(
        ErrorData::new(ErrorCode::METHOD_NOT_FOUND, why, None),
        Some(id),
    )
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Probe<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let (State::Armed { ping }, ClientJsonRpcMessage::Request(request)) =
            (&self.state, &item)
            && matches!(request.request, ClientRequest::DiscoverRequest(_))
        {
            self.state = State::Sent {
                id: request.id.clone(),
                ping: *ping,
            };
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        if let State::Sent { id, ping } = &self.state {
            let (id, ping) = (id.clone(), *ping);
            let pinged = ping && {
                let ping = ClientRequest::PingRequest(PingRequest::default());
                // Unsent, rmcp's own wait still applies.
                self.inner
                    .send(ClientJsonRpcMessage::request(ping, probe_id()))
                    .await
                    .is_ok()
            };
            self.state = State::Waiting { id, pinged };
        }
        loop {
            let message = self.inner.receive().await?;
            let State::Waiting { id, pinged } = &self.state else {
                if let State::Dropping(dropped) = &self.state
                    && answer_id(&message) == Some(dropped)
                {
                    self.state = State::Off;
                    continue;
                }
                return Some(message);
            };
            let (id, pinged) = (id.clone(), *pinged);
            let answers = answer_id(&message);
            if pinged && answers == Some(&probe_id()) {
                if matches!(message, ServerJsonRpcMessage::Error(_)) {
                    // No ping in this revision: a 2026-07-28 server, still answering.
                    self.state = State::Waiting { id, pinged: false };
                    continue;
                }
                self.state = State::Dropping(id.clone());
                return Some(older_server(
                    id,
                    "the server answered ping but not server/discover",
                ));
            }
            if answers != Some(&id) {
                return Some(message);
            }
            // The answer to `server/discover`; a ping still unanswered is dropped.
            self.state = match pinged {
                true => State::Dropping(probe_id()),
                false => State::Off,
            };
            if let ServerJsonRpcMessage::Error(error) = &message
                && error.error.code == ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
                && !offers_2026(error.error.data.as_ref())
            {
                return Some(older_server(
                    id,
                    "the server's server/discover offers no version this client speaks without initialize",
                ));
            }
            if let ServerJsonRpcMessage::Response(response) = &message {
                match &response.result {
                    ServerResult::DiscoverResult(found)
                        if !found
                            .supported_versions
                            .contains(&ProtocolVersion::V_2026_07_28) =>
                    {
                        return Some(older_server(
                            id,
                            "the server's server/discover offers no version this client speaks without initialize",
                        ));
                    }
                    ServerResult::DiscoverResult(_) => {}
                    _ => {
                        return Some(older_server(
                            id,
                            "the server answered server/discover with something other than a discover result",
                        ));
                    }
                }
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
