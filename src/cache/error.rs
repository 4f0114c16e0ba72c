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
    /// What went wrong, without the cause: [`source`](StdError::source) returns that, so
    /// reporters that walk the chain do not print it twice.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            ErrorKind::Load => "the load failed",
            ErrorKind::LoadTimeout => "the load timed out",
            ErrorKind::LoadPanicked => "the load panicked",
            ErrorKind::WaitTimeout => "timed out waiting for another load",
            ErrorKind::RecentFailure => "another load of this key failed a moment ago",
            ErrorKind::Pass => "the key is marked pass",
            ErrorKind::Store => "the change did not reach the store",
            ErrorKind::Decode => "the value in this process is not of the requested type",
            ErrorKind::Url => "the URL names no page the layer could store: it needs a scheme (http or https) and an authority",
        })
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
