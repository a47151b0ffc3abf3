//! The MCP server registry: the platform layer of policy.
//!
//! A registry is a directory of one file per server (`*.toml` or `*.json`). A server absent
//! from it cannot be used by any task, and a server's `allowed_tools` bounds every task
//! and session above it (empty means deny all). Loading is forgiving per file and strict
//! within one: a bad file is reported with its path and field and left out, every other
//! file still loads. `${ENV:VAR}` references are resolved here, once; a server whose
//! required variable is missing stays listed but unavailable, with the reason.
//!
//! Resolved values (env, headers, URLs) live only in [`Launch`], which the pool reads and
//! nothing shows: [`ServerRecord`] and [`ServerView`] keep the references as written.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::env::{EnvLookup, EnvRefError, check_refs, expand};
use crate::defaults;

/// How the host talks to a server.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Stdio,
    StreamableHttp,
    HttpSseLegacy,
}

/// How the client opens an MCP session with the server.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// The `initialize` handshake (protocol 2025-11-25 and earlier; servers speaking
    /// 2026-07-28 accept it too). One round trip; the default.
    #[default]
    Initialize,
    /// `server/discover` with protocol 2026-07-28 only, for servers that dropped
    /// `initialize`.
    Discover,
    /// Try `server/discover`, fall back to `initialize` when the server is older. Costs up
    /// to 10 s on a server that ignores unknown methods, so it is opt-in.
    Auto,
}

/// Whether a tool call needs a human or programmatic approval first.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Calls run without approval.
    #[default]
    Never,
    /// Every call needs approval. No approver exists yet, so such calls are refused with
    /// `mcp_policy_denied`.
    Always,
    /// Approval is decided by host policy; until approval hooks exist this refuses like
    /// `always` (deny by default).
    Policy,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StdioConfig {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host variables passed through unchanged: `["X"]` means `env.X = "${ENV:X}"`.
    #[serde(default)]
    pub env_from: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Name of a credential defined in host configuration (used by remote transports).
    #[serde(default)]
    pub auth_ref: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct BudgetsFile {
    tool_timeout_ms: Option<u64>,
    max_concurrency: Option<u32>,
    max_tool_output_bytes: Option<u64>,
}

/// Per-server budgets with the [`defaults`] filled in; never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    pub tool_timeout: Duration,
    pub max_concurrency: u32,
    pub max_tool_output_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    #[serde(default)]
    version: Option<u32>,
    server_id: String,
    #[serde(default)]
    display_name: Option<String>,
    transport: Transport,
    #[serde(default)]
    stdio: Option<StdioConfig>,
    #[serde(default)]
    http: Option<HttpConfig>,
    #[serde(default)]
    tool_namespace: Option<String>,
    #[serde(default)]
    allowed_tools: Vec<String>,
    #[serde(default)]
    approval_policy: ApprovalPolicy,
    #[serde(default)]
    budgets: BudgetsFile,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    lifecycle: Lifecycle,
}

/// One server as written in its file, with defaults applied and references unresolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRecord {
    pub server_id: String,
    pub display_name: String,
    pub transport: Transport,
    pub stdio: Option<StdioConfig>,
    pub http: Option<HttpConfig>,
    pub tool_namespace: String,
    pub allowed_tools: Vec<String>,
    pub approval_policy: ApprovalPolicy,
    pub budgets: Budgets,
    /// Labels profiles select servers by (e.g. `scm`, `search`).
    pub tags: Vec<String>,
    pub lifecycle: Lifecycle,
}

/// How to start or reach a server, with every reference resolved. Holds secrets: its
/// `Debug` shows names, never values.
#[derive(Clone, PartialEq, Eq)]
pub enum Launch {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Launch::Stdio { command, env, .. } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish_non_exhaustive(),
            Launch::Http { headers, .. } => f
                .debug_struct("Http")
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish_non_exhaustive(),
        }
    }
}

