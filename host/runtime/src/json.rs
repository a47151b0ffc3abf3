//! Reading JSON that came from outside the host (guests, servers, models, approvers, stores,
//! HTTP clients).
//!
//! The build has serde_json's `raw_value` feature on: axum needs it, and MCP answers pass a
//! tool's result on unparsed through it. With it, serde_json reads an object whose key is
//! `$serde_json::private::RawValue` (spelled plainly or with `\u` escapes) as the JSON *text
//! in that key's string*, wherever a [`serde_json::Value`] is built. Outside text could so
//! hide any structure in one string: every bound that scans text before it is parsed counts
//! it as a string, and each such string starts a fresh nesting limit. Nothing legitimate
//! sends that key, so text holding it is refused before it is parsed. Every parse of outside
//! text into a type that holds a `Value` goes through [`from_slice`] or [`from_str`], or
//! calls [`refuse_raw_value_key`] first; a TOML record or profile goes through
//! [`from_toml`].
//!
//! serde_json's error for a string where a struct, list, number or boolean belongs quotes
//! the string whole, escaped (up to 3.5 bytes for each byte read), before anyone can cut
//! it: a model's 16 MiB answer could make the host build and drop over 100 MB it never
//! charged. Typed answers read such fields through [`Unquoted`] (and [`optional`],
//! [`list`]), whose error says only "string".

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{
    DeserializeOwned, Deserializer, Error as _, Expected, IntoDeserializer, MapAccess, SeqAccess,
    Unexpected, Visitor,
};

/// The key serde_json reserves for its raw values.
const RAW_VALUE_KEY: &[u8] = b"$serde_json::private::RawValue";

/// Why text holding that key is refused, as errors and logs say it.
pub(crate) const RESERVED: &str =
    "the key `$serde_json::private::RawValue` is reserved; this text is refused";

/// `$` escaped, the only other way a string can start with it.
static ESCAPED_DOLLAR: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(br"\u0024"));

/// Parses outside JSON `bytes`, refusing serde_json's reserved raw-value key.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    refuse_raw_value_key(bytes)?;
    serde_json::from_slice(bytes)
}

/// Parses outside JSON `text`, refusing serde_json's reserved raw-value key.
pub fn from_str<T: DeserializeOwned>(text: &str) -> serde_json::Result<T> {
    from_slice(text.as_bytes())
}

/// An error (of serde_json's data category) when `bytes` holds a string that reads as
/// serde_json's reserved raw-value key. A string holding only `\"` and then the key is
/// refused too: such text is not worth telling apart.
pub fn refuse_raw_value_key(bytes: &[u8]) -> serde_json::Result<()> {
    let plain = memchr::memchr_iter(b'$', bytes).filter(|&at| at > 0 && bytes[at - 1] == b'"');
    let escaped = ESCAPED_DOLLAR
        .find_iter(bytes)
        .filter(|&at| at > 0 && bytes[at - 1] == b'"');
    if plain
        .chain(escaped)
        .any(|at| is_raw_value_key(&bytes[at..]))
    {
        return Err(serde_json::Error::custom(RESERVED));
    }
    Ok(())
}

/// A TOML document (a registry record or profile) as a JSON value; the error is the text to
/// show. Read straight into a `Value`, its keys would reach serde_json's raw-value check
/// too, so it is read as a TOML table, its keys checked, and then converted.
pub fn from_toml(text: &str) -> Result<serde_json::Value, String> {
    fn reserved(value: &toml::Value) -> bool {
        match value {
            toml::Value::Table(table) => table_reserved(table),
            toml::Value::Array(items) => items.iter().any(reserved),
            _ => false,
        }
    }
    fn table_reserved(table: &toml::Table) -> bool {
        table
            .iter()
            .any(|(key, value)| key.as_bytes() == RAW_VALUE_KEY || reserved(value))
    }
    let table: toml::Table = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    if table_reserved(&table) {
        return Err(RESERVED.to_owned());
    }
    serde_json::to_value(table).map_err(|e| e.to_string())
}

