//! Building a snapshot from registry documents: which files of a directory count, problems
//! named by file (or store document) and field, duplicates, and the revision that changes
//! with any content. A directory is read into documents first, so a directory and a store
//! go through one builder ([`build`]) and follow the same rules.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::env::EnvLookup;
use super::file::parse_server_file;
use super::launch::launch_fingerprint;
use super::profile::{Profile, build_profiles};
use super::record::ServerEntry;
use super::rules::RecordRules;
use super::store::{DocFormat, DocKind, StoredDoc};

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

/// What a set of documents builds into.
pub(super) struct Loaded {
    pub(super) servers: BTreeMap<String, Arc<ServerEntry>>,
    pub(super) profiles: BTreeMap<String, Profile>,
    pub(super) problems: Vec<Problem>,
    pub(super) revision: String,
}

/// One document to build a registry from, with the name its problems carry.
pub(super) struct SourcedDoc {
    pub(super) kind: DocKind,
    pub(super) format: DocFormat,
    pub(super) body: Vec<u8>,
    /// What problems name: the file, or `<store>/<servers|profiles>/<name>`.
    pub(super) source: PathBuf,
    /// What the revision hashes the document under (stable wherever the registry lives).
    pub(super) key: String,
}

/// A registry document read from a directory, named by its file's stem.
pub(crate) struct FileDoc {
    pub(crate) kind: DocKind,
    pub(crate) name: String,
    pub(crate) format: DocFormat,
    pub(crate) body: Vec<u8>,
    pub(crate) path: PathBuf,
}

impl FileDoc {
    fn sourced(self) -> SourcedDoc {
        let file = self
            .path
            .file_name()
            .map_or_else(|| self.name.clone(), |f| f.to_string_lossy().into_owned());
        let key = match self.kind {
            DocKind::Server => file,
            DocKind::Profile => format!("profiles/{file}"),
        };
        SourcedDoc {
            kind: self.kind,
            format: self.format,
            body: self.body,
            source: self.path,
            key,
        }
    }
}

/// The documents of a registry directory: server files at its top, profiles under
/// `profiles/`, each `.toml` or `.json` (the formats a store writes) and sorted by file name;
/// and the problems of files left out (symbolic links, unreadable files).
pub(crate) fn read_dir_docs(dir: &Path) -> Result<(Vec<FileDoc>, Vec<Problem>), RegistryDirError> {
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
    let mut docs = read_files(DocKind::Server, files, &mut problems);
    // A registry without profiles has no such directory.
    if let Ok(entries) = std::fs::read_dir(dir.join("profiles")) {
        let mut files: Vec<(String, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(name, _)| !is_ignored_name(name))
            .collect();
        files.sort();
        docs.extend(read_files(DocKind::Profile, files, &mut problems));
    }
    Ok((docs, problems))
}

fn read_files(
    kind: DocKind,
    files: Vec<(String, PathBuf)>,
    problems: &mut Vec<Problem>,
) -> Vec<FileDoc> {
    let mut docs = Vec::new();
    for (name, path) in files {
        let Some((stem, format)) = split_doc_name(&name) else {
            continue;
        };
        match std::fs::read(&path) {
            Ok(body) => docs.push(FileDoc {
                kind,
                name: stem.to_owned(),
                format,
                body,
                path,
            }),
            Err(e) => problems.push(file_problem(&path, None, format!("cannot read: {e}"))),
        }
    }
    docs
}

/// A registry file name's stem and format (`None`: not a `.toml` or `.json` file).
pub(crate) fn split_doc_name(file_name: &str) -> Option<(&str, DocFormat)> {
    if let Some(stem) = file_name.strip_suffix(".toml") {
        Some((stem, DocFormat::Toml))
    } else {
        file_name
            .strip_suffix(".json")
            .map(|stem| (stem, DocFormat::Json))
    }
}

pub(super) fn load_dir(
    dir: &Path,
    env: &EnvLookup<'_>,
    rules: &dyn RecordRules,
) -> Result<Loaded, RegistryDirError> {
    let (docs, problems) = read_dir_docs(dir)?;
    Ok(build(
        docs.into_iter().map(FileDoc::sourced).collect(),
        problems,
        env,
        rules,
    ))
}

/// A registry from documents a store holds; problems name `<label>/<servers|profiles>/<name>`.
pub(super) fn load_docs(
    docs: Vec<StoredDoc>,
    label: &str,
    env: &EnvLookup<'_>,
    rules: &dyn RecordRules,
) -> Loaded {
    let mut docs: Vec<SourcedDoc> = docs
        .into_iter()
        .map(|doc| {
            let dir = match doc.kind {
                DocKind::Server => "servers",
                DocKind::Profile => "profiles",
            };
            let ext = match doc.format {
                DocFormat::Toml => "toml",
                DocFormat::Json => "json",
            };
            SourcedDoc {
                kind: doc.kind,
                format: doc.format,
                source: PathBuf::from(format!("{label}/{dir}/{}", doc.name)),
                key: format!("{dir}/{}.{ext}", doc.name),
                body: doc.body,
            }
        })
        .collect();
    // The same order a directory gives: later names win duplicates, as later files do.
    docs.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
    build(docs, Vec::new(), env, rules)
}

/// The one way documents become a registry: every server parsed and checked alone (a bad
/// one is left out with its problem), duplicates and shared namespaces resolved, profiles
/// checked against the servers, and a revision over every body and resolved launch. A
/// server the operator's `rules` refuse is left out like a bad file.
pub(super) fn build(
    docs: Vec<SourcedDoc>,
    mut problems: Vec<Problem>,
    env: &EnvLookup<'_>,
    rules: &dyn RecordRules,
) -> Loaded {
    let mut hashed = Vec::new();
    let mut servers: BTreeMap<String, Arc<ServerEntry>> = BTreeMap::new();
    let (server_docs, profile_docs): (Vec<_>, Vec<_>) =
        docs.into_iter().partition(|d| d.kind == DocKind::Server);
    for doc in server_docs {
        hashed.push((doc.key.clone(), doc.body.clone()));
        let path = doc.source;
        let entry = match parse_server_file(&path, doc.format, &doc.body, env, rules) {
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
    let profiles = build_profiles(profile_docs, &servers, &mut problems, &mut hashed);
    let mut launches: Vec<(String, Vec<u8>)> = servers
        .values()
        .map(|s| (s.server_id().to_owned(), launch_fingerprint(&s.launch)))
        .collect();
    hashed.append(&mut launches);
    Loaded {
        servers,
        profiles,
        problems,
        revision: revision_of(&hashed),
    }
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
