//! The middleware service: [`Stampede`], its accessors, and the [`Service`] impl that sorts
//! each request (a purge, ignored, an unsafe method that invalidates, bypassed, or cached) and
//! hands a cacheable one to the [`flow`](crate::http::serving::flow).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response};
use http_body::Body;
use tower::util::Oneshot;
use tower::Service;

use super::future::ResponseFuture;
use crate::cache::Cache;
use crate::http::invalidation::by_url;
use crate::http::invalidation::purge::{self, Purger};
use crate::http::rules::request::{self, RequestRule};
use crate::http::serving::body::ResponseBody;
use crate::http::serving::cache_status::Served;
use crate::http::serving::config::HttpConfig;
use crate::http::serving::flow::{fetch, from_l1};
use crate::http::serving::load::Loading;
use crate::http::serving::responses::AnswerForm;
use crate::http::stored::key;
use crate::store::KeyDigest;

/// The middleware service; see the [module docs](crate::http) and [`StampedeLayer`](crate::http::StampedeLayer).
///
/// # Backpressure
///
/// A `Stampede` is always ready: cache hits and followers waiting for another request's load
/// never call the inner service, so they must not hold its readiness. Each call that does reach
/// the inner service (a load, a pass, another method) drives a clone of it to readiness first,
/// inside the response future. Put a concurrency limit *inside* the layer to bound the load on
/// the backend, or *outside* it to bound requests in flight.
#[derive(Clone, Debug)]
pub struct Stampede<S> {
    inner: S,
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl<S> Stampede<S> {
    pub(crate) fn new(inner: S, cache: Cache, config: Arc<HttpConfig>) -> Self {
        Stampede {
            inner,
            cache,
            config,
        }
    }

    inner_service_accessors!();

    /// The request's key under the [`MakeKey`](crate::http::MakeKey), made apart for requests with
    /// credentials or keyed forwarding headers (see [`key::primary`]), and its digest (hashed
    /// once: for L1, the forwarding variants and the fetch if L1 cannot answer); and whether
    /// it is a forwarded one; or `None`: the key cannot describe the request.
    fn primary_key(&self, parts: &mut Parts) -> Option<(String, KeyDigest, bool)> {
        // A HEAD is answered from the GET entry, so its key is the GET's.
        let method = std::mem::replace(&mut parts.method, Method::GET);
        let config = &self.config;
        let primary = config.make_key.make_key(parts).map(|key| {
            let credentialed = config.policy.credentialed(parts);
            let forwarded = config.reflected.forwarded(&parts.headers);
            let primary = key::primary(key, credentialed, forwarded);
            let digest = KeyDigest::of(primary.as_bytes());
            (primary, digest, forwarded)
        });
        parts.method = method;
        primary
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Stampede<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Oneshot<S, Request<ReqBody>>, ResBody, S::Error>;

    /// Always ready; see [Backpressure](Stampede#backpressure).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The inner service and the configuration are cloned only by the paths that keep
        // them: an L1 hit, answered here, needs neither. A clone of the inner service is only
        // ever called through `Oneshot`, which polls it ready first.
        if self.config.purge.is_some() && request.method().as_str() == "PURGE" {
            let purger = Purger::new(self.cache.clone(), Arc::clone(&self.config));
            let (parts, _body) = request.into_parts();
            return ResponseFuture::boxed(Box::pin(purge::endpoint(purger, parts)));
        }
        let (honor_client_no_cache, reflected) =
            (self.config.honor_client_no_cache, &self.config.reflected);
        let (bypassed, served) =
            match request::request_rule(&request, honor_client_no_cache, reflected) {
                RequestRule::Ignore => {
                    let inner = Oneshot::new(self.inner.clone(), request);
                    return ResponseFuture::inner(inner, None, Arc::clone(&self.config));
                }
                RequestRule::Invalidate => {
                    let (parts, body) = request.into_parts();
                    let invalidates = self.config.invalidates_after(&parts);
                    let request = Request::from_parts(parts, body);
                    let (inner, config) = (self.inner.clone(), Arc::clone(&self.config));
                    if !invalidates {
                        let inner = Oneshot::new(inner, request);
                        let served = Some(Served::Unsafe(None));
                        return ResponseFuture::inner(inner, served, config);
                    }
                    let sent = by_url::send_unsafe(inner, self.cache.clone(), config, request);
                    return ResponseFuture::boxed(Box::pin(sent));
                }
                RequestRule::Bypass(pass) => (request, Served::Request(pass)),
                RequestRule::Cache => {
                    // Taken apart once: the key is made from the parts, and a hit drops them.
                    let (mut parts, body) = request.into_parts();
                    match self.primary_key(&mut parts) {
                        Some((primary, digest, forwarded)) => {
                            let form = AnswerForm::of(&parts);
                            let url = (primary.as_str(), &digest);
                            let (variants, keyed) = (
                                &self.config.forwarded_variants,
                                self.config.reflected.keyed(),
                            );
                            if let Some(response) =
                                from_l1(&self.cache, url, &parts.headers, &form, &self.config)
                            {
                                if forwarded {
                                    variants.used(&digest, keyed, &parts.headers);
                                }
                                return ResponseFuture::ready(response);
                            }
                            // A set of forwarding values the URL is not stored for is looked
                            // up and coalesced, and its load stores nothing.
                            let stores =
                                !forwarded || variants.admit(&digest, keyed, &parts.headers);
                            let loading = Loading {
                                inner: self.inner.clone(),
                                cache: self.cache.clone(),
                                config: Arc::clone(&self.config),
                                forwarded,
                                stores,
                            };
                            let request = Request::from_parts(parts, body);
                            let fetched = fetch(loading, primary, digest, request, form);
                            return ResponseFuture::boxed(Box::pin(fetched));
                        }
                        // The key cannot describe the request.
                        None => (Request::from_parts(parts, body), Served::Unkeyed),
                    }
                }
            };
        self.cache.count_bypass();
        let inner = Oneshot::new(self.inner.clone(), bypassed);
        ResponseFuture::inner(inner, Some(served), Arc::clone(&self.config))
    }
}
