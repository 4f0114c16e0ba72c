//! The loader of a cacheable request: calls the inner service (a `GET`, without the
//! preconditions the layer answers itself), asks the [`Policy`](crate::http::Policy) whether the
//! response may be stored, reads its body up to the size limit, and encodes it for the cache.
//! Whatever cannot be stored goes, intact (but for its tag header fields), to this request's
//! own caller; and, where it may go to another user at all, to the requests that waited for
//! this load too ([`Outlet::Waiters`]): encoded for them through the store, or, for a body over
//! the size limit, relayed to those of this process (see [`relay`](super::relay)).
//!
//! A response with `Vary` loaded for the URL's key is stored under the request's variant key,
//! and the URL's key gets the vary marker (see [`key`]). The tags in the response's tag header
//! fields go with the stored response (not with the marker); the fields themselves do not,
//! unless they are kept.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{IF_MODIFIED_SINCE, IF_NONE_MATCH};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tower::util::Oneshot;
use tower::Service;
use tracing::debug;

use super::cache_status::Served;
use super::load_failure::LoadFailure;
use super::outlet::{exactly, route, Outlet, Refused, Route};
use super::read_body::{read_body, Read};
use super::relay::Relay;
use super::responses::{marked, Answer};
use super::slot::{Claim, Slot, Step};
use super::validation;
use crate::cache::{Ask, BoxError, Cache, Handoff, Loaded, Outcome, Previous};
use crate::http::rules::decision::Decision;
use crate::http::rules::parse;
use crate::http::rules::pass::Pass;
use crate::http::rules::stored_fields::is_stored_header;
use crate::http::rules::tag_fields;
use crate::http::serving::body::ResponseBody;
use crate::http::serving::config::HttpConfig;
use crate::http::stored::codec::{self, Forward, VaryMarker};
use crate::http::stored::key::{self, VariantId};

/// What a load needs: the inner service, the cache (a load of a response with `Vary` fills a
/// second key), the settings, whether the request is keyed by its forwarding headers (its
/// response is then always stored as a variant: see [`key`]), and whether its response may be
/// stored (not where its set of forwarding values has no place: see
/// [`ForwardedVariants`](key::ForwardedVariants)); one that may not is still handed to the
/// requests that waited for it.
pub(crate) struct Loading<S> {
    pub(crate) inner: S,
    pub(crate) cache: Cache,
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) forwarded: bool,
    pub(crate) stores: bool,
}

impl<S: Clone> Clone for Loading<S> {
    fn clone(&self) -> Self {
        Loading {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
            forwarded: self.forwarded,
            stores: self.stores,
        }
    }
}

/// What a loader gives its own caller, beside what it shares (the engine's
/// [`Own`](crate::cache::Own)).
// Made once per load and moved once: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ForCaller<B: Body, E> {
    /// A response passed through (not stored), or the inner service's error; `failed` if the
    /// load failed (an error, a server error, a body that failed), so that a stale response
    /// may stand in for it.
    Passed { answer: Answer<B, E>, failed: bool },
    /// The response under the caller's variant key, the primary key now holding the vary
    /// marker: the one it loaded, or (if a fresh one was there already) that one.
    Variant(Bytes, Served),
    /// The response was stored (or revalidated), and this is how the request was served by
    /// it (for `Cache-Status`).
    Stored(Served),
}

/// What a load gives: what it shares with the requests of its flight (or why it failed), and
/// what goes to its own caller.
type Gives<B, E> = crate::cache::Gives<ForCaller<B, E>>;

