//! `[mcp.launch]`: which stdio commands records may run, from which working directories,
//! and which host variables `${ENV:..}` references and `stdio.env_from` may read. The
//! default allows none; `quiver serve` keeps it unless the operator lists them
//! (docs/registry.md "What a record may run and reach").

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde::Deserialize;

use crate::policy::Pattern;
use crate::registry::{RecordRules, RuleViolation, ServerRecord, expand};

/// `[mcp.launch]` of the host config. Patterns take `*` (any run of characters) and `?`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LaunchConfig {
    /// Any command, directory and variable: for a registry only its operator writes.
    #[serde(default)]
    pub unrestricted: bool,
    /// Commands a stdio record may run, as written after `${ENV:..}` is resolved: exact
    /// absolute paths or patterns (`/opt/mcp/bin/*`).
    #[serde(default)]
    pub commands: Vec<String>,
    /// Working directories a stdio record may set (`stdio.cwd`), absolute paths or
    /// patterns; a record without `cwd` runs in the host's.
    #[serde(default)]
    pub cwd: Vec<String>,
    /// Host variables `${ENV:..}` references and `stdio.env_from` may read (`GITHUB_TOKEN`,
    /// `MCP_*`).
    #[serde(default)]
    pub env: Vec<String>,
}

/// Which commands, working directories and host variables records may use. The default
/// allows none: a record may still run with `unrestricted`, or with what the operator
/// lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchRules {
    unrestricted: bool,
    commands: Vec<Pattern>,
    cwd: Vec<Pattern>,
    env: Vec<Pattern>,
}

/// The launch rules alone (no egress or credential checks), e.g. to check records for a
/// host config's `[mcp.launch]` without a host.
impl RecordRules for LaunchRules {
    fn check_record(&self, record: &ServerRecord) -> Result<(), RuleViolation> {
        LaunchRules::check_record(self, record)
    }

    fn check_launch(
        &self,
        command: &str,
        cwd: Option<&str>,
        vars: &BTreeSet<String>,
    ) -> Result<(), RuleViolation> {
        LaunchRules::check_launch(self, command, cwd, vars)
    }
}

const FIX: &str = "(the host config, quiver.toml)";

impl LaunchRules {
    /// Any command, directory and variable (what a host did before the rules existed).
    pub fn unrestricted() -> Self {
        Self {
            unrestricted: true,
            ..Self::default()
        }
    }

    pub fn is_unrestricted(&self) -> bool {
        self.unrestricted
    }

