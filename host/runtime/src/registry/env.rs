//! `${ENV:VAR}` and `${ENV:VAR:-default}` references in registry values.
//!
//! Only `${ENV:` starts a reference; any other `$` is literal, so shell-like arguments pass
//! through untouched. A reference without a default whose variable is unset is an error the
//! registry turns into "server unavailable", never a host failure.

use std::fmt;

/// Looks a variable up; the registry passes the process environment, tests pass a map.
pub type EnvLookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvRefError {
    /// `${ENV:` without a closing `}` or with an invalid variable name.
    Malformed(String),
    /// A required variable is not set.
    Missing(String),
}

impl std::error::Error for EnvRefError {}

impl fmt::Display for EnvRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvRefError::Malformed(why) => write!(f, "malformed environment reference: {why}"),
            EnvRefError::Missing(var) => write!(
                f,
                "environment variable `{var}` is not set (set it, or write ${{ENV:{var}:-default}})"
            ),
        }
    }
}

const OPEN: &str = "${ENV:";

/// Splits `${ENV:NAME}` / `${ENV:NAME:-default}` at the start of `rest` (just after the
/// opening) into (name, default, bytes consumed).
fn parse_ref(rest: &str) -> Result<(&str, Option<&str>, usize), EnvRefError> {
    let end = rest
        .find('}')
        .ok_or_else(|| EnvRefError::Malformed(format!("no closing `}}` after `{OPEN}{rest}`")))?;
    let body = &rest[..end];
    let (name, default) = match body.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (body, None),
    };
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(EnvRefError::Malformed(format!(
            "`{name}` is not a variable name (letters, digits and `_`)"
        )));
    }
    Ok((name, default, end + 1))
}

/// Checks the syntax of every reference in `raw` without resolving anything.
pub fn check_refs(raw: &str) -> Result<(), EnvRefError> {
    expand(raw, &|_| Some(String::new())).map(|_| ())
}

/// Resolves every reference in `raw`.
pub fn expand(raw: &str, env: &EnvLookup<'_>) -> Result<String, EnvRefError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        let (name, default, used) = parse_ref(&rest[start + OPEN.len()..])?;
        match (env(name), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => return Err(EnvRefError::Missing(name.to_owned())),
        }
        rest = &rest[start + OPEN.len() + used..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    #[test]
    fn expands_required_and_defaulted_references() {
        assert_eq!(
            expand("Bearer ${ENV:TOKEN}", &env).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(
            expand("${ENV:NOPE:-fallback}/x", &env).unwrap(),
            "fallback/x"
        );
        assert_eq!(expand("${ENV:NOPE:-}", &env).unwrap(), "");
        assert_eq!(
            expand("$HOME ${HOME} $$", &env).unwrap(),
            "$HOME ${HOME} $$"
        );
        assert_eq!(
            expand("${ENV:TOKEN}${ENV:TOKEN}", &env).unwrap(),
            "s3crets3cret"
        );
    }

    #[test]
    fn missing_and_malformed_are_distinct() {
        assert_eq!(
            expand("${ENV:NOPE}", &env),
            Err(EnvRefError::Missing("NOPE".into()))
        );
        assert!(matches!(
            expand("${ENV:TOKEN", &env),
            Err(EnvRefError::Malformed(_))
        ));
        assert!(matches!(
            expand("${ENV:}", &env),
            Err(EnvRefError::Malformed(_))
        ));
        assert!(matches!(
            expand("${ENV:1X}", &env),
            Err(EnvRefError::Malformed(_))
        ));
        assert!(matches!(
            check_refs("${ENV:A B}"),
            Err(EnvRefError::Malformed(_))
        ));
        assert!(check_refs("${ENV:ANY}").is_ok());
    }
}
