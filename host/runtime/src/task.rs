//! The task spec (`task.json`): what one guest run is given.
//!
//! A task names its id, a free-form `config` map (string values as in a scheduler's
//! `Task.config`; native JSON values are accepted too), the guest's args and granted env,
//! optional preopened directories and its limits. Everything not granted here is denied: no
//! host env, no filesystem, no stdin. The `mcp.*` config keys are parsed into the task layer
//! of the MCP policy before the guest starts, so a malformed value fails the task with the
//! key's name instead of surprising the guest later.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::defaults;
use crate::identity::check_principal;
use crate::policy::{ListKey, Narrowing, Pattern, TaskMcpConfig};
use crate::sandbox::{Grants, GuestLogs, Preopen};

/// A task file or task config that cannot be used, with the place and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{path}: cannot read the task file: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not JSON, or not a task's shape; `field` is where it did not fit.
    #[error("{}: {}{source}", path.display(), field.as_deref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Parse {
        path: PathBuf,
        field: Option<String>,
        #[source]
        source: serde_json::Error,
    },
    /// A task file whose content a check refused.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        /// The check's own [`TaskError`] (boxed as a trait object so `source()` downcasts
        /// to it).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `source` is the JSON error of a value that should have held JSON.
    #[error("task config key `{key}`: {message}")]
    Config {
        key: String,
        message: String,
        #[source]
        source: Option<serde_json::Error>,
    },
    #[error("task field `{field}`: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
}

/// A root the task declares to the MCP servers it uses (MCP `roots/list`): information
/// for the server about where the task works. It grants nothing: the guest's files are
/// its `preopens`, and a server reaches what its own process or endpoint can.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TaskRoot {
    /// A `file://` URI, at most [`defaults::MAX_ROOT_URI_BYTES`] bytes.
    pub uri: String,
    /// A name for people, at most [`defaults::MAX_ROOT_NAME_BYTES`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl TaskRoot {
    /// Why this root may not be declared, if it may not.
    fn check(&self) -> Result<(), String> {
        let uri = &self.uri;
        if !uri.starts_with("file:///") && !uri.starts_with("file://localhost/") {
            return Err(format!(
                "`{}` is not a file:// URI of an absolute path (e.g. file:///home/me/project); roots are file URIs",
                crate::text::printable(crate::text::cut(uri, 64))
            ));
        }
        if uri.len() > defaults::MAX_ROOT_URI_BYTES {
            return Err(format!(
                "the URI is {} bytes; at most {} are allowed",
                uri.len(),
                defaults::MAX_ROOT_URI_BYTES
            ));
        }
        if uri.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(
                "the URI must not hold whitespace or control characters; percent-encode them"
                    .into(),
            );
        }
        if let Some(name) = &self.name {
            if name.len() > defaults::MAX_ROOT_NAME_BYTES {
                return Err(format!(
                    "the name is {} bytes; at most {} are allowed",
                    name.len(),
                    defaults::MAX_ROOT_NAME_BYTES
                ));
            }
            if name.chars().any(char::is_control) {
                return Err("the name must not hold control characters".into());
            }
        }
        Ok(())
    }
}

/// Per-task limits; absent fields take the [`defaults`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock deadline for the whole run, guest code and waiting hostcalls alike.
    pub deadline_ms: Option<u64>,
    /// Largest linear memory the guest may grow to.
    pub memory_bytes: Option<u64>,
    /// Open fds the guest may hold at once.
    pub max_fds: Option<usize>,
    /// Host memory the guest may make the host hold for it (chat sessions, kept outputs,
    /// responses, captured output); past it hostcalls fail with `-ENOMEM`. May only lower
    /// the host's own limit.
    pub host_memory_bytes: Option<u64>,
}

