//! [`Cause`]: the typed cause of an error that must stay `Clone` and `Eq` (errors handed
//! to several waiters, or compared in tests), where a `Box<dyn Error>` would be neither.

use std::error::Error;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A shared, typed cause. As a `#[source]` field it derefs to the error itself, so
/// `source()` returns that error (which `downcast_ref` finds), not this wrapper. Two causes
/// are equal when they say the same: the text is what an error shows of its cause.
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }
}

impl Deref for Cause {
    type Target = dyn Error + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer {
        #[source]
        cause: Cause,
    }

    #[test]
    fn the_source_is_the_error_itself() {
        let outer = Outer {
            cause: Cause::new(std::io::Error::other("disk gone")),
        };
        let source = outer.source().expect("a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(source.to_string(), "disk gone");
        assert_eq!(
            outer.cause.clone(),
            Cause::new(std::io::Error::other("disk gone"))
        );
    }
}
