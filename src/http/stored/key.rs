//! Cache keys: the [`MakeKey`] a user may replace, and the keys the layer derives from it.
//!
//! # Keys, in two steps when a response has `Vary`
//!
//! [`MakeKey`] names the request's URL (the **primary key**; [`DefaultKey`] unless replaced).
//! A response without `Vary` is stored under it. A response with `Vary` is stored under a
//! **variant key** instead: the primary key, then each field `Vary` names (lowercase) with the
//! request's values of it (every field line trimmed, joined by `,`; an absent field differs
//! from an empty one). The primary key then holds a small **vary marker**, the list of
//! names, so the next request can compute its own variant key. A hit costs two lookups (each
//! an L1 hit or one store round trip); a miss loads once and fills both. Marker and variants
//! are refreshed like any entry, each by one load: a refresh of the marker re-learns `Vary`
//! from the origin, and a variant is stored only under a key that names every field its
//! response varies on.
//!
//! # Invalidating a URL
//!
//! Variant keys cannot be listed, so a URL is invalidated (RFC 9111 §4.4, or a purge) by
//! removing what is under its primary key only: every vary marker holds a **generation**,
//! drawn at random whenever a marker is stored (by a load, or stored again for what it had
//! left), and every variant key under it names that generation. Once the marker is gone, no
//! request can compute the old variant keys again: their entries are never read, and expire
//! on their own. The engine's fence covers the marker: a load of the URL that started before
//! the invalidation cannot store its marker after it, so a variant it filled stays
//! unreachable too. The price: when a marker is loaded again (it expired), the URL's other
//! variants are loaded again as well, each once, even if they were still fresh.
//!
//! # Forwarding headers
//!
//! A request with a forwarding or rewrite header (`X-Forwarded-Proto`, `X-Forwarded-Host`,
//! `Forwarded`, ...: see [`poisoning`](crate::http::rules::poisoning)) that the operator
//! does not trust is keyed by its values, as if every response to it named these headers in
//! `Vary`: it gets a **forwarded primary key** apart from the URL's, which always holds a
//! vary marker naming every keyed forwarding header (and what the response's own `Vary`
//! names), so that each set of values is a variant of its own. A load balancer that sets the
//! same values on every request makes one variant, cached and coalesced as any entry; an
//! attacker's value makes one that only requests with that very value read. `Forwarded` is
//! keyed without its `for=` and `by=` parameters (in any element), which name the client and
//! the proxy rather than the page; `X-Forwarded-For` and `X-Real-IP` are not keyed at all.
//! Invalidating the URL removes its forwarded primary keys too, so their markers go, and
//! every forwarding variant with them.
//!
//! The variants of one URL are bounded: each process stores at most
//! [16](forwarded::MAX_FORWARDED_VARIANTS) sets of forwarding values per URL, those most
//! requests carry (see [`ForwardedVariants`]); a request whose set has no place is still
//! looked up and coalesced, and its load stores nothing (`too-many-variants`).
//!
//! What makes a request's variant (the fields its response varies on and its keyed
//! forwarding headers) is one value, [`VariantId`]: the variant key is made of it, and so is
//! what an answer handed to waiters or relayed carries and what a waiter is checked against.
//!
//! Requests with credentials (`Authorization`, or a cookie the [`Policy`](crate::http::Policy) does
//! not ignore: [`Policy::credentialed`](crate::http::Policy::credentialed)) are keyed apart from
//! requests without, whatever the [`MakeKey`]: an anonymous request never gets a response
//! stored for a request with credentials, nor the other way round. All requests with
//! credentials share one key per URL: a response to one is stored only when it says it may be
//! shared, or varies on what tells them apart (`Vary: Cookie`).
//!
//! Every key is hashed before it reaches the store, so neither a 64 KB URL nor a thousand
//! header values make a long store key, and no request byte reaches Redis raw.
//!
//! | file | holds |
//! | --- | --- |
//! | `key.rs` | [`MakeKey`] and its keys (default, site, origin), the primary keys made of them |
//! | `key/variant.rs` | a request's variant: its key's one spelling, hashed for a hit, and [`VariantId`] |
//! | `key/forwarded_field.rs` | `Forwarded` without `for=` and `by=`, as a variant reads it |
//! | `key/forwarded.rs` | [`ForwardedVariants`]: the sets of forwarding values a URL is stored for |

use std::borrow::Cow;
use std::sync::Arc;

