//! The path of one cacheable request through the cache: a fetch of the URL's key and, when it
//! holds a vary marker, a second fetch of the request's variant key (the two-step `Vary`
//! protocol of [`key`]). Each fetch is one flight of the engine, whose leader runs
//! [`load`](super::load); the request itself waits in its [`Slot`] for whichever loader or
//! fallback sends it.
//!
//! A request is answered from the cache, by its own load, by another request's load (the
//! origin's own answer, a server error included), by the inner service directly (for a pass),
//! or, when no answer of the origin is to be had (a load that failed without one, here or
//! elsewhere, or timed out), with a gateway error the layer makes itself.

use std::sync::Arc;

use bytes::Bytes;
use http::header::AGE;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::watch;
use tower::util::Oneshot;
use tower::Service;
use tracing::{debug, warn};

use super::cache_status::{CacheStatus, Detail, Served};
use super::load::{load, ForCaller, Loading};
use super::load_failure::LoadFailure;
use super::relay::Relay;
use super::responses::{
    self, answer, marked, own_entry, synthesized, without_body, Answer, AnswerForm, HitReady,
    HowFound,
};
use super::slot::{Slot, Step};
use crate::cache::{Ask, Cache, ErrorKind, Fetched, Loaded, Outcome, Own};
use crate::http::rules::decision::Decision;
use crate::http::rules::parse;
use crate::http::rules::pass::Pass;
use crate::http::serving::body::ResponseBody;
use crate::http::serving::config::HttpConfig;
use crate::http::stored::codec::{self, CachedResponse, Decoded, Forward, VaryMarker};
use crate::http::stored::key::{self, VariantId};
use crate::store::KeyDigest;

/// The hot path of a cacheable request: its answer from a response in L1, made as the
/// request is called, before anything a load needs is built (the slot, the loader and their
/// clones, the request's future): under the URL's key `primary` (hashed to `digest`), or, where
/// L1 holds the URL's vary marker there, under the variant key the marker and the request's
/// `headers` make (a page with `Vary`, or a request keyed by its forwarding headers). `None`
/// if L1 holds no response ready to answer: [`fetch`] looks in L1 again, then the store.
pub(crate) fn from_l1<B: Body>(
    cache: &Cache,
    (primary, digest): (&str, &KeyDigest),
    headers: &HeaderMap,
    form: &AnswerForm,
    config: &Arc<HttpConfig>,
) -> Option<Response<ResponseBody<B>>> {
    // Decoded once per L1 entry (a thread keeps it in view), with a plain hit's fields made
    // ready, or the marker's names.
    let read = |value: &Bytes| match codec::decode(value) {
        Ok(Decoded::Response(cached)) => Some(InL1::Hit(HitReady::new(cached, config))),
        Ok(Decoded::Vary(marker)) => Some(InL1::Marker(marker)),
        _ => None,
    };
    let local = |found: &Arc<InL1>| Arc::new(found.localized());
    let found = cache.l1_hit(digest, read, local)?;
    let marker = match &*found.value {
        InL1::Hit(ready) => return Some(responses::hit(ready, &found, form, config)),
        InL1::Marker(marker) => marker,
    };
    let variant = key::variant_digest(primary, marker.generation, &marker.names, headers);
    let read = |value: &Bytes| match codec::decode(value) {
        Ok(Decoded::Response(cached)) => Some(InL1::Hit(HitReady::new(cached, config))),
        _ => None,
    };
    let found = cache.l1_hit(&variant, read, local)?;
    match &*found.value {
        InL1::Hit(ready) => Some(responses::hit(ready, &found, form, config)),
        InL1::Marker(_) => None,
    }
}

/// What the hot path keeps in view of an L1 entry: a response ready to answer hits, or the
/// vary marker of a URL whose variants are keyed apart.
// Made once per L1 entry, held in an `Arc`: boxing the response would add an indirection to
// every hit.
#[allow(clippy::large_enum_variant)]
enum InL1 {
    Hit(HitReady),
    Marker(VaryMarker),
}

impl InL1 {
    /// A copy for a thread's view (see [`HitReady::localized`]).
    fn localized(&self) -> Self {
        match self {
            InL1::Hit(ready) => InL1::Hit(ready.localized()),
            InL1::Marker(marker) => InL1::Marker(marker.clone()),
        }
    }
}

