//! The OpenAI Responses wire format (`POST {base_url}/responses`), as a translation.
//!
//! Like [`super::anthropic`], this turns the loop's chat-completions request into a
//! Responses request ([`to_responses`]) and the response back into a `chat.completion`
//! ([`from_responses`]); HTTP, retries and caps are [`super::openai`]'s.
//!
//! What the Responses API keeps beyond a chat message travels in the assistant message's
//! [`RICH_CONTENT_FIELD`](super::RICH_CONTENT_FIELD), which the `openai` wire strips and
//! the other translations ignore:
//! - stateless (the default: `store: false`), the answer's reasoning items with their
//!   encrypted content (`include: ["reasoning.encrypted_content"]`), sent back before that
//!   answer's items on the next turns, as the API wants for a tool loop;
//! - chained (`chain_responses = true`: `store: true`), `{"type": "response", "id"}`, the
//!   stored response the next request continues with `previous_response_id`, sending only
//!   the messages after it.

mod request;
mod response;

pub(super) use request::to_responses;
pub(super) use response::from_responses;

/// How a backend carries a conversation from one request to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// `store: false`; every request holds the whole conversation.
    Stateless,
    /// `store: true`; a request continues the last stored response.
    Chained,
}

#[cfg(test)]
mod tests;
