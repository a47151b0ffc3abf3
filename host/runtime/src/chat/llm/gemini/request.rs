//! An OpenAI chat-completions request as a Gemini `generateContent` request.
//!
//! `system` and `developer` messages become `systemInstruction`; tools become
//! `functionDeclarations` (schemas reduced by [`super::schema`]); user messages become
//! `user` turns of `text` and `inlineData` parts; an assistant message a `model` turn of
//! text and `functionCall` parts (with the thought signatures its answer carried, kept in
//! [`RICH_CONTENT_FIELD`]); `tool` messages `functionResponse` parts, `{"output": text}`,
//! with the result's MCP images as `inlineData` parts inside the response on models that
//! take them ([`Options::images_in_results`]) and left as the text's notes on others.
//!
//! What the API would refuse is repaired, as for [`crate::chat::llm::anthropic`]: no empty
//! text or turn, turns of one role merged, call ids valid and unique, every function call
//! answered in the next turn by as many responses (an error response for a missing one),
//! a response answering no call sent as text, a model turn's first call with a thought
//! signature (Gemini 3 refuses one without; a call the model did not make gets the
//! documented placeholder), the newest [`defaults::LLM_MAX_IMAGES_PER_REQUEST`] images of
//! at most [`defaults::GEMINI_MAX_IMAGE_BYTES_PER_REQUEST`] of base64, `temperature` as
//! given (Gemini's range is OpenAI's 0–2), at most 5 `stop` sequences.
//!
//! What cannot be repaired, a tool schema Gemini cannot express, is an error naming it.

use serde_json::{Map, Value, json};

use super::{Options, schema};
use crate::chat::images;
use crate::chat::llm::RICH_CONTENT_FIELD;
use crate::chat::llm::anthropic::{text_of, tool_name};
use crate::chat::llm::ids::{self, Ids};
use crate::defaults;

/// The thought signature Gemini documents for function calls it did not make.
const PLACEHOLDER_SIGNATURE: &str = "skip_thought_signature_validator";

/// Image types Gemini takes inline.
const MEDIA_TYPES: [&str; 3] = ["image/png", "image/jpeg", "image/webp"];

/// The `generateContent` request for an OpenAI chat-completions `body`, or why none can
/// be made.
pub(in crate::chat::llm) fn to_gemini(body: &Value, options: &Options) -> Result<Value, String> {
    let messages: &[Value] = body["messages"].as_array().map_or(&[], Vec::as_slice);
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    let mut ids = Ids::new(
        ids::CALL,
        messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
            .filter_map(|call| call["id"].as_str()),
    );
    // The calls of the last model turn not answered yet: (id given, id sent, name).
    let mut asked: Vec<(String, String, String)> = Vec::new();
    for message in messages {
        match message["role"].as_str() {
            Some("system" | "developer") => {
                let text = text_of(&message["content"]);
                if !text.trim().is_empty() {
                    system.push(text);
                }
            }
            Some("assistant") => {
                let parts = model_parts(message, &mut ids, &mut asked);
                push(&mut turns, Role::Model, parts);
            }
            Some("tool") => {
                let part = function_response(message, &mut asked, options.images_in_results);
                push(&mut turns, Role::User, part);
            }
            _ => push(&mut turns, Role::User, user_parts(&message["content"])),
        }
    }
    answer_every_call(&mut turns);
    keep_newest_images(&mut turns);

    let mut request = Map::new();
    let contents: Vec<Value> = turns
        .into_iter()
        .map(|turn| json!({"role": turn.role.as_str(), "parts": turn.parts}))
        .collect();
    request.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        request.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": system.join("\n\n")}]}),
        );
    }
    if let Some(tools) = body["tools"].as_array().filter(|t| !t.is_empty()) {
        let mut declarations = Vec::new();
        for tool in tools {
            declarations.push(declaration(&tool["function"])?);
        }
        request.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
        if let Some(config) = tool_config(&body["tool_choice"]) {
            request.insert(
                "toolConfig".into(),
                json!({"functionCallingConfig": config}),
            );
        }
    }
    let config = generation_config(body)?;
    if !config.is_empty() {
        request.insert("generationConfig".into(), Value::Object(config));
    }
    Ok(Value::Object(request))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    User,
    Model,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Model => "model",
        }
    }
}

struct Turn {
    role: Role,
    parts: Vec<Value>,
}

/// Adds a `role` turn of `parts`: nothing when they are none, merged into the last turn
/// when that has the same role (function responses first).
fn push(turns: &mut Vec<Turn>, role: Role, parts: Vec<Value>) {
    if parts.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => {
            last.parts.extend(parts);
            last.parts
                .sort_by_key(|p| p.get("functionResponse").is_none());
        }
        _ => turns.push(Turn { role, parts }),
    }
}

fn text(text: String) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"text": text}))
}

