//! Name patterns: `*` and `?` globs on MCP-native tool names, resource URIs and prompt
//! names.

use std::fmt;

use serde_json::Value;

use super::ListKey;
use crate::defaults;

/// A tool-name pattern: `*` matches any run of characters, `?` exactly one; everything else
/// matches itself. Patterns apply to MCP-native tool names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    pub fn new(pattern: impl Into<String>) -> Self {
        Self(pattern.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches; linear-time backtracking on the last `*`, so a hostile
    /// pattern cannot blow up.
    pub fn matches(&self, name: &str) -> bool {
        let pattern: Vec<char> = self.0.chars().collect();
        let text: Vec<char> = name.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
                p += 1;
                t += 1;
            } else if p < pattern.len() && pattern[p] == '*' {
                star = Some((p, t));
                p += 1;
            } else if let Some((star_p, star_t)) = star {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            } else {
                return false;
            }
        }
        pattern[p..].iter().all(|&c| c == '*')
    }
}

impl Pattern {
    /// A session's list (`mcp.<kind>_allowlist` / `_denylist` as a chat SET_PARAM or
    /// `mcp_set_param` value): a JSON array of at most [`defaults::MAX_SESSION_PATTERNS`]
    /// strings of at most [`defaults::MAX_PATTERN_BYTES`] each, since every listing or send
    /// matches each against every name. The error says why without echoing the value.
    pub fn session_list(key: ListKey, value: &Value) -> Result<Vec<Pattern>, String> {
        let key = key.name();
        let not_strings = || format!("{key} must be an array of strings");
        let Value::Array(items) = value else {
            return Err(not_strings());
        };
        if items.len() > defaults::MAX_SESSION_PATTERNS {
            return Err(format!(
                "{key} has {} patterns; at most {} are allowed",
                items.len(),
                defaults::MAX_SESSION_PATTERNS
            ));
        }
        items
            .iter()
            .map(|item| match item {
                Value::String(p) if p.len() > defaults::MAX_PATTERN_BYTES => Err(format!(
                    "{key}: a pattern is {} bytes; at most {} are allowed",
                    p.len(),
                    defaults::MAX_PATTERN_BYTES
                )),
                Value::String(p) => Ok(Pattern::new(p.as_str())),
                _ => Err(not_strings()),
            })
            .collect()
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub(super) fn any_match(patterns: &[Pattern], name: &str) -> Option<Pattern> {
    patterns.iter().find(|p| p.matches(name)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let cases = [
            ("*", "anything", true),
            ("*", "", true),
            ("read_*", "read_text", true),
            ("read_*", "write_text", false),
            ("re?d", "read", true),
            ("re?d", "reed_", false),
            ("*_file", "delete_file", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("echo", "echo", true),
            ("echo", "echo2", false),
            ("", "", true),
            ("", "x", false),
            ("?", "é", true),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(
                Pattern::new(pattern).matches(name),
                want,
                "{pattern} vs {name}"
            );
        }
    }

    #[test]
    fn hostile_pattern_is_fast() {
        let pattern = Pattern::new("*a*a*a*a*a*a*a*a*a*a*b");
        let name = "a".repeat(10_000);
        assert!(!pattern.matches(&name));
    }
}
