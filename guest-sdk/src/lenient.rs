//! Lenient decoding of the JSON the host returns.
//!
//! The host passes the upstream LLM's `chat.completion` through as it came, and MCP servers
//! write their own results; either may be odd. The typed views in this crate decode every
//! field on its own: a field that is missing, `null` or of the wrong type (a string where a
//! number belongs, a negative or 1e30 token count, ..) becomes its default (`None`, `0`,
//! `""`, empty), and a list element that does not decode is left out. One odd field never
//! hides the rest of an answer, and nothing panics. The JSON as sent stays reachable
//! through each type's `extra` map (fields the SDK does not know) and the raw accessors
//! (`Response::json`, `ToolResult::json`, ..).

use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// `deserialize_with` for a field: the value, or `T::default()` if it does not decode.
pub(crate) fn field<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(d)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

/// `deserialize_with` for a list: the elements that decode, in order; empty if the value is
/// not an array.
pub(crate) fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|item| T::deserialize(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// Decodes a whole value leniently: `T::default()` if it is not even an object.
pub(crate) fn value<T: DeserializeOwned + Default>(value: &Value) -> T {
    T::deserialize(value).unwrap_or_default()
}

/// A string-valued enum of known values plus `Other(String)` for values this version of the
/// SDK does not know, so a new host or upstream value never fails decoding.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* #[doc = concat!("`\"", $text, "\"`")] $variant, )*
            /// A value this version of the SDK does not know, as it was sent (empty if the
            /// field was missing or not a string).
            Other(String),
        }

        impl $name {
            /// The value as sent.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )*
                    $name::Other(text) => text,
                }
            }
        }

        impl Default for $name {
            fn default() -> $name {
                $name::Other(String::new())
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> $name {
                match text {
                    $( $text => $name::$variant, )*
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<$name, D::Error> {
                let text = <::std::borrow::Cow<'de, str>>::deserialize(d)?;
                Ok($name::from(&*text))
            }
        }
    };
}

pub(crate) use open_enum;

/// `skip_serializing_if` for maps of unknown fields.
pub(crate) fn is_empty(map: &serde_json::Map<String, Value>) -> bool {
    map.is_empty()
}

/// Serializes `value` with `extra` keys added (used by hand-written `Serialize` impls).
pub(crate) fn serialize_tagged<S: Serializer, T: Serialize>(
    s: S,
    tag: (&str, &str),
    value: &T,
) -> Result<S::Ok, S::Error> {
    let mut json = serde_json::to_value(value).map_err(serde::ser::Error::custom)?;
    if let Value::Object(map) = &mut json {
        map.insert(tag.0.to_owned(), Value::String(tag.1.to_owned()));
    }
    json.serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    open_enum! {
        /// A test enum.
        pub enum Colour {
            Red = "red",
        }
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Sample {
        #[serde(deserialize_with = "field")]
        n: u64,
        #[serde(deserialize_with = "field")]
        name: Option<String>,
        #[serde(deserialize_with = "list")]
        items: Vec<u8>,
        #[serde(deserialize_with = "field")]
        colour: Option<Colour>,
    }

    #[test]
    fn fields_decode_one_by_one() {
        let sample: Sample = value(&json!({
            "n": 1e30, "name": 7, "items": [1, -1, "x", 300, 2], "colour": "blue"
        }));
        assert_eq!(sample.n, 0);
        assert_eq!(sample.name, None);
        assert_eq!(sample.items, [1, 2]);
        assert_eq!(sample.colour, Some(Colour::Other("blue".into())));

        let sample: Sample = value(&json!({"n": u64::MAX, "colour": "red", "items": {}}));
        assert_eq!(sample.n, u64::MAX);
        assert_eq!(sample.colour, Some(Colour::Red));
        assert!(sample.items.is_empty());

        assert_eq!(value::<Sample>(&json!("not an object")), Sample::default());
        assert_eq!(value::<Sample>(&json!({"n": null})), Sample::default());
    }

    #[test]
    fn open_enums() {
        assert_eq!(Colour::from("red"), Colour::Red);
        assert_eq!(Colour::Red, "red");
        assert_eq!(Colour::Other("x".into()).to_string(), "x");
        assert_eq!(Colour::default().as_str(), "");
        assert_eq!(serde_json::to_value(Colour::Red).unwrap(), json!("red"));
        let colour: Colour = serde_json::from_str(r#""r\u0065d""#).unwrap();
        assert_eq!(colour, Colour::Red);
    }
}
