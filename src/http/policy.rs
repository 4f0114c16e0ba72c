//! The one place that decides what is cached: cache keys, request rules, response rules, TTLs.

use std::time::Duration;

use http::header::{
    AUTHORIZATION, CACHE_CONTROL, HOST, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    IF_UNMODIFIED_SINCE, RANGE, SET_COOKIE, VARY,
};
use http::{HeaderMap, HeaderName, Method, Request, StatusCode};

/// What the layer does with a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RequestRule {
    /// Look it up under this key.
    Cache(String),
    /// A method the cache has nothing to do with: pass it on untouched.
    Ignore,
    /// A cacheable method that must not be shared (credentials, `no-store`): pass it on,
    /// marked `x-cache: BYPASS`.
    Bypass,
}

/// Decides what to do with a request.
pub(crate) fn request_rule<B>(request: &Request<B>) -> RequestRule {
    if request.method() != Method::GET {
        return RequestRule::Ignore;
    }
    let headers = request.headers();
    // Credentials are never shared. Conditional and range requests get answers for this
    // request only (304, 206): they must not become the entry, nor a "pass" for everyone.
    const PRIVATE_TO_THIS_REQUEST: [HeaderName; 7] = [
        AUTHORIZATION,
        RANGE,
        IF_NONE_MATCH,
        IF_MODIFIED_SINCE,
        IF_MATCH,
        IF_UNMODIFIED_SINCE,
        IF_RANGE,
    ];
    if PRIVATE_TO_THIS_REQUEST
        .iter()
        .any(|h| headers.contains_key(h))
        || directives(headers).any(|(d, _)| d == "no-store")
    {
        return RequestRule::Bypass;
    }
    RequestRule::Cache(key(request))
}

/// The default key: scheme, authority and path with query. Parts are separated by NUL, which no
/// URI or header value can hold, so two requests share a key only if all their parts match.
fn key<B>(request: &Request<B>) -> String {
    let uri = request.uri();
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = match uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => request
            .headers()
            .get(HOST)
            .map(|h| h.as_bytes())
            .unwrap_or_default(),
    };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut key = String::with_capacity(8 + scheme.len() + authority.len() + path.len());
    key.push_str("http\0GET\0");
    key.push_str(scheme);
    key.push('\0');
    // A Host header may hold obs-text bytes; the key is hashed, so a lossless escape is enough.
    key.extend(authority.escape_ascii().map(char::from));
    key.push('\0');
    key.push_str(path);
    key
}

/// What the cache does with a response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResponseRule {
    /// Store it, fresh for this long (`None`: the cache's default TTL).
    Store(Option<Duration>),
    /// Pass it on and store nothing.
    Pass,
    /// A server error: a failed load, for which a stale response may be served instead.
    Failure,
}

/// Decides whether a response may be stored and for how long: status 200; no `no-store`,
/// `private`, `no-cache`, `Set-Cookie` or `Vary`; TTL from `s-maxage`, then `max-age`.
pub(crate) fn response_rule(status: StatusCode, headers: &HeaderMap) -> ResponseRule {
    if status.is_server_error() {
        return ResponseRule::Failure;
    }
    if status != StatusCode::OK || headers.contains_key(SET_COOKIE) || headers.contains_key(VARY) {
        return ResponseRule::Pass;
    }
    let mut max_age = None;
    let mut s_maxage = None;
    for (directive, argument) in directives(headers) {
        match directive.as_str() {
            "no-store" | "private" | "no-cache" => return ResponseRule::Pass,
            "max-age" | "s-maxage" => {
                let Some(seconds) = argument.as_deref().and_then(delta_seconds) else {
                    // An unreadable lifetime is no permission to store.
                    return ResponseRule::Pass;
                };
                let slot = if directive == "max-age" {
                    &mut max_age
                } else {
                    &mut s_maxage
                };
                slot.get_or_insert(seconds);
            }
            _ => {}
        }
    }
    match s_maxage.or(max_age) {
        Some(0) => ResponseRule::Pass,
        Some(seconds) => ResponseRule::Store(Some(Duration::from_secs(seconds))),
        None => ResponseRule::Store(None),
    }
}

/// RFC 9111 delta-seconds: digits only; values past 2^31 are taken as 2^31.
fn delta_seconds(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse::<u64>().unwrap_or(u64::MAX).min(1 << 31))
}

/// The `Cache-Control` directives of every `Cache-Control` field: lowercase names and their
/// arguments (unquoted). Fields that are not visible ASCII are skipped.
fn directives(headers: &HeaderMap) -> impl Iterator<Item = (String, Option<String>)> + '_ {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|part| {
            let part = part.trim();
            if part.is_empty() {
                return None;
            }
            let (name, argument) = match part.split_once('=') {
                Some((name, argument)) => {
                    let argument = argument.trim();
                    let argument = argument
                        .strip_prefix('"')
                        .and_then(|a| a.strip_suffix('"'))
                        .unwrap_or(argument);
                    (name.trim(), Some(argument.to_owned()))
                }
                None => (part, None),
            };
            Some((name.to_ascii_lowercase(), argument))
        })
}

