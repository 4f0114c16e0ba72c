//! How the layer says it handled a response: `Cache-Status` (RFC 9211), and the older
//! `x-cache` for existing users. A pass says why in `Cache-Status`'s `detail` (a [`Pass`]),
//! and marking it also reports it ([`Passes`]: a metric by reason, a rate-limited warning).
//!
//! Every response the layer handles gets one `Cache-Status` member under the layer's cache
//! name, appended after any the response already carries: RFC 9211 §2 lists the caches in
//! order, the one closest to the origin first, so a `Cache-Status` of the origin's own cache
//! stays in front. The fixed values (a hit or a stale answer whose freshness is not known)
//! are made once, when the layer is configured; the others are written per response with
//! `itoa` (on a hit, only the member itself: see [`responses::hit`](super::responses::hit)).

use std::cell::RefCell;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::memo::made_once;
use crate::http::invalidation::bounded::Invalidated;
use crate::http::rules::pass::Pass;
use crate::http::rules::stored_fields::X_CACHE;
use crate::http::serving::passes::Passes;
use crate::http::stored::codec::Forward;

/// `Cache-Status` (RFC 9211).
pub(crate) static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");
/// `x-cache`: from the cache (L1, the shared store, or another request's load).
const HIT: HeaderValue = HeaderValue::from_static("HIT");
/// `x-cache`: this request's own load (or the layer made the response).
const MISS: HeaderValue = HeaderValue::from_static("MISS");
/// `x-cache`: passed to the inner service, not cacheable.
const BYPASS: HeaderValue = HeaderValue::from_static("BYPASS");
/// `x-cache`: a stale response.
const STALE: HeaderValue = HeaderValue::from_static("STALE");

/// RFC 9211 §2.4's `ttl` of a response fresh until `fresh_until` (if known), at `now`: its
/// remaining freshness in whole seconds, or, once stale, how long it has been stale as a
/// negative number (at least 1: a `ttl` of 0 would still read as fresh).
pub(crate) fn ttl(fresh_until: Option<Instant>, now: Instant) -> Option<i64> {
    let fresh_until = fresh_until?;
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    Some(match fresh_until.checked_duration_since(now) {
        Some(left) => seconds(left),
        None => {
            let stale = now.saturating_duration_since(fresh_until);
            let whole = seconds(stale).saturating_add(i64::from(stale.subsec_nanos() > 0));
            -whole.max(1)
        }
    })
}

thread_local! {
    /// The hit value this thread made last ([`CacheStatus::hit`]), made of the name and the
    /// `ttl`.
    static LAST_HIT: RefCell<Option<((Bytes, i64), HeaderValue)>> = const { RefCell::new(None) };
}

/// The cache name used in `Cache-Status` unless one is configured.
pub(crate) const DEFAULT_NAME: &str = "tower-stampede";

/// How a response was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// From a fresh entry: `hit; ttl=N`, with its remaining freshness in seconds when known
    /// (RFC 9211 §2.1, §2.4) (`x-cache: HIT`).
    Hit(Option<i64>),
    /// From an entry that is past its freshness, served while a load refreshes it, or in place
    /// of a failed one: `hit; ttl=-N; detail=stale` (`STALE`). RFC 9211 §2.1 calls a response
    /// from the cache that this request did not wait on the origin for a hit, and §2.4 marks a
    /// stale one with a negative `ttl`; `detail` says it too, for readers of the crate's
    /// earlier `hit; detail=stale` (`fwd=stale` is for a request that went forward because
    /// its entry was stale).
    Stale(Option<i64>),
    /// By another request's load (here or in another process), collapsed with it, as the
    /// entry that load stored says it went forward (RFC 9211 §2.2, §2.3): `fwd=uri-miss;
    /// fwd-status=N; collapsed` for a missing entry, `fwd=stale; fwd-status=N; collapsed` for
    /// a stale one the origin answered with a new response, `fwd=stale; fwd-status=304;
    /// collapsed` for a stale one it answered `304` (`MISS`: forwarded, if by another request;
    /// `x-cache` tells what `fwd` does).
    Collapsed(Forward),
    /// By this request's own load: `fwd=uri-miss; fwd-status=N`, with `stored; ttl=N` if it
    /// was stored for that long (`MISS`).
    Loaded(Option<Duration>),
    /// By this request's own load of a stale entry, which the origin answered with a new
    /// response (a `200` to the conditional reload): `fwd=stale; fwd-status=N`, with
    /// `stored; ttl=N` if it was stored for that long (`MISS`).
    Refreshed(Option<Duration>),
    /// By this request's own load, a revalidation of a stale entry that the origin answered
    /// with `304`: `fwd=stale; fwd-status=304`, with `stored; ttl=N` if the refreshed entry
    /// was stored for that long (`MISS`).
    Revalidated(Option<Duration>),
    /// By the inner service, the response not to be stored (or a "pass" marker said so), for
    /// this reason: `fwd=uri-miss; fwd-status=N; detail=R` (`BYPASS`).
    Passed(Pass),
    /// By the inner service, the request not to be answered from the cache (`no-store`, a
    /// range, a precondition, a reload the layer honours, a header that passes), for this
    /// reason: `fwd=request; fwd-status=N; detail=R` (`BYPASS`).
    Request(Pass),
    /// By the inner service, the key not describing the request: `fwd=bypass; fwd-status=N;
    /// detail=no-key` (`BYPASS`).
    Unkeyed,
    /// Made by the layer, with no answer of the origin to give: `fwd=uri-miss; detail=D`
    /// (`MISS`).
    MadeUp(Detail),
    /// By the inner service, to an unsafe method (or a method override naming one), which is
    /// forwarded for its semantics (RFC 9211 §2.2): `fwd=method; fwd-status=N; detail=D`
    /// (`BYPASS`), `D` saying what became of the URL's stored responses (RFC 9111 §4.4):
    /// `invalidated` now, `invalidation-coalesced` with the others of its interval (see
    /// [`invalidation_interval`](crate::http::StampedeLayer::invalidation_interval)), or
    /// `unsafe-method`, nothing (an error status, or invalidation turned off for it).
    Unsafe(Option<Invalidated>),
}

