//! The scripted server's OpenAI Responses API (`POST /v1/responses`).
//!
//! [`fault`] answers a 400 (an OpenAI error body) for what the real API refuses:
//! - a top-level parameter it does not know (`messages`, `max_tokens`, `stop`, ...), no
//!   string `model`, a `temperature` outside 0–2, `max_output_tokens` below 16;
//! - an `input` item of an unknown type or role; a `function_call` without a string
//!   `call_id`, `name` and `arguments`; a `function_call_output` whose `output` is not a
//!   string or a list of `input_text`/`input_image`/`input_file` parts, or whose `call_id`
//!   no earlier `function_call` (or stored response it continues) has; a `function_call`
//!   (of the input, or of the response it continues) that no output answers;
//! - a reasoning item without `summary`, without `encrypted_content` when `store` is
//!   false (the API has nothing stored to look it up by), not followed by another item,
//!   or repeating an item id;
//! - an `input_image` that is not a `data:` URL of PNG, JPEG, WebP or GIF of at most
//!   20 MB or an `https:` URL, or with a `detail` other than low/high/auto; more than 500;
//! - a `previous_response_id` of no response stored (`store: true`) by this server;
//! - a function tool whose name is not `^[a-zA-Z0-9_-]{1,64}$`, without object
//!   `parameters`, or strict (the API's default) without `additionalProperties: false`.
//!
//! [`answer`] serves [`Reply::Text`] and [`Reply::ToolCalls`] as a `response`: a tool call
//! answer starts with a reasoning item, its encrypted content when the request asked for it
//! (`include`), so a test can see it sent back.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use super::{COMPLETION_TOKENS, Recorded, Reply, expected_usage};

const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "store",
    "include",
    "previous_response_id",
    "reasoning",
    "text",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "truncation",
];

/// What the real API would refuse in this request, if anything.
pub(super) fn fault(request: &Recorded, stored: &HashMap<String, Vec<String>>) -> Option<String> {
    let body = &request.body;
    let Some(fields) = body.as_object() else {
        return Some("the body must be a JSON object".into());
    };
    if let Some(unknown) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Some(format!("Unknown parameter: '{unknown}'."));
    }
    if !body["model"].is_string() {
        return Some("Missing required parameter: 'model'.".into());
    }
    if body["temperature"]
        .as_f64()
        .is_some_and(|t| !(0.0..=2.0).contains(&t))
    {
        return Some("Invalid 'temperature': decimal above maximum value.".into());
    }
    if body["max_output_tokens"].as_u64().is_some_and(|n| n < 16) {
        return Some(
            "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16"
                .into(),
        );
    }
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if let Some(fault) = tool_fault(tool) {
            return Some(format!("tools[{i}]: {fault}"));
        }
    }
    let store = body["store"] != false;
    // Calls asked and not answered yet; those of the stored response continued first.
    let mut asked: Vec<String> = Vec::new();
    let mut known_calls: HashSet<String> = HashSet::new();
    if let Some(previous) = body.get("previous_response_id") {
        let id = previous.as_str().unwrap_or_default();
        match stored.get(id) {
            Some(calls) => {
                asked.extend(calls.iter().cloned());
                known_calls.extend(calls.iter().cloned());
            }
            None => return Some(format!("Previous response with id '{id}' not found.")),
        }
    }
    let Some(items) = body["input"].as_array() else {
        return Some("Invalid 'input': expected an array of items.".into());
    };
    let mut item_ids = HashSet::new();
    let mut images = 0;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if let Some(id) = item["id"].as_str()
            && !item_ids.insert(id.to_owned())
        {
            return Some(format!("Duplicate item found with id {id}."));
        }
        match (item["type"].as_str(), item["role"].as_str()) {
            (Some("function_call"), _) => {
                let (Some(id), true, true) = (
                    item["call_id"].as_str(),
                    item["name"].is_string(),
                    item["arguments"].is_string(),
                ) else {
                    return Some(format!(
                        "{at}: a function_call needs call_id, name and arguments"
                    ));
                };
                asked.push(id.to_owned());
                known_calls.insert(id.to_owned());
            }
            (Some("function_call_output"), _) => {
                let id = item["call_id"].as_str().unwrap_or_default();
                if !known_calls.contains(id) {
                    return Some(format!(
                        "No tool call found for function call output with call_id {id}."
                    ));
                }
                asked.retain(|asked| asked != id);
                match &item["output"] {
                    Value::String(_) => {}
                    Value::Array(parts) => {
                        for part in parts {
                            if let Some(fault) = part_fault(part, &mut images) {
                                return Some(format!("{at}.output: {fault}"));
                            }
                        }
                    }
                    _ => return Some(format!("{at}.output: expected a string or a list")),
                }
            }
            (Some("reasoning"), _) => {
                let id = item["id"].as_str().unwrap_or("?");
                if !item["summary"].is_array() {
                    return Some(format!("Missing required parameter: '{at}.summary'."));
                }
                if !store && !item["encrypted_content"].is_string() {
                    return Some(format!(
                        "Item with id '{id}' not found. Items are not persisted when `store` is set to false."
                    ));
                }
                let follows = items
                    .get(i + 1)
                    .is_some_and(|next| next["type"] != "reasoning");
                if !follows {
                    return Some(format!(
                        "Item '{id}' of type 'reasoning' was provided without its required following item."
                    ));
                }
            }
            (None | Some("message"), Some("user" | "system" | "developer" | "assistant")) => {
                match &item["content"] {
                    Value::String(_) => {}
                    Value::Array(parts) => {
                        for part in parts {
                            if let Some(fault) = part_fault(part, &mut images) {
                                return Some(format!("{at}.content: {fault}"));
                            }
                        }
                    }
                    _ => return Some(format!("{at}.content: expected a string or a list")),
                }
            }
            _ => return Some(format!("{at}: Invalid value: unknown item type or role")),
        }
    }
    if let Some(id) = asked.first() {
        return Some(format!("No tool output found for function call {id}."));
    }
    None
}

