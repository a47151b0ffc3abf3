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
//!   the messages after it. The entry carries a `tag` (an HMAC of the id under a key this
//!   process drew at random), and a request continues only an id whose tag checks: a
//!   stored response belongs to the operator's whole OpenAI project, so a guest must not
//!   continue one it did not get from this host by writing its id into a message.

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

static TAG_KEY: std::sync::LazyLock<Option<ring::hmac::Key>> = std::sync::LazyLock::new(|| {
    ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new()).ok()
});

/// The tag of a stored response `id` this process handed out (hex HMAC-SHA256); empty
/// without randomness, so that no tag checks and no stored response is continued.
fn response_tag(id: &str) -> String {
    let Some(key) = &*TAG_KEY else {
        return String::new();
    };
    ring::hmac::sign(key, id.as_bytes())
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether `tag` is the one [`response_tag`] gives `id` (checked by ring in constant time).
fn tag_checks(id: &str, tag: &str) -> bool {
    let (Some(key), true) = (&*TAG_KEY, tag.len() == 64) else {
        return false;
    };
    let bytes: Option<Vec<u8>> = (0..tag.len())
        .step_by(2)
        .map(|i| {
            tag.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect();
    bytes.is_some_and(|bytes| ring::hmac::verify(key, id.as_bytes(), &bytes).is_ok())
}

#[cfg(test)]
mod tests;
