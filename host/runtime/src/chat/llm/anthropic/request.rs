//! An OpenAI chat-completions request as a Messages request.
//!
//! `system` and `developer` messages become the top-level `system`; `tools[].function`
//! become tools with an `input_schema`; assistant messages become assistant turns of `text`
//! and `tool_use` blocks, `tool` messages `tool_result` blocks (a message's
//! [`RICH_CONTENT_FIELD`] images inside them), user messages text and `image` blocks.
//!
//! What the API would refuse is repaired, so a session never fails for good:
//! - text that is empty or only whitespace is left out, and a turn left with nothing is
//!   dropped; turns of the same role in a row are merged (tool results first), as the API
//!   would combine them;
//! - tool call ids are made valid and unique ([`crate::chat::llm::ids`]), tool names valid; a
//!   `tool_use` without its `tool_result` in the next turn gets an error result, and a
//!   `tool_result` that answers no `tool_use` of the turn before becomes text;
//! - images are checked ([`images::check`]) and only the newest
//!   [`defaults::ANTHROPIC_MAX_IMAGES_PER_REQUEST`] (at most
//!   [`defaults::ANTHROPIC_MAX_IMAGE_BYTES_PER_REQUEST`] of base64) are sent; the others
//!   become text notes;
//! - `temperature` is clamped to the API's 0–1 (OpenAI's range is 0–2);
//!   `parallel_tool_calls: false` becomes `disable_parallel_tool_use`.

use serde_json::{Map, Value, json};

use super::RICH_CONTENT_FIELD;
use crate::chat::images;
use crate::chat::llm::ids::{self, Ids};
use crate::defaults;

/// The Messages request for an OpenAI chat-completions `body`.
pub(in crate::chat::llm) fn to_messages(body: &Value, max_tokens: u32) -> Value {
    let mut system = Vec::new();
    let mut turns = Turns::default();
    for message in body["messages"].as_array().into_iter().flatten() {
        match message["role"].as_str() {
            Some("system" | "developer") => {
                let text = text_of(&message["content"]);
                if !text.trim().is_empty() {
                    system.push(text);
                }
            }
            Some("assistant") => {
                let mut blocks: Vec<Value> = text_block(text_of(&message["content"]))
                    .into_iter()
                    .collect();
                let calls = message["tool_calls"].as_array().into_iter().flatten();
                blocks.extend(calls.enumerate().map(|(i, call)| tool_use(i, call)));
                turns.push(Role::Assistant, blocks);
            }
            Some("tool") => turns.push(Role::User, vec![tool_result(message)]),
            _ => turns.push(Role::User, user_blocks(&message["content"])),
        }
    }
    let mut turns = turns.0;
    pair_tool_calls(&mut turns);
    keep_newest_images(&mut turns);

    let mut request = Map::new();
    request.insert("model".into(), body["model"].clone());
    let max_tokens = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .unwrap_or(u64::from(max_tokens));
    request.insert("max_tokens".into(), json!(max_tokens));
    if !system.is_empty() {
        request.insert("system".into(), json!(system.join("\n\n")));
    }
    let messages = turns
        .into_iter()
        .map(|turn| json!({"role": turn.role.as_str(), "content": turn.blocks}))
        .collect();
    request.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body["tools"].as_array().filter(|t| !t.is_empty()) {
        request.insert(
            "tools".into(),
            tools.iter().map(tool_definition).collect::<Value>(),
        );
        if let Some(choice) = tool_choice(body) {
            request.insert("tool_choice".into(), choice);
        }
    }
    if let Some(temperature) = body["temperature"].as_f64() {
        request.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
    }
    if body["top_p"].is_number() {
        request.insert("top_p".into(), body["top_p"].clone());
    }
    let stops: Vec<&Value> = match &body["stop"] {
        stop @ Value::String(_) => vec![stop],
        Value::Array(stops) => stops.iter().filter(|s| s.is_string()).collect(),
        _ => Vec::new(),
    };
    if !stops.is_empty() {
        request.insert("stop_sequences".into(), json!(stops));
    }
    Value::Object(request)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

struct Turn {
    role: Role,
    blocks: Vec<Value>,
}

#[derive(Default)]
struct Turns(Vec<Turn>);

impl Turns {
    /// Adds a `role` turn of `blocks`: nothing when they are none, merged into the last turn
    /// when that has the same role (tool results before the rest of a user turn).
    fn push(&mut self, role: Role, blocks: Vec<Value>) {
        if blocks.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(last) if last.role == role => {
                last.blocks.extend(blocks);
                last.blocks.sort_by_key(|b| !is_tool_result(b));
            }
            _ => self.0.push(Turn { role, blocks }),
        }
    }
}