/// Why the layer made a response itself, as `Cache-Status`'s `detail` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Detail {
    /// The load got no answer from the origin (the inner service failed, its body failed, or
    /// an answer could not be shared), here or in another process: `502`.
    NoOriginResponse,
    /// The load, or the wait for it, timed out: `504`.
    Timeout,
}

impl Detail {
    fn token(self) -> &'static [u8] {
        match self {
            Detail::NoOriginResponse => b"no-origin-response",
            Detail::Timeout => b"timeout",
        }
    }
}

impl Served {
    /// Why the response passed the cache, if it did.
    pub(crate) fn pass(self) -> Option<Pass> {
        match self {
            Served::Passed(pass) | Served::Request(pass) => Some(pass),
            Served::Unkeyed => Some(Pass::NoKey),
            _ => None,
        }
    }
}

/// The layer's `Cache-Status` name and whether it writes `x-cache` too, with the values made
/// once, and where it reports passes.
#[derive(Clone, Debug)]
pub(crate) struct CacheStatus {
    /// The name as a Structured Field item: a Token if it is one, else a String.
    name: Bytes,
    hit: HeaderValue,
    stale: HeaderValue,
    x_cache: bool,
    passes: Passes,
}

impl Default for CacheStatus {
    fn default() -> Self {
        CacheStatus::new(DEFAULT_NAME, true)
    }
}

impl CacheStatus {
    /// The values for the cache `name` (written as a Token if it is one, else as a String of
    /// its printable ASCII characters), with `x-cache` or without.
    pub(crate) fn new(name: &str, x_cache: bool) -> Self {
        let name = serialized_name(name);
        let fixed = |parameters: &[u8]| {
            let mut value = BytesMut::with_capacity(name.len() + parameters.len());
            value.put_slice(&name);
            value.put_slice(parameters);
            HeaderValue::from_maybe_shared(value.freeze())
                .unwrap_or_else(|_| HeaderValue::from_static(DEFAULT_NAME))
        };
        CacheStatus {
            hit: fixed(b"; hit"),
            stale: fixed(b"; hit; detail=stale"),
            name,
            x_cache,
            passes: Passes::default(),
        }
    }

    /// The same under the cache name `name`.
    pub(crate) fn renamed(&self, name: &str) -> Self {
        CacheStatus {
            passes: self.passes.clone(),
            ..CacheStatus::new(name, self.x_cache)
        }
    }

    /// The same, reporting passes to `passes`.
    pub(crate) fn reporting(mut self, passes: Passes) -> Self {
        self.passes = passes;
        self
    }

    /// The same, with `x-cache` on or off.
    pub(crate) fn with_x_cache(mut self, on: bool) -> Self {
        self.x_cache = on;
        self
    }

    /// Marks a response `status` with `headers` as `served`; a pass is reported too.
    pub(crate) fn mark(&self, status: StatusCode, headers: &mut HeaderMap, served: Served) {
        if let Some(pass) = served.pass() {
            self.passes.report(pass);
        }
        if self.x_cache {
            let x_cache = match served {
                Served::Hit(_) => HIT,
                Served::Stale(_) => STALE,
                Served::Loaded(_)
                | Served::Refreshed(_)
                | Served::Revalidated(_)
                | Served::Collapsed(_)
                | Served::MadeUp(_) => MISS,
                Served::Passed(_) | Served::Request(_) | Served::Unkeyed | Served::Unsafe(_) => {
                    BYPASS
                }
            };
            headers.insert(X_CACHE.clone(), x_cache);
        }
        let value = match served {
            Served::Hit(ttl) => self.hit(ttl),
            Served::Stale(None) => self.stale.clone(),
            Served::Stale(Some(ttl)) => self.with_ttl(ttl, b"; detail=stale"),
            _ => self.written(status, served),
        };
        headers.append(CACHE_STATUS.clone(), value);
    }

