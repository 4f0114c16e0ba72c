//! Tags in header fields: a response's tags (`Surrogate-Key: a b`, `Cache-Tag: a,b`), which
//! the layer attaches to its stored entry, and a purge request's, which it invalidates.
//!
//! A field holds tags separated by spaces, tabs or commas (as Fastly's and Varnish xkey's
//! `Surrogate-Key` and Cloudflare's `Cache-Tag` write them). What is accepted is bounded:
//! at most [`MAX_TAGS`] distinct tags of at most [`MAX_TAG_BYTES`] bytes each.

use http::{HeaderMap, HeaderName};

/// The most distinct tags a response (or a purge request) may carry.
pub(crate) const MAX_TAGS: usize = 128;

/// The longest tag, in bytes.
pub(crate) const MAX_TAG_BYTES: usize = 256;

/// The header fields read for tags by default: `Surrogate-Key`, then `Cache-Tag`.
pub(crate) fn default_headers() -> Vec<HeaderName> {
    vec![
        HeaderName::from_static("surrogate-key"),
        HeaderName::from_static("cache-tag"),
    ]
}

/// The tags are more than [`MAX_TAGS`], or one is longer than [`MAX_TAG_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OverLimit;

/// The distinct tags in the fields `names` of `headers`, in the order they come; empty if
/// there are none.
pub(crate) fn read(headers: &HeaderMap, names: &[HeaderName]) -> Result<Vec<Vec<u8>>, OverLimit> {
    let mut tags: Vec<Vec<u8>> = Vec::new();
    let values = names.iter().flat_map(|name| headers.get_all(name));
    for value in values {
        let split = value
            .as_bytes()
            .split(|&b| b == b' ' || b == b'\t' || b == b',');
        for tag in split.filter(|tag| !tag.is_empty()) {
            if tag.len() > MAX_TAG_BYTES {
                return Err(OverLimit);
            }
            if tags.iter().any(|t| t == tag) {
                continue;
            }
            if tags.len() == MAX_TAGS {
                return Err(OverLimit);
            }
            tags.push(tag.to_vec());
        }
    }
    Ok(tags)
}

/// Whether `headers` has any of the fields `names`.
pub(crate) fn present(headers: &HeaderMap, names: &[HeaderName]) -> bool {
    names.iter().any(|name| headers.contains_key(name))
}

/// Removes the fields `names` from `headers`.
pub(crate) fn remove(headers: &mut HeaderMap, names: &[HeaderName]) {
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::HeaderValue;

    /// A header map of these fields (the HTTP tests of other files build theirs here too).
    pub(crate) fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn tags(fields: &[(&'static str, &str)]) -> Result<Vec<String>, OverLimit> {
        let read = read(&headers(fields), &default_headers())?;
        Ok(read
            .into_iter()
            .map(|t| String::from_utf8(t).unwrap())
            .collect())
    }

    #[test]
    fn tags_are_split_on_spaces_and_commas_and_deduplicated() {
        assert_eq!(
            tags(&[("surrogate-key", "  a b\tc  a ")]),
            Ok(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(
            tags(&[("cache-tag", "a,b, c"), ("surrogate-key", "d a")]),
            Ok(vec!["d".into(), "a".into(), "b".into(), "c".into()]),
            "Surrogate-Key first"
        );
        assert_eq!(tags(&[("surrogate-key", " , ")]), Ok(vec![]));
        assert_eq!(tags(&[("x-other", "a")]), Ok(vec![]));
        let only_cache_tag = [HeaderName::from_static("cache-tag")];
        let read = read(&headers(&[("surrogate-key", "a")]), &only_cache_tag);
        assert_eq!(read, Ok(vec![]), "only the configured fields");
    }

    #[test]
    fn tags_are_bounded() {
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(
            tags(&[("surrogate-key", &many[..MAX_TAGS].join(" "))]).map(|t| t.len()),
            Ok(MAX_TAGS)
        );
        assert_eq!(tags(&[("surrogate-key", &many.join(" "))]), Err(OverLimit));
        let repeated = vec!["same"; 10 * MAX_TAGS].join(" ");
        assert_eq!(
            tags(&[("surrogate-key", &repeated)]).map(|t| t.len()),
            Ok(1)
        );
        let long = "x".repeat(MAX_TAG_BYTES + 1);
        assert_eq!(tags(&[("surrogate-key", &long)]), Err(OverLimit));
        assert_eq!(
            tags(&[("surrogate-key", &long[1..])]).map(|t| t.len()),
            Ok(1)
        );
    }
}
