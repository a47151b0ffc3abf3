//! A Messages response as a `chat.completion`.
//!
//! `text` blocks become the message's `content`, `tool_use` blocks its `tool_calls` (ids
//! made valid and unique, see [`crate::chat::llm::ids`]), `stop_reason` the `finish_reason`, and the
//! usage counts `prompt_tokens` (input tokens, cached ones included) and
//! `completion_tokens`. Other blocks (thinking) are not the model's answer and are left
//! out.
//!
//! The body is read into these types directly: a tool call's `input` stays its JSON text
//! (a [`RawValue`]), and fields the loop does not use are skipped unread, so a large reply
//! costs about its own size, not the many times that a JSON tree of it would.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::chat::llm::AnswerError as MessagesError;
use crate::chat::llm::ids::{self, Ids};
use crate::chat::wire::{ChatCompletion, FunctionCall, ToolCall, Usage};
use crate::json::Unquoted;

#[derive(Deserialize)]
struct Response {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
    model: Option<String>,
    #[serde(default, deserialize_with = "crate::json::list")]
    content: Option<Vec<Block>>,
    stop_reason: Option<String>,
    #[serde(default, deserialize_with = "crate::json::optional")]
    usage: Option<ResponseUsage>,
}

/// A content block: only the fields of `text` and `tool_use` blocks are read.
#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    id: Option<Box<RawValue>>,
    name: Option<String>,
    input: Option<Box<RawValue>>,
}

/// Counts that are not a `u64` are not counted.
#[derive(Deserialize)]
struct ResponseUsage {
    input_tokens: Option<Box<RawValue>>,
    output_tokens: Option<Box<RawValue>>,
    cache_creation_input_tokens: Option<Box<RawValue>>,
    cache_read_input_tokens: Option<Box<RawValue>>,
}

fn count(raw: &Option<Box<RawValue>>) -> Option<u64> {
    raw.as_ref().and_then(|raw| raw.get().parse().ok())
}

/// The `chat.completion` for a Messages response body, or why it is not one.
pub(in crate::chat::llm) fn from_messages(body: &[u8]) -> Result<ChatCompletion, MessagesError> {
    let Unquoted(response) = crate::json::from_slice::<Unquoted<Response>>(body)?;
    if response.kind.as_deref() == Some("error") {
        return Err(MessagesError::shape("an error body"));
    }
    let blocks = response
        .content
        .ok_or_else(|| MessagesError::shape("no `content` array of content blocks"))?;
    let given_ids: Vec<Option<String>> = blocks.iter().map(tool_use_id).collect();
    let mut ids = Ids::new(
        ids::ANTHROPIC,
        given_ids.iter().flatten().map(String::as_str),
    );
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (block, given_id) in blocks.into_iter().zip(given_ids) {
        match block.kind.as_str() {
            "text" => text.push_str(block.text.as_deref().unwrap_or_default()),
            "tool_use" => {
                let name = block.name.ok_or_else(|| {
                    MessagesError::shape("a `tool_use` block without a string `name`")
                })?;
                let arguments = block
                    .input
                    .map_or_else(|| "{}".to_owned(), |raw| Box::<str>::from(raw).into());
                tool_calls.push(ToolCall {
                    id: Some(Some(ids.claim(given_id.as_deref()))),
                    kind: Some(Some("function".into())),
                    function: FunctionCall {
                        name,
                        arguments,
                        rest: Map::new(),
                    },
                    rest: Map::new(),
                });
            }
            // Thinking and other blocks the loop cannot use are not the model's answer.
            _ => {}
        }
    }
    let content = if text.is_empty() && !tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    let finish_reason = response.stop_reason.map(|reason| match reason.as_str() {
        "end_turn" | "stop_sequence" | "pause_turn" => "stop".to_owned(),
        "max_tokens" => "length".to_owned(),
        "tool_use" => "tool_calls".to_owned(),
        "refusal" => "content_filter".to_owned(),
        // Cut: the server's text reaches the guest and the observers.
        _ => reason.chars().take(64).collect(),
    });
    Ok(ChatCompletion::translated(
        json!(response.id),
        json!(response.model),
        content,
        tool_calls,
        Map::new(),
        finish_reason,
        response.usage.as_ref().and_then(usage),
    ))
}

/// A `tool_use` block's id, when it is a string the API takes.
fn tool_use_id(block: &Block) -> Option<String> {
    let raw = block
        .id
        .as_ref()
        .filter(|_| block.kind == "tool_use")?
        .get();
    ids::ANTHROPIC.parse_raw(raw)
}

