//! A `generateContent` response as a `chat.completion`.
//!
//! The first candidate's `text` parts (not its thoughts) become the message's `content`,
//! its `functionCall` parts its `tool_calls` (ids made valid and unique, see
//! [`crate::chat::llm::ids`], generated when Gemini gives none; names mapped back from
//! [`super::request::gemini_name`]); their thought signatures are kept in the message's
//! [`RICH_CONTENT_FIELD`] for the next request. `finishReason` becomes the
//! `finish_reason` (`MAX_TOKENS` is `length`, the safety reasons `content_filter`); a
//! prompt blocked by `promptFeedback.blockReason` is an empty answer with a `refusal`
//! saying why and `content_filter`. `usageMetadata` becomes the usage: thoughts count as
//! completion tokens (and `reasoning_tokens`), cached content as `cached_tokens`.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::request::gemini_name;
use crate::chat::llm::AnswerError;
use crate::chat::llm::RICH_CONTENT_FIELD;
use crate::chat::llm::ids::{self, Ids};
use crate::chat::wire::{ChatCompletion, FunctionCall, ToolCall, Usage};
use crate::json::Unquoted;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default, deserialize_with = "crate::json::list")]
    candidates: Option<Vec<Candidate>>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    prompt_feedback: Option<Feedback>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    usage_metadata: Option<UsageMetadata>,
    model_version: Option<String>,
    response_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default, deserialize_with = "crate::json::optional")]
    content: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default, deserialize_with = "crate::json::list")]
    parts: Option<Vec<Part>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    text: Option<String>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    thought: Option<bool>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    function_call: Option<Call>,
    thought_signature: Option<String>,
}

#[derive(Deserialize)]
struct Call {
    id: Option<Box<RawValue>>,
    name: Option<String>,
    args: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Feedback {
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: Option<Box<RawValue>>,
    candidates_token_count: Option<Box<RawValue>>,
    thoughts_token_count: Option<Box<RawValue>>,
    tool_use_prompt_token_count: Option<Box<RawValue>>,
    cached_content_token_count: Option<Box<RawValue>>,
}

fn count(raw: &Option<Box<RawValue>>) -> Option<u64> {
    raw.as_ref().and_then(|raw| raw.get().parse().ok())
}

/// The `chat.completion` for a `generateContent` response body, or why it is not one;
/// `offered` are the tool names the request offered.
pub(in crate::chat::llm) fn from_gemini(
    body: &[u8],
    offered: &[&str],
) -> Result<ChatCompletion, AnswerError> {
    let Unquoted(response) = crate::json::from_slice::<Unquoted<Response>>(body)?;
    let candidate = response.candidates.into_iter().flatten().next();
    let block = response.prompt_feedback.and_then(|f| f.block_reason);
    let (parts, finish) = match (candidate, &block) {
        (Some(candidate), _) => (
            candidate.content.and_then(|c| c.parts).unwrap_or_default(),
            candidate.finish_reason,
        ),
        (None, Some(_)) => (Vec::new(), None),
        (None, None) => {
            return Err(AnswerError::shape(
                "no `candidates` and no `promptFeedback.blockReason`",
            ));
        }
    };
    let given_ids: Vec<Option<String>> = parts
        .iter()
        .map(|p| ids::CALL.parse_raw(p.function_call.as_ref()?.id.as_ref()?.get()))
        .collect();
    let mut ids = Ids::new(ids::CALL, given_ids.iter().flatten().map(String::as_str));
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut kept = Vec::new();
    for (part, given_id) in parts.into_iter().zip(given_ids) {
        if let Some(call) = part.function_call {
            let name = call
                .name
                .ok_or_else(|| AnswerError::shape("a `functionCall` without a string `name`"))?;
            let name = offered
                .iter()
                .find(|o| gemini_name(o) == name)
                .map_or(name, |o| (*o).to_owned());
            let id = ids.claim(given_id.as_deref());
            if let Some(signature) = part.thought_signature {
                kept.push(json!({"type": "thought_signature", "tool_call_id": id, "signature": signature}));
            }
            tool_calls.push(ToolCall {
                id: Some(Some(id)),
                kind: Some(Some("function".into())),
                function: FunctionCall {
                    name,
                    arguments: call
                        .args
                        .map_or_else(|| "{}".to_owned(), |raw| Box::<str>::from(raw).into()),
                    rest: Map::new(),
                },
                rest: Map::new(),
            });
        } else if part.thought != Some(true)
            && let Some(piece) = part.text
        {
            text.push_str(&piece);
        }
    }
    let mut rest = Map::new();
    if let Some(reason) = &block {
        let reason: String = reason.chars().take(64).collect();
        rest.insert(
            "refusal".into(),
            json!(format!("the prompt was blocked ({reason})")),
        );
    }
    if !kept.is_empty() {
        rest.insert(RICH_CONTENT_FIELD.into(), Value::Array(kept));
    }
    let finish_reason = match finish.as_deref() {
        _ if block.is_some() => "content_filter".to_owned(),
        Some("MAX_TOKENS") => "length".to_owned(),
        Some(
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY",
        ) => "content_filter".to_owned(),
        _ if !tool_calls.is_empty() => "tool_calls".to_owned(),
        Some("STOP") | None => "stop".to_owned(),
        Some(other) => other
            .chars()
            .take(64)
            .collect::<String>()
            .to_ascii_lowercase(),
    };
    let content = if text.is_empty() && !tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    Ok(ChatCompletion::translated(
        json!(response.response_id),
        json!(response.model_version),
        content,
        tool_calls,
        rest,
        Some(finish_reason),
        response.usage_metadata.as_ref().and_then(usage),
    ))
}

/// OpenAI chat usage: tool-use prompt tokens are prompt tokens, thoughts completion
/// tokens (billed as output), also told apart as OpenAI's `*_details`.
fn usage(usage: &UsageMetadata) -> Option<Usage> {
    let prompt = count(&usage.prompt_token_count)?
        .saturating_add(count(&usage.tool_use_prompt_token_count).unwrap_or(0));
    let thoughts = count(&usage.thoughts_token_count);
    let completion = count(&usage.candidates_token_count)
        .unwrap_or(0)
        .saturating_add(thoughts.unwrap_or(0));
    let mut rest = Map::new();
    if let Some(cached) = count(&usage.cached_content_token_count) {
        rest.insert(
            "prompt_tokens_details".into(),
            json!({"cached_tokens": cached}),
        );
    }
    if let Some(thoughts) = thoughts {
        rest.insert(
            "completion_tokens_details".into(),
            json!({"reasoning_tokens": thoughts}),
        );
    }
    Some(Usage {
        prompt_tokens: Some(prompt),
        completion_tokens: Some(completion),
        total_tokens: Some(prompt.saturating_add(completion)),
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
            r#"{"candidates": BIG}"#,
            r#"{"candidates": [BIG]}"#,
            r#"{"candidates": [{"content": BIG}]}"#,
            r#"{"candidates": [{"content": {"parts": BIG}}]}"#,
            r#"{"candidates": [{"content": {"parts": [BIG]}}]}"#,
            r#"{"candidates": [{"content": {"parts": [{"thought": BIG}]}}]}"#,
            r#"{"candidates": [{"content": {"parts": [{"functionCall": BIG}]}}]}"#,
            r#"{"promptFeedback": BIG}"#,
            r#"{"usageMetadata": BIG}"#,
        ]);
    }
}
