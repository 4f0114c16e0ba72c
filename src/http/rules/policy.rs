//! The one place that decides what is cached: request rules, the replaceable response
//! [`Policy`] and its default, [`RfcPolicy`], and which headers are stored.
//!
//! Past 500 lines because of its tests: the rules are about 540 lines (370 of code), and the
//! tests of every rule stay beside it, so that one file shows what is cached and the proof of it.

use std::time::{Duration, SystemTime};

use http::header::{
    AGE, CACHE_CONTROL, COOKIE, DATE, ETAG, EXPIRES, IF_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE,
    LAST_MODIFIED, PRAGMA, RANGE, SET_COOKIE,
};
use http::{request, response, HeaderMap, HeaderName, Method, Request, StatusCode};

use super::credentials::{CookieRule, Credentials};
use super::parse::{self, Directive};
use super::poisoning::Unkeyed;
use super::targeted;
use crate::http::invalidation::by_url;
use crate::http::serving::cache_status::X_CACHE;

/// What the layer does with a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RequestRule {
    /// Look it up (a `GET`, or a `HEAD` answered from the `GET` entry).
    Cache,
    /// A safe method the cache has nothing to do with (`OPTIONS`, `TRACE`), or `CONNECT`:
    /// pass it on untouched.
    Ignore,
    /// An unsafe method (`POST`, `PUT`, `DELETE`, `PATCH`, or one the layer does not know):
    /// pass it on, and invalidate its URL if the response is not an error (RFC 9111 §4.4).
    Invalidate,
    /// A cacheable method that must not be answered from the cache (`no-store`, a range, a
    /// precondition other than `If-None-Match` / `If-Modified-Since`, a reload the layer
    /// honours, or what could [poison](super::poisoning) the cache): pass it on, marked
    /// `x-cache: BYPASS`.
    Bypass,
}

/// Decides what to do with a request, before its key is made: `unkeyed` names what makes a
/// `GET` or `HEAD` pass.
pub(crate) fn request_rule<B>(
    request: &Request<B>,
    honor_client_no_cache: bool,
    unkeyed: &Unkeyed,
) -> RequestRule {
    let method = request.method();
    if method != Method::GET && method != Method::HEAD {
        return if by_url::is_safe(method) || method == Method::CONNECT {
            RequestRule::Ignore
        } else {
            RequestRule::Invalidate
        };
    }
    let headers = request.headers();
    if unkeyed.overrides_to_unsafe(headers) {
        tracing::debug!("a method override to an unsafe method; passed, and it invalidates");
        return RequestRule::Invalidate;
    }
    if unkeyed.poisons(headers) {
        tracing::debug!("a request that could poison the cache; passed");
        return RequestRule::Bypass;
    }
    // Ranges and these preconditions get answers for this request only (206, 412) that the
    // layer does not compute from an entry.
    const ANSWERED_BY_THE_ORIGIN: [HeaderName; 4] =
        [RANGE, IF_MATCH, IF_UNMODIFIED_SINCE, IF_RANGE];
    if ANSWERED_BY_THE_ORIGIN
        .iter()
        .any(|h| headers.contains_key(h))
    {
        return RequestRule::Bypass;
    }
    let mut reload = false;
    for Directive { name, argument } in parse::directives(headers) {
        match name.as_str() {
            "no-store" => return RequestRule::Bypass,
            "no-cache" => reload = true,
            "max-age" => {
                reload |= argument.as_deref().and_then(parse::delta_seconds) == Some(Duration::ZERO)
            }
            _ => {}
        }
    }
    // RFC 9111 §5.4: `Pragma: no-cache` counts only without `Cache-Control`.
    reload |= !headers.contains_key(CACHE_CONTROL)
        && headers
            .get_all(PRAGMA)
            .iter()
            .any(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"no-cache"));
    if reload && honor_client_no_cache {
        return RequestRule::Bypass;
    }
    RequestRule::Cache
}

/// What the layer does with a response from the inner service; see [`Policy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Store the response, fresh for this long from now (0 is the same as [`Pass`](Self::Pass)).
    /// Past its freshness it may be served under the cache's own
    /// [`stale`](crate::CacheBuilder::stale) windows.
    Store(Duration),
    /// Store the response, fresh for `fresh_for` from now, with stale rules of its own. A
    /// freshness of 0 stores a response that is never served without revalidating it first
    /// (`no-cache`), if the cache keeps values for revalidation
    /// ([`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)); otherwise it
    /// is passed.
    StoreWith {
        /// How long the response is fresh.
        fresh_for: Duration,
        /// How it may be served once it is not.
        stale: Staleness,
    },
    /// Hand the response to the request that loaded it and store nothing; the requests
    /// waiting for it go to the inner service themselves (a short "pass" marker tells
    /// them, see [`pass_ttl`](crate::CacheBuilder::pass_ttl)).
    Pass,
    /// A failed load that is private to its request: hand the response to the request that
    /// loaded it, store nothing, and answer the requests waiting for it with a stale response
    /// if there is one (see [`stale_if_error`](crate::CacheBuilder::stale_if_error)), else the
    /// layer's own `502 Bad Gateway`, for the [`failure_ttl`](crate::CacheBuilder::failure_ttl).
    /// [`RfcPolicy`] says so of a server error with `no-store`, `private` or `Set-Cookie`, or
    /// to a request with credentials it may not share.
    Fail,
    /// A failed load whose response may go to others (a server error without explicit
    /// freshness): store nothing, and hand the origin's response (status, headers, body) to the
    /// request that loaded it and to the requests that waited for this load, in every process;
    /// a request that comes after the load ended loads again (one load at a time, as for any
    /// miss). A stale response stands in for it where
    /// [`stale_if_error`](crate::CacheBuilder::stale_if_error) allows. A body over
    /// [`max_body_bytes`](crate::http::StampedeLayer::max_body_bytes) cannot be shared: the waiting
    /// requests then get the layer's own `502 Bad Gateway`, as for [`Fail`](Self::Fail).
    Share,
}

