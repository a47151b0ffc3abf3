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
    Anthropic,
    Replay,
}

impl BackendKind {
    /// The `gen_ai.provider.name` of its requests' spans.
    pub(crate) fn provider(self) -> &'static str {
        match self {
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
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
            BackendKind::Openai | BackendKind::Anthropic if self.transcript.is_some() => {
                return Err(("transcript", "only replay backends read transcripts"));
            }
            _ => {}
        }
        if self.kind != BackendKind::Anthropic {
            for (set, name) in [
                (self.anthropic_version.is_some(), "anthropic_version"),
                (self.max_tokens.is_some(), "max_tokens"),
            ] {
                if set {
                    return Err((name, "only anthropic backends take it"));
                }
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