use http::header::HOST;
use http::request::Parts;
use http::uri::{Authority, Scheme};

/// Makes the cache key of a request; see [`StampedeLayer::make_key`](crate::http::StampedeLayer::make_key).
///
/// Two requests share a cached response only if their keys are equal (and, for a response
/// with `Vary`, the request fields it names match). Returning `None` sends the request to the
/// inner service without the cache (`x-cache: BYPASS`).
///
/// `HEAD` requests are answered from the `GET` entry, so the key is made for them with
/// [`Parts::method`] set to `GET`. Requests with credentials get a key apart from the one
/// returned here (see the [HTTP guide](crate::guide::http#what-is-cached-and-why)).
///
/// Closures `Fn(&http::request::Parts) -> Option<String>` implement it. To add a request
/// header to the key (a tenant, a locale), extend the [`DefaultKey`]; see
/// [`StampedeLayer::make_key`](crate::http::StampedeLayer::make_key) for an example.
pub trait MakeKey: Send + Sync + 'static {
    /// The key of `request`, or `None` to bypass the cache.
    fn make_key(&self, request: &Parts) -> Option<String>;
}

impl<F> MakeKey for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn make_key(&self, request: &Parts) -> Option<String> {
        self(request)
    }
}

/// The default key: method, scheme, authority (or `Host`) and path with query.
///
/// Parts are separated by NUL, which no URI or header value can hold, so two requests share
/// a key only if all their parts match. A request in origin-form (`GET /path`, as servers
/// receive them) is keyed with the `http` scheme and its `Host` header. The authority is
/// keyed as RFC 3986 §6.2.2.1 and §6.2.3 normalise it: its host in lowercase, without the
/// port that is the scheme's default (`Shop.Example:80` is `shop.example`).
///
/// # One site under several names
///
/// Instances that each see their own `Host` (a load balancer that forwards each request with
/// the instance's address, or a site served under several names) key one page apart, so they
/// share nothing: a stampede costs a load per name, and a `POST` through one name leaves the
/// page stored under the others. [`authority`](Self::authority) keys every request under one
/// authority whatever its `Host`; [`aliases`](Self::aliases) keys the requests for a list of
/// names under one of them, and any other `Host` as it is. Both make a [`SiteKey`]:
///
/// ```
/// use http::uri::Authority;
/// use http::Request;
/// use tower_stampede::http::DefaultKey;
///
/// let shop = Authority::from_static("shop.example");
/// let fixed = DefaultKey.authority(shop.clone());
/// let aliased = DefaultKey.aliases(shop, [Authority::from_static("10.0.0.1:8080")]);
/// let request = |host| Request::get("/p/2").header("host", host).body(()).unwrap().into_parts().0;
/// let (instance, site, other) = (request("10.0.0.1:8080"), request("shop.example"), request("b.example"));
/// assert_eq!(fixed.key(&instance), DefaultKey.key(&site));
/// assert_eq!(aliased.key(&instance), DefaultKey.key(&site));
/// assert_eq!(fixed.key(&other), DefaultKey.key(&site));
/// assert_eq!(aliased.key(&other), DefaultKey.key(&other), "not an alias: keyed as it is");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultKey;

impl DefaultKey {
    /// The key of a request; never `None`.
    pub fn key(&self, request: &Parts) -> String {
        let scheme = request.uri.scheme_str().unwrap_or("http");
        key_of(request, scheme, own_authority(request))
    }

    /// This key for a site whose every request is keyed under `authority`, whatever its
    /// URI's authority or `Host`: for instances of one site that each see their own `Host`.
    /// Requests for other sites must not reach a layer keyed so: they would share the site's
    /// pages.
    pub fn authority(self, authority: Authority) -> SiteKey {
        SiteKey {
            canonical: authority,
            aliases: None,
        }
    }

    /// This key for a site whose requests for `canonical` or any of `aliases` (their URI's
    /// authority, or `Host`, written as the field carries it: with its port if it has one;
    /// ASCII case and the scheme's default port aside) are keyed under `canonical`, so that
    /// they share one cache; any other request is keyed with its own authority.
    pub fn aliases(
        self,
        canonical: Authority,
        aliases: impl IntoIterator<Item = Authority>,
    ) -> SiteKey {
        SiteKey {
            canonical,
            aliases: Some(aliases.into_iter().collect()),
        }
    }
}

