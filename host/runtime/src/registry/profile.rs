//! Profiles: named selections of servers (by id and tag) with tool, resource and prompt
//! lists, from `<registry>/profiles/*.{toml,json}` or a store's profile documents.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::Registry;
use super::load::{Problem, Severity, SourcedDoc, file_problem};
use super::record::ServerEntry;
use super::store::DocFormat;

/// A named selection of servers (by id and/or tag) with tool, resource and prompt lists,
/// from `<registry>/profiles/*.{toml,json}`. A task names one with `mcp.profile`; the lists join
/// each server's filters as the profile layer (an absent allowlist leaves the others in
/// charge, a denylist vetoes).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub server_ids: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub tool_allowlist: Option<Vec<String>>,
    #[serde(default)]
    pub tool_denylist: Vec<String>,
    /// Resource URI patterns.
    #[serde(default)]
    pub resource_allowlist: Option<Vec<String>>,
    #[serde(default)]
    pub resource_denylist: Vec<String>,
    /// Prompt name patterns.
    #[serde(default)]
    pub prompt_allowlist: Option<Vec<String>>,
    #[serde(default)]
    pub prompt_denylist: Vec<String>,
}

impl Profile {
    /// Its servers: those it names, and those carrying one of its tags, in registry order.
    pub fn servers(&self, registry: &Registry) -> Vec<String> {
        registry
            .servers()
            .filter(|s| {
                self.server_ids.iter().any(|id| id == s.server_id())
                    || s.record.tags.iter().any(|t| self.tags.contains(t))
            })
            .map(|s| s.server_id().to_owned())
            .collect()
    }
}

/// Builds the profile documents (same rules as server records). A profile naming an
/// unknown server is an error and is left out; a tag no server carries is a warning.
pub(super) fn build_profiles(
    docs: Vec<SourcedDoc>,
    servers: &BTreeMap<String, Arc<ServerEntry>>,
    problems: &mut Vec<Problem>,
    hashed: &mut Vec<(String, Vec<u8>)>,
) -> BTreeMap<String, Profile> {
    let mut profiles = BTreeMap::new();
    for doc in docs {
        let path = doc.source;
        hashed.push((doc.key, doc.body.clone()));
        let text = match std::str::from_utf8(&doc.body) {
            Ok(text) => text,
            Err(e) => {
                problems.push(file_problem(&path, None, format!("not UTF-8: {e}")));
                continue;
            }
        };
        let value: Result<serde_json::Value, String> = match doc.format {
            DocFormat::Toml => {
                crate::json::from_toml(text).map_err(|e| format!("invalid TOML: {e}"))
            }
            DocFormat::Json => {
                crate::json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
            }
        };
        let value = match value {
            Ok(value) => value,
            Err(message) => {
                problems.push(file_problem(&path, None, message));
                continue;
            }
        };
        let profile: Profile = match serde_path_to_error::deserialize(value) {
            Ok(profile) => profile,
            Err(e) => {
                let field = e.path().to_string();
                problems.push(file_problem(
                    &path,
                    (field != ".").then_some(field.as_str()),
                    e.into_inner().to_string(),
                ));
                continue;
            }
        };
        if let Some(unknown) = profile
            .server_ids
            .iter()
            .find(|id| !servers.contains_key(*id))
        {
            problems.push(file_problem(
                &path,
                Some("server_ids"),
                format!(
                    "profile `{}` names unknown server `{unknown}`",
                    profile.name
                ),
            ));
            continue;
        }
        for tag in profile
            .tags
            .iter()
            .filter(|t| !servers.values().any(|s| s.record.tags.contains(t)))
        {
            problems.push(Problem {
                severity: Severity::Warning,
                path: path.clone(),
                field: Some("tags".into()),
                message: format!("no server carries tag `{tag}`"),
            });
        }
        if let Some(previous) = profiles.insert(profile.name.clone(), profile) {
            problems.push(Problem {
                severity: Severity::Warning,
                path: path.clone(),
                field: Some("name".into()),
                message: format!(
                    "profile `{}` is defined more than once; this file wins",
                    previous.name
                ),
            });
        }
    }
    profiles
}
