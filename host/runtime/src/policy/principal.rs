//! The principal layer: which servers and profiles the operator lets each principal use,
//! from the host config's `[principals]` (the policy capability's section of
//! `quiver.toml`). It only narrows: a server must also pass the registry, profile, task and
//! session layers.
//!
//! ```toml
//! [principals.alice]
//! servers = ["github", "docs-*"]   # server id patterns
//! profiles = ["readonly"]          # profile name patterns a task of hers may name
//! [principals."*"]                 # everyone not listed, and tasks without a principal
//! servers = ["docs-*"]
//! ```
//!
//! Without the section nothing is narrowed. With it, a principal matching no entry (and a
//! task of no principal, when there is no `*` entry) may use no server and no profile.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::Pattern;
use crate::defaults;
use crate::identity::check_principal;

/// The entry of principals not listed, and of tasks without a principal.
const EVERYONE: &str = "*";

/// `[principals.NAME]` as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Patterns of the server ids the principal may use; empty: none.
    #[serde(default)]
    pub servers: Vec<String>,
    /// Patterns of the registry profiles its tasks may name in `mcp.profile`; empty: none
    /// (a task without a profile is not affected).
    #[serde(default)]
    pub profiles: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
struct Entry {
    name: Arc<str>,
    servers: Vec<Pattern>,
    profiles: Vec<Pattern>,
}

/// The `[principals]` section, checked: how [`PrincipalLayer`]s are made.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrincipalRules {
    entries: BTreeMap<String, Arc<Entry>>,
}

/// A `[principals]` value no host can use: the field (`principals.NAME.FIELD`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PrincipalConfigError {
    pub field: String,
    pub message: String,
}

impl PrincipalRules {
    /// Checks every entry: its name (a principal's, or `*`), and each pattern (not empty, at
    /// most [`defaults::MAX_PATTERN_BYTES`], at most [`defaults::MAX_TASK_PATTERNS`] per list).
    pub fn from_config(
        config: &BTreeMap<String, PrincipalConfig>,
    ) -> Result<Self, PrincipalConfigError> {
        let mut entries = BTreeMap::new();
        for (name, entry) in config {
            let shown =
                crate::text::printable(crate::text::cut(name, defaults::MAX_PRINCIPAL_BYTES));
            if name != EVERYONE {
                check_principal(name).map_err(|message| PrincipalConfigError {
                    field: format!("principals.{shown}"),
                    message: format!("{message}; name a principal as tasks carry it, or `\"*\"` for everyone else"),
                })?;
            }
            let patterns = |field: &str, list: &[String]| {
                let error = |message: String| PrincipalConfigError {
                    field: format!("principals.{shown}.{field}"),
                    message,
                };
                if list.len() > defaults::MAX_TASK_PATTERNS {
                    return Err(error(format!(
                        "{} patterns; at most {} are allowed (use `*` to cover many)",
                        list.len(),
                        defaults::MAX_TASK_PATTERNS
                    )));
                }
                list.iter()
                    .map(|p| {
                        if p.is_empty() || p.len() > defaults::MAX_PATTERN_BYTES {
                            return Err(error(format!(
                                "each pattern is 1 to {} bytes",
                                defaults::MAX_PATTERN_BYTES
                            )));
                        }
                        Ok(Pattern::new(p.as_str()))
                    })
                    .collect::<Result<Vec<_>, _>>()
            };
            entries.insert(
                name.clone(),
                Arc::new(Entry {
                    name: name.as_str().into(),
                    servers: patterns("servers", &entry.servers)?,
                    profiles: patterns("profiles", &entry.profiles)?,
                }),
            );
        }
        Ok(Self { entries })
    }

    /// The layer of a task of `principal`: its own entry, else `*`, else nothing allowed.
    pub fn layer(&self, principal: Option<&str>) -> PrincipalLayer {
        let entry = principal
            .and_then(|name| self.entries.get(name))
            .or_else(|| self.entries.get(EVERYONE))
            .cloned();
        PrincipalLayer {
            principal: principal.map(Arc::from),
            entry,
        }
    }

    /// The principals with an entry of their own (the metrics label only these).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries
            .keys()
            .map(String::as_str)
            .filter(|name| *name != EVERYONE)
    }
}

/// What the operator lets one task's principal use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrincipalLayer {
    principal: Option<Arc<str>>,
    /// `None`: no entry applies, so nothing is allowed.
    entry: Option<Arc<Entry>>,
}

impl PrincipalLayer {
    /// The principal as denials name it.
    fn who(&self) -> String {
        match &self.principal {
            Some(name) => format!("principal `{name}`"),
            None => "a task without a principal".into(),
        }
    }

    /// The entry to edit, as a denial's fix names it.
    fn fix_entry(&self) -> String {
        match (&self.entry, &self.principal) {
            (Some(entry), _) if &*entry.name == EVERYONE => "[principals.\"*\"]".into(),
            (Some(entry), _) => format!("[principals.{}]", entry.name),
            (None, Some(name)) => format!("[principals.{name}] (or [principals.\"*\"])"),
            (None, None) => "[principals.\"*\"]".into(),
        }
    }

    /// `Ok` if the principal may use server `server_id`; else the detail of the denial,
    /// naming the principal, the server and the fix.
    pub fn check_server(&self, server_id: &str) -> Result<(), String> {
        self.check("servers", server_id, |e| &e.servers)
            .map_err(|why| format!("{} may not use server `{server_id}`: {why}", self.who()))
    }

    /// `Ok` if the principal's tasks may name profile `name`; else why, with the fix.
    pub fn check_profile(&self, name: &str) -> Result<(), String> {
        self.check("profiles", name, |e| &e.profiles)
            .map_err(|why| format!("{} may not use profile `{name}`: {why}", self.who()))
    }

    fn check(
        &self,
        field: &str,
        name: &str,
        list: impl Fn(&Entry) -> &Vec<Pattern>,
    ) -> Result<(), String> {
        let fix = self.fix_entry();
        match &self.entry {
            Some(entry) if list(entry).iter().any(|p| p.matches(name)) => Ok(()),
            Some(_) => Err(format!(
                "not in {fix} {field} of the host config; add a pattern matching it there (quiver.toml)"
            )),
            None => Err(format!(
                "the host config's [principals] has no entry for it and no `*` entry; add {fix} with {field} = [...] (quiver.toml)"
            )),
        }
    }
}
