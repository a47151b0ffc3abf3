//! The guest SDK for Quiver.
//!
//! Quiver runs WebAssembly workloads (`wasm32-wasip1` modules) and offers them hostcalls in
//! the import module `spear`. This crate wraps those hostcalls in a safe Rust API:
//!
//! - [`Chat`]: a chat completion session held by the host: messages, params, guest
//!   [`Tool`]s and MCP tools; [`Chat::complete`] lets the host run the model's tool calls
//!   and returns the final [`Response`], with typed accessors for the completion, the
//!   host's `_spear` record, its errors and metrics ([`chat`] has the types);
//! - [`tool!`]: turns a plain Rust function into a [`Tool`] the model can call, with the
//!   parameter schema derived from the argument type ([`parameters_schema`]);
//! - [`Mcp`]: a session on one MCP server of the host's registry: list its tools
//!   ([`mcp::ToolList`]) and call them, getting a [`ToolResult`] back, with typed content
//!   parts and the host's typed errors ([`mcp`] has the types);
//! - [`registry`]: read-only views of the MCP server registry;
//! - [`stream`]: SPEAR's user streams, frames between the task and its client;
//! - [`log`]: log lines, shown as the guest's own stderr output, and [`time_now_ms`];
//! - [`sys`]: the raw hostcall imports, for anything the wrappers do not cover.
//!
//! Every fallible call returns [`Result`], whose [`Error`] names the operation and the
//! host's [`Errno`]. Hostcalls that return bytes use the ABI's output buffer protocol; the
//! SDK starts with a 4 KiB buffer and retries with the size the host asks for, so callers
//! never see `-ENOSPC` unless the host keeps asking for more.
//!
//! The crate re-exports [`serde`], [`serde_json`] and (with the default feature `schema`)
//! [`schemars`], which [`tool!`] uses; a guest can use them instead of depending on them
//! itself (to derive through the re-exports, add `#[serde(crate = "quiver_guest::serde")]`
//! and `#[schemars(crate = "quiver_guest::schemars")]`).
//!
//! # Typed answers, and the JSON as sent
//!
//! Everything the host answers in JSON has a typed view: [`chat::ResponseBody`] (the
//! `chat.completion`, the host's `_spear` object, its `error`), [`chat::Metrics`],
//! [`mcp::ToolList`], [`mcp::Content`], [`mcp::HostError`], [`registry::Listing`]. They
//! are decoded leniently, field by field: a missing or wrongly typed field (an upstream
//! that sends `"created": "soon"` or a token count of 1e30) is its default, list elements
//! that do not decode are left out, and nothing panics. Fields the SDK does not know are
//! kept in each type's `extra` map, and every typed accessor has a raw counterpart
//! ([`Response::json`], [`Response::metrics_json`], [`Mcp::list_tools_json`],
//! [`ToolResult::json`], [`registry::list_json`]) with the JSON exactly as sent.
//!
//! # Example: chat with a guest tool
//!
//! A complete guest that gives the model a Rust function to call, and the tools of the
//! MCP server `fs`. Build it with `cargo build --target wasm32-wasip1`, linking with
//! `--export-table` (see [Tools](Chat#tools)), and run it with the Quiver host.
//!
//! ```no_run
//! use quiver_guest::{Chat, log};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! /// The model's arguments; the schema it sees is derived from this type.
//! #[derive(Deserialize, JsonSchema)]
//! struct WeatherArgs {
//!     /// City name, e.g. Paris
//!     city: String,
//! }
//!
//! fn get_weather(args: WeatherArgs) -> Result<String, String> {
//!     Ok(format!("Sunny, 21°C in {}", args.city))
//! }
//!
//! quiver_guest::tool!(
//!     GET_WEATHER = get_weather(WeatherArgs),
//!     "get_weather",
//!     "Current weather for a city",
//! );
//!
//! fn main() -> quiver_guest::Result<()> {
//!     let mut chat = Chat::new()?;
//!     chat.system("You are a concise assistant.")?
//!         .tool(&GET_WEATHER)?
//!         .param("mcp.enabled", true)?
//!         .param("mcp.server_ids", ["fs"])?
//!         .user("What's the weather in Paris? And what is in README.md?")?;
//!
//!     let response = chat.complete()?;
//!     if let Some(error) = response.error()? {
//!         // A typed `ChatError`: `error.code` is a `ChatErrorCode`.
//!         eprintln!("chat failed: {error}");
//!         std::process::exit(1);
//!     }
//!     println!("{}", response.text()?.unwrap_or_default());
//!     if let Some(spear) = response.spear()? {
//!         for call in &spear.tool_calls {
//!             println!("the host ran {} ({}) in {:?} ms", call.name, call.kind, call.ms);
//!         }
//!     }
//!     let metrics = response.metrics()?;
//!     log::info(&format!("{} tokens in {} ms", metrics.total_tokens, metrics.latency_ms.total));
//!     Ok(())
//! }
//! ```
//!
//! # Example: MCP tools called directly
//!
//! A complete guest that lists the tools of the `fs` server and calls one of them.
//!
//! ```no_run
//! use quiver_guest::mcp::{Content, HostErrorCode};
//! use quiver_guest::{Mcp, log};
//! use serde_json::json;
//!
//! fn main() -> quiver_guest::Result<()> {
//!     let started = quiver_guest::time_now_ms();
//!     let fs = Mcp::open("fs")?;
//!
//!     let listing = fs.list_tools()?;
//!     for tool in &listing.tools {
//!         println!("{} — {}", tool.name, tool.description.as_deref().unwrap_or(""));
//!     }
//!
//!     let result = fs.call_tool("read_file", json!({ "path": "README.md" }))?;
//!     match result.host_error() {
//!         Some(error) if error.code == HostErrorCode::Timeout => eprintln!("slow: {error}"),
//!         Some(error) => eprintln!("{error}"),
//!         None if result.is_error() => eprintln!("tool failed: {}", result.text()),
//!         None => {
//!             for part in result.content() {
//!                 match part {
//!                     Content::Text(text) => println!("{}", text.text),
//!                     Content::Image(image) => println!("[image: {}]", image.mime_type),
//!                     other => println!("[{}]", other.kind()),
//!                 }
//!             }
//!         }
//!     }
//!
//!     fs.close()?;
//!     log::info(&format!("done in {} ms", quiver_guest::time_now_ms() - started));
//!     Ok(())
//! }
//! ```
//!
//! # Native builds
//!
//! On targets other than `wasm32` the hostcalls are replaced by stand-ins that fail with
//! [`Errno::ENOSYS`] ([`time_now_ms`] returns `0`), so code using the SDK compiles, and its
//! pure logic can be unit-tested, on the build machine. [`Tool::call`] runs a tool
//! in-process, as the model would, without a host.

#![warn(missing_docs)]

mod buffer;
pub mod chat;
mod error;
mod lenient;
pub mod log;
pub mod mcp;
pub mod registry;
pub mod rt;
pub mod stream;
pub mod sys;
mod tool;

pub use chat::{Chat, DEFAULT_TOOL_ARENA_BYTES, PendingResponse, Response, SendFlags};
pub use error::{Errno, Error, Result};
pub use mcp::{Mcp, PendingCall, ToolResult};
#[cfg(feature = "schema")]
pub use tool::parameters_schema;
pub use tool::{Tool, ToolFn};

#[cfg(feature = "schema")]
pub use schemars;
pub use serde;
pub use serde_json;

/// Unit tests watch the tool arenas being freed.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: chat::arena_tests::Watching = chat::arena_tests::Watching;

/// Support code for the [`tool!`] macro; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::tool::rt::*;
}

/// Wall-clock milliseconds since the Unix epoch, as the host sees it.
///
/// Returns `0` on native builds.
pub fn time_now_ms() -> i64 {
    // SAFETY: no arguments.
    unsafe { sys::time_now_ms() }
}
