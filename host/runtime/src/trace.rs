//! W3C trace context: what a task continues and what its outbound requests carry.
//!
//! The library emits `tracing` spans only and never exports anything (an embedder's
//! subscriber decides where spans go). Continuing a caller's trace and putting
//! `traceparent`/`tracestate` on MCP requests and LLM calls needs the trace ids the
//! subscriber gives those spans, which `tracing` does not know about; a [`Propagator`],
//! installed once per process by whoever installs an OpenTelemetry layer (the `quiver`
//! binary does), answers that. Without one, tasks still get their spans and nothing is
//! propagated.

use std::sync::OnceLock;

use crate::defaults;

/// A W3C trace context (`traceparent`, optional `tracestate`), checked: a valid version
/// 00 `traceparent` (or a later version's first four fields), a `tracestate` of at most
/// [`defaults::MAX_TRACESTATE_BYTES`] printable ASCII bytes (else dropped, as W3C allows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// A `traceparent` that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "traceparent: {0}; expected the W3C form 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"
)]
pub struct InvalidTraceparent(&'static str);

impl TraceContext {
    /// Checks `traceparent` (and `tracestate`, dropped when it is not valid).
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, InvalidTraceparent> {
        let traceparent = traceparent.trim_matches([' ', '\t']);
        check_traceparent(traceparent)?;
        let tracestate = tracestate
            .map(|s| s.trim_matches([' ', '\t']))
            .filter(|s| valid_tracestate(s))
            .map(str::to_owned);
        Ok(Self {
            // A later version may append fields; only the four known ones are kept.
            traceparent: traceparent[..TRACEPARENT_LEN].to_owned(),
            tracestate,
        })
    }

    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16 hex digits of the parent span's id.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the caller sampled its trace (flags bit 0).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }

    /// The header (and `_meta`) pairs: `traceparent`, then `tracestate` if any.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        std::iter::once(("traceparent", self.traceparent.as_str()))
            .chain(self.tracestate.as_deref().map(|s| ("tracestate", s)))
    }
}

const TRACEPARENT_LEN: usize = 55;

fn check_traceparent(text: &str) -> Result<(), InvalidTraceparent> {
    let bytes = text.as_bytes();
    if bytes.len() < TRACEPARENT_LEN || bytes.len() > defaults::MAX_TRACEPARENT_BYTES {
        return Err(InvalidTraceparent("wrong length"));
    }
    let lower_hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    if !lower_hex(0..2) || !lower_hex(3..35) || !lower_hex(36..52) || !lower_hex(53..55) {
        return Err(InvalidTraceparent("a field is not lowercase hex"));
    }
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return Err(InvalidTraceparent("fields are not separated by '-'"));
    }
    match &text[..2] {
        "ff" => return Err(InvalidTraceparent("version ff is invalid")),
        "00" if bytes.len() != TRACEPARENT_LEN => {
            return Err(InvalidTraceparent("version 00 has exactly four fields"));
        }
        "00" => {}
        _ if bytes.len() > TRACEPARENT_LEN && bytes[TRACEPARENT_LEN] != b'-' => {
            return Err(InvalidTraceparent("fields are not separated by '-'"));
        }
        _ => {}
    }
    if bytes[3..35].iter().all(|&b| b == b'0') {
        return Err(InvalidTraceparent("the trace id is all zeros"));
    }
    if bytes[36..52].iter().all(|&b| b == b'0') {
        return Err(InvalidTraceparent("the parent id is all zeros"));
    }
    Ok(())
}

/// At most [`defaults::MAX_TRACESTATE_BYTES`] of printable ASCII in at most 32 members,
/// each `key=value`.
fn valid_tracestate(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= defaults::MAX_TRACESTATE_BYTES
        && text.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && text.split(',').count() <= 32
        && text
            .split(',')
            .map(|m| m.trim_matches([' ', '\t']))
            .all(|m| {
                m.is_empty()
                    || m.split_once('=')
                        .is_some_and(|(k, v)| !k.is_empty() && !v.is_empty())
            })
}

/// Reads and sets the trace context of `tracing` spans, for a subscriber that gives spans
/// trace ids (an OpenTelemetry layer). Installed once per process with [`set_propagator`].
pub trait Propagator: Send + Sync + 'static {
    /// `span`'s context as it would be sent on, if it has one.
    fn context_of(&self, span: &tracing::Span) -> Option<TraceContext>;
    /// Makes `parent` the remote parent of `span` (called before `span` is entered).
    fn set_parent(&self, span: &tracing::Span, parent: &TraceContext);
}

static PROPAGATOR: OnceLock<Box<dyn Propagator>> = OnceLock::new();

/// Installs the process's [`Propagator`]; `false` if one was installed already (the first
/// one stays).
pub fn set_propagator(propagator: impl Propagator) -> bool {
    PROPAGATOR.set(Box::new(propagator)).is_ok()
}

/// The context the current span sends on, if a propagator knows one.
pub(crate) fn current() -> Option<TraceContext> {
    context_of(&tracing::Span::current())
}

/// The context `span` sends on, if a propagator knows one.
pub(crate) fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    PROPAGATOR.get()?.context_of(span)
}

/// Makes `parent` the remote parent of `span`, if a propagator is installed.
pub(crate) fn continue_from(span: &tracing::Span, parent: &TraceContext) {
    if let Some(propagator) = PROPAGATOR.get() {
        propagator.set_parent(span, parent);
    }
}

/// The current context's headers, for an outbound HTTP request (LLM backends).
pub(crate) fn headers() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    if let Some(context) = current() {
        for (name, value) in context.pairs() {
            // Checked printable ASCII, so always a valid header value.
            if let Ok(value) = http::HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_with_its_ids() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        assert!(context.sampled());
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
        let later = format!("01{}-extra", &VALID[2..]);
        assert_eq!(
            TraceContext::parse(&later, None).unwrap().traceparent(),
            format!("01{}", &VALID[2..])
        );
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad, None).is_err(), "{bad:?} accepted");
        }
        let huge = format!("01{}-{}", &VALID[2..], "a".repeat(10_000));
        assert!(TraceContext::parse(&huge, None).is_err());
    }

    #[test]
    fn an_invalid_tracestate_is_dropped_not_the_traceparent() {
        let long = "k=".to_owned() + &"v".repeat(600);
        for bad in ["novalue", "k=v\n", long.as_str(), "=v"] {
            let context = TraceContext::parse(VALID, Some(bad)).unwrap();
            assert_eq!(context.tracestate(), None, "{bad:?} kept");
        }
    }
}
