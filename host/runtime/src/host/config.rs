//! The host configuration file (`quiver.toml`), composed from the sections each capability
//! owns: the chat capability's LLM backends, the MCP capability's credentials, egress and
//! pool limits, and the host's own admission control (`[tasks]`).
//!
//! ```toml
//! default_backend = "openai"
//!
//! [backends.openai]
//! kind = "openai"                        # openai (default) | anthropic | replay
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
//! [backends.responses]
//! kind = "openai_responses"              # OpenAI Responses API (images in tool results)
//! chain_responses = false                # true: store responses, chain by previous_response_id
//! reasoning_models = ["gpt-5*"]          # models asked for encrypted reasoning (stateless)
//!
//! [backends.gemini]
//! kind = "gemini"                        # generateContent; key sent as `x-goog-api-key`
//! api_key_env = "GEMINI_API_KEY"
//! image_result_models = ["gemini-3*"]    # models taking images in tool results
//!
//! [backends.demo]
//! kind = "replay"
//! transcript = "transcripts/chat-demo.json"   # relative to this file
//!
//! [auth.corp]                            # referenced by a registry record's http.auth_ref
//! kind = "oauth_client_credentials"      # or "api_key" (value_env, header, prefix)
//! servers = ["corp-mcp"]                 # the records that may name it, and/or
//! origins = ["https://mcp.example.com"]  # where it may be sent (at least one of the two)
//! client_id = "quiver"
//! client_secret_env = "CORP_MCP_SECRET"
//! token_url = "https://auth.example.com/oauth/token"  # optional: discovered (docs/auth.md)
//!
//! [egress]                               # remote MCP servers the host may reach
//! allow = ["https://*.example.com"]
//! allow_private = ["127.0.0.0/8"]        # loopback/private/link-local need this
//! proxy = "http://proxy.internal:3128"   # the only proxy used; HTTP(S)_PROXY are ignored
//!
//! [mcp]                                  # the MCP pool's host-wide limits
//! max_concurrent_calls = 4096
//! max_server_processes = 64
//! server_idle_timeout_ms = 600000        # 0: never stop an idle server
//! prewarm = ["fs"]                       # servers started with the host
//! [mcp.launch]                           # what stdio records may run and read
//! commands = ["/opt/mcp/bin/*"]          # absolute paths or patterns
//! env = ["GITHUB_TOKEN"]                 # variables ${ENV:..} and env_from may read
//! [principals.alice]                    # what a task's principal may use (docs/policy.md)
//! servers = ["github", "docs-*"]         # server id patterns
//! profiles = ["readonly"]                # profile patterns for mcp.profile
//! [principals."*"]                       # everyone else; no entry at all: nothing
//! servers = ["docs-*"]
//! [tasks]                                # admission control (HostBuilder overrides it)
//! max_concurrent = 1024                  # tasks running at once
//! queue_capacity = 16384                 # tasks waiting for a slot; more get "host busy"
//! queue_timeout_ms = 60000               # longest wait for a slot
//! host_memory_bytes = 67108864           # each task's host memory budget
//! host_memory_total_bytes = 8589934592   # all tasks together (default: half the RAM)
//! guest_memory_total_bytes = 8589934592  # all guests' linear memory (default: half the RAM)
//! keep_resident_bytes = 8192             # per slot, reset in place when a task ends
//! ```
//!
//! A node (`quiver-node`) keeps `[serve]` and `[admin]` in the same file and reads them
//! with [`HostConfig::load_with_sections`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::chat::llm::BackendConfig;
use crate::config::{ConfigError, read_section};
use crate::mcp::{AuthConfig, EgressConfig, EgressPolicy, LaunchRules, McpHostConfig};
use crate::policy::{PrincipalConfig, PrincipalRules};

