//! mcp-explorer: list the tools of an MCP server and, optionally, call one.
//!
//! ```text
//! mcp-explorer <server_id> [tool_name] [json_args]
//! ```
//!
//! `json_args` is a JSON object and defaults to `{}`. Any error from the SDK is printed to
//! stderr and the guest exits with status 1.

use std::error::Error;
use std::process::exit;

use quiver_guest::{Mcp, log};
use serde_json::Value;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(server_id) = args.get(1) else {
        eprintln!("usage: mcp-explorer <server_id> [tool_name] [json_args]");
        exit(2);
    };
    let tool = args.get(2).map(String::as_str);
    let json_args = args.get(3).map_or("{}", String::as_str);

    if let Err(err) = run(server_id, tool, json_args) {
        eprintln!("mcp-explorer: {err}");
        exit(1);
    }
}

fn run(server_id: &str, tool: Option<&str>, json_args: &str) -> Result<(), Box<dyn Error>> {
    log::info(&format!("exploring MCP server {server_id}"));
    let mcp = Mcp::open(server_id)?;

    println!("tools on {server_id}:");
    let listing = mcp.list_tools()?;
    for tool in &listing.tools {
        let name = if tool.name.is_empty() {
            "?"
        } else {
            &tool.name
        };
        let description = tool.description.as_deref().unwrap_or("");
        println!("  {name} — {description}");
    }

    if let Some(tool) = tool {
        let args: Value = serde_json::from_str(json_args)?;
        let result = mcp.call_tool(tool, args)?;
        println!("call {tool}({json_args}) ->");
        match result.host_error() {
            // The host could not complete the call (unavailable, timeout, policy, ...).
            Some(error) => println!("error {}: {}", error.code, error.message),
            // The tool ran and reported a failure in its own words.
            None if result.is_error() => println!("tool error: {}", result.text()),
            None => println!("{}", result.text()),
        }
    }

    mcp.close()?;
    Ok(())
}
