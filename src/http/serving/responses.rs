//! Building the responses the layer returns: from a stored response (with `Age`, and `304 Not
//! Modified` where the request's preconditions say so), from a response passed through, or
//! made by the layer itself; each marked with how it was answered (see
//! [`cache_status`](super::cache_status)).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use bytes::Bytes;
use http::header::{Entry, AGE, CONTENT_LENGTH};
use http::{request, HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use http_body::Body;

use super::cache_status::{ttl, CacheStatus, Detail, Served, CACHE_STATUS};
use super::memo::made_once;
use crate::cache::{Fetched, L1Found, Outcome};
use crate::http::rules::conditional::{Conditions, NOT_MODIFIED_FIELDS};
use crate::http::serving::body::ResponseBody;
use crate::http::serving::config::HttpConfig;
use crate::http::stored::codec::{self, CachedResponse, Decoded, Forward, ANSWER_FIELDS};

/// A response to a cacheable request, or the inner service's error.
pub(crate) type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// `response`, marked as `served`.
pub(crate) fn marked<B>(
    mut response: Response<B>,
    served: Served,
    status: &CacheStatus,
) -> Response<B> {
    let code = response.status();
    status.mark(code, response.headers_mut(), served);
    response
}

/// How a fetch found the entry it answers with: the fetch's outcome, how the load that stored
/// the entry went forward (see [`codec::forward`]), and when the entry stops, or stopped,
/// being fresh ([`Fetched::fresh_until`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HowFound {
    pub(crate) outcome: Outcome,
    pub(crate) forward: Forward,
    pub(crate) fresh_until: Option<Instant>,
}

impl HowFound {
    pub(crate) fn of(fetched: &Fetched, entry: &Bytes) -> Self {
        HowFound {
            outcome: fetched.outcome(),
            forward: codec::forward(entry),
            fresh_until: fetched.fresh_until(),
        }
    }

    /// How an answer from the entry was served, by the fetch alone; a request collapsed onto
    /// a load says how that load went forward (a leader's own load may say more, see
    /// [`ForCaller::Stored`](super::load::ForCaller::Stored)).
    pub(crate) fn served(self) -> Served {
        let ttl = || ttl(self.fresh_until, Instant::now());
        match self.outcome {
            Outcome::Leader | Outcome::Uncached | Outcome::Degraded => match self.forward {
                Forward::Loaded => Served::Loaded(None),
                Forward::Refreshed => Served::Refreshed(None),
                Forward::Revalidated => Served::Revalidated(None),
            },
            // A stale answer's `ttl` is negative: an entry answered as stale though fresh
            // itself (a fresh variant under a stale vary marker) says no `ttl`.
            Outcome::Stale => Served::Stale(ttl().filter(|ttl| *ttl < 0)),
            Outcome::Follower => Served::Collapsed(self.forward),
            _ => Served::Hit(ttl()),
        }
    }
}

/// The form of answer a request wants besides its key: without a body (`HEAD`), or `304 Not
/// Modified` where its preconditions match. Kept apart from the request, which a load takes.
pub(crate) struct AnswerForm {
    head: bool,
    conditions: Option<Conditions>,
}

impl AnswerForm {
    pub(crate) fn of(request: &request::Parts) -> Self {
        AnswerForm {
            head: request.method == Method::HEAD,
            conditions: Conditions::of(&request.headers),
        }
    }

    /// Whether the request has preconditions the layer answers (`If-None-Match`,
    /// `If-Modified-Since`).
    pub(crate) fn has_conditions(&self) -> bool {
        self.conditions.is_some()
    }
}

/// The answer from the variant entry this request's own load of the URL left (a response).
pub(crate) fn own_entry<B: Body>(
    entry: &Bytes,
    served: Served,
    form: &AnswerForm,
    status: &CacheStatus,
) -> Response<ResponseBody<B>> {
    match codec::decode(entry) {
        Ok(Decoded::Response(cached)) => answer(&cached, served, form, status),
        _ => synthesized(StatusCode::BAD_GATEWAY, Detail::NoOriginResponse, status),
    }
}