    /// The value of a hit on an entry fresh for `ttl` more seconds (if known).
    /// The value made last on this thread is made again only when its `ttl` (or the name)
    /// changes: the hits of a hot entry within one second share it.
    pub(crate) fn hit(&self, ttl: Option<i64>) -> HeaderValue {
        let Some(ttl) = ttl else {
            return self.hit.clone();
        };
        made_once(
            &LAST_HIT,
            |(name, made)| *made == ttl && *name == self.name,
            || ((self.name.clone(), ttl), self.with_ttl(ttl, b"")),
        )
    }

    /// `hit; ttl=N`, then `rest`.
    fn with_ttl(&self, ttl: i64, rest: &[u8]) -> HeaderValue {
        let mut numbers = itoa::Buffer::new();
        let ttl = numbers.format(ttl).as_bytes();
        let mut value = BytesMut::with_capacity(self.name.len() + 11 + ttl.len() + rest.len());
        value.put_slice(&self.name);
        value.put_slice(b"; hit; ttl=");
        value.put_slice(ttl);
        value.put_slice(rest);
        HeaderValue::from_maybe_shared(value.freeze()).unwrap_or_else(|_| self.hit.clone())
    }

    /// A value with a status, a TTL or a detail in it.
    fn written(&self, status: StatusCode, served: Served) -> HeaderValue {
        let mut value = BytesMut::with_capacity(self.name.len() + 64);
        value.put_slice(&self.name);
        value.put_slice(match served {
            Served::Request(pass) if pass.configured() => b"; fwd=bypass",
            Served::Passed(pass) if pass.configured() => b"; fwd=bypass",
            Served::Request(_) => b"; fwd=request",
            Served::Unkeyed => b"; fwd=bypass",
            Served::Unsafe(_) => b"; fwd=method",
            Served::Revalidated(_)
            | Served::Refreshed(_)
            | Served::Collapsed(Forward::Refreshed | Forward::Revalidated) => b"; fwd=stale",
            _ => b"; fwd=uri-miss",
        });
        let mut numbers = itoa::Buffer::new();
        match served {
            Served::MadeUp(detail) => {
                value.put_slice(b"; detail=");
                value.put_slice(detail.token());
            }
            _ => {
                let status = match served {
                    Served::Revalidated(_) | Served::Collapsed(Forward::Revalidated) => {
                        StatusCode::NOT_MODIFIED
                    }
                    _ => status,
                };
                value.put_slice(b"; fwd-status=");
                value.put_slice(numbers.format(status.as_u16()).as_bytes());
            }
        }
        match served {
            Served::Collapsed(_) => value.put_slice(b"; collapsed"),
            Served::Loaded(Some(ttl))
            | Served::Refreshed(Some(ttl))
            | Served::Revalidated(Some(ttl)) => {
                value.put_slice(b"; stored; ttl=");
                value.put_slice(numbers.format(ttl.as_secs()).as_bytes());
            }
            _ => {}
        }
        if let Some(pass) = served.pass() {
            // RFC 9211 §2.8: a Token or a String. Every rule's name, and with the header it
            // names, is a Token; a String stands in should one not be.
            value.put_slice(b"; detail=");
            value.put_slice(&serialized_name(&pass.detail()));
        }
        if let Served::Unsafe(invalidated) = served {
            value.put_slice(match invalidated {
                Some(Invalidated::Now) => b"; detail=invalidated",
                Some(Invalidated::Coalesced) => b"; detail=invalidation-coalesced",
                None => b"; detail=unsafe-method",
            });
        }
        HeaderValue::from_maybe_shared(value.freeze()).unwrap_or_else(|_| self.hit.clone())
    }
}

/// `name` as a Structured Field Token (RFC 8941 §3.3.4) if it is one, else as a String of its
/// printable ASCII characters.
fn serialized_name(name: &str) -> Bytes {
    let bytes = name.as_bytes();
    let token = bytes
        .first()
        .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'*')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(b));
    if token {
        return Bytes::copy_from_slice(bytes);
    }
    let mut quoted = BytesMut::with_capacity(bytes.len() + 2);
    quoted.put_u8(b'"');
    for &b in bytes.iter().filter(|b| (0x20..=0x7e).contains(*b)) {
        if b == b'"' || b == b'\\' {
            quoted.put_u8(b'\\');
        }
        quoted.put_u8(b);
    }
    quoted.put_u8(b'"');
    quoted.freeze()
}

#[cfg(test)]
mod tests;
