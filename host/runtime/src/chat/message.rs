//! One message of a chat session, kept as the JSON text it is sent as.
//!
//! A session's messages go into every request of every send after they are added. Kept as
//! values, each request encoded all of them anew (escaping every string again), and each
//! was a tree of small allocations to build, charge and free. Kept as text, a message is
//! written once when it is added and copied into each request as it is (serde_json writes
//! a `RawValue` verbatim); a wire that translates the body reads it back into a value, and
//! is charged for that copy ([`value_copy_cost`]).
//!
//! A message with a `RICH_CONTENT_FIELD` (a tool result's images, or what a translated
//! answer keeps for its own wire: reasoning items, a response id) stays a value: a wire
//! that cannot carry that field is sent the message without it, and only a value can
//! leave it out.

use quiver_abi::Errno;
use serde::{Serialize, Serializer};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};

use super::GuestTool;
use super::llm::RICH_CONTENT_FIELD;
use super::wire::AssistantMessage;
use crate::sandbox::{Charge, heap};

/// Texts up to this long are written by serde_json's own `to_raw_value`, which needs a
/// moment's room for three times the text; longer ones into a buffer of their length.
const SMALL_TEXT: u64 = 64 * 1024;

#[derive(Clone, Debug)]
pub(crate) enum Message {
    /// Written once, sent as it is.
    Text(Box<RawValue>),
    /// A message with a `RICH_CONTENT_FIELD`.
    Rich(Map<String, Value>),
}

impl Message {
    /// `message` written as JSON text, charged to `charge` before it is written: `-ENOMEM`
    /// when the budget cannot hold it.
    pub(crate) fn encode(message: &impl Serialize, charge: &mut Charge) -> Result<Self, Errno> {
        let len = heap::json_len(message);
        let held = heap::alloc(len).saturating_add(heap::vec_slot::<Message>());
        // serde_json's own writer grows its buffer (from 128 bytes, doubling) and trims it:
        // for a moment the text and up to twice it more, charged for that moment. It
        // writes JSON, so unlike `RawValue::from_string` it need not parse it again
        // (which costs as much). Near the budget's end there is no room for the moment,
        // and the text goes the exact way.
        let moment = if len <= SMALL_TEXT {
            charge.beside(heap::alloc((2 * len).max(128))).ok()
        } else {
            None
        };
        charge.grow(held)?;
        let text = match moment {
            Some(_moment) => to_raw_value(message).ok(),
            // Into a buffer of exactly its length, checked once more to make it a
            // `RawValue`.
            None => usize::try_from(len).ok().and_then(|len| {
                let mut text = Vec::with_capacity(len);
                serde_json::to_writer(&mut text, message).ok()?;
                RawValue::from_string(String::from_utf8(text).ok()?).ok()
            }),
        };
        // Only a value that refuses to serialise fails, and none of ours does.
        let Some(text) = text else {
            charge.shrink(held);
            return Err(Errno::EIO);
        };
        Ok(Self::Text(text))
    }

    /// The model's `message`, charged to `charge`.
    pub(crate) fn assistant(
        message: &AssistantMessage,
        charge: &mut Charge,
    ) -> Result<Self, Errno> {
        if !message.rest.contains_key(RICH_CONTENT_FIELD) {
            return Self::encode(message, charge);
        }
        // A copy of the answer's message (which its own charge holds meanwhile).
        let Ok(Value::Object(fields)) = serde_json::to_value(message) else {
            return Err(Errno::EIO);
        };
        charge.grow(Self::rich_cost(&fields))?;
        Ok(Self::Rich(fields))
    }