/// A response passed through to this request, without its body if the request was a `HEAD`
/// (its load was a `GET`), but with the length the body has, when it is known.
pub(crate) fn without_body<B, E>(passed: Answer<B, E>, form: &AnswerForm) -> Answer<B, E>
where
    B: Body<Data = Bytes>,
{
    let mut response = passed?;
    if !form.head {
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

/// A stored response as L1 keeps it for hits: decoded once, with the fields of a plain hit (a
/// `GET` without preconditions) made ready, so that such a hit clones one map and sets `Age`.
pub(crate) struct HitReady {
    cached: CachedResponse,
    /// The stored fields, then `Content-Length` where they lack it, `Age` (set again by each
    /// hit, in place) and the marks of a hit, as [`answer`] adds them.
    fields: HeaderMap,
    /// The layer's configuration the marks are made for: a layer of another configuration
    /// sharing the cache (and so L1) answers its hits with [`answer`] instead.
    config: Arc<HttpConfig>,
    /// The response's age when the fields were made, and when (on the monotonic clock a hit
    /// reads anyway): a hit's `Age` counts on from there, without a read of the wall clock.
    age_then: Duration,
    made_at: Instant,
}

impl HitReady {
    pub(crate) fn new(cached: CachedResponse, config: &Arc<HttpConfig>) -> Self {
        let mut fields = cached.headers.clone();
        fields.reserve(ANSWER_FIELDS);
        with_length(&mut fields, cached.status, cached.body.len());
        fields.insert(AGE, HeaderValue::from_static("0"));
        config
            .cache_status
            .mark(cached.status, &mut fields, Served::Hit(None));
        let (made_at, now) = (Instant::now(), crate::clock::now());
        HitReady {
            age_then: now.duration_since(cached.stored_at).unwrap_or_default(),
            cached,
            fields,
            config: Arc::clone(config),
            made_at,
        }
    }

    /// A copy for one thread's view of L1: the hit's fields and the body in buffers of its
    /// own, so the reference counts a hit on this thread moves (a value's, the body's) are
    /// touched by no other thread's hits.
    pub(crate) fn localized(&self) -> HitReady {
        let mut fields = HeaderMap::with_capacity(self.fields.len());
        for (name, value) in &self.fields {
            fields.append(own_name(name), own_value(value));
        }
        let mut cached = self.cached.clone();
        cached.body = Bytes::copy_from_slice(&self.cached.body);
        HitReady {
            cached,
            fields,
            config: Arc::clone(&self.config),
            age_then: self.age_then,
            made_at: self.made_at,
        }
    }
}

/// A field name in a buffer of its own (a standard name has none).
fn own_name(name: &HeaderName) -> HeaderName {
    HeaderName::from_bytes(name.as_str().as_bytes()).unwrap_or_else(|_| name.clone())
}

/// A field value in a buffer of its own, as sensitive as `value`.
fn own_value(value: &HeaderValue) -> HeaderValue {
    let mut own = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
    own.set_sensitive(value.is_sensitive());
    own
}

/// The answer to a hit in L1 (`ready`, as `found` read it), for a layer of `config`: [`answer`]'s, built from the
/// fields made ready where the request is a plain `GET` of that layer (`Age` and our
/// `Cache-Status` member, the last, set in place).
pub(crate) fn hit<B: Body, T>(
    ready: &HitReady,
    found: &L1Found<T>,
    form: &AnswerForm,
    config: &Arc<HttpConfig>,
) -> Response<ResponseBody<B>> {
    let ttl = ttl(Some(found.fresh_until), found.read_at);
    if form.head || form.conditions.is_some() || !Arc::ptr_eq(&ready.config, config) {
        return answer(&ready.cached, Served::Hit(ttl), form, &config.cache_status);
    }
    let mut response = Response::new(ResponseBody::cached(ready.cached.body.clone()));
    *response.status_mut() = ready.cached.status;
    let fields = response.headers_mut();
    *fields = ready.fields.clone();
    let age = ready.age_then + found.read_at.saturating_duration_since(ready.made_at);
    fields.insert(AGE, age_value(age));
    if let Entry::Occupied(mut ours) = fields.entry(&CACHE_STATUS) {
        if let Some(last) = ours.iter_mut().next_back() {
            *last = config.cache_status.hit(ttl);
        }
    }
    response
}

/// The `Age` of a cached response at `now` (RFC 9111 §4.2.3, from when it was generated).
fn age(cached: &CachedResponse, now: SystemTime) -> HeaderValue {
    age_value(now.duration_since(cached.stored_at).unwrap_or_default())
}

thread_local! {
    /// The `Age` value this thread made last, made of its seconds (see [`age_value`]).
    static LAST_AGE: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// An `Age` field value: whole seconds, at most 2^31 (RFC 9111 §1.2.2). The value made last
/// on this thread is made again only when the seconds change: the hits of a hot entry within
/// one second share it (a clone shares its bytes).
fn age_value(age: Duration) -> HeaderValue {
    let seconds = age.as_secs().min(1 << 31);
    made_once(
        &LAST_AGE,
        |made| *made == seconds,
        || (seconds, HeaderValue::from(seconds)),
    )
}

/// Says the length of a response's body where its fields do not and its status lets them
/// (a `HEAD` or a `304` has no body to measure: they say the length of the `200`'s).
fn with_length(fields: &mut HeaderMap, status: StatusCode, length: usize) {
    if !fields.contains_key(CONTENT_LENGTH) && has_content(status) {
        fields.insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
}

/// The answer from a cached response: the response (without its body for a `HEAD`), or
/// `304 Not Modified` if the request's preconditions say so; with `Age`, marked as `served`.
pub(crate) fn answer<B: Body>(
    cached: &CachedResponse,
    served: Served,
    form: &AnswerForm,
    status: &CacheStatus,
) -> Response<ResponseBody<B>> {
    let now = crate::clock::now();
    let not_modified = form
        .conditions
        .as_ref()
        .is_some_and(|c| c.not_modified(cached.status, &cached.headers, now));
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
        let body = if form.head {
            ResponseBody::empty()
        } else {
            ResponseBody::cached(cached.body.clone())
        };
        let mut response = Response::new(body);
        *response.status_mut() = cached.status;
        *response.headers_mut() = cached.headers.clone();
        response
    };
    with_length(response.headers_mut(), cached.status, cached.body.len());
    response.headers_mut().insert(AGE, age(cached, now));
    marked(response, served, status)
}

/// Whether a response with this status may say its length (RFC 9110 §8.6: never 1xx, 204).
fn has_content(status: StatusCode) -> bool {
    !status.is_informational() && status != StatusCode::NO_CONTENT
}

/// A response the layer makes itself when there is neither a cached response nor an answer
/// of the origin for this request; `Cache-Status` says why (`detail`).
pub(crate) fn synthesized<B: Body>(
    code: StatusCode,
    detail: Detail,
    status: &CacheStatus,
) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    marked(response, Served::MadeUp(detail), status)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Forward, HowFound, Served};
    use crate::cache::Outcome;

    /// RFC 9111 §5.1, §1.2.2: `Age` is whole seconds, at most 2^31; the last value made on
    /// a thread is reused for the same seconds only.
    #[test]
    fn age_says_its_own_seconds_each_time() {
        for seconds in [0, 0, 1, 1, 0, 7, 1 << 31, 1 << 40, 7] {
            let value = super::age_value(Duration::from_millis(seconds * 1000 + 999));
            assert_eq!(value.to_str().unwrap(), seconds.min(1 << 31).to_string());
        }
    }

    /// RFC 9211 §2.4: a hit's `ttl` is what is left of its freshness; a stale answer's is
    /// negative, and an answer counted stale for another reason (a stale vary marker over a
    /// fresh variant) says none rather than a positive one.
    #[test]
    fn a_stale_answer_never_says_a_positive_ttl() {
        let found = |outcome, fresh_until| HowFound {
            outcome,
            forward: Forward::Loaded,
            fresh_until: Some(fresh_until),
        };
        let (later, earlier) = (
            Instant::now() + Duration::from_secs(30),
            Instant::now() - Duration::from_millis(2500),
        );
        assert!(matches!(
            found(Outcome::L2Hit, later).served(),
            Served::Hit(Some(29 | 30))
        ));
        assert_eq!(
            found(Outcome::Stale, earlier).served(),
            Served::Stale(Some(-3))
        );
        assert_eq!(found(Outcome::Stale, later).served(), Served::Stale(None));
    }
}
