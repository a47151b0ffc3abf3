//! Many records in one file (an import, a directory compared with a node), and what
//! writing them would change.
//!
//! A bundle is a TOML file with `[[servers]]` and `[[profiles]]` tables, or a JSON object
//! with `"servers"` and `"profiles"` arrays; each entry is one record exactly as a file of
//! its own would hold it. A file holding a single server record (a top-level `server_id`)
//! is a bundle of one, kept byte for byte. Entries become documents in the bundle's format;
//! nothing is resolved, so `${ENV:..}` references stay references.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{DocFormat, DocKind, StoreError, StoredDoc};
use crate::defaults::{REGISTRY_STORE_MAX_DOC_BYTES, REGISTRY_STORE_MAX_DOCS};

/// Reads a bundle (see the module docs) into documents at revision 0, servers first.
/// `source` names the file in errors. Refuses unknown top-level keys, entries without
/// their name field, duplicate names, and more documents or bytes than a store takes.
pub fn parse_bundle(
    format: DocFormat,
    text: &[u8],
    source: &str,
) -> Result<Vec<StoredDoc>, StoreError> {
    let invalid = |message: String| StoreError::Invalid(format!("{source}: {message}"));
    let text = std::str::from_utf8(text).map_err(|e| invalid(format!("not valid UTF-8 ({e})")))?;
    let top: Value = match format {
        DocFormat::Toml => {
            crate::json::from_toml(text).map_err(|e| invalid(format!("not TOML: {e}")))?
        }
        DocFormat::Json => {
            crate::json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?
        }
    };
    let Value::Object(top) = top else {
        return Err(invalid(
            "a bundle is an object with `servers` and `profiles` arrays".into(),
        ));
    };
    if top.contains_key("server_id") {
        return Ok(vec![StoredDoc {
            kind: DocKind::Server,
            name: name_of(&top, "server_id").ok_or_else(|| {
                invalid("server_id: must be a string, e.g. server_id = \"fs\"".into())
            })?,
            format,
            body: text.as_bytes().to_vec(),
            updated_at: None,
            revision: 0,
        }]);
    }
    if let Some(key) = top.keys().find(|k| *k != "servers" && *k != "profiles") {
        return Err(invalid(format!(
            "unknown key `{key}`; a bundle holds `servers` and `profiles` lists \
             (or is a single server record with a `server_id`)"
        )));
    }
    let mut docs = Vec::new();
    let mut seen = BTreeMap::new();
    for (list, kind, field) in [
        ("servers", DocKind::Server, "server_id"),
        ("profiles", DocKind::Profile, "name"),
    ] {
        let entries = match top.get(list) {
            None => continue,
            Some(Value::Array(entries)) => entries,
            Some(_) => {
                return Err(invalid(format!(
                    "{list}: must be a list of records ([[{list}]] in TOML)"
                )));
            }
        };
        for (index, entry) in entries.iter().enumerate() {
            let at = format!("{list}[{index}]");
            let Value::Object(record) = entry else {
                return Err(invalid(format!("{at}: must be a table of fields")));
            };
            let name = name_of(record, field).ok_or_else(|| {
                invalid(format!("{at}.{field}: missing or not a string; add one"))
            })?;
            if let Some(first) = seen.insert((kind, name.clone()), at.clone()) {
                return Err(invalid(format!(
                    "{at}.{field}: `{name}` is also {first}; each name appears once"
                )));
            }
            if docs.len() >= REGISTRY_STORE_MAX_DOCS {
                return Err(invalid(format!(
                    "more than {REGISTRY_STORE_MAX_DOCS} records; split the file"
                )));
            }
            let body = match format {
                DocFormat::Toml => toml::to_string(record)
                    .map(String::into_bytes)
                    .map_err(|e| e.to_string()),
                DocFormat::Json => serde_json::to_vec_pretty(record).map_err(|e| e.to_string()),
            }
            .map_err(|e| invalid(format!("{at}: {e}")))?;
            if body.len() > REGISTRY_STORE_MAX_DOC_BYTES {
                return Err(invalid(format!(
                    "{at}: {} bytes, over the {REGISTRY_STORE_MAX_DOC_BYTES}-byte limit of one record",
                    body.len()
                )));
            }
            docs.push(StoredDoc {
                kind,
                name,
                format,
                body,
                revision: 0,
                updated_at: None,
            });
        }
    }
    Ok(docs)
}

fn name_of(record: &serde_json::Map<String, Value>, field: &str) -> Option<String> {
    record.get(field)?.as_str().map(str::to_owned)
}

/// What writing a document would do to a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Add,
    Update,
    Unchanged,
    /// In the store, not in the documents compared with it.
    Remove,
}

/// One document's change; ordered by kind, then name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DocChange {
    pub kind: DocKind,
    pub name: String,
    pub change: Change,
}