/// A loaded server: its record, where it came from, and how to launch it (or why not).
#[derive(Debug)]
pub struct ServerEntry {
    pub record: ServerRecord,
    pub source: PathBuf,
    pub launch: Result<Launch, String>,
}

impl ServerEntry {
    pub fn server_id(&self) -> &str {
        &self.record.server_id
    }

    /// What a guest may see of this server: no command line, env, URL or headers.
    pub fn view(&self) -> ServerView {
        let r = &self.record;
        ServerView {
            server_id: r.server_id.clone(),
            display_name: r.display_name.clone(),
            transport: r.transport,
            tool_namespace: r.tool_namespace.clone(),
            allowed_tools: r.allowed_tools.clone(),
            approval_policy: r.approval_policy,
            tags: r.tags.clone(),
            budgets: BudgetsView {
                tool_timeout_ms: r.budgets.tool_timeout.as_millis() as u64,
                max_concurrency: r.budgets.max_concurrency,
                max_tool_output_bytes: r.budgets.max_tool_output_bytes,
            },
            available: self.launch.is_ok(),
            unavailable_reason: self.launch.as_ref().err().cloned(),
        }
    }
}

/// The secret-free, guest-visible view of a server (`mcp_registry_list` / `_get`).
#[derive(Clone, Debug, Serialize)]
pub struct ServerView {
    pub server_id: String,
    pub display_name: String,
    pub transport: Transport,
    pub tool_namespace: String,
    pub allowed_tools: Vec<String>,
    pub approval_policy: ApprovalPolicy,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    pub budgets: BudgetsView,
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BudgetsView {
    pub tool_timeout_ms: u64,
    pub max_concurrency: u32,
    pub max_tool_output_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing; the registry is still as the files say.
    Warning,
    /// A file, or part of one, was left out.
    Error,
}

/// One problem found while loading, naming the file and (when known) the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub path: PathBuf,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: {}", self.path.display())?;
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The registry directory itself could not be read.
#[derive(Debug, thiserror::Error)]
#[error("MCP registry {}: {source} (pass an existing directory with --registry)", dir.display())]
pub struct RegistryDirError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// A snapshot of the registry. Cheap to share; reloading makes a new one.
#[derive(Debug, Default)]
pub struct Registry {
    servers: BTreeMap<String, Arc<ServerEntry>>,
    profiles: BTreeMap<String, Profile>,
    problems: Vec<Problem>,
    revision: String,
}

/// A named selection of servers (by id and/or tag) with tool lists, from
/// `<registry>/profiles/*.toml`. A task names one with `mcp.profile`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub server_ids: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub tool_allowlist: Option<Vec<String>>,
    #[serde(default)]
    pub tool_denylist: Vec<String>,
}

impl Profile {
    /// Its servers: those it names, and those carrying one of its tags, in registry order.
    pub fn servers(&self, registry: &Registry) -> Vec<String> {
        registry
            .servers()
            .filter(|s| {
                self.server_ids.iter().any(|id| id == s.server_id())
                    || s.record.tags.iter().any(|t| self.tags.contains(t))
            })
            .map(|s| s.server_id().to_owned())
            .collect()
    }
}

impl Registry {
    /// A registry with no servers: every MCP use is denied.
    pub fn empty() -> Self {
        Self {
            revision: revision_of(&[]),
            ..Self::default()
        }
    }

    /// Loads `dir`, resolving `${ENV:..}` from the process environment.
    pub fn load_dir(dir: impl AsRef<Path>) -> Result<Self, RegistryDirError> {
        Self::load_dir_with_env(dir, &|name: &str| std::env::var(name).ok())
    }