/// The [`DefaultKey`] of a site known under several authorities, keyed under one of them;
/// from [`DefaultKey::authority`] or [`DefaultKey::aliases`].
#[derive(Clone, Debug)]
pub struct SiteKey {
    canonical: Authority,
    /// The site's names; `None`: every request is the site's.
    aliases: Option<Arc<[Authority]>>,
}

impl SiteKey {
    /// The key of a request; never `None`.
    pub fn key(&self, request: &Parts) -> String {
        let scheme = request.uri.scheme_str().unwrap_or("http");
        let own = own_authority(request);
        let authority = if self.names(scheme, own) {
            self.canonical.as_str().as_bytes()
        } else {
            own
        };
        key_of(request, scheme, authority)
    }

    /// Whether a request of `scheme` with this authority (or `Host`) is one of the site's.
    fn names(&self, scheme: &str, authority: &[u8]) -> bool {
        let Some(aliases) = &self.aliases else {
            return true;
        };
        let authority = normalized(scheme, authority.trim_ascii());
        std::iter::once(&self.canonical)
            .chain(aliases.iter())
            .any(|name| normalized(scheme, name.as_str().as_bytes()) == authority)
    }
}

impl MakeKey for SiteKey {
    fn make_key(&self, request: &Parts) -> Option<String> {
        Some(self.key(request))
    }
}

/// The authority a request names: its URI's, or its `Host` (empty without either).
fn own_authority(request: &Parts) -> &[u8] {
    match request.uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => request
            .headers
            .get(HOST)
            .map(|h| h.as_bytes())
            .unwrap_or_default(),
    }
}

/// The key of a reverse proxy with one origin: the [`DefaultKey`] of the request as it is sent
/// to the origin (the origin's scheme and authority, the request's method, path and query),
/// whatever `Host` or absolute URI the client used.
///
/// It saves such a proxy from rewriting every request's URI before the layer sees it (a
/// parse and an allocation per request, hits included): the rewrite can wait for the requests
/// that do reach the origin, and the keys stay those of the origin's URLs.
///
/// ```
/// use http::uri::{Authority, Scheme};
/// use http::Request;
/// use tower_stampede::http::{DefaultKey, OriginKey};
///
/// let key = OriginKey::new(Scheme::HTTP, Authority::from_static("origin:8080"));
/// let from_client = Request::get("/page?q=1").header("host", "proxy.example");
/// let (from_client, _) = from_client.body(()).unwrap().into_parts();
/// let (to_origin, _) = Request::get("http://origin:8080/page?q=1").body(()).unwrap().into_parts();
/// assert_eq!(key.key(&from_client), DefaultKey.key(&to_origin));
/// ```
#[derive(Clone, Debug)]
pub struct OriginKey {
    /// The origin's scheme and authority as every key of it holds them, made once.
    origin: String,
}

impl OriginKey {
    /// The key of requests sent on to the origin at `scheme://authority`.
    pub fn new(scheme: Scheme, authority: Authority) -> Self {
        let origin = origin_of(scheme.as_str(), authority.as_str().as_bytes());
        OriginKey { origin }
    }

    /// The key of a request; never `None`.
    pub fn key(&self, request: &Parts) -> String {
        key_with(request, &self.origin)
    }
}

impl MakeKey for OriginKey {
    fn make_key(&self, request: &Parts) -> Option<String> {
        Some(self.key(request))
    }
}

/// The [`DefaultKey`] format: method, scheme, authority and path with query, NUL-separated.
fn key_of(request: &Parts, scheme: &str, authority: &[u8]) -> String {
    key_with(request, &origin_of(scheme, authority))
}

/// The key of `request` to the origin whose part of the key is `origin` (see [`origin_of`]).
fn key_with(request: &Parts, origin: &str) -> String {
    let path = request
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let method = request.method.as_str();
    let mut key = String::with_capacity(6 + method.len() + origin.len() + path.len());
    key.push_str("http\0");
    key.push_str(method);
    key.push('\0');
    key.push_str(origin);
    key.push_str(path);
    key
}

/// The scheme and authority of an origin as a key holds them: each followed by a NUL, the
/// authority [normalized].
fn origin_of(scheme: &str, authority: &[u8]) -> String {
    let authority = normalized(scheme, authority);
    let mut origin = String::with_capacity(scheme.len() + authority.len() + 2);
    origin.push_str(scheme);
    origin.push('\0');
    // A Host header may hold obs-text bytes; the key is hashed, so a lossless escape is
    // enough. Most authorities have nothing to escape: copied whole.
    match std::str::from_utf8(&authority) {
        Ok(plain) if authority.iter().all(|&b| needs_no_escape(b)) => origin.push_str(plain),
        _ => origin.extend(authority.escape_ascii().map(char::from)),
    }
    origin.push('\0');
    origin
}

