//! The upstream request body of one model request, borrowed from the session, the send and
//! its tool set instead of copied out of them, and its JSON text written once into a
//! buffer charged before it grows.

use std::io;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use super::message::Message;
use super::tools::Definitions;
use crate::sandbox::{Charge, heap};

/// The body: forwarded params (a forced `tool_choice` mapped to the offered name), then
/// what the host owns: `model`, the session's messages and those the send added, and the
/// tools. It serialises to what a `Map` built in that order would.
pub(super) struct RequestBody<'a> {
    pub(super) upstream: &'a Map<String, Value>,
    /// `tool_choice` rewritten to the name offered, when it needs that.
    pub(super) tool_choice: Option<Value>,
    pub(super) model: &'a str,
    pub(super) messages: &'a [Message],
    pub(super) added: &'a [Message],
    pub(super) tools: Definitions<'a>,
    /// Leave out the tool messages' image parts: a wire that cannot carry them would refuse
    /// them as unknown fields.
    pub(super) plain: bool,
}

impl Serialize for RequestBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.upstream {
            match &self.tool_choice {
                Some(mapped) if key == "tool_choice" => map.serialize_entry(key, mapped)?,
                _ => map.serialize_entry(key, value)?,
            }
        }
        map.serialize_entry("model", self.model)?;
        map.serialize_entry("messages", &Messages(self))?;
        if !self.tools.is_empty() {
            map.serialize_entry("tools", &self.tools)?;
        }
        map.end()
    }
}

struct Messages<'a, 'b>(&'a RequestBody<'b>);

impl Serialize for Messages<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let body = self.0;
        let all = body.messages.iter().chain(body.added);
        let mut seq = serializer.serialize_seq(Some(body.messages.len() + body.added.len()))?;
        for message in all {
            seq.serialize_element(&AsSent {
                message,
                plain: body.plain,
            })?;
        }
        seq.end()
    }
}

/// A message as the body sends it: without its image parts on a wire that cannot carry
/// them (it would refuse them as unknown fields).
struct AsSent<'a> {
    message: &'a Message,
    plain: bool,
}

impl Serialize for AsSent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.message.serialize_as(self.plain, serializer)
    }
}

/// The first buffer a body is written into; it doubles as it fills.
const FIRST_BYTES: usize = 4096;

/// The least a buffer grows by when the budget has no room to double it.
const STEP_BYTES: usize = 64 * 1024;

/// `body` as JSON text, each growth of its buffer charged to `charge` before it is made;
/// `-ENOMEM` (as an I/O error of kind `OutOfMemory`) when the budget cannot hold it.
pub(super) fn encode(body: &impl Serialize, charge: &mut Charge) -> io::Result<Vec<u8>> {
    let mut out = Charged {
        bytes: Vec::new(),
        charge,
    };
    match serde_json::to_writer(&mut out, body) {
        Ok(()) => return Ok(out.bytes),
        Err(e) if e.io_error_kind() == Some(io::ErrorKind::OutOfMemory) => {}
        Err(e) => return Err(e.into()),
    }
    // Near the budget's end, growing step by step would copy the buffer on every small
    // write: count the body once and hold exactly that, or refuse it.
    drop(out.bytes);
    let len = heap::json_len(body);
    charge
        .resize(heap::alloc(len))
        .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(usize::MAX));
    serde_json::to_writer(&mut bytes, body).map_err(io::Error::from)?;
    Ok(bytes)
}

struct Charged<'a> {
    bytes: Vec<u8>,
    charge: &'a mut Charge,
}

impl Charged<'_> {
    /// Makes room for `more` bytes, charged first. Out of line: the serializer writes a
    /// body in many small pieces, and the common one must stay a bounds check and a copy.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, more: usize) -> io::Result<()> {
        let needed = self.bytes.len().saturating_add(more);
        let capacity = self.bytes.capacity();
        // Double, else grow by a step (an eighth, at least STEP_BYTES); never by less, so
        // the buffer is copied O(log n) times whatever the budget.
        let wanted = needed.max(capacity.saturating_mul(2)).max(FIRST_BYTES);
        let step = needed
            .saturating_add((capacity / 8).max(STEP_BYTES))
            .min(wanted);
        let held = self
            .charge
            .resize_between(heap::alloc(step as u64), heap::alloc(wanted as u64))
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let room = if held >= heap::alloc(wanted as u64) {
            wanted
        } else {
            step
        };
        self.bytes.reserve_exact(room - self.bytes.len());
        Ok(())
    }
}

