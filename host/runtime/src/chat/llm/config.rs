//! The chat capability's part of `quiver.toml`: its LLM backends by name
//! (`[backends.NAME]`) and the default one (`default_backend`); see
//! [`HostConfig`](crate::HostConfig) for the whole file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::{ConfigError, ConfigOrigin};

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    #[default]
    Openai,
    /// The OpenAI Responses API (`POST {base_url}/responses`), translated.
    OpenaiResponses,
    Anthropic,
    /// Gemini `generateContent` (`POST {base_url}/models/{model}:generateContent`), translated.
    Gemini,
    Replay,
}

impl BackendKind {
    /// Whether backends of this kind speak HTTP (all but `replay`).
    fn is_http(self) -> bool {
        self != BackendKind::Replay
    }

    /// The `gen_ai.provider.name` of its requests' spans.
    pub(crate) fn provider(self) -> &'static str {
        match self {
            Self::Openai | Self::OpenaiResponses => "openai",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gcp.gemini",
            Self::Replay => "quiver.replay",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    #[serde(default)]
    pub kind: BackendKind,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub default_model: Option<String>,
    pub request_timeout_ms: Option<u64>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Replay backends: the transcript file.
    pub transcript: Option<PathBuf>,
    /// Anthropic backends: the `anthropic-version` header
    /// ([`crate::defaults::ANTHROPIC_VERSION`]).
    pub anthropic_version: Option<String>,
    /// Anthropic backends: `max_tokens` for requests that set none
    /// ([`crate::defaults::ANTHROPIC_MAX_TOKENS`]).
    pub max_tokens: Option<u32>,
    /// OpenAI Responses backends: store each response and send only what is new since the
    /// last one, with `previous_response_id` (default false: stateless, `store: false`).
    pub chain_responses: Option<bool>,
    /// OpenAI Responses backends, stateless: the models (`*`/`?` patterns) asked to return
    /// their reasoning encrypted (`include: ["reasoning.encrypted_content"]`), which models
    /// without reasoning refuse ([`crate::defaults::RESPONSES_REASONING_MODELS`]).
    pub reasoning_models: Option<Vec<String>>,
    /// Gemini backends: the models (`*`/`?` patterns) that take images inside a function
    /// response ([`crate::defaults::GEMINI_IMAGE_RESULT_MODELS`]); others get a text note.
    pub image_result_models: Option<Vec<String>>,
}

impl BackendConfig {
    /// The field at fault (below `backends.NAME`) and the fix, for a backend no host can use.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.request_timeout_ms == Some(0) {
            return Err((
                "request_timeout_ms",
                "must be greater than 0; omit it for the default",
            ));
        }
        match self.kind {
            BackendKind::Replay if self.transcript.is_none() => {
                return Err(("transcript", "a replay backend needs a transcript file"));
            }
            kind if kind.is_http() && self.transcript.is_some() => {
                return Err(("transcript", "only replay backends read transcripts"));
            }
            _ => {}
        }
        let only = [
            (
                self.anthropic_version.is_some(),
                "anthropic_version",
                BackendKind::Anthropic,
                "only anthropic backends take it",
            ),
            (
                self.max_tokens.is_some(),
                "max_tokens",
                BackendKind::Anthropic,
                "only anthropic backends take it",
            ),
            (
                self.chain_responses.is_some(),
                "chain_responses",
                BackendKind::OpenaiResponses,
                "only openai_responses backends take it",
            ),
            (
                self.reasoning_models.is_some(),
                "reasoning_models",
                BackendKind::OpenaiResponses,
                "only openai_responses backends take it",
            ),
            (
                self.image_result_models.is_some(),
                "image_result_models",
                BackendKind::Gemini,
                "only gemini backends take it",
            ),
        ];
        for (set, name, kind, why) in only {
            if set && self.kind != kind {
                return Err((name, why));
            }
        }
        if self.max_tokens == Some(0) {
            return Err((
                "max_tokens",
                "must be greater than 0; omit it for the default",
            ));
        }
        Ok(())
    }
}

/// The configured backends, or the zero-config `openai` backend from the environment.
pub(super) fn backends_or_zero_config(
    backends: &BTreeMap<String, BackendConfig>,
) -> BTreeMap<String, BackendConfig> {
    if !backends.is_empty() {
        return backends.clone();
    }
    let zero = BackendConfig {
        kind: BackendKind::Openai,
        base_url: std::env::var("OPENAI_BASE_URL").ok(),
        api_key_env: Some("OPENAI_API_KEY".into()),
        ..BackendConfig::default()
    };
    BTreeMap::from([("openai".to_owned(), zero)])
}

/// The backend sessions use when they name none.
pub(super) fn default_backend_name(
    default_backend: Option<&str>,
    backends: &BTreeMap<String, BackendConfig>,
    origin: &ConfigOrigin,
) -> Result<String, ConfigError> {
    match default_backend {
        Some(name) if backends.contains_key(name) => Ok(name.to_owned()),
        Some(name) => Err(ConfigError::new(
            &origin.file,
            "default_backend",
            format!(
                "`{name}` is not one of the configured backends ({})",
                backends.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )),
        None if backends.len() == 1 || backends.contains_key("openai") => Ok(backends
            .keys()
            .find(|k| *k == "openai")
            .or_else(|| backends.keys().next())
            .cloned()
            .unwrap_or_default()),
        None => Err(ConfigError::new(
            &origin.file,
            "default_backend",
            "several backends are configured; name the default one",
        )),
    }
}
