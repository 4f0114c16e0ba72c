//! Conditional `GET` and `HEAD` answered from a cached entry: `If-None-Match` and
//! `If-Modified-Since` (RFC 9110 §13.1.2, §13.1.3), with `304 Not Modified`.

use std::time::SystemTime;

use http::header::{
    CACHE_CONTROL, CONTENT_LOCATION, DATE, ETAG, EXPIRES, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    LAST_MODIFIED, VARY,
};
use http::{HeaderMap, HeaderName, StatusCode};

use super::parse::{self, IfNoneMatch};

/// The fields a `304` carries from the response it stands for (RFC 9110 §15.4.5), and
/// `Last-Modified`, which helps caches downstream update their entry.
pub(crate) const NOT_MODIFIED_FIELDS: [HeaderName; 7] = [
    CACHE_CONTROL,
    CONTENT_LOCATION,
    DATE,
    ETAG,
    EXPIRES,
    VARY,
    LAST_MODIFIED,
];

/// A request's preconditions that a cached entry can answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Conditions {
    /// `If-None-Match`; `None` if it is malformed (then it is ignored, and so is any
    /// `If-Modified-Since`).
    IfNoneMatch(Option<IfNoneMatch>),
    /// `If-Modified-Since` without `If-None-Match`; `None` if it is not a date.
    IfModifiedSince(Option<SystemTime>),
}

impl Conditions {
    /// The request's conditions, if it has any.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Self> {
        if headers.contains_key(IF_NONE_MATCH) {
            return Some(Conditions::IfNoneMatch(parse::if_none_match(headers)));
        }
        parse::date_field(headers, &IF_MODIFIED_SINCE).map(Conditions::IfModifiedSince)
    }

    /// Whether the request is answered `304 Not Modified` by a cached response of `status`
    /// and `headers`: a `200` whose `ETag`
    /// matches (weak comparison) or, for `If-Modified-Since`, whose `Last-Modified` is not
    /// later than the date asked about (a date in the future is ignored).
    pub(crate) fn not_modified(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        now: SystemTime,
    ) -> bool {
        if status != StatusCode::OK {
            return false;
        }
        match self {
            Conditions::IfNoneMatch(None) | Conditions::IfModifiedSince(None) => false,
            Conditions::IfNoneMatch(Some(IfNoneMatch::Any)) => true,
            Conditions::IfNoneMatch(Some(IfNoneMatch::Tags(tags))) => headers
                .get(ETAG)
                .and_then(parse::etag)
                .is_some_and(|etag| tags.iter().any(|tag| tag.as_slice() == etag)),
            Conditions::IfModifiedSince(Some(since)) => {
                *since <= now
                    && parse::date_field(headers, &LAST_MODIFIED)
                        .flatten()
                        .is_some_and(|modified| modified <= *since)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::time::Duration;

    /// A cached response's status and header fields.
    fn cached(status: u16, headers: &[(&'static str, &'static str)]) -> (StatusCode, HeaderMap) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        (StatusCode::from_u16(status).unwrap(), map)
    }

    fn asks(headers: &[(&'static str, &'static str)]) -> Option<Conditions> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        Conditions::of(&map)
    }

    const MODIFIED: &str = "Wed, 21 Oct 2015 07:28:00 GMT";
    const BEFORE: &str = "Tue, 20 Oct 2015 07:28:00 GMT";

    #[test]
    fn if_none_match_uses_weak_comparison() {
        let entry = cached(200, &[("etag", "W/\"v1\""), ("last-modified", MODIFIED)]);
        let now = crate::clock::now();
        let not_modified = |headers| asks(headers).unwrap().not_modified(entry.0, &entry.1, now);
        assert!(not_modified(&[("if-none-match", "\"v1\"")]));
        assert!(not_modified(&[("if-none-match", "\"v0\", W/\"v1\"")]));
        assert!(not_modified(&[("if-none-match", "*")]));
        assert!(!not_modified(&[("if-none-match", "\"v2\"")]));
        assert!(
            !not_modified(&[("if-none-match", "v1")]),
            "malformed: ignored"
        );
        assert!(
            !not_modified(&[("if-none-match", "\"v2\""), ("if-modified-since", MODIFIED)]),
            "If-Modified-Since is ignored with If-None-Match"
        );
        let other = cached(404, &[("etag", "\"v1\"")]);
        assert!(!asks(&[("if-none-match", "*")])
            .unwrap()
            .not_modified(other.0, &other.1, now));
        assert_eq!(asks(&[]), None);
    }

    #[test]
    fn if_modified_since_compares_last_modified() {
        let entry = cached(200, &[("last-modified", MODIFIED)]);
        let now = crate::clock::now();
        let not_modified = |headers| asks(headers).unwrap().not_modified(entry.0, &entry.1, now);
        assert!(not_modified(&[("if-modified-since", MODIFIED)]));
        assert!(!not_modified(&[("if-modified-since", BEFORE)]));
        assert!(!not_modified(&[("if-modified-since", "yesterday")]));
        // Asked on 1 January 2015 about 21 October 2015: a date in the future is ignored.
        let earlier = SystemTime::UNIX_EPOCH + Duration::from_secs(1_420_070_400);
        assert!(!asks(&[("if-modified-since", MODIFIED)])
            .unwrap()
            .not_modified(entry.0, &entry.1, earlier));
        let no_date = cached(200, &[]);
        assert!(!asks(&[("if-modified-since", MODIFIED)])
            .unwrap()
            .not_modified(no_date.0, &no_date.1, now));
    }
}
