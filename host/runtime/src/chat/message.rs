//! One message of a chat session, kept as the JSON text it is sent as.
//!
//! A session's messages go into every request of every send after they are added. Kept as
//! values, each request encoded all of them anew (escaping every string again), and each
//! was a tree of small allocations to build, charge and free. Kept as text, a message is
//! written once when it is added and copied into each request as it is (serde_json writes
//! a `RawValue` verbatim); a wire that translates the body still reads it as a value.
//!
//! A message with image parts stays a value: a wire that cannot carry images is sent it
//! without them, and only a value can leave them out.

use quiver_abi::Errno;
use serde::{Serialize, Serializer};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};

use super::llm::RICH_CONTENT_FIELD;
use crate::sandbox::{Charge, heap};

#[derive(Clone, Debug)]
pub(crate) enum Message {
    /// Written once, sent as it is.
    Text(Box<RawValue>),
    /// A message with image parts (`RICH_CONTENT_FIELD`).
    Rich(Map<String, Value>),
}

impl Message {
    /// `message` written as JSON text, charged to `charge` before it is written: `-ENOMEM`
    /// when the budget cannot hold it.
    pub(crate) fn encode(message: &impl Serialize, charge: &mut Charge) -> Result<Self, Errno> {
        let len = heap::json_len(message);
        charge.grow(heap::alloc(len).saturating_add(heap::vec_slot::<Message>()))?;
        // Only a value that refuses to serialise fails here, and none of ours does.
        let text = to_raw_value(message).map_err(|_| Errno::EIO)?;
        Ok(Self::Text(text))
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
    /// keeps them as its image parts.
    pub(crate) fn tool_result(
        id: &str,
        content: &str,
        images: Vec<Value>,
        charge: &mut Charge,
    ) -> Result<Self, Errno> {
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
        if images.is_empty() {
            return Self::encode(&result, charge);
        }
        let Ok(Value::Object(mut fields)) = serde_json::to_value(&result) else {
            unreachable!("a struct serialises to an object")
        };
        fields.insert(RICH_CONTENT_FIELD.into(), Value::Array(images));
        charge.grow(Self::rich_cost(&fields))?;
        Ok(Self::Rich(fields))
    }

    fn rich_cost(fields: &Map<String, Value>) -> u64 {
        heap::map(fields).saturating_add(heap::vec_slot::<Message>())
    }

    /// `message`: one with image parts is kept as a value, any other is written as text.
    /// `charge` holds the value alone before, and what the message holds after.
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

    /// The message as sent, less its image parts when `plain`.
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

    /// What a copy of the message as a value may hold: a wire that translates the body
    /// reads each message back into one.
    pub(crate) fn value_cost(&self) -> u64 {
        match self {
            Self::Text(text) => heap::json_text_bound(text.get().as_bytes()),
            Self::Rich(fields) => heap::map(fields),
        }
    }
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
        assert!(message.value_cost() >= heap::json(&value));
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