/// `authority` as a key holds it for `scheme` (RFC 3986 §6.2.2.1, §6.2.3): in lowercase, and
/// without a port that is empty or the scheme's default (443 for `https`, 80 otherwise: a
/// request in origin-form is keyed as `http`). Borrowed when already so, as most are.
fn normalized<'a>(scheme: &str, authority: &'a [u8]) -> Cow<'a, [u8]> {
    let default = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    // A port is the digits after the last `:`, unless that `:` is inside an IPv6 literal.
    let without_port = match authority.iter().rposition(|&b| b == b':') {
        Some(colon) if authority[colon + 1..].iter().all(u8::is_ascii_digit) => {
            let port = std::str::from_utf8(&authority[colon + 1..])
                .ok()
                .and_then(|port| port.parse::<u16>().ok());
            match port {
                Some(port) if port != default => authority,
                // Empty, or the default.
                None if colon + 1 < authority.len() => authority,
                _ => &authority[..colon],
            }
        }
        _ => authority,
    };
    if without_port.iter().any(u8::is_ascii_uppercase) {
        Cow::Owned(without_port.to_ascii_lowercase())
    } else {
        Cow::Borrowed(without_port)
    }
}

/// Whether `escape_ascii` leaves a byte as it is.
fn needs_no_escape(byte: u8) -> bool {
    matches!(byte, b' '..=b'~') && !matches!(byte, b'\\' | b'\'' | b'"')
}

impl MakeKey for DefaultKey {
    fn make_key(&self, request: &Parts) -> Option<String> {
        Some(self.key(request))
    }
}

/// The primary key the layer uses for a request whose [`MakeKey`] said `key`: the same, or a
/// key apart for requests with credentials, or with forwarding headers that are keyed, or
/// both.
pub(crate) fn primary(key: String, credentialed: bool, forwarded: bool) -> String {
    let key = if forwarded { forwarded_key(&key) } else { key };
    if credentialed {
        authorized(&key)
    } else {
        key
    }
}

/// The primary keys of a URL whose [`MakeKey`] said `key`: without and with credentials,
/// and (if any forwarding header is keyed) their forwarded ones.
pub(crate) fn primaries(key: &str, forwarding_keyed: bool) -> Vec<String> {
    let mut keys = vec![authorized(key), key.to_owned()];
    if forwarding_keyed {
        let forwarded = forwarded_key(key);
        keys.push(authorized(&forwarded));
        keys.push(forwarded);
    }
    keys
}

/// The forwarded primary key of requests with keyed forwarding headers whose [`MakeKey`]
/// said `key`.
fn forwarded_key(key: &str) -> String {
    length_prefixed(FORWARDED_PREFIX, key)
}

/// How a forwarded primary key starts (after `authorized\0N\0`, for one with credentials).
const FORWARDED_PREFIX: &str = "forwarded\0";

/// Whether `primary` is a forwarded primary key.
fn is_forwarded(primary: &str) -> bool {
    let unauthorized = primary
        .strip_prefix("authorized\0")
        .and_then(|rest| rest.split_once('\0'))
        .map_or(primary, |(_, key)| key);
    unauthorized.starts_with(FORWARDED_PREFIX)
}

/// The primary key of requests with credentials (`Authorization`, cookies) whose [`MakeKey`]
/// said `key`.
pub(crate) fn authorized(key: &str) -> String {
    length_prefixed("authorized\0", key)
}

/// `prefix`, the length of `key`, NUL and `key`: no key of another shape can equal it.
fn length_prefixed(prefix: &str, key: &str) -> String {
    let mut prefixed = String::with_capacity(prefix.len() + 21 + key.len());
    prefixed.push_str(prefix);
    put_number(&mut prefixed, key.len() as u64, 10, 1);
    prefixed.push('\0');
    prefixed.push_str(key);
    prefixed
}

mod forwarded;
mod forwarded_field;

pub(crate) use forwarded::ForwardedVariants;

mod variant;

use variant::put_number;
pub(crate) use variant::{variant, variant_digest, VariantId};

#[cfg(test)]
mod tests;
