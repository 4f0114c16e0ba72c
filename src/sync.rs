//! Small helpers the crate's layers share: the poison-tolerant lock, and instants far ahead.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, poisoned or not: no critical section in this crate panics half-way through
/// an update, so data behind a poisoned lock is still consistent, and a panic elsewhere must
/// not turn every later cache call into one.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `now + after`, or a point far enough ahead to mean "never" where the sum would overflow
/// the clock (a TTL or window set to `Duration::MAX` must not panic).
pub(crate) fn later(now: tokio::time::Instant, after: std::time::Duration) -> tokio::time::Instant {
    const NEVER: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(after.min(NEVER)).unwrap_or(now)
}
