//! Calls three MCP tools at once and waits for all of them: `quiver_guest::rt` runs the
//! calls' futures together over the host's epoll, so three `slow` calls of 300 ms each
//! (on the fixture server) take about 300 ms, not 900.
//!
//! Arguments: the server id (default `fixture`), then the tool (default `slow`) and its
//! JSON arguments (default `{"ms":300}`). Prints each result's text, then the time taken.

use quiver_guest::{Mcp, Result, rt, time_now_ms};
use serde_json::Value;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let server = args.first().map_or("fixture", String::as_str);
    let tool = args.get(1).map_or("slow", String::as_str);
    let arguments: Value = match args.get(2) {
        Some(json) => serde_json::from_str(json).expect("the third argument is a JSON object"),
        None => serde_json::json!({"ms": 300}),
    };
    let mcp = Mcp::open(server)?;
    let started = time_now_ms();
    let calls = (0..3)
        .map(|_| mcp.call_tool_async(tool, &arguments))
        .collect::<Result<Vec<_>>>()?;
    for result in rt::block_on(rt::join_all(calls))? {
        println!("{}", result?.text());
    }
    println!("3 calls in {} ms", time_now_ms() - started);
    Ok(())
}
