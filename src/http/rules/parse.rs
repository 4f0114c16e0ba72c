//! Parsers of the header fields the layer reads: `Cache-Control`, `Vary`, HTTP dates and entity
//! tags. They read bytes from the network: each returns an answer or nothing, never panics, and
//! does work bounded by the size of its input.

use std::time::{Duration, SystemTime};

use http::header::{AGE, CACHE_CONTROL, VARY};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The most header fields a `Vary` may name for its response to be stored: each one is part of
/// the variant's key. A response that names more is not stored.
pub(crate) const MAX_VARY_NAMES: usize = 16;

/// The longest lifetime a header can give (RFC 9111 §1.2.2: 2^31 seconds).
const MAX_DELTA_SECONDS: u64 = 1 << 31;

/// One `Cache-Control` directive: its lowercase name and its argument, unquoted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Directive {
    pub(crate) name: String,
    pub(crate) argument: Option<String>,
}

/// The directives of every `Cache-Control` field of `headers`, in order. Commas inside quoted
/// arguments do not split; fields that are not visible ASCII are skipped whole.
pub(crate) fn directives(headers: &HeaderMap) -> impl Iterator<Item = Directive> + '_ {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(split_list)
        .filter_map(|part| {
            let (name, argument) = match part.split_once('=') {
                Some((name, argument)) => (name.trim(), Some(unquote(argument.trim()))),
                None => (part, None),
            };
            (!name.is_empty()).then(|| Directive {
                name: name.to_ascii_lowercase(),
                argument,
            })
        })
}

/// The elements of a comma-separated list, trimmed, empty ones left out; commas inside a
/// quoted string (with its backslash escapes) do not split.
fn split_list(value: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(value);
    std::iter::from_fn(move || loop {
        let text = rest?;
        let (mut quoted, mut escaped) = (false, false);
        let mut end = None;
        for (i, c) in text.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                ',' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let element = match end {
            Some(i) => {
                rest = text.get(i + 1..);
                text.get(..i).unwrap_or_default()
            }
            None => {
                rest = None;
                text
            }
        };
        let element = element.trim();
        if !element.is_empty() {
            return Some(element);
        }
    })
}

/// A directive's argument without its quotes and backslash escapes.
fn unquote(argument: &str) -> String {
    let Some(inner) = argument.strip_prefix('"').and_then(|a| a.strip_suffix('"')) else {
        return argument.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut escaped = false;
    for c in inner.chars() {
        if c == '\\' && !escaped {
            escaped = true;
        } else {
            out.push(c);
            escaped = false;
        }
    }
    out
}

/// RFC 9111 delta-seconds: digits only; values past 2^31 are taken as 2^31.
pub(crate) fn delta_seconds(text: &str) -> Option<Duration> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
    Some(Duration::from_secs(seconds.min(MAX_DELTA_SECONDS)))
}

/// An HTTP date (IMF-fixdate, or the obsolete RFC 850 and asctime forms, as RFC 9110 §5.6.7
/// asks recipients to accept).
pub(crate) fn http_date(value: &HeaderValue) -> Option<SystemTime> {
    httpdate::parse_http_date(value.to_str().ok()?).ok()
}

/// The first field named `name`, as an HTTP date: `None` if absent, `Some(None)` if it is not
/// a valid date.
pub(crate) fn date_field(headers: &HeaderMap, name: &HeaderName) -> Option<Option<SystemTime>> {
    headers.get(name).map(http_date)
}

/// The `Age` a response arrived with: of several (field lines, or a list), the first; 0 if
/// none, or if that one is not a non-negative integer (RFC 9111 §5.1: ignored).
pub(crate) fn age(headers: &HeaderMap) -> Duration {
    headers
        .get(AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .and_then(|v| delta_seconds(v.trim()))
        .unwrap_or_default()
}

/// What a response's `Vary` says about its variants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Vary {
    /// No `Vary`, or one that names nothing: one response for every request.
    None,
    /// The response depends on these request header fields (lowercase, sorted, distinct; at
    /// most [`MAX_VARY_NAMES`]).
    Names(Vec<HeaderName>),
    /// `Vary: *`, more names than [`MAX_VARY_NAMES`], or a field that cannot be read: the
    /// response cannot be matched to later requests, so it is not stored.
    Unkeyable,
}