fn is_tool_result(block: &Value) -> bool {
    block["type"] == "tool_result"
}

/// A text block, or none for text the API would refuse (empty or only whitespace).
fn text_block(text: String) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn note(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// The `i`-th call of an assistant message. Its `id` is the one its `tool` message
/// answers (`call_<i>` when it has none, as the chat loop names it); [`pair_tool_calls`]
/// makes it one the API takes.
fn tool_use(i: usize, call: &Value) -> Value {
    let id = call["id"]
        .as_str()
        .map_or_else(|| format!("call_{i}"), str::to_owned);
    let arguments = call["function"]["arguments"].as_str().unwrap_or("");
    let input = match crate::json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Value::Object(map),
        _ => json!({}),
    };
    json!({
        "type": "tool_use",
        "id": id,
        "name": tool_name(call["function"]["name"].as_str().unwrap_or("")),
        "input": input,
    })
}

/// `name` if the API takes it as a tool name (`^[a-zA-Z0-9_-]{1,64}$`), else a close one
/// (the Responses API and Gemini take these too).
pub(in crate::chat::llm) fn tool_name(name: &str) -> String {
    let name: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "unnamed_tool".to_owned()
    } else {
        name
    }
}

/// A `tool` message as a `tool_result` block: its text, then the images the chat loop
/// kept (checked later, with the others); without either it has no `content`.
fn tool_result(message: &Value) -> Value {
    let mut content: Vec<Value> = text_block(text_of(&message["content"]))
        .into_iter()
        .collect();
    for part in message[RICH_CONTENT_FIELD].as_array().into_iter().flatten() {
        content.push(match part["type"].as_str() {
            Some("image") => part.clone(),
            other => note(format!(
                "[{} content not sent: only text and images are]",
                other.unwrap_or("unknown")
            )),
        });
    }
    let mut block = json!({"type": "tool_result", "tool_use_id": message["tool_call_id"]});
    if !content.is_empty() {
        block["content"] = Value::Array(content);
    }
    block
}

/// A user message's content: text, and OpenAI `image_url` parts as `image` blocks (a
/// `data:` URL as base64, an `https:` URL as a URL the API fetches); other parts as notes.
fn user_blocks(content: &Value) -> Vec<Value> {
    let Value::Array(parts) = content else {
        return text_block(text_of(content)).into_iter().collect();
    };
    parts
        .iter()
        .filter_map(|part| match part["type"].as_str() {
            Some("text") => text_block(part["text"].as_str()?.to_owned()),
            Some("image_url") => Some(image_url(part)),
            other => Some(note(format!(
                "[{} part not sent: only text and images are]",
                other.unwrap_or("unknown")
            ))),
        })
        .collect()
}

fn image_url(part: &Value) -> Value {
    let url = part["image_url"]["url"]
        .as_str()
        .or_else(|| part["image_url"].as_str())
        .unwrap_or("");
    if let Some((media_type, data)) = url
        .strip_prefix("data:")
        .and_then(|url| url.split_once(";base64,"))
    {
        json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        })
    } else if url.starts_with("https://") {
        json!({"type": "image", "source": {"type": "url", "url": url}})
    } else {
        note("[image not sent: only data: and https: image URLs are]".into())
    }
}

/// Gives every `tool_use` a valid, unique id and its `tool_result` in the next turn, the
/// only place the API looks for it.
fn pair_tool_calls(turns: &mut Vec<Turn>) {
    let mut ids = Ids::new(
        ids::ANTHROPIC,
        turns
            .iter()
            .filter(|t| t.role == Role::Assistant)
            .flat_map(|t| &t.blocks)
            .filter_map(|b| b["id"].as_str()),
    );
    // The calls of the assistant turn before: (the id its results name, the id sent).
    let mut asked: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < turns.len() {
        if turns[i].role == Role::Assistant {
            for block in &mut turns[i].blocks {
                if block["type"] == "tool_use" {
                    let given = block["id"].as_str().unwrap_or_default().to_owned();
                    let id = ids.claim(Some(&given));
                    block["id"] = json!(id);
                    asked.push((given, id));
                }
            }
            if !asked.is_empty() && turns.get(i + 1).is_none_or(|t| t.role != Role::User) {
                turns.insert(
                    i + 1,
                    Turn {
                        role: Role::User,
                        blocks: Vec::new(),
                    },
                );
            }
        } else {
            let blocks = std::mem::take(&mut turns[i].blocks);
            let mut answered = Vec::with_capacity(blocks.len());
            for mut block in blocks {
                if !is_tool_result(&block) {
                    answered.push(block);
                    continue;
                }
                let given = block["tool_use_id"].as_str();
                match asked.iter().position(|(id, _)| Some(id.as_str()) == given) {
                    Some(at) => {
                        block["tool_use_id"] = json!(asked.remove(at).1);
                        answered.push(block);
                    }
                    None => answered.extend(orphan_result(block)),
                }
            }
            let unanswered = asked.drain(..).map(|(_, id)| {
                json!({
                    "type": "tool_result",
                    "tool_use_id": id,
                    "is_error": true,
                    "content": [note("[no result was recorded for this tool call]".into())],
                })
            });
            let mut blocks: Vec<Value> = unanswered.collect();
            blocks.extend(answered);
            blocks.sort_by_key(|b| !is_tool_result(b));
            turns[i].blocks = blocks;
        }
        i += 1;
    }
}