    /// Loads `dir`, resolving `${ENV:..}` through `env`.
    pub fn load_dir_with_env(
        dir: impl AsRef<Path>,
        env: &EnvLookup<'_>,
    ) -> Result<Self, RegistryDirError> {
        let dir = dir.as_ref();
        let io_err = |source| RegistryDirError {
            dir: dir.to_owned(),
            source,
        };
        let mut problems = Vec::new();
        let mut files = Vec::new();
        for dirent in std::fs::read_dir(dir).map_err(io_err)? {
            let dirent = dirent.map_err(io_err)?;
            let path = dirent.path();
            let name = dirent.file_name().to_string_lossy().into_owned();
            if is_ignored_name(&name) {
                continue;
            }
            let file_type = dirent.file_type().map_err(io_err)?;
            if file_type.is_symlink() {
                problems.push(Problem {
                    severity: Severity::Warning,
                    path,
                    field: None,
                    message: "symbolic link skipped: registry files must be regular files".into(),
                });
                continue;
            }
            if file_type.is_file() {
                files.push((name, path));
            }
        }
        files.sort();

        let mut hashed = Vec::new();
        let mut servers: BTreeMap<String, Arc<ServerEntry>> = BTreeMap::new();
        for (name, path) in files {
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    problems.push(file_problem(&path, None, format!("cannot read: {e}")));
                    continue;
                }
            };
            hashed.push((name, bytes.clone()));
            let entry = match parse_server_file(&path, &bytes, env) {
                Ok(entry) => entry,
                Err(problem) => {
                    problems.push(problem);
                    continue;
                }
            };
            if let Err(reason) = &entry.launch {
                problems.push(Problem {
                    severity: Severity::Warning,
                    path: path.clone(),
                    field: None,
                    message: format!("server `{}` is unavailable: {reason}", entry.server_id()),
                });
            }
            if let Some(previous) = servers.get(entry.server_id()) {
                problems.push(Problem {
                    severity: Severity::Warning,
                    path: path.clone(),
                    field: Some("server_id".into()),
                    message: format!(
                        "server `{}` is also defined in {}; this file wins (lexicographically last)",
                        entry.server_id(),
                        previous.source.display()
                    ),
                });
            }
            servers.insert(entry.server_id().to_owned(), Arc::new(entry));
        }
        let profiles = load_profiles(&dir.join("profiles"), &servers, &mut problems, &mut hashed);
        let mut launches: Vec<(String, Vec<u8>)> = servers
            .values()
            .map(|s| (s.server_id().to_owned(), launch_fingerprint(&s.launch)))
            .collect();
        hashed.append(&mut launches);
        Ok(Self {
            servers,
            profiles,
            problems,
            revision: revision_of(&hashed),
        })
    }

    pub fn get(&self, server_id: &str) -> Option<&Arc<ServerEntry>> {
        self.servers.get(server_id)
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name)
    }

    pub fn profiles(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.values()
    }

    /// A registry built in code (tests, embedders with their own source of records).
    pub fn from_entries(entries: Vec<ServerEntry>, profiles: Vec<Profile>) -> Self {
        let servers: BTreeMap<_, _> = entries
            .into_iter()
            .map(|e| (e.server_id().to_owned(), Arc::new(e)))
            .collect();
        let profiles = profiles.into_iter().map(|p| (p.name.clone(), p)).collect();
        let parts: Vec<(String, Vec<u8>)> = servers
            .values()
            .map(|s: &Arc<ServerEntry>| {
                (
                    s.server_id().to_owned(),
                    format!("{:?}", s.record).into_bytes(),
                )
            })
            .collect();
        Self {
            servers,
            profiles,
            problems: Vec::new(),
            revision: revision_of(&parts),
        }
    }

    pub fn servers(&self) -> impl Iterator<Item = &Arc<ServerEntry>> {
        self.servers.values()
    }

    /// Every problem found while loading, in file order.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Changes whenever any file's content, or any resolved reference, changes.
    pub fn revision(&self) -> &str {
        &self.revision
    }
}

