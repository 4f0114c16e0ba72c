//! `StoreError`: why a store call failed, as a kind and, where there is one, the error that
//! caused it.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// An error from a store: the store could not be reached or answered something unexpected.
///
/// The engine treats every store error the same way: it falls back to protection within this
/// process, so a store error is never an outage. [`kind`](Self::kind) says what went wrong, for
/// metrics and health checks; [`source`](StdError::source) is the error of the store's client
/// behind it, where there is one (for `RedisStore`, a `redis::RedisError`).
///
/// `Display` gives the message (`Redis at redis://host:6379/`) and not its cause, which is
/// [`source`](StdError::source) (`broken pipe`): a reporter that walks the chain (`anyhow`'s
/// `{:#}`, `tracing`'s `error = &e as &dyn Error`, which this crate's logs use) prints each
/// once. Addresses in messages never hold user names or passwords, and `Debug` shows the
/// cause as `Display` does, not the client's own `Debug`.
///
/// Errors are cheap to clone.
#[derive(Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: Arc<str>,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

/// The kind of a [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The call did not complete in time: the engine's
    /// [`store_timeout`](crate::CacheBuilder::store_timeout), or the client's own.
    Timeout,
    /// The store could not be reached or is not serving: connecting failed or was refused
    /// (credentials included), the connection broke, or a cluster is down.
    Connection,
    /// The store answered, but not as the call expects: an error reply, or a reply of an
    /// unexpected shape.
    Protocol,
    /// The call was not made: the engine's circuit breaker is open, so it cannot have taken a
    /// lock.
    Skipped,
    /// The store's settings are wrong: an invalid URL, TLS asked for but not available, root
    /// certificates that hold no certificate.
    Configuration,
    /// Anything else: an error made with [`StoreError::new`].
    Other,
}

impl StoreError {
    /// A store error with a message and no cause, of kind [`StoreErrorKind::Other`] (for store
    /// implementations).
    pub fn new(message: impl fmt::Display) -> Self {
        StoreError::of_kind(StoreErrorKind::Other, message)
    }

    /// A store error of `kind`, with a message and the error that caused it (for store
    /// implementations). The message says what failed, the source why; `Display` shows the
    /// message, `source` the cause.
    pub fn with_source(
        kind: StoreErrorKind,
        message: impl fmt::Display,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind,
            message: message.to_string().into(),
            source: Some(Arc::from(source.into())),
        }
    }

    /// A store error of `kind` with a message and no cause.
    pub(crate) fn of_kind(kind: StoreErrorKind, message: impl fmt::Display) -> Self {
        StoreError {
            kind,
            message: message.to_string().into(),
            source: None,
        }
    }

    pub(crate) fn timeout(after: Duration) -> Self {
        StoreError::of_kind(
            StoreErrorKind::Timeout,
            format_args!("store call timed out after {after:?}"),
        )
    }

    pub(crate) fn circuit_open() -> Self {
        StoreError::of_kind(
            StoreErrorKind::Skipped,
            "store call skipped: the circuit breaker is open",
        )
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the call was never made, because the circuit breaker was open (so it cannot
    /// have taken a lock).
    pub(crate) fn skipped(&self) -> bool {
        self.kind == StoreErrorKind::Skipped
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("StoreError");
        debug
            .field("kind", &self.kind)
            .field("message", &self.message);
        if let Some(source) = &self.source {
            debug.field("source", &format_args!("{source}"));
        }
        debug.finish()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_the_source_and_not_in_the_message() {
        let cause = std::io::Error::other("broken pipe");
        let error = StoreError::with_source(StoreErrorKind::Connection, "Redis at h:1", cause);
        assert_eq!(error.kind(), StoreErrorKind::Connection);
        assert_eq!(error.to_string(), "Redis at h:1");
        let source = error.source().map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("broken pipe"));
        assert!(format!("{error:?}").contains("broken pipe"));
    }

    #[test]
    fn kinds_of_the_engine_errors() {
        let timeout = StoreError::timeout(Duration::from_millis(50));
        assert_eq!(timeout.kind(), StoreErrorKind::Timeout);
        assert!(!timeout.skipped());
        assert_eq!(timeout.to_string(), "store call timed out after 50ms");
        assert!(timeout.source().is_none());
        let skipped = StoreError::circuit_open();
        assert_eq!(skipped.kind(), StoreErrorKind::Skipped);
        assert!(skipped.skipped());
        assert_eq!(StoreError::new("odd").kind(), StoreErrorKind::Other);
    }
}
