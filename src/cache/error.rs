//! The engine's error type.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A boxed error, as returned by loaders.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a [`Cache::get_or_load`](crate::Cache::get_or_load) call failed.
///
/// Errors are cheap to clone: every caller that shared one load gets the same error.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    source: Option<Arc<dyn StdError + Send + Sync>>,
    /// What `Display` says after the kind that is this error's own, not a cause's: the load
    /// timeout, a panicking loader's message.
    detail: Option<Arc<str>>,
}

/// The kind of an [`Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The loader returned an error; [`Error::source`](StdError::source) is that error.
    Load,
    /// The loader ran longer than the load timeout and was abandoned.
    LoadTimeout,
    /// The loader panicked.
    LoadPanicked,
    /// A follower waited longer than the wait timeout, and the policy is
    /// [`WaitTimeoutPolicy::Error`](crate::WaitTimeoutPolicy::Error).
    WaitTimeout,
    /// Another load of this key failed a moment ago (within the
    /// [`failure_ttl`](crate::CacheBuilder::failure_ttl)), so this call fails at once rather
    /// than call the failing backend again.
    RecentFailure,
    /// The key is marked "pass" (its last load was not cacheable), so there is no value to
    /// share; the caller should go to its backend directly.
    Pass,
    /// A change of the cache ([`Cache::invalidate`](crate::Cache::invalidate),
    /// [`set`](crate::Cache::set), [`expire`](crate::Cache::expire), ...) did not reach the
    /// store; [`Error::source`](StdError::source) is the
    /// [`StoreError`](crate::store::StoreError). This process's L1 was changed all the same.
    Store,
    /// A typed call (`Typed::get_or_load`, feature
    /// `serde`) was handed, twice, a value from this process that is not of its type: the key
    /// is also read raw or as another type in this process.
    Decode,
    /// A purge named a URL the layer could never have stored a response under: one without
    /// an authority (`/p/5`), or of a scheme other than `http` and `https`
    /// ([`Purger::purge_url`](crate::http::Purger::purge_url)). Nothing was removed.
    Url,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Error {
            kind,
            source: None,
            detail: None,
        }
    }

    pub(crate) fn load(source: BoxError) -> Self {
        Error {
            source: Some(Arc::from(source)),
            ..Error::new(ErrorKind::Load)
        }
    }

    pub(crate) fn load_timeout(after: Duration) -> Self {
        Error {
            detail: Some(format!("abandoned after {after:?}").into()),
            ..Error::new(ErrorKind::LoadTimeout)
        }
    }

    /// A loader that panicked, with its panic's message where the payload is text (as
    /// `panic!` makes it).
    pub(crate) fn panicked(payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&'static str>()
            .map(|text| Arc::from(*text))
            .or_else(|| {
                payload
                    .downcast_ref::<String>()
                    .map(|text| Arc::from(text.as_str()))
            });
        Error {
            detail: message,
            ..Error::new(ErrorKind::LoadPanicked)
        }
    }

    pub(crate) fn store(source: crate::store::StoreError) -> Self {
        Error {
            source: Some(Arc::new(source)),
            ..Error::new(ErrorKind::Store)
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The cause, if there is one: the loader's own error for [`ErrorKind::Load`] (downcast it
    /// to your type), the [`StoreError`](crate::store::StoreError) for [`ErrorKind::Store`].
    /// It is also [`source`](StdError::source), so a reporter that walks the chain (`anyhow`'s
    /// `{:#}`, `eyre`) prints it after this error's own message, which does not repeat it.
    ///
    /// ```
    /// use tower_stampede::{store::MemoryStore, Cache, ErrorKind};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let load = || async { Err::<bytes::Bytes, _>(std::io::Error::other("database down")) };
    /// let error = cache.get_or_load("user:42", load).await.unwrap_err();
    /// assert_eq!(error.kind(), ErrorKind::Load);
    /// assert_eq!(error.to_string(), "the load failed");
    /// let cause = error.get_ref().and_then(|cause| cause.downcast_ref::<std::io::Error>());
    /// assert_eq!(cause.map(|io| io.kind()), Some(std::io::ErrorKind::Other));
    /// let source = std::error::Error::source(&error).map(ToString::to_string);
    /// assert_eq!(source.as_deref(), Some("database down"));
    /// # }
    /// ```
    pub fn get_ref(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .field("detail", &self.detail)
            .finish()
    }
}

impl fmt::Display for Error {
    /// What went wrong, without its cause (`the load failed`): the cause is
    /// [`source`](StdError::source), which a reporter prints after it. What belongs to the
    /// error itself follows the kind: `the load timed out: abandoned after 30s`, `the load
    /// panicked: index out of bounds`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.describe())?;
        match &self.detail {
            Some(detail) => write!(f, ": {detail}"),
            None => Ok(()),
        }
    }
}

impl ErrorKind {
    /// The kind in words, as [`Error`]'s `Display` starts.
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Load => "the load failed",
            ErrorKind::LoadTimeout => "the load timed out",
            ErrorKind::LoadPanicked => "the load panicked",
            ErrorKind::WaitTimeout => "timed out waiting for another load",
            ErrorKind::RecentFailure => "another load of this key failed a moment ago",
            ErrorKind::Pass => "the key is marked pass",
            ErrorKind::Store => "the store did not answer",
            ErrorKind::Decode => "the value in this process is not of the requested type",
            ErrorKind::Url => "the URL names no page the layer could store: it needs a scheme (http or https) and an authority",
        }
    }
}

impl StdError for Error {
    /// The cause: the loader's own error, or the [`StoreError`](crate::store::StoreError)
    /// (as [`Error::get_ref`] gives it, to downcast).
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, StoreErrorKind};

    #[derive(Debug)]
    struct Backend;

    impl fmt::Display for Backend {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("backend down")
        }
    }

    impl StdError for Backend {}

    #[test]
    fn a_report_shows_each_message_once_and_the_cause_downcasts() {
        let report = anyhow::Error::from(Error::load(Box::new(Backend)));
        assert_eq!(format!("{report:#}"), "the load failed: backend down");
        assert!(report.chain().any(|cause| cause.is::<Backend>()));
    }

    #[test]
    fn a_store_error_is_the_source_with_its_own_cause_after_it() {
        let cause = std::io::Error::other("broken pipe");
        let store = StoreError::with_source(StoreErrorKind::Connection, "Redis at h:1", cause);
        let report = anyhow::Error::from(Error::store(store));
        assert_eq!(
            format!("{report:#}"),
            "the store did not answer: Redis at h:1: broken pipe"
        );
        let kind = report
            .chain()
            .find_map(|cause| cause.downcast_ref::<StoreError>())
            .map(StoreError::kind);
        assert_eq!(kind, Some(StoreErrorKind::Connection));
    }

    #[test]
    fn a_panic_keeps_its_message_when_it_is_text() {
        let literal: Box<dyn std::any::Any + Send> = Box::new("index out of bounds");
        let formatted: Box<dyn std::any::Any + Send> = Box::new(format!("row {}", 7));
        let other: Box<dyn std::any::Any + Send> = Box::new(7_u8);
        let shown =
            [literal, formatted, other].map(|payload| Error::panicked(&*payload).to_string());
        assert_eq!(
            shown,
            [
                "the load panicked: index out of bounds",
                "the load panicked: row 7",
                "the load panicked",
            ]
        );
    }

    #[test]
    fn a_timeout_says_when_it_gave_up_and_has_no_source() {
        let error = Error::load_timeout(Duration::from_secs(30));
        assert_eq!(error.to_string(), "the load timed out: abandoned after 30s");
        assert!(error.source().is_none());
    }
}
