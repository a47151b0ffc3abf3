//! JSON Schema reduced to the OpenAPI subset Gemini's `parameters` take.
//!
//! Kept: `type` (upper case; `["T", "null"]` as `T` with `nullable`, several types as
//! `anyOf`), `description`, `title`, `nullable`, string `enum`s (`const` as a one-value
//! enum), `format` where Gemini knows it, `properties`, `required` (only names of
//! properties), `items`, `anyOf` (`oneOf` as `anyOf`, a one-schema `allOf` inlined), and
//! the numeric, length and item-count bounds. Local `$ref`s (`#/$defs/..`,
//! `#/definitions/..`) are inlined. Dropped, since Gemini would refuse them and the model
//! needs them least: `additionalProperties`, `default`, `examples`, `$schema`, exclusive
//! bounds, non-string enums (their values go to the description) and the like.
//!
//! What cannot be expressed is an error naming the path: a recursive or non-local `$ref`,
//! an `allOf` of several schemas, `not`, a schema of any type (`{}` or `true`), an array
//! without `items`, a nested object without properties (Gemini needs at least one),
//! nesting deeper than [`MAX_DEPTH`], or `$ref`s that inline to more than
//! [`MAX_INLINED_BYTES`].

use serde_json::{Map, Value, json};

/// Nesting a reduced schema may have; deeper is an error, not a stack overflow.
const MAX_DEPTH: usize = 64;

/// Schemas one reduction visits at most: inlined `$ref`s may fan out exponentially.
const MAX_NODES: usize = 10_000;

/// JSON bytes the inlined `$ref`s of one schema may add up to. A definition is copied at
/// each use, so a few small bytes of `$ref`s can ask for gigabytes; a node count alone
/// does not bound that (one definition may hold a megabyte of description).
const MAX_INLINED_BYTES: u64 = 256 * 1024;

/// Where a reduction is: the `$ref`s being inlined (for recursion), the schemas seen and
/// the bytes inlined so far.
#[derive(Default)]
struct Walk {
    refs: Vec<String>,
    nodes: usize,
    inlined_bytes: u64,
}

/// Formats Gemini takes, by type.
const FORMATS: &[(&str, &[&str])] = &[
    ("STRING", &["enum", "date-time"]),
    ("NUMBER", &["float", "double"]),
    ("INTEGER", &["int32", "int64"]),
];

/// A tool's `parameters` as Gemini takes them; `None` for a function without parameters
/// (an object schema without properties, which Gemini refuses as `parameters`).
pub(super) fn parameters(schema: &Value) -> Result<Option<Value>, String> {
    let root = schema;
    let reduced = match schema {
        Value::Object(map) if map.get("properties").is_none_or(is_empty_object) => {
            // An object of no properties: whatever else it says, the function takes none.
            if map.get("type").is_none_or(|t| t == "object") {
                return Ok(None);
            }
            reduce(schema, root, "", &mut Walk::default())?
        }
        Value::Null => return Ok(None),
        _ => reduce(schema, root, "", &mut Walk::default())?,
    };
    Ok(Some(reduced))
}

/// A response schema (`response_format`'s) as Gemini takes it.
pub(super) fn response_schema(schema: &Value) -> Result<Value, String> {
    reduce(schema, schema, "", &mut Walk::default())
}

fn is_empty_object(value: &Value) -> bool {
    value.as_object().is_some_and(Map::is_empty)
}

fn at(path: &str) -> &str {
    if path.is_empty() {
        "the top level"
    } else {
        path
    }
}

