//! Resolving a record's `${ENV:..}` references into how to start or reach the server.
//! The result holds secrets, so only the pool reads it and its `Debug` hides values.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use super::env::{EnvLookup, EnvRefError, expand};
use super::record::ServerRecord;

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

/// Why a server cannot be launched: a reference its record needs does not resolve. It
/// names the variable and the field, never a resolved value; the pool compares it with
/// `==` (with the rest of the launch config) to notice a changed server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchUnavailable {
    /// A `${ENV:..}` reference in `field` is missing or malformed.
    #[error("{source} (needed by {field})")]
    EnvRef {
        field: String,
        #[source]
        source: EnvRefError,
    },
    /// A variable `stdio.env_from` passes through is not set.
    #[error("environment variable `{var}` is not set (needed by stdio.env_from)")]
    EnvFromMissing { var: String },
    /// The record has neither `stdio` nor `http`.
    #[error("no transport configuration")]
    NoTransport,
}

pub(super) fn resolve_launch(
    record: &ServerRecord,
    env: &EnvLookup<'_>,
) -> Result<Launch, LaunchUnavailable> {
    let missing = |field: &str, source: EnvRefError| LaunchUnavailable::EnvRef {
        field: field.to_owned(),
        source,
    };
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
            let value =
                env(name).ok_or_else(|| LaunchUnavailable::EnvFromMissing { var: name.clone() })?;
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
    let http = record.http.as_ref().ok_or(LaunchUnavailable::NoTransport)?;
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

pub(super) fn launch_fingerprint(launch: &Result<Launch, LaunchUnavailable>) -> Vec<u8> {
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
        Err(reason) => hasher.update(reason.to_string().as_bytes()),
    }
    hasher.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::record::{StdioConfig, Transport};

    fn record(stdio: StdioConfig) -> ServerRecord {
        ServerRecord {
            server_id: "git".into(),
            display_name: "git".into(),
            transport: Transport::Stdio,
            stdio: Some(stdio),
            http: None,
            tool_namespace: "mcp.git".into(),
            allowed_tools: vec!["*".into()],
            approval_policy: crate::registry::ApprovalPolicy::Never,
            budgets: crate::registry::record::Budgets {
                tool_timeout: crate::defaults::TOOL_TIMEOUT,
                max_concurrency: 1,
                max_tool_output_bytes: 1,
                max_tool_list_bytes: 1,
                connect_timeout: None,
            },
            tags: vec![],
            lifecycle: Default::default(),
        }
    }

    #[test]
    fn an_unavailable_launch_names_the_variable_and_field_and_no_resolved_value() {
        let env = |name: &str| (name == "GIT_TOKEN").then(|| "s3cret-value".to_owned());
        let stdio = |args: &[&str], env_from: &[&str]| StdioConfig {
            command: "git-mcp".into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: [("TOKEN".to_owned(), "${ENV:GIT_TOKEN}".to_owned())].into(),
            env_from: env_from.iter().map(|s| s.to_string()).collect(),
            cwd: None,
        };
        let missing = resolve_launch(
            &record(stdio(&["--token=${ENV:GIT_TOKEN}", "${ENV:NOPE}"], &[])),
            &env,
        )
        .unwrap_err();
        assert_eq!(
            missing.to_string(),
            "environment variable `NOPE` is not set (set it, or write ${ENV:NOPE:-default}) \
             (needed by stdio.args[1])"
        );
        let env_from = resolve_launch(&record(stdio(&[], &["ABSENT"])), &env).unwrap_err();
        assert_eq!(
            env_from,
            LaunchUnavailable::EnvFromMissing {
                var: "ABSENT".into()
            }
        );
        for error in [&missing, &env_from] {
            for text in [error.to_string(), format!("{error:?}")] {
                assert!(!text.contains("s3cret"), "{text}");
            }
        }
        assert!(std::error::Error::source(&missing).is_some());
    }
}
