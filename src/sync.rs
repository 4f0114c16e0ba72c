//! The one lock helper the crate's layers share.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, poisoned or not: no critical section in this crate panics half-way through
/// an update, so data behind a poisoned lock is still consistent, and a panic elsewhere must
/// not turn every later cache call into one.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
