//! The scripted server's Gemini `generateContent` (`POST /v1/models/{model}:generateContent`).
//!
//! [`fault`] answers a 400 (a Google error body) for what the real API refuses:
//! - a top-level field it does not know; no `contents`; a turn whose role is not
//!   `user`/`model`, whose `parts` are empty, or of the same role as the turn before;
//! - a part that is not exactly one of `text`, `inlineData`, `functionCall`,
//!   `functionResponse` (with an optional `thoughtSignature`), or whose text is empty;
//! - a model turn of function calls not followed by a user turn of exactly as many
//!   function responses, naming the calls (and their ids, when the calls have some); a
//!   function response anywhere else; a `response` that is not an object;
//! - on `gemini-3*` models, a model turn whose first function call has no
//!   `thoughtSignature`; on other models, a function response with `parts` (images);
//! - inline data that is not PNG, JPEG or WebP (HEIC/HEIF too, outside function
//!   responses) base64, or more than 20 MB of it in the request;
//! - a function declaration whose name does not start with a letter or `_` or is longer
//!   than 64, or whose `parameters` use a field the OpenAPI subset does not have
//!   (`additionalProperties`, `$ref`, `$schema`, ...), a type it does not know, an `OBJECT`
//!   without properties or an `ARRAY` without `items`;
//! - a `temperature` outside 0–2, more than 5 stop sequences.
//!
//! [`answer`] serves [`Reply::Text`] and [`Reply::ToolCalls`] as a `generateContent`
//! response: on `gemini-3*` models function calls carry ids and the first one a thought
//! signature; on others neither, as Gemini 2 answers.

use serde_json::{Value, json};

use super::{COMPLETION_TOKENS, Recorded, Reply, expected_usage};

/// The model a request's path names.
pub(super) fn model(path: &str) -> &str {
    path.strip_prefix("/v1/models/")
        .and_then(|rest| rest.strip_suffix(":generateContent"))
        .unwrap_or_default()
}

fn gemini_3(model: &str) -> bool {
    model.starts_with("gemini-3")
}

const SCHEMA_FIELDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// A Google API error body.
pub(super) fn error_body(code: u16, message: &str) -> Value {
    let status = match code {
        400 => "INVALID_ARGUMENT",
        429 => "RESOURCE_EXHAUSTED",
        _ => "INTERNAL",
    };
    json!({"error": {"code": code, "message": message, "status": status}})
}

