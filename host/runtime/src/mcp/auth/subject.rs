//! The subject token a task carries from the platform that submitted it (an OIDC ID token
//! or an access token), for `oauth_token_exchange` credentials (RFC 8693).
//!
//! A [`SubjectToken`] is a secret: its `Debug` is redacted, it is never serialised, and it
//! reaches only the token endpoint of a credential the operator configured. While a task
//! runs, its token is registered under the task's principal in [`SubjectTokens`]; a
//! connection acting for that principal reads the newest one when it needs a token, and the
//! registration ends with the task, so no subject token outlives the tasks that carried it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use crate::identity::{SubjectToken, SubjectTokenError};

type Principal = Option<Arc<str>>;

/// The subject tokens of running tasks, by principal; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct SubjectTokens {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    next: AtomicU64,
    by_principal: Mutex<HashMap<Principal, Vec<(u64, SubjectToken)>>>,
}

impl SubjectTokens {
    /// Registers a task's `token` under its `principal` until the returned guard drops.
    pub(crate) fn register(
        &self,
        principal: Option<&str>,
        token: SubjectToken,
    ) -> SubjectRegistration {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let principal: Principal = principal.map(Arc::from);
        self.lock()
            .entry(principal.clone())
            .or_default()
            .push((id, token));
        SubjectRegistration {
            tokens: self.clone(),
            principal,
            id,
        }
    }

    /// The subject token the running tasks of `principal` carry, when they all carry the
    /// same one. Tasks of one principal share its connection, so while two carry different
    /// tokens none is used: one task must never act with another's identity (name each
    /// user as its own principal, see [`Self::differ`]).
    pub(crate) fn current(&self, principal: Option<&str>) -> Option<SubjectToken> {
        let principal: Principal = principal.map(Arc::from);
        let map = self.lock();
        let tokens = map.get(&principal)?;
        let (_, first) = tokens.first()?;
        let fingerprint = first.fingerprint();
        tokens
            .iter()
            .all(|(_, token)| token.fingerprint() == fingerprint)
            .then(|| first.clone())
    }

    /// Whether running tasks of `principal` carry different subject tokens.
    pub(crate) fn differ(&self, principal: Option<&str>) -> bool {
        let principal: Principal = principal.map(Arc::from);
        self.lock().get(&principal).is_some_and(|tokens| {
            tokens
                .windows(2)
                .any(|pair| pair[0].1.fingerprint() != pair[1].1.fingerprint())
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Principal, Vec<(u64, SubjectToken)>>> {
        self.inner
            .by_principal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// A task's subject token, registered until this drops with the task.
pub(crate) struct SubjectRegistration {
    tokens: SubjectTokens,
    principal: Principal,
    id: u64,
}

impl Drop for SubjectRegistration {
    fn drop(&mut self) {
        let mut map = self.tokens.lock();
        if let Some(tokens) = map.get_mut(&self.principal) {
            tokens.retain(|(id, _)| *id != self.id);
            if tokens.is_empty() {
                map.remove(&self.principal);
            }
        }
    }
}

impl std::fmt::Debug for SubjectRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectRegistration")
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_tokens_are_checked_redacted_and_end_with_their_task() {
        assert_eq!(SubjectToken::new(""), Err(SubjectTokenError::Empty));
        assert_eq!(
            SubjectToken::new("Bearer abc"),
            Err(SubjectTokenError::BadCharacter)
        );
        assert_eq!(SubjectToken::new("é"), Err(SubjectTokenError::BadCharacter));
        let huge = "a".repeat(crate::defaults::MAX_SUBJECT_TOKEN_BYTES + 1);
        assert!(matches!(
            SubjectToken::new(&huge),
            Err(SubjectTokenError::TooLong { .. })
        ));
        let token = SubjectToken::new("eyJ.secret-subject.sig").unwrap();
        assert!(!format!("{token:?}").contains("secret"));

        let tokens = SubjectTokens::default();
        let alice = tokens.register(Some("alice"), token.clone());
        let newer = tokens.register(Some("alice"), SubjectToken::new("newer").unwrap());
        assert_eq!(tokens.current(Some("bob")), None);
        assert_eq!(tokens.current(None), None);
        // Two tasks of alice with different tokens: neither is used for the other.
        assert_eq!(tokens.current(Some("alice")), None);
        assert!(tokens.differ(Some("alice")));
        drop(newer);
        assert!(!tokens.differ(Some("alice")));
        let same = tokens.register(Some("alice"), token.clone());
        assert_eq!(tokens.current(Some("alice")), Some(token.clone()));
        drop(same);
        assert_eq!(tokens.current(Some("alice")), Some(token));
        drop(alice);
        assert_eq!(tokens.current(Some("alice")), None);
        assert!(tokens.lock().is_empty(), "nothing is kept after the tasks");
    }
}