/// An assistant message's text and function calls, each call with its signature.
fn model_parts(
    message: &Value,
    ids: &mut Ids,
    asked: &mut Vec<(String, String, String)>,
) -> Vec<Value> {
    asked.clear();
    let mut parts: Vec<Value> = text(text_of(&message["content"])).into_iter().collect();
    let kept = message[RICH_CONTENT_FIELD]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let signature_of = |id: &str| {
        kept.iter()
            .find(|k| k["type"] == "thought_signature" && k["tool_call_id"] == id)
            .and_then(|k| k["signature"].as_str())
    };
    for (k, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let given = call["id"]
            .as_str()
            .map_or_else(|| format!("call_{k}"), str::to_owned);
        let id = ids.claim(Some(&given));
        let name = gemini_name(call["function"]["name"].as_str().unwrap_or(""));
        let args = match &call["function"]["arguments"] {
            Value::String(text) => match crate::json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => Value::Object(map),
                _ => json!({}),
            },
            Value::Object(map) => Value::Object(map.clone()),
            _ => json!({}),
        };
        let mut part = json!({"functionCall": {"id": id, "name": name, "args": args}});
        if let Some(signature) = signature_of(&given) {
            part["thoughtSignature"] = json!(signature);
        }
        parts.push(part);
        asked.push((given, id, name));
    }
    let first_call = parts.iter_mut().find(|p| p.get("functionCall").is_some());
    if let Some(first) = first_call
        && first.get("thoughtSignature").is_none()
    {
        first["thoughtSignature"] = json!(PLACEHOLDER_SIGNATURE);
    }
    parts
}

/// A `tool` message: the response to the call it answers, or text if none.
fn function_response(
    message: &Value,
    asked: &mut Vec<(String, String, String)>,
    images_in_results: bool,
) -> Vec<Value> {
    let output = text_of(&message["content"]);
    let given = message["tool_call_id"].as_str();
    let Some(at) = asked.iter().position(|(id, ..)| Some(id.as_str()) == given) else {
        let shown: String = given.unwrap_or("?").chars().take(64).collect();
        let mut parts = vec![json!({"text": format!(
            "[result of tool call {shown}, which no earlier tool call matches]"
        )})];
        parts.extend(text(output));
        return parts;
    };
    let (_, id, name) = asked.remove(at);
    let mut response = json!({"id": id, "name": name, "response": {"output": output}});
    if images_in_results {
        let inline: Vec<Value> = message[RICH_CONTENT_FIELD]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|part| part["type"] == "image" && part["source"]["type"] == "base64")
            .map(|part| {
                let source = &part["source"];
                json!({"inlineData": {"mimeType": source["media_type"], "data": source["data"]}})
            })
            .collect();
        if !inline.is_empty() {
            response["parts"] = Value::Array(inline);
        }
    }
    vec![json!({"functionResponse": response})]
}

/// A user message's content: text, and `data:` image URLs as `inlineData`; other parts
/// as notes.
fn user_parts(content: &Value) -> Vec<Value> {
    let Value::Array(parts) = content else {
        return text(text_of(content)).into_iter().collect();
    };
    parts
        .iter()
        .filter_map(|part| match part["type"].as_str() {
            Some("text") => text(part["text"].as_str()?.to_owned()),
            Some("image_url") => {
                let url = part["image_url"]["url"]
                    .as_str()
                    .or_else(|| part["image_url"].as_str())
                    .unwrap_or("");
                Some(
                    match url
                        .strip_prefix("data:")
                        .and_then(|u| u.split_once(";base64,"))
                    {
                        Some((media_type, data)) => {
                            json!({"inlineData": {"mimeType": media_type, "data": data}})
                        }
                        None => note("[image not sent: Gemini takes only data: image URLs]"),
                    },
                )
            }
            other => Some(note(&format!(
                "[{} part not sent: only text and images are]",
                other.unwrap_or("unknown")
            ))),
        })
        .collect()
}

fn note(text: &str) -> Value {
    json!({"text": text})
}

/// Gives every model turn's function calls a user turn after it with a response to each,
/// the only place the API looks for them, in the calls' order.
fn answer_every_call(turns: &mut Vec<Turn>) {
    let mut i = 0;
    while i < turns.len() {
        if turns[i].role == Role::Model {
            let calls: Vec<(Value, Value)> = turns[i]
                .parts
                .iter()
                .map(|p| {
                    (
                        p["functionCall"]["id"].clone(),
                        p["functionCall"]["name"].clone(),
                    )
                })
                .filter(|(id, _)| !id.is_null())
                .collect();
            if !calls.is_empty() {
                if turns.get(i + 1).is_none_or(|t| t.role != Role::User) {
                    turns.insert(
                        i + 1,
                        Turn {
                            role: Role::User,
                            parts: Vec::new(),
                        },
                    );
                }
                let next = &mut turns[i + 1];
                let mut responses: Vec<Value> = Vec::new();
                for (id, name) in calls {
                    let found = next
                        .parts
                        .iter()
                        .position(|p| p["functionResponse"]["id"] == id);
                    responses.push(match found {
                        Some(at) => next.parts.remove(at),
                        None => json!({"functionResponse": {"id": id, "name": name, "response": {
                            "error": "no result was recorded for this tool call"}}}),
                    });
                }
                responses.append(&mut next.parts);
                next.parts = responses;
            }
        }
        i += 1;
    }
}

