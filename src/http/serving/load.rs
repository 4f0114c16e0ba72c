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
use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::oneshot;
use tower::util::Oneshot;
use tower::Service;
use tracing::debug;

use super::cache_status::Served;
use super::load_failure::LoadFailure;
use super::outlet::{exactly, Outlet};
use super::read_body::{read_body, Read};
use super::relay::Relay;
use super::responses::{marked, Answer};
use super::slot::{Claim, Slot, Step};
use super::validation;
use crate::cache::{BoxError, Cache, Handoff, Loaded, Outcome, Previous};
use crate::http::rules::decision::{Decision, Staleness};
use crate::http::rules::parse::{self, Vary};
use crate::http::rules::pass::Pass;
use crate::http::rules::stored_fields::is_stored_header;
use crate::http::rules::tag_fields;
use crate::http::serving::body::ResponseBody;
use crate::http::serving::config::HttpConfig;
use crate::http::stored::codec::{self, Forward, VaryMarker};
use crate::http::stored::key;

/// What a load needs: the inner service, the cache (a load of a response with `Vary` fills a
/// second key), the settings, and whether the request is keyed by its forwarding headers
/// (its response is then always stored as a variant: see [`key`]).
pub(crate) struct Loading<S> {
    pub(crate) inner: S,
    pub(crate) cache: Cache,
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) forwarded: bool,
}

impl<S: Clone> Clone for Loading<S> {
    fn clone(&self) -> Self {
        Loading {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
            config: Arc::clone(&self.config),
            forwarded: self.forwarded,
        }
    }
}

/// What a loader hands straight to its own caller.
// Made once per load and moved once, through a oneshot: boxing would only add an allocation.
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