/// What the real API would refuse in this request, if anything.
pub(super) fn fault(request: &Recorded) -> Option<String> {
    let body = &request.body;
    let model = model(&request.path);
    let Some(fields) = body.as_object() else {
        return Some("Invalid JSON payload received.".into());
    };
    const KNOWN: &[&str] = &[
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "generationConfig",
        "safetySettings",
        "cachedContent",
    ];
    if let Some(unknown) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Some(format!(
            "Invalid JSON payload received. Unknown name \"{unknown}\": Cannot find field."
        ));
    }
    let config = &body["generationConfig"];
    if config["temperature"]
        .as_f64()
        .is_some_and(|t| !(0.0..=2.0).contains(&t))
    {
        return Some("generationConfig.temperature: must be between 0 and 2".into());
    }
    if config["stopSequences"]
        .as_array()
        .is_some_and(|s| s.len() > 5)
    {
        return Some("generationConfig.stopSequences: at most 5".into());
    }
    let declarations = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten());
    for (i, declaration) in declarations.enumerate() {
        let at = format!("tools[0].function_declarations[{i}]");
        let name = declaration["name"].as_str().unwrap_or_default();
        let valid = (1..=64).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if !valid {
            return Some(format!(
                "* GenerateContentRequest.{at}.name: Invalid function name. Must start with a letter or an underscore."
            ));
        }
        if let Some(parameters) = declaration.get("parameters")
            && let Some(fault) = schema_fault(parameters, &format!("{at}.parameters"))
        {
            return Some(fault);
        }
    }
    let Some(contents) = body["contents"].as_array().filter(|c| !c.is_empty()) else {
        return Some("* GenerateContentRequest.contents: contents is not specified".into());
    };
    let mut inline_bytes = 0;
    // The function calls of the model turn before: (id, name).
    let mut calls: Vec<(Value, Value)> = Vec::new();
    for (i, content) in contents.iter().enumerate() {
        let at = format!("contents[{i}]");
        let role = content["role"].as_str().unwrap_or_default();
        if !["user", "model"].contains(&role) {
            return Some(format!("{at}.role: Please use a valid role: user, model."));
        }
        if i > 0 && contents[i - 1]["role"] == role {
            return Some(
                "Please ensure that multiturn requests alternate between user and model.".into(),
            );
        }
        let Some(parts) = content["parts"].as_array().filter(|p| !p.is_empty()) else {
            return Some(format!(
                "* GenerateContentRequest.{at}.parts: contents.parts must not be empty."
            ));
        };
        for part in parts {
            if let Some(fault) = part_fault(part, model, &mut inline_bytes) {
                return Some(format!("{at}: {fault}"));
            }
        }
        let responses: Vec<&Value> = parts
            .iter()
            .filter_map(|p| p.get("functionResponse"))
            .collect();
        if !calls.is_empty() || !responses.is_empty() {
            if responses.len() != calls.len() {
                return Some("Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.".into());
            }
            for (response, (id, name)) in responses.iter().zip(&calls) {
                if response["name"] != *name || (!id.is_null() && response["id"] != *id) {
                    return Some(format!(
                        "{at}: function response {} does not match its function call {name}",
                        response["name"]
                    ));
                }
            }
        }
        calls = parts
            .iter()
            .filter_map(|p| p.get("functionCall"))
            .map(|c| (c["id"].clone(), c["name"].clone()))
            .collect();
        if role == "model" && !calls.is_empty() && gemini_3(model) {
            let first = parts.iter().find(|p| p.get("functionCall").is_some());
            if first.is_some_and(|p| !p["thoughtSignature"].is_string()) {
                return Some(format!(
                    "Function call is missing a thought_signature in functionCall parts. {at}"
                ));
            }
        }
    }
    if !calls.is_empty() {
        return Some("Please ensure that function call turn comes immediately before a function response turn.".into());
    }
    None
}

fn part_fault(part: &Value, model: &str, inline_bytes: &mut usize) -> Option<String> {
    let data_fields = ["text", "inlineData", "functionCall", "functionResponse"];
    let present: Vec<&str> = data_fields
        .into_iter()
        .filter(|f| part.get(*f).is_some())
        .collect();
    if present.len() != 1 {
        return Some(format!(
            "a part must have exactly one data field (has {present:?})"
        ));
    }
    if let Some(other) = part.as_object().and_then(|p| {
        p.keys().find(|k| {
            !data_fields.contains(&k.as_str()) && *k != "thoughtSignature" && *k != "thought"
        })
    }) {
        return Some(format!(
            "Invalid JSON payload received. Unknown name \"{other}\""
        ));
    }
    match present[0] {
        "text" if part["text"].as_str().is_none_or(str::is_empty) => {
            Some("Unable to submit request because it has an empty text parameter.".into())
        }
        "inlineData" => blob_fault(&part["inlineData"], true, inline_bytes),
        "functionResponse" => {
            let response = &part["functionResponse"];
            if !response["response"].is_object() {
                return Some("functionResponse.response: must be an object".into());
            }
            if let Some(inline) = response.get("parts") {
                if !gemini_3(model) {
                    return Some(format!(
                        "Multimodal function response is not supported for model {model}."
                    ));
                }
                for part in inline.as_array().into_iter().flatten() {
                    if let Some(fault) = blob_fault(&part["inlineData"], false, inline_bytes) {
                        return Some(format!("functionResponse.parts: {fault}"));
                    }
                }
            }
            None
        }
        _ => None,
    }
}

