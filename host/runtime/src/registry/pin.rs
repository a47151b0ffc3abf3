//! Tool-definition pins: a record's `pins` table holds, per tool, a digest of the tool's
//! definition as the operator approved it, so a server that changes a tool afterwards (a
//! "rug pull") has that tool refused until an operator pins it again.
//!
//! The digest ([`tool_digest`]) is `sha256:` and the lowercase hex SHA-256 of the RFC 8785
//! (JSON Canonicalization Scheme) form of a JSON object holding exactly the tool's `name`,
//! `description`, `inputSchema`, `outputSchema` and `annotations` as the server listed them
//! in `tools/list` (MCP field names; an absent field is left out, never `null`). Any tool
//! that can canonicalize JSON computes the same digest, e.g.
//! `jq -c '{name,description,inputSchema,outputSchema,annotations} | with_entries(select(.value != null))'`
//! piped through an RFC 8785 canonicalizer and `sha256sum`.

use std::collections::BTreeMap;

use rmcp::model::Tool;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::store::DocFormat;

/// The prefix of every pin; the only algorithm this host computes.
pub const PIN_ALGORITHM: &str = "sha256:";

/// The fields of a tool definition a pin covers, in MCP's spelling.
const PINNED_FIELDS: [&str; 5] = [
    "name",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// The pin of `tool`'s current definition: `sha256:<64 lowercase hex digits>`.
pub fn tool_digest(tool: &Tool) -> String {
    let value = serde_json::to_value(tool).unwrap_or(Value::Null);
    let mut pinned = serde_json::Map::new();
    if let Value::Object(fields) = value {
        for field in PINNED_FIELDS {
            if let Some(v) = fields.get(field).filter(|v| !v.is_null()) {
                pinned.insert(field.to_owned(), v.clone());
            }
        }
    }
    // Cannot fail for a `Value` (string keys, finite numbers only).
    let text = serde_json_canonicalizer::to_vec(&Value::Object(pinned)).unwrap_or_default();
    let digest = Sha256::digest(&text);
    let mut out = String::with_capacity(PIN_ALGORITHM.len() + 64);
    out.push_str(PIN_ALGORITHM);
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Whether `pin` is written as this host writes pins (so a typo is an error at load, not
/// a tool that never matches).
pub fn is_valid_pin(pin: &str) -> bool {
    pin.strip_prefix(PIN_ALGORITHM).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// `text`, a server record written as `format`, with its `pins` table replaced by `pins`
/// and everything else kept as written (TOML comments and order included; a JSON record
/// is re-indented). What `quiver registry pin` and the admin API's pin endpoint write.
pub fn with_pins(
    format: DocFormat,
    text: &str,
    pins: &BTreeMap<String, String>,
) -> Result<String, String> {
    match format {
        DocFormat::Toml => {
            let mut doc: toml_edit::DocumentMut =
                text.parse().map_err(|e| format!("invalid TOML: {e}"))?;
            let mut table = toml_edit::Table::new();
            for (tool, pin) in pins {
                table.insert(tool, toml_edit::value(pin.as_str()));
            }
            doc.insert("pins", toml_edit::Item::Table(table));
            Ok(doc.to_string())
        }
        DocFormat::Json => {
            let mut value: Value =
                crate::json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
            let object = value
                .as_object_mut()
                .ok_or_else(|| "the record is not a JSON object".to_owned())?;
            object.insert("pins".into(), serde_json::json!(pins));
            let mut out = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
            out.push('\n');
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_covers_exactly_the_pinned_fields() {
        let tool: Tool = serde_json::from_value(serde_json::json!({
            "name": "echo",
            "description": "Echo",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        }))
        .unwrap();
        let pin = tool_digest(&tool);
        assert!(is_valid_pin(&pin), "{pin}");
        // The canonical text, hashed by hand: what another tool computes.
        let text = r#"{"description":"Echo","inputSchema":{"properties":{"text":{"type":"string"}},"type":"object"},"name":"echo"}"#;
        let expected: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(pin, format!("sha256:{expected}"));
        let mut titled = tool.clone();
        titled.title = Some("Not pinned".into());
        assert_eq!(tool_digest(&titled), pin, "the title is not pinned");
        let mut changed = tool;
        changed.description = Some("Echo, and send the text elsewhere".into());
        assert_ne!(tool_digest(&changed), pin);
    }

    #[test]
    fn pins_are_checked_for_their_syntax() {
        assert!(is_valid_pin(&format!("sha256:{}", "a".repeat(64))));
        for bad in [
            "",
            "sha256:",
            "md5:0123",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}", "a".repeat(63)),
            &format!("sha256:{}", "g".repeat(64)),
            &"a".repeat(71),
        ] {
            assert!(!is_valid_pin(bad), "{bad}");
        }
    }
}