/// OpenAI usage: prompt tokens are all input tokens, those read from or written to the
/// prompt cache included (the API counts them apart); `prompt_tokens_details.cached_tokens`
/// are those read from it, as OpenAI reports them.
fn usage(usage: &ResponseUsage) -> Option<Usage> {
    let input = count(&usage.input_tokens)?;
    let output = count(&usage.output_tokens)?;
    let cache_read = count(&usage.cache_read_input_tokens);
    let prompt = input
        .saturating_add(count(&usage.cache_creation_input_tokens).unwrap_or(0))
        .saturating_add(cache_read.unwrap_or(0));
    let mut rest = Map::new();
    if let Some(cached) = cache_read {
        rest.insert(
            "prompt_tokens_details".into(),
            json!({"cached_tokens": cached}),
        );
    }
    Some(Usage {
        prompt_tokens: Some(prompt),
        completion_tokens: Some(output),
        total_tokens: Some(prompt.saturating_add(output)),
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
            r#"{"content": BIG}"#,
            r#"{"content": [BIG]}"#,
            r#"{"content": [], "usage": BIG}"#,
        ]);
    }

    fn read(response: Value) -> Result<Value, String> {
        let completion =
            from_messages(response.to_string().as_bytes()).map_err(|e| e.to_string())?;
        Ok(serde_json::to_value(completion).unwrap())
    }

    /// serde's text quotes a misplaced string whole: the shape error keeps a short cut.
    #[test]
    fn a_shape_error_quoting_a_huge_string_is_cut() {
        let huge = "\u{85}".repeat(100_000);
        let error = from_messages(format!(r#"{{"content": [], "usage": "{huge}"}}"#).as_bytes())
            .unwrap_err();
        assert!(matches!(error, MessagesError::Shape(_)), "{error:?}");
        let limit = crate::defaults::MAX_SHAPE_ERROR_BYTES;
        assert!(
            error.to_string().len() <= limit,
            "{} bytes",
            error.to_string().len()
        );
    }

    #[test]
    fn response_becomes_a_chat_completion() {
        let out = read(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "let me"},
                {"type": "tool_use", "id": "tu", "name": "echo", "input": {"a": 1}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 7, "output_tokens": 3},
        }))
        .unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(out["choices"][0]["message"]["content"], "let me");
        let call = &out["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["id"], "tu");
        assert_eq!(call["function"]["arguments"], "{\"a\":1}");
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        );
        assert_eq!(out["id"], "msg_1");
        assert_eq!(out["model"], "claude-x");
        assert!(read(json!({"type": "error", "error": {"type": "x"}})).is_err());
        assert!(read(json!({"content": "nope"})).is_err());
        assert!(read(json!({"content": [{"type": "tool_use", "id": "x"}]})).is_err());
    }

    #[test]
    fn cached_input_tokens_are_prompt_tokens() {
        let out = read(json!({
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 2,
                      "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000},
        }))
        .unwrap();
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 1105, "completion_tokens": 2, "total_tokens": 1107,
                   "prompt_tokens_details": {"cached_tokens": 1000}})
        );
        let odd = read(json!({"content": [], "usage": {"input_tokens": -1, "output_tokens": 2}}));
        assert_eq!(
            odd.unwrap()["usage"],
            Value::Null,
            "uncountable usage is null"
        );
    }

    #[test]
    fn tool_use_ids_are_made_valid_and_unique() {
        let long = "a".repeat(10_000);
        let out = read(json!({
            "content": [
                {"type": "tool_use", "id": "x", "name": "t", "input": {}},
                {"type": "tool_use", "id": "x", "name": "t", "input": {}},
                {"type": "tool_use", "name": "t", "input": {}},
                {"type": "tool_use", "id": 7, "name": "t", "input": {}},
                {"type": "tool_use", "id": "a.b", "name": "t", "input": {}},
                {"type": "tool_use", "id": long, "name": "t", "input": [1, 2]},
                {"type": "tool_use", "id": "toolu_quiver_0", "name": "t"},
            ],
            "stop_reason": "tool_use",
        }))
        .unwrap();
        let calls = out["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap();
        let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(
            ids,
            [
                "x",
                "toolu_quiver_1",
                "toolu_quiver_2",
                "toolu_quiver_3",
                "toolu_quiver_4",
                "toolu_quiver_5",
                "toolu_quiver_0"
            ]
        );
        assert_eq!(
            calls[5]["function"]["arguments"], "[1,2]",
            "input is kept as sent"
        );
        assert_eq!(calls[6]["function"]["arguments"], "{}");
    }

    #[test]
    fn empty_answers_and_stop_reasons() {
        let out = read(json!({"content": [], "stop_reason": "end_turn"})).unwrap();
        assert_eq!(out["choices"][0]["message"]["content"], "");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        let out = read(json!({"content": [], "stop_reason": "max_tokens"})).unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], "length");
        let out = read(json!({"content": [], "stop_reason": "refusal"})).unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
        let out = read(json!({"content": []})).unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], Value::Null);
    }
}
