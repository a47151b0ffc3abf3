//! What host state costs: upper bounds on the heap a string or a JSON value takes, so a
//! [`Charge`](super::Charge) can be taken before the state is built.
//!
//! Guest JSON is the input to be careful with: parsed into a `serde_json::Value`, text can
//! take a hundred times its size (`[{"a":0},{"a":0},..]` gives one B-tree node of about 700
//! bytes per 8 input bytes). [`json_text`] walks the text without building anything and
//! returns the bound [`json`] gives for the value it parses to, so a 16 MiB input is charged
//! (or refused) before it is parsed. The bounds count the allocator's bookkeeping and the
//! spare room of growing vectors, so they stay above what the allocator really hands out.

use std::mem::size_of;

use serde::Serialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use smallvec::SmallVec;

/// The allocator's bookkeeping per block, with blocks rounded to 16 bytes (as glibc does).
const ALLOC_OVERHEAD: u64 = 16;

const VALUE: u64 = size_of::<Value>() as u64;

/// One node of a B-tree of JSON entries: 11 keys, 11 values, 12 child pointers and its
/// header. The host's objects keep their key order (serde_json's `preserve_order`, an
/// `IndexMap`): its entry vector (hash, key, value; doubled) and index table come to about
/// 250 bytes an entry, under the 320 an entry that [`object`] charges, so the bound holds.
const MAP_NODE: u64 = alloc((11 * (size_of::<String>() + size_of::<Value>()) + 12 * 8 + 16) as u64);

/// One heap block holding `bytes`.
pub const fn alloc(bytes: u64) -> u64 {
    if bytes == 0 {
        return 0;
    }
    match bytes
        .saturating_add(ALLOC_OVERHEAD)
        .checked_next_multiple_of(16)
    {
        Some(rounded) => rounded,
        None => u64::MAX,
    }
}

/// A `String` (or `Vec<u8>`) of `len` bytes.
pub const fn string(len: u64) -> u64 {
    alloc(len)
}

/// One element of a `Vec<T>` grown by pushing: the element and the spare room doubling
/// leaves.
pub const fn vec_slot<T>() -> u64 {
    2 * size_of::<T>() as u64
}

/// The buffer of a JSON array of `len` elements as the parser grows it (4, 8, 16, ..).
pub fn array(len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    let capacity = len.checked_next_power_of_two().unwrap_or(u64::MAX).max(4);
    alloc(capacity.saturating_mul(VALUE))
}

/// The B-tree nodes of a JSON object of `len` entries: every node but the root holds at
/// least 5 entries, so `1 + len / 4` nodes bound leaves and inner nodes together.
pub fn object(len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    MAP_NODE.saturating_mul(1 + len / 4)
}

/// A list of strings, bounded as a JSON array of them is (so a list parsed from one costs
/// no more than the value it came from).
pub fn strings<'a>(items: impl ExactSizeIterator<Item = &'a str>) -> u64 {
    let len = items.len() as u64;
    items.fold(array(len), |sum, s| {
        sum.saturating_add(string(s.len() as u64))
    })
}

/// One entry added to a JSON object (`key` → `value`), beyond the object's first node.
pub fn object_entry(key: &str, value: &Value) -> u64 {
    (MAP_NODE / 4)
        .saturating_add(string(key.len() as u64))
        .saturating_add(json(value))
}

