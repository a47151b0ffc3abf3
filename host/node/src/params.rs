//! Path and query parameters of the node's routes, checked before a handler uses them: a
//! malformed one is a 400 that names it, never an unknown id or a silently ignored value.

use std::time::Duration;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;

use crate::error::ApiError;

/// Approval ids are short and made of letters, digits and `-` ([`ApprovalQueue`] makes
/// them); anything else is a malformed request, not an unknown id.
pub(crate) fn is_approval_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// `wait=SECONDS` (a non-negative number) and nothing else.
pub(crate) fn parse_wait(query: Option<&str>) -> Result<Duration, ApiError> {
    let mut wait = Duration::ZERO;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "wait" {
            return Err(ApiError::bad(
                key.chars().take(64).collect::<String>(),
                "unknown query parameter; the only one is `wait`",
            ));
        }
        wait = value
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| ApiError::bad("wait", "expected a number of seconds, e.g. wait=30"))?;
    }
    Ok(wait)
}

/// A path parameter of exactly `len` hex digits, lowercased.
pub(crate) fn hex_param(
    param: Result<Path<String>, PathRejection>,
    field: &str,
    len: usize,
) -> Result<String, ApiError> {
    let expected = || {
        ApiError::bad(
            field,
            match field {
                "sha256" => "expected the SHA-256 of the body, 64 hex digits".to_owned(),
                _ => format!("expected {len} hex digits"),
            },
        )
    };
    let Ok(Path(value)) = param else {
        return Err(expected());
    };
    normalise_hex(&value, len).ok_or_else(expected)
}

pub(crate) fn normalise_hex(value: &str, len: usize) -> Option<String> {
    (value.len() == len && value.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| value.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_takes_seconds_and_nothing_else() {
        assert_eq!(parse_wait(None).ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_wait(Some("wait=1.5")).ok(),
            Some(Duration::from_millis(1500))
        );
        for bad in [
            "wait=-1",
            "wait=NaN",
            "wait=inf",
            "wait=",
            "wait=1e400",
            "other=1",
        ] {
            assert!(parse_wait(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn approval_ids_are_short_and_plain() {
        assert!(is_approval_id("1a2b3c4d-00000007"));
        for bad in ["", "a b", "../x", "ü", &"a".repeat(65)] {
            assert!(!is_approval_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn ids_and_hashes_are_exact_hex() {
        assert_eq!(normalise_hex("ABcd", 4).as_deref(), Some("abcd"));
        assert_eq!(normalise_hex("abc", 4), None);
        assert_eq!(normalise_hex("abcg", 4), None);
        assert_eq!(normalise_hex("ab\u{e9}", 4), None);
    }
}
