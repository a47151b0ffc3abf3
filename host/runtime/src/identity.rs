//! Who a task acts for, checked once for every caller: a principal's name
//! ([`check_principal`]) and the subject token a platform vouches for it with
//! ([`SubjectToken`]). Below every capability, so the task spec, policy and the MCP
//! credentials all use one rule.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::defaults;

/// Whether `name` may be a principal (or a client's name in events): 1 to
/// [`defaults::MAX_PRINCIPAL_BYTES`] bytes, no control or invisible formatting characters
/// (it is written into every log and audit line of its tasks), and not `*` (the
/// `[principals]` entry of everyone not listed). The one rule of the CLI, the node and the
/// host config; the error says what is wrong.
pub fn check_principal(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > defaults::MAX_PRINCIPAL_BYTES {
        return Err(format!(
            "a principal is 1 to {} bytes, not {}",
            defaults::MAX_PRINCIPAL_BYTES,
            name.len()
        ));
    }
    if crate::text::printable(name) != name {
        return Err("a principal may not hold control or invisible formatting characters".into());
    }
    if name.trim() != name {
        return Err("a principal may not begin or end with white space".into());
    }
    if name == "*" {
        return Err(
            "`*` names the [principals] entry of everyone not listed, not a principal".into(),
        );
    }
    Ok(())
}

/// A subject token: 1 to [`defaults::MAX_SUBJECT_TOKEN_BYTES`] visible ASCII characters
/// (what a JWT or an opaque bearer token is made of).
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectToken(Arc<str>);

/// A subject token that cannot be one. It says which rule failed, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectTokenError {
    #[error("the subject token is empty")]
    Empty,
    #[error(
        "the subject token is {len} bytes, more than {max}; pass the platform's token as issued",
        max = defaults::MAX_SUBJECT_TOKEN_BYTES
    )]
    TooLong { len: usize },
    #[error(
        "the subject token holds a character that no token has (space, control or non-ASCII); pass the token alone, without `Bearer ` or quotes"
    )]
    BadCharacter,
}

impl SubjectToken {
    /// Checks `token` and keeps it.
    pub fn new(token: &str) -> Result<Self, SubjectTokenError> {
        if token.is_empty() {
            return Err(SubjectTokenError::Empty);
        }
        if token.len() > defaults::MAX_SUBJECT_TOKEN_BYTES {
            return Err(SubjectTokenError::TooLong { len: token.len() });
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SubjectTokenError::BadCharacter);
        }
        Ok(Self(Arc::from(token)))
    }

    /// The token, for the token request only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// A digest to tell tokens apart without keeping them.
    pub(crate) fn fingerprint(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }
}

impl std::fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectToken(<redacted>)")
    }
}
