//! Where registry records live: one trait over the stores a node can follow.
//!
//! A store holds documents as they were written: each server record and each profile is
//! one TOML or JSON document under its name, `${ENV:..}` references unresolved, so no store
//! ever holds a secret. Every change moves the store's revision forward; a node lists the
//! store at a revision, builds a snapshot from the documents with the same parser the
//! directory uses, and watches from that revision for the next change. The directory is
//! the embedded default; etcd v3 is the store a fleet of nodes shares (its revision is
//! etcd's).

mod etcd;

pub use etcd::{DocValidator, EtcdStore};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use futures::stream::BoxStream;

/// A boxed future of a store call (the trait stays dyn-compatible).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What a document describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DocKind {
    /// A server record; its name is the `server_id`.
    Server,
    /// A profile; its name is the profile's name.
    Profile,
}

/// How a document's text is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
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
    #[error("registry store {store} is unreachable: {message}")]
    Unreachable { store: String, message: String },
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
    /// Anything else the store reported.
    #[error("registry store {store}: {message}")]
    Other { store: String, message: String },
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

    /// Removes a document; the new revision, or `None` if there was no such document.
    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>>;

    /// The changes after `since` (a revision from [`list`](Self::list)), in order.
    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>>;
}
