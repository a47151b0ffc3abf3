//! The store side of a [`Target`](super::Target): a registry directory or etcd used
//! directly, with the checks a node makes: `put` checks the whole set first
//! (`check_changes`), `delete` checks that nothing still needs the document. The write is
//! then a checked write ([`RegistryStore::apply`]): it fails (`Changed`) if anything was
//! written after the listing the check was made on.

use quiver::registry::{
    Change, DocChange, DocKind, RegistryStore, StoreError, StoredDoc, Write, check_changes,
    diff_docs,
};

use super::{Listed, Record, Written};

pub(super) async fn list(store: &dyn RegistryStore) -> Result<Listed, StoreError> {
    let listing = store.list().await?;
    let records = listing
        .docs
        .into_iter()
        .map(|doc| Record {
            kind: doc.kind,
            name: doc.name,
            format: doc.format,
            revision: doc.revision,
            updated_at: doc.updated_at,
            state: None,
            tool_count: None,
        })
        .collect();
    Ok(Listed {
        revision: listing.revision,
        records,
    })
}

/// Writes each document of `docs` that adds a record or changes one, servers first (a
/// profile may name a server of the same file), as one checked write: on etcd one
/// transaction; in a directory file by file under the store's lock.
pub(super) async fn put(
    store: &dyn RegistryStore,
    docs: &[StoredDoc],
    dry_run: bool,
) -> Result<Written, StoreError> {
    let current = store.list().await?;
    let writes: Vec<Write> = docs.iter().cloned().map(Write::Put).collect();
    check_changes(&current.docs, &store.describe(), &writes)?;
    // Import never removes: a record of the store missing from the file stays.
    let changes: Vec<DocChange> = diff_docs(&current.docs, docs)
        .into_iter()
        .filter(|c| c.change != Change::Remove)
        .collect();
    let mut revision = current.revision;
    if !dry_run {
        let mut pending: Vec<&StoredDoc> = docs
            .iter()
            .filter(|doc| {
                changes.iter().any(|c| {
                    c.kind == doc.kind && c.name == doc.name && c.change != Change::Unchanged
                })
            })
            .collect();
        pending.sort_by_key(|doc| doc.kind);
        if !pending.is_empty() {
            let writes = pending.into_iter().cloned().map(Write::Put).collect();
            revision = store.apply(writes, current.revision).await?;
        }
    }
    Ok(Written { revision, changes })
}

/// Deletes a document unless the registry without it would have a new error (a profile
/// still naming the server); `None` if there is no such document.
pub(super) async fn delete(
    store: &dyn RegistryStore,
    kind: DocKind,
    name: &str,
) -> Result<Option<u64>, StoreError> {
    let current = store.list().await?;
    if !current
        .docs
        .iter()
        .any(|d| d.kind == kind && d.name == name)
    {
        return Ok(None);
    }
    let delete = Write::Delete {
        kind,
        name: name.to_owned(),
    };
    check_changes(
        &current.docs,
        &store.describe(),
        std::slice::from_ref(&delete),
    )?;
    store.apply(vec![delete], current.revision).await.map(Some)
}
