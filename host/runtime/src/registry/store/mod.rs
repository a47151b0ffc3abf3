//! Where registry records live: one trait over the stores a node can follow.
//!
//! A store holds documents as they were written: each server record and each profile is
//! one TOML or JSON document under its name, `${ENV:..}` references unresolved, so no store
//! ever holds a secret. Every change moves the store's revision forward; a node lists the
//! store at a revision, builds a snapshot from the documents with the same parser the
//! directory uses, and watches from that revision for the next change. The directory is
//! the embedded default; etcd v3 is the store a fleet of nodes shares (its revision is
//! etcd's).

mod bundle;
mod dir;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use futures::stream::BoxStream;

pub use bundle::{Change, DocChange, diff_docs, parse_bundle};
pub use dir::DirStore;

use super::{RecordRules, Registry, Severity, Unrestricted, is_valid_server_id};
use crate::Cause;

/// A boxed future of a store call (the trait stays dyn-compatible).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What a document describes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DocKind {
    /// A server record; its name is the `server_id`.
    Server,
    /// A profile; its name is the profile's name.
    Profile,
}

/// How a document's text is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocFormat {
    Toml,
    Json,
}

/// One document as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDoc {
    pub kind: DocKind,
    pub name: String,
    pub format: DocFormat,
    pub body: Vec<u8>,
    /// The store revision of the document's last change.
    pub revision: u64,
    /// When the document was last written (unix seconds), if the store knows: a file's
    /// modification time, or the time an etcd write recorded.
    pub updated_at: Option<u64>,
}

/// Every document at one store revision.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub revision: u64,
    pub docs: Vec<StoredDoc>,
}

/// A change seen by a watch. A watch that cannot go on (history compacted, connection lost)
/// ends its stream with an error; the follower then lists again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    Put(StoredDoc),
    Deleted {
        kind: DocKind,
        name: String,
        revision: u64,
    },
}

/// Why a store call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached (or did not answer in time); try again later.
    /// `source` is the I/O or transport error `message` tells of, if there was one.
    #[error("registry store {store} is unreachable: {message}")]
    Unreachable {
        store: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The watch's start revision is gone from the store's history: list again.
    #[error("registry store {store} no longer has revision {revision} (compacted); list again")]
    Compacted { store: String, revision: u64 },
    /// The document is not a valid record or profile; names the field and the fix.
    #[error("{0}")]
    Invalid(String),
    /// A conditional write found another revision than it expected.
    #[error("{kind:?} `{name}` changed meanwhile (now at revision {current}); read it again")]
    Conflict {
        kind: DocKind,
        name: String,
        current: u64,
    },
    /// A checked write ([`RegistryStore::apply`]) found that another write reached the
    /// store after the listing it was checked against: list, check and write again.
    #[error(
        "registry store {store} changed meanwhile (another write came after the listing this one was checked against); retry"
    )]
    Changed { store: String },
    /// Anything else the store reported.
    /// `source` is the client's error `message` tells of, if there was one.
    #[error("registry store {store}: {message}")]
    Other {
        store: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

impl StoreError {
    /// This error with the message of an `Unreachable`, `Invalid` or `Other` error
    /// rewritten by `f` (to add context or a fix); other kinds say what they say.
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::Unreachable {
                store,
                message,
                source,
            } => Self::Unreachable {
                store,
                message: f(message),
                source,
            },
            Self::Other {
                store,
                message,
                source,
            } => Self::Other {
                store,
                message: f(message),
                source,
            },
            Self::Invalid(message) => Self::Invalid(f(message)),
            other => other,
        }
    }
}

/// A registry store. Implementations must be cheap to share (`Arc<dyn RegistryStore>`).
pub trait RegistryStore: Send + Sync + fmt::Debug {
    /// Where the store is, for messages and `/readyz` (never with credentials).
    fn describe(&self) -> String;

    /// Every document, and the revision they were read at.
    fn list(&self) -> StoreFuture<'_, Listing>;

