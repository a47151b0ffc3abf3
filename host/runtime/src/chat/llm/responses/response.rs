//! A Responses response as a `chat.completion`.
//!
//! `message` items' `output_text` becomes the message's `content` (a `refusal` part its
//! `refusal`, with `finish_reason` `content_filter`), `function_call` items its
//! `tool_calls` (ids made valid and unique, see [`crate::chat::llm::ids`]); `status` and
//! `incomplete_details` become the `finish_reason` (`max_output_tokens` is `length`); the
//! usage keeps cached and reasoning tokens in OpenAI's `*_details`. Reasoning items
//! (stateless) or the response's id (chained) are kept in the message's
//! [`RICH_CONTENT_FIELD`] for the next request. A `failed` response is not an answer.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::State;
use crate::chat::llm::AnswerError;
use crate::chat::llm::RICH_CONTENT_FIELD;
use crate::chat::llm::ids::{self, Ids};
use crate::chat::wire::{ChatCompletion, FunctionCall, ToolCall, Usage};
use crate::json::Unquoted;

#[derive(Deserialize)]
struct Response {
    id: Option<String>,
    model: Option<String>,
    status: Option<String>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    error: Option<Failure>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    incomplete_details: Option<Incomplete>,
    #[serde(default, deserialize_with = "crate::json::list")]
    output: Option<Vec<Item>>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    usage: Option<ResponseUsage>,
}

#[derive(Deserialize)]
struct Failure {
    code: Option<String>,
    message: Option<String>,
}

#[derive(Deserialize)]
struct Incomplete {
    reason: Option<String>,
}

/// An output item: only the fields of `message`, `function_call` and `reasoning` items.
#[derive(Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, deserialize_with = "crate::json::list")]
    content: Option<Vec<Part>>,
    call_id: Option<Box<RawValue>>,
    name: Option<String>,
    arguments: Option<String>,
    id: Option<String>,
    #[serde(default, deserialize_with = "crate::json::list")]
    summary: Option<Vec<Part>>,
    encrypted_content: Option<String>,
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct ResponseUsage {
    input_tokens: Option<Box<RawValue>>,
    output_tokens: Option<Box<RawValue>>,
    total_tokens: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    input_tokens_details: Option<Details>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    output_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<Box<RawValue>>,
    reasoning_tokens: Option<Box<RawValue>>,
}

fn count(raw: &Option<Box<RawValue>>) -> Option<u64> {
    raw.as_ref().and_then(|raw| raw.get().parse().ok())
}

