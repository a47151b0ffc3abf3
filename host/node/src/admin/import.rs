//! `POST servers/import[?dry_run=true]`: many records at once from one bundle
//! ([`parse_bundle`]: TOML `[[servers]]`/`[[profiles]]`, a JSON object with those lists,
//! or a single server record). The whole set is checked against the store before anything
//! is written, so a bundle with one bad entry writes nothing and the `422` names that entry
//! (`servers[i]`/`profiles[i]`). The changed documents are then one checked write
//! ([`RegistryStore::apply`]): on etcd one transaction (so at most
//! [`ETCD_MAX_TXN_WRITES`](defaults::ETCD_MAX_TXN_WRITES) changed records, else `422`); in
//! a directory file by file under the store's lock, an error part-way naming what was
//! written. An import adds and updates; it never removes. Unchanged documents (same fields
//! and values, whatever the formatting) are not written.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::records::refuse_reserved;
use super::{NodeState, query_pairs, read_record, store, store_error};
use crate::defaults;
use crate::error::ApiError;
use quiver::registry::{
    Change, DocKind, RecordRules, RegistryStore, StoreError, StoredDoc, Write, check_changes_under,
    diff_docs, parse_bundle,
};

/// `POST /admin/api/mcp/servers/import`.
pub(crate) async fn import(
    State(state): State<Arc<NodeState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let dry_run = dry_run(query.as_deref())?;
    let record = read_record(&state, &headers, body).await?;
    let docs = parse_bundle(record.format, record.body.as_bytes(), "bundle").map_err(|e| {
        let field = entry_field(&e.to_string());
        store_error(e).with_field(field)
    })?;
    if docs.len() > defaults::ADMIN_IMPORT_MAX_DOCS {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "too_many_records",
            format!(
                "the bundle holds {} records, more than the {} one import takes; split it",
                docs.len(),
                defaults::ADMIN_IMPORT_MAX_DOCS
            ),
        )
        .with_field("body"));
    }
    for (i, doc) in docs.iter().enumerate() {
        // Servers come first in a bundle, so a server's index is its place in `docs`.
        refuse_reserved(doc.kind, &doc.name).map_err(|e| e.with_field(format!("servers[{i}]")))?;
    }
    let store = store(&state)?;
    let listing = store.list().await.map_err(store_error)?;
    let changes: Vec<_> = diff_docs(&listing.docs, &docs)
        .into_iter()
        .filter(|c| c.change != Change::Remove)
        .collect();
    // Building registries is CPU work: off the async workers.
    let (current, describe) = (listing.docs, store.describe());
    let rules = state.host.record_rules();
    let docs = tokio::task::spawn_blocking(move || {
        let writes: Vec<Write> = docs.iter().cloned().map(Write::Put).collect();
        match check_changes_under(&current, &describe, &writes, &*rules) {
            Ok(()) => Ok(docs),
            Err(error) => Err(blame(&current, &describe, &docs, error, &*rules)),
        }
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("checking the bundle failed: {e}"),
        )
    })??;
    let shown: Vec<_> = changes
        .iter()
        .map(|c| json!({"kind": c.kind, "name": c.name, "change": c.change}))
        .collect();
    if dry_run {
        return Ok(answer(true, listing.revision, shown));
    }
    let written = apply(store, &docs, &changes, listing.revision).await;
    // Also after a failure: a directory may hold part of the import (the error names it).
    if !matches!(written, Ok(None)) {
        state.host.sync_after_write(&**store).await;
    }
    Ok(answer(false, written?.unwrap_or(listing.revision), shown))
}

/// The entry a bundle error names (`servers[2].server_id`), else `body`.
fn entry_field(message: &str) -> String {
    message
        .strip_prefix("bundle: ")
        .filter(|rest| rest.starts_with("servers[") || rest.starts_with("profiles["))
        .and_then(|rest| rest.split([':', ' ']).next())
        .map_or_else(|| "body".to_owned(), str::to_owned)
}

fn answer(dry_run: bool, revision: u64, changes: Vec<serde_json::Value>) -> Response {
    axum::Json(json!({"dry_run": dry_run, "revision": revision, "changes": changes}))
        .into_response()
}

/// `dry_run=true|false` (a bare `dry_run` is true); no other parameter.
fn dry_run(query: Option<&str>) -> Result<bool, ApiError> {
    let mut dry_run = false;
    for (_, value) in query_pairs(query, &["dry_run"])? {
        dry_run = match value {
            "" | "true" | "1" => true,
            "false" | "0" => false,
            _ => {
                return Err(ApiError::bad(
                    "dry_run",
                    "expected dry_run=true or dry_run=false",
                ));
            }
        };
    }
    Ok(dry_run)
}

/// Writes the added and updated documents as one checked write made against the listing
/// at `listed_at` (the one the set was checked on), servers first (the order of `docs`), so
/// in a directory a profile is written after the servers it names. The new revision,
/// `None` if nothing changed.
async fn apply(
    store: &Arc<dyn RegistryStore>,
    docs: &[StoredDoc],
    changes: &[quiver::registry::DocChange],
    listed_at: u64,
) -> Result<Option<u64>, ApiError> {
    let writes: Vec<Write> = docs
        .iter()
        .filter(|doc| {
            changes
                .iter()
                .any(|c| c.kind == doc.kind && c.name == doc.name && c.change != Change::Unchanged)
        })
        .cloned()
        .map(Write::Put)
        .collect();
    if writes.is_empty() {
        return Ok(None);
    }
    store
        .apply(writes, listed_at)
        .await
        .map(Some)
        .map_err(store_error)
}

/// The `422` for a bundle that does not check: the first entry whose addition brings a
/// new error, found by checking ever longer prefixes of the bundle (halving the range,
/// since an error a prefix brings stays in every longer one).
fn blame(
    current: &[StoredDoc],
    store: &str,
    docs: &[StoredDoc],
    error: StoreError,
    rules: &dyn RecordRules,
) -> ApiError {
    let writes: Vec<Write> = docs.iter().cloned().map(Write::Put).collect();
    let fails = |len: usize| check_changes_under(current, store, &writes[..len], rules).err();
    // The shortest failing prefix: `ok` passes, `bad` fails.
    let (mut ok, mut bad) = (0, docs.len());
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if fails(mid).is_some() {
            bad = mid;
        } else {
            ok = mid;
        }
    }
    let message = fails(bad).unwrap_or(error).to_string();
    let Some(doc) = docs.get(bad.saturating_sub(1)) else {
        return store_error(StoreError::Invalid(message));
    };
    let servers = docs.iter().filter(|d| d.kind == DocKind::Server).count();
    let at = match doc.kind {
        DocKind::Server => format!("servers[{}]", bad.saturating_sub(1)),
        DocKind::Profile => format!("profiles[{}]", bad.saturating_sub(1 + servers)),
    };
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_record",
        format!("{at} (`{}`): {message}; nothing was written", doc.name),
    )
    .with_field(at)
}
