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
//!
//! The objects are read in one pass by hand-written visitors (a known key into its field,
//! any other into `rest`, a known key given twice an error as with serde's derive), not by
//! `#[serde(flatten)]`, which buffers each nested object once per level; the path of a
//! shape error is worked out only when there is one.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::json::{Key, Unquoted, misplaced_string};
use crate::text::display_cut;

/// A JSON object read key by key into a wire type.
trait Object<'de>: Sized {
    /// What serde's error says was expected.
    const EXPECTING: &'static str;
    fn read<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Object<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(T::EXPECTING)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::read(map)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
        Err(misplaced_string(&self))
    }
}

/// Read through `deserialize_any`: serde_json's `deserialize_map` would quote a string in
/// the object's place whole in its error (see [`misplaced_string`]).
fn read_object<'de, D: Deserializer<'de>, T: Object<'de>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(ObjectVisitor(PhantomData))
}

/// Reads field `name` into `slot`, unless it was already read. For a nullable field
/// (`Option<Option<T>>`), absent stays `None` and `null` is `Some(None)`.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    name: &'static str,
) -> Result<(), A::Error> {
    once_as(map, slot, name, |value: T| value)
}

/// [`once`], reading the value as `R` (a list as [`Unquoted`]) and keeping it `into` a `T`.
fn once_as<'de, A: MapAccess<'de>, R: Deserialize<'de>, T>(
    map: &mut A,
    slot: &mut Option<T>,
    name: &'static str,
    into: impl FnOnce(R) -> T,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(into(map.next_value()?));
    Ok(())
}

fn required<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

/// Reads a field that is passed on as it came into `slot` (a repeated one: the last value).
fn pass<'de, A: MapAccess<'de>>(map: &mut A, slot: &mut Option<Value>) -> Result<(), A::Error> {
    *slot = Some(map.next_value()?);
    Ok(())
}

/// Keeps an unknown field in `rest` (a repeated one: the last value, at the first place).
fn keep<'de, A: MapAccess<'de>>(
    map: &mut A,
    rest: &mut Map<String, Value>,
    key: Cow<'de, str>,
) -> Result<(), A::Error> {
    let value = map.next_value()?;
    rest.insert(key.into_owned(), value);
    Ok(())
}

/// A JSON string as is, an object (or any other value) as its JSON text, `null` as `""`.
fn arguments(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A `chat.completion` object.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(flatten)]
    pub passed: Option<Box<Passed>>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The other top-level fields OpenAI sends, passed on as they came (any JSON): named so
/// that most answers keep nothing in `rest`, where each field costs a key, a value and the
/// map's growth. Boxed: a completion is moved whole from the parse to the response.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Passed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<Value>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Choice {
    pub message: AssistantMessage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<Option<String>>,
    /// Passed on as they came, like [`Passed`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `choices[i].message`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct AssistantMessage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Option<String>>,
    /// A string, content parts, or `null` (`Some(Value::Null)`); `None` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
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

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ToolCall {
    /// The call's id; the loop names a call without one `call_<index>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Option<String>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
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

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text, as the model sent them.
    pub arguments: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl<'de> Object<'de> for ChatCompletion {
    const EXPECTING: &'static str = "struct ChatCompletion";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut choices, mut completion) = (None, Self::default());
        let mut passed = Passed::default();
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "choices" => once_as(&mut map, &mut choices, "choices", |Unquoted(c)| c)?,
                "usage" => once(&mut map, &mut completion.usage, "usage")?,
                "id" => pass(&mut map, &mut passed.id)?,
                "object" => pass(&mut map, &mut passed.object)?,
                "created" => pass(&mut map, &mut passed.created)?,
                "model" => pass(&mut map, &mut passed.model)?,
                "service_tier" => pass(&mut map, &mut passed.service_tier)?,
                "system_fingerprint" => pass(&mut map, &mut passed.system_fingerprint)?,
                _ => keep(&mut map, &mut completion.rest, key)?,
            }
        }
        completion.choices = required(choices, "choices")?;
        if passed != Passed::default() {
            completion.passed = Some(Box::new(passed));
        }
        Ok(completion)
    }
}

impl<'de> Object<'de> for Choice {
    const EXPECTING: &'static str = "struct Choice";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut message, mut choice) = (None, Self::default());
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "message" => once(&mut map, &mut message, "message")?,
                "finish_reason" => once(&mut map, &mut choice.finish_reason, "finish_reason")?,
                "index" => pass(&mut map, &mut choice.index)?,
                "logprobs" => pass(&mut map, &mut choice.logprobs)?,
                _ => keep(&mut map, &mut choice.rest, key)?,
            }
        }
        choice.message = required(message, "message")?;
        Ok(choice)
    }
}