/// Compares `wanted` with `current`: each wanted document is an add, an update or
/// unchanged, and each current document not wanted is a remove. Two documents are equal
/// when they hold the same fields and values, whatever their format, spacing or comments.
pub fn diff_docs(current: &[StoredDoc], wanted: &[StoredDoc]) -> Vec<DocChange> {
    let current: BTreeMap<(DocKind, &str), &StoredDoc> = current
        .iter()
        .map(|d| ((d.kind, d.name.as_str()), d))
        .collect();
    let wanted: BTreeMap<(DocKind, &str), &StoredDoc> = wanted
        .iter()
        .map(|d| ((d.kind, d.name.as_str()), d))
        .collect();
    let mut changes: Vec<DocChange> = wanted
        .iter()
        .map(|(&(kind, name), doc)| DocChange {
            kind,
            name: name.to_owned(),
            change: match current.get(&(kind, name)) {
                None => Change::Add,
                Some(old) if same_fields(old, doc) => Change::Unchanged,
                Some(_) => Change::Update,
            },
        })
        .collect();
    changes.extend(
        current
            .keys()
            .filter(|key| !wanted.contains_key(key))
            .map(|&(kind, name)| DocChange {
                kind,
                name: name.to_owned(),
                change: Change::Remove,
            }),
    );
    changes.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    changes
}

fn same_fields(a: &StoredDoc, b: &StoredDoc) -> bool {
    match (fields(a), fields(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a.body == b.body,
    }
}

fn fields(doc: &StoredDoc) -> Option<Value> {
    let text = std::str::from_utf8(&doc.body).ok()?;
    match doc.format {
        DocFormat::Toml => crate::json::from_toml(text).ok(),
        DocFormat::Json => crate::json::from_str(text).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(kind: DocKind, name: &str, format: DocFormat, body: &str) -> StoredDoc {
        StoredDoc {
            kind,
            name: name.into(),
            format,
            body: body.as_bytes().to_vec(),
            revision: 0,
            updated_at: None,
        }
    }

    #[test]
    fn toml_and_json_bundles_become_one_document_per_record() {
        let toml = br#"
[[servers]]
server_id = "fs"
transport = "stdio"
[servers.stdio]
command = "npx"
[[profiles]]
name = "dev"
server_ids = ["fs"]
"#;
        let docs = parse_bundle(DocFormat::Toml, toml, "import.toml").unwrap();
        assert_eq!(
            docs.iter()
                .map(|d| (d.kind, d.name.as_str()))
                .collect::<Vec<_>>(),
            [(DocKind::Server, "fs"), (DocKind::Profile, "dev")]
        );
        let server: toml::Table = toml::from_str(std::str::from_utf8(&docs[0].body).unwrap())
            .expect("each document is a TOML record of its own");
        assert_eq!(server["stdio"]["command"].as_str(), Some("npx"));

        let json = br#"{"servers":[{"server_id":"a","transport":"stdio"}]}"#;
        let docs = parse_bundle(DocFormat::Json, json, "import.json").unwrap();
        assert_eq!(docs[0].format, DocFormat::Json);
        assert_eq!(docs[0].name, "a");
    }

    #[test]
    fn a_single_record_is_kept_byte_for_byte() {
        let text = b"# reviewed\nserver_id = \"fs\"\ntransport = \"stdio\"\n";
        let docs = parse_bundle(DocFormat::Toml, text, "fs.toml").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].body, text);
    }

    #[test]
    fn bad_bundles_name_the_entry_and_the_fix() {
        for (format, text, expect) in [
            (
                DocFormat::Toml,
                &b"[[servers]]\ntransport = \"stdio\"\n"[..],
                "servers[0].server_id",
            ),
            (
                DocFormat::Json,
                br#"{"servers":[{"server_id":"a"},{"server_id":"a"}]}"#,
                "servers[1].server_id: `a` is also servers[0]",
            ),
            (DocFormat::Json, br#"{"server":[]}"#, "unknown key `server`"),
            (
                DocFormat::Json,
                br#"{"servers":{}}"#,
                "servers: must be a list",
            ),
            (DocFormat::Json, br#"[1]"#, "a bundle is an object"),
            (DocFormat::Json, b"{\"servers\":[\xff]}", "not valid UTF-8"),
            (DocFormat::Toml, b"servers = [", "not TOML"),
            (
                DocFormat::Json,
                br#"{"profiles":[{"server_ids":[]}]}"#,
                "profiles[0].name",
            ),
        ] {
            let err = parse_bundle(format, text, "f").unwrap_err().to_string();
            assert!(err.starts_with("f: ") && err.contains(expect), "{err}");
        }
    }

    #[test]
    fn diff_compares_fields_not_formatting() {
        let current = [
            doc(
                DocKind::Server,
                "a",
                DocFormat::Toml,
                "server_id = \"a\"\n# note\nx = 1",
            ),
            doc(
                DocKind::Server,
                "b",
                DocFormat::Toml,
                "server_id = \"b\"\nx = 1",
            ),
            doc(DocKind::Profile, "p", DocFormat::Toml, "name = \"p\""),
        ];
        let wanted = [
            doc(
                DocKind::Server,
                "a",
                DocFormat::Json,
                r#"{"x":1,"server_id":"a"}"#,
            ),
            doc(
                DocKind::Server,
                "b",
                DocFormat::Toml,
                "server_id = \"b\"\nx = 2",
            ),
            doc(DocKind::Server, "c", DocFormat::Toml, "server_id = \"c\""),
        ];
        let changes: Vec<(DocKind, String, Change)> = diff_docs(&current, &wanted)
            .into_iter()
            .map(|c| (c.kind, c.name, c.change))
            .collect();
        assert_eq!(
            changes,
            [
                (DocKind::Server, "a".into(), Change::Unchanged),
                (DocKind::Server, "b".into(), Change::Update),
                (DocKind::Server, "c".into(), Change::Add),
                (DocKind::Profile, "p".into(), Change::Remove),
            ]
        );
    }
}
