//! The Anthropic Messages wire format (`POST {base_url}/messages`), as a translation.
//!
//! The chat loop speaks OpenAI chat completions everywhere; this module turns one such
//! request into a Messages request ([`to_messages`]) and the Messages response back into a
//! `chat.completion` ([`from_messages`]), so the loop, the guest's `cchat_recv` body and
//! transcripts stay one shape. HTTP, retries and size caps are [`super::openai`]'s, shared.
//!
//! The API refuses a whole request for one flaw in its history (an empty text block, a
//! repeated tool call id, a `tool_use` left unanswered, a bad image), and a session sends
//! its history again on every turn, so one flaw would fail every later request of the
//! session. The translation therefore makes every request one the API accepts, whatever
//! the session holds (a model's odd answer, a guest's own messages), and says in text notes
//! what it could not send.

mod request;
mod response;

pub(super) use request::{text_of, to_messages, tool_name};
pub(super) use response::from_messages;

/// The field of a `tool` message holding the MCP image parts only this wire format sends.
pub(crate) const RICH_CONTENT_FIELD: &str = "quiver_content";