/// What one guest run is given. See the crate README for a complete `task.json`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub task_id: String,
    #[serde(default)]
    pub config: BTreeMap<String, Value>,
    /// Guest arguments after argv[0].
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables the guest sees; the host's own are never passed through.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub preopens: Vec<Preopen>,
    /// The roots the task declares to its MCP servers (`roots/list`); none by default.
    /// At most [`defaults::MAX_TASK_ROOTS`]. Information only: they widen nothing.
    #[serde(default)]
    pub roots: Vec<TaskRoot>,
    #[serde(default)]
    pub limits: Limits,
    /// Export to call instead of `_start`.
    #[serde(default)]
    pub entry: Option<String>,
    /// Lets the guest read the host's stdin.
    #[serde(default)]
    pub inherit_stdin: bool,
    /// Keeps guest stdout/stderr in the outcome instead of passing them through.
    #[serde(skip)]
    pub capture_output: bool,
    /// Where the guest's `log` lines go.
    #[serde(skip)]
    pub guest_logs: GuestLogs,
    /// Who the task acts for (a node sets its authenticated client's name, or the end
    /// user that client names where `[clients.NAME] act_for` allows it); written into
    /// every tool-call and denial event and approval request of the task, and bound by
    /// the host config's `[principals]`. Never read from task.json, and out of the guest's
    /// reach. Checked by [`check_principal`].
    #[serde(skip)]
    pub principal: Option<String>,
    /// The client that submitted the task for its principal (a node's `[clients.NAME]`),
    /// in the same events beside the principal; `None` outside a node.
    #[serde(skip)]
    pub client: Option<String>,
    /// A token from the platform that submitted the task (an OIDC ID token or an access
    /// token), exchanged for servers whose credential is `oauth_token_exchange`. A secret:
    /// never read from task.json, never serialised, shown or given to the guest.
    #[serde(skip)]
    pub subject_token: Option<crate::identity::SubjectToken>,
    /// The caller's W3C trace context: the task's span continues that trace (a node takes
    /// it from the `traceparent`/`tracestate` headers of `POST /v1/tasks`). Only used when
    /// a [`Propagator`](crate::telemetry::Propagator) is installed. Never read from
    /// task.json.
    #[serde(skip)]
    pub trace_parent: Option<crate::TraceContext>,
    /// The task's user streams (`user_stream_*`), which the embedder attaches a client to
    /// with [`UserStreams::attach`](crate::UserStreams::attach) while the task runs.
    /// Without them the guest's `user_stream_open` is `-ENOTCONN`. Never read from
    /// task.json.
    #[serde(skip)]
    pub user_streams: Option<crate::UserStreams>,
}

/// The `mcp.*` keys besides the lists ([`ListKey`]).
const MCP_KEYS: [&str; 5] = [
    "mcp.enabled",
    "mcp.profile",
    "mcp.default_server_ids",
    "mcp.allowed_server_ids",
    SAMPLING_MAX_TOKENS_KEY,
];

/// The task key lowering the tokens its servers' sampling may use.
const SAMPLING_MAX_TOKENS_KEY: &str = "mcp.sampling_max_tokens";

impl TaskSpec {
    /// A task with nothing granted.
    pub fn new(task_id: impl Into<String>) -> Self {
        Self {
            task_id: task_id.into(),
            config: BTreeMap::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            preopens: Vec::new(),
            roots: Vec::new(),
            limits: Limits::default(),
            entry: None,
            inherit_stdin: false,
            capture_output: false,
            guest_logs: GuestLogs::Stderr,
            principal: None,
            client: None,
            subject_token: None,
            trace_parent: None,
            user_streams: None,
        }
    }

