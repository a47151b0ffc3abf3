//! The operator's rules for records as the MCP capability holds them: the launch rules
//! (`[mcp.launch]`), the egress policy a remote record's URL must pass (`[egress]`, the
//! same list every request is checked against, so there is one list of reachable
//! origins), and the credentials' bindings (`[auth.NAME] servers / origins`). The registry
//! checks records against them when written and loaded; the connector checks again when
//! it launches or connects.

use std::collections::BTreeSet;

use crate::mcp::auth::AuthSet;
use crate::mcp::egress::EgressPolicy;
use crate::mcp::launch::LaunchRules;
use crate::registry::{RecordRules, RuleViolation, ServerRecord};

#[derive(Debug, Default)]
pub(crate) struct ServerRules {
    pub(crate) launch: LaunchRules,
    pub(crate) egress: EgressPolicy,
    pub(crate) auth: AuthSet,
}

impl RecordRules for ServerRules {
    fn check_record(&self, record: &ServerRecord) -> Result<(), RuleViolation> {
        self.launch.check_record(record)
    }

    fn check_launch(
        &self,
        command: &str,
        cwd: Option<&str>,
        vars: &BTreeSet<String>,
    ) -> Result<(), RuleViolation> {
        self.launch.check_launch(command, cwd, vars)
    }

    fn check_remote(&self, record: &ServerRecord, url: &str) -> Result<(), RuleViolation> {
        // A URL that does not parse is the connector's to report, with the parser's reason.
        if let Ok(parsed) = reqwest::Url::parse(url) {
            self.egress.check_url(&parsed).map_err(|denied| {
                RuleViolation::new(
                    "http.url",
                    format!("{denied}; or point the record at an allowed origin"),
                )
            })?;
        }
        match record.http.as_ref().and_then(|h| h.auth_ref.as_deref()) {
            Some(auth_ref) => self.auth.check_binding(auth_ref, &record.server_id, url),
            None => Ok(()),
        }
    }
}