/// Reads `profiles/*.toml` (same file rules as server records). A profile naming an
/// unknown server is an error and is left out; a tag no server carries is a warning.
fn load_profiles(
    dir: &Path,
    servers: &BTreeMap<String, Arc<ServerEntry>>,
    problems: &mut Vec<Problem>,
    hashed: &mut Vec<(String, Vec<u8>)>,
) -> BTreeMap<String, Profile> {
    let mut profiles = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return profiles;
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !is_ignored_name(&name) && name.ends_with(".toml")
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                problems.push(file_problem(&path, None, format!("cannot read: {e}")));
                continue;
            }
        };
        hashed.push((
            format!("profiles/{}", path.display()),
            text.clone().into_bytes(),
        ));
        let value: toml::Value = match toml::from_str(&text) {
            Ok(value) => value,
            Err(e) => {
                problems.push(file_problem(
                    &path,
                    None,
                    format!("invalid TOML: {}", e.message()),
                ));
                continue;
            }
        };
        let profile: Profile = match serde_path_to_error::deserialize(value) {
            Ok(profile) => profile,
            Err(e) => {
                let field = e.path().to_string();
                problems.push(file_problem(
                    &path,
                    (field != ".").then_some(field.as_str()),
                    e.into_inner().to_string(),
                ));
                continue;
            }
        };
        if let Some(unknown) = profile
            .server_ids
            .iter()
            .find(|id| !servers.contains_key(*id))
        {
            problems.push(file_problem(
                &path,
                Some("server_ids"),
                format!(
                    "profile `{}` names unknown server `{unknown}`",
                    profile.name
                ),
            ));
            continue;
        }
        for tag in profile
            .tags
            .iter()
            .filter(|t| !servers.values().any(|s| s.record.tags.contains(t)))
        {
            problems.push(Problem {
                severity: Severity::Warning,
                path: path.clone(),
                field: Some("tags".into()),
                message: format!("no server carries tag `{tag}`"),
            });
        }
        if let Some(previous) = profiles.insert(profile.name.clone(), profile) {
            problems.push(Problem {
                severity: Severity::Warning,
                path: path.clone(),
                field: Some("name".into()),
                message: format!(
                    "profile `{}` is defined more than once; this file wins",
                    previous.name
                ),
            });
        }
    }
    profiles
}

fn is_ignored_name(name: &str) -> bool {
    let hidden_or_temp = name.starts_with('.')
        || name.starts_with('#')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".tmp");
    hidden_or_temp || !(name.ends_with(".toml") || name.ends_with(".json"))
}

fn revision_of(parts: &[(String, Vec<u8>)]) -> String {
    let mut hasher = Sha256::new();
    for (name, bytes) in parts {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn launch_fingerprint(launch: &Result<Launch, String>) -> Vec<u8> {
    let mut hasher = Sha256::new();
    match launch {
        Ok(Launch::Stdio {
            command,
            args,
            env,
            cwd,
        }) => {
            for part in [command].into_iter().chain(args).chain(cwd) {
                hasher.update(part.as_bytes());
                hasher.update([0]);
            }
            for (k, v) in env {
                hasher.update(k.as_bytes());
                hasher.update([0]);
                hasher.update(v.as_bytes());
                hasher.update([0]);
            }
        }
        Ok(Launch::Http { url, headers }) => {
            hasher.update(url.as_bytes());
            for (k, v) in headers {
                hasher.update(k.as_bytes());
                hasher.update([0]);
                hasher.update(v.as_bytes());
            }
        }
        Err(reason) => hasher.update(reason.as_bytes()),
    }
    hasher.finalize().to_vec()
}

fn file_problem(path: &Path, field: Option<&str>, message: String) -> Problem {
    Problem {
        severity: Severity::Error,
        path: path.to_owned(),
        field: field.map(Into::into),
        message,
    }
}

/// Parses and checks one file; any problem rejects the whole file.
fn parse_server_file(
    path: &Path,
    bytes: &[u8],
    env: &EnvLookup<'_>,
) -> Result<ServerEntry, Problem> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| file_problem(path, None, format!("not UTF-8: {e}")))?;
    let value: Value = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(text)
            .map_err(|e| file_problem(path, None, format!("invalid TOML: {}", e.message())))?
    } else {
        serde_json::from_str(text)
            .map_err(|e| file_problem(path, None, format!("invalid JSON: {e}")))?
    };
    let file: ServerFile = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let field = (field != ".").then_some(field);
        file_problem(path, field.as_deref(), e.into_inner().to_string())
    })?;
    let record =
        check_record(file).map_err(|(field, message)| file_problem(path, Some(&field), message))?;
    let launch = resolve_launch(&record, env);
    Ok(ServerEntry {
        record,
        source: path.to_owned(),
        launch,
    })
}

