//! The replay backend: answers from a transcript file instead of a model.
//!
//! A transcript is a list of exchanges; each has a matcher on the request and the response
//! to give. The first exchange whose matcher fits answers. Matching is stateless, so many
//! tasks can share one transcript. This is what the offline demo runs on, and what
//! `quiver run --record` writes.
//!
//! ```json
//! {"version": 1,
//!  "note": "Scripted responses, not a model.",
//!  "exchanges": [
//!    {"match": {"last_role": "user", "last_content_contains": "weather"},
//!     "response": {"object": "chat.completion", "choices": [...]}}]}
//! ```
//!
//! Matcher fields, all optional (an empty matcher matches everything): `last_role`,
//! `last_content_contains` (a substring of the last message's text), `tools_include` (tool
//! names the request must offer), `model`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::BackendConfig;
use super::{LlmError, LlmFailure, LlmReply};
use crate::chat::wire::ChatCompletion;
use crate::config::{ConfigError, ConfigOrigin};
use crate::sandbox::{Charge, heap};

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Matcher {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_content_contains: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools_include: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    #[serde(rename = "match", default)]
    pub matcher: Matcher,
    /// Read when the transcript loads, so a response the loop could not use is a config
    /// error naming its path.
    pub response: ChatCompletion,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Transcript {
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub exchanges: Vec<Exchange>,
}

/// The last message's role and text, the parts of a request matchers look at.
pub(super) fn last_message(body: &Value) -> (Option<&str>, String) {
    let last = body["messages"].as_array().and_then(|m| m.last());
    let role = last.and_then(|m| m["role"].as_str());
    let text = match last.map(|m| &m["content"]) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    (role, text)
}

impl Matcher {
    fn matches(&self, body: &Value) -> bool {
        let (role, text) = last_message(body);
        let offered: Vec<&str> = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        self.last_role
            .as_deref()
            .is_none_or(|want| role == Some(want))
            && self
                .last_content_contains
                .as_deref()
                .is_none_or(|want| text.contains(want))
            && self
                .tools_include
                .iter()
                .all(|name| offered.contains(&name.as_str()))
            && self
                .model
                .as_deref()
                .is_none_or(|want| body["model"].as_str() == Some(want))
    }
}

/// Each exchange's response: the length of its JSON text, and the heap a copy of it takes.
fn response_sizes(transcript: &Transcript) -> Vec<(usize, u64)> {
    transcript
        .exchanges
        .iter()
        .map(|exchange| {
            let json = serde_json::to_vec(&exchange.response).unwrap_or_default();
            (json.len(), heap::json_text_bound(&json))
        })
        .collect()
}

pub(super) struct ReplayBackend {
    name: String,
    path: PathBuf,
    transcript: Transcript,
    /// What each exchange's answer is charged.
    costs: Vec<u64>,
}

impl ReplayBackend {
    pub(super) fn load(
        name: &str,
        config: &BackendConfig,
        origin: &ConfigOrigin,
    ) -> Result<Self, ConfigError> {
        let field = format!("backends.{name}.transcript");
        let relative = config.transcript.as_ref().ok_or_else(|| {
            ConfigError::new(
                &origin.file,
                &field,
                "missing: a replay backend needs a transcript file",
            )
        })?;
        let path = origin.dir.join(relative);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::new(
                &path,
                "",
                format!("cannot read the transcript ({field}): {e}"),
            )
            .with_source(e)
        })?;
        crate::json::refuse_raw_value_key(text.as_bytes())
            .map_err(|e| ConfigError::new(&path, "", e.to_string()).with_source(e))?;
        let de = &mut serde_json::Deserializer::from_str(&text);
        let transcript: Transcript = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let source = e.into_inner();
            ConfigError::new(
                &path,
                if at == "." { String::new() } else { at },
                source.to_string(),
            )
            .with_source(source)
        })?;
        // What a live backend could not send, a transcript cannot answer with either.
        let limit = crate::defaults::LLM_MAX_RESPONSE_BYTES;
        let sizes = response_sizes(&transcript);
        if let Some((i, (len, _))) = sizes.iter().enumerate().find(|(_, (len, _))| *len > limit) {
            return Err(ConfigError::new(
                &path,
                format!("exchanges[{i}].response"),
                format!("{len} bytes; a response may be at most {limit} bytes"),
            ));
        }
        if transcript.version != 1 {
            return Err(ConfigError::new(
                &path,
                "version",
                format!(
                    "unsupported version {}; this host reads 1",
                    transcript.version
                ),
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            path,
            transcript,
            costs: sizes.into_iter().map(|(_, cost)| cost).collect(),
        })
    }

    pub(super) fn complete(
        &self,
        body: &Value,
        answer: &mut Charge,
    ) -> Result<LlmReply, LlmFailure> {
        match self
            .transcript
            .exchanges
            .iter()
            .zip(&self.costs)
            .find(|(x, _)| x.matcher.matches(body))
        {
            Some((exchange, &cost)) => {
                if answer.resize(cost).is_err() {
                    return Err(LlmFailure {
                        error: LlmError::AnswerOverBudget {
                            backend: self.name.clone(),
                        },
                        retries: 0,
                    });
                }
                let mut response = exchange.response.clone();
                if let Some(model) = body["model"].as_str() {
                    let passed = response.passed.get_or_insert_default();
                    passed.model.get_or_insert_with(|| Value::from(model));
                }
                Ok(LlmReply {
                    body: response,
                    retries: 0,
                })
            }
            None => {
                let (role, text) = last_message(body);
                let message = format!(
                    "transcript {} has no exchange matching this request (last message: role {:?}, text {:?})",
                    self.path.display(),
                    role.unwrap_or("none"),
                    text.chars().take(80).collect::<String>()
                );
                Err(LlmFailure {
                    error: LlmError::InvalidResponse {
                        backend: self.name.clone(),
                        message,
                        source: None,
                    },
                    retries: 0,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_response_is_sized_as_text_and_as_heap() {
        let transcript: Transcript = serde_json::from_value(serde_json::json!({
            "version": 1,
            "exchanges": [
                {"response": {"object": "chat.completion", "choices": []}},
                {"response": {"object": "chat.completion", "choices": [], "pad": "x".repeat(200)}},
            ],
        }))
        .unwrap();
        let first = serde_json::to_vec(&transcript.exchanges[0].response)
            .unwrap()
            .len();
        let sizes = response_sizes(&transcript);
        assert_eq!(sizes[0].0, first);
        assert!(sizes[1].0 > first + 200);
        // A copy takes more heap than its text, and a longer text more.
        assert!(sizes[0].1 > first as u64 && sizes[1].1 > sizes[0].1);
    }
}