/// Whether a header is hop-by-hop (never stored): the fixed list of RFC 9110 and whatever the
/// response's `Connection` header names; also `x-cache`, which the layer sets itself.
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
    if HOP_BY_HOP.contains(&name) || name == super::X_CACHE.as_str() {
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
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn ttl_comes_from_s_maxage_then_max_age() {
        let ok = StatusCode::OK;
        assert_eq!(response_rule(ok, &headers(&[])), ResponseRule::Store(None));
        assert_eq!(
            response_rule(ok, &headers(&[("cache-control", "public, max-age=30")])),
            ResponseRule::Store(Some(Duration::from_secs(30)))
        );
        assert_eq!(
            response_rule(
                ok,
                &headers(&[("cache-control", "max-age=30, S-MAXAGE=\"7\"")])
            ),
            ResponseRule::Store(Some(Duration::from_secs(7)))
        );
        assert_eq!(
            response_rule(
                ok,
                &headers(&[("cache-control", "max-age=99999999999999999999999")])
            ),
            ResponseRule::Store(Some(Duration::from_secs(1 << 31)))
        );
    }

    #[test]
    fn what_is_never_stored() {
        let ok = StatusCode::OK;
        for pairs in [
            &[("cache-control", "no-store")][..],
            &[
                ("cache-control", "max-age=60"),
                ("cache-control", "Private"),
            ],
            &[("cache-control", "no-cache")],
            &[("cache-control", "max-age=0")],
            &[("cache-control", "max-age=-1")],
            &[("cache-control", "max-age=abc")],
            &[("cache-control", "max-age")],
            &[("set-cookie", "a=b")],
            &[("vary", "accept-encoding")],
        ] {
            assert_eq!(
                response_rule(ok, &headers(pairs)),
                ResponseRule::Pass,
                "{pairs:?}"
            );
        }
        assert_eq!(
            response_rule(StatusCode::NOT_FOUND, &headers(&[])),
            ResponseRule::Pass
        );
        assert_eq!(
            response_rule(StatusCode::INTERNAL_SERVER_ERROR, &headers(&[])),
            ResponseRule::Failure
        );
    }

    #[test]
    fn requests() {
        let get = |uri: &str| Request::get(uri).body(()).unwrap();
        assert_eq!(
            request_rule(&Request::post("/").body(()).unwrap()),
            RequestRule::Ignore
        );
        assert_eq!(
            request_rule(&Request::head("/").body(()).unwrap()),
            RequestRule::Ignore
        );
        let mut authed = get("/");
        authed
            .headers_mut()
            .insert(AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(request_rule(&authed), RequestRule::Bypass);
        for (name, value) in [
            ("range", "bytes=0-10"),
            ("if-none-match", "\"v1\""),
            ("if-modified-since", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ] {
            let mut conditional = get("/");
            conditional
                .headers_mut()
                .insert(name, HeaderValue::from_static(value));
            assert_eq!(request_rule(&conditional), RequestRule::Bypass, "{name}");
        }
        let mut no_store = get("/");
        no_store
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        assert_eq!(request_rule(&no_store), RequestRule::Bypass);

        let RequestRule::Cache(a) = request_rule(&get("http://a.example/x?y=1")) else {
            panic!()
        };
        let mut hosted = get("/x?y=1");
        hosted
            .headers_mut()
            .insert(HOST, HeaderValue::from_static("a.example"));
        let RequestRule::Cache(b) = request_rule(&hosted) else {
            panic!()
        };
        assert_eq!(a, b, "absolute-form and Host give one key");
        let RequestRule::Cache(c) = request_rule(&get("http://a.example/x?y=2")) else {
            panic!()
        };
        assert_ne!(a, c, "the query is part of the key");
        let RequestRule::Cache(d) = request_rule(&get("http://b.example/x?y=1")) else {
            panic!()
        };
        assert_ne!(a, d, "the host is part of the key");
    }

    #[test]
    fn hop_by_hop_headers_are_not_stored() {
        let map = headers(&[("connection", "close, X-Secret"), ("x-secret", "1")]);
        assert!(!is_stored_header(
            &HeaderName::from_static("transfer-encoding"),
            &map
        ));
        assert!(!is_stored_header(
            &HeaderName::from_static("x-secret"),
            &map
        ));
        assert!(!is_stored_header(&HeaderName::from_static("x-cache"), &map));
        assert!(is_stored_header(
            &HeaderName::from_static("content-type"),
            &map
        ));
    }
}