type FieldError = (String, String);

fn field_err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    (field.into(), message.into())
}

/// A server id is 1..=64 of `[A-Za-z0-9_-]`: safe in file names, log fields and the
/// model-facing names `mcp__<id>__<tool>` / `mcp.<id>.<tool>`.
pub fn is_valid_server_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn positive<T: PartialEq + Default + Copy>(
    field: &str,
    value: Option<T>,
) -> Result<Option<T>, FieldError> {
    match value {
        Some(v) if v == T::default() => Err(field_err(
            field,
            "must be greater than 0; omit it for the default",
        )),
        other => Ok(other),
    }
}

fn check_record(file: ServerFile) -> Result<ServerRecord, FieldError> {
    if let Some(version) = file.version
        && version != 1
    {
        return Err(field_err(
            "version",
            format!("unsupported version {version}; this host reads version 1"),
        ));
    }
    if !is_valid_server_id(&file.server_id) {
        return Err(field_err(
            "server_id",
            format!(
                "{:?} is not 1 to 64 characters of letters, digits, `_` and `-`",
                file.server_id
            ),
        ));
    }
    match (file.transport, &file.stdio, &file.http) {
        (Transport::Stdio, None, _) => {
            return Err(field_err(
                "stdio",
                "transport \"stdio\" needs a [stdio] table with a command",
            ));
        }
        (Transport::Stdio, Some(_), Some(_)) => {
            return Err(field_err(
                "http",
                "an [http] table makes no sense with transport \"stdio\"",
            ));
        }
        (Transport::StreamableHttp | Transport::HttpSseLegacy, _, None) => {
            return Err(field_err(
                "http",
                "an HTTP transport needs an [http] table with a url",
            ));
        }
        (Transport::StreamableHttp | Transport::HttpSseLegacy, Some(_), Some(_)) => {
            return Err(field_err(
                "stdio",
                "a [stdio] table makes no sense with an HTTP transport",
            ));
        }
        _ => {}
    }
    if let Some(stdio) = &file.stdio {
        if stdio.command.trim().is_empty() {
            return Err(field_err("stdio.command", "must not be empty"));
        }
        check_refs(&stdio.command).map_err(|e| field_err("stdio.command", e.to_string()))?;
        for (i, arg) in stdio.args.iter().enumerate() {
            check_refs(arg).map_err(|e| field_err(format!("stdio.args[{i}]"), e.to_string()))?;
        }
        for (key, value) in &stdio.env {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(field_err(
                    format!("stdio.env.{key}"),
                    "not a valid variable name",
                ));
            }
            check_refs(value).map_err(|e| field_err(format!("stdio.env.{key}"), e.to_string()))?;
        }
        for name in &stdio.env_from {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(field_err(
                    "stdio.env_from",
                    format!("{name:?} is not a valid variable name"),
                ));
            }
            if stdio.env.contains_key(name) {
                return Err(field_err(
                    "stdio.env_from",
                    format!("`{name}` is also set in stdio.env; keep one"),
                ));
            }
        }
        if let Some(cwd) = &stdio.cwd {
            check_refs(cwd).map_err(|e| field_err("stdio.cwd", e.to_string()))?;
        }
    }
    if let Some(http) = &file.http {
        check_refs(&http.url).map_err(|e| field_err("http.url", e.to_string()))?;
        let scheme_ok = http.url.starts_with("http://")
            || http.url.starts_with("https://")
            || http.url.starts_with("${ENV:");
        if !scheme_ok {
            return Err(field_err(
                "http.url",
                format!("{:?} is not an http:// or https:// URL", http.url),
            ));
        }
        for (key, value) in &http.headers {
            check_refs(value)
                .map_err(|e| field_err(format!("http.headers.{key}"), e.to_string()))?;
        }
    }
    if let Some(i) = file.tags.iter().position(|t| !is_valid_server_id(t)) {
        return Err(field_err(
            format!("tags[{i}]"),
            "a tag is 1 to 64 characters of letters, digits, `_` and `-`",
        ));
    }
    if let Some(i) = file.allowed_tools.iter().position(|p| p.trim().is_empty()) {
        return Err(field_err(
            format!("allowed_tools[{i}]"),
            "an empty pattern matches nothing; remove it",
        ));
    }
    let tool_namespace = file
        .tool_namespace
        .unwrap_or_else(|| format!("mcp.{}", file.server_id));
    if tool_namespace.trim().is_empty() {
        return Err(field_err(
            "tool_namespace",
            "must not be empty; omit it for mcp.<server_id>",
        ));
    }
    let budgets = Budgets {
        tool_timeout: positive("budgets.tool_timeout_ms", file.budgets.tool_timeout_ms)?
            .map(Duration::from_millis)
            .unwrap_or(defaults::TOOL_TIMEOUT),
        max_concurrency: positive("budgets.max_concurrency", file.budgets.max_concurrency)?
            .unwrap_or(defaults::MAX_CONCURRENCY),
        max_tool_output_bytes: positive(
            "budgets.max_tool_output_bytes",
            file.budgets.max_tool_output_bytes,
        )?
        .unwrap_or(defaults::MAX_TOOL_OUTPUT_BYTES),
    };
    Ok(ServerRecord {
        display_name: file.display_name.unwrap_or_else(|| file.server_id.clone()),
        server_id: file.server_id,
        transport: file.transport,
        stdio: file.stdio,
        http: file.http,
        tool_namespace,
        allowed_tools: file.allowed_tools,
        approval_policy: file.approval_policy,
        budgets,
        tags: file.tags,
        lifecycle: file.lifecycle,
    })
}

