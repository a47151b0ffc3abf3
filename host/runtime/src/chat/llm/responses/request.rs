//! An OpenAI chat-completions request as a Responses request.
//!
//! `system` and `developer` messages become `instructions`; `tools[].function` become
//! function tools (`strict: false` unless the guest asked for strict, since the API's
//! default strict mode refuses most MCP schemas); user messages become `input_text` and
//! `input_image` parts; an assistant message becomes its reasoning items (stateless, from
//! [`RICH_CONTENT_FIELD`]), its text and one `function_call` item per tool call; a `tool`
//! message a `function_call_output` whose `output` carries the message's MCP images as
//! `input_image` parts after its text.
//!
//! What the API would refuse is repaired, so a session never fails for good:
//! - tool call ids are made valid, short and unique ([`ids::CALL`]); a call without an
//!   output before the next message gets an error output, and an output that answers no
//!   call of the message before becomes user text;
//! - `function_call` items carry no item `id` (the API would then want the reasoning item
//!   it came with); reasoning items carry their encrypted content, or are left out;
//! - images are checked ([`images::check`]) and only the newest
//!   [`defaults::LLM_MAX_IMAGES_PER_REQUEST`] (at most
//!   [`defaults::RESPONSES_MAX_IMAGE_BYTES_PER_REQUEST`] of base64) are sent;
//! - `max_tokens` becomes `max_output_tokens`, at least the API's 16; `response_format`
//!   becomes `text.format`, `reasoning_effort` `reasoning.effort`; parameters the API does
//!   not take (`stop`, `n`, `seed`, penalties, `logprobs`, ...) are not sent.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::State;
use crate::chat::images;
use crate::chat::llm::RICH_CONTENT_FIELD;
use crate::chat::llm::anthropic::{text_of, tool_name};
use crate::chat::llm::ids::{self, Ids};
use crate::defaults;

/// One input item and the index of the message it stands for (chaining sends only those
/// after the stored response's).
struct Item {
    from: usize,
    value: Value,
}

/// The Responses request for an OpenAI chat-completions `body`.
/// `reasons`: the model reasons, so a stateless request asks for its reasoning encrypted.
pub(in crate::chat::llm) fn to_responses(body: &Value, state: State, reasons: bool) -> Value {
    let messages: &[Value] = body["messages"].as_array().map_or(&[], Vec::as_slice);
    let mut instructions = Vec::new();
    let mut input = Input {
        items: Vec::new(),
        ids: Ids::new(
            ids::CALL,
            messages
                .iter()
                .filter(|m| m["role"] == "assistant")
                .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
                .filter_map(|call| call["id"].as_str()),
        ),
        asked: Vec::new(),
        reasoning_ids: HashSet::new(),
    };
    for (i, message) in messages.iter().enumerate() {
        match message["role"].as_str() {
            Some("system" | "developer") => {
                let text = text_of(&message["content"]);
                if !text.trim().is_empty() {
                    instructions.push(text);
                }
            }
            Some("tool") => input.tool_output(i, message),
            Some("assistant") => {
                input.unanswered(i);
                input.assistant(i, message, state);
            }
            _ => {
                input.unanswered(i);
                if let Some(value) = user_message(&message["content"]) {
                    input.items.push(Item { from: i, value });
                }
            }
        }
    }
    input.unanswered(messages.len());
    let mut items = input.items;
    keep_newest_images(&mut items);

    let mut request = Map::new();
    request.insert("model".into(), body["model"].clone());
    match state {
        State::Stateless => {
            request.insert("store".into(), json!(false));
            if reasons {
                request.insert("include".into(), json!(["reasoning.encrypted_content"]));
            }
        }
        State::Chained => {
            request.insert("store".into(), json!(true));
            if let Some((anchor, id)) = stored_response(messages)
                && items.iter().any(|item| item.from > anchor)
            {
                items.retain(|item| item.from > anchor);
                request.insert("previous_response_id".into(), json!(id));
            }
        }
    }
    let input: Vec<Value> = items.into_iter().map(|item| item.value).collect();
    request.insert("input".into(), Value::Array(input));
    if !instructions.is_empty() {
        request.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    if let Some(tools) = body["tools"].as_array().filter(|t| !t.is_empty()) {
        request.insert(
            "tools".into(),
            tools.iter().map(tool_definition).collect::<Value>(),
        );
        if let Some(choice) = tool_choice(&body["tool_choice"]) {
            request.insert("tool_choice".into(), choice);
        }
        if body["parallel_tool_calls"].is_boolean() {
            request.insert(
                "parallel_tool_calls".into(),
                body["parallel_tool_calls"].clone(),
            );
        }
    }
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p")] {
        if body[from].is_number() {
            request.insert(to.into(), body[from].clone());
        }
    }
    for (name, keep) in [
        ("user", Value::is_string as fn(&Value) -> bool),
        ("service_tier", Value::is_string),
        ("prompt_cache_key", Value::is_string),
        ("metadata", Value::is_object),
    ] {
        if keep(&body[name]) {
            request.insert(name.into(), body[name].clone());
        }
    }
    if let Some(max) = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
    {
        request.insert(
            "max_output_tokens".into(),
            json!(max.max(defaults::RESPONSES_MIN_OUTPUT_TOKENS)),
        );
    }
    if let Some(effort) = body["reasoning_effort"].as_str() {
        request.insert("reasoning".into(), json!({"effort": effort}));
    }
    if let Some(format) = text_format(&body["response_format"]) {
        request.insert("text".into(), json!({"format": format}));
    }
    Value::Object(request)
}

