//! The store side of a [`Target`](super::Target): a registry directory or etcd used
//! directly. `put` makes the node's import checks: the whole set first, with
//! `check_changes`, then each write again as the store makes it.

use quiver::registry::{
    Change, DocChange, RegistryStore, StoreError, StoredDoc, Write, check_changes, diff_docs,
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
            updated_at: None,
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
/// profile may name a server of the same file). A store has no transaction over many
/// documents: the set is checked as a whole before the first write, and a writer racing
/// this one can still make a later write fail its own check.
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
        for doc in pending {
            revision = store
                .upsert(doc.kind, &doc.name, doc.format, doc.body.clone())
                .await?;
        }
    }
    Ok(Written { revision, changes })
}
