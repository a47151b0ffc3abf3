//! One registry file: parsed with serde (unknown fields refused), then checked field by
//! field, so that every problem names the file and the field to fix.

use std::path::Path;
use std::time::Duration;

use rmcp::model::ProtocolVersion;
use serde::Deserialize;
use serde_json::Value;

use super::env::{EnvLookup, check_refs};
use super::launch::{Launch, resolve_launch};
use super::load::{Problem, file_problem};
use super::record::{
    ApprovalPolicy, Budgets, HttpConfig, Lifecycle, SamplingConfig, ServerEntry, ServerRecord,
    StdioConfig, Transport, is_valid_server_id,
};
use super::rules::{RecordRules, RuleViolation};
use super::store::DocFormat;
use crate::defaults;

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct BudgetsFile {
    tool_timeout_ms: Option<u64>,
    max_concurrency: Option<u32>,
    max_tool_output_bytes: Option<u64>,
    max_tool_list_bytes: Option<u64>,
    connect_timeout_ms: Option<u64>,
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
    allowed_resources: Vec<String>,
    #[serde(default)]
    allowed_prompts: Vec<String>,
    #[serde(default)]
    approval_policy: ApprovalPolicy,
    #[serde(default)]
    approval_tools: Vec<String>,
    #[serde(default)]
    approval_timeout_ms: Option<u64>,
    #[serde(default)]
    budgets: BudgetsFile,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    lifecycle: Lifecycle,
    #[serde(default)]
    protocol_version: Option<String>,
    #[serde(default)]
    audit_arguments: bool,
    #[serde(default)]
    pins: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pin_required: bool,
    #[serde(default)]
    sampling: SamplingConfig,
}

/// Parses and checks one file, then holds it to the operator's `rules` (before any
/// reference is resolved, and again on what they resolved to); any problem rejects the
/// whole file.
pub(super) fn parse_server_file(
    path: &Path,
    format: DocFormat,
    bytes: &[u8],
    env: &EnvLookup<'_>,
    rules: &dyn RecordRules,
) -> Result<ServerEntry, Problem> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| file_problem(path, None, format!("not UTF-8: {e}")))?;
    let value: Value = match format {
        DocFormat::Toml => crate::json::from_toml(text)
            .map_err(|e| file_problem(path, None, format!("invalid TOML: {e}")))?,
        DocFormat::Json => crate::json::from_str(text)
            .map_err(|e| file_problem(path, None, format!("invalid JSON: {e}")))?,
    };
    let file: ServerFile = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let field = (field != ".").then_some(field);
        file_problem(path, field.as_deref(), e.into_inner().to_string())
    })?;
    let record =
        check_record(file).map_err(|(field, message)| file_problem(path, Some(&field), message))?;
    let refused = |v: RuleViolation| {
        let message = format!("server `{}` is refused: {}", record.server_id, v.message);
        file_problem(path, Some(&v.field), message)
    };
    rules.check_record(&record).map_err(refused)?;
    let launch = resolve_launch(&record, env);
    if let Ok(resolved) = &launch {
        let checked = match resolved {
            Launch::Stdio {
                command, cwd, vars, ..
            } => rules.check_launch(command, cwd.as_deref(), vars),
            Launch::Http { url, .. } => rules.check_remote(&record, url),
        };
        // A resolved command or URL may hold a value of the environment.
        checked.map_err(|v| {
            refused(RuleViolation {
                message: resolved.secrets().redact(&v.message).into_owned(),
                ..v
            })
        })?;
    }
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