/// The input items so far, and what pairing calls with outputs needs.
struct Input {
    items: Vec<Item>,
    ids: Ids,
    /// The calls of the last assistant message not answered yet: (id given, id sent).
    asked: Vec<(String, String)>,
    /// Reasoning items sent, by id: the API refuses one twice.
    reasoning_ids: HashSet<String>,
}

impl Input {
    /// Its reasoning items (stateless), its text, then its tool calls.
    fn assistant(&mut self, from: usize, message: &Value, state: State) {
        let calls = message["tool_calls"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let text = text_of(&message["content"]);
        let has_text = !text.trim().is_empty();
        // A reasoning item must be followed by the answer it led to.
        if state == State::Stateless && (has_text || !calls.is_empty()) {
            let kept = message[RICH_CONTENT_FIELD].as_array().into_iter().flatten();
            for item in kept.filter_map(reasoning_item) {
                let fresh = item["id"]
                    .as_str()
                    .is_none_or(|id| self.reasoning_ids.insert(id.to_owned()));
                if fresh {
                    self.items.push(Item { from, value: item });
                }
            }
        }
        if has_text {
            let value = json!({"role": "assistant", "content": text});
            self.items.push(Item { from, value });
        }
        for (k, call) in calls.iter().enumerate() {
            let given = call["id"]
                .as_str()
                .map_or_else(|| format!("call_{k}"), str::to_owned);
            let id = self.ids.claim(Some(&given));
            let arguments = match &call["function"]["arguments"] {
                Value::String(text) => text.clone(),
                Value::Object(map) => Value::Object(map.clone()).to_string(),
                _ => "{}".to_owned(),
            };
            let value = json!({
                "type": "function_call",
                "call_id": id,
                "name": tool_name(call["function"]["name"].as_str().unwrap_or("")),
                "arguments": arguments,
            });
            self.items.push(Item { from, value });
            self.asked.push((given, id));
        }
    }

    /// A `tool` message: the output of the call it answers, or user text if none.
    fn tool_output(&mut self, from: usize, message: &Value) {
        let text = text_of(&message["content"]);
        let mut parts: Vec<Value> = Vec::new();
        for part in message[RICH_CONTENT_FIELD].as_array().into_iter().flatten() {
            parts.push(match part["type"].as_str() {
                Some("image") => input_image_of_block(part),
                other => input_text(format!(
                    "[{} content not sent: only text and images are]",
                    other.unwrap_or("unknown")
                )),
            });
        }
        let given = message["tool_call_id"].as_str();
        let value = match self
            .asked
            .iter()
            .position(|(id, _)| Some(id.as_str()) == given)
        {
            Some(at) => {
                let (_, id) = self.asked.remove(at);
                let output = if parts.is_empty() {
                    Value::String(text)
                } else {
                    if !text.trim().is_empty() {
                        parts.insert(0, input_text(text));
                    }
                    Value::Array(parts)
                };
                json!({"type": "function_call_output", "call_id": id, "output": output})
            }
            None => {
                let shown: String = given.unwrap_or("?").chars().take(64).collect();
                let mut content = vec![input_text(format!(
                    "[result of tool call {shown}, which no earlier tool call matches]"
                ))];
                if !text.trim().is_empty() {
                    content.push(input_text(text));
                }
                content.extend(parts);
                json!({"role": "user", "content": content})
            }
        };
        self.items.push(Item { from, value });
    }

    /// An error output for each call of the message before still unanswered.
    fn unanswered(&mut self, from: usize) {
        for (_, id) in self.asked.drain(..) {
            self.items.push(Item {
                from,
                value: json!({
                    "type": "function_call_output",
                    "call_id": id,
                    "output": "[no result was recorded for this tool call]",
                }),
            });
        }
    }
}

/// The last assistant message naming the stored response it was, and that response's id.
fn stored_response(messages: &[Value]) -> Option<(usize, &str)> {
    messages.iter().enumerate().rev().find_map(|(i, message)| {
        let kept = message[RICH_CONTENT_FIELD].as_array()?;
        let entry = kept.iter().find(|part| part["type"] == "response")?;
        let id = entry["id"].as_str()?;
        let handed_out = super::tag_checks(id, entry["tag"].as_str().unwrap_or(""));
        (message["role"] == "assistant" && handed_out).then_some((i, id))
    })
}

/// A kept reasoning item as the API takes it back: only its id, summary and encrypted
/// content, and none without the last (with `store: false` the API has nothing else).
fn reasoning_item(part: &Value) -> Option<Value> {
    if part["type"] != "reasoning" {
        return None;
    }
    let encrypted = part["encrypted_content"].as_str()?;
    let summary: Vec<Value> = part["summary"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["text"].as_str())
        .map(|text| json!({"type": "summary_text", "text": text}))
        .collect();
    let mut item = json!({"type": "reasoning", "summary": summary, "encrypted_content": encrypted});
    if let Some(id) = part["id"].as_str() {
        item["id"] = json!(id);
    }
    Some(item)
}

fn input_text(text: String) -> Value {
    json!({"type": "input_text", "text": text})
}

/// An image block the chat loop kept (`{"type": "image", "source": {...}}`) as an
/// `input_image` part, checked later with the others.
fn input_image_of_block(block: &Value) -> Value {
    let source = &block["source"];
    let url = match source["type"].as_str() {
        Some("base64") => format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or(""),
            source["data"].as_str().unwrap_or("")
        ),
        Some("url") => source["url"].as_str().unwrap_or("").to_owned(),
        _ => String::new(),
    };
    json!({"type": "input_image", "image_url": url, "detail": "auto"})
}