/// The heap a JSON value owns (its own slot lives in its parent).
pub fn json(value: &Value) -> u64 {
    match value {
        Value::String(s) => string(s.len() as u64),
        Value::Array(items) => items.iter().fold(array(items.len() as u64), |sum, v| {
            sum.saturating_add(json(v))
        }),
        Value::Object(map) => self::map(map),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// [`json`] of a JSON object, from its map.
pub fn map(map: &Map<String, Value>) -> u64 {
    map.iter().fold(object(map.len() as u64), |sum, (k, v)| {
        sum.saturating_add(string(k.len() as u64))
            .saturating_add(json(v))
    })
}

/// [`json`] of the value `text` parses to, without parsing it into one; an error for text
/// that is not JSON or that [`crate::json::from_slice`] refuses (its reserved key would
/// hide structure this count does not see).
pub fn json_text(text: &[u8]) -> Result<u64, serde_json::Error> {
    crate::json::refuse_raw_value_key(text)?;
    let mut de = serde_json::Deserializer::from_slice(text);
    let cost = Cost.deserialize(&mut de)?;
    de.end()?;
    Ok(cost)
}

/// serde_json's nesting limit: a parse fails at deeper text and builds nothing past it.
const MAX_DEPTH: usize = 128;

/// An upper bound on the heap serde_json builds from any `text`, JSON or not, before it
/// ends or fails: [`json`]'s bound for the value valid text parses to (a string counted at
/// its written length, which escapes only shorten), and for the rest everything begun
/// before the end. Text cut off or broken after a long amplifying prefix is charged for
/// the prefix, which a parse builds before it fails. It also counts serde_json's scratch
/// buffer, which holds the longest number's digits or escaped string's text (and may have
/// doubled past it) while that token is read.
///
/// One pass over the bytes with no allocation: for a model's answer, where [`json_text`]
/// (serde_json's own parser) cost about half the parse it guards. It checks nothing; the
/// parse that follows does.
pub fn json_text_bound(text: &[u8]) -> u64 {
    let (held, scratch) = json_text_parts(text);
    held.saturating_add(scratch)
}

/// [`json_text_bound`] in its two parts: what the parse builds, and the scratch buffer it
/// needs meanwhile (given back when it ends, so parses one after another need only the
/// largest).
pub fn json_text_parts(text: &[u8]) -> (u64, u64) {
    /// An open array or object: its commas, and whether anything was written in it.
    #[derive(Clone, Copy, Default)]
    struct Open {
        object: bool,
        commas: u64,
        written: bool,
    }
    impl Open {
        /// Its bound with as many elements (or entries) as its commas allow.
        fn cost(self) -> u64 {
            let len = if self.written { self.commas + 1 } else { 0 };
            if self.object { object(len) } else { array(len) }
        }
    }
    // `inner` is the innermost open array or object, or the top level, which owns
    // nothing; `outer` the ones around it, top level first. Kept in a local, the
    // innermost one's counts stay in registers; `outer` is uninitialised until pushed to,
    // and holds the deepest nesting without spilling to the heap.
    let mut inner = Open::default();
    let mut outer = SmallVec::<[Open; MAX_DEPTH]>::new();
    let (mut sum, mut scratch, mut rest) = (0u64, 0, text);
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        // Tested most common first: a branch each is predicted better than one jump
        // through a table, and every key or string value starts with a quote.
        if byte == b'"' {
            inner.written = true;
            let (len, escaped) = quoted_len(rest);
            sum = sum.saturating_add(string(len as u64));
            if escaped {
                scratch = scratch.max(len);
            }
            rest = rest.get(len + 1..).unwrap_or_default();
            // A key's colon, read here rather than taken round the loop again.
            if let [b':', after @ ..] = rest {
                rest = after;
            }
        } else if byte == b',' {
            inner.commas += 1;
        } else if byte == b']' || byte == b'}' {
            if let Some(around) = outer.pop() {
                sum = sum.saturating_add(inner.cost());
                inner = around;
            }
        } else if byte == b'[' || byte == b'{' {
            inner.written = true;
            if outer.len() == MAX_DEPTH {
                break;
            }
            outer.push(inner);
            inner = Open {
                object: byte == b'{',
                ..Open::default()
            };
        } else if !matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b':') {
            // A number or a literal, which owns no heap (a number's digits pass through
            // the scratch buffer): on to the byte after it.
            inner.written = true;
            let end = rest.iter().position(|&b| ENDS_TOKEN[b as usize]);
            let end = end.unwrap_or(rest.len());
            if byte == b'-' || byte.is_ascii_digit() {
                scratch = scratch.max(end + 1);
            }
            rest = &rest[end..];
        }
    }
    // Text that ends inside arrays or objects: what they hold so far (the first of
    // `outer`, when there is one, is the top level).
    let held = if outer.is_empty() {
        sum
    } else {
        outer[1..]
            .iter()
            .fold(sum.saturating_add(inner.cost()), |sum, open| {
                sum.saturating_add(open.cost())
            })
    };
    (held, alloc(2 * scratch as u64))
}