fn tool_fault(tool: &Value) -> Option<String> {
    if tool["type"] != "function" {
        return Some("only function tools are scripted".into());
    }
    let name = tool["name"].as_str().unwrap_or_default();
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Some(format!(
            "Invalid 'name': string does not match pattern '^[a-zA-Z0-9_-]+$' ({name})"
        ));
    }
    if !tool["parameters"].is_object() {
        return Some("Invalid 'parameters': expected an object".into());
    }
    if tool["strict"] != false && tool["parameters"]["additionalProperties"] != false {
        return Some(format!(
            "Invalid schema for function '{name}': In context=(), 'additionalProperties' is required to be supplied and to be false."
        ));
    }
    None
}

fn part_fault(part: &Value, images: &mut usize) -> Option<String> {
    match part["type"].as_str() {
        Some("input_text" | "output_text") if part["text"].is_string() => None,
        Some("input_file") => None,
        Some("input_image") => {
            *images += 1;
            if *images > 500 {
                return Some("too many images (at most 500)".into());
            }
            if !["low", "high", "auto"].contains(&part["detail"].as_str().unwrap_or("auto")) {
                return Some("Invalid 'detail'".into());
            }
            let url = part["image_url"].as_str().unwrap_or_default();
            if url.starts_with("https://") {
                return None;
            }
            let Some((media_type, data)) = url
                .strip_prefix("data:")
                .and_then(|u| u.split_once(";base64,"))
            else {
                return Some(
                    "Invalid 'image_url': expected a base64 data URL or an https URL".into(),
                );
            };
            if !["image/png", "image/jpeg", "image/webp", "image/gif"].contains(&media_type) {
                return Some(format!("Invalid image media type {media_type}"));
            }
            (data.len() > 20 * 1024 * 1024).then(|| "image exceeds 20 MB".into())
        }
        other => Some(format!("Invalid content part type {other:?}")),
    }
}

/// The `response` for `reply` to request `number`, for the replies it translates.
pub(super) fn answer(
    number: usize,
    request: &Value,
    reply: Option<&Reply>,
    stored: &mut HashMap<String, Vec<String>>,
) -> Option<Value> {
    let id = format!("resp_scripted_{number}");
    let (output, calls) = match reply? {
        Reply::Text(text) => (
            vec![
                json!({"type": "message", "id": format!("msg_{number}"), "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}),
            ],
            Vec::new(),
        ),
        Reply::ToolCalls(calls) => {
            let mut reasoning =
                json!({"type": "reasoning", "id": format!("rs_{number}"), "summary": []});
            let include = request["include"].as_array().into_iter().flatten();
            if include
                .into_iter()
                .any(|i| i == "reasoning.encrypted_content")
            {
                reasoning["encrypted_content"] = json!(format!("enc-{number}"));
            }
            let mut output = vec![reasoning];
            output.extend(calls.iter().enumerate().map(|(k, (call_id, name, arguments))| {
                json!({"type": "function_call", "id": format!("fc_{number}_{k}"), "call_id": call_id,
                       "name": name, "arguments": arguments, "status": "completed"})
            }));
            (output, calls.iter().map(|(id, ..)| id.clone()).collect())
        }
        _ => return None,
    };
    if request["store"] != false {
        stored.insert(id.clone(), calls);
    }
    let items = request["input"].as_array().map_or(0, Vec::len);
    let (input_tokens, _, _) = expected_usage(items);
    Some(json!({
        "id": id,
        "object": "response",
        "status": "completed",
        "model": request["model"],
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": COMPLETION_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + COMPLETION_TOKENS,
        },
    }))
}
