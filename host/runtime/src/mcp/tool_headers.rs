//! Why a listed tool's `x-mcp-header` declarations (SEP-2243) are invalid, for the decision
//! log. rmcp's Streamable HTTP transport leaves such a tool out of `tools/list` at
//! 2026-07-28 (with its own check, which it does not export); [`AuthedClient`] runs this
//! one on the listing as it arrives, so the pool can say which tools rmcp dropped and why.
//! The pool only reports tools that really are missing from what rmcp returned, so the two
//! checks differing at most changes a reason's wording, never what is offered.
//!
//! [`AuthedClient`]: super::http::AuthedClient

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use rmcp::model::{JsonObject, ListToolsResult};
use serde_json::Value;

use crate::defaults;
use crate::text::cut;

/// Tools of one connection whose declarations were found invalid, by name, with the reason;
/// filled by the transport, drained by the pool after each listing. Bounded by
/// [`defaults::MAX_LEFT_OUT_TOOLS`] entries.
#[derive(Clone, Default)]
pub(crate) struct LeftOut(Arc<Mutex<BTreeMap<String, String>>>);

impl LeftOut {
    /// Notes the tools of `list` whose declarations are invalid.
    pub(crate) fn check(&self, list: &ListToolsResult) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for tool in &list.tools {
            if seen.len() >= defaults::MAX_LEFT_OUT_TOOLS {
                return;
            }
            if let Err(reason) = check_declarations(&tool.input_schema) {
                let name = cut(&tool.name, defaults::MAX_TOOL_NAME_BYTES).to_owned();
                seen.insert(name, reason);
            }
        }
    }

    /// The noted tools `listed` lacks (those rmcp left out), each with its reason; the
    /// record starts afresh.
    pub(crate) fn missing_from(&self, listed: &[rmcp::model::Tool]) -> Vec<(String, String)> {
        let seen = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        seen.into_iter()
            .filter(|(name, _)| !listed.iter().any(|tool| tool.name == *name))
            .collect()
    }
}

/// RFC 9110 token characters.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// `Err(reason)` when `schema`'s `x-mcp-header` declarations break SEP-2243: each must be a
/// non-empty HTTP token, unique in any case, on a `string`, `integer` or `boolean` property
/// reached from the root through `properties` alone.
pub(crate) fn check_declarations(schema: &JsonObject) -> Result<(), String> {
    if schema.contains_key("x-mcp-header") {
        return Err("x-mcp-header on the schema root, not on a property".into());
    }
    let mut names = HashSet::new();
    walk(schema, "", true, &mut names)
}

fn walk(
    schema: &JsonObject,
    path: &str,
    on_path: bool,
    names: &mut HashSet<String>,
) -> Result<(), String> {
    for (key, value) in schema {
        match key.as_str() {
            "x-mcp-header" if !on_path => {
                return Err(format!(
                    "x-mcp-header inside `{path}` is not on a `properties` path from the root"
                ));
            }
            "properties" => {
                let Some(properties) = value.as_object() else {
                    continue;
                };
                for (name, property) in properties {
                    let Some(property) = property.as_object() else {
                        continue;
                    };
                    let at = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}.{name}")
                    };
                    if on_path && let Some(header) = property.get("x-mcp-header") {
                        check_one(&at, header, property, names)?;
                    }
                    walk(property, &at, on_path, names)?;
                }
            }
            // Instance data, not schemas.
            "default" | "const" | "enum" | "examples" => {}
            _ => nested(value, path, names)?,
        }
    }
    Ok(())
}

/// Any schema below a keyword other than `properties`: no declaration may sit there.
fn nested(value: &Value, path: &str, names: &mut HashSet<String>) -> Result<(), String> {
    match value {
        Value::Object(schema) => walk(schema, path, false, names),
        Value::Array(items) => items.iter().try_for_each(|v| nested(v, path, names)),
        _ => Ok(()),
    }
}

