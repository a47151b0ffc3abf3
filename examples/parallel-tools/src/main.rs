//! Calls MCP tools at once and waits for all of them: `quiver_guest::rt` runs the calls'
//! futures together over the host's epoll, so three `slow` calls of 300 ms each (on the
//! fixture server) take about 300 ms, not 900.
//!
//! Arguments: the server id (default `fixture`), then the tool (default `slow`) and its
//! JSON arguments (default `{"ms":300}`): an object makes three calls with it, an array
//! of objects one call per element (`[{"ms":50},{"ms":200}]`: two calls in flight).
//! Prints each result's text, then the number of calls and the time taken.
//!
//! A task has at most half of a server's `budgets.max_concurrency` calls in flight at once
//! (4 of the default 8); a call past that fails with `EAGAIN`.

use quiver_guest::{Mcp, Result, rt, time_now_ms};
use serde_json::Value;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let server = args.first().map_or("fixture", String::as_str);
    let tool = args.get(1).map_or("slow", String::as_str);
    let arguments: Vec<Value> = match args.get(2) {
        Some(json) => match serde_json::from_str(json).expect("the third argument is JSON") {
            Value::Array(each) => each,
            one => vec![one; 3],
        },
        None => vec![serde_json::json!({"ms": 300}); 3],
    };
    let mcp = Mcp::open(server)?;
    let started = time_now_ms();
    let calls = arguments
        .iter()
        .map(|arguments| mcp.call_tool_async(tool, arguments))
        .collect::<Result<Vec<_>>>()?;
    for result in rt::block_on(rt::join_all(calls))? {
        println!("{}", result?.text());
    }
    println!(
        "{} calls in {} ms",
        arguments.len(),
        time_now_ms() - started
    );
    Ok(())
}