    /// Reads and checks a `task.json`; relative preopen paths become relative to its folder.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TaskError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TaskError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut spec = Self::from_json(&text).map_err(|e| match e {
            TaskError::Parse { field, source, .. } => TaskError::Parse {
                path: path.to_owned(),
                field,
                source,
            },
            other => TaskError::InFile {
                path: path.to_owned(),
                source: Box::new(other),
            },
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for preopen in &mut spec.preopens {
            if preopen.host.is_relative() {
                preopen.host = base.join(&preopen.host);
            }
        }
        Ok(spec)
    }

    /// Parses and checks task JSON.
    pub fn from_json(text: &str) -> Result<Self, TaskError> {
        crate::json::refuse_raw_value_key(text.as_bytes()).map_err(|e| TaskError::Parse {
            path: PathBuf::from("<task json>"),
            field: None,
            source: e,
        })?;
        let de = &mut serde_json::Deserializer::from_str(text);
        let spec: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            TaskError::Parse {
                path: PathBuf::from("<task json>"),
                field: (at != ".").then_some(at),
                source: e.into_inner(),
            }
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks a task built from JSON by other means (the node's API) as [`TaskSpec::from_json`] does.
    pub fn validate(&self) -> Result<(), TaskError> {
        if self.task_id.trim().is_empty() {
            return Err(TaskError::Field {
                field: "task_id",
                message: "must not be empty".into(),
            });
        }
        // It is in every log and audit line of the task.
        if self.task_id.len() > defaults::MAX_TASK_ID_BYTES {
            return Err(TaskError::Field {
                field: "task_id",
                message: format!(
                    "is {} bytes; at most {} are allowed",
                    self.task_id.len(),
                    defaults::MAX_TASK_ID_BYTES
                ),
            });
        }
        if self.task_id.chars().any(char::is_control) {
            return Err(TaskError::Field {
                field: "task_id",
                message: "must not hold control characters (newlines, tabs, escapes)".into(),
            });
        }
        if self.limits.deadline_ms == Some(0) {
            return Err(TaskError::Field {
                field: "limits.deadline_ms",
                message: "must be greater than 0; omit it for the default".into(),
            });
        }
        if self.limits.max_fds == Some(0) {
            return Err(TaskError::Field {
                field: "limits.max_fds",
                message: "must be greater than 0; omit it for the default".into(),
            });
        }
        if self.limits.host_memory_bytes == Some(0) {
            return Err(TaskError::Field {
                field: "limits.host_memory_bytes",
                message: "must be greater than 0; omit it for the host's default".into(),
            });
        }
        for (field, name) in [("principal", &self.principal), ("client", &self.client)] {
            if let Some(name) = name {
                check_principal(name).map_err(|message| TaskError::Field { field, message })?;
            }
        }
        if self.roots.len() > defaults::MAX_TASK_ROOTS {
            return Err(TaskError::Field {
                field: "roots",
                message: format!(
                    "declares {} roots; at most {} are allowed",
                    self.roots.len(),
                    defaults::MAX_TASK_ROOTS
                ),
            });
        }
        for root in &self.roots {
            root.check().map_err(|message| TaskError::Field {
                field: "roots",
                message,
            })?;
        }
        self.mcp_config()?;
        Ok(())
    }

    #[must_use]
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    #[must_use]
    pub fn with_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Declares `root` to the task's MCP servers (checked by [`validate`](Self::validate)).
    #[must_use]
    pub fn with_root(mut self, uri: impl Into<String>, name: Option<&str>) -> Self {
        self.roots.push(TaskRoot {
            uri: uri.into(),
            name: name.map(str::to_owned),
        });
        self
    }

    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.limits.deadline_ms = Some(deadline.as_millis().max(1) as u64);
        self
    }

    #[must_use]
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.limits.memory_bytes = Some(bytes);
        self
    }

    #[must_use]
    pub fn with_max_fds(mut self, max_fds: usize) -> Self {
        self.limits.max_fds = Some(max_fds);
        self
    }

    /// Lowers the host memory budget of the task (`limits.host_memory_bytes`).
    #[must_use]
    pub fn with_host_memory_limit(mut self, bytes: u64) -> Self {
        self.limits.host_memory_bytes = Some(bytes);
        self
    }

    #[must_use]
    pub fn with_entry(mut self, export: impl Into<String>) -> Self {
        self.entry = Some(export.into());
        self
    }

    /// Keep guest stdout/stderr in the [`TaskOutcome`](crate::TaskOutcome).
    #[must_use]
    pub fn with_captured_output(mut self) -> Self {
        self.capture_output = true;
        self
    }

    /// Sends the guest's `log` lines to `logs` instead of its stderr.
    #[must_use]
    pub fn with_guest_logs(mut self, logs: GuestLogs) -> Self {
        self.guest_logs = logs;
        self
    }

    pub fn deadline(&self) -> Duration {
        self.limits
            .deadline_ms
            .map(Duration::from_millis)
            .unwrap_or(defaults::TASK_DEADLINE)
    }

    pub fn memory_limit(&self) -> u64 {
        self.limits
            .memory_bytes
            .unwrap_or(defaults::TASK_MEMORY_BYTES)
    }

    pub fn max_fds(&self) -> usize {
        self.limits.max_fds.unwrap_or(defaults::MAX_FDS_PER_TASK)
    }

    /// What the task's sandbox grants its guest.
    pub(crate) fn grants(&self) -> Grants<'_> {
        Grants {
            args: &self.args,
            env: &self.env,
            preopens: &self.preopens,
            inherit_stdin: self.inherit_stdin,
            capture_output: self.capture_output,
            guest_logs: self.guest_logs,
            max_fds: self.max_fds(),
            deadline: self.deadline(),
        }
    }

    /// The task's host memory budget, given the host's: the task's own limit can only
    /// lower it.
    pub fn host_memory_limit(&self, host_limit: u64) -> u64 {
        self.limits
            .host_memory_bytes
            .map_or(host_limit, |limit| limit.min(host_limit))
    }

    /// The task layer of the MCP policy as written (`mcp.*` keys); profiles are applied
    /// against the registry by [`TaskMcpConfig::resolve`].
    pub fn mcp_config(&self) -> Result<TaskMcpConfig, TaskError> {
        for key in self.config.keys().filter(|k| k.starts_with("mcp.")) {
            if !MCP_KEYS.contains(&key.as_str()) && ListKey::parse(key).is_none() {
                let known: Vec<&str> = MCP_KEYS
                    .into_iter()
                    .chain(ListKey::ALL.map(ListKey::name))
                    .collect();
                return Err(TaskError::Config {
                    key: key.clone(),
                    message: format!("unknown MCP key; known keys are {}", known.join(", ")),
                    source: None,
                });
            }
        }
        let enabled = match self.config.get("mcp.enabled") {
            Some(value) => parse_bool("mcp.enabled", value)?,
            None => false,
        };
        let profile = match self.config.get("mcp.profile") {
            None => None,
            Some(Value::String(name)) if !name.trim().is_empty() => Some(name.trim().to_owned()),
            Some(other) => {
                return Err(config_error(
                    "mcp.profile",
                    format!("expected a profile name, got {}", shown(other.to_string())),
                ));
            }
        };
        let default_server_ids = self.list("mcp.default_server_ids")?;
        let allowed_server_ids = self.list("mcp.allowed_server_ids")?;
        if let (Some(defaults), Some(allowed)) = (&default_server_ids, &allowed_server_ids)
            && let Some(outside) = defaults.iter().find(|id| !allowed.contains(id))
        {
            return Err(TaskError::Config {
                key: "mcp.default_server_ids".into(),
                message: format!(
                    "`{outside}` is not in mcp.allowed_server_ids; defaults must be a subset of the allowed servers"
                ),
                source: None,
            });
        }
        let mut narrowing = Narrowing::default();
        for key in ListKey::ALL {
            if let Some(patterns) = self.patterns(key.name())? {
                narrowing.set(key, patterns);
            }
        }
        Ok(TaskMcpConfig {
            enabled,
            profile,
            default_server_ids,
            allowed_server_ids,
            narrowing,
        })
    }

    /// Tokens the task's servers may use through sampling: the host's
    /// [`defaults::SAMPLING_TASK_MAX_TOKENS`], lowered by `mcp.sampling_max_tokens` (0
    /// refuses every sampling request; a larger value changes nothing, since a task can
    /// only narrow what the operator allows).
    pub fn sampling_max_tokens(&self) -> Result<u64, TaskError> {
        let Some(value) = self.config.get(SAMPLING_MAX_TOKENS_KEY) else {
            return Ok(defaults::SAMPLING_TASK_MAX_TOKENS);
        };
        let tokens = match value {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| {
            config_error(
                SAMPLING_MAX_TOKENS_KEY,
                format!(
                    "expected a number of tokens (0 or more), got {}",
                    shown(value.to_string())
                ),
            )
        })?;
        Ok(tokens.min(defaults::SAMPLING_TASK_MAX_TOKENS))
    }

    /// A list of patterns: at most [`defaults::MAX_TASK_PATTERNS`] of at most
    /// [`defaults::MAX_PATTERN_BYTES`], since every listing matches each against every name.
    fn patterns(&self, key: &str) -> Result<Option<Vec<Pattern>>, TaskError> {
        let Some(items) = self.list(key)? else {
            return Ok(None);
        };
        if items.len() > defaults::MAX_TASK_PATTERNS {
            return Err(config_error(
                key,
                format!(
                    "has {} patterns; at most {} are allowed",
                    items.len(),
                    defaults::MAX_TASK_PATTERNS
                ),
            ));
        }
        if let Some(long) = items.iter().find(|p| p.len() > defaults::MAX_PATTERN_BYTES) {
            return Err(config_error(
                key,
                format!(
                    "a pattern is {} bytes; at most {} are allowed",
                    long.len(),
                    defaults::MAX_PATTERN_BYTES
                ),
            ));
        }
        Ok(Some(items.into_iter().map(Pattern::new).collect()))
    }

    fn list(&self, key: &str) -> Result<Option<Vec<String>>, TaskError> {
        self.config
            .get(key)
            .map(|value| parse_list(key, value))
            .transpose()
    }
}

