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

pub(super) fn resolve_launch(record: &ServerRecord, env: &EnvLookup<'_>) -> Result<Launch, String> {
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

pub(super) fn launch_fingerprint(launch: &Result<Launch, String>) -> Vec<u8> {
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