    /// `{"role": role, "content": content}`, charged to `charge`.
    pub(crate) fn text(role: &str, content: &str, charge: &mut Charge) -> Result<Self, Errno> {
        #[derive(Serialize)]
        struct Text<'a> {
            role: &'a str,
            content: &'a str,
        }
        Self::encode(&Text { role, content }, charge)
    }

    /// A tool's result for the call `id`, charged to `charge`; with `images`, a value that
    /// keeps them as its `RICH_CONTENT_FIELD`.
    pub(crate) fn tool_result(
        id: &str,
        content: &str,
        images: Vec<Value>,
        charge: &mut Charge,
    ) -> Result<Self, Errno> {
        if images.is_empty() {
            #[derive(Serialize)]
            struct ToolResult<'a> {
                role: &'static str,
                tool_call_id: &'a str,
                content: &'a str,
            }
            let result = ToolResult {
                role: "tool",
                tool_call_id: id,
                content,
            };
            return Self::encode(&result, charge);
        }
        let keys = ["role", "tool", "tool_call_id", id, "content", content];
        let strings = keys
            .iter()
            .fold(heap::string(RICH_CONTENT_FIELD.len() as u64), |sum, s| {
                sum.saturating_add(heap::string(s.len() as u64))
            });
        let images_cost = images
            .iter()
            .fold(heap::array(images.len() as u64), |sum, image| {
                sum.saturating_add(heap::json(image))
            });
        charge.grow(
            heap::object(4)
                .saturating_add(strings)
                .saturating_add(images_cost)
                .saturating_add(heap::vec_slot::<Message>()),
        )?;
        let mut fields = Map::new();
        fields.insert("role".into(), "tool".into());
        fields.insert("tool_call_id".into(), id.into());
        fields.insert("content".into(), content.into());
        fields.insert(RICH_CONTENT_FIELD.into(), Value::Array(images));
        Ok(Self::Rich(fields))
    }

    /// `message`: one with a `RICH_CONTENT_FIELD` is kept as a value, any other is written
    /// as text. `charge` holds the value alone before, and what the message holds after.
    pub(crate) fn from_value(message: Value, charge: &mut Charge) -> Result<Self, Errno> {
        match message {
            Value::Object(fields) if fields.contains_key(RICH_CONTENT_FIELD) => {
                charge.resize(Self::rich_cost(&fields))?;
                Ok(Self::Rich(fields))
            }
            message => {
                let held = charge.bytes();
                let encoded = Self::encode(&message, charge)?;
                drop(message);
                charge.shrink(held);
                Ok(encoded)
            }
        }
    }

    fn rich_cost(fields: &Map<String, Value>) -> u64 {
        heap::map(fields).saturating_add(heap::vec_slot::<Message>())
    }

    /// What the message's charge holds.
    fn held(&self) -> u64 {
        match self {
            Self::Text(text) => {
                heap::alloc(text.get().len() as u64).saturating_add(heap::vec_slot::<Message>())
            }
            Self::Rich(fields) => Self::rich_cost(fields),
        }
    }

    /// The message as sent, less its `RICH_CONTENT_FIELD` when `plain`.
    pub(crate) fn serialize_as<S: Serializer>(
        &self,
        plain: bool,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text(text) => text.serialize(serializer),
            Self::Rich(fields) if plain => {
                serializer.collect_map(fields.iter().filter(|(k, _)| *k != RICH_CONTENT_FIELD))
            }
            Self::Rich(fields) => fields.serialize(serializer),
        }
    }
}

