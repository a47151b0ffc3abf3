//! The parts of an OpenAI `chat.completion` response the tool-call loop reads, as types.
//!
//! Everything else passes through: each type keeps the fields it does not name in `rest`,
//! and a known field keeps its shape, so a completion serialises back to what upstream sent
//! (absent stays absent, `null` stays `null`). The guest's `cchat_recv` body and the
//! assistant message appended to the session are built from these types. Two deliberate
//! normalisations: `function.arguments` sent as a JSON object becomes its JSON text (what
//! OpenAI requires in a request), and a null or absent `arguments` becomes `""`.
//!
//! Shapes the loop cannot use (no `choices` array, a `message` that is not an object, a
//! tool call whose `function.name` is not a string, ...) fail to deserialise, which the
//! backends report as `llm_invalid_response` naming the path. Token counts that are not
//! `u64` (negative, fractional, beyond `u64::MAX`) are not counted but still passed on.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `absent` → `None`, `null` → `Some(None)`, a value → `Some(Some(v))`.
fn nullable<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// `content` keeps `null` (`Some(Value::Null)`); absent is `None`.
fn present<'de, D>(deserializer: D) -> Result<Option<Value>, D::Error>
where
    D: Deserializer<'de>,
{
    Value::deserialize(deserializer).map(Some)
}

