//! The middleware service and the path of a cacheable request through it.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{AGE, CONTENT_LENGTH, IF_MODIFIED_SINCE, IF_NONE_MATCH};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::{oneshot, watch};
use tower::util::Oneshot;
use tower::Service;
use tracing::{debug, warn};

use super::body::ResponseBody;
use super::codec::{self, CachedResponse, Entry, VaryMarker};
use super::conditional::{Conditions, NOT_MODIFIED_FIELDS};
use super::future::ResponseFuture;
use super::parse::{self, Vary};
use super::policy::{self, Decision, RequestRule};
use super::{key, HttpConfig, BYPASS, HIT, MISS, STALE, X_CACHE};
use crate::cache::{BoxError, Cache, ErrorKind, Fetched, Loaded, Outcome};

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
        match policy::request_rule(&request, self.config.honor_client_no_cache) {
            RequestRule::Ignore => ResponseFuture::inner(Oneshot::new(inner, request), None),
            RequestRule::Bypass => {
                crate::cache::telemetry::lookup("bypass");
                ResponseFuture::inner(Oneshot::new(inner, request), Some(BYPASS))
            }
            RequestRule::Cache => {
                // A HEAD is answered from the GET entry, so its key is the GET's.
                let (mut parts, body) = request.into_parts();
                let method = std::mem::replace(&mut parts.method, Method::GET);
                let key = self.config.make_key.make_key(&parts);
                parts.method = method;
                let request = Request::from_parts(parts, body);
                let Some(key) = key else {
                    crate::cache::telemetry::lookup("bypass");
                    return ResponseFuture::inner(Oneshot::new(inner, request), Some(BYPASS));
                };
                let primary = key::primary(key, request.headers());
                let loading = Loading {
                    inner,
                    cache: self.cache.clone(),
                    config: Arc::clone(&self.config),
                };
                ResponseFuture::cached(Box::pin(serve(loading, primary, request)))
            }
        }
    }
}

