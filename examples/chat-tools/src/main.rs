//! chat-tools: a chat in which the model calls a Rust function of this guest and a tool of
//! an MCP server, both run by the host.
//!
//! ```text
//! chat-tools [question]
//! ```
//!
//! The session gets the guest tool `get_weather {city}` (a made-up, deterministic
//! forecast) and the tools of the MCP server `fixture` (among them `add {a, b}`), then the
//! question, which defaults to "What's the weather in Paris, and what is 2+3?". The host
//! runs the model's tool calls until it answers. The guest prints the answer, then one line
//! naming the tools the host ran:
//!
//! ```text
//! tools used: get_weather (guest), mcp__fixture__add (mcp)
//! ```
//!
//! An error response, or an error from the SDK, is printed to stderr and the guest exits
//! with status 1.

use std::error::Error;
use std::process::exit;

use quiver_guest::{Chat, Response, log};
use schemars::JsonSchema;
use serde::Deserialize;

const DEFAULT_QUESTION: &str = "What's the weather in Paris, and what is 2+3?";

const SYSTEM_PROMPT: &str = "You are a concise assistant. Use the get_weather tool for \
     weather questions and the add tool for arithmetic; never guess what a tool would say. \
     Answer in one or two sentences.";

/// The weather tool's arguments; the schema the model sees is derived from them.
#[derive(Deserialize, JsonSchema)]
struct WeatherArgs {
    /// City name, e.g. Paris
    city: String,
}

/// The weather tool: the same made-up forecast every time.
fn get_weather(args: WeatherArgs) -> Result<String, String> {
    let city = args.city.trim();
    if city.is_empty() {
        return Err("`city` must not be empty".to_owned());
    }
    Ok(format!("Sunny, 21°C in {city}"))
}

quiver_guest::tool!(
    GET_WEATHER = get_weather(WeatherArgs),
    "get_weather",
    "Current weather for a city",
);

fn main() {
    let question = std::env::args()
        .nth(1)
        .unwrap_or_else(|| DEFAULT_QUESTION.to_owned());
    if let Err(err) = run(&question) {
        eprintln!("chat-tools: {err}");
        exit(1);
    }
}

fn run(question: &str) -> Result<(), Box<dyn Error>> {
    let mut chat = Chat::new()?;
    chat.system(SYSTEM_PROMPT)?
        .tool(&GET_WEATHER)?
        .param("mcp.enabled", true)?
        .param("mcp.server_ids", ["fixture"])?
        .user(question)?;

    let response = chat.complete()?;
    if let Some(error) = response.error()? {
        return Err(format!("chat failed: {error}").into());
    }
    match response.metrics() {
        Ok(metrics) => log::info(&format!(
            "chat metrics: {}",
            serde_json::to_string(&metrics).unwrap_or_default()
        )),
        Err(err) => log::warn(&format!("no chat metrics: {err}")),
    }

    match response.text()? {
        Some(text) => println!("{text}"),
        None => println!("(the model gave no text answer)"),
    }
    println!("tools used: {}", tools_used(&response)?);
    Ok(())
}

/// `name (kind)` for each distinct tool the host ran, in order, from `_spear.tool_calls`;
/// `none` if it ran none.
fn tools_used(response: &Response) -> Result<String, Box<dyn Error>> {
    let calls = response.spear()?.map_or(&[][..], |spear| &spear.tool_calls);
    let mut used: Vec<String> = Vec::new();
    for call in calls {
        let name = if call.name.is_empty() {
            "?"
        } else {
            &call.name
        };
        let kind = match call.kind.as_str() {
            "" => "?",
            kind => kind,
        };
        let entry = if call.ok == Some(false) {
            format!("{name} ({kind}, failed)")
        } else {
            format!("{name} ({kind})")
        };
        if !used.contains(&entry) {
            used.push(entry);
        }
    }
    Ok(if used.is_empty() {
        "none".to_owned()
    } else {
        used.join(", ")
    })
}
