//! The replaceable response [`Policy`] and its default, [`RfcPolicy`]: whether a response
//! may be stored, and for how long.

use std::time::Duration;

use http::header::{COOKIE, DATE, ETAG, EXPIRES, LAST_MODIFIED, SET_COOKIE};
use http::{request, response, HeaderMap, HeaderName, StatusCode};

use super::credentials::{CookieRule, Credentials};
use super::decision::{Decision, Staleness};
use super::field_name::field_name;
use super::methods::cacheable_by_default;
use super::parse::{self, Directive};
use super::pass::Pass;
use super::targeted;
use super::unstored::goes_to_waiters;

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

    /// Whether a response this policy does not store ([`Decision::Pass`]) may still go to the
    /// requests that arrived while it was loaded (a request collapsed onto another's load):
    /// it is handed to them, in every process, and not stored, so a request after the load
    /// loads again; a waiter whose request differs in a field the response's `Vary` names
    /// goes to the inner service instead. Default: no, every waiter of a pass goes to the
    /// inner service. [`RfcPolicy`] says yes of a response it could have stored with
    /// freshness of its own (RFC 9111 §4, request collapsing): to a request without
    /// credentials, with a status cacheable by default, without `no-store`, `private`,
    /// `no-cache`, `Set-Cookie`, `Vary: *`, nor an explicit freshness (which, not stored, was
    /// 0).
    fn shares_with_waiters(&self, request: &request::Parts, response: &response::Parts) -> bool {
        let _ = (request, response);
        false
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
///    (unless [`share_authorized`](Self::share_authorized) is on) and cookies (but the
///    [analytics cookies](Self::ignore_analytics_cookies) and those
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
    /// none but the [analytics cookies](Self::ignore_analytics_cookies): every other cookie
    /// is a credential.
    ///
    /// ```
    /// use tower_stampede::http::RfcPolicy;
    ///
    /// let policy = RfcPolicy::new().ignore_cookie("_ga").ignore_cookie("consent");
    /// ```
    #[must_use]
    pub fn ignore_cookie(mut self, name: impl AsRef<str>) -> Self {
        self.cookies.ignore(name.as_ref());
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

    /// Whether the cookies that well-known analytics and advertising scripts set are
    /// ignored, as those given to [`ignore_cookie`](Self::ignore_cookie) are: Google
    /// Analytics (`_ga`, `_ga_<id>`, `_gid`, `_gat`, `_gat_<id>`, `_gac_<id>`, `__utma`,
    /// `__utmb`, `__utmc`, `__utmt`, `__utmv`, `__utmz`), Google Ads (`_gcl_<x>`), Meta
    /// (`_fbp`, `_fbc`), Hotjar (`_hj<x>`), Microsoft Clarity (`_clck`, `_clsk`) and Ads
    /// (`_uetsid`, `_uetvid`), Segment (`ajs_anonymous_id`, `ajs_user_id`, `ajs_group_id`)
    /// and Mixpanel (`mp_<token>_mixpanel`), named exactly so (cookie names are
    /// case-sensitive). They are read by scripts in the browser, and a page does not depend
    /// on them; any other cookie still makes the request one with credentials. Default: on;
    /// off for an application that does read one of them to build its pages.
    ///
    /// ```
    /// use tower_stampede::http::RfcPolicy;
    ///
    /// let policy = RfcPolicy::new().ignore_analytics_cookies(false);
    /// ```
    #[must_use]
    pub fn ignore_analytics_cookies(mut self, on: bool) -> Self {
        self.cookies.ignore_analytics(on);
        self
    }

    /// A targeted cache-control field of this cache's own (RFC 9213 §2), such as
    /// `Stampede-Cache-Control`: an origin that sends it, valid and not empty, tells this
    /// cache alone what to do, ahead of `CDN-Cache-Control`, `Cache-Control` and `Expires`.
    /// Fields given by several calls are looked at in the order given, all before
    /// `CDN-Cache-Control`. Default: none of the operator's own.
    ///
    /// ```
    /// use tower_stampede::http::RfcPolicy;
    ///
    /// let policy = RfcPolicy::new().targeted_field("Stampede-Cache-Control");
    /// ```
    #[must_use]
    pub fn targeted_field(mut self, name: impl AsRef<str>) -> Self {
        let Some(name) = field_name("targeted_field", name.as_ref()) else {
            return self;
        };
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

    fn shares_with_waiters(&self, request: &request::Parts, response: &response::Parts) -> bool {
        let credentialed = self.credentialed(request);
        goes_to_waiters(credentialed, self.directives(&response.headers), response)
    }

    fn decide(&self, request: &request::Parts, response: &response::Parts) -> Decision {
        self.judge(request, response).0
    }
}

impl RfcPolicy {
    /// What [`decide`](Policy::decide) decides, and, for a response it does not store, the
    /// rule that says so.
    pub(crate) fn judge(
        &self,
        request: &request::Parts,
        response: &response::Parts,
    ) -> (Decision, Option<Pass>) {
        let (status, headers) = (response.status, &response.headers);
        // What is not stored: a pass, but for a server error, a failed load (shared with the
        // requests that waited for it, unless it is private to its own).
        let unstored = |private: bool, why: Pass| {
            let decision = match (
                status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED,
                private,
            ) {
                (false, _) => Decision::Pass,
                (true, false) => Decision::Share,
                (true, true) => Decision::Fail,
            };
            (decision, Some(why))
        };
        if status.is_informational()
            || status == StatusCode::PARTIAL_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return (Decision::Pass, Some(Pass::Status));
        }
        if headers.contains_key(SET_COOKIE) {
            return unstored(true, Pass::SetCookie);
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
                "no-store" => return unstored(true, Pass::NoStore),
                "private" => return unstored(true, Pass::Private),
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
                        return unstored(false, Pass::NoFreshness);
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
            return unstored(true, Pass::Credentials);
        }
        if must_revalidate {
            stale = Staleness::must_revalidate();
        }
        if no_cache {
            let validated = headers.contains_key(ETAG) || headers.contains_key(LAST_MODIFIED);
            return match unstored(false, Pass::NoCache) {
                (Decision::Pass, _) if validated => (
                    Decision::StoreWith {
                        fresh_for: Duration::ZERO,
                        stale: Staleness::must_revalidate(),
                    },
                    Some(Pass::NoCache),
                ),
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
        match lifetime.map(|l| l.saturating_sub(parse::age(headers))) {
            Some(ttl) if !ttl.is_zero() && stale == Staleness::default() => {
                (Decision::Store(ttl), None)
            }
            Some(ttl) if !ttl.is_zero() => (
                Decision::StoreWith {
                    fresh_for: ttl,
                    stale,
                },
                None,
            ),
            // A server error without freshness is the origin's answer to this load only.
            _ => unstored(false, Pass::NoFreshness),
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
        .unwrap_or_else(crate::clock::now);
    Some(expires.map_or(Duration::ZERO, |expires| {
        expires.duration_since(date).unwrap_or_default()
    }))
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