/// What a load needs: the inner service, the cache (a load of a response with `Vary` fills a
/// second key) and the settings.
struct Loading<S> {
    inner: S,
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl<S: Clone> Clone for Loading<S> {
    fn clone(&self) -> Self {
        Loading {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

/// What a request asked for besides its key, kept apart from the request, which a load takes.
struct Asked {
    head: bool,
    conditions: Option<Conditions>,
}

/// A request waiting to be sent, shared between its caller and its loaders: a loader takes it
/// if it runs; otherwise the caller still has it if it must go to the inner service itself.
struct Pending<B> {
    request: Option<Request<B>>,
    /// The request's headers, left here by the loader that took it (to key a variant).
    sent_headers: Option<HeaderMap>,
    /// Set when the caller follows a vary marker to its variant: the request then goes to the
    /// variant's loader first. A later run of the URL's loader (an early refresh, or the
    /// refresh of a stale marker) waits until the variant is done with the request, then
    /// refreshes the marker with it, or, if the variant's loader sent it, stores this marker
    /// again for what it had left.
    following: Option<VaryMarker>,
    /// Turns true (or its sender goes away) once the variant's step is done with the request.
    variant_done: Option<watch::Receiver<bool>>,
}

type Slot<B> = Arc<Mutex<Pending<B>>>;

fn lock<B>(slot: &Slot<B>) -> MutexGuard<'_, Pending<B>> {
    // Nothing panics while the slot is locked; a poisoned slot is still consistent.
    crate::sync::lock(slot)
}

/// What a loader hands straight to its own caller.
// Made once per load and moved once, through a oneshot: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Own<B: Body, E> {
    /// A response passed through (not stored), or the inner service's error; `failed` if the
    /// load failed (an error, a server error, a body that failed), so that a stale response
    /// may stand in for it.
    Passed {
        answer: Result<Response<ResponseBody<B>>, E>,
        failed: bool,
    },
    /// The response under the caller's variant key, the primary key now holding the vary
    /// marker: the one it loaded, or (if a fresh one was there already) that one.
    Stored(Bytes, Outcome),
}

/// The key a loader loads for.
enum Step {
    /// The URL's key: a response without `Vary`, or a vary marker.
    Primary,
    /// A variant's key, under a marker naming these fields.
    Variant(Vec<HeaderName>),
}

type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// A cacheable request: served from the cache, by this request's own load, or (for a pass or a
/// failed load elsewhere) by the inner service directly.
async fn serve<S, ReqBody, ResBody>(
    loading: Loading<S>,
    primary: String,
    request: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let asked = Asked {
        head: request.method() == Method::HEAD,
        conditions: Conditions::of(request.headers()),
    };
    let slot: Slot<ReqBody> = Arc::new(Mutex::new(Pending {
        request: Some(request),
        sent_headers: None,
        following: None,
        variant_done: None,
    }));
    let cache = loading.cache.clone();

    // Step one: the URL's key.
    let (to_leader, mut from_loader) = oneshot::channel();
    let loader = {
        let (loading, primary, slot) = (loading.clone(), primary.clone(), Arc::clone(&slot));
        move || load(loading, primary, Step::Primary, slot, to_leader)
    };
    let fetched = cache
        .fetch_accepting(&primary, codec::accepts_primary, loader)
        .await;
    let (marker, outcome) = match entry(&fetched) {
        Some((Entry::Response(cached), outcome)) => return Ok(answer(cached, outcome, &asked)),
        Some((Entry::Vary(marker), outcome)) => (marker, outcome),
        // The colder paths are boxed, so the future of every request (a hit's included) stays
        // small to build and move.
        None => {
            return Box::pin(settle(
                fetched,
                from_loader,
                &slot,
                loading.inner,
                &asked,
                None,
            ))
            .await
        }
    };
    // A marker. This request's own load of the URL may have answered already, or may hold the
    // request: it then loads (a refresh of the marker, started as the marker was served) and
    // its answer is this request's answer.
    let mut own = from_loader.try_recv().ok();
    let variant = if own.is_none() {
        let mut pending = lock(&slot);
        match &pending.request {
            Some(request) => {
                let variant = key::variant(&primary, &marker.names, request.headers());
                // The request is kept for the variant's loader from now on.
                let (done, variant_done) = watch::channel(false);
                pending.following = Some(marker.clone());
                pending.variant_done = Some(variant_done);
                Some((variant, done))
            }
            None => None,
        }
    } else {
        None
    };
    let (variant, done) = match variant {
        Some(variant) => variant,
        None => {
            if own.is_none() {
                own = from_loader.await.ok();
            }
            let fallback = match own {
                Some(Own::Stored(entry, outcome)) => return Ok(own_entry(&entry, outcome, &asked)),
                Some(Own::Passed { answer, failed }) if !failed => {
                    return without_body(answer, &asked)
                }
                Some(Own::Passed { answer, .. }) => Some(answer),
                None => None,
            };
            // The load failed: a variant may still be there (stale or fresh) to stand in for
            // it. Its key comes from the request as it was sent.
            let sent = lock(&slot)
                .sent_headers
                .as_ref()
                .map(|h| key::variant(&primary, &marker.names, h));
            match (sent, fallback) {
                (Some(variant), fallback) => {
                    return Box::pin(stand_in(&cache, &variant, &asked, outcome, fallback)).await
                }
                (None, Some(answer)) => return without_body(answer, &asked),
                (None, None) => return Ok(synthesized(StatusCode::BAD_GATEWAY)),
            }
        }
    };

    // Step two: the variant's key.
    let (to_leader, from_loader) = oneshot::channel();
    let loader = {
        let (loading, primary, slot) = (loading.clone(), primary.clone(), Arc::clone(&slot));
        let names = marker.names.clone();
        move || load(loading, primary, Step::Variant(names), slot, to_leader)
    };
    let fetched = Box::pin(cache.fetch_accepting(&variant, codec::accepts_variant, loader)).await;
    match entry(&fetched) {
        Some((Entry::Response(cached), outcome)) => Ok(answer(cached, outcome, &asked)),
        _ => {
            Box::pin(settle(
                fetched,
                from_loader,
                &slot,
                loading.inner,
                &asked,
                Some(done),
            ))
            .await
        }
    }
}

/// After this request's own load of a marked URL failed: the variant, if the store still has
/// one to stand in for the failure, else the failure itself (or a gateway error). Nothing
/// loads: the variant's loader has no request, so a variant that must be loaded fails too.
async fn stand_in<B, E>(
    cache: &Cache,
    variant: &str,
    asked: &Asked,
    outcome: Outcome,
    failure: Option<Answer<B, E>>,
) -> Answer<B, E>
where
    B: Body<Data = Bytes>,
{
    let fetched = cache
        .fetch_accepting(variant, codec::accepts_variant, || async {
            Err::<Loaded, _>("the request went to the failed load of its URL")
        })
        .await;
    match (entry(&fetched), failure) {
        (Some((Entry::Response(cached), found)), _) => {
            // Stale if either the marker or the variant was.
            let outcome = if outcome == Outcome::Stale {
                outcome
            } else {
                found
            };
            Ok(answer(cached, outcome, asked))
        }
        (_, Some(failure)) => without_body(failure, asked),
        (_, None) => Ok(synthesized(StatusCode::BAD_GATEWAY)),
    }
}

/// The entry a fetch found, decoded, and how it was found.
fn entry(fetched: &Result<Fetched, crate::Error>) -> Option<(Entry, Outcome)> {
    let fetched = fetched.as_ref().ok()?;
    let value = fetched.value()?;
    match codec::decode(value) {
        Ok(entry) => Some((entry, fetched.outcome())),
        Err(codec::Malformed) => {
            // The engine only hands over entries the codec accepts: a bug, not bad bytes.
            warn!("cached entry is not a response; passing the request through");
            None
        }
    }
}

/// A fetch that found no response: this request's own load's answer, a gateway error for a
/// failed load, or the inner service directly for a pass.
async fn settle<S, ReqBody, ResBody>(
    fetched: Result<Fetched, crate::Error>,
    mut from_loader: oneshot::Receiver<Own<ResBody, S::Error>>,
    slot: &Slot<ReqBody>,
    inner: S,
    asked: &Asked,
    done: Option<watch::Sender<bool>>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    match from_loader.try_recv() {
        Ok(Own::Passed { answer, .. }) => return without_body(answer, asked),
        Ok(Own::Stored(entry, outcome)) => return Ok(own_entry(&entry, outcome, asked)),
        Err(_) => {}
    }
    // A failed load (this request's or another's, here or in another process) is answered
    // with a gateway error rather than by calling the failing inner service again; a pass
    // goes to the inner service directly.
    let failed = match fetched {
        Ok(_) => None,
        Err(error) => {
            debug!(%error, "no cached response");
            Some(match error.kind() {
                ErrorKind::WaitTimeout | ErrorKind::LoadTimeout => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            })
        }
    };
    let request = lock(slot).request.take();
    // Done with the request: a refresh of the URL's marker waiting for it may go on.
    drop(done);
    match (failed, request) {
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

/// What a loader found in the request slot.
enum Claim<B> {
    Request(Request<B>),
    /// The caller follows this marker to a variant: store it again instead of loading.
    Restore(VaryMarker),
    Gone,
}

async fn claim<B>(slot: &Slot<B>, step: &Step) -> Claim<B> {
    let following = {
        let mut pending = lock(slot);
        match (step, &pending.following) {
            (Step::Primary, Some(marker)) => Some((marker.clone(), pending.variant_done.clone())),
            _ => return take_request(&mut pending).map_or(Claim::Gone, Claim::Request),
        }
    };
    // The caller follows the marker to its variant: once the variant is done with the request
    // (answered from the cache, or loaded), this loader may take it and refresh the marker.
    let Some((marker, done)) = following else {
        return Claim::Gone;
    };
    if let Some(mut done) = done {
        // An error only means the caller is gone, which is done as well.
        let _ = done.wait_for(|done| *done).await;
    }
    take_request(&mut lock(slot)).map_or(Claim::Restore(marker), Claim::Request)
}

fn take_request<B>(pending: &mut Pending<B>) -> Option<Request<B>> {
    let request = pending.request.take()?;
    pending.sent_headers = Some(request.headers().clone());
    Some(request)
}

/// The loader of a cacheable request: calls the inner service (a `GET`, without the
/// preconditions the layer answers itself) and reads the body, up to the size limit, into a
/// cache entry. Whatever cannot be stored goes to this request's own caller.
async fn load<S, ReqBody, ResBody>(
    loading: Loading<S>,
    primary: String,
    step: Step,
    slot: Slot<ReqBody>,
    to_leader: oneshot::Sender<Own<ResBody, S::Error>>,
) -> Result<Loaded, BoxError>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    let request = match claim(&slot, &step).await {
        Claim::Request(request) => request,
        Claim::Restore(marker) => return restore(&marker),
        Claim::Gone => return Err("the request was already sent".into()),
    };
    let (mut parts, body) = request.into_parts();
    let asked = parts.clone();
    parts.method = Method::GET;
    parts.headers.remove(IF_NONE_MATCH);
    parts.headers.remove(IF_MODIFIED_SINCE);
    let response = match Oneshot::new(loading.inner, Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(error) => {
            let _ = to_leader.send(Own::Passed {
                answer: Err(error),
                failed: true,
            });
            return Err("the inner service failed".into());
        }
    };
    let (parts, body) = response.into_parts();
    let passed = |body: ResponseBody<ResBody>, failed: bool| {
        let mut response = Response::from_parts(parts.clone(), body);
        response.headers_mut().insert(X_CACHE.clone(), BYPASS);
        Own::Passed {
            answer: Ok(response),
            failed,
        }
    };
    let ttl = match loading.config.policy.decide(&asked, &parts) {
        Decision::Store(ttl) if !ttl.is_zero() => ttl,
        Decision::Fail => {
            // A failed load: a stale response, if there is one, is served in its place.
            let _ = to_leader.send(passed(ResponseBody::inner(body), true));
            return Err(format!("the inner service answered {}", parts.status).into());
        }
        _ => {
            let _ = to_leader.send(passed(ResponseBody::inner(body), false));
            return Ok(Loaded::pass());
        }
    };
    let names = match (parse::vary(&parts.headers), &step) {
        (Vary::None, _) => Vec::new(),
        // A variant may be stored under a key that names more fields than it varies on, never
        // fewer.
        (Vary::Names(names), Step::Variant(keyed)) if names.iter().all(|n| keyed.contains(n)) => {
            names
        }
        (Vary::Names(names), Step::Primary) => names,
        (Vary::Names(_) | Vary::Unkeyable, _) => {
            let _ = to_leader.send(passed(ResponseBody::inner(body), false));
            return Ok(Loaded::pass());
        }
    };
    let chunks = match read_body(Box::pin(body), loading.config.max_body_bytes).await {
        Read::Complete(chunks) => chunks,
        Read::Stopped {
            read,
            trailers,
            error,
            rest,
        } => {
            let failed = error.is_some();
            let body = ResponseBody::replay(read, trailers, error, rest);
            let _ = to_leader.send(passed(body, failed));
            return if failed {
                Err("the response body failed".into())
            } else {
                Ok(Loaded::pass())
            };
        }
    };
    let now = SystemTime::now();
    // `Age` is counted from when the response was generated, as far as the cache knows.
    let stored_at = now
        .checked_sub(policy::age(&parts.headers))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let stored: Vec<_> = parts
        .headers
        .iter()
        .filter(|(name, _)| policy::is_stored_header(name, &parts.headers))
        .collect();
    let Some(entry) = codec::encode_response(stored_at, parts.status, &stored, &chunks) else {
        let body = ResponseBody::replay(chunks, None, None, None);
        let _ = to_leader.send(passed(body, false));
        return Ok(Loaded::pass());
    };
    if names.is_empty() || matches!(step, Step::Variant(_)) {
        return Ok(Loaded::value_with_ttl(entry, ttl));
    }
    // A response with `Vary`, loaded for the URL's key: the response goes under this request's
    // variant key, and a marker naming the fields under the URL's key. The variant is filled
    // before the marker, so a request that finds the marker finds the variant.
    let marker = VaryMarker {
        stored_at: now,
        ttl,
        names,
    };
    let Some(marker_entry) = codec::encode_vary(&marker) else {
        let _ = to_leader.send(Own::Stored(entry, Outcome::Uncached));
        return Ok(Loaded::pass());
    };
    let variant = key::variant(&primary, &marker.names, &asked.headers);
    let loaded = entry.clone();
    let filled = loading
        .cache
        .fetch_accepting(variant, codec::accepts_variant, move || async move {
            Ok::<_, Infallible>(Loaded::value_with_ttl(loaded, ttl))
        })
        .await;
    // A fresh variant already there (refreshed on its own) is kept, and is the answer: the
    // caller never sees an older response after a newer one. A stale one is being replaced
    // by this load.
    let own = match filled {
        Ok(fetched) => match (fetched.outcome(), fetched.into_value()) {
            (Outcome::L1Hit | Outcome::L2Hit | Outcome::Follower, Some(value))
                if value != entry =>
            {
                Own::Stored(value, Outcome::L1Hit)
            }
            _ => Own::Stored(entry, Outcome::Leader),
        },
        Err(error) => {
            debug!(%error, "the variant was not stored");
            Own::Stored(entry, Outcome::Uncached)
        }
    };
    let _ = to_leader.send(own);
    Ok(Loaded::value_with_ttl(marker_entry, ttl))
}

/// A run of the URL's loader whose request went to the variant's loader: the marker is stored
/// again for what it had left (at least a second), instead of a load without a request.
fn restore(marker: &VaryMarker) -> Result<Loaded, BoxError> {
    let entry = codec::encode_vary(marker).ok_or("the vary marker cannot be encoded")?;
    let left = marker
        .remaining(SystemTime::now())
        .max(Duration::from_secs(1));
    Ok(Loaded::value_with_ttl(entry, left))
}

/// How reading a body for the cache ended.
enum Read<B: Body> {
    /// All of it, within the limit, with no trailers.
    Complete(Vec<Bytes>),
    /// Not storable: over the limit, with trailers, or failed. Holds what was read, then what
    /// stopped the read, then the unread rest.
    Stopped {
        read: Vec<Bytes>,
        trailers: Option<HeaderMap>,
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

/// The answer from the variant entry this request's own load of the URL left (a response).
fn own_entry<B: Body>(entry: &Bytes, outcome: Outcome, asked: &Asked) -> Response<ResponseBody<B>> {
    match codec::decode(entry) {
        Ok(Entry::Response(cached)) => answer(cached, outcome, asked),
        _ => synthesized(StatusCode::BAD_GATEWAY),
    }
}

/// A response passed through to this request, without its body if the request was a `HEAD`
/// (its load was a `GET`), but with the length the body has, when it is known.
fn without_body<B, E>(passed: Answer<B, E>, asked: &Asked) -> Answer<B, E>
where
    B: Body<Data = Bytes>,
{
    let mut response = passed?;
    if !asked.head {
        return Ok(response);
    }
    if let Some(length) = response.body().size_hint().exact() {
        if !response.headers().contains_key(CONTENT_LENGTH)
            && response.status() != StatusCode::NOT_MODIFIED
            && has_content(response.status())
        {
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(length));
        }
    }
    Ok(response.map(|_| ResponseBody::empty()))
}

/// The answer from a cached response: the response (without its body for a `HEAD`), or
/// `304 Not Modified` if the request's preconditions say so; with `Age` and `x-cache`.
fn answer<B: Body>(
    cached: CachedResponse,
    outcome: Outcome,
    asked: &Asked,
) -> Response<ResponseBody<B>> {
    let mark = match outcome {
        Outcome::Leader | Outcome::Uncached | Outcome::Degraded => MISS,
        Outcome::Stale => STALE,
        _ => HIT,
    };
    let now = SystemTime::now();
    let age = now
        .duration_since(cached.stored_at)
        .unwrap_or_default()
        .as_secs()
        .min(1 << 31);
    let not_modified = asked
        .conditions
        .as_ref()
        .is_some_and(|c| c.not_modified(&cached, now));
    // A HEAD or a 304 has no body to measure: say the length of the 200's.
    let length = HeaderValue::from(cached.body.len());
    let mut response = if not_modified {
        let mut response = Response::new(ResponseBody::empty());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        for name in NOT_MODIFIED_FIELDS.iter().chain([&CONTENT_LENGTH]) {
            for value in cached.headers.get_all(name) {
                response.headers_mut().append(name.clone(), value.clone());
            }
        }
        response
    } else {
        let body = if asked.head {
            ResponseBody::empty()
        } else {
            ResponseBody::cached(cached.body)
        };
        let mut response = Response::new(body);
        *response.status_mut() = cached.status;
        *response.headers_mut() = cached.headers;
        response
    };
    if !response.headers().contains_key(CONTENT_LENGTH) && has_content(cached.status) {
        response.headers_mut().insert(CONTENT_LENGTH, length);
    }
    response.headers_mut().insert(AGE, HeaderValue::from(age));
    response.headers_mut().insert(X_CACHE.clone(), mark);
    response
}

/// Whether a response with this status may say its length (RFC 9110 §8.6: never 1xx, 204).
fn has_content(status: StatusCode) -> bool {
    !status.is_informational() && status != StatusCode::NO_CONTENT
}

/// A response the layer makes itself when there is neither a cached response nor a way to
/// reach the inner service for this request.
fn synthesized<B: Body>(status: StatusCode) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    *response.status_mut() = status;
    response.headers_mut().insert(X_CACHE.clone(), MISS);
    response
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}