/// Whether the JSON string body at the start of `text` (after its opening quote) decodes to
/// exactly [`RAW_VALUE_KEY`] and then ends.
fn is_raw_value_key(mut text: &[u8]) -> bool {
    for &want in RAW_VALUE_KEY {
        let (got, len) = match text {
            [b'\\', b'u', hex @ ..] if hex.len() >= 4 => {
                let Some(unit) = std::str::from_utf8(&hex[..4])
                    .ok()
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
                else {
                    return false;
                };
                (unit, 6)
            }
            [b'\\', ..] => return false,
            [byte, ..] => (u16::from(*byte), 1),
            [] => return false,
        };
        if got != u16::from(want) {
            return false;
        }
        text = &text[len..];
    }
    text.first() == Some(&b'"')
}

/// An object's key, borrowed from the input unless it has escapes.
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A `T` that is not a string, read so that a string in its place is an error that does
/// not quote it (see the module docs). `T`'s own fields are read as `T` reads them. `T`
/// is a struct, a list, a number or a bool: not an `Option` (use [`optional`]), a
/// `RawValue`, an enum or a newtype, which this reads wrongly.
#[derive(Debug)]
pub(crate) struct Unquoted<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Unquoted<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UnquotedVisitor(PhantomData))
            .map(Unquoted)
    }
}

struct UnquotedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for UnquotedVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object, array, number, boolean or null")
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<T, E> {
        Err(misplaced_string(&self))
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<T, E> {
        T::deserialize(v.into_deserializer())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<T, E> {
        T::deserialize(v.into_deserializer())
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<T, E> {
        T::deserialize(v.into_deserializer())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<T, E> {
        T::deserialize(v.into_deserializer())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<T, E> {
        T::deserialize(().into_deserializer())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq))
    }
}

/// The error for a string where `expected` belongs: named, not quoted (see the module docs).
/// A visitor reached through `deserialize_any` returns it from `visit_str`.
pub(crate) fn misplaced_string<E: serde::de::Error>(expected: &dyn Expected) -> E {
    E::invalid_type(Unexpected::Other("string"), expected)
}

/// For `#[serde(default, deserialize_with = "optional")]` on an `Option<T>` field whose `T`
/// is not a string: absent or `null` is `None`.
pub(crate) fn optional<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    let value = Option::<Unquoted<T>>::deserialize(deserializer)?;
    Ok(value.map(|Unquoted(value)| value))
}

/// For `#[serde(default, deserialize_with = "list")]` on an `Option<Vec<T>>` field whose `T`
/// is not a string: absent or `null` is `None`.
pub(crate) fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let items = optional::<D, Vec<Unquoted<T>>>(deserializer)?;
    Ok(items.map(|items| items.into_iter().map(|Unquoted(item)| item).collect()))
}

