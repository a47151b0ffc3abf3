//! Resolving a record's `${ENV:..}` references into how to start or reach the server.
//! The result holds secrets, so only the pool reads it and its `Debug` hides values; the
//! values the references resolved to travel with it as [`Secrets`], so that whatever is
//! said about the server can be cleaned of them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::env::{EnvLookup, EnvRefError, expand};
use super::record::ServerRecord;
use super::secrets::Secrets;

/// How to start or reach a server, with every reference resolved. Holds secrets: its
/// `Debug` shows names, never values.
#[derive(Clone, PartialEq, Eq)]
pub enum Launch {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        /// The host variables the record's references and `env_from` read, for the
        /// launcher's last check against the launch rules.
        vars: BTreeSet<String>,
        /// What the record's references (and `env_from`) resolved to.
        secrets: Secrets,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        /// What the record's references resolved to.
        secrets: Secrets,
    },
}

impl Launch {
    /// The resolved values to cut out of every error and log line about this server.
    pub fn secrets(&self) -> &Secrets {
        match self {
            Launch::Stdio { secrets, .. } | Launch::Http { secrets, .. } => secrets,
        }
    }
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Launch::Stdio {
                command,
                env,
                secrets,
                ..
            } => f
                .debug_struct("Stdio")
                .field("command", &secrets.redact(command))
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
    // Every value a reference resolves to is a secret, wherever it ends up.
    let resolved = RefCell::new(Vec::new());
    let read = RefCell::new(BTreeSet::new());
    let recording = |name: &str| {
        read.borrow_mut().insert(name.to_owned());
        let value = env(name);
        if let Some(value) = &value {
            resolved.borrow_mut().push(value.clone());
        }
        value
    };
    let env: &EnvLookup<'_> = &recording;
    let secrets = || Secrets::new(resolved.borrow().iter());
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
        let mut resolved_env = BTreeMap::new();
        for (key, value) in &stdio.env {
            resolved_env.insert(
                key.clone(),
                expand(value, env).map_err(|e| missing(&format!("stdio.env.{key}"), e))?,
            );
        }
        for name in &stdio.env_from {
            let value =
                env(name).ok_or_else(|| LaunchUnavailable::EnvFromMissing { var: name.clone() })?;
            resolved_env.insert(name.clone(), value);
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
            env: resolved_env,
            cwd,
            vars: read.take(),
            secrets: secrets(),
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
    Ok(Launch::Http {
        url,
        headers,
        secrets: secrets(),
    })
}

/// A key drawn once per process, so the registry revision (which guests see) changes
/// with every resolved value yet cannot be used to guess a short secret offline.
fn fingerprint_key() -> &'static [u8; 16] {
    static KEY: OnceLock<[u8; 16]> = OnceLock::new();
    KEY.get_or_init(|| {
        use std::hash::{BuildHasher, RandomState};
        // RandomState is seeded from the OS's random source.
        let a = RandomState::new().hash_one(0u8).to_le_bytes();
        let b = RandomState::new().hash_one(1u8).to_le_bytes();
        let mut key = [0; 16];
        key[..8].copy_from_slice(&a);
        key[8..].copy_from_slice(&b);
        key
    })
}

pub(super) fn launch_fingerprint(launch: &Result<Launch, LaunchUnavailable>) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update(fingerprint_key());
    match launch {
        Ok(Launch::Stdio {
            command,
            args,
            env,
            cwd,
            ..
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
        Ok(Launch::Http { url, headers, .. }) => {
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
    use crate::registry::record::StdioConfig;

    fn record(stdio: StdioConfig) -> ServerRecord {
        ServerRecord {
            stdio: Some(stdio),
            ..ServerRecord::for_tests("git")
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
            idle_timeout_ms: None,
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

    #[test]
    fn every_resolved_value_is_a_secret_of_the_launch_and_defaults_are_not() {
        let env = |name: &str| match name {
            "TOKEN" => Some("tok-value-1".to_owned()),
            "PASSED" => Some("passed-value-2".to_owned()),
            _ => None,
        };
        let stdio = StdioConfig {
            command: "srv-${ENV:TOKEN}".into(),
            args: vec![
                "--t=${ENV:TOKEN}".into(),
                "${ENV:UNSET:-default-arg}".into(),
            ],
            env: BTreeMap::new(),
            env_from: vec!["PASSED".into()],
            cwd: None,
            idle_timeout_ms: None,
        };
        let launch = resolve_launch(&record(stdio), &env).unwrap();
        assert!(!format!("{launch:?}").contains("tok-value-1"), "{launch:?}");
        let secrets = launch.secrets();
        let text = "tok-value-1 passed-value-2 default-arg";
        assert_eq!(
            secrets.redact(text),
            format!("{0} {0} default-arg", crate::registry::REDACTED)
        );
    }
}