/// Loads for `step` of the request in `slot`; see the [module docs](self). With a `previous`
/// stored response, the load is a revalidation (see [`validation`]). Three steps: the
/// origin's answer ([`ask_origin`]), where it may go ([`route`]), then its body read and
/// encoded for there ([`keep`]).
pub(crate) async fn load<S, ReqBody, ResBody>(
    loading: Loading<S>,
    primary: String,
    step: Step,
    slot: Slot<ReqBody>,
    previous: Option<Previous>,
) -> Gives<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let request = match slot.claim(&step).await {
        Claim::Request(request) => request,
        Claim::Restore(marker) => return (restore(&loading.cache, &primary, &marker).await, None),
        Claim::Gone => return (Err(LoadFailure::RequestSent.into()), None),
    };
    let stored = previous
        .as_ref()
        .and_then(|previous| match codec::decode(previous.value()) {
            Ok(codec::Decoded::Response(stored)) => Some(stored),
            _ => None,
        });
    // What this load says in `Cache-Status` when it answers with what the origin sent, and
    // its entry says for the requests collapsed onto it: a forward for a stale entry, or for
    // a missing one (RFC 9211 §2.2).
    let forward = if stored.is_some() {
        Forward::Refreshed
    } else {
        Forward::Loaded
    };
    let Loading {
        inner,
        cache,
        config,
        forwarded,
        stores,
    } = loading;
    let (asked, response) = ask_origin(inner, request, stored.as_ref()).await;
    let response = match response {
        Ok(response) => response,
        Err(error) => {
            let own = ForCaller::Passed {
                answer: Err(error),
                failed: true,
            };
            return (Err(LoadFailure::InnerService.into()), Some(own));
        }
    };
    let (mut parts, body) = response.into_parts();
    let tags = tag_fields::read(&parts.headers, &config.tag_headers);
    config.strip_tags(&mut parts.headers);
    if let (Some(stored), Some(previous), StatusCode::NOT_MODIFIED) =
        (stored, &previous, parts.status)
    {
        let answer = (stored, previous, &parts);
        return not_modified(&config, &cache, &asked, answer, tags);
    }
    let keyed_by_forwarding = forwarded.then(|| (config.reflected.keyed(), stores));
    match route(
        (&cache, &config),
        &asked,
        &parts,
        &step,
        tags,
        keyed_by_forwarding,
    ) {
        Ok(route) => {
            let response = (parts, body);
            keep(
                (&cache, &config),
                &primary,
                &step,
                &asked,
                response,
                route,
                forward,
            )
            .await
        }
        Err(Refused { why, failure }) => {
            let body = ResponseBody::inner(body);
            let own = passed(&parts, body, failure.is_some(), why, &config);
            let shared = failure.map_or_else(|| Ok(telling(why)), |failure| Err(failure.into()));
            (shared, Some(own))
        }
    }
}

/// The origin's answer to `request`, sent as a `GET` without the preconditions the layer
/// answers itself, asking whether `stored` changed where there is one; with the request's
/// parts as it was asked.
async fn ask_origin<S, ReqBody, ResBody>(
    inner: S,
    request: Request<ReqBody>,
    stored: Option<&codec::CachedResponse>,
) -> (http::request::Parts, Result<Response<ResBody>, S::Error>)
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    let asked = parts.clone();
    parts.method = Method::GET;
    parts.headers.remove(IF_NONE_MATCH);
    parts.headers.remove(IF_MODIFIED_SINCE);
    if let Some(stored) = stored {
        validation::ask_if_changed(stored, &mut parts.headers);
    }
    let response = Oneshot::new(inner, Request::from_parts(parts, body)).await;
    (asked, response)
}

