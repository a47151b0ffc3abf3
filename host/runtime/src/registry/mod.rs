//! The MCP server registry: the platform layer of policy, and the records the MCP
//! capability connects with.
//!
//! A registry is a directory of one file per server (`*.toml` or `*.json`). A server absent
//! from it cannot be used by any task, and a server's `allowed_tools` bounds every task
//! and session above it (empty means deny all). Loading is forgiving per file and strict
//! within one: a bad file is reported with its path and field and left out, every other
//! file still loads. `${ENV:VAR}` references are resolved here, once; a server whose
//! required variable is missing stays listed but unavailable, with the reason.
//!
//! Resolved values (env, headers, URLs) live only in [`Launch`], which the pool reads and
//! nothing shows: [`ServerRecord`] and [`ServerView`] keep the references as written. What
//! the references resolved to also travels as [`Secrets`], which cut those values out of
//! errors and log lines ([`redact_known`] for log sinks).
//!
//! The same documents can live in a [`RegistryStore`] (a [`DirStore`] over a directory,
//! etcd for a fleet); [`Registry::from_docs`] builds a snapshot from them with the same
//! rules, and [`check_change`] refuses a write a load would reject.
//!
//! The module is split by job: [`record`](self) holds the types a record is made of,
//! `file` parses and checks one file, `launch` resolves references into what the pool
//! needs, `rules` is what the operator lets records do (asked, not decided, here), `load`
//! builds a snapshot from documents (a directory's files or a store's), `profile`
//! reads the named selections, `store` holds the stores.

/// The directory of a registry directory that holds user grants: hidden, so the loader
/// (which reads files only) and its watcher pass it by.
pub const REGISTRY_GRANTS_DIR: &str = ".grants";

mod env;
mod file;
mod launch;
mod load;
mod pin;
mod profile;
mod record;
mod rules;
mod secrets;
mod store;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use env::{EnvLookup, EnvRefError, expand};
pub use launch::{Launch, LaunchUnavailable};
pub use load::{Problem, RegistryDirError, Severity};
pub use pin::{PIN_ALGORITHM, is_valid_pin, tool_digest, with_pins};
pub use profile::Profile;
pub use record::{
    ApprovalPolicy, Budgets, BudgetsView, HttpConfig, Lifecycle, SamplingConfig, ServerEntry,
    ServerRecord, ServerView, StdioConfig, Transport, is_valid_server_id,
};
pub use rules::{RecordRules, RuleViolation, Unrestricted};
pub use secrets::{REDACTED, Secrets, redact_known};
pub use store::{
    Change, DirStore, DocChange, DocFormat, DocKind, Listing, RegistryStore, StoreError,
    StoreEvent, StoreFuture, StoredDoc, Write, check_change, check_changes, check_changes_under,
    diff_docs, parse_bundle,
};

/// A snapshot of the registry. Cheap to share; reloading makes a new one.
#[derive(Debug, Default)]
pub struct Registry {
    servers: BTreeMap<String, Arc<ServerEntry>>,
    profiles: BTreeMap<String, Profile>,
    problems: Vec<Problem>,
    revision: String,
}

impl Registry {
    /// A registry with no servers: every MCP use is denied.
    pub fn empty() -> Self {
        Self {
            revision: load::revision_of(&[]),
            ..Self::default()
        }
    }

    /// Loads `dir`, resolving `${ENV:..}` from the process environment.
    pub fn load_dir(dir: impl AsRef<std::path::Path>) -> Result<Self, RegistryDirError> {
        Self::load_dir_with_env(dir, &|name: &str| std::env::var(name).ok())
    }

    /// Loads `dir`, resolving `${ENV:..}` through `env`. No operator rules apply at load
    /// (a host's stdio launcher still checks its own); see [`load_dir_under`](Self::load_dir_under).
    pub fn load_dir_with_env(
        dir: impl AsRef<std::path::Path>,
        env: &EnvLookup<'_>,
    ) -> Result<Self, RegistryDirError> {
        Self::load_dir_under(dir, env, &Unrestricted)
    }

    /// Loads `dir` under the operator's `rules`: a record that breaks one is left out, with
    /// a problem naming its file, field and the rule.
    pub fn load_dir_under(
        dir: impl AsRef<std::path::Path>,
        env: &EnvLookup<'_>,
        rules: &dyn RecordRules,
    ) -> Result<Self, RegistryDirError> {
        Ok(Self::from_loaded(load::load_dir(dir.as_ref(), env, rules)?))
    }

    /// Builds a registry from a store's documents with the directory's parser and rules;
    /// problems name each document `<source_label>/<servers|profiles>/<name>`. No operator
    /// rules apply; see [`from_docs_under`](Self::from_docs_under).
    pub fn from_docs(docs: Vec<StoredDoc>, source_label: &str, env: &EnvLookup<'_>) -> Self {
        Self::from_docs_under(docs, source_label, env, &Unrestricted)
    }

    /// [`from_docs`](Self::from_docs) under the operator's `rules`, as
    /// [`load_dir_under`](Self::load_dir_under).
    pub fn from_docs_under(
        docs: Vec<StoredDoc>,
        source_label: &str,
        env: &EnvLookup<'_>,
        rules: &dyn RecordRules,
    ) -> Self {
        Self::from_loaded(load::load_docs(docs, source_label, env, rules))
    }

    fn from_loaded(loaded: load::Loaded) -> Self {
        Self {
            servers: loaded.servers,
            profiles: loaded.profiles,
            problems: loaded.problems,
            revision: loaded.revision,
        }
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
            revision: load::revision_of(&parts),
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
