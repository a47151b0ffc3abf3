//! The host configuration file (`quiver.toml`): named LLM backends and the default one.
//!
//! ```toml
//! default_backend = "openai"
//!
//! [backends.openai]
//! kind = "openai"                        # openai (default) | replay
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"         # the *name* of the variable, never the key
//! default_model = "gpt-4o-mini"
//! request_timeout_ms = 120000
//! headers = { "OpenAI-Organization" = "org-..." }
//!
//! [backends.claude]
//! kind = "anthropic"                     # Anthropic Messages API (images in tool results)
//! base_url = "https://api.anthropic.com/v1"
//! api_key_env = "ANTHROPIC_API_KEY"      # sent as `x-api-key`
//! default_model = "claude-sonnet-4-5"
//! anthropic_version = "2023-06-01"       # the `anthropic-version` header
//! max_tokens = 4096                      # for requests that set none
//!
//! [backends.demo]
//! kind = "replay"
//! transcript = "transcripts/chat-demo.json"   # relative to this file
//!
//! [auth.corp]                            # referenced by a registry record's http.auth_ref
//! kind = "oauth_client_credentials"      # or "api_key" (value_env, header, prefix)
//! client_id = "quiver"
//! client_secret_env = "CORP_MCP_SECRET"
//! token_url = "https://auth.example.com/oauth/token"  # optional: discovered (docs/auth.md)
//!
//! [egress]                               # remote MCP servers the host may reach
//! allow = ["https://*.example.com"]
//! allow_private = ["127.0.0.0/8"]        # loopback/private/link-local need this
//!
//! [mcp]                                  # the MCP pool's host-wide limits
//! max_concurrent_calls = 4096
//! max_server_processes = 64
//! server_idle_timeout_ms = 600000        # 0: never stop an idle server
//! prewarm = ["fs"]                       # servers started with the host
//! [tasks]                                # admission control (HostBuilder overrides it)
//! max_concurrent = 1024                  # tasks running at once
//! queue_capacity = 16384                 # tasks waiting for a slot; more get "host busy"
//! queue_timeout_ms = 60000               # longest wait for a slot
//! host_memory_bytes = 67108864           # each task's host memory budget
//! host_memory_total_bytes = 8589934592   # all tasks together (default: half the RAM)
//! [serve]                                # `quiver serve` (see crate::serve::ServeConfig)
//! token_env = "QUIVER_TOKEN"             # the *name* of the variable holding the API token
//! drain_grace_ms = 30000                 # running tasks' time to finish on SIGTERM
//! [admin]                                # `quiver serve` admin API (off without it)
//! token_env = "QUIVER_ADMIN_TOKEN"       # the *name* of the variable holding the admin token
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::mcp::{AuthConfig, EgressConfig, EgressPolicy, McpHostConfig};
use crate::serve::{AdminConfig, ServeConfig};

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    #[default]
    Openai,
    Anthropic,
    Replay,
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

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub default_backend: Option<String>,
    #[serde(default)]
    pub backends: BTreeMap<String, BackendConfig>,
    /// Credentials remote MCP servers reference with `http.auth_ref`.
    #[serde(default)]
    pub auth: BTreeMap<String, AuthConfig>,
    /// What remote MCP servers the host may reach.
    #[serde(default)]
    pub egress: EgressConfig,
    /// The MCP pool's host-wide limits and the servers to start with the host.
    #[serde(default)]
    pub mcp: McpHostConfig,
    /// How many tasks run at once and how many may wait.
    #[serde(default)]
    pub tasks: TasksConfig,
    /// `quiver serve`: the node's API token and limits.
    #[serde(default)]
    pub serve: ServeConfig,
    /// `quiver serve`: the admin API's token; without it the admin API is off.
    #[serde(default)]
    pub admin: AdminConfig,
}

/// `[tasks]`: admission control. Unset fields take their `defaults`; `HostBuilder` options
/// override them.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TasksConfig {
    /// Tasks running at once ([`crate::defaults::MAX_CONCURRENT_TASKS`]).
    pub max_concurrent: Option<u32>,
    /// Tasks that may wait for a running slot ([`crate::defaults::TASK_QUEUE_CAPACITY`]); 0 turns
    /// the queue off.
    pub queue_capacity: Option<u32>,
    /// Longest wait for a running slot ([`crate::defaults::TASK_QUEUE_TIMEOUT`]).
    pub queue_timeout_ms: Option<u64>,
    /// Each task's host memory budget ([`crate::defaults::TASK_HOST_MEMORY_BYTES`]); a
    /// task's `limits.host_memory_bytes` may only lower it.
    pub host_memory_bytes: Option<u64>,
    /// Host memory all tasks hold together ([`crate::defaults::host_memory_total`]).
    pub host_memory_total_bytes: Option<u64>,
}

impl TasksConfig {
    /// The field at fault and the fix, for a value no host can use.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.max_concurrent == Some(0) {
            return Err((
                "tasks.max_concurrent",
                "must be at least 1; omit it for the default",
            ));
        }
        if self.host_memory_total_bytes == Some(0) {
            return Err((
                "tasks.host_memory_total_bytes",
                "must be greater than 0; omit it for half of the machine's memory",
            ));
        }
        if self.host_memory_bytes == Some(0) {
            return Err((
                "tasks.host_memory_bytes",
                "must be greater than 0; omit it for the default",
            ));
        }
        if self.queue_timeout_ms == Some(0) {
            return Err((
                "tasks.queue_timeout_ms",
                "must be greater than 0; set tasks.queue_capacity = 0 to refuse at once instead of queueing",
            ));
        }
        Ok(())
    }
}

