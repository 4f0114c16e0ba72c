//! Requests that could poison the cache: a `GET` or `HEAD` whose response may depend on what
//! the key leaves out, so that one client's request would become everyone's page. By default
//! the layer passes them (neither stored nor answered from the cache):
//!
//! - a **method override** (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`),
//!   which many frameworks obey: a `GET` that the origin runs as a `DELETE`. One that names
//!   an unsafe method also invalidates the URL as that method would (RFC 9111 §4.4), so the
//!   change it made is not hidden behind the page stored before;
//! - a **request body** (`Content-Length` other than 0, or `Transfer-Encoding`), which some
//!   frameworks read on a `GET` as they would on a `POST`;
//! - a **forwarding or rewrite header** (`X-Forwarded-Host`, `X-Host`, `X-Forwarded-Proto`,
//!   `X-Forwarded-Scheme`, `X-Forwarded-Ssl`, `X-Forwarded-Port`, `X-Forwarded-Prefix`,
//!   `Forwarded`, `X-Original-URL`, `X-Rewrite-URL`), which frameworks reflect in links and
//!   redirects or route by;
//! - any header the operator names as one the application reflects
//!   ([`pass_header`](crate::http::StampedeLayer::pass_header)).
//!
//! A forwarding header that the operator's own load balancer sets on every request, replacing
//! whatever a client sent, cannot come from an attacker: naming it with
//! [`trust_header`](crate::http::StampedeLayer::trust_header) lets such requests be cached again.
//!
//! Each of these headers also counts when spelled with underscores (`X_Forwarded_Host`), even
//! a trusted one: servers that name headers the CGI way (`HTTP_X_FORWARDED_HOST`) read it as
//! the hyphenated one, and a load balancer overwrites only the hyphenated one.
//!
//! A body is known by its framing headers: an HTTP/2 or HTTP/3 request may carry one without
//! `Content-Length`, which the layer cannot see without reading it; an application that reads
//! the bodies of `GET`s should refuse such requests itself.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, Method};

use super::methods::invalidates_its_url;

/// The headers that make a `GET` or `HEAD` pass unless trusted: method overrides, then the
/// well-known forwarding and rewrite headers.
const UNKEYED: [&str; 13] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-forwarded-host",
    "x-host",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-forwarded-ssl",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "forwarded",
    "x-original-url",
    "x-rewrite-url",
];

/// How many of [`UNKEYED`] are method overrides (its first).
const OVERRIDES: usize = 3;

/// The request headers that make a `GET` or `HEAD` pass.
#[derive(Clone, Debug)]
pub(crate) struct Unkeyed {
    names: Vec<HeaderName>,
}

impl Default for Unkeyed {
    fn default() -> Self {
        Unkeyed {
            names: UNKEYED.map(HeaderName::from_static).to_vec(),
        }
    }
}

impl Unkeyed {
    /// Requests with `name` no longer pass for it.
    pub(crate) fn trust(&mut self, name: &HeaderName) {
        self.names.retain(|held| held != name);
    }

    /// Requests with `name` pass.
    pub(crate) fn pass(&mut self, name: HeaderName) {
        if !self.names.contains(&name) {
            self.names.push(name);
        }
    }

    /// Whether a `GET` or `HEAD` with these headers must pass: it has a body or one of the
    /// headers (or a well-known one, trusted or not, spelled with underscores). One walk over
    /// the request's field names, which are few.
    pub(crate) fn poisons(&self, headers: &HeaderMap) -> bool {
        headers.keys().any(|name| {
            *name == TRANSFER_ENCODING
                || (*name == CONTENT_LENGTH
                    && headers
                        .get_all(CONTENT_LENGTH)
                        .iter()
                        .any(|length| length.as_bytes().trim_ascii() != b"0"))
                || self.names.contains(name)
                || (name.as_str().contains('_') && self.underscored(name.as_str()))
        })
    }

    /// Whether a `GET` or `HEAD` with these headers carries a method override, not trusted,
    /// that names an unsafe method (any case; frameworks upper-case it): the origin runs it
    /// as that method, whose response invalidates the URL.
    pub(crate) fn overrides_to_unsafe(&self, headers: &HeaderMap) -> bool {
        UNKEYED[..OVERRIDES]
            .iter()
            .filter(|name| self.names.iter().any(|held| held == **name))
            .flat_map(|name| headers.get_all(*name))
            .any(|value| {
                let method = value.as_bytes().trim_ascii().to_ascii_uppercase();
                Method::from_bytes(&method).is_ok_and(|m| invalidates_its_url(&m))
            })
    }

    /// Whether `name`, its underscores read as hyphens, is one of the headers or a well-known
    /// one.
    fn underscored(&self, name: &str) -> bool {
        let hyphenated = name.replace('_', "-");
        UNKEYED.contains(&hyphenated.as_str())
            || self.names.iter().any(|held| held.as_str() == hyphenated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::invalidation::tag_fields::tests::headers;

    #[test]
    fn overrides_bodies_and_forwarding_headers_pass_unless_trusted() {
        let mut unkeyed = Unkeyed::default();
        let plain = headers(&[("accept", "*/*"), ("content-length", "0")]);
        assert!(!unkeyed.poisons(&plain));
        for name in UNKEYED {
            assert!(unkeyed.poisons(&headers(&[(name, "x")])), "{name}");
        }
        for body in [
            &[("content-length", "7")][..],
            &[("content-length", "0"), ("content-length", "7")],
            &[("transfer-encoding", "chunked")],
        ] {
            assert!(unkeyed.poisons(&headers(body)), "{body:?}");
        }
        let proto = HeaderName::from_static("x-forwarded-proto");
        unkeyed.trust(&proto);
        assert!(!unkeyed.poisons(&headers(&[("x-forwarded-proto", "https")])));
        assert!(unkeyed.poisons(&headers(&[("x-forwarded-host", "evil")])));
        unkeyed.pass(HeaderName::from_static("x-theme"));
        assert!(unkeyed.poisons(&headers(&[("x-theme", "dark")])));
        for underscored in ["x_forwarded_proto", "x_forwarded-host", "x_theme"] {
            assert!(
                unkeyed.poisons(&headers(&[(underscored, "x")])),
                "{underscored}"
            );
        }
        assert!(!unkeyed.poisons(&headers(&[("x_request_id", "x")])));
        for (value, unsafe_) in [("DELETE", true), (" put ", true), ("FROB", true)]
            .into_iter()
            .chain([
                ("GET", false),
                ("head", false),
                ("CONNECT", false),
                ("a b", false),
            ])
        {
            let overridden = headers(&[("x-http-method", value)]);
            assert_eq!(unkeyed.overrides_to_unsafe(&overridden), unsafe_, "{value}");
        }
        unkeyed.trust(&HeaderName::from_static("x-http-method"));
        assert!(!unkeyed.overrides_to_unsafe(&headers(&[("x-http-method", "DELETE")])));
    }
}