/// The response `(parts, body)`, loaded for `step` of the request `asked` under the URL's key
/// `primary`, read and encoded for where `route` says it goes: stored (under a variant key and
/// a vary marker, for a response with `Vary` loaded for the URL's key), handed to the
/// requests that waited for it, or, where it cannot be, to its own request alone.
async fn keep<ResBody, E>(
    (cache, config): (&Cache, &HttpConfig),
    primary: &str,
    step: &Step,
    asked: &http::request::Parts,
    (parts, body): (http::response::Parts, ResBody),
    route: Route,
    forward: Forward,
) -> Gives<ResBody, E>
where
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let Route {
        outlet,
        why,
        stale,
        tags,
        names,
    } = route;
    let failed = matches!(outlet, Outlet::Waiters { failed: true });
    let own_load = move |ttl| match forward {
        Forward::Loaded => Served::Loaded(ttl),
        Forward::Refreshed | Forward::Revalidated => Served::Refreshed(ttl),
    };
    // What the requests that wait for this load must match to get it, where it is not stored.
    let sent_with = || VariantId::of(primary, names.clone(), &asked.headers);
    let chunks = match read_body(Box::pin(body), config.max_body_bytes).await {
        Read::Complete(chunks) => chunks,
        Read::Stopped {
            read,
            trailers: None,
            error: None,
            rest: Some(rest),
        } if !failed && config.relays(rest.size_hint()) => {
            // Over the limit, but shareable: relayed to the requests of this process that
            // waited for this load (the engine hands them the relay); other processes' load
            // once each.
            let limit = config.max_relay_bytes;
            let (relay, reader) = Relay::start(parts.clone(), sent_with(), (read, rest), limit);
            let body = ResponseBody::relayed(reader);
            let own = passed(&parts, body, false, Pass::TooLarge, config);
            return (Ok(Loaded::pass_handing(Handoff(relay))), Some(own));
        }
        Read::Stopped {
            read,
            trailers,
            error,
            rest,
        } => {
            let failed = error.is_some() || failed;
            let why = match (&error, &trailers) {
                (Some(_), _) => Pass::BodyError,
                (None, Some(_)) => Pass::Trailers,
                (None, None) => Pass::TooLarge,
            };
            // What the requests that waited for it are told: a body that would have been
            // shared, but was over what the relay holds, met the relay's bound.
            let told = match why {
                Pass::TooLarge if !failed && config.max_relay_bytes > 0 => Pass::RelayFull,
                why => why,
            };
            let body = ResponseBody::replay(read, trailers, error, rest);
            let own = passed(&parts, body, failed, why, config);
            // A server error's answer that cannot be shared fails its waiters (the layer
            // answers them itself).
            let shared = if failed {
                Err(LoadFailure::BodyNotShareable.into())
            } else {
                Ok(telling(told))
            };
            return (shared, Some(own));
        }
    };
    let now = crate::clock::now();
    // `Age` is counted from when the response was generated, as far as the cache knows.
    let stored_at = now
        .checked_sub(parse::age(&parts.headers))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let stored: Vec<_> = parts
        .headers
        .iter()
        .filter(|(name, _)| is_stored_header(name, &parts.headers))
        .collect();
    let replayed = |chunks, why| {
        let body = ResponseBody::replay(chunks, None, None, None);
        passed(&parts, body, failed, why, config)
    };
    let ttl = match outlet {
        Outlet::Store(ttl) => ttl,
        Outlet::Waiters { failed } => {
            // The waiting requests get this answer through the cache; this request gets it
            // as it came (if a stale response does not stand in for a failure).
            let head = (parts.status, &stored[..]);
            let (entry, loaded): (_, fn(Bytes) -> Loaded) = if failed && names.is_empty() {
                let entry =
                    codec::encode_response(stored_at, parts.status, &stored, &chunks, forward);
                (entry, Loaded::for_waiters)
            } else {
                let entry =
                    codec::encode_for_waiters(stored_at, head, &chunks, forward, &sent_with());
                let loaded = if failed {
                    Loaded::for_waiters
                } else {
                    Loaded::shared_with_waiters
                };
                (entry, loaded)
            };
            let shared = match entry {
                Some(entry) => Ok(loaded(entry)),
                None if failed => Err(LoadFailure::NotEncodable.into()),
                None => Ok(telling(Pass::NotEncodable)),
            };
            if failed {
                // A server error is this request's own load, not stored, as it says wherever
                // the entry for its waiters answers it.
                let body = ResponseBody::replay(chunks, None, None, None);
                let response = Response::from_parts(parts, body);
                let answer = Ok(marked(response, own_load(None), &config.cache_status));
                return (shared, Some(ForCaller::Passed { answer, failed }));
            }
            return (shared, Some(replayed(chunks, why)));
        }
    };
    let Some(entry) = codec::encode_response(stored_at, parts.status, &stored, &chunks, forward)
    else {
        return (
            Ok(telling(Pass::NotEncodable)),
            Some(replayed(chunks, Pass::NotEncodable)),
        );
    };
    if names.is_empty() || matches!(step, Step::Variant(_)) {
        let own = ForCaller::Stored(own_load(Some(ttl)));
        return (Ok(config.to_store(entry, ttl, stale, &tags)), Some(own));
    }
    // A response with `Vary`, loaded for the URL's key: the response goes under this request's
    // variant key, and a marker naming the fields under the URL's key. The variant is filled
    // before the marker, so a request that finds the marker finds the variant.
    let marker = VaryMarker {
        stored_at: now,
        ttl,
        generation: rand::random(),
        names,
    };
    // The marker is not tagged: a purge of a tag removes the responses that carry it, and a
    // request that follows the marker to one of them loads it again.
    let Some(marker_entry) = codec::encode_vary(&marker) else {
        return (
            Ok(Loaded::pass()),
            Some(ForCaller::Variant(entry, own_load(None))),
        );
    };
    let variant = key::variant(primary, marker.generation, &marker.names, &asked.headers);
    let loaded = config.to_store(entry.clone(), ttl, stale, &tags);
    let ask = Ask::key(variant.as_bytes()).accepting(codec::accepts_variant);
    let fill = move |_| async move { Ok::<_, Infallible>(loaded) };
    let filled = cache.fetch_shared(ask, fill).await;
    // A fresh variant already there (refreshed on its own) is kept, and is the answer: the
    // caller never sees an older response after a newer one. A stale one is being replaced
    // by this load.
    let own = match filled {
        Ok(fetched) => match (fetched.outcome(), fetched.into_value()) {
            (Outcome::L1Hit | Outcome::L2Hit | Outcome::Follower, Some(value))
                if value != entry =>
            {
                ForCaller::Variant(value, Served::Hit(None))
            }
            _ => ForCaller::Variant(entry, own_load(Some(ttl))),
        },
        Err(error) => {
            debug!(
                error = &error as &dyn std::error::Error,
                "the variant was not stored"
            );
            ForCaller::Variant(entry, own_load(None))
        }
    };
    (Ok(exactly(marker_entry, ttl)), Some(own))
}

