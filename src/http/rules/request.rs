//! What the layer does with a request before it makes its key: look it up, pass it untouched,
//! pass it and invalidate its URL, or pass it marked as bypassed.

use std::time::Duration;

use http::header::{CACHE_CONTROL, IF_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, PRAGMA, RANGE};
use http::{HeaderName, Method, Request};

use super::methods::invalidates_its_url;
use super::parse::{self, Directive};
use super::poisoning::Unkeyed;

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
        return if invalidates_its_url(method) {
            RequestRule::Invalidate
        } else {
            RequestRule::Ignore
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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
}