fn blob_fault(blob: &Value, heic: bool, inline_bytes: &mut usize) -> Option<String> {
    let media_type = blob["mimeType"].as_str().unwrap_or_default();
    let mut types = vec!["image/png", "image/jpeg", "image/webp"];
    if heic {
        types.extend(["image/heic", "image/heif"]);
    }
    if !types.contains(&media_type) {
        return Some(format!("Unsupported MIME type: {media_type}"));
    }
    let data = blob["data"].as_str().unwrap_or_default();
    if data.is_empty() {
        return Some("inlineData.data: empty".into());
    }
    *inline_bytes += data.len();
    (*inline_bytes > 20 * 1000 * 1000)
        .then(|| "Request payload size exceeds the limit: 20971520 bytes.".into())
}

fn schema_fault(schema: &Value, at: &str) -> Option<String> {
    let Some(fields) = schema.as_object() else {
        return Some(format!("{at}: a schema must be an object"));
    };
    if let Some(unknown) = fields.keys().find(|k| !SCHEMA_FIELDS.contains(&k.as_str())) {
        return Some(format!(
            "Invalid JSON payload received. Unknown name \"{unknown}\" at '{at}': Cannot find field."
        ));
    }
    if let Some(any) = fields.get("anyOf") {
        return any
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .find_map(|(i, s)| schema_fault(s, &format!("{at}.any_of[{i}]")));
    }
    let kind = fields
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_uppercase();
    match kind.as_str() {
        "OBJECT" => {
            let Some(properties) = fields
                .get("properties")
                .and_then(Value::as_object)
                .filter(|p| !p.is_empty())
            else {
                return Some(format!(
                    "* {at}.properties: should be non-empty for OBJECT type"
                ));
            };
            properties
                .iter()
                .find_map(|(name, s)| schema_fault(s, &format!("{at}.properties[{name}]")))
        }
        "ARRAY" => match fields.get("items") {
            Some(items) => schema_fault(items, &format!("{at}.items")),
            None => Some(format!("* {at}.items: missing field.")),
        },
        "STRING" | "NUMBER" | "INTEGER" | "BOOLEAN" => {
            let enumerated = fields.get("enum").and_then(Value::as_array);
            if enumerated.is_some_and(|e| kind != "STRING" || !e.iter().all(Value::is_string)) {
                return Some(format!("* {at}.enum: only allowed for STRING type"));
            }
            None
        }
        other => Some(format!("* {at}.type: invalid type {other:?}")),
    }
}

/// The response for `reply` to request `number`, for the replies it translates.
pub(super) fn answer(
    number: usize,
    path: &str,
    request: &Value,
    reply: Option<&Reply>,
) -> Option<Value> {
    let model = model(path);
    let (parts, finish) = match reply? {
        Reply::Text(text) => (vec![json!({"text": text})], "STOP"),
        Reply::ToolCalls(calls) => {
            let parts = calls
                .iter()
                .enumerate()
                .map(|(k, (id, name, arguments))| {
                    let args: Value = serde_json::from_str(arguments)
                        .expect("scripted LLM: tool call arguments must be JSON");
                    let mut part = json!({"functionCall": {"name": name, "args": args}});
                    if gemini_3(model) {
                        part["functionCall"]["id"] = json!(id);
                        if k == 0 {
                            part["thoughtSignature"] = json!(format!("sig-{number}"));
                        }
                    }
                    part
                })
                .collect();
            (parts, "STOP")
        }
        _ => return None,
    };
    let turns = request["contents"].as_array().map_or(0, Vec::len);
    let (prompt, _, _) = expected_usage(turns);
    Some(json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": COMPLETION_TOKENS,
            "totalTokenCount": prompt + COMPLETION_TOKENS,
        },
        "modelVersion": model,
        "responseId": format!("gemini-scripted-{number}"),
    }))
}