/// A user message's content as an input message: text, and `image_url` parts as
/// `input_image`; other parts as notes. `None` when nothing is left.
fn user_message(content: &Value) -> Option<Value> {
    let Value::Array(parts) = content else {
        let text = text_of(content);
        return (!text.trim().is_empty()).then(|| json!({"role": "user", "content": text}));
    };
    let parts: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part["type"].as_str() {
            Some("text") => part["text"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
                .map(|t| input_text(t.to_owned())),
            Some("image_url") => {
                let url = part["image_url"]["url"]
                    .as_str()
                    .or_else(|| part["image_url"].as_str())
                    .unwrap_or("");
                let detail = part["image_url"]["detail"]
                    .as_str()
                    .filter(|d| ["low", "high", "auto"].contains(d))
                    .unwrap_or("auto");
                Some(json!({"type": "input_image", "image_url": url, "detail": detail}))
            }
            other => Some(input_text(format!(
                "[{} part not sent: only text and images are]",
                other.unwrap_or("unknown")
            ))),
        })
        .collect();
    (!parts.is_empty()).then(|| json!({"role": "user", "content": parts}))
}

/// Checks the images of `items`, newest first, keeping those the request has room for
/// and turning the rest into notes.
fn keep_newest_images(items: &mut [Item]) {
    let mut budget = images::Budget::new(
        defaults::LLM_MAX_IMAGES_PER_REQUEST,
        defaults::RESPONSES_MAX_IMAGE_BYTES_PER_REQUEST,
    );
    for item in items.iter_mut().rev() {
        let field = if item.value.get("output").is_some() {
            "output"
        } else {
            "content"
        };
        let parts = item.value.get_mut(field).and_then(Value::as_array_mut);
        for part in parts.into_iter().flatten().rev() {
            if part["type"] == "input_image" {
                admit_image(part, &mut budget);
            }
        }
    }
}

fn admit_image(part: &mut Value, budget: &mut images::Budget) {
    let url = part["image_url"].as_str().unwrap_or("");
    if let Some((media_type, data)) = url
        .strip_prefix("data:")
        .and_then(|url| url.split_once(";base64,"))
    {
        match images::check(media_type, data) {
            Ok(_) if !budget.admit(data.len()) => *part = input_text(budget.full_note()),
            Ok(checked) if checked != media_type => {
                part["image_url"] = json!(format!("data:{checked};base64,{data}"));
            }
            Ok(_) => {}
            Err(why) => *part = input_text(format!("[image not sent: {why}]")),
        }
    } else if url.starts_with("https://") {
        if !budget.admit(0) {
            *part = input_text(budget.full_note());
        }
    } else {
        *part = input_text("[image not sent: only data: and https: image URLs are]".into());
    }
}

fn tool_definition(tool: &Value) -> Value {
    let function = &tool["function"];
    let mut out = json!({
        "type": "function",
        "name": function["name"],
        "parameters": match &function["parameters"] {
            Value::Object(schema) => Value::Object(schema.clone()),
            _ => json!({"type": "object", "properties": {}}),
        },
        "strict": function["strict"] == true,
    });
    if let Some(description) = function["description"].as_str() {
        out["description"] = json!(description);
    }
    out
}

/// `tool_choice`: the modes as they are, a named function as `{"type": "function", "name"}`.
fn tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(mode) if ["auto", "none", "required"].contains(&mode.as_str()) => {
            Some(choice.clone())
        }
        Value::Object(_) => choice["function"]["name"]
            .as_str()
            .map(|name| json!({"type": "function", "name": name})),
        _ => None,
    }
}

/// `response_format` as `text.format`.
fn text_format(format: &Value) -> Option<Value> {
    match format["type"].as_str()? {
        "json_schema" => {
            let spec = format["json_schema"].as_object()?;
            let mut out = Map::from_iter([("type".to_owned(), json!("json_schema"))]);
            for field in ["name", "schema", "strict", "description"] {
                if let Some(value) = spec.get(field) {
                    out.insert(field.into(), value.clone());
                }
            }
            Some(Value::Object(out))
        }
        kind @ ("json_object" | "text") => Some(json!({"type": kind})),
        _ => None,
    }
}