/// `schema` at `path` reduced.
fn reduce(schema: &Value, root: &Value, path: &str, walk: &mut Walk) -> Result<Value, String> {
    if walk.refs.len() + path.matches('.').count() > MAX_DEPTH {
        return Err(format!(
            "{}: nested deeper than {MAX_DEPTH} levels",
            at(path)
        ));
    }
    walk.nodes += 1;
    if walk.nodes > MAX_NODES {
        return Err(format!(
            "{}: more than {MAX_NODES} schemas once its `$ref`s are inlined",
            at(path)
        ));
    }
    let Value::Object(map) = schema else {
        return Err(format!(
            "{}: a schema of any value (`{schema}`) has no type Gemini can express",
            at(path)
        ));
    };
    if let Some(reference) = map.get("$ref") {
        let reference = reference.as_str().unwrap_or_default();
        let target = reference
            .strip_prefix("#/$defs/")
            .map(|name| &root["$defs"][name])
            .or_else(|| {
                reference
                    .strip_prefix("#/definitions/")
                    .map(|name| &root["definitions"][name])
            })
            .filter(|target| !target.is_null())
            .ok_or_else(|| {
                format!(
                    "{}: `$ref` {reference:?} is not a local definition",
                    at(path)
                )
            })?;
        if walk.refs.iter().any(|r| r == reference) {
            return Err(format!(
                "{}: `$ref` {reference:?} is recursive, which Gemini cannot express",
                at(path)
            ));
        }
        walk.refs.push(reference.to_owned());
        let mut inlined = reduce(target, root, path, walk)?;
        walk.refs.pop();
        // Counted as each use returns, inner uses first: what is held never passes the cap
        // by more than one definition's own (input-bounded) size.
        walk.inlined_bytes = walk
            .inlined_bytes
            .saturating_add(crate::sandbox::heap::json_len(&inlined));
        if walk.inlined_bytes > MAX_INLINED_BYTES {
            return Err(format!(
                "{}: its `$ref`s inline to more than {} KiB of schema",
                at(path),
                MAX_INLINED_BYTES / 1024
            ));
        }
        // A description beside the `$ref` describes this use of it.
        if let Some(description) = map.get("description").and_then(Value::as_str) {
            inlined["description"] = json!(description);
        }
        return Ok(inlined);
    }
    if map.contains_key("not") {
        return Err(format!("{}: `not` cannot be expressed", at(path)));
    }
    if let Some(all) = map.get("allOf") {
        let [only] = all.as_array().map_or(&[][..], Vec::as_slice) else {
            return Err(format!(
                "{}: an `allOf` of several schemas cannot be expressed",
                at(path)
            ));
        };
        // The one schema, described as this use of it describes it.
        let mut out = reduce(only, root, path, walk)?;
        for key in ["description", "title"] {
            if let Some(text) = map.get(key).filter(|v| v.is_string()) {
                out[key] = text.clone();
            }
        }
        return Ok(out);
    }
    let mut out = Map::new();
    for key in ["description", "title"] {
        if let Some(text) = map.get(key).filter(|v| v.is_string()) {
            out.insert(key.into(), text.clone());
        }
    }
    if let Some(any) = map.get("anyOf").or_else(|| map.get("oneOf")) {
        let schemas = any.as_array().map_or(&[][..], Vec::as_slice);
        let mut reduced = Vec::new();
        let mut nullable = false;
        for (i, schema) in schemas.iter().enumerate() {
            if schema["type"] == "null" {
                nullable = true;
                continue;
            }
            reduced.push(reduce(schema, root, &format!("{path}.anyOf[{i}]"), walk)?);
        }
        match reduced.len() {
            0 => return Err(format!("{}: an `anyOf` of no types", at(path))),
            1 => {
                let only = reduced.remove(0);
                for (key, value) in only.as_object().into_iter().flatten() {
                    out.entry(key.clone()).or_insert(value.clone());
                }
            }
            _ => {
                out.insert("anyOf".into(), Value::Array(reduced));
            }
        }
        if nullable {
            out.insert("nullable".into(), json!(true));
        }
        return Ok(Value::Object(out));
    }
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).collect(),
        _ if map.contains_key("properties") => vec!["object"],
        _ if map.contains_key("items") => vec!["array"],
        _ if map.get("const").is_some_and(Value::is_string)
            || map
                .get("enum")
                .and_then(Value::as_array)
                .is_some_and(|e| e.iter().all(Value::is_string)) =>
        {
            vec!["string"]
        }
        _ => {
            return Err(format!(
                "{}: a schema without a `type` (any value) cannot be expressed",
                at(path)
            ));
        }
    };
    let nullable = types.contains(&"null") || map.get("nullable") == Some(&json!(true));
    let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
    if nullable {
        out.insert("nullable".into(), json!(true));
    }
    match types.as_slice() {
        [] => Err(format!(
            "{}: a schema of only `null` cannot be expressed",
            at(path)
        )),
        [kind] => {
            typed(kind, map, root, path, walk, &mut out)?;
            Ok(Value::Object(out))
        }
        several => {
            let mut any = Vec::new();
            for kind in several {
                let mut one = Map::new();
                typed(kind, map, root, path, walk, &mut one)?;
                any.push(Value::Object(one));
            }
            out.insert("anyOf".into(), Value::Array(any));
            Ok(Value::Object(out))
        }
    }
}

