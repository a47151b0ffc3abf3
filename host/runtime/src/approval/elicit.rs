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

use crate::observe::{Via, unix_seconds};

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
pub(crate) fn required_fields(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
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
}