/// A JSON string as is, an object (or any other value) as its JSON text, `null` as `""`.
fn arguments<'de, D>(deserializer: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
{
    Ok(match Value::deserialize(deserializer)? {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

/// A `chat.completion` object.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub choices: Vec<Choice>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub usage: Option<Option<Usage>>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Choice {
    pub message: AssistantMessage,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub finish_reason: Option<Option<String>>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `choices[i].message`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct AssistantMessage {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub role: Option<Option<String>>,
    /// A string, content parts, or `null` (`Some(Value::Null)`); `None` when absent.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub content: Option<Value>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_calls: Option<Option<Vec<ToolCall>>>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl AssistantMessage {
    /// The tool calls the model made (none when `tool_calls` is absent, null or empty).
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.tool_calls
            .as_ref()
            .and_then(Option::as_deref)
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ToolCall {
    /// The call's id; the loop names a call without one `call_<index>`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub id: Option<Option<String>>,
    #[serde(
        rename = "type",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub kind: Option<Option<String>>,
    pub function: FunctionCall,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ToolCall {
    pub fn id(&self) -> Option<&str> {
        self.id.as_ref().and_then(Option::as_deref)
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text, as the model sent them.
    #[serde(default, deserialize_with = "arguments")]
    pub arguments: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `usage`. A count that is not a `u64` stays in `rest`, uncounted.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Usage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl<'de> Deserialize<'de> for Usage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut rest = Map::<String, Value>::deserialize(deserializer)
            .map_err(|e| de::Error::custom(format!("usage: {e}")))?;
        let mut count = |key: &str| match rest.get(key).and_then(Value::as_u64) {
            Some(n) => {
                rest.remove(key);
                Some(n)
            }
            None => None,
        };
        Ok(Self {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
            total_tokens: count("total_tokens"),
            rest,
        })
    }
}

impl ChatCompletion {
    /// The one-choice `chat.completion` a translated API's answer becomes: `id` and
    /// `model` as that API named them (any JSON it gave, `null` if none); the assistant
    /// message of `content`, `tool_calls` (left out when none) and `rest`.
    pub(crate) fn translated(
        id: Value,
        model: Value,
        content: Value,
        tool_calls: Vec<ToolCall>,
        rest: Map<String, Value>,
        finish_reason: Option<String>,
        usage: Option<Usage>,
    ) -> Self {
        let message = AssistantMessage {
            role: Some(Some("assistant".into())),
            content: Some(content),
            tool_calls: (!tool_calls.is_empty()).then_some(Some(tool_calls)),
            rest,
        };
        let rest = Map::from_iter([
            ("id".to_owned(), id),
            ("object".to_owned(), Value::from("chat.completion")),
            ("model".to_owned(), model),
        ]);
        Self {
            choices: vec![Choice {
                message,
                finish_reason: Some(finish_reason),
                rest: Map::from_iter([("index".to_owned(), Value::from(0))]),
            }],
            usage: Some(usage),
            rest,
        }
    }

    /// The first choice's message, the one the loop acts on.
    pub fn message(&self) -> Option<&AssistantMessage> {
        self.choices.first().map(|c| &c.message)
    }

    /// The first choice's `finish_reason`, if it is a string.
    pub fn finish_reason(&self) -> Option<&str> {
        self.choices
            .first()
            .and_then(|c| c.finish_reason.as_ref())
            .and_then(Option::as_deref)
    }

    /// The usage counts, if upstream reported them.
    pub fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref().and_then(Option::as_ref)
    }

    /// Reads a completion from a JSON value; the error names the path that did not fit.
    #[cfg(test)]
    pub fn from_value(value: Value) -> Result<Self, WireError> {
        serde_path_to_error::deserialize(value).map_err(shape_error)
    }

    /// Reads a completion from a response body.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, WireError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let parsed: Result<Self, _> = serde_path_to_error::deserialize(de);
        match parsed {
            Ok(completion) => Ok(completion),
            Err(e) if e.inner().is_data() => Err(shape_error(e)),
            Err(e) => Err(WireError::NotJson(e.into_inner())),
        }
    }
}

/// Why a body is not a usable chat completion.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    /// JSON of another shape; `message` names the path that did not fit.
    #[error("not a chat completion ({message})")]
    Shape {
        message: String,
        #[source]
        source: serde_json::Error,
    },
}

fn shape_error(error: serde_path_to_error::Error<serde_json::Error>) -> WireError {
    let path = error.path().to_string();
    let source = error.into_inner();
    let message = if path == "." {
        source.to_string()
    } else {
        format!("at {path}: {source}")
    };
    WireError::Shape { message, source }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(value: Value) -> (ChatCompletion, Value) {
        let completion = ChatCompletion::from_value(value).expect("parses");
        let back = serde_json::to_value(&completion).unwrap();
        (completion, back)
    }

    #[test]
    fn unknown_fields_nulls_and_absences_survive() {
        let upstream = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "system_fingerprint": "fp_x", "service_tier": null,
            "choices": [{
                "index": 0, "finish_reason": "tool_calls",
                "logprobs": {"content": [{"token": "a", "logprob": -0.25}]},
                "message": {"role": "assistant", "content": null, "refusal": null,
                            "vendor_reasoning": {"steps": 3},
                            "tool_calls": [{"id": "c1", "type": "function", "index": 0,
                                            "function": {"name": "f", "arguments": "{\"a\":1}", "strict": true}}]}
            }, {"index": 1, "message": {"content": [{"type": "text", "text": "hi"}]}, "finish_reason": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                      "prompt_tokens_details": {"cached_tokens": 1}}
        });
        let (completion, back) = round_trip(upstream.clone());
        assert_eq!(back, upstream);
        let message = completion.message().unwrap();
        assert_eq!(message.tool_calls()[0].id(), Some("c1"));
        assert_eq!(message.tool_calls()[0].function.arguments, "{\"a\":1}");
        assert_eq!(completion.usage().unwrap().total_tokens, Some(7));
        assert_eq!(completion.choices[1].message.tool_calls(), []);

        let bare = json!({"choices": [{"message": {}}]});
        assert_eq!(round_trip(bare.clone()).1, bare, "absent stays absent");
        let nulls =
            json!({"choices": [{"message": {"role": null, "tool_calls": null}}], "usage": null});
        let (completion, back) = round_trip(nulls.clone());
        assert_eq!(back, nulls, "null stays null");
        assert!(completion.usage().is_none());
        assert!(completion.message().unwrap().tool_calls().is_empty());
    }

    #[test]
    fn arguments_may_be_an_object_and_ids_may_be_missing() {
        let (completion, back) = round_trip(json!({"choices": [{"message": {"tool_calls": [
            {"function": {"name": "f", "arguments": {"city": "Oslo"}}},
            {"id": null, "function": {"name": "g"}}
        ]}}]}));
        let calls = completion.message().unwrap().tool_calls();
        assert_eq!(calls[0].function.arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(calls[0].id(), None);
        assert_eq!(calls[1].id(), None);
        assert_eq!(calls[1].function.arguments, "");
        assert_eq!(
            back["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Oslo"}"#,
            "an object becomes its JSON text"
        );
    }

    #[test]
    fn hostile_shapes_are_errors_naming_the_path_or_defaults() {
        for (body, needle) in [
            (json!({}), "choices"),
            (json!({"choices": {"0": {}}}), "choices"),
            (
                json!({"choices": [{"message": null}]}),
                "choices[0].message",
            ),
            (json!({"choices": [{}]}), "message"),
            (
                json!({"choices": [{"message": {"tool_calls": [{"function": {"name": 7}}]}}]}),
                "choices[0].message.tool_calls[0].function.name",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [{"id": 1, "function": {"name": "f"}}]}}]}),
                "tool_calls[0].id",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": "many"}}]}),
                "tool_calls",
            ),
            (json!({"choices": [], "usage": "lots"}), "usage"),
            (json!([1, 2]), "expected struct ChatCompletion"),
        ] {
            let error = ChatCompletion::from_value(body.clone())
                .expect_err(&body.to_string())
                .to_string();
            assert!(error.contains(needle), "{body}: {error}");
        }
        let empty = ChatCompletion::from_value(json!({"choices": []})).unwrap();
        assert!(empty.message().is_none());

        let huge = json!({"choices": [], "usage": {"prompt_tokens": 1e30, "completion_tokens": -1,
                          "total_tokens": 18446744073709551615u64}});
        let (completion, back) = round_trip(huge.clone());
        let usage = completion.usage().unwrap();
        assert_eq!(usage.prompt_tokens, None);
        assert_eq!(usage.completion_tokens, None);
        assert_eq!(usage.total_tokens, Some(u64::MAX));
        assert_eq!(back, huge, "uncountable values are still passed on");
    }

    #[test]
    fn bodies_that_are_not_json_are_told_apart() {
        assert!(matches!(
            ChatCompletion::from_slice(b"<html>"),
            Err(WireError::NotJson(_))
        ));
        let shape = ChatCompletion::from_slice(br#"{"choices": 1}"#).unwrap_err();
        assert!(matches!(shape, WireError::Shape { .. }), "{shape:?}");
        // Both keep serde's error as their source.
        for error in [ChatCompletion::from_slice(b"<html>").unwrap_err(), shape] {
            let source = std::error::Error::source(&error);
            assert!(
                source.is_some_and(|e| e.downcast_ref::<serde_json::Error>().is_some()),
                "{error:?}"
            );
        }
        let ok = ChatCompletion::from_slice(br#"{"choices": [], "x": [1.5, -2]}"#).unwrap();
        assert_eq!(ok.rest["x"], json!([1.5, -2]));
    }
}