/// Fills `out` with what a schema of type `kind` keeps of `map`.
fn typed(
    kind: &str,
    map: &Map<String, Value>,
    root: &Value,
    path: &str,
    walk: &mut Walk,
    out: &mut Map<String, Value>,
) -> Result<(), String> {
    let upper = match kind {
        "string" => "STRING",
        "number" => "NUMBER",
        "integer" => "INTEGER",
        "boolean" => "BOOLEAN",
        "array" => "ARRAY",
        "object" => "OBJECT",
        other => {
            let other: String = other.chars().take(32).collect();
            return Err(format!(
                "{}: type {other:?} is not a JSON Schema type",
                at(path)
            ));
        }
    };
    out.insert("type".into(), json!(upper));
    let enumerated = map
        .get("enum")
        .and_then(Value::as_array)
        .cloned()
        .or_else(|| map.get("const").map(|c| vec![c.clone()]));
    if let Some(values) = enumerated {
        if upper == "STRING" && values.iter().all(Value::is_string) {
            out.insert("enum".into(), Value::Array(values));
        } else {
            // Gemini's enums are strings: other values are told, not enforced.
            let listed: Vec<String> = values.iter().map(Value::to_string).collect();
            let note = format!("One of: {}.", listed.join(", "));
            let description = match out.get("description").and_then(Value::as_str) {
                Some(text) => format!("{text} {note}"),
                None => note,
            };
            out.insert("description".into(), json!(description));
        }
    }
    if let Some(format) = map.get("format").and_then(Value::as_str)
        && FORMATS
            .iter()
            .any(|(t, formats)| *t == upper && formats.contains(&format))
    {
        out.insert("format".into(), json!(format));
    }
    let bounds: &[&str] = match upper {
        "STRING" => &["minLength", "maxLength", "pattern"],
        "NUMBER" | "INTEGER" => &["minimum", "maximum"],
        "ARRAY" => &["minItems", "maxItems"],
        _ => &[],
    };
    for bound in bounds {
        if let Some(value) = map.get(*bound).filter(|v| v.is_number() || v.is_string()) {
            out.insert((*bound).into(), value.clone());
        }
    }
    match upper {
        "ARRAY" => {
            let items = map.get("items").ok_or_else(|| {
                format!("{}: an array without `items` cannot be expressed", at(path))
            })?;
            out.insert(
                "items".into(),
                reduce(items, root, &format!("{path}.items"), walk)?,
            );
        }
        "OBJECT" => {
            let properties = map.get("properties").and_then(Value::as_object);
            let Some(properties) = properties.filter(|p| !p.is_empty()) else {
                return Err(format!(
                    "{}: an object without properties cannot be expressed (Gemini needs at least one)",
                    at(path)
                ));
            };
            let mut reduced = Map::new();
            for (name, schema) in properties {
                reduced.insert(
                    name.clone(),
                    reduce(schema, root, &format!("{path}.{name}"), walk)?,
                );
            }
            let required: Vec<&Value> = map
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|name| name.as_str().is_some_and(|n| reduced.contains_key(n)))
                .collect();
            out.insert("properties".into(), Value::Object(reduced));
            if !required.is_empty() {
                out.insert("required".into(), json!(required));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schema_is_reduced_to_what_gemini_takes() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "city": {"type": "string", "format": "uri", "minLength": 1},
                "when": {"type": ["string", "null"], "format": "date-time"},
                "unit": {"const": "c"},
                "level": {"type": "integer", "enum": [1, 2], "description": "How loud."},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
                "either": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]},
                "where": {"allOf": [{"$ref": "#/$defs/Tag"}], "description": "Place."},
            },
            "required": ["city", "ghost"],
            "$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string"}}}},
        });
        let reduced = parameters(&schema).unwrap().unwrap();
        assert_eq!(
            reduced,
            json!({
                "type": "OBJECT",
                "properties": {
                    "city": {"type": "STRING", "minLength": 1},
                    "when": {"type": "STRING", "nullable": true, "format": "date-time"},
                    "unit": {"type": "STRING", "enum": ["c"]},
                    "level": {"type": "INTEGER", "description": "How loud. One of: 1, 2."},
                    "tags": {"type": "ARRAY", "items": {"type": "OBJECT", "properties": {"name": {"type": "STRING"}}}},
                    "either": {"anyOf": [{"type": "STRING"}, {"type": "NUMBER"}], "nullable": true},
                    "where": {"description": "Place.", "type": "OBJECT", "properties": {"name": {"type": "STRING"}}},
                },
                "required": ["city"],
            })
        );
        assert_eq!(parameters(&json!({"type": "object"})).unwrap(), None);
        assert_eq!(
            parameters(&json!({"type": "object", "properties": {}})).unwrap(),
            None
        );
    }

    #[test]
    fn what_gemini_cannot_express_is_an_error_naming_the_path() {
        for (schema, expected) in [
            (
                json!({"type": "object", "properties": {"node": {"$ref": "#/$defs/Node"}},
                       "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}}),
                ".node.next: `$ref` \"#/$defs/Node\" is recursive",
            ),
            (
                json!({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}),
                ".x: `$ref` \"https://example.com/s.json\" is not a local definition",
            ),
            (
                json!({"type": "object", "properties": {"meta": {"type": "object"}}}),
                ".meta: an object without properties",
            ),
            (
                json!({"type": "object", "properties": {"list": {"type": "array"}}}),
                ".list: an array without `items`",
            ),
            (
                json!({"type": "object", "properties": {"any": {}}}),
                ".any: a schema without a `type`",
            ),
            (
                json!({"type": "object", "properties": {"x": {"allOf": [{"type": "string"}, {"minLength": 2}]}}}),
                ".x: an `allOf` of several schemas",
            ),
        ] {
            let error = parameters(&schema).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
        }
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(parameters(&deep).unwrap_err().contains("nested deeper"));
        // Each definition uses the next twice: 2^20 schemas once inlined.
        let mut defs = serde_json::Map::new();
        for i in 0..20 {
            defs.insert(
                format!("D{i}"),
                json!({"type": "object", "properties": {
                    "l": {"$ref": format!("#/$defs/D{}", i + 1)},
                    "r": {"$ref": format!("#/$defs/D{}", i + 1)}}}),
            );
        }
        defs.insert("D20".into(), json!({"type": "string"}));
        let wide =
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs});
        let error = parameters(&wide).unwrap_err();
        assert!(
            error.contains("`$ref`s inline") || error.contains("schemas once"),
            "{error}"
        );
        // Few schemas, but one definition of 100 KB used three times.
        let big = "d".repeat(100_000);
        let fan = json!({"type": "object",
            "properties": {"a": {"$ref": "#/$defs/B"}, "b": {"$ref": "#/$defs/B"}, "c": {"$ref": "#/$defs/B"}},
            "$defs": {"B": {"type": "string", "description": big}}});
        let error = parameters(&fan).unwrap_err();
        assert!(
            error.starts_with(".c: its `$ref`s inline to more than 256 KiB"),
            "{error}"
        );
        let two = json!({"type": "object",
            "properties": {"a": {"$ref": "#/$defs/B"}, "b": {"$ref": "#/$defs/B"}},
            "$defs": {"B": {"type": "string", "description": "d".repeat(100_000)}}});
        assert!(
            parameters(&two).is_ok(),
            "200 KB of inlined schema is allowed"
        );
    }
}