fn check_one(
    at: &str,
    header: &Value,
    property: &JsonObject,
    names: &mut HashSet<String>,
) -> Result<(), String> {
    let Value::String(header) = header else {
        return Err(format!("property `{at}`: x-mcp-header is not a string"));
    };
    if header.is_empty() {
        return Err(format!("property `{at}`: x-mcp-header is empty"));
    }
    if !header.chars().all(is_tchar) {
        return Err(format!(
            "property `{at}`: x-mcp-header {:?} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~ only)",
            cut(header, 64)
        ));
    }
    if !names.insert(header.to_ascii_lowercase()) {
        return Err(format!(
            "property `{at}`: x-mcp-header {header:?} is declared twice (names are compared in any case)"
        ));
    }
    match property.get("type").and_then(Value::as_str) {
        Some("string" | "integer" | "boolean") => Ok(()),
        other => Err(format!(
            "property `{at}`: x-mcp-header is only for string, integer or boolean properties, not {}",
            other.map_or_else(
                || "an untyped one".to_owned(),
                |t| format!("`{}`", cut(t, 32))
            )
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(schema: Value) -> Result<(), String> {
        check_declarations(schema.as_object().unwrap())
    }

    fn property(p: Value) -> Value {
        json!({"type": "object", "properties": {"p": p}})
    }

    #[test]
    fn the_conformance_suites_invalid_declarations_are_each_refused() {
        for (bad, rule) in [
            (
                property(json!({"type": "string", "x-mcp-header": ""})),
                "empty",
            ),
            (
                property(json!({"type": "object", "x-mcp-header": "D"})),
                "not `object`",
            ),
            (
                property(json!({"type": "array", "x-mcp-header": "I"})),
                "not `array`",
            ),
            (
                property(json!({"type": "null", "x-mcp-header": "N"})),
                "not `null`",
            ),
            (
                property(json!({"type": "number", "x-mcp-header": "S"})),
                "not `number`",
            ),
            (
                property(json!({"type": "string", "x-mcp-header": "My Region"})),
                "HTTP token",
            ),
            (
                property(json!({"type": "string", "x-mcp-header": "Region:Primary"})),
                "HTTP token",
            ),
            (
                property(json!({"type": "string", "x-mcp-header": "Région"})),
                "HTTP token",
            ),
            (
                property(json!({"type": "string", "x-mcp-header": "Region\t1"})),
                "HTTP token",
            ),
            (
                property(json!({"type": "string", "x-mcp-header": 7})),
                "not a string",
            ),
            (
                json!({"type": "object", "properties": {
                    "a": {"type": "string", "x-mcp-header": "MyField"},
                    "b": {"type": "string", "x-mcp-header": "myfield"}}}),
                "declared twice",
            ),
            (
                json!({"type": "object", "x-mcp-header": "Root"}),
                "schema root",
            ),
            (
                json!({"type": "object", "$defs": {"d": {"type": "string", "x-mcp-header": "D"}}}),
                "not on a `properties` path",
            ),
            (
                property(json!({"anyOf": [{"type": "string", "x-mcp-header": "A"}]})),
                "not on a `properties` path",
            ),
        ] {
            let reason = check(bad.clone()).expect_err(&bad.to_string());
            assert!(reason.contains(rule), "{bad}: {reason}");
        }
    }

    #[test]
    fn valid_declarations_and_instance_data_pass() {
        check(json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "Priority"},
            "v": {"type": "boolean", "x-mcp-header": "Verbose", "default": {"x-mcp-header": 1}},
            "nested": {"type": "object", "properties": {
                "deep": {"type": "string", "x-mcp-header": "Deep"}}},
            "plain": {"type": "number"}}}))
        .unwrap();
        check(json!({"type": "object"})).unwrap();
    }

    #[test]
    fn the_record_is_bounded_and_reports_only_what_the_listing_lacks() {
        let bad = |name: &str| {
            serde_json::from_value::<rmcp::model::Tool>(json!({"name": name,
                "inputSchema": property(json!({"type": "object", "x-mcp-header": "X"}))}))
            .unwrap()
        };
        let left = LeftOut::default();
        let tools: Vec<_> = (0..defaults::MAX_LEFT_OUT_TOOLS + 5)
            .map(|i| bad(&format!("t{i}")))
            .collect();
        left.check(&ListToolsResult::with_all_items(tools));
        let kept = [bad("t0")];
        let missing = left.missing_from(&kept);
        assert_eq!(missing.len(), defaults::MAX_LEFT_OUT_TOOLS - 1);
        assert!(missing.iter().all(|(name, _)| name != "t0"));
        assert!(left.missing_from(&[]).is_empty(), "drained");
    }
}
