//! The guarded service: [`CacheService`], its accessors, and the [`Service`] impl that sorts
//! each request (no key: straight through; a key: L1, else [`fetch`](super::fetch)).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::Oneshot;
use tower::Service;

use super::codec::{self, ServiceCodec};
use super::error::MapError;
use super::fetch::fetch;
use super::freshness::FreshnessFor;
use super::future::ResponseFuture;
use super::settings::Settings;
use crate::cache::Cache;
use crate::store::KeyDigest;

/// A service whose calls are answered from the cache, one load per stampede across
/// processes; see the [module docs](super) and [`CacheLayer`](super::CacheLayer).
///
/// # Backpressure
///
/// A `CacheService` is always ready: cache hits and calls waiting for another call's load
/// never call the inner service, so they must not hold its readiness. Each call that does
/// reach the inner service (a load, a request without a key, a call after a pass) drives a
/// clone of it to readiness first, inside the response future (`Oneshot`). Put a
/// concurrency limit *inside* the layer to bound the loads on the backend, or *outside* it
/// to bound calls in flight.
pub struct CacheService<S, K, C, F, M> {
    inner: S,
    cache: Cache,
    settings: Arc<Settings<K, C, F, M>>,
}

impl<S: Clone, K, C, F, M> Clone for CacheService<S, K, C, F, M> {
    fn clone(&self) -> Self {
        CacheService {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: fmt::Debug, K, C, F, M> fmt::Debug for CacheService<S, K, C, F, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheService")
            .field("inner", &self.inner)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl<S, K, C, F, M> CacheService<S, K, C, F, M> {
    pub(super) fn new(inner: S, cache: Cache, settings: Arc<Settings<K, C, F, M>>) -> Self {
        CacheService {
            inner,
            cache,
            settings,
        }
    }

    inner_service_accessors!();
}

impl<S, Req, K, Key, C, F, M> Service<Req> for CacheService<S, K, C, F, M>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Clone + Send + Sync + 'static,
    S::Error: Send + 'static,
    Req: Send + 'static,
    K: Fn(&Req) -> Option<Key> + Send + Sync + 'static,
    Key: AsRef<[u8]>,
    C: ServiceCodec<S::Response, S::Error>,
    F: FreshnessFor<S::Response, S::Error>,
    M: MapError<S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<Oneshot<S, Req>, S::Response, S::Error>;

    /// Always ready; see [Backpressure](CacheService#backpressure).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let Some(key) = (self.settings.key)(&request) else {
            return ResponseFuture::inner(Oneshot::new(self.inner.clone(), request));
        };
        let digest = KeyDigest::of(key.as_ref());
        let codec = &self.settings.codec;
        // Decoded once per L1 entry; each hit hands out a clone.
        if let Some(found) = self.cache.l1_hit(
            &digest,
            |bytes| codec::decode_response(codec, bytes),
            |value| Arc::new(S::Response::clone(value)),
        ) {
            return ResponseFuture::ready(S::Response::clone(&found.value));
        }
        let (inner, cache) = (self.inner.clone(), self.cache.clone());
        let settings = Arc::clone(&self.settings);
        ResponseFuture::boxed(Box::pin(fetch(inner, cache, settings, digest, request)))
    }
}
