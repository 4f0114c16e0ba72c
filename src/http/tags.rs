//! Tags in header fields: a response's tags (`Surrogate-Key: a b`, `Cache-Tag: a,b`), which
//! the layer keeps between the origin and itself.

use http::{HeaderMap, HeaderName};

/// The header fields read for tags by default: `Surrogate-Key`, then `Cache-Tag`.
pub(crate) fn default_headers() -> Vec<HeaderName> {
    vec![
        HeaderName::from_static("surrogate-key"),
        HeaderName::from_static("cache-tag"),
    ]
}

/// Removes the fields `names` from `headers`.
pub(crate) fn remove(headers: &mut HeaderMap, names: &[HeaderName]) {
    for name in names {
        headers.remove(name);
    }
}
