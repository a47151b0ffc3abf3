//! The guest SDK for Quiver.
//!
//! Quiver runs WebAssembly workloads (`wasm32-wasip1` modules) and offers them hostcalls in
//! the import module `spear`. This crate wraps those hostcalls in a safe Rust API:
//!
//! - [`Chat`]: a chat completion session held by the host: messages, params, guest
//!   [`Tool`]s and MCP tools; [`Chat::complete`] lets the host run the model's tool calls
//!   and returns the final [`Response`];
//! - [`tool!`]: turns a plain Rust function into a [`Tool`] the model can call;
//! - [`Mcp`]: a session on one MCP server of the host's registry: list its tools and call
//!   them, getting a [`ToolResult`] back;
//! - [`registry`]: read-only views of the MCP server registry;
//! - [`log`]: log lines routed into the host's structured logs, and [`time_now_ms`];
//! - [`sys`]: the raw hostcall imports, for anything the wrappers do not cover.
//!
//! Every fallible call returns [`Result`], whose [`Error`] names the operation and the
//! host's [`Errno`]. Hostcalls that return bytes use the ABI's output buffer protocol; the
//! SDK starts with a 4 KiB buffer and retries with the size the host asks for, so callers
//! never see `-ENOSPC` unless the host keeps asking for more.
//!
//! The crate re-exports [`serde`] and [`serde_json`], which [`tool!`] uses; a guest can
//! use them instead of depending on them itself (to derive `Deserialize` through the
//! re-export, add `#[serde(crate = "quiver_guest::serde")]`).
//!
//! # Example: chat with a guest tool
//!
//! A complete guest that gives the model a Rust function to call, and the tools of the
//! MCP server `fs`. Build it with `cargo build --target wasm32-wasip1`, linking with
//! `--export-table` (see [Tools](Chat#tools)), and run it with the Quiver host.
//!
//! ```no_run
//! use quiver_guest::{Chat, log};
//! use serde::Deserialize;
//! use serde_json::json;
//!
//! #[derive(Deserialize)]
//! struct WeatherArgs {
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
//!     json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
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
//!         eprintln!("chat failed: {error}");
//!         std::process::exit(1);
//!     }
//!     println!("{}", response.text()?.unwrap_or_default());
//!     log::info(&format!("metrics: {}", response.metrics()?));
//!     Ok(())
//! }
//! ```
//!
//! # Example: MCP tools called directly
//!
//! A complete guest that lists the tools of the `fs` server and calls one of them.
//!
//! ```no_run
//! use quiver_guest::{Mcp, log};
//! use serde_json::json;
//!
//! fn main() -> quiver_guest::Result<()> {
//!     let started = quiver_guest::time_now_ms();
//!     let fs = Mcp::open("fs")?;
//!
//!     let listing = fs.list_tools()?;
//!     for tool in listing["tools"].as_array().into_iter().flatten() {
//!         println!("{} — {}", tool["name"], tool["description"]);
//!     }
//!
//!     let result = fs.call_tool("read_file", json!({ "path": "README.md" }))?;
//!     match result.error_code() {
//!         Some(code) => eprintln!("{code}: {}", result.error_message().unwrap_or("")),
//!         None if result.is_error() => eprintln!("tool failed: {}", result.text()),
//!         None => println!("{}", result.text()),
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
mod chat;
mod error;
pub mod log;
mod mcp;
pub mod registry;
pub mod sys;
mod tool;

pub use chat::{Chat, DEFAULT_TOOL_ARENA_BYTES, Response, SendFlags};
pub use error::{Errno, Error, Result};
pub use mcp::{Mcp, ToolResult};
pub use tool::{Tool, ToolFn};

pub use serde;
pub use serde_json;

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
