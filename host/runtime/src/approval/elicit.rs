//! A server's question (MCP elicitation, form mode) put to the host's approver: what the
//! approver is shown and what it may answer. The host checks the form before asking (a
//! flat object of primitive fields, bounded) and the answer before sending it (every field
//! one of the form's, of its type; required fields present; bounded), and fills in the
//! form's defaults the answer left out (SEP-1034).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::defaults;
use crate::observe::{Via, unix_seconds};
use crate::text::{cut, printable};

/// One question a server asked during a request of a task: what
/// [`Approver::elicit`](super::Approver::elicit) is given.
#[derive(Clone, Debug, Serialize)]
pub struct ElicitationRequest {
    /// Unique within the process.
    pub id: String,
    pub task_id: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    pub via: Via,
    pub server_id: String,
    /// The request the question came with: `tools/call`, `prompts/get` or
    /// `resources/read`.
    pub method: &'static str,
    /// Its tool, prompt or resource URI.
    pub name: String,
    /// The server's text, cut to
    /// [`defaults::MAX_ELICITATION_MESSAGE_BYTES`](crate::defaults::MAX_ELICITATION_MESSAGE_BYTES)
    /// and made printable: it is the server's, not the host's.
    pub message: String,
    /// The form, as the server sent it once checked: `{"type": "object", "properties":
    /// {...}, "required": [...]}`, each property a string, number, integer, boolean or
    /// enum field, possibly with a `default`.
    pub requested_schema: Value,
    #[serde(serialize_with = "unix_seconds")]
    pub requested_at: SystemTime,
    /// When the question stops waiting and is declined.
    #[serde(serialize_with = "unix_seconds")]
    pub expires_at: SystemTime,
}

/// An answer to an [`ElicitationRequest`]. Deserialises from `{"action": "accept",
/// "content": {...}}`, `{"action": "decline"}` or `{"action": "cancel"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase", try_from = "AnswerWire")]
pub enum ElicitationAnswer {
    /// The fields filled in; the form's defaults are added for those left out.
    Accept {
        #[serde(default)]
        content: Map<String, Value>,
    },
    Decline,
    Cancel,
}

/// An answer as JSON, read strictly: serde ignores unknown fields of a unit variant of a
/// tagged enum, so the fields are checked here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerWire {
    action: Action,
    content: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Action {
    Accept,
    Decline,
    Cancel,
}

impl TryFrom<AnswerWire> for ElicitationAnswer {
    type Error = &'static str;

    fn try_from(wire: AnswerWire) -> Result<Self, Self::Error> {
        match (wire.action, wire.content) {
            (Action::Accept, content) => Ok(Self::Accept {
                content: content.unwrap_or_default(),
            }),
            (Action::Decline, None) => Ok(Self::Decline),
            (Action::Cancel, None) => Ok(Self::Cancel),
            (_, Some(_)) => Err("`content` goes only with `\"action\": \"accept\"`"),
        }
    }
}

/// The future of one answer; `None`: this approver answers no questions (the host
/// declines). The host drops it when the question stops waiting.
pub type ElicitationFuture<'a> =
    Pin<Box<dyn Future<Output = Option<ElicitationAnswer>> + Send + 'a>>;

/// The answer that takes every field's default: `None` when a required field has none
/// (the form cannot be accepted without a person).
pub fn accept_defaults(schema: &Value) -> Option<ElicitationAnswer> {
    let properties = schema.get("properties")?.as_object()?;
    let required = required_fields(schema);
    let mut content = Map::new();
    for (name, property) in properties {
        match property.get("default") {
            Some(default) => {
                content.insert(name.clone(), default.clone());
            }
            None if required.contains(&name.as_str()) => return None,
            None => {}
        }
    }
    Some(ElicitationAnswer::Accept { content })
}

/// The names the form's `required` lists.
fn required_fields(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `content` with the form's defaults filled in for fields it left out (SEP-1034), if each
/// field is one of the form's and of its type, every required field is there, and it is
/// within the answer cap.
pub(crate) fn check_answer(
    schema: &Value,
    mut content: Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, property) in properties {
        if !content.contains_key(name)
            && let Some(default) = property.get("default")
        {
            content.insert(name.clone(), default.clone());
        }
    }
    for (name, value) in &content {
        let Some(property) = properties.get(name) else {
            return Err(format!(
                "`{}` is not a field of the form",
                printable(cut(name, 64))
            ));
        };
        check_value(property, value)
            .map_err(|why| format!("field `{}`: {why}", printable(cut(name, 64))))?;
    }
    for name in required_fields(schema) {
        if !content.contains_key(name) {
            return Err(format!(
                "required field `{}` is missing",
                printable(cut(name, 64))
            ));
        }
    }
    let size = serde_json::to_vec(&content).map_or(usize::MAX, |b| b.len());
    if size > defaults::MAX_ELICITATION_ANSWER_BYTES {
        return Err(format!(
            "the answer takes {size} bytes as JSON; at most {} are sent",
            defaults::MAX_ELICITATION_ANSWER_BYTES
        ));
    }
    Ok(content)
}