/// The bytes that end a number or a literal.
const ENDS_TOKEN: [bool; 256] = {
    let mut ends = [false; 256];
    let bytes = b",]} \n\r\t\"[{";
    let mut i = 0;
    while i < bytes.len() {
        ends[bytes[i] as usize] = true;
        i += 1;
    }
    ends
};

/// Strings this short are searched eight bytes at a time ([`quote_or_backslash`]): most
/// are (keys, ids, roles), and that ends before `memchr`'s setup would pay off.
const SHORT_STRING: usize = 32;

/// Where the first `"` or `\` in `bytes` is: a word at a time while eight bytes are left,
/// then byte by byte.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    /// The high bit set in each byte of `word` that is zero; the lowest set bit is always
    /// the first zero byte (a borrow only carries into the bytes above it).
    fn zero_bytes(word: u64) -> u64 {
        word.wrapping_sub(ONES) & !word & HIGHS
    }
    let (words, tail) = bytes.as_chunks::<8>();
    for (i, word) in words.iter().enumerate() {
        let word = u64::from_le_bytes(*word);
        let found = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')));
        if found != 0 {
            return Some(i * 8 + found.trailing_zeros() as usize / 8);
        }
    }
    let at = tail.iter().position(|&b| b == b'"' || b == b'\\')?;
    Some(bytes.len() - tail.len() + at)
}

/// The length of a string's text up to its closing quote (all of `rest` when unclosed),
/// and whether it has escapes.
fn quoted_len(rest: &[u8]) -> (usize, bool) {
    let head = &rest[..rest.len().min(SHORT_STRING)];
    let start = match quote_or_backslash(head) {
        Some(at) if rest[at] == b'"' => return (at, false),
        Some(backslash) => backslash,
        None if head.len() == rest.len() => return (rest.len(), false),
        None => head.len(),
    };
    let (mut at, mut escaped) = (start, false);
    while let Some(found) = rest
        .get(at..)
        .and_then(|tail| memchr::memchr2(b'"', b'\\', tail))
    {
        at += found;
        if rest[at] == b'"' {
            return (at, escaped);
        }
        // A backslash and the byte it escapes.
        escaped = true;
        at += 2;
    }
    (rest.len(), escaped)
}

/// Bytes `value` serialises to as JSON, counted without writing them anywhere.
pub fn json_len(value: &impl Serialize) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.write_all(bytes)?;
            Ok(bytes.len())
        }
        // What serde_json calls for every piece; the default loops over `write`.
        #[inline]
        fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.0 = self.0.saturating_add(bytes.len() as u64);
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        // Only a type that refuses to serialise; its callers fail on it too.
        Err(_) => 0,
    }
}

/// Walks one JSON value, summing [`json`]'s bound for it.
struct Cost;