/// Where a host config came from: errors name `file`, relative paths resolve against `dir`.
#[derive(Clone, Debug)]
pub struct ConfigOrigin {
    pub file: PathBuf,
    pub dir: PathBuf,
}

impl ConfigOrigin {
    /// A config read from `file`.
    pub fn file(file: &Path) -> Self {
        Self {
            file: file.to_owned(),
            dir: file
                .parent()
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from(".")),
        }
    }

    /// A config built in code, its relative paths relative to `dir`.
    pub fn in_code(dir: impl Into<PathBuf>) -> Self {
        Self {
            file: PathBuf::from("<host config built in code>"),
            dir: dir.into(),
        }
    }
}

/// A config file that cannot be used, naming the file, the field and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{}: {field}{message}", path.display())]
pub struct ConfigError {
    pub path: PathBuf,
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        let field = if field.is_empty() {
            field
        } else {
            format!("{field}: ")
        };
        Self {
            path: path.to_owned(),
            field,
            message: message.into(),
        }
    }
}

impl HostConfig {
    /// Reads `quiver.toml`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, "", format!("cannot read the host config: {e}")))?;
        let value: toml::Value = toml::from_str(&text)
            .map_err(|e| ConfigError::new(path, "", format!("invalid TOML: {}", e.message())))?;
        let config: Self = serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::new(
                path,
                if field == "." { String::new() } else { field },
                e.into_inner().to_string(),
            )
        })?;
        EgressPolicy::from_config(&config.egress)
            .map_err(|e| ConfigError::new(path, "egress", e.to_string()))?;
        config
            .mcp
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        config
            .tasks
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        config
            .serve
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        config
            .admin
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        for (name, backend) in &config.backends {
            let field = |f: &str| format!("backends.{name}.{f}");
            if backend.request_timeout_ms == Some(0) {
                return Err(ConfigError::new(
                    path,
                    field("request_timeout_ms"),
                    "must be greater than 0; omit it for the default",
                ));
            }
            match backend.kind {
                BackendKind::Replay if backend.transcript.is_none() => {
                    return Err(ConfigError::new(
                        path,
                        field("transcript"),
                        "a replay backend needs a transcript file",
                    ));
                }
                BackendKind::Openai | BackendKind::Anthropic if backend.transcript.is_some() => {
                    return Err(ConfigError::new(
                        path,
                        field("transcript"),
                        "only replay backends read transcripts",
                    ));
                }
                _ => {}
            }
            if backend.kind != BackendKind::Anthropic {
                for (set, name) in [
                    (backend.anthropic_version.is_some(), "anthropic_version"),
                    (backend.max_tokens.is_some(), "max_tokens"),
                ] {
                    if set {
                        return Err(ConfigError::new(
                            path,
                            field(name),
                            "only anthropic backends take it",
                        ));
                    }
                }
            }
            if backend.max_tokens == Some(0) {
                return Err(ConfigError::new(
                    path,
                    field("max_tokens"),
                    "must be greater than 0; omit it for the default",
                ));
            }
        }
        Ok(config)
    }

    /// The configured backends, or the zero-config `openai` backend from the environment.
    pub(crate) fn backends_or_zero_config(&self) -> BTreeMap<String, BackendConfig> {
        if !self.backends.is_empty() {
            return self.backends.clone();
        }
        let zero = BackendConfig {
            kind: BackendKind::Openai,
            base_url: std::env::var("OPENAI_BASE_URL").ok(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            ..BackendConfig::default()
        };
        BTreeMap::from([("openai".to_owned(), zero)])
    }

    pub(crate) fn default_backend_name(
        &self,
        backends: &BTreeMap<String, BackendConfig>,
        origin: &ConfigOrigin,
    ) -> Result<String, ConfigError> {
        match &self.default_backend {
            Some(name) if backends.contains_key(name) => Ok(name.clone()),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<HostConfig, ConfigError> {
        let dir = std::env::temp_dir().join(format!("quiver-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| ConfigError::new(&dir, "", e.to_string()))?;
        let file = dir.join("quiver.toml");
        std::fs::write(&file, text).map_err(|e| ConfigError::new(&file, "", e.to_string()))?;
        let loaded = HostConfig::load(&file);
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    #[test]
    fn anthropic_fields_belong_to_anthropic_backends_only() {
        let config = load(
            "[backends.c]\nkind = \"anthropic\"\nanthropic_version = \"2023-06-01\"\nmax_tokens = 10\n",
        )
        .expect("an anthropic backend");
        assert_eq!(config.backends["c"].kind, BackendKind::Anthropic);
        assert_eq!(config.backends["c"].max_tokens, Some(10));

        let error =
            load("[backends.o]\nmax_tokens = 10\n").expect_err("openai takes no max_tokens");
        assert!(
            error
                .to_string()
                .contains("backends.o.max_tokens: only anthropic"),
            "{error}"
        );
        let error = load("[backends.c]\nkind = \"anthropic\"\nmax_tokens = 0\n")
            .expect_err("zero max_tokens");
        assert!(
            error.to_string().contains("backends.c.max_tokens"),
            "{error}"
        );
    }
}
