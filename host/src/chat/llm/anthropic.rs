//! The Anthropic Messages wire format (`POST {base_url}/messages`), as a translation.
//!
//! The chat loop speaks OpenAI chat completions everywhere; this module turns one such
//! request into a Messages request and the Messages response back into a `chat.completion`,
//! so the loop, the guest's `cchat_recv` body and transcripts stay one shape. HTTP, retries
//! and size caps are [`super::openai`]'s, shared. Mapping:
//! `system` messages become the top-level `system`; `tools[].function.parameters` become
//! `input_schema`; assistant `tool_calls` become `tool_use` blocks and `tool` messages
//! `tool_result` blocks, consecutive ones merged into one user turn as the API requires;
//! a tool message's `quiver_content` (image parts the chat loop kept, never sent to OpenAI)
//! becomes `image` blocks inside its `tool_result`. Back: `text` and `tool_use` blocks become
//! the message's `content` and `tool_calls`, `stop_reason` the `finish_reason`,
//! `input_tokens`/`output_tokens` the `prompt_tokens`/`completion_tokens`.

use serde_json::{Map, Value, json};

/// The field of a `tool` message holding the MCP image parts only this wire format sends.
pub(crate) const RICH_CONTENT_FIELD: &str = "quiver_content";

/// The Messages request for an OpenAI chat-completions `body`.
pub(super) fn to_messages(body: &Value, max_tokens: u32) -> Value {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        match message["role"].as_str() {
            Some("system" | "developer") => system.push(text_of(&message["content"])),
            Some("assistant") => {
                let mut blocks = Vec::new();
                let text = text_of(&message["content"]);
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let arguments = call["function"]["arguments"].as_str().unwrap_or("");
                    let input = match serde_json::from_str::<Value>(arguments) {
                        Ok(Value::Object(map)) => Value::Object(map),
                        _ => json!({}),
                    };
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": input,
                    }));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            Some("tool") => {
                let mut content =
                    vec![json!({"type": "text", "text": text_of(&message["content"])})];
                content.extend(
                    message[RICH_CONTENT_FIELD]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                let block = json!({
                    "type": "tool_result",
                    "tool_use_id": message["tool_call_id"],
                    "content": content,
                });
                match messages.last_mut() {
                    Some(last) if is_tool_results(last) => {
                        if let Some(blocks) = last["content"].as_array_mut() {
                            blocks.push(block);
                        }
                    }
                    _ => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
            _ => {
                messages.push(json!({"role": "user", "content": user_content(&message["content"])}))
            }
        }
    }
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
    request.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body["tools"].as_array().filter(|t| !t.is_empty()) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|tool| {
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
            })
            .collect();
        request.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tool_choice(&body["tool_choice"]) {
            request.insert("tool_choice".into(), choice);
        }
    }
    for key in ["temperature", "top_p"] {
        if body[key].is_number() {
            request.insert(key.into(), body[key].clone());
        }
    }
    match &body["stop"] {
        Value::String(stop) => {
            request.insert("stop_sequences".into(), json!([stop]));
        }
        Value::Array(stops) => {
            request.insert("stop_sequences".into(), Value::Array(stops.clone()));
        }
        _ => {}
    }
    Value::Object(request)
}

/// The `chat.completion` for a Messages response, or why it is not one.
pub(super) fn from_messages(response: &Value) -> Result<Value, String> {
    if response["type"] == "error" {
        return Err(format!("an error body: {}", response["error"]));
    }
    let blocks = response["content"]
        .as_array()
        .ok_or("`content` is not an array of content blocks")?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => {
                let name = block["name"]
                    .as_str()
                    .ok_or("a `tool_use` block without a string `name`")?;
                tool_calls.push(json!({
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": name, "arguments": block["input"].to_string()},
                }));
            }
            // Thinking and other blocks the loop cannot use are not the model's answer.
            _ => {}
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !tool_calls.is_empty() { Value::Null } else { json!(text) },
    });
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let finish_reason = match response["stop_reason"].as_str() {
        Some("end_turn" | "stop_sequence" | "pause_turn") => json!("stop"),
        Some("max_tokens") => json!("length"),
        Some("tool_use") => json!("tool_calls"),
        Some("refusal") => json!("content_filter"),
        Some(other) => json!(other),
        None => Value::Null,
    };
    let usage = &response["usage"];
    let usage = match (
        usage["input_tokens"].as_u64(),
        usage["output_tokens"].as_u64(),
    ) {
        (Some(input), Some(output)) => json!({
            "prompt_tokens": input,
            "completion_tokens": output,
            "total_tokens": input.saturating_add(output),
        }),
        _ => Value::Null,
    };
    Ok(json!({
        "id": response["id"],
        "object": "chat.completion",
        "model": response["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }))
}

fn is_tool_results(message: &Value) -> bool {
    message["role"] == "user"
        && message["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().all(|b| b["type"] == "tool_result"))
}

/// The text of an OpenAI `content`: a string, or its text parts joined.
fn text_of(content: &Value) -> String {
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

/// A user message's content: text as is; OpenAI `image_url` data URLs as `image` blocks.
fn user_content(content: &Value) -> Value {
    let Value::Array(parts) = content else {
        return json!(text_of(content));
    };
    let blocks: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part["type"].as_str() {
            Some("text") => Some(json!({"type": "text", "text": part["text"]})),
            Some("image_url") => {
                let url = part["image_url"]["url"].as_str()?;
                let (media_type, data) = url.strip_prefix("data:")?.split_once(";base64,")?;
                Some(json!({
                    "type": "image",
                    "source": {"type": "base64", "media_type": media_type, "data": data},
                }))
            }
            _ => None,
        })
        .collect();
    Value::Array(blocks)
}

fn tool_choice(choice: &Value) -> Option<Value> {
    match choice {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_merges_tool_results_and_lifts_system() {
        let body = json!({
            "model": "claude-x",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "t1", "arguments": "{\"x\":1}"}},
                    {"id": "b", "type": "function", "function": {"name": "t2", "arguments": "not json"}},
                ]},
                {"role": "tool", "tool_call_id": "a", "content": "one"},
                {"role": "tool", "tool_call_id": "b", "content": "two", "quiver_content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                ]},
            ],
            "tools": [{"type": "function", "function": {"name": "t1", "parameters": {"type": "object"}}}],
            "tool_choice": "required",
            "stop": "END",
        });
        let out = to_messages(&body, 99);
        assert_eq!(out["system"], "be brief");
        assert_eq!(out["max_tokens"], 99);
        assert_eq!(out["tool_choice"], json!({"type": "any"}));
        assert_eq!(out["stop_sequences"], json!(["END"]));
        assert_eq!(out["tools"][0]["input_schema"], json!({"type": "object"}));
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["content"][0]["input"], json!({"x": 1}));
        assert_eq!(messages[1]["content"][1]["input"], json!({}));
        let results = messages[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[1]["tool_use_id"], "b");
        assert_eq!(results[1]["content"][1]["source"]["data"], "AAAA");
    }

    #[test]
    fn response_becomes_a_chat_completion() {
        let response = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "let me"}, {"type": "tool_use", "id": "tu", "name": "echo", "input": {"a": 1}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 7, "output_tokens": 3},
        });
        let out = from_messages(&response).unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(out["choices"][0]["message"]["content"], "let me");
        let call = &out["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], "{\"a\":1}");
        assert_eq!(out["usage"]["total_tokens"], 10);
        assert!(from_messages(&json!({"type": "error", "error": {"type": "x"}})).is_err());
        assert!(from_messages(&json!({"content": "nope"})).is_err());
    }
}