/// Loads for `step` of the request in `slot`; see the [module docs](self). With a `previous`
/// stored response, the load is a revalidation (see [`validation`]).
pub(crate) async fn load<S, ReqBody, ResBody>(
    loading: Loading<S>,
    primary: String,
    step: Step,
    slot: Slot<ReqBody>,
    to_leader: oneshot::Sender<ForCaller<ResBody, S::Error>>,
    previous: Option<Previous>,
) -> Result<Loaded, BoxError>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Send + 'static,
{
    let request = match slot.claim(&step).await {
        Claim::Request(request) => request,
        Claim::Restore(marker) => return restore(&loading.cache, &primary, &marker).await,
        Claim::Gone => return Err(LoadFailure::RequestSent.into()),
    };
    let (mut parts, body) = request.into_parts();
    let asked = parts.clone();
    parts.method = Method::GET;
    parts.headers.remove(IF_NONE_MATCH);
    parts.headers.remove(IF_MODIFIED_SINCE);
    let stored = previous
        .as_ref()
        .and_then(|previous| match codec::decode(previous.value()) {
            Ok(codec::Decoded::Response(stored)) => Some(stored),
            _ => None,
        });
    if let Some(stored) = &stored {
        validation::ask_if_changed(stored, &mut parts.headers);
    }
    // What this load says in `Cache-Status` when it answers with what the origin sent, and
    // its entry says for the requests collapsed onto it: a forward for a stale entry, or for
    // a missing one (RFC 9211 §2.2).
    let forward = if stored.is_some() {
        Forward::Refreshed
    } else {
        Forward::Loaded
    };
    let own_load = move |ttl| match forward {
        Forward::Loaded => Served::Loaded(ttl),
        Forward::Refreshed | Forward::Revalidated => Served::Refreshed(ttl),
    };
    let response = match Oneshot::new(loading.inner, Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(error) => {
            let _ = to_leader.send(ForCaller::Passed {
                answer: Err(error),
                failed: true,
            });
            return Err(LoadFailure::InnerService.into());
        }
    };
    let (mut parts, body) = response.into_parts();
    let tags = tag_fields::read(&parts.headers, &loading.config.tag_headers);
    loading.config.strip_tags(&mut parts.headers);
    let passed = |body: ResponseBody<ResBody>, failed: bool, why: Pass| ForCaller::Passed {
        answer: Ok(marked(
            Response::from_parts(parts.clone(), body),
            Served::Passed(why),
            &loading.config.cache_status,
        )),
        failed,
    };
    if let (Some(stored), Some(previous), StatusCode::NOT_MODIFIED) =
        (stored, &previous, parts.status)
    {
        let config = &loading.config;
        let loaded = not_modified(
            config,
            &loading.cache,
            &asked,
            (stored, previous),
            &parts,
            tags,
            to_leader,
        );
        return Ok(loaded);
    }
    let (decision, why) = loading.config.decide(&loading.cache, &asked, &parts);
    let (outlet, stale) = match decision {
        Decision::StoreWith { fresh_for, stale } => (Outlet::Store(fresh_for), stale),
        // A failed load (a server error without explicit freshness): stored for nobody, but
        // the requests that waited for this load, here and elsewhere, get the origin's own
        // answer too (below), and a stale response may stand in for it.
        Decision::Share => (Outlet::Waiters { failed: true }, Staleness::default()),
        Decision::Fail => {
            // A failed load private to its request: a stale response, if there is one, is
            // served in its place to the others.
            let _ = to_leader.send(passed(ResponseBody::inner(body), true, why));
            return Err(LoadFailure::PrivateServerError(parts.status).into());
        }
        // Not stored, but it may go to the requests that waited for this load.
        Decision::Pass if loading.config.policy.shares_with_waiters(&asked, &parts) => {
            (Outlet::Waiters { failed: false }, Staleness::default())
        }
        _ => {
            let _ = to_leader.send(passed(ResponseBody::inner(body), false, why));
            return Ok(Loaded::pass());
        }
    };
    let failed = matches!(outlet, Outlet::Waiters { failed: true });
    if !loading.config.headers_fit(&parts.headers) {
        // As for a body over the limit: not stored, and a server error's answer that cannot
        // be shared fails its waiters.
        debug!("response header fields over the limit; passed");
        let _ = to_leader.send(passed(
            ResponseBody::inner(body),
            failed,
            Pass::HeadersTooLarge,
        ));
        return if failed {
            Err(LoadFailure::HeadersTooLarge.into())
        } else {
            Ok(Loaded::pass())
        };
    }
    // Keyed by its forwarding headers: as if the response varied on them too, so that what was
    // loaded for one set of their values goes to no request with others, stored or handed on.
    let with_forwarded = |mut names: Vec<HeaderName>| {
        if loading.forwarded {
            for name in loading.config.reflected.keyed() {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names
    };
    let (tags, names) = match (outlet, tags) {
        // A server error goes to every waiter (the layer's own gateway error is no better),
        // but for its forwarding headers.
        (Outlet::Waiters { failed: true }, _) => (Vec::new(), with_forwarded(Vec::new())),
        (Outlet::Waiters { failed: false }, _) => match parse::vary(&parts.headers) {
            Vary::None => (Vec::new(), with_forwarded(Vec::new())),
            Vary::Names(names) => (Vec::new(), with_forwarded(names)),
            Vary::Unkeyable => {
                let _ = to_leader.send(passed(ResponseBody::inner(body), false, Pass::VaryStar));
                return Ok(Loaded::pass());
            }
        },
        (Outlet::Store(_), Err(_)) => {
            // A purge of its tags could not reach it.
            debug!("more tags than a stored response may carry; passed");
            let _ = to_leader.send(passed(ResponseBody::inner(body), false, Pass::TooManyTags));
            return Ok(Loaded::pass());
        }
        (Outlet::Store(_), Ok(tags)) => match (parse::vary(&parts.headers), &step) {
            // Keyed by its forwarding headers: a variant.
            (Vary::None, Step::Primary) if loading.forwarded => (tags, with_forwarded(Vec::new())),
            (Vary::Names(names), Step::Primary) if loading.forwarded => {
                (tags, with_forwarded(names))
            }
            (Vary::None, _) => (tags, Vec::new()),
            // A variant may be stored under a key that names more fields than it varies on,
            // never fewer.
            (Vary::Names(names), Step::Variant(keyed))
                if names.iter().all(|n| keyed.contains(n)) =>
            {
                (tags, names)
            }
            (Vary::Names(names), Step::Primary) => (tags, names),
            (Vary::Names(_) | Vary::Unkeyable, _) => {
                let _ = to_leader.send(passed(ResponseBody::inner(body), false, Pass::VaryStar));
                return Ok(Loaded::pass());
            }
        },
    };
    // What the requests that wait for this load must match to get it, where it is not stored.
    let sent_with = || key::vary_digest(&names, &asked.headers);
    let chunks = match read_body(Box::pin(body), loading.config.max_body_bytes).await {
        Read::Complete(chunks) => chunks,
        Read::Stopped {
            read,
            trailers: None,
            error: None,
            rest: Some(rest),
        } if !failed && loading.config.relays(rest.size_hint()) => {
            // Over the limit, but shareable: relayed to the requests of this process that
            // waited for this load (the engine hands them the relay); other processes' load
            // once each.
            let limit = loading.config.max_relay_bytes;
            let (relay, reader) = Relay::start(parts.clone(), sent_with(), (read, rest), limit);
            let _ = to_leader.send(passed(ResponseBody::relayed(reader), false, Pass::TooLarge));
            return Ok(Loaded::pass_handing(Handoff(relay)));
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
            let body = ResponseBody::replay(read, trailers, error, rest);
            let _ = to_leader.send(passed(body, failed, why));
            // A server error's answer that cannot be shared fails its waiters (the layer
            // answers them itself).
            return if failed {
                Err(LoadFailure::BodyNotShareable.into())
            } else {
                Ok(Loaded::pass())
            };
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
            let body = ResponseBody::replay(chunks, None, None, None);
            let _ = to_leader.send(passed(body, failed, why));
            return match entry {
                Some(entry) => Ok(loaded(entry)),
                None if failed => Err(LoadFailure::NotEncodable.into()),
                None => Ok(Loaded::pass()),
            };
        }
    };
    let Some(entry) = codec::encode_response(stored_at, parts.status, &stored, &chunks, forward)
    else {
        let body = ResponseBody::replay(chunks, None, None, None);
        let _ = to_leader.send(passed(body, false, Pass::NotEncodable));
        return Ok(Loaded::pass());
    };
    if names.is_empty() || matches!(step, Step::Variant(_)) {
        let _ = to_leader.send(ForCaller::Stored(own_load(Some(ttl))));
        return Ok(loading.config.to_store(entry, ttl, stale, &tags));
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
        let _ = to_leader.send(ForCaller::Variant(entry, own_load(None)));
        return Ok(Loaded::pass());
    };
    let variant = key::variant(&primary, marker.generation, &marker.names, &asked.headers);
    let loaded = loading.config.to_store(entry.clone(), ttl, stale, &tags);
    let filled = loading
        .cache
        .fetch_accepting(variant, codec::accepts_variant, move |_| async move {
            Ok::<_, Infallible>(loaded)
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
    let _ = to_leader.send(own);
    Ok(exactly(marker_entry, ttl))
}

/// The origin answered the revalidation of `stored` with `304 Not Modified`: the stored
/// response, its header fields updated by the `304`'s, is stored again (with its body, its
/// tags and the `304`'s) for the freshness the policy gives the updated response, and is
/// this request's answer. If the policy no longer stores it, it goes to this request alone.
fn not_modified<B: Body, E>(
    config: &HttpConfig,
    cache: &Cache,
    asked: &http::request::Parts,
    (stored, previous): (codec::CachedResponse, &Previous),
    answer: &http::response::Parts,
    tags: Result<Vec<Vec<u8>>, tag_fields::OverLimit>,
    to_leader: oneshot::Sender<ForCaller<B, E>>,
) -> Loaded {
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
            let _ = to_leader.send(ForCaller::Stored(Served::Revalidated(Some(fresh_for))));
            return config
                .to_store(entry, fresh_for, stale, &tags)
                .tags_of(previous);
        }
    }
    let body = ResponseBody::replay(vec![stored.body], None, None, None);
    let _ = to_leader.send(ForCaller::Passed {
        answer: Ok(marked(
            Response::from_parts(updated, body),
            Served::Revalidated(None),
            &config.cache_status,
        )),
        failed: false,
    });
    Loaded::pass()
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