/// Reads every `Vary` field of a response.
pub(crate) fn vary(headers: &HeaderMap) -> Vary {
    let mut names: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(VARY) {
        let Ok(value) = value.to_str() else {
            return Vary::Unkeyable;
        };
        for element in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if element == "*" {
                return Vary::Unkeyable;
            }
            let Ok(name) = HeaderName::from_bytes(element.as_bytes()) else {
                return Vary::Unkeyable;
            };
            if !names.contains(&name) {
                if names.len() == MAX_VARY_NAMES {
                    return Vary::Unkeyable;
                }
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        return Vary::None;
    }
    names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    Vary::Names(names)
}

/// What an `If-None-Match` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IfNoneMatch {
    /// `*`: any current representation.
    Any,
    /// These entity tags, by their opaque part (weak comparison ignores `W/`).
    Tags(Vec<Vec<u8>>),
}

/// Reads every `If-None-Match` field of a request; `None` if there is none or one is
/// malformed (a malformed precondition is ignored, so the full response is sent).
pub(crate) fn if_none_match(headers: &HeaderMap) -> Option<IfNoneMatch> {
    let mut tags = Vec::new();
    let mut fields = headers
        .get_all(http::header::IF_NONE_MATCH)
        .iter()
        .peekable();
    fields.peek()?;
    for field in fields {
        let bytes = trim(field.as_bytes());
        if bytes == b"*" {
            return Some(IfNoneMatch::Any);
        }
        let mut rest = bytes;
        loop {
            rest = trim_start(rest);
            if rest.is_empty() {
                break;
            }
            let (tag, after) = entity_tag(rest)?;
            tags.push(tag.to_vec());
            rest = trim_start(after);
            match rest.split_first() {
                None => break,
                Some((b',', after)) => rest = after,
                Some(_) => return None,
            }
        }
    }
    Some(IfNoneMatch::Tags(tags))
}

/// The opaque part of a response's `ETag` (weak or strong), if it is one well-formed tag.
pub(crate) fn etag(value: &HeaderValue) -> Option<&[u8]> {
    match entity_tag(trim(value.as_bytes()))? {
        (tag, []) => Some(tag),
        _ => None,
    }
}