/// How a stored response may be served past its freshness: its own stale-while-revalidate
/// and stale-if-error windows (RFC 5861 §3, §4; `None`: the cache's), within the layer's
/// [`max_response_stale`](crate::http::StampedeLayer::max_response_stale).
/// [`must_revalidate`](Self::must_revalidate) forbids both (RFC 9111 §4.2.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Staleness {
    /// How long past its freshness the response may be served while a reload revalidates it.
    pub while_revalidating: Option<Duration>,
    /// How long past its freshness the response may stand in for a reload that failed.
    pub if_error: Option<Duration>,
}

impl Staleness {
    /// The cache's windows: the response says nothing of its own.
    pub fn cache_default() -> Self {
        Staleness::default()
    }

    /// Never served stale: `must-revalidate`, `proxy-revalidate`, `s-maxage`, `no-cache`.
    pub fn must_revalidate() -> Self {
        Staleness {
            while_revalidating: Some(Duration::ZERO),
            if_error: Some(Duration::ZERO),
        }
    }

    /// With a stale-while-revalidate window of its own.
    #[must_use]
    pub fn while_revalidating(mut self, window: Duration) -> Self {
        self.while_revalidating = Some(window);
        self
    }

    /// With a stale-if-error window of its own.
    #[must_use]
    pub fn if_error(mut self, window: Duration) -> Self {
        self.if_error = Some(window);
        self
    }
}

/// Decides whether a response may be stored, and for how long; see
/// [`StampedeLayer::policy`](crate::http::StampedeLayer::policy).
///
/// `request` is the request as the client sent it (a `HEAD` loads with `GET`, and the
/// layer's `If-None-Match` / `If-Modified-Since` are not sent on); `response` is the inner
/// service's answer to it, before its body is read. Whatever the policy says, the layer passes
/// a response whose `Vary` it cannot key (`*`, or more than 16 fields), whose body is over
/// [`max_body_bytes`](crate::http::StampedeLayer::max_body_bytes) or ends with trailers or an error.
///
/// Closures `Fn(&request::Parts, &response::Parts) -> Decision` implement it.
pub trait Policy: Send + Sync + 'static {
    /// What to do with `response`.
    fn decide(&self, request: &request::Parts, response: &response::Parts) -> Decision;

    /// Whether `request` carries credentials: the layer keys the requests that do apart from
    /// those that do not, so that neither is ever answered with a response stored for the
    /// other (a signed-in user never gets the anonymous page, nor the other way round).
    /// Default: it has `Authorization` or `Cookie`. [`RfcPolicy`] leaves out the cookies it
    /// [ignores](RfcPolicy::ignore_cookie).
    fn credentialed(&self, request: &request::Parts) -> bool {
        Credentials::any_in(&request.headers)
    }
}

impl<F> Policy for F
where
    F: Fn(&request::Parts, &response::Parts) -> Decision + Send + Sync + 'static,
{
    fn decide(&self, request: &request::Parts, response: &response::Parts) -> Decision {
        self(request, response)
    }
}

