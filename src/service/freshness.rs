//! How long a response stays fresh: [`Freshness`], fixed or chosen per response
//! ([`FreshnessFor`]), and whether an error is stored at all.

use std::time::Duration;

use bytes::Bytes;

#[cfg(doc)]
use crate::cache::CacheBuilder;
use crate::cache::Loaded;

/// How a response of the inner service is stored: for how long, with which stale windows
/// and tags, or not at all. The same choices as a loader's [`Loaded`].
///
/// ```
/// # use std::time::Duration;
/// # use tower_stampede::service::Freshness;
/// let freshness = Freshness::ttl(Duration::from_secs(60))
///     .stale_while_revalidate(Duration::from_secs(10))
///     .tags(["users"]);
/// ```
#[derive(Clone, Debug)]
pub struct Freshness {
    /// The result to store, its bytes put in once the response is encoded.
    template: Loaded,
}

impl Default for Freshness {
    /// [`Freshness::default_ttl`].
    fn default() -> Self {
        Freshness::default_ttl()
    }
}

impl Freshness {
    /// Fresh for the cache's default [`ttl`](CacheBuilder::ttl).
    pub fn default_ttl() -> Self {
        Freshness {
            template: Loaded::value(Bytes::new()),
        }
    }

    /// Fresh for `ttl`.
    pub fn ttl(ttl: Duration) -> Self {
        Freshness {
            template: Loaded::value_with_ttl(Bytes::new(), ttl),
        }
    }

    /// Not stored: the response goes to its own caller only, and the calls that waited for
    /// it call the inner service themselves (see [`Loaded::pass`]).
    pub fn pass() -> Self {
        Freshness {
            template: Loaded::pass(),
        }
    }

    /// A stale-while-revalidate window of its own (see [`Loaded::stale_while_revalidate`]).
    #[must_use]
    pub fn stale_while_revalidate(self, window: Duration) -> Self {
        Freshness {
            template: self.template.stale_while_revalidate(window),
        }
    }

    /// A stale-if-error window of its own (see [`Loaded::stale_if_error`]).
    #[must_use]
    pub fn stale_if_error(self, window: Duration) -> Self {
        Freshness {
            template: self.template.stale_if_error(window),
        }
    }

    /// Never served past its freshness (see [`Loaded::must_revalidate`]).
    #[must_use]
    pub fn must_revalidate(self) -> Self {
        Freshness {
            template: self.template.must_revalidate(),
        }
    }

    /// Tags, for [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) (see [`Loaded::tags`]).
    #[must_use]
    pub fn tags<I, T>(self, tags: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        Freshness {
            template: self.template.tags(tags),
        }
    }

    /// The result to hand the engine for `bytes`.
    pub(super) fn loaded(self, bytes: Bytes) -> Loaded {
        self.template.with_bytes(bytes)
    }
}

/// How the layer chooses the [`Freshness`] of each response, and which errors it stores.
///
/// A [`Freshness`] is one (the same for every response), and so is any
/// `Fn(&Response) -> Freshness`.
pub trait FreshnessFor<R, E>: Send + Sync + 'static {
    /// How `response` is stored.
    fn freshness(&self, response: &R) -> Freshness;

    /// How `error` is stored, if at all; `None` (the default): errors are never stored.
    fn error_freshness(&self, error: &E) -> Option<Freshness> {
        let _ = error;
        None
    }
}

impl<R, E> FreshnessFor<R, E> for Freshness {
    fn freshness(&self, _response: &R) -> Freshness {
        self.clone()
    }
}

impl<R, E, F> FreshnessFor<R, E> for F
where
    F: Fn(&R) -> Freshness + Send + Sync + 'static,
{
    fn freshness(&self, response: &R) -> Freshness {
        self(response)
    }
}

/// A [`FreshnessFor`] that stores the errors `errors` chooses too; made by
/// [`CacheLayer::cache_errors`](super::CacheLayer::cache_errors).
#[derive(Clone, Debug)]
pub struct CachingErrors<F, G> {
    pub(super) responses: F,
    pub(super) errors: G,
}

impl<R, E, F, G> FreshnessFor<R, E> for CachingErrors<F, G>
where
    F: FreshnessFor<R, E>,
    G: Fn(&E) -> Option<Freshness> + Send + Sync + 'static,
{
    fn freshness(&self, response: &R) -> Freshness {
        self.responses.freshness(response)
    }

    fn error_freshness(&self, error: &E) -> Option<Freshness> {
        (self.errors)(error)
    }
}
