//! The layer: the configuration a user writes, shared by every service it makes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

use super::cache_service::CacheService;
use super::error::IntoError;
use super::freshness::{CachingErrors, Freshness};
use super::settings::Settings;
use crate::cache::Cache;

/// Wraps services in a [`CacheService`] over one [`Cache`]; see the [module docs](super).
///
/// Type parameters: `K` the key function, `C` the [`ServiceCodec`](super::ServiceCodec),
/// `F` the [`FreshnessFor`](super::FreshnessFor), `M` the [`MapError`](super::MapError).
#[derive(Clone)]
#[must_use]
pub struct CacheLayer<K, C, F = Freshness, M = IntoError> {
    cache: Cache,
    settings: Settings<K, C, F, M>,
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<K, R> CacheLayer<K, crate::cache::Typed<R>> {
    /// A layer that caches the responses of type `R` through `cache`, encoded as
    /// [typed values](crate::cache::typed) with [`Postcard`](crate::cache::Postcard), fresh
    /// for the cache's default TTL, keyed by `key` (a request whose key is `None` goes to
    /// the inner service untouched).
    pub fn new(cache: Cache, key: K) -> Self {
        let typed = cache.typed::<R>();
        Self::with_codec(cache, key, typed)
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<K, R, D> CacheLayer<K, crate::cache::Typed<R, D>>
where
    R: serde::Serialize + serde::de::DeserializeOwned,
    D: crate::cache::Codec,
{
    /// Like [`new`](CacheLayer::new), through a typed handle of your own (with its schema
    /// version, schema name or codec).
    pub fn typed(typed: crate::cache::Typed<R, D>, key: K) -> Self {
        let cache = typed.cache().clone();
        Self::with_codec(cache, key, typed)
    }
}

impl<K, C> CacheLayer<K, C> {
    /// A layer that caches through `cache`, its responses encoded by `codec` (a
    /// [`ServiceCodec`](super::ServiceCodec)), fresh for the cache's default TTL, keyed by
    /// `key`.
    pub fn with_codec(cache: Cache, key: K, codec: C) -> Self {
        CacheLayer {
            cache,
            settings: Settings {
                key,
                codec,
                freshness: Freshness::default_ttl(),
                map_error: IntoError,
            },
        }
    }
}

impl<K, C, F, M> CacheLayer<K, C, F, M> {
    /// Every response is fresh for `ttl`.
    pub fn ttl(self, ttl: Duration) -> CacheLayer<K, C, Freshness, M> {
        self.freshness(Freshness::ttl(ttl))
    }

    /// How each response is stored: a [`Freshness`] for all, or a function of the response
    /// (`Fn(&Response) -> Freshness`), any [`FreshnessFor`](super::FreshnessFor).
    pub fn freshness<G>(self, freshness: G) -> CacheLayer<K, C, G, M> {
        self.remade(|_| freshness, |map_error| map_error)
    }

    /// Stores the errors of the inner service that `errors` gives a [`Freshness`] (a "not
    /// found", say), where the codec can encode them
    /// ([`encode_error`](super::ServiceCodec::encode_error)). By default no error is stored:
    /// it goes to the calls that waited for its load, and the next call loads again. Call
    /// it after [`ttl`](Self::ttl) or [`freshness`](Self::freshness), which replace it.
    pub fn cache_errors<G>(self, errors: G) -> CacheLayer<K, C, CachingErrors<F, G>, M> {
        let caching = |responses| CachingErrors { responses, errors };
        self.remade(caching, |map_error| map_error)
    }

    /// How an error of the cache becomes the inner service's error (see
    /// [`MapError`](super::MapError)); needed where that type is not `From<Error>`.
    pub fn map_error<N>(self, map_error: N) -> CacheLayer<K, C, F, N> {
        self.remade(|freshness| freshness, |_| map_error)
    }

    /// The same layer with its freshness and its error mapping made anew from the old.
    fn remade<G, N>(
        self,
        freshness: impl FnOnce(F) -> G,
        map_error: impl FnOnce(M) -> N,
    ) -> CacheLayer<K, C, G, N> {
        let Settings {
            key,
            codec,
            freshness: old_freshness,
            map_error: old_map_error,
        } = self.settings;
        CacheLayer {
            cache: self.cache,
            settings: Settings {
                key,
                codec,
                freshness: freshness(old_freshness),
                map_error: map_error(old_map_error),
            },
        }
    }
}

impl<S, K, C, F, M> Layer<S> for CacheLayer<K, C, F, M>
where
    K: Clone,
    C: Clone,
    F: Clone,
    M: Clone,
{
    type Service = CacheService<S, K, C, F, M>;

    fn layer(&self, inner: S) -> Self::Service {
        CacheService::new(inner, self.cache.clone(), Arc::new(self.settings.clone()))
    }
}

impl<K, C, F, M> fmt::Debug for CacheLayer<K, C, F, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}