fn config_error(key: &str, message: String) -> TaskError {
    TaskError::Config {
        key: key.to_owned(),
        message,
        source: None,
    }
}

/// `true`/`false`/`1`/`0`/`yes`/`no` as a string, or a JSON boolean.
fn parse_bool(key: &str, value: &Value) -> Result<bool, TaskError> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(config_error(
                key,
                format!("expected true/false/1/0/yes/no, got {}", shown(s.clone())),
            )),
        },
        other => Err(config_error(
            key,
            format!("expected a boolean, got {}", shown(other.to_string())),
        )),
    }
}

/// A JSON array of strings, as a native array or as a string holding one; or a
/// comma-separated string. Empty items are refused rather than silently dropped.
fn parse_list(key: &str, value: &Value) -> Result<Vec<String>, TaskError> {
    let from_array = |items: &[Value]| -> Result<Vec<String>, TaskError> {
        items
            .iter()
            .map(|item| match item {
                Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                other => Err(config_error(
                    key,
                    format!(
                        "expected a list of non-empty strings, found item {}",
                        shown(other.to_string())
                    ),
                )),
            })
            .collect()
    };
    match value {
        Value::Array(items) => from_array(items),
        Value::String(s) if s.trim_start().starts_with('[') => {
            let parsed: Value = crate::json::from_str(s).map_err(|e| TaskError::Config {
                key: key.to_owned(),
                message: format!("not a valid JSON array string ({e}): {}", shown(s.clone())),
                source: Some(e),
            })?;
            match parsed {
                Value::Array(items) => from_array(&items),
                _ => Err(config_error(
                    key,
                    format!("expected a JSON array, got {}", shown(s.clone())),
                )),
            }
        }
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::String(s) => s
            .split(',')
            .map(|item| {
                let item = item.trim();
                if item.is_empty() {
                    Err(config_error(
                        key,
                        format!("empty item in comma-separated list {}", shown(s.clone())),
                    ))
                } else {
                    Ok(item.to_owned())
                }
            })
            .collect(),
        other => Err(config_error(
            key,
            format!(
                "expected a JSON array or a comma-separated string, got {}",
                shown(other.to_string())
            ),
        )),
    }
}

