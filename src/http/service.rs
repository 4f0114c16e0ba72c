//! The middleware service and the path of a cacheable request through it.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tower::util::Oneshot;
use tower::Service;
use tracing::{debug, warn};

use super::body::ResponseBody;
use super::codec::{self, CachedResponse};
use super::future::ResponseFuture;
use super::policy::{self, RequestRule, ResponseRule};
use super::{HttpConfig, BYPASS, HIT, MISS, STALE, X_CACHE};
use crate::cache::{BoxError, Cache, ErrorKind, Loaded, Outcome};

/// The middleware service; see the [module docs](super) and [`StampedeLayer`](super::StampedeLayer).
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

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    pub fn into_inner(self) -> S {
        self.inner
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

    /// Always ready: hits and waiting followers never touch the inner service, so they must not
    /// hold its readiness. Every call to the inner service waits for its readiness itself.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A clone is only ever called through `Oneshot`, which polls it ready first.
        let inner = self.inner.clone();
        match policy::request_rule(&request) {
            RequestRule::Ignore => ResponseFuture::inner(Oneshot::new(inner, request), None),
            RequestRule::Bypass => {
                crate::cache::telemetry::lookup("bypass");
                ResponseFuture::inner(Oneshot::new(inner, request), Some(BYPASS))
            }
            RequestRule::Cache(key) => ResponseFuture::cached(Box::pin(serve(
                inner,
                self.cache.clone(),
                Arc::clone(&self.config),
                key,
                request,
            ))),
        }
    }
}

/// A request waiting to be sent, shared between the caller and its loader: the loader takes it
/// if it runs; otherwise the caller still has it if it must go to the inner service itself.
type RequestSlot<ReqBody> = Arc<Mutex<Option<Request<ReqBody>>>>;

fn take<ReqBody>(slot: &RequestSlot<ReqBody>) -> Option<Request<ReqBody>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// What the loader hands straight to its own caller when the response cannot come from the
/// cache: the inner service's error, or a response passed through.
type LeaderResponse<ResBody, E> = Result<Response<ResponseBody<ResBody>>, E>;

/// A cacheable request: served from the cache, by this request's own load, or (for a pass or a
/// failed load elsewhere) by the inner service directly.
async fn serve<S, ReqBody, ResBody>(
    inner: S,
    cache: Cache,
    config: Arc<HttpConfig>,
    key: String,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let slot: RequestSlot<ReqBody> = Arc::new(Mutex::new(Some(request)));
    let (to_leader, mut from_loader) = oneshot::channel();
    let loader = {
        let (inner, slot) = (inner.clone(), Arc::clone(&slot));
        move || load(inner, config, slot, to_leader)
    };
    let fetched = cache.fetch(key, loader).await;
    // A cached response (a stale one included, in place of this request's own failed load)
    // comes first; then what this request's own load could not store.
    let cached = match &fetched {
        Ok(fetched) => fetched
            .value()
            .map(|value| (codec::decode(value), fetched.outcome())),
        Err(_) => None,
    };
    if let Some((Ok(cached), outcome)) = cached {
        return Ok(from_cache(cached, outcome));
    }
    if let Ok(own) = from_loader.try_recv() {
        return own;
    }
    // A failed load (this request's or another's, here or in another process) is answered
    // with a gateway error rather than by calling the failing inner service again; a pass (or
    // an entry that is not a response) goes to the inner service directly.
    let failed = match fetched {
        Ok(fetched) => {
            if fetched.value().is_some() {
                warn!("cached entry is not a response; passing the request through");
            }
            None
        }
        Err(error) => {
            debug!(%error, "no cached response");
            Some(match error.kind() {
                ErrorKind::WaitTimeout | ErrorKind::LoadTimeout => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            })
        }
    };
    match (failed, take(&slot)) {
        (None, Some(request)) => {
            let mut response = Oneshot::new(inner, request).await?.map(ResponseBody::inner);
            response.headers_mut().insert(X_CACHE.clone(), BYPASS);
            Ok(response)
        }
        (Some(status), _) => Ok(synthesized(status)),
        // This request's own load took the request and ended without an answer for it.
        (None, None) => Ok(synthesized(StatusCode::BAD_GATEWAY)),
    }
}