    /// The rules `[mcp.launch]` says; the field at fault (`mcp.launch.*`) and the fix.
    pub fn from_config(config: &LaunchConfig) -> Result<Self, RuleViolation> {
        if config.unrestricted {
            let listed = [
                ("commands", &config.commands),
                ("cwd", &config.cwd),
                ("env", &config.env),
            ];
            if let Some((field, _)) = listed.iter().find(|(_, list)| !list.is_empty()) {
                return Err(RuleViolation::new(
                    format!("mcp.launch.{field}"),
                    "has no effect with unrestricted = true; drop one of them",
                ));
            }
            return Ok(Self::unrestricted());
        }
        let paths = |field: &str, list: &[String]| {
            list.iter()
                .map(|p| {
                    if p.starts_with('/') && !has_parent_dir(p) {
                        Ok(Pattern::new(p.as_str()))
                    } else {
                        Err(RuleViolation::new(
                            format!("mcp.launch.{field}"),
                            format!("{p:?} must be an absolute path (or pattern) without `..`"),
                        ))
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let env = config
            .env
            .iter()
            .map(|p| {
                let valid = !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'*' || b == b'?');
                if valid {
                    Ok(Pattern::new(p.as_str()))
                } else {
                    Err(RuleViolation::new(
                        "mcp.launch.env",
                        format!("{p:?} is not a variable name or pattern (letters, digits, `_`, `*`, `?`)"),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            unrestricted: false,
            commands: paths("commands", &config.commands)?,
            cwd: paths("cwd", &config.cwd)?,
            env,
        })
    }

    /// A record as written: its command and directory (when they hold no reference, else
    /// at launch) and every variable it reads. Nothing is resolved.
    pub fn check_record(&self, record: &ServerRecord) -> Result<(), RuleViolation> {
        if self.unrestricted {
            return Ok(());
        }
        // What would run first, then what it would read.
        if let Some(stdio) = &record.stdio {
            if !stdio.command.contains("${ENV:") {
                self.check_command(&stdio.command)?;
            }
            if let Some(cwd) = stdio.cwd.as_deref().filter(|c| !c.contains("${ENV:")) {
                self.check_cwd(cwd)?;
            }
            for var in &stdio.env_from {
                self.check_var("stdio.env_from", var)?;
            }
        }
        for (field, value) in written_values(record) {
            for var in referenced_vars(value) {
                self.check_var(&field, &var)?;
            }
        }
        Ok(())
    }

    /// What the stdio launcher is about to start: the resolved command and directory, and
    /// the host variables its record read.
    pub fn check_launch<'a>(
        &self,
        command: &str,
        cwd: Option<&str>,
        vars: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), RuleViolation> {
        if self.unrestricted {
            return Ok(());
        }
        for var in vars {
            self.check_var("stdio", var)?;
        }
        self.check_command(command)?;
        cwd.map_or(Ok(()), |cwd| self.check_cwd(cwd))
    }

    fn check_var(&self, field: &str, var: &str) -> Result<(), RuleViolation> {
        if self.env.iter().any(|p| p.matches(var)) {
            return Ok(());
        }
        Err(RuleViolation::new(
            field,
            format!(
                "may not read the host variable `{var}`: it is not in [mcp.launch] env; add it (or a pattern) there {FIX}, or drop the reference"
            ),
        ))
    }

    fn check_command(&self, command: &str) -> Result<(), RuleViolation> {
        if !has_parent_dir(command) && self.commands.iter().any(|p| p.matches(command)) {
            return Ok(());
        }
        Err(RuleViolation::new(
            "stdio.command",
            format!(
                "`{command}` is not an allowed command: list its absolute path (or a pattern) in [mcp.launch] commands {FIX}"
            ),
        ))
    }

    fn check_cwd(&self, cwd: &str) -> Result<(), RuleViolation> {
        if !has_parent_dir(cwd) && self.cwd.iter().any(|p| p.matches(cwd)) {
            return Ok(());
        }
        Err(RuleViolation::new(
            "stdio.cwd",
            format!(
                "`{cwd}` is not an allowed working directory: list it in [mcp.launch] cwd {FIX}, or drop stdio.cwd"
            ),
        ))
    }
}

/// A `..` component would let `/opt/mcp/*` reach any path.
fn has_parent_dir(path: &str) -> bool {
    path.split('/').any(|part| part == "..")
}

/// Every value of a record that may hold `${ENV:..}` references, with its field.
fn written_values(record: &ServerRecord) -> Vec<(String, &str)> {
    let mut values = Vec::new();
    if let Some(stdio) = &record.stdio {
        values.push(("stdio.command".to_owned(), stdio.command.as_str()));
        for (i, arg) in stdio.args.iter().enumerate() {
            values.push((format!("stdio.args[{i}]"), arg.as_str()));
        }
        for (key, value) in &stdio.env {
            values.push((format!("stdio.env.{key}"), value.as_str()));
        }
        if let Some(cwd) = &stdio.cwd {
            values.push(("stdio.cwd".to_owned(), cwd.as_str()));
        }
    }
    if let Some(http) = &record.http {
        values.push(("http.url".to_owned(), http.url.as_str()));
        for (key, value) in &http.headers {
            values.push((format!("http.headers.{key}"), value.as_str()));
        }
    }
    values
}

/// The variables `raw`'s references name (with or without a default); none when the
/// references are malformed (the record's own check reports those).
fn referenced_vars(raw: &str) -> BTreeSet<String> {
    let names = RefCell::new(BTreeSet::new());
    let _ = expand(raw, &|name: &str| {
        names.borrow_mut().insert(name.to_owned());
        Some(String::new())
    });
    names.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{HttpConfig, StdioConfig, Transport};

    fn rules(commands: &[&str], cwd: &[&str], env: &[&str]) -> LaunchRules {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        LaunchRules::from_config(&LaunchConfig {
            unrestricted: false,
            commands: list(commands),
            cwd: list(cwd),
            env: list(env),
        })
        .unwrap()
    }

    fn stdio(command: &str, env: &[(&str, &str)], env_from: &[&str]) -> ServerRecord {
        ServerRecord {
            stdio: Some(StdioConfig {
                command: command.into(),
                args: vec![],
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                env_from: env_from.iter().map(|s| s.to_string()).collect(),
                cwd: None,
                idle_timeout_ms: None,
            }),
            ..ServerRecord::for_tests("x")
        }
    }

    #[test]
    fn the_default_allows_no_command_and_no_variable() {
        let none = LaunchRules::default();
        let error = none.check_record(&stdio("/bin/sh", &[], &[])).unwrap_err();
        assert_eq!(error.field, "stdio.command");
        assert!(error.message.contains("[mcp.launch] commands"), "{error}");
        let error = rules(&["/bin/sh"], &[], &[])
            .check_record(&stdio(
                "/bin/sh",
                &[("A", "${ENV:QUIVER_ADMIN_TOKEN}")],
                &[],
            ))
            .unwrap_err();
        assert_eq!(error.field, "stdio.env.A");
        assert!(error.message.contains("`QUIVER_ADMIN_TOKEN`"), "{error}");
        let error = rules(&["/bin/sh"], &[], &[])
            .check_record(&stdio("/bin/sh", &[], &["AWS_SECRET_ACCESS_KEY"]))
            .unwrap_err();
        assert_eq!(error.field, "stdio.env_from");
        assert!(
            LaunchRules::unrestricted()
                .check_record(&stdio("/bin/sh", &[("A", "${ENV:ANY}")], &["B"]))
                .is_ok()
        );
    }

    #[test]
    fn listed_commands_directories_and_variables_pass_and_dot_dot_does_not() {
        let rules = rules(&["/opt/mcp/*"], &["/srv/mcp"], &["MCP_*", "GITHUB_TOKEN"]);
        let ok = stdio(
            "/opt/mcp/git",
            &[("T", "${ENV:GITHUB_TOKEN}"), ("D", "${ENV:MCP_DIR:-/x}")],
            &["MCP_HOME"],
        );
        rules.check_record(&ok).unwrap();
        let escape = stdio("/opt/mcp/../../bin/sh", &[], &[]);
        assert_eq!(
            rules.check_record(&escape).unwrap_err().field,
            "stdio.command"
        );
        let mut cwd = ok.clone();
        cwd.stdio.as_mut().unwrap().cwd = Some("/etc".into());
        assert_eq!(rules.check_record(&cwd).unwrap_err().field, "stdio.cwd");
        let http = ServerRecord {
            transport: Transport::StreamableHttp,
            http: Some(HttpConfig {
                url: "https://x.example/${ENV:HOME}".into(),
                headers: Default::default(),
                auth_ref: None,
            }),
            ..ServerRecord::for_tests("h")
        };
        assert_eq!(rules.check_record(&http).unwrap_err().field, "http.url");
        // At launch, the resolved command is checked whatever the record said.
        let read = ["MCP_HOME".to_owned()];
        rules.check_launch("/opt/mcp/git", None, &read).unwrap();
        assert!(rules.check_launch("/bin/sh", None, &read).is_err());
        let other = ["PATH_SECRET".to_owned()];
        assert!(rules.check_launch("/opt/mcp/git", None, &other).is_err());
    }

    #[test]
    fn bad_rules_name_the_field() {
        let relative = LaunchConfig {
            commands: vec!["node".into()],
            ..Default::default()
        };
        let error = LaunchRules::from_config(&relative).unwrap_err();
        assert_eq!(error.field, "mcp.launch.commands");
        let both = LaunchConfig {
            unrestricted: true,
            env: vec!["A".into()],
            ..Default::default()
        };
        assert_eq!(
            LaunchRules::from_config(&both).unwrap_err().field,
            "mcp.launch.env"
        );
        let bad_env = LaunchConfig {
            env: vec!["A-B".into()],
            ..Default::default()
        };
        assert_eq!(
            LaunchRules::from_config(&bad_env).unwrap_err().field,
            "mcp.launch.env"
        );
    }
}
