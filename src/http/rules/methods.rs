//! Request methods and statuses as the cache sees them: the safe methods (RFC 9110 §9.2.1),
//! those whose non-error response invalidates their URL (RFC 9111 §4.4), and the statuses
//! cacheable by default (RFC 9110 §15.1).

use http::{Method, StatusCode};

/// Whether a method is safe (RFC 9110 §9.2.1).
pub(crate) fn is_safe(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method)
}

/// Whether a non-error response to `method` invalidates its URL: every unsafe method does
/// (RFC 9111 §4.4) but `CONNECT`, which names no stored resource.
pub(crate) fn invalidates_its_url(method: &Method) -> bool {
    !is_safe(method) && method != Method::CONNECT
}

/// RFC 9110's statuses that are heuristically cacheable (§15.1).
pub(crate) fn cacheable_by_default(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_methods_and_those_that_invalidate() {
        for method in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            let method = method.parse().unwrap();
            assert!(is_safe(&method), "{method}");
            assert!(!invalidates_its_url(&method), "{method}");
        }
        for method in ["POST", "PUT", "DELETE", "PATCH", "PURGE", "FROB"] {
            let method = method.parse().unwrap();
            assert!(!is_safe(&method), "{method}");
            assert!(invalidates_its_url(&method), "{method}");
        }
        assert!(!is_safe(&Method::CONNECT) && !invalidates_its_url(&Method::CONNECT));
    }
}