/// A `tool_result` that answers no `tool_use` of the turn before, as plain content.
fn orphan_result(mut block: Value) -> Vec<Value> {
    let id = block["tool_use_id"].as_str().unwrap_or("?");
    let shown: String = id.chars().take(64).collect();
    let mut blocks = vec![note(format!(
        "[result of tool call {shown}, which no earlier tool call matches]"
    ))];
    if let Value::Array(content) = block["content"].take() {
        blocks.extend(content);
    }
    blocks
}

/// Checks the images of `turns`, newest first, keeping those the request has room for
/// and turning the rest into notes.
fn keep_newest_images(turns: &mut [Turn]) {
    let mut budget = images::Budget::new(
        defaults::ANTHROPIC_MAX_IMAGES_PER_REQUEST,
        defaults::ANTHROPIC_MAX_IMAGE_BYTES_PER_REQUEST,
    );
    for turn in turns.iter_mut().rev() {
        for block in turn.blocks.iter_mut().rev() {
            if block["type"] == "image" {
                admit_image(block, &mut budget);
            } else if let Some(content) = block.get_mut("content").and_then(Value::as_array_mut) {
                for part in content.iter_mut().rev() {
                    if part["type"] == "image" {
                        admit_image(part, &mut budget);
                    }
                }
            }
        }
    }
}

fn admit_image(block: &mut Value, budget: &mut images::Budget) {
    let source = &block["source"];
    match source["type"].as_str() {
        Some("base64") => {
            let media_type = source["media_type"].as_str().unwrap_or("");
            let data = source["data"].as_str().unwrap_or("");
            match images::check(media_type, data) {
                Ok(_) if !budget.admit(data.len()) => *block = note(budget.full_note()),
                Ok(media_type) => block["source"]["media_type"] = json!(media_type),
                Err(why) => *block = note(format!("[image not sent: {why}]")),
            }
        }
        Some("url")
            if source["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://")) =>
        {
            if budget.admit(0) {
                *block = json!({"type": "image", "source": {"type": "url", "url": source["url"]}});
            } else {
                *block = note(budget.full_note());
            }
        }
        _ => *block = note("[image not sent: not base64 data or an https: URL]".into()),
    }
}

/// The text of an OpenAI `content`: a string, or its text parts joined.
pub(in crate::chat::llm) fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn tool_definition(tool: &Value) -> Value {
    let function = &tool["function"];
    let mut out = json!({
        "name": function["name"],
        "input_schema": match &function["parameters"] {
            Value::Object(schema) => Value::Object(schema.clone()),
            _ => json!({"type": "object"}),
        },
    });
    if let Some(description) = function["description"].as_str() {
        out["description"] = json!(description);
    }
    out
}

/// `tool_choice`, with `parallel_tool_calls: false` as `disable_parallel_tool_use`.
fn tool_choice(body: &Value) -> Option<Value> {
    let choice = &body["tool_choice"];
    let mut mapped = match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Some(json!({"type": "auto"})),
            "none" => Some(json!({"type": "none"})),
            "required" => Some(json!({"type": "any"})),
            _ => None,
        },
        Value::Object(_) => choice["function"]["name"]
            .as_str()
            .map(|name| json!({"type": "tool", "name": name})),
        _ => None,
    };
    if body["parallel_tool_calls"] == false {
        let choice = mapped.get_or_insert_with(|| json!({"type": "auto"}));
        // `none` takes no such field: no tool is called at all.
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
    }
    mapped
}

#[cfg(test)]
mod tests;