/// At most this much of a config value goes into an error (a value may be megabytes).
const SHOWN_BYTES: usize = 80;

/// The start of `text`, quoted, for an error message.
fn shown(text: String) -> String {
    if text.len() <= SHOWN_BYTES {
        return format!("{text:?}");
    }
    let start = crate::text::cut(&text, SHOWN_BYTES);
    format!("{start:?}… ({} bytes)", text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    #[test]
    fn seed_example_config_parses() {
        let spec = TaskSpec::from_json(
            r#"{"task_id":"t","config":{
                "mcp.enabled":"true",
                "mcp.default_server_ids":"[\"gitlab\",\"fs\"]",
                "mcp.allowed_server_ids":"gitlab, fs, duckduckgo-search",
                "mcp.tool_allowlist":["*"],
                "mcp.tool_denylist":"[\"delete_*\"]"}}"#,
        )
        .unwrap();
        let policy = spec
            .mcp_config()
            .unwrap()
            .resolve(&Registry::empty())
            .unwrap();
        assert!(policy.enabled);
        assert_eq!(policy.default_server_ids, ["gitlab", "fs"]);
        assert_eq!(
            policy.allowed_server_ids,
            ["gitlab", "fs", "duckduckgo-search"]
        );
        assert_eq!(policy.narrowing.tools.deny, [Pattern::new("delete_*")]);
    }

    #[test]
    fn allowed_defaults_to_default_and_mcp_is_off_by_default() {
        let spec = TaskSpec::new("t").with_config("mcp.default_server_ids", json!(["fs"]));
        let policy = spec
            .mcp_config()
            .unwrap()
            .resolve(&Registry::empty())
            .unwrap();
        assert!(!policy.enabled);
        assert_eq!(policy.allowed_server_ids, ["fs"]);
        assert_eq!(policy.narrowing, Narrowing::default());
    }

    #[test]
    fn malformed_values_name_the_key() {
        for (key, value) in [
            ("mcp.enabled", json!("maybe")),
            ("mcp.default_server_ids", json!("[\"fs\"")),
            ("mcp.tool_allowlist", json!(42)),
            ("mcp.tool_denylist", json!("a,,b")),
            ("mcp.server_ids", json!("fs")),
        ] {
            let err = TaskSpec::new("t")
                .with_config(key, value)
                .mcp_config()
                .unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn resource_and_prompt_lists_parse_like_tool_lists() {
        let spec = TaskSpec::from_json(
            r#"{"task_id":"t","config":{
                "mcp.resource_allowlist":"demo://static/*, demo://dynamic/*",
                "mcp.resource_denylist":["*/secret*"],
                "mcp.prompt_allowlist":"[]",
                "mcp.prompt_denylist":"[\"complex-*\"]"}}"#,
        )
        .unwrap();
        let narrowing = spec.mcp_config().unwrap().narrowing;
        let patterns = |l: &[&str]| l.iter().map(|p| Pattern::new(*p)).collect::<Vec<_>>();
        assert_eq!(
            narrowing.resources.allow,
            Some(patterns(&["demo://static/*", "demo://dynamic/*"]))
        );
        assert_eq!(narrowing.resources.deny, patterns(&["*/secret*"]));
        assert_eq!(narrowing.prompts.allow, Some(vec![]), "[] allows nothing");
        assert_eq!(narrowing.prompts.deny, patterns(&["complex-*"]));
        assert_eq!(narrowing.tools, Default::default());
    }

    #[test]
    fn hostile_lists_are_refused_with_a_short_message_naming_the_key() {
        let huge = "x".repeat(1 << 20);
        let too_many = vec!["p"; defaults::MAX_TASK_PATTERNS + 1];
        for (key, value) in [
            ("mcp.resource_allowlist", json!({ "a": huge })),
            ("mcp.resource_denylist", json!(42)),
            ("mcp.prompt_allowlist", json!(too_many)),
            ("mcp.prompt_denylist", json!([huge])),
            ("mcp.resource_denylist", json!(format!("[\"{huge}"))),
            ("mcp.prompt_allowlist", json!(huge.replace('x', ","))),
        ] {
            let err = TaskSpec::new("t")
                .with_config(key, value)
                .mcp_config()
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
            assert!(err.len() < 400, "{key}: {} bytes", err.len());
        }
        let err = TaskSpec::new("t")
            .with_config("mcp.resource_list", json!([]))
            .mcp_config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("mcp.resource_allowlist"), "{err}");
    }

    #[test]
    fn defaults_outside_allowed_are_refused() {
        let err = TaskSpec::new("t")
            .with_config("mcp.default_server_ids", json!(["fs", "git"]))
            .with_config("mcp.allowed_server_ids", json!(["fs"]))
            .mcp_config()
            .unwrap_err();
        assert!(err.to_string().contains("`git`"), "{err}");
    }

    #[test]
    fn unknown_fields_and_bad_limits_are_refused_with_their_path() {
        let err = TaskSpec::from_json(r#"{"task_id":"t","limits":{"deadline":5}}"#).unwrap_err();
        assert!(err.to_string().contains("limits"), "{err}");
        assert!(err.to_string().contains("deadline"), "{err}");
        let err = TaskSpec::from_json(r#"{"task_id":"t","limits":{"deadline_ms":0}}"#).unwrap_err();
        assert!(err.to_string().contains("limits.deadline_ms"), "{err}");
        let err =
            TaskSpec::from_json(r#"{"task_id":"t","limits":{"host_memory_bytes":0}}"#).unwrap_err();
        assert!(
            err.to_string().contains("limits.host_memory_bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_task_can_only_lower_the_hosts_memory_budget() {
        let spec =
            TaskSpec::from_json(r#"{"task_id":"t","limits":{"host_memory_bytes":1000}}"#).unwrap();
        assert_eq!(spec.host_memory_limit(5000), 1000);
        assert_eq!(spec.host_memory_limit(500), 500);
        assert_eq!(TaskSpec::new("t").host_memory_limit(5000), 5000);
    }

    #[test]
    fn a_long_task_id_or_one_with_control_characters_is_refused() {
        let json = |id: &str| json!({ "task_id": id }).to_string();
        let longest = "t".repeat(defaults::MAX_TASK_ID_BYTES);
        assert!(TaskSpec::from_json(&json(&longest)).is_ok());
        for bad in [format!("{longest}t"), "a\nb".into(), "a\u{1b}[31mb".into()] {
            let err = TaskSpec::from_json(&json(&bad)).unwrap_err();
            assert!(err.to_string().contains("task_id"), "{err}");
        }
    }

    #[test]
    fn roots_are_file_uris_bounded_in_count_and_length() {
        let spec = TaskSpec::from_json(
            r#"{"task_id":"t","roots":[{"uri":"file:///srv/project","name":"project"}]}"#,
        )
        .unwrap();
        assert_eq!(spec.roots[0].uri, "file:///srv/project");
        assert!(TaskSpec::new("t").roots.is_empty(), "none by default");
        let long = format!("file:///{}", "a".repeat(defaults::MAX_ROOT_URI_BYTES));
        let many: Vec<String> = (0..=defaults::MAX_TASK_ROOTS)
            .map(|i| format!(r#"{{"uri":"file:///r{i}"}}"#))
            .collect();
        for (roots, says) in [
            (r#"[{"uri":"https://example.com/x"}]"#.to_owned(), "file://"),
            (r#"[{"uri":"file://relative"}]"#.to_owned(), "file://"),
            (r#"[{"uri":"file:///a b"}]"#.to_owned(), "whitespace"),
            (r#"[{"uri":"file:///a\u0007"}]"#.to_owned(), "control"),
            (format!(r#"[{{"uri":"{long}"}}]"#), "at most 1024"),
            (format!("[{}]", many.join(",")), "at most 16"),
            (
                r#"[{"uri":"file:///a","name":"x\ny"}]"#.to_owned(),
                "control",
            ),
        ] {
            let err = TaskSpec::from_json(&format!(r#"{{"task_id":"t","roots":{roots}}}"#))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("roots") && err.contains(says),
                "{roots}: {err}"
            );
        }
        assert!(
            TaskSpec::from_json(r#"{"task_id":"t","roots":[{"uri":"file:///a","x":1}]}"#).is_err(),
            "unknown fields"
        );
    }
}