/// Nothing stored, for `why`, which the requests of this process that waited for the load are
/// told (they go to the inner service themselves, and say why).
fn telling(why: Pass) -> Loaded {
    Loaded::pass_telling(Handoff(Arc::new(why)))
}

/// The response with head `parts` and `body`, passed to its own request: not stored, for
/// `why`; `failed` if the load failed.
fn passed<B: Body, E>(
    parts: &http::response::Parts,
    body: ResponseBody<B>,
    failed: bool,
    why: Pass,
    config: &HttpConfig,
) -> ForCaller<B, E> {
    let response = Response::from_parts(parts.clone(), body);
    ForCaller::Passed {
        answer: Ok(marked(response, Served::Passed(why), &config.cache_status)),
        failed,
    }
}

/// The origin answered the revalidation of `stored` with `304 Not Modified`: the stored
/// response, its header fields updated by the `304`'s, is stored again (with its body, its
/// tags and the `304`'s) for the freshness the policy gives the updated response, and is
/// this request's answer. If the policy no longer stores it, it goes to this request alone.
fn not_modified<B: Body, E>(
    config: &HttpConfig,
    cache: &Cache,
    asked: &http::request::Parts,
    (stored, previous, answer): (codec::CachedResponse, &Previous, &http::response::Parts),
    tags: Result<Vec<Vec<u8>>, tag_fields::OverLimit>,
) -> Gives<B, E> {
    let updated = validation::updated(&stored, answer);
    let encoded = || {
        let stored_at = crate::clock::now()
            .checked_sub(parse::age(&answer.headers))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let fields: Vec<_> = updated.headers.iter().collect();
        codec::encode_response(
            stored_at,
            updated.status,
            &fields,
            std::slice::from_ref(&stored.body),
            Forward::Revalidated,
        )
    };
    if let ((Decision::StoreWith { fresh_for, stale }, _), Ok(tags)) =
        (config.decide(cache, asked, &updated), tags)
    {
        if let Some(entry) = encoded().filter(|_| config.headers_fit(&updated.headers)) {
            let own = ForCaller::Stored(Served::Revalidated(Some(fresh_for)));
            let loaded = config.to_store(entry, fresh_for, stale, &tags);
            return (Ok(loaded.tags_of(previous)), Some(own));
        }
    }
    let body = ResponseBody::replay(vec![stored.body], None, None, None);
    let own = ForCaller::Passed {
        answer: Ok(marked(
            Response::from_parts(updated, body),
            Served::Revalidated(None),
            &config.cache_status,
        )),
        failed: false,
    };
    (Ok(Loaded::pass()), Some(own))
}

/// A run of the URL's loader whose request went to the variant's loader: the marker is stored
/// again for what it had left (at least a second), instead of a load without a request.
///
/// It keeps its generation, so the URL's variants stay reachable (and a stale one can still
/// stand in for a failed load), if the store still holds that very marker. Otherwise (the URL
/// was invalidated since the request read the marker) it takes a generation of its own, or the
/// variants from before the invalidation would be reachable again. This run holds the URL's
/// lock, so an invalidation after this read voids it and its fill is refused: either way no
/// old variant comes back. One store read, once per marker that goes stale.
async fn restore(cache: &Cache, primary: &str, marker: &VaryMarker) -> Result<Loaded, BoxError> {
    // A read that fails (the store slow, down, or its breaker open) finds no marker: a new
    // generation, which is always safe.
    let stored = cache.read_stored(primary).await;
    let still_there = stored.ok().flatten().is_some_and(|stored| {
        matches!(
            crate::cache::entry::decode(stored.bytes),
            Ok(crate::cache::entry::Entry::Value { payload, .. })
                if matches!(codec::decode(&payload), Ok(codec::Decoded::Vary(held)) if held.generation == marker.generation)
        )
    });
    let marker = VaryMarker {
        generation: if still_there {
            marker.generation
        } else {
            rand::random()
        },
        ..marker.clone()
    };
    let entry = codec::encode_vary(&marker).ok_or(LoadFailure::MarkerNotEncodable)?;
    let left = marker
        .remaining(crate::clock::now())
        .max(Duration::from_secs(1));
    Ok(exactly(entry, left))
}