impl<'de> DeserializeSeed<'de> for Cost {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<u64, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Cost {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(string(s.len() as u64))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let (mut len, mut sum) = (0u64, 0u64);
        while let Some(cost) = seq.next_element_seed(Cost)? {
            len += 1;
            sum = sum.saturating_add(cost);
        }
        Ok(sum.saturating_add(array(len)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let (mut len, mut sum) = (0u64, 0u64);
        while let Some(key) = map.next_key_seed(Cost)? {
            let value = map.next_value_seed(Cost)?;
            len += 1;
            sum = sum.saturating_add(key).saturating_add(value);
        }
        Ok(sum.saturating_add(object(len)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 200, 12, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\u{e9}\"\\\\]{0,6}", inner, 0..12)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The word-at-a-time search and `memchr` find the same end, wherever a quote or an
    /// escape falls around the short strings' length and whatever bytes surround it.
    #[test]
    fn a_string_ends_at_its_first_unescaped_quote() {
        fn naive(rest: &[u8]) -> (usize, bool) {
            let (mut at, mut escaped) = (0, false);
            while at < rest.len() {
                match rest[at] {
                    b'"' => return (at, escaped),
                    b'\\' => {
                        escaped = true;
                        at += 2;
                    }
                    _ => at += 1,
                }
            }
            (rest.len(), escaped)
        }
        // Fillers around the two bytes searched for: their high-bit twins, zero, and the
        // bytes one above them (which a borrow from below would turn into a false match).
        for (len, fill) in
            (0..80).flat_map(|len| [b'a', 0xA2, 0xDC, 0, 0x23, 0x5D].map(|fill| (len, fill)))
        {
            for at in 0..=len {
                for special in [&b"\""[..], b"\\\"", b"\\\\\"", b"\\"] {
                    let mut text = vec![fill; len];
                    text.splice(at..at, special.iter().copied());
                    // Unterminated (a backslash may be the last byte), then closed.
                    for end in [&b""[..], b"\",1"] {
                        let mut text = text.clone();
                        text.extend_from_slice(end);
                        let shown = String::from_utf8_lossy(&text);
                        assert_eq!(quoted_len(&text), naive(&text), "{shown:?}");
                    }
                }
            }
        }
    }

    /// Nesting deep enough to fill the scan's stack of open containers is counted exactly
    /// (no numbers or escapes), and past serde_json's limit the scan stops, as the parse does.
    #[test]
    fn deep_nesting_is_counted_exactly_up_to_the_parsers_limit() {
        for depth in [1, 15, 16, 17, 64, 127] {
            let mut value = json!("leaf");
            for level in 0..depth {
                value = if level % 2 == 0 {
                    json!([value, "x"])
                } else {
                    json!({"k": value, "l": "y"})
                };
            }
            let text = serde_json::to_vec(&value).unwrap();
            assert_eq!(json_text_bound(&text), json(&value), "depth {depth}");
        }
        let deepest = json_text_parts(&b"[".repeat(MAX_DEPTH + 1));
        assert_eq!(json_text_parts(&b"[".repeat(300)), deepest);
        let mut past = b"[".repeat(MAX_DEPTH + 1);
        past.extend_from_slice(b"\"tail\",1]]]");
        assert_eq!(json_text_parts(&past), deepest);
    }

    proptest! {
        /// The text walk gives the value's bound, so charging before parsing charges what
        /// the parsed value is then held to.
        #[test]
        fn the_text_walk_agrees_with_the_value(value in any_json()) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(json_text(&text).unwrap(), json(&value));
            prop_assert_eq!(json_len(&value), text.len() as u64);
        }

        /// The byte scan bounds the value: exactly for text without escapes or numbers
        /// (which pass through serde_json's scratch buffer).
        #[test]
        fn the_byte_scan_bounds_the_value(value in any_json()) {
            let text = serde_json::to_vec(&value).unwrap();
            let bound = json_text_bound(&text);
            prop_assert!(bound >= json(&value), "{} < {}", bound, json(&value));
            if !text.iter().any(|&b| b == b'\\' || b == b'-' || b.is_ascii_digit()) {
                prop_assert_eq!(bound, json(&value));
            }
        }

        /// Cut anywhere, text is charged at least what its complete prefix values hold, and
        /// more text never costs less.
        #[test]
        fn the_byte_scan_of_cut_text_grows_with_it(value in any_json(), cut in any::<prop::sample::Index>()) {
            let text = serde_json::to_vec(&value).unwrap();
            let at = cut.index(text.len() + 1);
            let (head, longer) = (json_text_bound(&text[..at]), json_text_bound(&text[..(at + 1).min(text.len())]));
            prop_assert!(head <= longer, "{} > {} at {}", head, longer, at);
        }

        #[test]
        fn a_list_of_strings_costs_what_its_json_array_does(items in prop::collection::vec("\\PC{0,30}", 0..40)) {
            let array = Value::from(items.clone());
            prop_assert_eq!(strings(items.iter().map(String::as_str)), json(&array));
        }
    }

    #[test]
    fn amplifying_json_is_charged_for_what_it_parses_to() {
        let text = format!("[{}]", vec![r#"{"a":0}"#; 10_000].join(","));
        let cost = json_text(text.as_bytes()).unwrap();
        assert!(
            cost > 50 * text.len() as u64,
            "{cost} for {} bytes",
            text.len()
        );
        let duplicate_keys = json_text(br#"{"a":"xxxx","a":"yyyy"}"#).unwrap();
        assert!(duplicate_keys >= json(&json!({"a": "yyyy"})));
    }

    /// A parse builds what comes before its error: text broken or cut off after an
    /// amplifying prefix is charged for the prefix.
    #[test]
    fn broken_text_is_charged_for_what_comes_before_the_break() {
        let elements = vec![r#"{"a":0}"#; 10_000].join(",");
        let whole = json_text(format!(r#"{{"pad":[{elements}]}}"#).as_bytes()).unwrap();
        for broken in [
            format!(r#"{{"pad":[{elements},"#),
            format!(r#"{{"pad":[{elements}"#),
            format!(r#"{{"pad":[{elements}]]]"#),
            format!(r#"{{"pad":[{elements},"unclosed"#),
            format!(r#"{{"pad":[{elements}}} trailing"#),
        ] {
            let bound = json_text_bound(broken.as_bytes());
            assert!(
                bound >= whole,
                "{bound} < {whole} for ..{}",
                &broken[broken.len() - 12..]
            );
        }
        // Deeper than serde_json parses: bounded work, and the levels it does build.
        let deep = "[".repeat(100_000);
        let levels = (0..MAX_DEPTH).fold(0, |sum, _| sum + array(1));
        assert!(json_text_bound(deep.as_bytes()) >= levels);
        assert_eq!(json_text_bound(b""), 0);
        assert_eq!(json_text_bound(b"]]}},,,"), 0);
    }

    /// serde_json reads a number's digits, and an escaped string's text, into a scratch
    /// buffer that grows by doubling: a long one is charged for it, once.
    #[test]
    fn long_numbers_and_escaped_strings_are_charged_for_the_scratch_buffer() {
        let digits = format!("[1.{}1]", "0".repeat(100_000));
        assert!(json_text_bound(digits.as_bytes()) >= 200_000);
        let escaped = format!(r#"["{}\n"]"#, "a".repeat(100_000));
        assert!(
            json_text_bound(escaped.as_bytes()) >= 300_000,
            "the string and the buffer"
        );
        let plain = format!(r#"["{}"]"#, "a".repeat(100_000));
        assert!(
            json_text_bound(plain.as_bytes()) < 110_000,
            "no escapes: no scratch"
        );
    }

    #[test]
    fn what_is_not_json_is_an_error() {
        for bad in [&b"{"[..], b"[1,]", b"{} {}", b"nul", b"\"\xff\"", b""] {
            assert!(
                json_text(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = "[".repeat(100_000);
        assert!(
            json_text(deep.as_bytes()).is_err(),
            "the recursion limit holds"
        );
    }

    #[test]
    fn sizes_count_the_allocator_and_never_overflow() {
        assert_eq!(string(0), 0);
        assert_eq!(string(1), 32);
        assert_eq!(string(16), 32);
        assert_eq!(string(17), 48);
        assert_eq!(string(u64::MAX), u64::MAX);
        assert_eq!(array(1), alloc(4 * VALUE));
        assert_eq!(array(5), alloc(8 * VALUE));
        assert_eq!(array(u64::MAX), alloc(u64::MAX));
        assert_eq!(object(u64::MAX), u64::MAX);
    }
}
