//! The values `${ENV:..}` references resolve to, and cutting them out of text.
//!
//! A record's references are resolved once, into [`Launch`](super::Launch); what they
//! resolved to is a secret wherever it sits (URL, header, argument, environment). Two nets
//! keep those values away from guests and logs:
//!
//! - **At the source.** Each launch carries its [`Secrets`]; the MCP pool passes every error
//!   and log line about that server through [`Secrets::redact`], so a library user with
//!   any log setup and every guest-visible error are covered.
//! - **At the log sink.** Libraries log on their own (rmcp and reqwest may print a URL at
//!   debug or trace level). Every value resolved in this process is also remembered in a
//!   process-wide set that [`redact_known`] applies; the CLI's log writer
//!   ([`crate::telemetry::RedactingWriter`]) runs every line through it.
//!
//! Besides the raw value, the forms it takes inside a URL (percent-encoded as the URL
//! parser writes path, query, fragment and user info, lowercased as in a host), a JSON string and a Rust `Debug`
//! string are cut too. Values shorter than [`defaults::MIN_SECRET_BYTES`] are left alone:
//! they are not credentials, and cutting them would garble every message.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, RwLock};

use crate::defaults;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The secrets of one launch: each resolved value and the encoded forms it may take in
/// messages, longest first (so a value containing another is cut whole).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    needles: Arc<[String]>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} forms)", self.needles.len())
    }
}

impl Secrets {
    /// The secrets behind `values` (resolved reference values), also remembered for
    /// [`redact_known`].
    pub fn new<I, S>(values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut needles = Vec::new();
        for value in values {
            for form in forms(value.as_ref()) {
                if !needles.contains(&form) {
                    needles.push(form);
                }
            }
        }
        needles.sort_by_key(|n: &String| std::cmp::Reverse(n.len()));
        remember(&needles);
        Self {
            needles: needles.into(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Bytes of the longest form of any secret; 0 without secrets.
    pub fn longest(&self) -> usize {
        self.needles.first().map_or(0, String::len)
    }

    /// `text` with every secret replaced by [`REDACTED`]; borrowed when nothing matched.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        redact_with(&self.needles, text)
    }
}

/// The forms `value` takes in messages: raw, percent-encoded by the URL parser, escaped
/// in a JSON or `Debug` string. Empty when the value is too short to be a secret.
fn forms(value: &str) -> Vec<String> {
    if value.len() < defaults::MIN_SECRET_BYTES {
        return Vec::new();
    }
    let mut out = vec![value.to_owned()];
    let quoted = |s: String| s.get(1..s.len().saturating_sub(1)).map(str::to_owned);
    out.extend(serde_json::to_string(value).ok().and_then(quoted));
    out.extend(quoted(format!("{value:?}")));
    // The URL parser lowercases a host name.
    let lower = value.to_lowercase();
    if lower != value {
        out.push(lower);
    }
    if let Ok(mut url) = reqwest::Url::parse("http://h/") {
        url.set_query(Some(value));
        out.extend(url.query().map(str::to_owned));
        url.set_fragment(Some(value));
        out.extend(url.fragment().map(str::to_owned));
        url.set_path(&format!("/{value}"));
        out.extend(url.path().get(1..).map(str::to_owned));
        if url.set_username(value).is_ok() {
            out.push(url.username().to_owned());
        }
        if url.set_password(Some(value)).is_ok() {
            out.extend(url.password().map(str::to_owned));
        }
    }
    out.retain(|form| form.len() >= defaults::MIN_SECRET_BYTES);
    out
}

fn redact_with<'a>(needles: &[String], text: &'a str) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for needle in needles {
        if out.contains(needle.as_str()) {
            out = Cow::Owned(out.replace(needle.as_str(), REDACTED));
        }
    }
    out
}

/// Every secret form resolved in this process, longest first. It only grows: a value
/// that was a secret once stays one for the log.
static KNOWN: RwLock<Vec<String>> = RwLock::new(Vec::new());

fn remember(needles: &[String]) {
    if needles.is_empty() {
        return;
    }
    let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
    let before = known.len();
    for needle in needles {
        if !known.contains(needle) {
            known.push(needle.clone());
        }
    }
    if known.len() != before {
        known.sort_by_key(|n| std::cmp::Reverse(n.len()));
    }
}

/// `text` with every secret resolved so far in this process replaced by [`REDACTED`]. For
/// log sinks, which cannot know which server a library's line is about.
pub fn redact_known(text: &str) -> Cow<'_, str> {
    let known = KNOWN.read().unwrap_or_else(|e| e.into_inner());
    match redact_with(&known, text) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        Cow::Owned(clean) => Cow::Owned(clean),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_secret_is_cut_and_short_values_are_left_alone() {
        let secrets = Secrets::new(["tok en/\"x\"", "abc", "tok"]);
        let text = concat!(
            "raw tok en/\"x\" ",
            "json tok en/\\\"x\\\" ",
            "query http://h/?k=tok%20en/%22x%22 ",
            "path http://h/tok%20en/%22x%22 ",
            "abc tok stay"
        );
        let clean = secrets.redact(text);
        assert!(!clean.contains("tok en"), "{clean}");
        assert!(!clean.contains("tok%20en"), "{clean}");
        assert!(clean.ends_with("abc tok stay"), "{clean}");
        assert_eq!(clean.matches(REDACTED).count(), 4, "{clean}");
        assert!(matches!(secrets.redact("nothing here"), Cow::Borrowed(_)));
        assert!(!format!("{secrets:?}").contains("tok"));
    }

    #[test]
    fn resolved_values_are_remembered_for_log_sinks() {
        let marker = "remembered-7d1c9e";
        assert_eq!(redact_known(marker), marker);
        let _secrets = Secrets::new([marker]);
        assert_eq!(
            redact_known(&format!("a {marker} b")),
            format!("a {REDACTED} b")
        );
    }

    #[test]
    fn a_longer_secret_containing_a_shorter_one_is_cut_whole() {
        let secrets = Secrets::new(["abcd", "xxabcdxx"]);
        assert_eq!(
            secrets.redact("xxabcdxx abcd"),
            format!("{REDACTED} {REDACTED}")
        );
    }
}
