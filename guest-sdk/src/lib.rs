//! The guest SDK for Quiver.
//!
//! Quiver runs WebAssembly workloads (`wasm32-wasip1` modules) and offers them hostcalls in
//! the import module `spear`. This crate wraps those hostcalls in a safe Rust API:
//!
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
//! # Example
//!
//! A complete guest that lists the tools of the `fs` server and calls one of them. Build it
//! with `cargo build --target wasm32-wasip1` and run it with the Quiver host.
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
//! pure logic can be unit-tested, on the build machine.

#![warn(missing_docs)]

mod buffer;
mod error;
pub mod log;
mod mcp;
pub mod registry;
pub mod sys;
// The chat completion sessions (`cchat_*`) will get their own `chat` module.

pub use error::{Errno, Error, Result};
pub use mcp::{Mcp, ToolResult};

/// Wall-clock milliseconds since the Unix epoch, as the host sees it.
///
/// Returns `0` on native builds.
pub fn time_now_ms() -> i64 {
    // SAFETY: no arguments.
    unsafe { sys::time_now_ms() }
}