fn resolve_launch(record: &ServerRecord, env: &EnvLookup<'_>) -> Result<Launch, String> {
    let missing = |field: &str, e: EnvRefError| format!("{e} (needed by {field})");
    if let Some(stdio) = &record.stdio {
        let command = expand(&stdio.command, env).map_err(|e| missing("stdio.command", e))?;
        let args = stdio
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| expand(a, env).map_err(|e| missing(&format!("stdio.args[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut resolved = BTreeMap::new();
        for (key, value) in &stdio.env {
            resolved.insert(
                key.clone(),
                expand(value, env).map_err(|e| missing(&format!("stdio.env.{key}"), e))?,
            );
        }
        for name in &stdio.env_from {
            let value = env(name).ok_or_else(|| {
                format!("environment variable `{name}` is not set (needed by stdio.env_from)")
            })?;
            resolved.insert(name.clone(), value);
        }
        let cwd = stdio
            .cwd
            .as_deref()
            .map(|c| expand(c, env))
            .transpose()
            .map_err(|e| missing("stdio.cwd", e))?;
        return Ok(Launch::Stdio {
            command,
            args,
            env: resolved,
            cwd,
        });
    }
    let http = record
        .http
        .as_ref()
        .ok_or_else(|| "no transport configuration".to_owned())?;
    let url = expand(&http.url, env).map_err(|e| missing("http.url", e))?;
    let mut headers = BTreeMap::new();
    for (key, value) in &http.headers {
        headers.insert(
            key.clone(),
            expand(value, env).map_err(|e| missing(&format!("http.headers.{key}"), e))?,
        );
    }
    Ok(Launch::Http { url, headers })
}
