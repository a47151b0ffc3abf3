//! Reading a registry directory into a snapshot: which files count, problems named by
//! file and field, duplicates, and the revision that changes with any content.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::env::EnvLookup;
use super::file::parse_server_file;
use super::launch::launch_fingerprint;
use super::profile::{Profile, load_profiles};
use super::record::ServerEntry;

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

/// What a directory holds.
pub(super) struct Loaded {
    pub(super) servers: BTreeMap<String, Arc<ServerEntry>>,
    pub(super) profiles: BTreeMap<String, Profile>,
    pub(super) problems: Vec<Problem>,
    pub(super) revision: String,
}

pub(super) fn load_dir(dir: &Path, env: &EnvLookup<'_>) -> Result<Loaded, RegistryDirError> {
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
            // An error: the earlier file is left out.
            problems.push(Problem {
                severity: Severity::Error,
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
    drop_shared_namespaces(&mut servers, &mut problems);
    let profiles = load_profiles(&dir.join("profiles"), &servers, &mut problems, &mut hashed);
    let mut launches: Vec<(String, Vec<u8>)> = servers
        .values()
        .map(|s| (s.server_id().to_owned(), launch_fingerprint(&s.launch)))
        .collect();
    hashed.append(&mut launches);
    Ok(Loaded {
        servers,
        profiles,
        problems,
        revision: revision_of(&hashed),
    })
}

pub(super) fn is_ignored_name(name: &str) -> bool {
    let hidden_or_temp = name.starts_with('.')
        || name.starts_with('#')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".tmp");
    hidden_or_temp || !(name.ends_with(".toml") || name.ends_with(".json"))
}

pub(super) fn revision_of(parts: &[(String, Vec<u8>)]) -> String {
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

pub(super) fn file_problem(path: &Path, field: Option<&str>, message: String) -> Problem {
    Problem {
        severity: Severity::Error,
        path: path.to_owned(),
        field: field.map(Into::into),
        message,
    }
}

/// Two servers with one `tool_namespace` would offer the model the same names for
/// different servers' tools; the one whose id sorts later is left out, with the reason.
fn drop_shared_namespaces(
    servers: &mut BTreeMap<String, Arc<ServerEntry>>,
    problems: &mut Vec<Problem>,
) {
    let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
    let mut shared = Vec::new();
    for entry in servers.values() {
        let namespace = entry.record.tool_namespace.as_str();
        match owners.get(namespace) {
            Some(owner) => shared.push((entry.server_id().to_owned(), (*owner).to_owned())),
            None => {
                owners.insert(namespace, entry.server_id());
            }
        }
    }
    for (server_id, owner) in shared {
        if let Some(entry) = servers.remove(&server_id) {
            problems.push(file_problem(
                &entry.source,
                Some("tool_namespace"),
                format!(
                    "`{}` is already the namespace of server `{owner}`; server `{server_id}` is left out until one of them changes it",
                    entry.record.tool_namespace
                ),
            ));
        }
    }
}