impl<'de> Object<'de> for AssistantMessage {
    const EXPECTING: &'static str = "struct AssistantMessage";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut message = Self::default();
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "role" => once(&mut map, &mut message.role, "role")?,
                // `null` is kept as `Some(Value::Null)`.
                "content" => once(&mut map, &mut message.content, "content")?,
                "tool_calls" => once_as(
                    &mut map,
                    &mut message.tool_calls,
                    "tool_calls",
                    |calls: Option<Unquoted<_>>| calls.map(|Unquoted(calls)| calls),
                )?,
                _ => keep(&mut map, &mut message.rest, key)?,
            }
        }
        Ok(message)
    }
}

impl<'de> Object<'de> for ToolCall {
    const EXPECTING: &'static str = "struct ToolCall";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut id, mut kind, mut function, mut rest) = (None, None, None, Map::new());
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "id" => once(&mut map, &mut id, "id")?,
                "type" => once(&mut map, &mut kind, "type")?,
                "function" => once(&mut map, &mut function, "function")?,
                _ => keep(&mut map, &mut rest, key)?,
            }
        }
        Ok(Self {
            id,
            kind,
            function: required(function, "function")?,
            rest,
        })
    }
}

impl<'de> Object<'de> for FunctionCall {
    const EXPECTING: &'static str = "struct FunctionCall";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut name, mut raw, mut rest) = (None, None::<Value>, Map::new());
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "name" => once(&mut map, &mut name, "name")?,
                "arguments" => once(&mut map, &mut raw, "arguments")?,
                _ => keep(&mut map, &mut rest, key)?,
            }
        }
        Ok(Self {
            name: required(name, "name")?,
            arguments: raw.map(arguments).unwrap_or_default(),
            rest,
        })
    }
}

macro_rules! deserialize_as_object {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                read_object(deserializer)
            }
        }
    )*};
}

deserialize_as_object!(
    ChatCompletion,
    Choice,
    AssistantMessage,
    ToolCall,
    FunctionCall,
    Usage
);

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