/// `quiver.toml` as the host reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The backend a chat session uses when it names none.
    pub default_backend: Option<String>,
    /// LLM backends by name (the chat capability's).
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
    /// The servers and profiles each principal may use (the policy capability's); absent,
    /// principals are not a policy layer.
    pub principals: Option<BTreeMap<String, PrincipalConfig>>,
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
    /// Guest linear memory all running tasks hold together
    /// ([`crate::defaults::guest_memory_total`]); tasks wait for room at admission and a
    /// grow past it traps.
    pub guest_memory_total_bytes: Option<u64>,
    /// Bytes of each slot's fiber stack and linear memory reset in place when a task ends
    /// ([`crate::defaults::TASK_KEEP_RESIDENT`]); 0 gives them all back to the kernel.
    pub keep_resident_bytes: Option<usize>,
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
        if self
            .guest_memory_total_bytes
            .is_some_and(|bytes| bytes < crate::defaults::GUEST_MEMORY_TOTAL_MIN)
        {
            return Err((
                "tasks.guest_memory_total_bytes",
                "must be at least 1048576 (1 MiB) so a small guest can start; omit it for half of the machine's memory",
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

impl HostConfig {
    /// `[principals]`, checked; `None` without the section.
    pub(crate) fn principal_rules(
        &self,
    ) -> Result<Option<PrincipalRules>, crate::policy::PrincipalConfigError> {
        self.principals
            .as_ref()
            .map(PrincipalRules::from_config)
            .transpose()
    }

    /// Reads `quiver.toml`; a section the host does not know is an error.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_sections(path, &[]).map(|(config, _)| config)
    }

    /// Reads `quiver.toml`, handing back the top-level tables named in `sections` (those a
    /// layer above the host owns, such as a node's `[serve]`) unread, for that layer to read
    /// with [`read_section`]. Any other unknown section is an error.
    pub fn load_with_sections(
        path: &Path,
        sections: &[&str],
    ) -> Result<(Self, toml::Table), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(path, "", format!("cannot read the host config: {e}")).with_source(e)
        })?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
            ConfigError::new(path, "", format!("invalid TOML: {}", e.message())).with_source(e)
        })?;
        let others = sections
            .iter()
            .filter_map(|name| table.remove(*name).map(|value| ((*name).to_owned(), value)))
            .collect();
        if let Some((field, message)) = table.get("auth").and_then(crate::mcp::misplaced_dpop) {
            return Err(ConfigError::new(path, field, message));
        }
        let config: Self = read_section(path, "", toml::Value::Table(table))?;
        config.check(path)?;
        Ok((config, others))
    }

    /// Every section's own checks, each error naming `path` and the field.
    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        EgressPolicy::from_config(&self.egress)
            .map_err(|e| ConfigError::new(path, "egress", e.to_string()).with_source(e))?;
        self.mcp
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        if let Some(launch) = &self.mcp.launch {
            LaunchRules::from_config(launch)
                .map_err(|v| ConfigError::new(path, v.field, v.message))?;
        }
        self.tasks
            .check()
            .map_err(|(field, message)| ConfigError::new(path, field, message))?;
        self.principal_rules()
            .map_err(|e| ConfigError::new(path, e.field, e.message))?;
        for (name, backend) in &self.backends {
            backend.check().map_err(|(field, message)| {
                ConfigError::new(path, format!("backends.{name}.{field}"), message)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::llm::BackendKind;

    /// `text` as a `quiver.toml`, read handing back `sections`.
    fn load_with(text: &str, sections: &[&str]) -> Result<(HostConfig, toml::Table), ConfigError> {
        let dir = std::env::temp_dir().join(format!(
            "quiver-config-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| ConfigError::new(&dir, "", e.to_string()))?;
        let file = dir.join("quiver.toml");
        std::fs::write(&file, text).map_err(|e| ConfigError::new(&file, "", e.to_string()))?;
        let loaded = HostConfig::load_with_sections(&file, sections);
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    fn load(text: &str) -> Result<HostConfig, ConfigError> {
        load_with(text, &[]).map(|(config, _)| config)
    }

    /// The TOML, field or I/O error a config error tells of is also its `source()`.
    #[test]
    fn config_errors_keep_their_cause() {
        use std::error::Error;
        let is_toml = |error: &ConfigError| {
            error
                .source()
                .is_some_and(|e| e.downcast_ref::<toml::de::Error>().is_some())
        };
        let error = load("[tasks\n").expect_err("not TOML");
        assert!(is_toml(&error), "{error:?}");
        let error = load("[tasks]\nmax_concurrent = \"two\"\n").expect_err("not a number");
        assert!(
            error.to_string().contains("tasks.max_concurrent"),
            "{error}"
        );
        assert!(is_toml(&error), "{error:?}");
        let error = HostConfig::load(Path::new("/nonexistent/quiver.toml")).expect_err("no file");
        assert!(
            error
                .source()
                .is_some_and(|e| e.downcast_ref::<std::io::Error>().is_some()),
            "{error:?}"
        );
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

    #[test]
    fn responses_and_gemini_fields_belong_to_their_kinds() {
        let config = load(
            "[backends.r]\nkind = \"openai_responses\"\nchain_responses = true\n[backends.g]\nkind = \"gemini\"\nimage_result_models = [\"gemini-3*\"]\ndefault_backend_unused = 1\n",
        );
        assert!(config.is_err(), "a typo is still refused");
        let config = load(
            "default_backend = \"g\"\n[backends.r]\nkind = \"openai_responses\"\nchain_responses = true\n[backends.g]\nkind = \"gemini\"\nimage_result_models = [\"gemini-3*\"]\n",
        )
        .expect("both kinds");
        assert_eq!(config.backends["r"].kind, BackendKind::OpenaiResponses);
        assert_eq!(config.backends["g"].kind, BackendKind::Gemini);
        for (text, field) in [
            (
                "[backends.o]\nchain_responses = true\n",
                "backends.o.chain_responses: only openai_responses",
            ),
            (
                "[backends.o]\nkind = \"anthropic\"\nimage_result_models = []\n",
                "backends.o.image_result_models: only gemini",
            ),
        ] {
            let error = load(text).expect_err(field);
            assert!(error.to_string().contains(field), "{error}");
        }
    }

    #[test]
    fn dpop_is_refused_where_it_is_not_built_naming_the_kind_that_has_it() {
        let error = load(
            "[auth.corp]\nkind = \"oauth_client_credentials\"\nclient_id = \"c\"\ndpop = true\n",
        )
        .expect_err("no DPoP for client credentials");
        let text = error.to_string();
        assert!(
            text.contains("auth.corp.dpop")
                && text.contains("oauth_authorization_code")
                && text.contains("oauth_client_credentials"),
            "{text}"
        );
        let error = load(
            "[auth.x]\nkind = \"oauth_token_exchange\"\ndpop = false\n[auth.y]\nkind = \"oauth_authorization_code\"\ndpop = true\n",
        )
        .expect_err("not even dpop = false");
        assert!(error.to_string().contains("auth.x.dpop"), "{error}");
        let config = load("[auth.y]\nkind = \"oauth_authorization_code\"\ndpop = true\n")
            .expect("DPoP for user grants");
        assert!(matches!(
            &config.auth["y"],
            AuthConfig::OauthAuthorizationCode(c) if c.dpop
        ));
    }

    #[test]
    fn sections_of_other_layers_are_handed_back_and_others_refused() {
        let error = load("[serve]\ntoken_env = \"T\"\n").expect_err("the host has no [serve]");
        assert!(
            error.to_string().contains("unknown field `serve`"),
            "{error}"
        );
        let error = load("[tasks]\nmax_concurent = 2\n").expect_err("a typo");
        assert!(
            error
                .to_string()
                .contains("tasks.max_concurent: unknown field `max_concurent`"),
            "{error}"
        );

        let loaded = load_with(
            "[serve]\ntoken_env = \"T\"\n[tasks]\nmax_concurrent = 2\n",
            &["serve", "admin"],
        );
        let (config, others) = loaded.expect("[serve] is handed back");
        assert_eq!(config.tasks.max_concurrent, Some(2));
        assert_eq!(others["serve"]["token_env"].as_str(), Some("T"));
        assert!(!others.contains_key("admin"), "absent sections stay absent");
    }
}
