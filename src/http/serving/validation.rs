//! Revalidation (RFC 9111 §4.3): the reload of a stored response asks the origin whether it
//! changed, with the stored response's validators (§4.3.1), and a `304 Not Modified` updates
//! the stored response's header fields (§4.3.4) instead of replacing it. What the layer then
//! stores, and for how long, the [`Policy`](crate::http::Policy) decides on the updated response.

use http::header::{CONTENT_LENGTH, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};
use http::{response, HeaderMap, Response};

use crate::http::rules::stored_fields::is_stored_header;
use crate::http::stored::codec::CachedResponse;

/// Makes a reload of `stored` conditional: `If-None-Match` with its `ETag`,
/// `If-Modified-Since` with its `Last-Modified` (each if it has one). The client's own
/// conditional fields were removed before: the layer answers those itself.
pub(crate) fn ask_if_changed(stored: &CachedResponse, headers: &mut HeaderMap) {
    if let Some(etag) = stored.headers.get(ETAG) {
        headers.insert(IF_NONE_MATCH, etag.clone());
    }
    if let Some(modified) = stored.headers.get(LAST_MODIFIED) {
        headers.insert(IF_MODIFIED_SINCE, modified.clone());
    }
}

/// The stored response, its header fields updated by the `304`'s (RFC 9111 §4.3.4): each
/// field the `304` carries replaces every instance of it, but for `Content-Length` (which
/// describes the `304`'s empty body, §3.2) and the fields that are never stored.
pub(crate) fn updated(stored: &CachedResponse, not_modified: &response::Parts) -> response::Parts {
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = stored.status;
    parts.headers = stored.headers.clone();
    for name in not_modified.headers.keys() {
        if name == CONTENT_LENGTH || !is_stored_header(name, &not_modified.headers) {
            continue;
        }
        parts.headers.remove(name);
        for value in not_modified.headers.get_all(name) {
            parts.headers.append(name.clone(), value.clone());
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderValue, StatusCode};

    use super::*;

    fn stored(headers: &[(&'static str, &'static str)]) -> CachedResponse {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        CachedResponse {
            stored_at: crate::clock::now(),
            status: StatusCode::OK,
            headers: map,
            body: Bytes::from_static(b"body"),
        }
    }

    #[test]
    fn the_reload_carries_the_stored_validators() {
        // RFC 9111 §4.3.1: `If-None-Match` from `ETag`, `If-Modified-Since` from
        // `Last-Modified`; a response without validators asks nothing.
        let with = stored(&[
            ("etag", "W/\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        let mut headers = HeaderMap::new();
        ask_if_changed(&with, &mut headers);
        assert_eq!(headers[IF_NONE_MATCH], "W/\"v1\"");
        assert_eq!(headers[IF_MODIFIED_SINCE], "Sun, 06 Nov 1994 08:49:37 GMT");
        let mut headers = HeaderMap::new();
        ask_if_changed(&stored(&[("content-type", "text/plain")]), &mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn a_304_replaces_the_fields_it_carries() {
        // RFC 9111 §4.3.4 (and §3.2: not `Content-Length`; hop-by-hop fields never).
        let before = stored(&[
            ("etag", "\"v1\""),
            ("cache-control", "max-age=1"),
            ("x-kept", "a"),
            ("x-many", "1"),
            ("x-many", "2"),
            ("content-length", "4"),
        ]);
        let mut not_modified = Response::new(());
        *not_modified.status_mut() = StatusCode::NOT_MODIFIED;
        for (name, value) in [
            ("cache-control", "max-age=60"),
            ("x-many", "3"),
            ("content-length", "0"),
            ("connection", "close"),
        ] {
            not_modified
                .headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
        let after = updated(&before, &not_modified.into_parts().0);
        assert_eq!(after.status, StatusCode::OK);
        assert_eq!(after.headers["cache-control"], "max-age=60");
        assert_eq!(after.headers["etag"], "\"v1\"");
        assert_eq!(after.headers["x-kept"], "a");
        let many: Vec<_> = after.headers.get_all("x-many").iter().collect();
        assert_eq!(many, ["3"]);
        assert_eq!(after.headers["content-length"], "4");
        assert!(!after.headers.contains_key("connection"));
    }
}