/// The default [`Policy`]: the shared-cache rules of RFC 9111.
///
/// In order, a response is:
///
/// 1. passed if its status is `206` or `304` (answers to one request) or informational;
/// 2. passed if it has `Set-Cookie`, or `Cache-Control` with `no-store` or `private` (with
///    or without field names), or a `max-age` / `s-maxage` that is not a number;
/// 3. passed if the request had credentials (RFC 9111 §3.5), unless the response says it may
///    be shared: `public`, `s-maxage` or `must-revalidate`. Credentials are `Authorization`
///    (unless [`share_authorized`](Self::share_authorized) is on) and cookies (but those
///    [ignored](Self::ignore_cookie)); a response with `Vary: Cookie` may be stored for a
///    request with cookies too, as one variant per cookie value;
/// 4. stored for its explicit freshness, if it has one (a server error too): `s-maxage`, else `max-age`, else
///    `Expires` less `Date` (an `Expires` that is not a date, or several that disagree, is in
///    the past: RFC 9111 §5.3, §4.2.1), less the `Age` it arrived with (its first member; an
///    `Age` that is not a number is ignored: §5.1);
/// 5. without explicit freshness, stored for the [`default_ttl`](Self::default_ttl) (less its
///    `Age`) if one is set, its status is cacheable by default (200, 203, 204, 300, 301,
///    308, 404, 405, 410, 414, 501) and the request had no credentials (but an
///    `Authorization` shared by [`share_authorized`](Self::share_authorized));
/// 6. otherwise (or with a freshness of 0 or less) passed.
///
/// A freshness of 0 or less passes, but for `no-cache` (RFC 9111 §5.2.2.4; `no-cache="field"`
/// is read as plain `no-cache`, the stricter): a response with a validator (`ETag` or
/// `Last-Modified`) is stored fresh for 0 and never served stale, so that each use
/// revalidates it; one without a validator passes, as nothing could revalidate it.
///
/// A server error (a status of 5xx but `501`) that is not stored is a failed load rather than
/// a pass: [`Decision::Share`] (its waiters get it), or [`Decision::Fail`] where 2 or 3 found
/// it private to its request. A server error with `no-cache` is not stored either.
///
/// A stored response's [`Staleness`] follows its directives: `must-revalidate`,
/// `proxy-revalidate` and `s-maxage` (RFC 9111 §5.2.2.2, §5.2.2.8, §5.2.2.10) forbid serving
/// it stale; otherwise `stale-while-revalidate=N` and `stale-if-error=N` (RFC 5861) set its
/// windows, and a response without them has the cache's. `immutable` (RFC 8246) changes
/// nothing here: it tells clients not to revalidate a fresh response, and this cache never
/// revalidates a fresh response either.
///
/// The directives of 2 to 4 come from the first *targeted field* (RFC 9213) that the response
/// carries, valid and not empty: the fields given to [`targeted_field`](Self::targeted_field),
/// then `CDN-Cache-Control`. Such a field is a Structured Field Dictionary
/// (`max-age=60, must-revalidate`); when one is used, `Cache-Control` and `Expires` are
/// ignored for this cache (RFC 9213 §2.1), and a field that does not parse is ignored itself
/// (§2.2). Targeted fields are stored and forwarded downstream unchanged, as other fields are:
/// a cache further down may be targeted by them too.
#[derive(Clone, Debug)]
pub struct RfcPolicy {
    default_ttl: Option<Duration>,
    share_authorized: bool,
    cookies: CookieRule,
    /// The targeted fields this cache obeys, in order of precedence (RFC 9213 §2.1).
    targets: Vec<HeaderName>,
}

impl Default for RfcPolicy {
    fn default() -> Self {
        RfcPolicy {
            default_ttl: None,
            share_authorized: false,
            cookies: CookieRule::default(),
            targets: vec![targeted::CDN_CACHE_CONTROL.clone()],
        }
    }
}

impl RfcPolicy {
    /// The policy with no default TTL: only responses with explicit freshness are stored.
    pub fn new() -> Self {
        Self::default()
    }

    /// The freshness of a response with a status cacheable by default and no explicit
    /// freshness (RFC 9111's heuristic freshness). Default: none, so such responses are
    /// not stored.
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = Some(ttl);
        self
    }

    /// Whether responses to requests with `Authorization` are stored under the same rules as
    /// the others, without `public`, `s-maxage` or `must-revalidate`: only for services whose
    /// responses do not depend on who asks (every request with credentials then shares one
    /// entry per URL; requests without credentials never see it). Default: off.
    #[must_use]
    pub fn share_authorized(mut self, on: bool) -> Self {
        self.share_authorized = on;
        self
    }

    /// A cookie that personalises nothing (an analytics or consent cookie), named exactly as
    /// sent: a request whose cookies are all ignored is cached as one without cookies (one
    /// entry with the requests that have none), while any other cookie makes the request
    /// one with credentials (see [`RfcPolicy`], rule 3). Give one call per name. Default:
    /// none, every cookie is a credential.
    ///
    /// ```
    /// use tower_stampede::http::RfcPolicy;
    ///
    /// let policy = RfcPolicy::new().ignore_cookie("_ga").ignore_cookie("consent");
    /// ```
    #[must_use]
    pub fn ignore_cookie(mut self, name: &str) -> Self {
        self.cookies.ignore(name);
        self
    }

    /// Whether every cookie is ignored, for a service whose responses never depend on
    /// cookies: requests with cookies are then cached exactly as those without, and share
    /// their entries (a response with `Set-Cookie` is still never stored). Only for services
    /// that know this of every route: a page that greets its user by a session cookie is then
    /// served to everyone. Default: off.
    #[must_use]
    pub fn ignore_all_cookies(mut self, on: bool) -> Self {
        self.cookies.ignore_all(on);
        self
    }

    /// A targeted cache-control field of this cache's own (RFC 9213 §2), such as
    /// `Stampede-Cache-Control`: an origin that sends it, valid and not empty, tells this
    /// cache alone what to do, ahead of `CDN-Cache-Control`, `Cache-Control` and `Expires`.
    /// Fields given by several calls are looked at in the order given, all before
    /// `CDN-Cache-Control`. Default: none of the operator's own.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_stampede::http::RfcPolicy;
    ///
    /// let policy = RfcPolicy::new()
    ///     .targeted_field(HeaderName::from_static("stampede-cache-control"));
    /// ```
    #[must_use]
    pub fn targeted_field(mut self, name: HeaderName) -> Self {
        if !self.targets.contains(&name) {
            let cdn = self
                .targets
                .iter()
                .position(|target| *target == targeted::CDN_CACHE_CONTROL)
                .unwrap_or(self.targets.len());
            self.targets.insert(cdn, name);
        }
        self
    }

    /// The cache directives of a response for this cache, and whether its `Expires` counts:
    /// the first valid, non-empty targeted field's (and then `Expires` does not count, RFC
    /// 9213 §2.1), else `Cache-Control`'s.
    pub(crate) fn directives(&self, headers: &HeaderMap) -> (Vec<Directive>, bool) {
        match targeted::directives(headers, &self.targets) {
            Some(directives) => (directives, false),
            None => (parse::directives(headers).collect(), true),
        }
    }
}

