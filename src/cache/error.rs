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
        Error { kind, source: None }
    }

    pub(crate) fn load(source: BoxError) -> Self {
        Error {
            kind: ErrorKind::Load,
            source: Some(Arc::from(source)),
        }
    }

    pub(crate) fn load_timeout(after: Duration) -> Self {
        Error {
            kind: ErrorKind::LoadTimeout,
            source: Some(Arc::from(BoxError::from(format!(
                "load abandoned after {after:?}"
            )))),
        }
    }

    pub(crate) fn store(source: crate::store::StoreError) -> Self {
        Error {
            kind: ErrorKind::Store,
            source: Some(Arc::new(source)),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The cause, if there is one: the loader's own error for [`ErrorKind::Load`] (downcast it
    /// to your type), the [`StoreError`](crate::store::StoreError) for [`ErrorKind::Store`].
    /// `Display` prints it after the kind.
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
    /// assert_eq!(error.to_string(), "the load failed: database down");
    /// let cause = error.get_ref().and_then(|cause| cause.downcast_ref::<std::io::Error>());
    /// assert_eq!(cause.map(|io| io.kind()), Some(std::io::ErrorKind::Other));
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
            .finish()
    }
}

impl fmt::Display for Error {
    /// What went wrong, then its cause: `the load failed: connection refused`. As with
    /// [`std::io::Error`], the cause is [`get_ref`](Error::get_ref), and
    /// [`source`](StdError::source) is the cause's own source, so a reporter that walks the
    /// chain prints each message once.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.describe())?;
        match &self.source {
            Some(cause) => write!(f, ": {cause}"),
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
    /// The cause's own source: the cause itself is in `Display` and [`Error::get_ref`].
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().and_then(StdError::source)
    }
}