/// The loader of a cacheable request: calls the inner service and reads the body, up to the
/// size limit, into a cache entry. Whatever cannot be stored goes to this request's own caller.
async fn load<S, ReqBody, ResBody>(
    inner: S,
    config: Arc<HttpConfig>,
    slot: RequestSlot<ReqBody>,
    to_leader: oneshot::Sender<LeaderResponse<ResBody, S::Error>>,
) -> Result<Loaded, BoxError>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    let request = take(&slot).ok_or("the request was already sent")?;
    let response = match Oneshot::new(inner, request).await {
        Ok(response) => response,
        Err(error) => {
            let _ = to_leader.send(Err(error));
            return Err("the inner service failed".into());
        }
    };
    let (parts, body) = response.into_parts();
    let pass_through = |body: ResponseBody<ResBody>| {
        let mut response = Response::from_parts(parts.clone(), body);
        response.headers_mut().insert(X_CACHE.clone(), BYPASS);
        response
    };
    let ttl = match policy::response_rule(parts.status, &parts.headers) {
        ResponseRule::Store(ttl) => ttl,
        ResponseRule::Pass => {
            let _ = to_leader.send(Ok(pass_through(ResponseBody::inner(body))));
            return Ok(Loaded::pass());
        }
        ResponseRule::Failure => {
            // A failed load: a stale response, if there is one, is served in its place.
            let status = parts.status;
            let _ = to_leader.send(Ok(pass_through(ResponseBody::inner(body))));
            return Err(format!("the inner service answered {status}").into());
        }
    };
    let chunks = match read_body(Box::pin(body), config.max_body_bytes).await {
        Read::Complete(chunks) => chunks,
        Read::Stopped {
            read,
            trailers,
            error,
            rest,
        } => {
            let failed = error.is_some();
            let body = ResponseBody::replay(read, trailers, error, rest);
            let _ = to_leader.send(Ok(pass_through(body)));
            return if failed {
                Err("the response body failed".into())
            } else {
                Ok(Loaded::pass())
            };
        }
    };
    let stored: Vec<_> = parts
        .headers
        .iter()
        .filter(|(name, _)| policy::is_stored_header(name, &parts.headers))
        .collect();
    let Some(entry) = codec::encode(parts.status, &stored, &chunks) else {
        let body = ResponseBody::replay(chunks, None, None, None);
        let _ = to_leader.send(Ok(pass_through(body)));
        return Ok(Loaded::pass());
    };
    Ok(match ttl {
        Some(ttl) => Loaded::value_with_ttl(entry, ttl),
        None => Loaded::value(entry),
    })
}

/// How reading a body for the cache ended.
enum Read<B: Body> {
    /// All of it, within the limit, with no trailers.
    Complete(Vec<Bytes>),
    /// Not storable: over the limit, with trailers, or failed. Holds what was read, then what
    /// stopped the read, then the unread rest.
    Stopped {
        read: Vec<Bytes>,
        trailers: Option<http::HeaderMap>,
        error: Option<B::Error>,
        rest: Option<Pin<Box<B>>>,
    },
}

async fn read_body<B>(mut body: Pin<Box<B>>, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes>,
{
    let mut read = Vec::new();
    if body.size_hint().lower() > limit as u64 {
        return Read::Stopped {
            read,
            trailers: None,
            error: None,
            rest: Some(body),
        };
    }
    let mut len = 0usize;
    loop {
        match body.frame().await {
            None => return Read::Complete(read),
            Some(Err(error)) => {
                return Read::Stopped {
                    read,
                    trailers: None,
                    error: Some(error),
                    rest: None,
                }
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    len = len.saturating_add(chunk.len());
                    read.push(chunk);
                    if len > limit {
                        return Read::Stopped {
                            read,
                            trailers: None,
                            error: None,
                            rest: Some(body),
                        };
                    }
                }
                Err(frame) => {
                    return Read::Stopped {
                        read,
                        trailers: frame.into_trailers().ok(),
                        error: None,
                        rest: Some(body),
                    }
                }
            },
        }
    }
}

/// A response from a cache entry, marked with how it was served.
fn from_cache<B: Body>(cached: CachedResponse, outcome: Outcome) -> Response<ResponseBody<B>> {
    let mark = match outcome {
        Outcome::Leader | Outcome::Uncached | Outcome::Degraded => MISS,
        Outcome::Stale => STALE,
        _ => HIT,
    };
    let mut response = Response::new(ResponseBody::cached(cached.body));
    *response.status_mut() = cached.status;
    *response.headers_mut() = cached.headers;
    response.headers_mut().insert(X_CACHE.clone(), mark);
    response
}

/// A response the layer makes itself when there is neither a cached response nor a way to
/// reach the inner service for this request.
fn synthesized<B: Body>(status: StatusCode) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    *response.status_mut() = status;
    response.headers_mut().insert(X_CACHE.clone(), MISS);
    response
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}
