//! Which header fields of a response are stored with it, and so sent with every answer made
//! from its entry (the load stores them; a revalidation merges a `304`'s into them).

use http::header::AGE;
use http::{HeaderMap, HeaderName};

/// The header that tells how the layer answered, in the older style: set by the layer on
/// every answer, never stored.
pub(crate) static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

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
    use http::HeaderValue;

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