/// The `chat.completion` for a Responses response body, or why it is not one.
pub(in crate::chat::llm) fn from_responses(
    body: &[u8],
    state: State,
) -> Result<ChatCompletion, AnswerError> {
    let Unquoted(response) = crate::json::from_slice::<Unquoted<Response>>(body)?;
    match response.status.as_deref() {
        Some("completed" | "incomplete") | None => {}
        Some("failed") => {
            let error = response.error.as_ref();
            let code = error.and_then(|e| e.code.as_deref()).unwrap_or("unknown");
            let message = error.and_then(|e| e.message.as_deref()).unwrap_or("");
            let message: String = message.chars().take(300).collect();
            return Err(AnswerError::shape(format!(
                "the response failed ({code}): {message}"
            )));
        }
        Some(other) => {
            let other: String = other.chars().take(32).collect();
            return Err(AnswerError::shape(format!(
                "the response is `{other}`, not finished (background responses are not supported)"
            )));
        }
    }
    let items = response
        .output
        .ok_or_else(|| AnswerError::shape("no `output` array of items"))?;
    let given_ids: Vec<Option<String>> = items
        .iter()
        .map(|item| {
            let raw = item
                .call_id
                .as_ref()
                .filter(|_| item.kind == "function_call")?;
            ids::CALL.parse_raw(raw.get())
        })
        .collect();
    let mut ids = Ids::new(ids::CALL, given_ids.iter().flatten().map(String::as_str));
    let mut text = String::new();
    let mut refusal = String::new();
    let mut tool_calls = Vec::new();
    let mut kept = Vec::new();
    for (item, given_id) in items.into_iter().zip(given_ids) {
        match item.kind.as_str() {
            "message" => {
                for part in item.content.into_iter().flatten() {
                    match part.kind.as_str() {
                        "output_text" => text.push_str(part.text.as_deref().unwrap_or_default()),
                        "refusal" => refusal.push_str(part.refusal.as_deref().unwrap_or_default()),
                        _ => {}
                    }
                }
            }
            "function_call" => {
                let name = item.name.ok_or_else(|| {
                    AnswerError::shape("a `function_call` item without a string `name`")
                })?;
                tool_calls.push(ToolCall {
                    id: Some(Some(ids.claim(given_id.as_deref()))),
                    kind: Some(Some("function".into())),
                    function: FunctionCall {
                        name,
                        arguments: item.arguments.unwrap_or_default(),
                        rest: Map::new(),
                    },
                    rest: Map::new(),
                });
            }
            "reasoning" if state == State::Stateless => {
                if let Some(encrypted) = item.encrypted_content {
                    let summary: Vec<Value> = item
                        .summary
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.text)
                        .map(|text| json!({"type": "summary_text", "text": text}))
                        .collect();
                    kept.push(json!({
                        "type": "reasoning",
                        "id": item.id,
                        "summary": summary,
                        "encrypted_content": encrypted,
                    }));
                }
            }
            // Built-in tool calls and the like are not the loop's to answer.
            _ => {}
        }
    }
    if state == State::Chained
        && let Some(id) = &response.id
    {
        kept.push(json!({"type": "response", "id": id, "tag": super::response_tag(id)}));
    }
    let content = if text.is_empty() && (!tool_calls.is_empty() || !refusal.is_empty()) {
        Value::Null
    } else {
        Value::String(text)
    };
    let mut rest = Map::new();
    if !refusal.is_empty() {
        rest.insert("refusal".into(), json!(refusal));
    }
    if !kept.is_empty() {
        rest.insert(RICH_CONTENT_FIELD.into(), Value::Array(kept));
    }
    let finish_reason = match (
        response.status.as_deref(),
        response.incomplete_details.and_then(|d| d.reason),
    ) {
        (Some("incomplete"), Some(reason)) => match reason.as_str() {
            "max_output_tokens" => "length".to_owned(),
            "content_filter" => "content_filter".to_owned(),
            // Cut: the server's text reaches the guest and the observers.
            _ => reason.chars().take(64).collect(),
        },
        _ if !refusal.is_empty() => "content_filter".to_owned(),
        _ if !tool_calls.is_empty() => "tool_calls".to_owned(),
        _ => "stop".to_owned(),
    };
    Ok(ChatCompletion::translated(
        json!(response.id),
        json!(response.model),
        content,
        tool_calls,
        rest,
        Some(finish_reason),
        response.usage.as_ref().and_then(usage),
    ))
}

/// OpenAI chat usage: cached input tokens as `prompt_tokens_details.cached_tokens`,
/// reasoning tokens as `completion_tokens_details.reasoning_tokens`.
fn usage(usage: &ResponseUsage) -> Option<Usage> {
    let input = count(&usage.input_tokens)?;
    let output = count(&usage.output_tokens)?;
    let mut rest = Map::new();
    if let Some(cached) = usage
        .input_tokens_details
        .as_ref()
        .and_then(|d| count(&d.cached_tokens))
    {
        rest.insert(
            "prompt_tokens_details".into(),
            json!({"cached_tokens": cached}),
        );
    }
    if let Some(reasoning) = usage
        .output_tokens_details
        .as_ref()
        .and_then(|d| count(&d.reasoning_tokens))
    {
        rest.insert(
            "completion_tokens_details".into(),
            json!({"reasoning_tokens": reasoning}),
        );
    }
    Some(Usage {
        prompt_tokens: Some(input),
        completion_tokens: Some(output),
        total_tokens: Some(
            count(&usage.total_tokens).unwrap_or_else(|| input.saturating_add(output)),
        ),
        rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_where_an_object_or_list_belongs_is_not_quoted() {
        crate::json::assert_strings_unquoted::<Unquoted<Response>>(&[
            "BIG",
            r#"{"error": BIG}"#,
            r#"{"incomplete_details": BIG}"#,
            r#"{"output": BIG}"#,
            r#"{"output": [BIG]}"#,
            r#"{"output": [{"type": "message", "content": BIG}]}"#,
            r#"{"output": [{"type": "message", "content": [BIG]}]}"#,
            r#"{"output": [{"type": "reasoning", "summary": [BIG]}]}"#,
            r#"{"usage": BIG}"#,
            r#"{"usage": {"input_tokens_details": BIG}}"#,
            r#"{"usage": {"output_tokens_details": BIG}}"#,
        ]);
    }
}
