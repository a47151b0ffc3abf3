//! Request bodies: read with a byte limit and a deadline, then parsed as typed JSON whose
//! errors name the field at fault. Every handler (task API and admin API) reads through
//! here, so no route can take an unbounded body, nor one whose `Content-Type` is not what
//! the route takes: a JSON body must say `application/json`, which a web page can only
//! send across sites after a CORS preflight the node never grants (a `text/plain` or form
//! "simple request" needs none).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt;

use crate::error::ApiError;

/// JSON of type `T`; an error names the field at fault, below `prefix`.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    prefix: &str,
) -> Result<T, ApiError> {
    quiver::json::refuse_raw_value_key(bytes).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()).with_field("body")
    })?;
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let message = e.inner().to_string();
        let field = field_path(prefix, &e.path().to_string(), &message);
        let field = if field.is_empty() {
            "body".to_owned()
        } else {
            field
        };
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", message).with_field(field)
    })
}

/// `prefix.path`, plus the name a "missing field" or "unknown field" message gives (serde
/// reports those at the enclosing object).
pub(crate) fn field_path(prefix: &str, path: &str, message: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if !prefix.is_empty() {
        parts.push(prefix);
    }
    if !matches!(path, "" | "." | "?") {
        parts.push(path);
    }
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|lead| message.strip_prefix(lead)?.split('`').next());
    if let Some(name) = named.filter(|name| path.rsplit('.').next() != Some(*name)) {
        parts.push(name);
    }
    parts.join(".")
}

/// What a route takes as its body.
#[derive(Clone, Copy)]
pub(crate) enum Media {
    /// `application/json`.
    Json,
    /// A module: `application/wasm` or `application/octet-stream`.
    Module,
}

impl Media {
    fn types(self) -> &'static [&'static str] {
        match self {
            Self::Json => &["application/json"],
            Self::Module => &["application/wasm", "application/octet-stream"],
        }
    }
}

/// The body's one `Content-Type` is one of `media`'s (parameters such as `charset` aside).
fn check_type(headers: &HeaderMap, media: Media) -> Result<(), ApiError> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let given = match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    };
    let essence = given.and_then(|v| v.split(';').next()).map(str::trim);
    if essence.is_some_and(|e| media.types().iter().any(|t| e.eq_ignore_ascii_case(t))) {
        return Ok(());
    }
    let wanted = media.types().join(" or ");
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!(
            "this endpoint takes a body of type {wanted}; send `Content-Type: {}`",
            media.types()[0]
        ),
    )
    .with_field("Content-Type"))
}

/// The request body, of type `media`, at most `limit` bytes and within `timeout`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    media: Media,
    limit: u64,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    check_type(headers, media)?;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than this endpoint's limit of {limit} bytes"),
        )
        .with_field("body")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let read = async {
        let mut stream = body.into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad("body", format!("cannot read the body: {e}")))?;
            if buf.len().saturating_add(chunk.len()) > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the body did not arrive within {} ms", timeout.as_millis()),
        )
        .with_field("body")
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_name_the_field_serde_reports_at_the_parent() {
        assert_eq!(field_path("", ".", "missing field `task`"), "task");
        assert_eq!(
            field_path(
                "task",
                "limits.deadline",
                "unknown field `deadline`, expected …"
            ),
            "task.limits.deadline"
        );
        assert_eq!(
            field_path("task", "task_id", "invalid type"),
            "task.task_id"
        );
        assert_eq!(field_path("", "?", "key must be a string"), "");
    }

    #[test]
    fn a_body_must_say_its_type() {
        let with = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(header::CONTENT_TYPE, value.parse().expect("value"));
            }
            headers
        };
        for ok in ["application/json", "Application/JSON; charset=utf-8"] {
            assert!(check_type(&with(&[ok]), Media::Json).is_ok(), "{ok}");
        }
        for ok in ["application/wasm", "application/octet-stream"] {
            assert!(check_type(&with(&[ok]), Media::Module).is_ok(), "{ok}");
        }
        for bad in [
            &["text/plain"][..],
            &["application/x-www-form-urlencoded"],
            &["application/jsonx"],
            &[],
            &["application/json", "application/json"],
        ] {
            assert!(check_type(&with(bad), Media::Json).is_err(), "{bad:?}");
        }
        assert!(check_type(&with(&["application/json"]), Media::Module).is_err());
    }
}
