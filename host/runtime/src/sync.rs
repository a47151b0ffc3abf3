//! Locking shared by the units whose data stays whole between statements.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`, whatever a panic elsewhere left it in. Only for data that every change leaves
/// whole in a single call, so a panic cannot leave it half-changed.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