impl Policy for RfcPolicy {
    fn credentialed(&self, request: &request::Parts) -> bool {
        Credentials::of(&request.headers, &self.cookies).any()
    }

    fn decide(&self, request: &request::Parts, response: &response::Parts) -> Decision {
        let (status, headers) = (response.status, &response.headers);
        // What is not stored: a pass, but for a server error, a failed load (shared with the
        // requests that waited for it, unless it is private to its own).
        let unstored = |private: bool| match (
            status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED,
            private,
        ) {
            (false, _) => Decision::Pass,
            (true, false) => Decision::Share,
            (true, true) => Decision::Fail,
        };
        if status.is_informational()
            || status == StatusCode::PARTIAL_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Decision::Pass;
        }
        if headers.contains_key(SET_COOKIE) {
            return unstored(true);
        }
        let (mut max_age, mut s_maxage) = (None, None);
        // Whether the response says it may be shared (RFC 9111 §3.5).
        let mut shared = false;
        let (mut no_cache, mut must_revalidate) = (false, false);
        let mut stale = Staleness::default();
        let (directives, expires_counts) = self.directives(headers);
        for Directive { name, argument } in directives {
            let seconds = || argument.as_deref().and_then(parse::delta_seconds);
            match name.as_str() {
                "no-store" | "private" => return unstored(true),
                "no-cache" => no_cache = true,
                "public" => shared = true,
                "must-revalidate" => {
                    shared = true;
                    must_revalidate = true;
                }
                "proxy-revalidate" => must_revalidate = true,
                "stale-while-revalidate" => {
                    stale.while_revalidating = stale.while_revalidating.or_else(seconds);
                }
                "stale-if-error" => stale.if_error = stale.if_error.or_else(seconds),
                "max-age" | "s-maxage" => {
                    let Some(seconds) = argument.as_deref().and_then(parse::delta_seconds) else {
                        // An unreadable lifetime is no permission to store.
                        return unstored(false);
                    };
                    if name == "s-maxage" {
                        shared = true;
                        must_revalidate = true;
                        s_maxage.get_or_insert(seconds);
                    } else {
                        max_age.get_or_insert(seconds);
                    }
                }
                _ => {}
            }
        }
        let credentials = Credentials::of(&request.headers, &self.cookies);
        let varies_on_cookie =
            || matches!(parse::vary(headers), parse::Vary::Names(names) if names.contains(&COOKIE));
        if credentials.any()
            && !credentials.allow(
                shared,
                self.share_authorized,
                credentials.cookies && varies_on_cookie(),
            )
        {
            return unstored(true);
        }
        if must_revalidate {
            stale = Staleness::must_revalidate();
        }
        if no_cache {
            let validated = headers.contains_key(ETAG) || headers.contains_key(LAST_MODIFIED);
            return match unstored(false) {
                Decision::Pass if validated => Decision::StoreWith {
                    fresh_for: Duration::ZERO,
                    stale: Staleness::must_revalidate(),
                },
                unstored => unstored,
            };
        }
        let explicit = s_maxage
            .or(max_age)
            .or_else(|| expires_lifetime(headers).filter(|_| expires_counts));
        let lifetime = explicit.or_else(|| {
            self.default_ttl.filter(|_| {
                cacheable_by_default(status)
                    && credentials.may_invent_freshness(self.share_authorized)
            })
        });
        match lifetime.map(|l| l.saturating_sub(age(headers))) {
            Some(ttl) if !ttl.is_zero() && stale == Staleness::default() => Decision::Store(ttl),
            Some(ttl) if !ttl.is_zero() => Decision::StoreWith {
                fresh_for: ttl,
                stale,
            },
            // A server error without freshness is the origin's answer to this load only.
            _ => unstored(false),
        }
    }
}

/// `Expires` less `Date` (or less now, without a valid `Date`); `None` without `Expires`.
/// An `Expires` that is not a valid date (`0` included) means "already expired" (RFC 9111
/// §5.3), and so do several `Expires` lines that disagree: §4.2.1 lets a cache use the first
/// or consider the response stale, and a shared cache takes the safe reading.
fn expires_lifetime(headers: &HeaderMap) -> Option<Duration> {
    let mut lines = headers.get_all(EXPIRES).iter();
    let first = lines.next()?;
    if lines.any(|other| other != first) {
        return Some(Duration::ZERO);
    }
    let expires = parse::http_date(first);
    let date = parse::date_field(headers, &DATE)
        .flatten()
        .unwrap_or_else(SystemTime::now);
    Some(expires.map_or(Duration::ZERO, |expires| {
        expires.duration_since(date).unwrap_or_default()
    }))
}