/// What a copy of `charged` (the bytes that hold `messages` and `guest_tools`, and more) as
/// values holds: the messages and the guest tools' definitions, kept as text, are read
/// back into values, one after another (so their parses need only the largest scratch
/// buffer); the rest is a copy of what it is now.
pub(crate) fn value_copy_cost<'a>(
    charged: u64,
    messages: impl Iterator<Item = &'a Message>,
    guest_tools: &[GuestTool],
) -> u64 {
    let (mut as_text, mut as_values, mut scratch) = (0u64, 0u64, 0u64);
    for message in messages {
        as_text = as_text.saturating_add(message.held());
        let (held, needed) = match message {
            Message::Text(text) => heap::json_text_parts(text.get().as_bytes()),
            Message::Rich(fields) => (Message::rich_cost(fields), 0),
        };
        as_values = as_values.saturating_add(held);
        scratch = scratch.max(needed);
    }
    for tool in guest_tools {
        as_text = as_text.saturating_add(tool.definition_cost());
        as_values = as_values.saturating_add(tool.value_cost);
    }
    charged
        .saturating_sub(as_text)
        .saturating_add(as_values)
        .saturating_add(scratch)
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.serialize_as(false, serializer)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sandbox::MemoryBudget;

    fn sent(message: &Message, plain: bool) -> String {
        let mut out = Vec::new();
        message
            .serialize_as(plain, &mut serde_json::Serializer::new(&mut out))
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_message_is_sent_as_its_value_would_be_and_charged_as_its_text() {
        let budget = MemoryBudget::new("t".into(), 1 << 20);
        // Control characters escape to six bytes each: the text outgrows the content.
        let content = "\u{1}é\"\n".repeat(100);
        let mut charge = budget.empty("test");
        let text = Message::text("user", &content, &mut charge).unwrap();
        let expected = json!({"role": "user", "content": content}).to_string();
        assert_eq!(sent(&text, false), expected);
        assert_eq!(
            charge.bytes(),
            heap::alloc(expected.len() as u64) + heap::vec_slot::<Message>()
        );
        assert_eq!(budget.used(), charge.bytes());

        let mut charge = budget.empty("test");
        let result = Message::tool_result("c1", "ok", Vec::new(), &mut charge).unwrap();
        assert_eq!(
            sent(&result, false),
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}).to_string()
        );
    }

    #[test]
    fn a_message_the_budget_cannot_hold_is_refused_and_holds_nothing() {
        let budget = MemoryBudget::new("t".into(), 10_000);
        let mut charge = budget.empty("test");
        let refused = Message::text("user", &"\u{1}".repeat(2_000), &mut charge);
        assert_eq!(refused.unwrap_err(), Errno::ENOMEM, "12 000 bytes escaped");
        assert_eq!(budget.used(), 0);
    }

    /// A message that fits, with no room for serde_json's growing buffer, is written into
    /// a buffer of its length instead.
    #[test]
    fn a_message_that_just_fits_is_kept() {
        let content = "x".repeat(1000);
        let text = json!({"role": "user", "content": content}).to_string();
        let held = heap::alloc(text.len() as u64) + heap::vec_slot::<Message>();
        let budget = MemoryBudget::new("t".into(), held + 16);
        let mut charge = budget.empty("test");
        let message = Message::text("user", &content, &mut charge).unwrap();
        assert_eq!(sent(&message, false), text);
        assert_eq!((charge.bytes(), budget.used()), (held, held));
    }

    #[test]
    fn a_value_becomes_text_and_its_charge_the_text_s() {
        let budget = MemoryBudget::new("t".into(), 1 << 20);
        let text = br#"{"role": "user",  "content": [{}, {}, {}], "role": "assistant"}"#;
        let (value, mut charge) = budget.parse_json("test", text).unwrap();
        let message = Message::from_value(value, &mut charge).unwrap();
        let expected = r#"{"role":"assistant","content":[{},{},{}]}"#;
        assert_eq!(
            sent(&message, false),
            expected,
            "compact, the last key wins"
        );
        assert_eq!(
            charge.bytes(),
            heap::alloc(expected.len() as u64) + heap::vec_slot::<Message>()
        );
        assert_eq!(budget.used(), charge.bytes());
        // Read back into a value, the empty objects hold more than their text.
        let value: Value = serde_json::from_str(expected).unwrap();
        let copy = value_copy_cost(charge.bytes(), [&message].into_iter(), &[]);
        assert!(copy >= heap::json(&value), "{copy}");
    }

    /// A translating wire reads the messages back into values: that copy is charged for
    /// what the values hold (and one parse's scratch), not for the text again.
    #[test]
    fn a_copy_as_values_is_charged_for_the_values() {
        let budget = MemoryBudget::unlimited();
        let mut charge = budget.empty("test");
        let contents = ["line\n".repeat(20_000), "x".repeat(50_000)];
        let messages: Vec<Message> = contents
            .iter()
            .map(|content| Message::text("user", content, &mut charge).unwrap())
            .collect();
        let values: u64 = contents
            .iter()
            .map(|content| heap::json(&json!({"role": "user", "content": content})))
            .sum();
        let copy = value_copy_cost(charge.bytes(), messages.iter(), &[]);
        assert!(copy >= values, "{copy} < {values}");
        // The scratch of the longest escaped string (about 120 KB written) at most.
        assert!(copy <= values + 300_000, "{copy}");
    }

    /// What a translated answer keeps for its own wire (reasoning items, a response id)
    /// stays out of a request to a wire that cannot carry it.
    #[test]
    fn an_answer_s_rich_field_stays_a_value() {
        let budget = MemoryBudget::new("t".into(), 1 << 20);
        let answer = json!({"role": "assistant", "content": "hi",
                            RICH_CONTENT_FIELD: [{"type": "reasoning", "encrypted_content": "SECRET"}]});
        let message: AssistantMessage = serde_json::from_value(answer.clone()).unwrap();
        let mut charge = budget.empty("test");
        let kept = Message::assistant(&message, &mut charge).unwrap();
        assert!(matches!(kept, Message::Rich(_)));
        assert_eq!(sent(&kept, false), answer.to_string());
        assert_eq!(
            sent(&kept, true),
            json!({"role": "assistant", "content": "hi"}).to_string()
        );
        assert_eq!(
            budget.used(),
            heap::json(&answer) + heap::vec_slot::<Message>()
        );

        let plain: AssistantMessage =
            serde_json::from_value(json!({"role": "assistant", "content": "hi"})).unwrap();
        let kept = Message::assistant(&plain, &mut charge).unwrap();
        assert!(matches!(kept, Message::Text(_)));
    }

    #[test]
    fn image_parts_stay_a_value_and_a_plain_wire_is_sent_none() {
        let budget = MemoryBudget::new("t".into(), 1 << 20);
        let image = json!({"type": "image", "data": "AAAA"});
        let mut charge = budget.empty("test");
        let result = Message::tool_result("c1", "see", vec![image.clone()], &mut charge).unwrap();
        let rich = json!({"role": "tool", "tool_call_id": "c1", "content": "see", RICH_CONTENT_FIELD: [image]});
        assert_eq!(sent(&result, false), rich.to_string());
        let plain = json!({"role": "tool", "tool_call_id": "c1", "content": "see"});
        assert_eq!(sent(&result, true), plain.to_string());
        assert_eq!(
            charge.bytes(),
            heap::json(&rich) + heap::vec_slot::<Message>()
        );

        let (value, mut charge) = budget
            .parse_json("test", rich.to_string().as_bytes())
            .unwrap();
        let added = Message::from_value(value, &mut charge).unwrap();
        assert!(matches!(added, Message::Rich(_)));
        assert_eq!(sent(&added, true), plain.to_string());
        assert_eq!(
            charge.bytes(),
            heap::json(&rich) + heap::vec_slot::<Message>()
        );
    }
}
