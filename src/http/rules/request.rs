//! What the layer does with a request before it makes its key: look it up, pass it untouched,
//! pass it and invalidate its URL, or pass it marked as bypassed.

use std::time::Duration;

use http::header::{CACHE_CONTROL, IF_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, PRAGMA, RANGE};
use http::{HeaderMap, Method, Request};

use super::methods::invalidates_its_url;
use super::parse::{self, Directive};
use super::pass::Pass;
use super::poisoning::Reflected;

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
    /// honours, or what could [poison](super::poisoning) the cache), for this reason: pass
    /// it on, marked `x-cache: BYPASS`.
    Bypass(Pass),
}

/// Decides what to do with a request, before its key is made: `reflected` names what makes a
/// `GET` or `HEAD` pass.
pub(crate) fn request_rule<B>(
    request: &Request<B>,
    honor_client_no_cache: bool,
    reflected: &Reflected,
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
    if reflected.overrides_to_unsafe(headers) {
        tracing::debug!("a method override to an unsafe method; passed, and it invalidates");
        return RequestRule::Invalidate;
    }
    if let Some(pass) = reflected.passes(headers) {
        return RequestRule::Bypass(pass);
    }
    let read = Read::of(headers);
    // Ranges and these preconditions get answers for this request only (206, 412) that the
    // layer does not compute from an entry.
    if read.range {
        return RequestRule::Bypass(Pass::Range);
    }
    if read.precondition {
        return RequestRule::Bypass(Pass::Precondition);
    }
    let mut reload = false;
    if read.cache_control {
        for Directive { name, argument } in parse::directives(headers) {
            match name.as_str() {
                "no-store" => return RequestRule::Bypass(Pass::NoStoreRequest),
                "no-cache" => reload = true,
                "max-age" => {
                    reload |=
                        argument.as_deref().and_then(parse::delta_seconds) == Some(Duration::ZERO)
                }
                _ => {}
            }
        }
    } else {
        // RFC 9111 §5.4: `Pragma: no-cache` counts only without `Cache-Control`.
        reload = read.pragma_no_cache;
    }
    if reload && honor_client_no_cache {
        return RequestRule::Bypass(Pass::ClientNoCache);
    }
    RequestRule::Cache
}

/// What the rules read of a request's standard fields, found in one walk over them: a request
/// has few, and most have none of these, where a lookup per name would hash each name.
#[derive(Default)]
struct Read {
    range: bool,
    /// `If-Match`, `If-Unmodified-Since` or `If-Range`.
    precondition: bool,
    cache_control: bool,
    /// A `no-cache` directive in a `Pragma` field.
    pragma_no_cache: bool,
}

impl Read {
    fn of(headers: &HeaderMap) -> Self {
        let mut read = Read::default();
        for (name, value) in headers {
            if *name == RANGE {
                read.range = true;
            } else if *name == IF_MATCH || *name == IF_UNMODIFIED_SINCE || *name == IF_RANGE {
                read.precondition = true;
            } else if *name == CACHE_CONTROL {
                read.cache_control = true;
            } else if *name == PRAGMA {
                // A list of directives (RFC 9111 §5.4: `1#pragma-directive`).
                read.pragma_no_cache |= value
                    .as_bytes()
                    .split(|&b| b == b',')
                    .any(|directive| directive.trim_ascii().eq_ignore_ascii_case(b"no-cache"));
            }
        }
        read
    }
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
                request_rule(&with(method.clone(), &[]), false, &Reflected::default()),
                RequestRule::Invalidate,
                "{method}"
            );
        }
        for method in [Method::POST, Method::GET, Method::HEAD] {
            let overridden = with(method, &[("x-http-method-override", "PUT")]);
            assert_eq!(
                request_rule(&overridden, false, &Reflected::default()),
                RequestRule::Invalidate
            );
        }
        for method in [Method::OPTIONS, Method::TRACE, Method::CONNECT] {
            assert_eq!(
                request_rule(&with(method.clone(), &[]), false, &Reflected::default()),
                RequestRule::Ignore,
                "{method}"
            );
        }
        assert_eq!(
            request_rule(&with(Method::GET, &[]), false, &Reflected::default()),
            RequestRule::Cache
        );
        assert_eq!(
            request_rule(&with(Method::HEAD, &[]), false, &Reflected::default()),
            RequestRule::Cache
        );
        for (name, value, pass) in [
            ("range", "bytes=0-10", Pass::Range),
            ("if-match", "\"v1\"", Pass::Precondition),
            (
                "if-unmodified-since",
                "Wed, 21 Oct 2015 07:28:00 GMT",
                Pass::Precondition,
            ),
            ("if-range", "\"v1\"", Pass::Precondition),
            ("cache-control", "no-store", Pass::NoStoreRequest),
            ("x-http-method-override", "GET", Pass::MethodOverride),
            ("content-length", "5", Pass::Body),
            (
                "x_forwarded_host",
                "evil.example",
                Pass::ForwardingHeader("x_forwarded_host"),
            ),
        ] {
            let request = with(Method::GET, &[(name, value)]);
            assert_eq!(
                request_rule(&request, false, &Reflected::default()),
                RequestRule::Bypass(pass),
                "{name}"
            );
        }
        // Keyed by their values (the key's module), not passed.
        for (name, value) in [
            ("if-none-match", "\"v1\""),
            ("if-modified-since", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ("authorization", "Bearer a"),
            ("x-forwarded-host", "evil.example"),
        ] {
            let request = with(Method::GET, &[(name, value)]);
            assert_eq!(
                request_rule(&request, false, &Reflected::default()),
                RequestRule::Cache,
                "{name}"
            );
        }
        for reload in [
            &[("cache-control", "no-cache")][..],
            &[("cache-control", "max-age=0")],
            &[("pragma", "no-cache")],
            &[("pragma", "x-other"), ("pragma", " No-Cache ")],
            // RFC 9111 §5.4: Pragma is a list.
            &[("pragma", "x-other, no-cache")],
        ] {
            let request = with(Method::GET, reload);
            assert_eq!(
                request_rule(&request, false, &Reflected::default()),
                RequestRule::Cache,
                "{reload:?}"
            );
            assert_eq!(
                request_rule(&request, true, &Reflected::default()),
                RequestRule::Bypass(Pass::ClientNoCache),
                "{reload:?}"
            );
        }
        let request = with(
            Method::GET,
            &[("pragma", "no-cache"), ("cache-control", "max-age=5")],
        );
        assert_eq!(
            request_rule(&request, true, &Reflected::default()),
            RequestRule::Cache
        );
    }
}