/// A cacheable request under the URL's key `primary` (hashed to `digest`) that L1 did not
/// answer ([`from_l1`]): served from the cache, by this request's own load, or (for a pass or
/// a failed load elsewhere) by the inner service directly. The URL's key goes through the
/// engine (a flight, the store, or this request's own load), then its variant's key if it
/// holds a vary marker.
pub(crate) async fn fetch<S, ReqBody, ResBody>(
    loading: Loading<S>,
    primary: String,
    digest: KeyDigest,
    request: Request<ReqBody>,
    form: AnswerForm,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let slot = Slot::new(request, primary.clone());
    let cache = loading.cache.clone();
    let status = &loading.config.cache_status;

    // Step one: the URL's key.
    let loader = {
        let (loading, primary, slot) = (loading.clone(), primary.clone(), slot.clone());
        move |previous| load(loading, primary, Step::Primary, slot, previous)
    };
    let ask = Ask::digest(digest, primary.as_bytes()).accepting(codec::accepts_primary);
    let (fetched, mut own) = cache.fetch_as(ask, loader).await;
    let (marker, outcome) = match decoded(&fetched) {
        Some((Decoded::Response(cached), found)) => {
            let served = own_served(found, &mut own);
            return Ok(answer(&cached, served, &form, status));
        }
        Some((Decoded::ForWaiters(cached, sent_with), found)) => {
            let handed = (cached, sent_with, found);
            let config = &loading.config;
            let waited = for_waiters(handed, own, &slot, loading.inner, config, &form);
            return Box::pin(waited).await;
        }
        Some((Decoded::Vary(marker), found)) => (marker, found.outcome),
        // The colder paths are boxed, so the future of every request stays small to build
        // and move.
        None => {
            return Box::pin(answer_without_entry(
                fetched,
                own,
                &slot,
                loading.inner,
                &loading.config,
                &form,
                None,
            ))
            .await
        }
    };
    // A marker. This request's own load of the URL may have answered already, or may hold the
    // request: it then loads (a refresh of the marker, started as the marker was served) and
    // its answer is this request's answer.
    let mut mine = own.ready();
    let variant = match mine {
        // (A load that stored a response has no answer for this request beyond it.)
        None | Some(ForCaller::Stored(_)) => slot.follow(&marker),
        Some(_) => None,
    };
    let Some((variant, done)) = variant else {
        if mine.is_none() {
            mine = own.ended().await;
        }
        let fallback = match mine {
            Some(ForCaller::Variant(entry, served)) => {
                return Ok(own_entry(&entry, served, &form, status))
            }
            Some(ForCaller::Passed { answer, failed }) if !failed => {
                return without_body(answer, &form)
            }
            Some(ForCaller::Passed { answer, .. }) => Some(answer),
            Some(ForCaller::Stored(_)) | None => None,
        };
        // The load failed: a variant may still be there (stale or fresh) to stand in for it.
        // Its key comes from the request as it was sent.
        return match (slot.sent_variant(&marker), fallback) {
            (Some(variant), fallback) => {
                Box::pin(stand_in(&cache, &variant, &form, outcome, fallback, status)).await
            }
            (None, Some(answer)) => without_body(answer, &form),
            (None, None) => Ok(synthesized(
                StatusCode::BAD_GATEWAY,
                Detail::NoOriginResponse,
                status,
            )),
        };
    };

    // Step two: the variant's key.
    let loader = {
        let (loading, primary, slot) = (loading.clone(), primary.clone(), slot.clone());
        let names = marker.names.clone();
        move |previous| load(loading, primary, Step::Variant(names), slot, previous)
    };
    let ask = Ask::key(variant.as_bytes()).accepting(codec::accepts_variant);
    let (fetched, mut own) = Box::pin(cache.fetch_as(ask, loader)).await;
    match decoded(&fetched) {
        Some((Decoded::Response(cached), found)) => {
            let served = own_served(found, &mut own);
            Ok(answer(&cached, served, &form, status))
        }
        Some((Decoded::ForWaiters(cached, sent_with), found)) => {
            let handed = (cached, sent_with, found);
            let config = &loading.config;
            let waited = for_waiters(handed, own, &slot, loading.inner, config, &form);
            let answer = Box::pin(waited).await;
            // Done with the request: a refresh of the URL's marker waiting for it may go on.
            drop(done);
            answer
        }
        _ => {
            Box::pin(answer_without_entry(
                fetched,
                own,
                &slot,
                loading.inner,
                &loading.config,
                &form,
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
    form: &AnswerForm,
    outcome: Outcome,
    failure: Option<Answer<B, E>>,
    status: &CacheStatus,
) -> Answer<B, E>
where
    B: Body<Data = Bytes>,
{
    let ask = Ask::key(variant.as_bytes()).accepting(codec::accepts_variant);
    let fail = |_| async { Err::<Loaded, _>(LoadFailure::RequestWithFailedLoad) };
    let fetched = cache.fetch_shared(ask, fail).await;
    match (decoded(&fetched), failure) {
        (Some((Decoded::Response(cached), mut found)), _) => {
            // Stale if either the marker or the variant was.
            if outcome == Outcome::Stale {
                found.outcome = outcome;
            }
            Ok(answer(&cached, found.served(), form, status))
        }
        (_, Some(failure)) => without_body(failure, form),
        (_, None) => Ok(synthesized(
            StatusCode::BAD_GATEWAY,
            Detail::NoOriginResponse,
            status,
        )),
    }
}

/// How the response this request is answered with was served: as the fetch `found` it, or
/// as this request's own load tells (stored, for how long, or revalidated).
fn own_served<B: Body, E>(found: HowFound, own: &mut Own<ForCaller<B, E>>) -> Served {
    match own.ready() {
        Some(ForCaller::Stored(served)) if found.outcome == Outcome::Leader => served,
        _ => found.served(),
    }
}

/// The entry a fetch found, decoded, and how it was found.
fn decoded(fetched: &Result<Fetched, crate::Error>) -> Option<(Decoded, HowFound)> {
    let fetched = fetched.as_ref().ok()?;
    let value = fetched.value()?;
    match codec::decode(value) {
        Ok(stored) => Some((stored, HowFound::of(fetched, value))),
        Err(codec::Malformed) => {
            // The engine only hands over entries the codec accepts: a bug, not bad bytes.
            warn!("cached entry is not a response; passing the request through");
            None
        }
    }
}

/// The answer when a fetch found no response: this request's own load's answer, a gateway
/// error for a failed load, or the inner service directly for a pass. `done` is dropped once
/// this request is done with the slot (see [`Slot::follow`]).
async fn answer_without_entry<S, ReqBody, ResBody>(
    fetched: Result<Fetched, crate::Error>,
    mut own: Own<ForCaller<ResBody, S::Error>>,
    slot: &Slot<ReqBody>,
    inner: S,
    config: &HttpConfig,
    form: &AnswerForm,
    done: Option<watch::Sender<bool>>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Send + 'static,
{
    match own.ready() {
        Some(ForCaller::Passed { answer, .. }) => return without_body(answer, form),
        Some(ForCaller::Variant(entry, served)) => {
            return Ok(own_entry(&entry, served, form, &config.cache_status))
        }
        Some(ForCaller::Stored(_)) | None => {}
    }
    // A load that failed without an answer of the origin (this request's or another's, here or
    // in another process) is answered with a gateway error rather than by calling the failing
    // inner service again; a pass goes to the inner service directly.
    let failed = match &fetched {
        Ok(_) => None,
        Err(error) => {
            debug!(
                error = error as &dyn std::error::Error,
                "no cached response"
            );
            Some(match error.kind() {
                ErrorKind::WaitTimeout | ErrorKind::LoadTimeout => {
                    (StatusCode::GATEWAY_TIMEOUT, Detail::Timeout)
                }
                _ => (StatusCode::BAD_GATEWAY, Detail::NoOriginResponse),
            })
        }
    };
    if let Some((code, detail)) = failed {
        drop(slot.take_back());
        // Done with the request: a refresh of the URL's marker waiting for it may go on.
        drop(done);
        return Ok(synthesized(code, detail, &config.cache_status));
    }
    // A pass whose load relayed its body to the requests that waited for it.
    let relay = fetched
        .as_ref()
        .ok()
        .and_then(Fetched::handoff)
        .and_then(|handoff| {
            Arc::clone(&handoff.0)
                .downcast::<Relay<ResBody::Error>>()
                .ok()
        });
    // Why the load's response was not kept, where it said so in this process.
    let mut told = fetched
        .as_ref()
        .ok()
        .and_then(Fetched::handoff)
        .and_then(|handoff| handoff.0.downcast_ref::<Pass>().copied());
    if let Some(relay) = relay {
        match relayed(&relay, slot, config, form).await {
            Ok(answer) => {
                drop(done);
                return answer;
            }
            Err(why) => told = why,
        }
    }
    pass_through(slot, inner, config, (done, told)).await
}

/// The answer from a `relay` this request waited for: the whole body once it is in, if the
/// request is of the loading one's variant and has no preconditions for the layer to answer
/// (those go to the origin, which answers them); where it cannot have it (see
/// [`relay`](super::relay)), it goes to the origin, told why if the relay could not hold the
/// body.
async fn relayed<ReqBody, ResBody, E>(
    relay: &Relay<ResBody::Error>,
    slot: &Slot<ReqBody>,
    config: &HttpConfig,
    form: &AnswerForm,
) -> Result<Answer<ResBody, E>, Option<Pass>>
where
    ResBody: Body<Data = Bytes>,
{
    if form.has_conditions() || !slot.is_of(&relay.sent_with) {
        return Err(None);
    }
    let chunks = relay.body().await.map_err(Some)?;
    let mut response = Response::from_parts(relay.head.clone(), ());
    // Its age, as a response from the cache says it (RFC 9111 §4.2.3), from when it came.
    let age = crate::clock::now()
        .duration_since(relay.received_at)
        .unwrap_or_default();
    let age = parse::age(response.headers()).saturating_add(age);
    response
        .headers_mut()
        .insert(AGE, HeaderValue::from(age.as_secs().min(1 << 31)));
    let response = response.map(|()| ResponseBody::replay(chunks, None, None, None));
    let served = Served::Collapsed(Forward::Loaded);
    Ok(without_body(
        Ok(marked(response, served, &config.cache_status)),
        form,
    ))
}

/// A response not stored, handed to the requests that waited for its load (`handed`: see
/// [`Decoded::ForWaiters`]): this request's own load's answer, as it came; a waiter's, if its
/// request matches the loading one in every field the response's `Vary` names (RFC 9111
/// §4.1), else the inner service's own answer to it.
async fn for_waiters<S, ReqBody, ResBody>(
    (cached, sent_with, found): (CachedResponse, VariantId, HowFound),
    mut own: Own<ForCaller<ResBody, S::Error>>,
    slot: &Slot<ReqBody>,
    inner: S,
    config: &HttpConfig,
    form: &AnswerForm,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    if let Some(ForCaller::Passed { answer, .. }) = own.ready() {
        return without_body(answer, form);
    }
    if slot.is_of(&sent_with) {
        return Ok(answer(&cached, found.served(), form, &config.cache_status));
    }
    pass_through(slot, inner, config, (None, None)).await
}

/// The inner service's own answer to this request (a pass), or the layer's `502` if a loader
/// took the request and ended without an answer for it. `done` is dropped once this request
/// is done with the slot (see [`Slot::follow`]); `told`, why the load it waited for kept
/// nothing, where that load said so (in this process).
async fn pass_through<S, ReqBody, ResBody>(
    slot: &Slot<ReqBody>,
    inner: S,
    config: &HttpConfig,
    (done, told): (Option<watch::Sender<bool>>, Option<Pass>),
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    let request = slot.take_back();
    // Done with the request: a refresh of the URL's marker waiting for it may go on.
    drop(done);
    match request {
        Some(request) => {
            // Another request's load of the URL was not stored (a "pass" marker said so): the
            // policy tells why of this response, if it does not store it either.
            let (parts, body) = request.into_parts();
            let asked = parts.clone();
            let response = Oneshot::new(inner, Request::from_parts(parts, body)).await?;
            let (mut head, body) = response.into_parts();
            let why = match config.judge(&asked, &head) {
                (Decision::Store(_) | Decision::StoreWith { .. }, _) => {
                    told.unwrap_or_else(|| config.unkept(body.size_hint()))
                }
                (_, why) => why,
            };
            config.strip_tags(&mut head.headers);
            Ok(marked(
                Response::from_parts(head, ResponseBody::inner(body)),
                Served::Passed(why),
                &config.cache_status,
            ))
        }
        // This request's own load took the request and ended without an answer for it.
        None => Ok(synthesized(
            StatusCode::BAD_GATEWAY,
            Detail::NoOriginResponse,
            &config.cache_status,
        )),
    }
}