/// Whether `value` fits one field of a form: its type, its enum (or `oneOf` consts), and
/// its length or range bounds.
fn check_value(property: &Value, value: &Value) -> Result<(), String> {
    let allowed = |values: &[Value], value: &Value| {
        values
            .iter()
            .any(|v| v == value || v.get("const") == Some(value))
    };
    let choices = property
        .get("enum")
        .or_else(|| property.get("oneOf"))
        .and_then(Value::as_array);
    match property.get("type").and_then(Value::as_str) {
        Some("string") => {
            let text = value.as_str().ok_or("expected a string")?;
            if let Some(choices) = choices
                && !allowed(choices, value)
            {
                return Err("not one of the form's choices".into());
            }
            let chars = text.chars().count() as u64;
            if property
                .get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|max| chars > max)
            {
                return Err("longer than its maxLength".into());
            }
            if property
                .get("minLength")
                .and_then(Value::as_u64)
                .is_some_and(|min| chars < min)
            {
                return Err("shorter than its minLength".into());
            }
        }
        Some(kind @ ("number" | "integer")) => {
            let number = value.as_f64().ok_or("expected a number")?;
            if kind == "integer" && !(value.is_i64() || value.is_u64()) {
                return Err("expected an integer".into());
            }
            if property
                .get("minimum")
                .and_then(Value::as_f64)
                .is_some_and(|min| number < min)
            {
                return Err("below its minimum".into());
            }
            if property
                .get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|max| number > max)
            {
                return Err("above its maximum".into());
            }
        }
        Some("boolean") => {
            value.as_bool().ok_or("expected a boolean")?;
        }
        Some("array") => {
            let items = value.as_array().ok_or("expected an array")?;
            let item_choices = property.get("items").and_then(|items| {
                items
                    .get("enum")
                    .or_else(|| items.get("anyOf"))
                    .and_then(Value::as_array)
            });
            for item in items {
                if !item.is_string() {
                    return Err("expected an array of strings".into());
                }
                if let Some(choices) = item_choices
                    && !allowed(choices, item)
                {
                    return Err("an item is not one of the form's choices".into());
                }
            }
        }
        _ => return Err("the form gives this field no type the host knows".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_the_form_unless_a_required_field_has_none() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "note": {"type": "string"}}});
        assert_eq!(
            accept_defaults(&schema),
            Some(ElicitationAnswer::Accept {
                content: json!({"name": "John Doe", "age": 30})
                    .as_object()
                    .unwrap()
                    .clone()
            })
        );
        let mut required = schema.clone();
        required["required"] = json!(["note"]);
        assert_eq!(accept_defaults(&required), None);
    }

    #[test]
    fn answers_parse_strictly() {
        let accept: ElicitationAnswer =
            serde_json::from_value(json!({"action": "accept", "content": {"a": 1}})).unwrap();
        assert!(matches!(accept, ElicitationAnswer::Accept { .. }));
        assert!(
            serde_json::from_value::<ElicitationAnswer>(json!({"action": "decline", "x": 1}))
                .is_err()
        );
        assert!(serde_json::from_value::<ElicitationAnswer>(json!({"action": "maybe"})).is_err());
        assert!(
            serde_json::from_value::<ElicitationAnswer>(json!({"action": "cancel", "content": {}}))
                .is_err()
        );
        assert_eq!(
            serde_json::from_value::<ElicitationAnswer>(json!({"action": "accept"})).unwrap(),
            ElicitationAnswer::Accept {
                content: Map::new()
            }
        );
    }

    fn form() -> Value {
        json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe", "maxLength": 20},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
            "verified": {"type": "boolean", "default": true},
            "email": {"type": "string"}},
            "required": ["email"]})
    }

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn an_answer_gets_the_forms_defaults_and_is_checked_against_it() {
        let filled = check_answer(&form(), object(json!({"email": "a@b"}))).unwrap();
        assert_eq!(
            Value::Object(filled),
            json!({"name": "John Doe", "age": 30, "score": 95.5, "status": "active",
                   "verified": true, "email": "a@b"})
        );
        let wrong = [
            json!({}),
            json!({"email": 1}),
            json!({"email": "x", "age": 1.5}),
            json!({"email": "x", "status": "gone"}),
            json!({"email": "x", "name": "n".repeat(21)}),
            json!({"email": "x", "extra": "field"}),
        ];
        for answer in wrong {
            assert!(
                check_answer(&form(), object(answer.clone())).is_err(),
                "{answer}"
            );
        }
        let huge = json!({"type": "object", "properties": {"t": {"type": "string"}}});
        let big = "x".repeat(defaults::MAX_ELICITATION_ANSWER_BYTES);
        assert!(check_answer(&huge, object(json!({"t": big}))).is_err());
    }
}