/// One entity tag at the start of `bytes`: `[W/]"opaque"`. Returns the opaque part (with its
/// quotes, so `""` is a tag of its own) and what follows.
fn entity_tag(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let bytes = bytes.strip_prefix(b"W/").unwrap_or(bytes);
    let after_quote = bytes.strip_prefix(b"\"")?;
    let end = after_quote.iter().position(|&b| b == b'"')?;
    // etagc = %x21 / %x23-7E / obs-text
    if !after_quote[..end]
        .iter()
        .all(|&b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
    {
        return None;
    }
    Some((bytes.get(..end + 2)?, after_quote.get(end + 1..)?))
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii_start()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(name: &'static str, values: &[&'static str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn directives_split_outside_quotes() {
        let headers = map(
            "cache-control",
            &[
                "public, X-Ext=\"a, max-age=9\" , MAX-AGE=\"7\"",
                ",,no-cache=\"set-cookie\"",
            ],
        );
        let got: Vec<_> = directives(&headers).map(|d| (d.name, d.argument)).collect();
        assert_eq!(
            got,
            [
                ("public".to_owned(), None),
                ("x-ext".to_owned(), Some("a, max-age=9".to_owned())),
                ("max-age".to_owned(), Some("7".to_owned())),
                ("no-cache".to_owned(), Some("set-cookie".to_owned())),
            ]
        );
    }

    #[test]
    fn delta_seconds_are_digits_capped() {
        assert_eq!(delta_seconds("30"), Some(Duration::from_secs(30)));
        assert_eq!(
            delta_seconds("99999999999999999999999"),
            Some(Duration::from_secs(1 << 31))
        );
        for bad in ["", "-1", "1.5", " 1", "abc"] {
            assert_eq!(delta_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dates_in_all_three_forms() {
        let want = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                http_date(&HeaderValue::from_static(form)),
                Some(want),
                "{form}"
            );
        }
        assert_eq!(http_date(&HeaderValue::from_static("0")), None);
    }

    #[test]
    fn vary_names_are_normalised_and_bounded() {
        assert_eq!(vary(&HeaderMap::new()), Vary::None);
        assert_eq!(vary(&map("vary", &[" , "])), Vary::None);
        assert_eq!(
            vary(&map(
                "vary",
                &["Accept-Encoding, accept-language", "ACCEPT-ENCODING"]
            )),
            Vary::Names(vec![
                HeaderName::from_static("accept-encoding"),
                HeaderName::from_static("accept-language"),
            ])
        );
        assert_eq!(vary(&map("vary", &["accept, *"])), Vary::Unkeyable);
        assert_eq!(vary(&map("vary", &["a b"])), Vary::Unkeyable);
        let many = (0..=MAX_VARY_NAMES)
            .map(|i| format!("x-{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut headers = HeaderMap::new();
        headers.insert(VARY, HeaderValue::from_str(&many).unwrap());
        assert_eq!(vary(&headers), Vary::Unkeyable);
    }

    #[test]
    fn entity_tags() {
        let tags = |v: &'static str| if_none_match(&map("if-none-match", &[v]));
        assert_eq!(tags("*"), Some(IfNoneMatch::Any));
        assert_eq!(
            tags(" \"a\", W/\"b\" ,\"\""),
            Some(IfNoneMatch::Tags(vec![
                b"\"a\"".to_vec(),
                b"\"b\"".to_vec(),
                b"\"\"".to_vec()
            ]))
        );
        for bad in ["a", "\"a", "\"a\" \"b\"", "W/", "\"a b\"", "\"a\",x"] {
            assert_eq!(tags(bad), None, "{bad:?}");
        }
        assert_eq!(if_none_match(&HeaderMap::new()), None);
        assert_eq!(
            etag(&HeaderValue::from_static("W/\"v1\"")),
            Some(&b"\"v1\""[..])
        );
        assert_eq!(etag(&HeaderValue::from_static("\"v1\" x")), None);
    }

    /// Any bytes a header value may hold (all but CR, LF and NUL).
    fn header_value() -> impl Strategy<Value = HeaderValue> {
        proptest::collection::vec(any::<u8>(), 0..200)
            .prop_filter_map("not a header value", |b| HeaderValue::from_bytes(&b).ok())
    }

    /// Header values built from the characters these parsers care about, so that they reach
    /// deep into the grammar more often than uniformly random bytes do.
    fn structured_value() -> impl Strategy<Value = HeaderValue> {
        proptest::string::string_regex("[ ,=\"\\\\W/*a-zA-Z0-9\\-\u{80}-\u{ff}]{0,80}")
            .expect("a valid regex")
            .prop_filter_map("not a header value", |s| HeaderValue::from_str(&s).ok())
    }

    proptest! {
        #[test]
        fn header_parsers_never_panic(
            values in proptest::collection::vec(prop_oneof![header_value(), structured_value()], 0..6),
        ) {
            let mut headers = HeaderMap::new();
            for value in &values {
                for name in ["cache-control", "vary", "if-none-match", "expires", "etag"] {
                    headers.append(name, value.clone());
                }
            }
            for directive in directives(&headers) {
                prop_assert!(!directive.name.is_empty());
                prop_assert_eq!(directive.name.to_ascii_lowercase(), directive.name.clone());
                if let Some(argument) = &directive.argument {
                    let _ = delta_seconds(argument);
                }
            }
            match vary(&headers) {
                Vary::Names(names) => prop_assert!(!names.is_empty() && names.len() <= MAX_VARY_NAMES),
                Vary::None | Vary::Unkeyable => {}
            }
            let _ = if_none_match(&headers);
            for value in &values {
                let _ = http_date(value);
                let _ = etag(value);
            }
        }

        #[test]
        fn dates_round_trip(seconds in 0u64..253_402_300_799) {
            let time = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
            let text = httpdate::fmt_http_date(time);
            prop_assert_eq!(http_date(&HeaderValue::from_str(&text).unwrap()), Some(time));
        }
    }
}