/// Asserts that `T` fails on each case, `BIG` in it replaced by a long string, with an
/// error that does not quote that string.
#[cfg(test)]
pub(crate) fn assert_strings_unquoted<T: DeserializeOwned>(cases: &[&str]) {
    // Escaped by `Debug` as `\u{600}`: 3.5 bytes for each byte read.
    let big = serde_json::to_string(&"\u{600}".repeat(50_000)).unwrap();
    for case in cases {
        let text = case.replace("BIG", &big);
        let Err(error) = serde_json::from_str::<T>(&text) else {
            panic!("{case} parsed");
        };
        let error = error.to_string();
        assert!(error.len() < 300, "{case}: {} bytes", error.len());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Answer {
        #[serde(default, deserialize_with = "optional")]
        flag: Option<bool>,
        #[serde(default, deserialize_with = "list")]
        items: Option<Vec<Item>>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Item {
        n: u64,
    }

    #[test]
    fn a_misplaced_string_is_not_quoted_in_the_error() {
        // Why `Unquoted` exists: serde_json's own error quotes it whole.
        let big = serde_json::to_string(&"x".repeat(100_000)).unwrap();
        let quoted = serde_json::from_str::<Item>(&big).unwrap_err();
        assert!(quoted.to_string().len() > 100_000);

        assert_strings_unquoted::<Unquoted<Answer>>(&[
            "BIG",
            r#"{"flag": BIG}"#,
            r#"{"items": BIG}"#,
            r#"{"items": [{"n": 1}, BIG]}"#,
        ]);
        let answer: Unquoted<Answer> =
            serde_json::from_str(r#"{"flag": true, "items": [{"n": 1}, {"n": 2}]}"#).unwrap();
        assert_eq!(answer.0.flag, Some(true));
        assert_eq!(answer.0.items.map(|items| items.len()), Some(2));
        for absent in ["{}", r#"{"flag": null, "items": null}"#] {
            let Unquoted(answer) = serde_json::from_str::<Unquoted<Answer>>(absent).unwrap();
            assert!(answer.flag.is_none() && answer.items.is_none(), "{absent}");
        }
        let error = serde_json::from_str::<Unquoted<Answer>>(r#"{"items": [{"n": "1"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid type: string \"1\""), "{error}");
    }

    #[test]
    fn serde_json_reads_the_reserved_key_as_json_text_and_we_refuse_it() {
        let hidden = r#"{"$serde_json::private::RawValue": "[[[1], {\"a\": 2}]]"}"#;
        // Why this module exists: the string became structure.
        let value: Value = serde_json::from_str(hidden).unwrap();
        assert_eq!(value, serde_json::json!([[[1], {"a": 2}]]));

        for text in [
            hidden.to_string(),
            r#"{"x": [{"\u0024serde_json::private::RawValue": "{}"}]}"#.to_string(),
            r#"{"\u0024serde_json::private::Raw\u0056alue": "1"}"#.to_string(),
            r#"{"\u0024\u0073erde_json::private::RawValu\u0065": "1"}"#.to_string(),
        ] {
            let error = from_str::<Value>(&text).unwrap_err();
            assert!(error.is_data(), "{text}: {error}");
            assert!(error.to_string().contains("reserved"), "{error}");
        }
    }

    #[test]
    fn near_misses_parse() {
        for text in [
            r#"{"$serde_json::private::RawValu": "1"}"#,
            r#"{"$serde_json::private::RawValuee": "1"}"#,
            r#"{"a$serde_json::private::RawValue": "1"}"#,
            r#"{"$": "$5", "price": "\u0024 5", "\u0024": 1}"#,
            r#"["\u0024serde_json::private::RawValue\n"]"#,
            r#""$"#,
            r#""\u002"#,
            r#""\u0024"#,
        ] {
            assert!(refuse_raw_value_key(text.as_bytes()).is_ok(), "{text}");
        }
        let value: Value = from_str(r#"{"$a": "\u0024b"}"#).unwrap();
        assert_eq!(value["$a"], "$b");
    }

    #[test]
    fn toml_keys_are_checked_too() {
        let hidden = "[a]\n\"$serde_json::private::RawValue\" = \"[1, 2]\"\n";
        let direct: Value = toml::from_str(hidden).unwrap();
        assert_eq!(
            direct["a"],
            serde_json::json!([1, 2]),
            "why: TOML reaches the check"
        );
        for text in [
            hidden,
            "x = [{ '$serde_json::private::RawValue' = '{}' }]",
            "\"\\u0024serde_json::private::RawValue\" = \"1\"",
        ] {
            assert!(from_toml(text).unwrap_err().contains("reserved"), "{text}");
        }
        let value = from_toml("a = 1\nwhen = 1979-05-27T07:32:00Z\n[b]\nc = [\"$d\"]").unwrap();
        let direct: Value =
            toml::from_str("a = 1\nwhen = 1979-05-27T07:32:00Z\n[b]\nc = [\"$d\"]").unwrap();
        assert_eq!(value, direct);
        assert!(from_toml("a = ").is_err());
    }

    #[test]
    fn a_stack_of_hidden_values_is_refused_at_the_outer_one() {
        let mut text = "1".to_string();
        for _ in 0..6 {
            text = serde_json::json!({"$serde_json::private::RawValue": text}).to_string();
        }
        assert!(serde_json::from_str::<Value>(&text).is_ok());
        assert!(from_str::<Value>(&text).is_err());
    }
}
