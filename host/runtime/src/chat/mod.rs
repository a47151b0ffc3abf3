//! The chat capability: sessions, the host-side tool-call loop, LLM backends and their
//! wire types, the `cchat_*` hostcalls and each task's chat state.
//!
//! A session holds what a guest built with `cchat_*`: messages, params (some consumed by
//! the host, the rest forwarded upstream), its own tools and its MCP settings, which can
//! only narrow the task's. `cchat_send` runs [`run::send`]: it builds the tool set once
//! (guest tools plus the MCP tools the session may use, from the pool's cache; the MCP
//! half is the task's last one while nothing it was built from changed), asks the
//! backend (whose answer is read as the [`wire`] types), runs the tool calls the model makes through the session's own name map, and
//! loops until the model answers or a budget is hit. Guest tools are called through a
//! [`GuestTools`] implementation the ABI layer provides, so this module never touches
//! wasm.

mod guest_tools;
mod hostcalls;
mod images;
pub mod llm;
mod message;
mod metrics;
mod params;
mod pending;
mod request;
mod response;
mod results;
pub(crate) mod run;
mod sampling;
mod session;
mod spans;
pub(crate) mod tools;
pub mod wire;

pub(crate) use guest_tools::GuestTool;
pub use hostcalls::add_to_linker;
pub(crate) use metrics::Metrics;
pub(crate) use params::{ParamError, SessionMcp, Settings};
pub(crate) use run::{GuestTools, SendContext};
pub(crate) use sampling::Sampler;
pub(crate) use session::ROLES;
pub use session::{ChatResponse, ChatSession, ChatTask, ChatView};

#[cfg(test)]
mod tests;