/// A tool namespace is dot-separated parts of `[A-Za-z0-9_-]`, at most 48 bytes, so that
/// `<namespace>__<tool>` (dots become `__`) leaves room for a tool name within OpenAI's 64.
fn is_valid_namespace(namespace: &str) -> bool {
    namespace.len() <= 48
        && namespace.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// `protocol_version`: one of the versions rmcp knows that still has an `initialize`
/// handshake, since that is the only handshake it applies to; `discover` has none.
fn check_protocol_version(
    version: &str,
    lifecycle: Lifecycle,
) -> Result<ProtocolVersion, FieldError> {
    let with_initialize = || {
        ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .filter(|v| v.has_initialize())
            .map(|v| format!("\"{v}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let known = ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|v| v.as_str() == version)
        .ok_or_else(|| {
            field_err(
                "protocol_version",
                format!(
                    "{version:?} is not a protocol version this host knows; use one of {}",
                    with_initialize()
                ),
            )
        })?;
    if !known.has_initialize() {
        return Err(field_err(
            "protocol_version",
            format!(
                "{version:?} has no initialize handshake, and protocol_version only sets the version `initialize` asks for; remove it and use lifecycle = \"discover\" or \"auto\", or use one of {}",
                with_initialize()
            ),
        ));
    }
    if lifecycle == Lifecycle::Discover {
        return Err(field_err(
            "protocol_version",
            "applies to the initialize handshake, which lifecycle = \"discover\" never sends; remove it, or use lifecycle = \"initialize\" for a server that only speaks an older version",
        ));
    }
    Ok(known.clone())
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
    if let Some(i) = file
        .allowed_resources
        .iter()
        .position(|p| p.trim().is_empty())
    {
        return Err(field_err(
            format!("allowed_resources[{i}]"),
            "an empty pattern matches nothing; remove it",
        ));
    }
    if let Some(i) = file
        .allowed_prompts
        .iter()
        .position(|p| p.trim().is_empty())
    {
        return Err(field_err(
            format!("allowed_prompts[{i}]"),
            "an empty pattern matches nothing; remove it",
        ));
    }
    if !file.approval_tools.is_empty() && file.approval_policy != ApprovalPolicy::Policy {
        return Err(field_err(
            "approval_tools",
            "applies only with approval_policy = \"policy\"; set that or remove approval_tools",
        ));
    }
    if let Some(i) = file.approval_tools.iter().position(|p| p.trim().is_empty()) {
        return Err(field_err(
            format!("approval_tools[{i}]"),
            "an empty pattern matches nothing; remove it",
        ));
    }
    let approval_timeout =
        positive("approval_timeout_ms", file.approval_timeout_ms)?.map(Duration::from_millis);
    let tool_namespace = file
        .tool_namespace
        .unwrap_or_else(|| format!("mcp.{}", file.server_id));
    if !is_valid_namespace(&tool_namespace) {
        return Err(field_err(
            "tool_namespace",
            format!(
                "{tool_namespace:?} is not 1 to 48 characters of dot-separated parts made of letters, digits, `_` and `-` (e.g. \"github\" or \"acme.gh\"); omit it for mcp.<server_id>"
            ),
        ));
    }
    let own_default = format!("mcp.{}", file.server_id);
    if tool_namespace != own_default && tool_namespace.replace('.', "__").starts_with("mcp") {
        return Err(field_err(
            "tool_namespace",
            format!(
                "{tool_namespace:?}: names starting with `mcp` are reserved for the default mcp.<server_id> of each server, so that mcp__<id>__<tool> always means that server's tool; choose another namespace"
            ),
        ));
    }
    let protocol_version = file
        .protocol_version
        .as_deref()
        .map(|v| check_protocol_version(v, file.lifecycle))
        .transpose()?;
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
        max_tool_list_bytes: positive(
            "budgets.max_tool_list_bytes",
            file.budgets.max_tool_list_bytes,
        )?
        .unwrap_or(defaults::MAX_TOOL_LIST_BYTES),
        connect_timeout: positive(
            "budgets.connect_timeout_ms",
            file.budgets.connect_timeout_ms,
        )?
        .map(Duration::from_millis),
    };
    check_pins(&file.pins)?;
    check_sampling(&file.sampling)?;
    Ok(ServerRecord {
        display_name: file.display_name.unwrap_or_else(|| file.server_id.clone()),
        server_id: file.server_id,
        transport: file.transport,
        stdio: file.stdio,
        http: file.http,
        tool_namespace,
        allowed_tools: file.allowed_tools,
        allowed_resources: file.allowed_resources,
        allowed_prompts: file.allowed_prompts,
        approval_policy: file.approval_policy,
        approval_tools: file.approval_tools,
        approval_timeout,
        budgets,
        tags: file.tags,
        lifecycle: file.lifecycle,
        protocol_version,
        audit_arguments: file.audit_arguments,
        pins: file.pins,
        pin_required: file.pin_required,
        sampling: file.sampling,
    })
}

/// `[sampling]`: limits only beside `allow = true` (a limit on what is refused anyway is a
/// mistake worth naming), positive, and names a host could hold.
fn check_sampling(sampling: &SamplingConfig) -> Result<(), FieldError> {
    let set = [
        ("sampling.backend", sampling.backend.is_some()),
        ("sampling.model", sampling.model.is_some()),
        ("sampling.max_tokens", sampling.max_tokens.is_some()),
        ("sampling.max_requests", sampling.max_requests.is_some()),
        ("sampling.timeout_ms", sampling.timeout_ms.is_some()),
    ];
    if !sampling.allow
        && let Some((field, _)) = set.iter().find(|(_, set)| *set)
    {
        return Err(field_err(
            *field,
            "applies only with sampling.allow = true; set that to let the server use the task's model, or remove it",
        ));
    }
    positive("sampling.max_tokens", sampling.max_tokens)?;
    positive("sampling.max_requests", sampling.max_requests)?;
    positive("sampling.timeout_ms", sampling.timeout_ms)?;
    for (field, name) in [
        ("sampling.backend", &sampling.backend),
        ("sampling.model", &sampling.model),
    ] {
        if let Some(name) = name
            && (name.trim().is_empty()
                || name.len() > defaults::MAX_MODEL_NAME_BYTES
                || name.chars().any(char::is_control))
        {
            return Err(field_err(
                field,
                format!(
                    "must be 1 to {} bytes without control characters; omit it for the host's default",
                    defaults::MAX_MODEL_NAME_BYTES
                ),
            ));
        }
    }
    Ok(())
}

/// `pins`: at most [`defaults::MAX_TOOL_PINS`] entries, each a tool name an MCP server may
/// have and a pin as [`tool_digest`](super::tool_digest) writes it.
fn check_pins(pins: &std::collections::BTreeMap<String, String>) -> Result<(), FieldError> {
    if pins.len() > defaults::MAX_TOOL_PINS {
        return Err(field_err(
            "pins",
            format!(
                "{} pins, more than the {} a record may hold; pin only the tools allowed_tools lets through",
                pins.len(),
                defaults::MAX_TOOL_PINS
            ),
        ));
    }
    for (tool, pin) in pins {
        if tool.is_empty() || tool.len() > defaults::MAX_TOOL_NAME_BYTES {
            return Err(field_err(
                "pins",
                format!(
                    "a pinned tool name is 1 to {} bytes; remove the entry {:?}",
                    defaults::MAX_TOOL_NAME_BYTES,
                    crate::text::cut(tool, defaults::MAX_TOOL_NAME_BYTES)
                ),
            ));
        }
        if !super::pin::is_valid_pin(pin) {
            return Err(field_err(
                format!("pins.{tool}"),
                format!(
                    "{:?} is not a pin: write `sha256:` and 64 lowercase hex digits, as `quiver registry pin` does (run it to pin the tool's current definition)",
                    crate::text::cut(pin, 80)
                ),
            ));
        }
    }
    Ok(())
}
