//! The node's errors: [`ServeError`] when a node cannot start, and [`ApiError`], the one
//! way a request fails. Every failing request gets its status, a stable `code`, a message
//! and the `field` at fault, as `{"error": {"code", "message", "field"?}}`, from here only.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::defaults;
use quiver::ApprovalError;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {addr} without a token for tasks, approvals and status: only loopback addresses may go without one; set `[serve] token_env` (or `[clients.NAME]` with roles) in quiver.toml to the name of a variable holding the token"
    )]
    NoToken { addr: SocketAddr },
    #[error(
        "{}: {field}: the variable `{var}` is not set or blank; export the client's token in it",
        file.display()
    )]
    TokenEnv {
        file: PathBuf,
        field: String,
        var: String,
    },
    #[error(
        "{}: admin.token_env: the variable `{var}` is not set or blank; export the admin token in it, or remove `[admin]` to turn the admin API off",
        file.display()
    )]
    AdminTokenEnv { file: PathBuf, var: String },
    #[error("{}: {field}: {message}", file.display())]
    Field {
        file: PathBuf,
        field: &'static str,
        message: &'static str,
    },
    #[error(
        "serve.allowed_hosts: \"*\" (any host name) needs a token, or any web page could reach the node by DNS rebinding; set `[serve] token_env`, or list the names clients use instead of \"*\""
    )]
    AnyHostWithoutToken,
    #[error("{origin}: the token is empty; give the client a non-blank token")]
    BlankToken { origin: String },
    #[error(
        "{origin}: a client's name is 1 to 64 letters, digits, `_`, `-` and `.`, it holds one or more roles, and each of its act_for patterns is 1 to 256 printable bytes (at most 256 of them)"
    )]
    BadClient { origin: String },
    #[error("{first} and {second} both name the client `{name}`; give each client its own name")]
    DuplicateClient {
        name: String,
        first: String,
        second: String,
    },
    #[error(
        "{first} and {second} hold the same token, so the node could not tell the two clients apart; give each client its own token"
    )]
    SharedToken { first: String, second: String },
    #[error("{origin}: {message}")]
    PublicUrl { origin: String, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A request that failed; turned into its JSON answer in [`IntoResponse`].
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    field: Option<String>,
    retry_after: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: false,
        }
    }

    /// Names the request field (or path parameter, or query parameter) at fault.
    #[must_use]
    pub(crate) fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// A `400 bad_request` about `field`.
    pub(crate) fn bad(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message).with_field(field)
    }

    /// A refusal the client may retry later (`Retry-After`).
    pub(crate) fn busy(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            retry_after: true,
            ..Self::new(status, code, message)
        }
    }

    pub(crate) fn unauthorized(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message).with_field("Authorization")
    }

    pub(crate) fn not_found(what: &str, field: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
        )
        .with_field(field)
    }

    /// Replaces the generic code with a more precise one.
    #[must_use]
    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }
}

/// An approval never seen is not found; one that stopped waiting is a conflict.
impl From<ApprovalError> for ApiError {
    fn from(error: ApprovalError) -> Self {
        let (status, code) = match error {
            ApprovalError::NotPending { .. } => (StatusCode::NOT_FOUND, "not_found"),
            ApprovalError::NoLongerWaiting { .. } => (StatusCode::CONFLICT, "no_longer_waiting"),
            ApprovalError::Unfit { .. } => {
                return Self::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_answer",
                    error.to_string(),
                )
                .with_field("body");
            }
        };
        Self::new(status, code, error.to_string()).with_field("id")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                code: self.code,
                message: &self.message,
                field: self.field.as_deref(),
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"quiver\""),
            );
        }
        if self.retry_after {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(defaults::SERVE_RETRY_AFTER_SECS),
            );
        }
        response
    }
}