/// RFC 9110's statuses that are heuristically cacheable.
fn cacheable_by_default(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The `Age` a response arrived with: of several (field lines, or a list), the first; 0 if
/// none, or if that one is not a non-negative integer (RFC 9111 §5.1: ignored).
pub(crate) fn age(headers: &HeaderMap) -> Duration {
    headers
        .get(AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .and_then(|v| parse::delta_seconds(v.trim()))
        .unwrap_or_default()
}

/// Whether a response header is stored: not hop-by-hop (the fixed list of RFC 9110 and
/// whatever the response's `Connection` names), not `Age` (recomputed when served), not
/// `x-cache` (set by the layer).
pub(crate) fn is_stored_header(name: &HeaderName, headers: &HeaderMap) -> bool {
    const HOP_BY_HOP: [&str; 9] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let name = name.as_str();
    if HOP_BY_HOP.contains(&name) || name == X_CACHE.as_str() || name == AGE.as_str() {
        return false;
    }
    !headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|listed| listed.trim().eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Response};

    fn request(headers: &[(&'static str, &'static str)]) -> request::Parts {
        let mut request = Request::get("/").body(()).unwrap();
        for (name, value) in headers {
            request
                .headers_mut()
                .append(*name, HeaderValue::from_static(value));
        }
        request.into_parts().0
    }

    fn response(status: u16, headers: &[(&'static str, String)]) -> response::Parts {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response
                .headers_mut()
                .append(*name, HeaderValue::from_str(value).unwrap());
        }
        response.into_parts().0
    }

    fn decide(policy: &RfcPolicy, status: u16, headers: &[(&'static str, &str)]) -> Decision {
        let headers: Vec<_> = headers.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
        policy.decide(&request(&[]), &response(status, &headers))
    }

    fn secs(s: u64) -> Decision {
        Decision::Store(Duration::from_secs(s))
    }

    /// Stored for `s` seconds and never served stale.
    fn strict(s: u64) -> Decision {
        Decision::StoreWith {
            fresh_for: Duration::from_secs(s),
            stale: Staleness::must_revalidate(),
        }
    }

    #[test]
    fn ttl_comes_from_s_maxage_then_max_age_then_expires() {
        let p = RfcPolicy::new();
        let cc = "cache-control";
        assert_eq!(decide(&p, 200, &[(cc, "public, max-age=30")]), secs(30));
        assert_eq!(
            decide(&p, 200, &[(cc, "max-age=30, S-MAXAGE=\"7\"")]),
            strict(7),
            "s-maxage, which also forbids serving it stale (RFC 9111 §5.2.2.10)"
        );
        assert_eq!(
            decide(&p, 200, &[(cc, "max-age=99999999999999999999999")]),
            secs(1 << 31)
        );
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let expires = "Sun, 06 Nov 1994 08:51:37 GMT";
        assert_eq!(
            decide(&p, 200, &[("date", date), ("expires", expires)]),
            secs(120)
        );
        assert_eq!(
            decide(
                &p,
                200,
                &[("date", date), ("expires", expires), (cc, "max-age=5")]
            ),
            secs(5),
            "max-age wins over Expires"
        );
        assert_eq!(
            decide(&p, 200, &[("date", expires), ("expires", date)]),
            Decision::Pass,
            "already expired"
        );
        assert_eq!(
            decide(&p, 200, &[("expires", "0")]),
            Decision::Pass,
            "an invalid Expires is in the past"
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
        let Decision::Store(ttl) = decide(&p, 200, &[("expires", &later)]) else {
            panic!("not stored")
        };
        assert!(
            ttl > Duration::from_secs(3000),
            "{ttl:?}: Expires less now without Date"
        );
        assert_eq!(
            decide(&p, 200, &[(cc, "max-age=60"), ("age", "45")]),
            secs(15),
            "less the Age it arrived with"
        );
        assert_eq!(
            decide(&p, 200, &[(cc, "max-age=60"), ("age", "60")]),
            Decision::Pass
        );
    }

    /// RFC 9111 §5.1: of a list-based `Age`, the first member counts; an invalid one is
    /// ignored. §5.3: an invalid `Expires` (`0` included) is in the past; §4.2.1: several
    /// `Expires` that disagree make the response stale, identical ones count once.
    #[test]
    fn age_and_expires_follow_rfc_9111_5_1_and_5_3() {
        let p = RfcPolicy::new();
        let cc = ("cache-control", "max-age=60");
        assert_eq!(decide(&p, 200, &[cc, ("age", "10, 50")]), secs(50));
        assert_eq!(
            decide(&p, 200, &[cc, ("age", "10"), ("age", "50")]),
            secs(50)
        );
        for invalid in ["-5", "ten", "1.5", ""] {
            assert_eq!(
                decide(&p, 200, &[cc, ("age", invalid)]),
                secs(60),
                "{invalid:?}"
            );
        }
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let later = "Sun, 06 Nov 1994 08:51:37 GMT";
        let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
        for expires in ["0", "-1", "tomorrow"] {
            assert_eq!(
                decide(&heuristic, 200, &[("date", date), ("expires", expires)]),
                Decision::Pass,
                "Expires: {expires}: already expired, no heuristic freshness either"
            );
        }
        assert_eq!(
            decide(
                &p,
                200,
                &[("date", date), ("expires", later), ("expires", later)]
            ),
            secs(120)
        );
        assert_eq!(
            decide(
                &p,
                200,
                &[("date", date), ("expires", later), ("expires", date)]
            ),
            Decision::Pass
        );
        assert_eq!(
            decide(&p, 200, &[("date", "not a date"), ("expires", "0")]),
            Decision::Pass
        );
    }

    /// RFC 9213 §2.1: the first valid, non-empty targeted field decides, and `Cache-Control`
    /// and `Expires` are then ignored; §2.2: an invalid or empty one is ignored itself.
    #[test]
    fn targeted_fields_outrank_cache_control_rfc_9213() {
        let p = RfcPolicy::new();
        let cdn = "cdn-cache-control";
        let cc = "cache-control";
        assert_eq!(
            decide(&p, 200, &[(cdn, "max-age=30"), (cc, "max-age=5")]),
            secs(30)
        );
        assert_eq!(
            decide(&p, 200, &[(cdn, "max-age=30"), (cc, "no-store")]),
            secs(30)
        );
        assert_eq!(
            decide(&p, 200, &[(cdn, "no-store"), (cc, "max-age=60")]),
            Decision::Pass
        );
        assert_eq!(
            decide(&p, 200, &[(cdn, "private"), (cc, "max-age=60")]),
            Decision::Pass
        );
        assert_eq!(
            decide(
                &p,
                200,
                &[(cdn, "max-age=30, s-maxage=10"), (cc, "s-maxage=99")]
            ),
            strict(10)
        );
        let expires = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
        assert_eq!(
            decide(&p, 200, &[(cdn, "public"), ("expires", &expires)]),
            Decision::Pass,
            "Expires is ignored with a targeted field"
        );
        for ignored in ["max-age=\"30", "Max-Age=30", "max-age=30,", ""] {
            assert_eq!(
                decide(&p, 200, &[(cdn, ignored), (cc, "max-age=5")]),
                secs(5),
                "{ignored:?}: Cache-Control decides"
            );
        }
        assert_eq!(
            decide(&p, 200, &[(cdn, "max-age=1.5"), (cc, "max-age=5")]),
            Decision::Pass,
            "a valid field whose max-age is no delta-seconds gives no permission"
        );
        let own =
            RfcPolicy::new().targeted_field(HeaderName::from_static("stampede-cache-control"));
        let fields = [
            ("stampede-cache-control", "max-age=7"),
            (cdn, "max-age=30"),
            (cc, "max-age=5"),
        ];
        assert_eq!(decide(&own, 200, &fields), secs(7));
        assert_eq!(
            decide(&p, 200, &fields),
            secs(30),
            "not on this cache's target list"
        );
        assert_eq!(
            decide(
                &own,
                200,
                &[
                    ("stampede-cache-control", "max-age=\"x"),
                    (cdn, "max-age=30")
                ]
            ),
            secs(30),
            "an invalid field of its own is ignored"
        );
        assert_eq!(
            decide(
                &own,
                200,
                &[("stampede-cache-control", "max-age=x"), (cdn, "max-age=30")]
            ),
            Decision::Pass,
            "a valid field with a max-age that is no number gives no permission"
        );
    }

    #[test]
    fn statuses_and_the_default_ttl() {
        let strict = RfcPolicy::new();
        let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
        for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
            assert_eq!(decide(&strict, status, &[]), Decision::Pass, "{status}");
            assert_eq!(decide(&heuristic, status, &[]), secs(9), "{status}");
            assert_eq!(
                decide(&strict, status, &[("cache-control", "max-age=3")]),
                secs(3),
                "{status}"
            );
        }
        for status in [302, 307, 400, 403] {
            assert_eq!(decide(&heuristic, status, &[]), Decision::Pass, "{status}");
            assert_eq!(
                decide(&strict, status, &[("cache-control", "max-age=3")]),
                secs(3),
                "{status}: explicit freshness"
            );
        }
        for status in [100, 206, 304] {
            assert_eq!(
                decide(&heuristic, status, &[("cache-control", "max-age=3")]),
                Decision::Pass,
                "{status}"
            );
        }
        for status in [500, 502, 503, 504] {
            assert_eq!(
                decide(&heuristic, status, &[]),
                Decision::Share,
                "{status}: without explicit freshness, the origin's answer to this load only"
            );
            assert_eq!(
                decide(&heuristic, status, &[("cache-control", "max-age=0")]),
                Decision::Share,
                "{status}"
            );
            assert_eq!(
                decide(&heuristic, status, &[("cache-control", "max-age=3")]),
                secs(3),
                "{status}: with explicit freshness, stored like any response"
            );
            for private in [
                ("cache-control", "no-store"),
                ("cache-control", "private"),
                ("set-cookie", "a=b"),
            ] {
                assert_eq!(
                    decide(&heuristic, status, &[private]),
                    Decision::Fail,
                    "{status} {private:?}: private to its request, a stale response may stand in"
                );
            }
        }
    }

    #[test]
    fn what_is_never_stored() {
        let p = RfcPolicy::new().default_ttl(Duration::from_secs(60));
        for pairs in [
            &[("cache-control", "no-store")][..],
            &[
                ("cache-control", "max-age=60"),
                ("cache-control", "Private"),
            ],
            &[("cache-control", "private=\"x-user\", max-age=60")],
            &[("cache-control", "no-cache")],
            &[("cache-control", "no-cache=\"set-cookie\", max-age=60")],
            &[("cache-control", "max-age=0")],
            &[("cache-control", "max-age=-1")],
            &[("cache-control", "max-age=abc")],
            &[("cache-control", "max-age")],
            &[
                ("set-cookie", "a=b"),
                ("cache-control", "public, max-age=60"),
            ],
        ] {
            assert_eq!(decide(&p, 200, pairs), Decision::Pass, "{pairs:?}");
        }
    }

    #[test]
    fn stale_rules_follow_the_response_directives() {
        let p = RfcPolicy::new();
        let cc = "cache-control";
        // RFC 5861 §3, §4: the response's own windows; the first of each counts.
        assert_eq!(
            decide(
                &p,
                200,
                &[(
                    cc,
                    "max-age=60, stale-while-revalidate=30, stale-if-error=600, stale-if-error=1"
                )]
            ),
            Decision::StoreWith {
                fresh_for: Duration::from_secs(60),
                stale: Staleness::default()
                    .while_revalidating(Duration::from_secs(30))
                    .if_error(Duration::from_secs(600)),
            }
        );
        assert_eq!(
            decide(&p, 200, &[(cc, "max-age=60, stale-if-error=oops")]),
            secs(60),
            "an unreadable window is no window"
        );
        // RFC 9111 §5.2.2.2, §5.2.2.8, §5.2.2.10: never stale, whatever RFC 5861 says.
        for prohibits in [
            "max-age=60, must-revalidate, stale-while-revalidate=30",
            "max-age=60, proxy-revalidate, stale-if-error=30",
            "s-maxage=60, stale-while-revalidate=30",
        ] {
            assert_eq!(
                decide(&p, 200, &[(cc, prohibits)]),
                strict(60),
                "{prohibits}"
            );
        }
        // RFC 9111 §5.2.2.4: `no-cache` with a validator is stored, fresh for 0 and never
        // served stale (a field-qualified one too, read as unqualified); without one it passes.
        for validator in [
            ("etag", "\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ] {
            for directive in ["no-cache, max-age=60", "no-cache=\"x-user\""] {
                assert_eq!(
                    decide(&p, 200, &[(cc, directive), validator]),
                    strict(0),
                    "{directive} {validator:?}"
                );
            }
        }
        // RFC 8246: `immutable` changes nothing for this cache.
        assert_eq!(decide(&p, 200, &[(cc, "max-age=60, immutable")]), secs(60));
    }

    #[test]
    fn authorized_requests_need_the_response_to_allow_it() {
        let authorized = request(&[("authorization", "Bearer a")]);
        let ok = |cc: &str| response(200, &[("cache-control", cc.to_owned())]);
        let p = RfcPolicy::new();
        assert_eq!(p.decide(&authorized, &ok("max-age=60")), Decision::Pass);
        assert_eq!(p.decide(&authorized, &ok("public, max-age=60")), secs(60));
        for allowed in ["s-maxage=60", "must-revalidate, max-age=60"] {
            assert_eq!(p.decide(&authorized, &ok(allowed)), strict(60), "{allowed}");
        }
        assert_eq!(
            p.decide(&authorized, &ok("public, private, max-age=60")),
            Decision::Pass
        );
        let shared = RfcPolicy::new().share_authorized(true);
        assert_eq!(shared.decide(&authorized, &ok("max-age=60")), secs(60));
        // No invented freshness for a request with credentials, even where it may be shared.
        let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
        assert_eq!(heuristic.decide(&authorized, &ok("public")), Decision::Pass);
        assert_eq!(
            heuristic
                .share_authorized(true)
                .decide(&authorized, &ok("public")),
            secs(9)
        );
    }

    /// RFC 9111 §3.5 applied to cookies: as for `Authorization`, but for cookies the policy
    /// ignores, and for a response that varies on `Cookie` (stored per cookie value).
    #[test]
    fn cookies_are_credentials_but_those_ignored() {
        let ok = |pairs: &[(&'static str, &str)]| {
            let pairs: Vec<_> = pairs.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
            response(200, &pairs)
        };
        let p = RfcPolicy::new()
            .default_ttl(Duration::from_secs(9))
            .ignore_cookie("_ga");
        let session = request(&[("cookie", "_ga=1; session=a")]);
        let analytics = request(&[("cookie", "_ga=1")]);
        assert!(p.credentialed(&session) && !p.credentialed(&analytics));
        assert!(RfcPolicy::new().credentialed(&analytics));
        assert!(RfcPolicy::new()
            .ignore_all_cookies(true)
            .credentialed(&request(&[
                ("cookie", "s=1"),
                ("authorization", "Bearer a")
            ])));
        assert_eq!(p.decide(&session, &ok(&[])), Decision::Pass);
        assert_eq!(p.decide(&analytics, &ok(&[])), secs(9));
        let cc = "cache-control";
        assert_eq!(
            p.decide(&session, &ok(&[(cc, "max-age=60")])),
            Decision::Pass
        );
        assert_eq!(
            p.decide(&session, &ok(&[(cc, "public, max-age=60")])),
            secs(60)
        );
        assert_eq!(p.decide(&session, &ok(&[(cc, "public")])), Decision::Pass);
        assert_eq!(
            p.decide(
                &session,
                &ok(&[(cc, "max-age=60"), ("vary", "Accept, Cookie")])
            ),
            secs(60)
        );
        assert_eq!(
            p.decide(&session, &ok(&[("vary", "cookie")])),
            Decision::Pass
        );
        assert_eq!(
            p.share_authorized(true)
                .decide(&session, &ok(&[(cc, "max-age=60")])),
            Decision::Pass
        );
        let everything = RfcPolicy::new()
            .default_ttl(Duration::from_secs(9))
            .ignore_all_cookies(true);
        assert_eq!(everything.decide(&session, &ok(&[])), secs(9));
        assert_eq!(
            everything.decide(&session, &ok(&[("set-cookie", "a=b")])),
            Decision::Pass
        );
    }

    #[test]
    fn request_rules() {
        let with = |method: Method, headers: &[(&'static str, &'static str)]| {
            let mut request = Request::builder().method(method).uri("/").body(()).unwrap();
            for (name, value) in headers {
                request
                    .headers_mut()
                    .append(*name, HeaderValue::from_static(value));
            }
            request
        };
        for method in ["POST", "PUT", "DELETE", "PATCH", "PURGE", "FROB"] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(
                request_rule(&with(method.clone(), &[]), false, &Unkeyed::default()),
                RequestRule::Invalidate,
                "{method}"
            );
        }
        for method in [Method::POST, Method::GET, Method::HEAD] {
            let overridden = with(method, &[("x-http-method-override", "PUT")]);
            assert_eq!(
                request_rule(&overridden, false, &Unkeyed::default()),
                RequestRule::Invalidate
            );
        }
        for method in [Method::OPTIONS, Method::TRACE, Method::CONNECT] {
            assert_eq!(
                request_rule(&with(method.clone(), &[]), false, &Unkeyed::default()),
                RequestRule::Ignore,
                "{method}"
            );
        }
        assert_eq!(
            request_rule(&with(Method::GET, &[]), false, &Unkeyed::default()),
            RequestRule::Cache
        );
        assert_eq!(
            request_rule(&with(Method::HEAD, &[]), false, &Unkeyed::default()),
            RequestRule::Cache
        );
        for (name, value) in [
            ("range", "bytes=0-10"),
            ("if-match", "\"v1\""),
            ("if-unmodified-since", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ("if-range", "\"v1\""),
            ("cache-control", "no-store"),
            ("x-http-method-override", "GET"),
            ("content-length", "5"),
            ("x-forwarded-host", "evil.example"),
        ] {
            let request = with(Method::GET, &[(name, value)]);
            assert_eq!(
                request_rule(&request, false, &Unkeyed::default()),
                RequestRule::Bypass,
                "{name}"
            );
        }
        for (name, value) in [
            ("if-none-match", "\"v1\""),
            ("if-modified-since", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ("authorization", "Bearer a"),
        ] {
            let request = with(Method::GET, &[(name, value)]);
            assert_eq!(
                request_rule(&request, false, &Unkeyed::default()),
                RequestRule::Cache,
                "{name}"
            );
        }
        for reload in [
            &[("cache-control", "no-cache")][..],
            &[("cache-control", "max-age=0")],
            &[("pragma", "no-cache")],
        ] {
            let request = with(Method::GET, reload);
            assert_eq!(
                request_rule(&request, false, &Unkeyed::default()),
                RequestRule::Cache,
                "{reload:?}"
            );
            assert_eq!(
                request_rule(&request, true, &Unkeyed::default()),
                RequestRule::Bypass,
                "{reload:?}"
            );
        }
        let request = with(
            Method::GET,
            &[("pragma", "no-cache"), ("cache-control", "max-age=5")],
        );
        assert_eq!(
            request_rule(&request, true, &Unkeyed::default()),
            RequestRule::Cache
        );
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// Whatever bytes the response's deciding fields hold, the policy decides, and never
        /// for longer than the longest lifetime a header can give.
        #[test]
        fn any_response_headers_get_a_decision(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "cache-control", "expires", "date", "age", "vary", "set-cookie",
                    ]),
                    proptest::prop_oneof![
                        // Any bytes a value may hold.
                        proptest::collection::vec(
                            proptest::prop_oneof![0x20u8..0x7f, 0x80u8..=0xff],
                            0..60,
                        ),
                        // Or something close to what these fields hold.
                        proptest::string::string_regex(
                            "(public|private|no-cache|no-store|s-maxage=[0-9]{0,12}|max-age=\"?[0-9]{0,25}\"?|[0-9]{1,12}|Sun, 06 Nov 1994 08:49:37 GMT|accept|\\*|[ ,=\"])*"
                        )
                        .expect("a valid regex")
                        .prop_map(String::into_bytes),
                    ],
                ),
                0..8,
            ),
            status in 100u16..600,
            authorized in proptest::bool::ANY,
        ) {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            for (name, bytes) in fields {
                if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                    response.headers_mut().append(name, value);
                }
            }
            let (response, ()) = response.into_parts();
            let request = if authorized {
                request(&[("authorization", "Bearer a")])
            } else {
                request(&[])
            };
            let policy = RfcPolicy::new().default_ttl(Duration::from_secs(60));
            if let Decision::Store(ttl) = policy.decide(&request, &response) {
                proptest::prop_assert!(!ttl.is_zero() && ttl <= Duration::from_secs(1 << 31));
            }
            let _ = age(&response.headers);
        }
    }

    #[test]
    fn hop_by_hop_headers_and_age_are_not_stored() {
        let mut map = HeaderMap::new();
        map.append("connection", HeaderValue::from_static("close, X-Secret"));
        map.append("x-secret", HeaderValue::from_static("1"));
        for name in [
            "transfer-encoding",
            "x-secret",
            "x-cache",
            "age",
            "keep-alive",
        ] {
            assert!(
                !is_stored_header(&HeaderName::from_static(name), &map),
                "{name}"
            );
        }
        assert!(is_stored_header(
            &HeaderName::from_static("content-type"),
            &map
        ));
    }
}