impl<'de> Object<'de> for Usage {
    const EXPECTING: &'static str = "struct Usage";
    fn read<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut usage = Self::default();
        while let Some(Key(key)) = map.next_key()? {
            let count = match &*key {
                "prompt_tokens" => &mut usage.prompt_tokens,
                "completion_tokens" => &mut usage.completion_tokens,
                "total_tokens" => &mut usage.total_tokens,
                _ => {
                    keep(&mut map, &mut usage.rest, key)?;
                    continue;
                }
            };
            // A repeated key's last value is the one read, as in a map.
            let value: Value = map.next_value()?;
            *count = value.as_u64();
            if count.is_some() {
                usage.rest.remove(&*key);
            } else {
                usage.rest.insert(key.into_owned(), value);
            }
        }
        Ok(usage)
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
        Self {
            choices: vec![Choice {
                message,
                finish_reason: Some(finish_reason),
                index: Some(Value::from(0)),
                ..Choice::default()
            }],
            usage: Some(usage),
            passed: Some(Box::new(Passed {
                id: Some(id),
                object: Some(Value::from("chat.completion")),
                model: Some(model),
                ..Passed::default()
            })),
            rest: Map::new(),
        }
    }

    /// `model` when it is a string.
    pub fn model(&self) -> Option<&str> {
        self.passed.as_ref()?.model.as_ref()?.as_str()
    }

    /// `id` when it is a string.
    pub fn id(&self) -> Option<&str> {
        self.passed.as_ref()?.id.as_ref()?.as_str()
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
        if let Err(source) = crate::json::refuse_raw_value_key(bytes) {
            let message = source.to_string();
            return Err(WireError::Shape { message, source });
        }
        let error = match serde_json::from_slice(bytes) {
            Ok(completion) => return Ok(completion),
            Err(error) => error,
        };
        if !error.is_data() {
            return Err(WireError::NotJson(error));
        }
        // JSON of another shape: read again, tracking the path, for the error to name it.
        drop(error);
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

/// The shape error, its text cut to [`MAX_SHAPE_ERROR_BYTES`](crate::defaults::MAX_SHAPE_ERROR_BYTES):
/// serde's text quotes a misplaced string whole (escaped, up to six bytes for two), and the
/// answer may be 16 MiB. Its source keeps the cut text too.
fn shape_error(error: serde_path_to_error::Error<serde_json::Error>) -> WireError {
    let limit = crate::defaults::MAX_SHAPE_ERROR_BYTES;
    let (path, inner) = (error.path(), error.inner());
    let message = if path.iter().next().is_none() {
        display_cut(inner, limit)
    } else {
        display_cut(&format_args!("at {path}: {inner}"), limit)
    };
    drop(error);
    let source = <serde_json::Error as de::Error>::custom(&message);
    WireError::Shape { message, source }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_string_where_an_object_or_list_belongs_is_not_quoted() {
        crate::json::assert_strings_unquoted::<ChatCompletion>(&[
            "BIG",
            r#"{"choices": BIG}"#,
            r#"{"choices": [BIG]}"#,
            r#"{"choices": [{"message": BIG}]}"#,
            r#"{"choices": [{"message": {"tool_calls": BIG}}]}"#,
            r#"{"choices": [{"message": {"tool_calls": [BIG]}}]}"#,
            r#"{"choices": [{"message": {"tool_calls": [{"function": BIG}]}}]}"#,
            r#"{"choices": [], "usage": BIG}"#,
        ]);
    }

    fn round_trip(value: Value) -> (ChatCompletion, Value) {
        let completion = ChatCompletion::from_value(value).expect("parses");
        let back = serde_json::to_value(&completion).unwrap();
        (completion, back)
    }

    /// Each type writes its fields in order, then its unknown ones: text already in that
    /// order comes back byte for byte (the key order is part of the response ABI).
    #[test]
    fn fields_are_written_in_order_and_unknown_ones_last() {
        let text = concat!(
            r#"{"choices":[{"message":{"role":"assistant","content":null,"#,
            r#""tool_calls":[{"id":"c1","type":"function","function":{"name":"f","#,
            r#""arguments":"{}","strict":true},"index":0}],"refusal":null},"#,
            r#""finish_reason":"tool_calls","index":0,"logprobs":null,"extra":1}],"#,
            r#""usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"#,
            r#""details":{"cached_tokens":1}},"id":"x","object":"chat.completion","#,
            r#""created":1,"model":"m","service_tier":"default","system_fingerprint":"fp","#,
            r#""vendor":{"a":[1]}}"#
        );
        let completion = ChatCompletion::from_slice(text.as_bytes()).expect("parses");
        assert_eq!(serde_json::to_string(&completion).unwrap(), text);
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
        assert!(
            completion.rest.is_empty() && completion.choices.iter().all(|c| c.rest.is_empty()),
            "OpenAI's own fields are named, so the usual answer keeps no map"
        );
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
    fn repeated_keys_and_escaped_keys_read_as_serde_reads_them() {
        let error = ChatCompletion::from_slice(br#"{"choices": [], "choices": []}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("duplicate field `choices`"), "{error}");
        let error = ChatCompletion::from_slice(
            br#"{"choices": [{"message": {"role": "a", "role": "b"}}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("choices[0].message") && error.contains("duplicate field `role`"),
            "{error}"
        );
        // An unknown key given twice keeps its first place and its last value.
        let body =
            br#"{"x": 1, "choi\u0063es": [{"message": {"c\u006fntent": "hi"}}], "y": 2, "x": 3}"#;
        let completion = ChatCompletion::from_slice(body).unwrap();
        assert_eq!(completion.message().unwrap().content, Some(json!("hi")));
        assert_eq!(
            serde_json::to_string(&completion.rest).unwrap(),
            r#"{"x":3,"y":2}"#
        );
        // A named field passed on as it came, given twice: its last value.
        let completion =
            ChatCompletion::from_slice(br#"{"model": "a", "choices": [], "model": "b"}"#).unwrap();
        assert_eq!(completion.model(), Some("b"));
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

    /// serde's text would quote a misplaced string whole, escaped (six bytes for two here):
    /// the error names it instead, path and all within the limit, its source too.
    #[test]
    fn a_shape_error_quoting_a_huge_string_is_cut() {
        let huge = "\u{85}".repeat(100_000);
        for body in [
            format!(r#"{{"choices": "{huge}"}}"#),
            format!(r#"{{"choices": [{{"message": "{huge}"}}]}}"#),
        ] {
            let error = ChatCompletion::from_slice(body.as_bytes()).unwrap_err();
            let WireError::Shape { message, source } = &error else {
                panic!("{error:?}");
            };
            assert!(message.starts_with("at choices"), "{message}");
            assert!(message.contains("invalid type: string,"), "{message}");
            let limit = crate::defaults::MAX_SHAPE_ERROR_BYTES;
            assert!(message.len() <= limit, "{} bytes", message.len());
            assert!(source.to_string().len() <= limit);
        }
    }
}