/// Checks the images of `turns`, newest first, keeping those the request has room for
/// and turning the rest into notes (beside the response they were in).
fn keep_newest_images(turns: &mut [Turn]) {
    let mut budget = images::Budget::new(
        defaults::LLM_MAX_IMAGES_PER_REQUEST,
        defaults::GEMINI_MAX_IMAGE_BYTES_PER_REQUEST,
    );
    for turn in turns.iter_mut().rev() {
        let mut notes = Vec::new();
        for part in turn.parts.iter_mut().rev() {
            if part.get("inlineData").is_some() {
                if let Err(why) = admit(&mut part["inlineData"], &mut budget) {
                    *part = note(&why);
                }
            } else if let Some(inline) = part
                .get_mut("functionResponse")
                .and_then(|r| r.get_mut("parts"))
                .and_then(Value::as_array_mut)
            {
                inline.reverse();
                inline.retain_mut(|p| match admit(&mut p["inlineData"], &mut budget) {
                    Ok(()) => true,
                    Err(why) => {
                        notes.push(note(&why));
                        false
                    }
                });
                inline.reverse();
                if inline.is_empty()
                    && let Some(response) = part["functionResponse"].as_object_mut()
                {
                    response.remove("parts");
                }
            }
        }
        turn.parts.extend(notes);
    }
}

/// Whether an `inlineData` blob may go, or the note it becomes.
/// On success the blob's `mimeType` is the checked spelling (`IMAGE/PNG` goes as
/// `image/png`), so a type Gemini would refuse never makes every later turn fail.
fn admit(blob: &mut Value, budget: &mut images::Budget) -> Result<(), String> {
    let media_type = blob["mimeType"].as_str().unwrap_or("");
    let data = blob["data"].as_str().unwrap_or("");
    let checked =
        images::check(media_type, data).map_err(|why| format!("[image not sent: {why}]"))?;
    if !MEDIA_TYPES.contains(&checked) {
        return Err(format!("[image not sent: Gemini does not take {checked}]"));
    }
    if !budget.admit(data.len()) {
        return Err(budget.full_note());
    }
    blob["mimeType"] = Value::from(checked);
    Ok(())
}

fn declaration(function: &Value) -> Result<Value, String> {
    let name = function["name"].as_str().unwrap_or("");
    let mut out = json!({"name": gemini_name(name)});
    if let Some(description) = function["description"].as_str() {
        out["description"] = json!(description);
    }
    let parameters = schema::parameters(&function["parameters"])
        .map_err(|why| format!("the parameters of tool `{name}`: {why}"))?;
    if let Some(parameters) = parameters {
        out["parameters"] = parameters;
    }
    Ok(out)
}

/// A tool name as Gemini takes it: it must start with a letter or `_`
/// ([`super::response`] maps the answer back).
pub(super) fn gemini_name(name: &str) -> String {
    let name = tool_name(name);
    if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        name
    } else {
        format!("_{}", &name[..name.len().min(63)])
    }
}

/// `tool_choice` as a `functionCallingConfig`.
fn tool_config(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Some(json!({"mode": "AUTO"})),
            "none" => Some(json!({"mode": "NONE"})),
            "required" => Some(json!({"mode": "ANY"})),
            _ => None,
        },
        Value::Object(_) => choice["function"]["name"]
            .as_str()
            .map(|name| json!({"mode": "ANY", "allowedFunctionNames": [gemini_name(name)]})),
        _ => None,
    }
}

fn generation_config(body: &Value) -> Result<Map<String, Value>, String> {
    let mut config = Map::new();
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ] {
        if body[from].is_number() {
            config.insert(to.into(), body[from].clone());
        }
    }
    if let Some(max) = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
    {
        config.insert("maxOutputTokens".into(), json!(max));
    }
    let stops: Vec<&Value> = match &body["stop"] {
        stop @ Value::String(_) => vec![stop],
        Value::Array(stops) => stops.iter().filter(|s| s.is_string()).take(5).collect(),
        _ => Vec::new(),
    };
    if !stops.is_empty() {
        config.insert("stopSequences".into(), json!(stops));
    }
    match body["response_format"]["type"].as_str() {
        Some("json_object") => {
            config.insert("responseMimeType".into(), json!("application/json"));
        }
        Some("json_schema") => {
            config.insert("responseMimeType".into(), json!("application/json"));
            let schema = &body["response_format"]["json_schema"]["schema"];
            if !schema.is_null() {
                let reduced = schema::response_schema(schema)
                    .map_err(|why| format!("the response_format schema: {why}"))?;
                config.insert("responseSchema".into(), reduced);
            }
        }
        _ => {}
    }
    Ok(config)
}
