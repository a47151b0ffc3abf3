//! The operator's rules a registry is built under ([`RecordRules`]): which stdio commands
//! may run, from which directories, which host variables records may read, where a remote
//! record may point and which credential it may name. The MCP capability implements them
//! (`[mcp.launch]`, `[egress]`, `[auth.*]`); the registry only asks.
//!
//! A record is checked when it is written ([`check_changes_under`](super::check_changes_under)),
//! whenever a registry is built from it (a record that breaks a rule is left out, with the
//! problem), and the stdio launcher and the connector check again before they spawn or
//! send a credential, so a registry built in code cannot skip the rules either.

use std::collections::BTreeSet;
use std::fmt;

use super::record::ServerRecord;

/// A record breaks a rule: the field and the rule with its fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RuleViolation {
    pub field: String,
    pub message: String,
}

impl RuleViolation {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The operator's rules a registry is built under. [`check_record`](Self::check_record)
/// runs before any reference is resolved (so a variable the rules refuse is never read);
/// the others on what the references resolved to.
pub trait RecordRules: Send + Sync + fmt::Debug {
    /// A record as written: its command, directory and the variables it reads.
    fn check_record(&self, _record: &ServerRecord) -> Result<(), RuleViolation> {
        Ok(())
    }

    /// A stdio server about to be launched: the resolved command and directory, and the
    /// host variables its record read.
    fn check_launch(
        &self,
        _command: &str,
        _cwd: Option<&str>,
        _vars: &BTreeSet<String>,
    ) -> Result<(), RuleViolation> {
        Ok(())
    }

    /// Whether a remote record may reach `url` and name its `http.auth_ref`.
    fn check_remote(&self, _record: &ServerRecord, _url: &str) -> Result<(), RuleViolation> {
        Ok(())
    }
}

/// No rules: any command, variable, URL and credential (what a registry loaded without a
/// host, such as `quiver registry validate`, checks against).
#[derive(Clone, Copy, Debug, Default)]
pub struct Unrestricted;

impl RecordRules for Unrestricted {}