    /// One document, if present.
    fn get(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<StoredDoc>>;

    /// Writes `body` (checked with the same rules as the directory loader first) and returns
    /// the new store revision.
    fn upsert(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> StoreFuture<'_, u64>;

    /// [`upsert`](Self::upsert) only while the document is still at `expected` (the
    /// revision it was read at), else [`StoreError::Conflict`]: a write made on a stale
    /// read fails instead of undoing another. The default reads then writes; the
    /// directory and etcd stores check and write in one step.
    fn upsert_if(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
        expected: u64,
    ) -> StoreFuture<'_, u64> {
        let name = name.to_owned();
        Box::pin(async move {
            let current = self.get(kind, &name).await?.map_or(0, |d| d.revision);
            if current != expected {
                return Err(StoreError::Conflict {
                    kind,
                    name,
                    current,
                });
            }
            self.upsert(kind, &name, format, body).await
        })
    }

    /// Makes `writes` (puts first, in order, then deletes) only while no write has reached
    /// the store since the listing at revision `listed_at`, the one the caller checked them
    /// against with [`check_changes`]; else [`StoreError::Changed`]. This ties a check to
    /// its write: two writers each valid alone (one deletes a server, one adds a profile
    /// naming it) cannot both land. etcd makes all writes in one transaction; the
    /// directory checks and writes under its write lock, file by file (an error part-way
    /// names the documents already written). Returns the new store revision.
    fn apply(&self, writes: Vec<Write>, listed_at: u64) -> StoreFuture<'_, u64>;

    /// Removes a document; the new revision, or `None` if there was no such document.
    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>>;

    /// The changes after `since` (a revision from [`list`](Self::list)), in order.
    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>>;
}

/// Checks a write before a store makes it: the name is a plain name (1 to 64 letters,
/// digits, `_`, `-`: it becomes a file name or a key), and the registry built from
/// `current` with the change applied has no error the current one lacks (a bad field, a
/// profile naming an unknown server, a taken namespace). `change` is the new document, or
/// `None` for a delete. The error names the field and the fix.
pub fn check_change(
    current: &[StoredDoc],
    store: &str,
    kind: DocKind,
    name: &str,
    change: Option<(DocFormat, &[u8])>,
) -> Result<(), StoreError> {
    let change = match change {
        Some((format, body)) => Write::Put(StoredDoc {
            kind,
            name: name.to_owned(),
            format,
            body: body.to_vec(),
            revision: 0,
            updated_at: None,
        }),
        None => Write::Delete {
            kind,
            name: name.to_owned(),
        },
    };
    check_changes(current, store, &[change])
}

/// One write of a batch checked by [`check_changes`] and made by [`RegistryStore::apply`].
#[derive(Clone, Debug)]
pub enum Write {
    Put(StoredDoc),
    Delete { kind: DocKind, name: String },
}

impl Write {
    /// The document written: its kind and name.
    pub fn key(&self) -> (DocKind, &str) {
        match self {
            Self::Put(doc) => (doc.kind, &doc.name),
            Self::Delete { kind, name } => (*kind, name),
        }
    }
}

/// [`check_change`] for several writes made together (an import): the registry with all of
/// them applied must have no error the current one lacks.
pub fn check_changes(
    current: &[StoredDoc],
    store: &str,
    writes: &[Write],
) -> Result<(), StoreError> {
    check_changes_under(current, store, writes, &Unrestricted)
}

/// [`check_changes`] under the operator's `rules` (what a node checks an admin write
/// with): a record that breaks one is refused, naming the record, field and rule.
pub fn check_changes_under(
    current: &[StoredDoc],
    store: &str,
    writes: &[Write],
    rules: &dyn RecordRules,
) -> Result<(), StoreError> {
    for write in writes {
        let (kind, name) = write.key();
        if !is_valid_server_id(name) {
            return Err(StoreError::Invalid(format!(
                "{} name {name:?}: use 1 to 64 letters, digits, `_` and `-`",
                kind_name(kind)
            )));
        }
    }
    // `${ENV:..}` references are checked for form only; a missing variable makes a
    // server unavailable, not invalid.
    let no_env = |_: &str| None;
    let build = |docs: Vec<StoredDoc>| Registry::from_docs_under(docs, store, &no_env, rules);
    let errors = |registry: &Registry| -> Vec<String> {
        registry
            .problems()
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .map(ToString::to_string)
            .collect()
    };
    let before = errors(&build(current.to_vec()));
    // A set, so a large import costs one lookup per current document.
    let keys: std::collections::HashSet<(DocKind, &str)> = writes.iter().map(Write::key).collect();
    let written = |doc: &StoredDoc| keys.contains(&(doc.kind, doc.name.as_str()));
    let mut docs: Vec<StoredDoc> = current.iter().filter(|d| !written(d)).cloned().collect();
    docs.extend(writes.iter().filter_map(|w| match w {
        Write::Put(doc) => Some(doc.clone()),
        Write::Delete { .. } => None,
    }));
    let after = build(docs);
    let new: Vec<String> = errors(&after)
        .into_iter()
        .filter(|e| !before.contains(e))
        .collect();
    if !new.is_empty() {
        return Err(StoreError::Invalid(new.join("; ")));
    }
    for write in writes {
        let Write::Put(StoredDoc { kind, name, .. }) = write else {
            continue;
        };
        let stored_as_named = match kind {
            DocKind::Server => after.get(name).is_some(),
            DocKind::Profile => after.profile(name).is_some(),
        };
        if !stored_as_named {
            let field = match kind {
                DocKind::Server => "server_id",
                DocKind::Profile => "name",
            };
            return Err(StoreError::Invalid(format!(
                "{store}/{}s/{name}: {field}: the document is stored as `{name}` but its {field} differs; make them equal",
                kind_name(*kind)
            )));
        }
    }
    Ok(())
}

fn kind_name(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "server",
        DocKind::Profile => "profile",
    }
}