impl io::Write for Charged<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// What serde_json calls for every piece; the default loops over `write`.
    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.bytes.capacity() - self.bytes.len() < buf.len() {
            self.grow(buf.len())?;
        }
        self.bytes.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::GuestTool;
    use crate::chat::llm::RICH_CONTENT_FIELD;
    use crate::sandbox::MemoryBudget;

    /// `values` as a session's messages.
    fn messages(values: &[Value]) -> Vec<Message> {
        let budget = MemoryBudget::unlimited();
        values
            .iter()
            .map(|v| Message::from_value(v.clone(), &mut budget.empty("test")).unwrap())
            .collect()
    }

    fn body<'a>(
        upstream: &'a Map<String, Value>,
        messages: &'a [Message],
        added: &'a [Message],
        tools: &'a [GuestTool],
        plain: bool,
    ) -> RequestBody<'a> {
        RequestBody {
            upstream,
            tool_choice: None,
            model: "m",
            messages,
            added,
            tools: tools.into(),
            plain,
        }
    }

    #[test]
    fn the_body_is_what_a_map_built_in_order_would_be() {
        let upstream = json!({"temperature": 0.5, "tool_choice": {"type": "function", "function": {"name": "mcp.fs.read"}}, "seed": 1});
        let upstream = upstream.as_object().unwrap();
        let messages = [json!({"role": "user", "content": "hi"})];
        let rich = json!({"role": "tool", "tool_call_id": "a", "content": "x", RICH_CONTENT_FIELD: [{"type": "image"}]});
        let added = self::messages(std::slice::from_ref(&rich));
        let tools = [GuestTool::parse(
            1,
            r#"{"type": "function", "function": {"name": "f", "parameters": {}}}"#,
        )
        .unwrap()];
        let mapped = json!({"type": "function", "function": {"name": "mcp__fs__read"}});

        let mut expected = upstream.clone();
        expected.insert("model".into(), json!("m"));
        expected.insert("messages".into(), json!([messages[0], rich]));
        expected.insert("tools".into(), json!([*tools[0].definition]));
        expected.insert("tool_choice".into(), mapped.clone());
        let session = self::messages(&messages);
        let mut built = body(upstream, &session, &added, &tools, false);
        built.tool_choice = Some(mapped);
        let budget = MemoryBudget::new("t".into(), 1 << 20);
        let mut charge = budget.empty("request");
        let text = encode(&built, &mut charge).unwrap();
        assert_eq!(text, serde_json::to_vec(&expected).unwrap());
        assert!(charge.bytes() >= heap::alloc(text.len() as u64));
        assert_eq!(budget.used(), charge.bytes());

        built.plain = true;
        let plain = serde_json::to_value(&built).unwrap();
        assert_eq!(
            plain["messages"][1],
            json!({"role": "tool", "tool_call_id": "a", "content": "x"})
        );
        let bare = serde_json::to_value(body(&Map::new(), &[], &[], &[], true)).unwrap();
        assert_eq!(
            bare,
            json!({"model": "m", "messages": []}),
            "no tools, no key"
        );
    }

    #[test]
    fn a_body_the_budget_cannot_hold_is_refused_before_it_is_written() {
        let messages = messages(&[json!({"role": "user", "content": "x".repeat(100_000)})]);
        let budget = MemoryBudget::new("t".into(), 50_000);
        let mut charge = budget.empty("request");
        let upstream = Map::new();
        let error = encode(&body(&upstream, &messages, &[], &[], false), &mut charge).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::OutOfMemory);
        assert!(budget.used() <= 50_000);
    }

    /// Near the budget's end the buffer is sized once to the body, not grown write by
    /// write: a body of many small values that just fits is written, and what is held is
    /// what it takes.
    #[test]
    fn a_body_that_just_fits_is_sized_once() {
        let values: Vec<Value> = (0..20_000)
            .map(|i| json!({"role": "user", "content": i.to_string()}))
            .collect();
        let messages = messages(&values);
        let upstream = Map::new();
        let built = body(&upstream, &messages, &[], &[], false);
        let len = heap::json_len(&built);
        let budget = MemoryBudget::new("t".into(), heap::alloc(len) + 1024);
        let mut charge = budget.empty("request");
        let text = encode(&built, &mut charge).expect("it fits");
        assert_eq!(text.len() as u64, len);
        assert_eq!(charge.bytes(), heap::alloc(len));
        assert_eq!(text.capacity(), text.len());
    }
}
