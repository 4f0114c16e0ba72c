//! Request headers that could poison the cache: a `GET` or `HEAD` whose response may depend
//! on a header the URL does not name, so that one client's request would become everyone's
//! page. The layer keys some of them and passes the requests that carry the others (neither
//! stored nor answered from the cache):
//!
//! - a **forwarding or rewrite header** (`X-Forwarded-Host`, `X-Host`, `X-Forwarded-Proto`,
//!   `X-Forwarded-Scheme`, `X-Forwarded-Ssl`, `X-Forwarded-Port`, `X-Forwarded-Prefix`,
//!   `Forwarded`, `X-Original-URL`, `X-Rewrite-URL`), which frameworks reflect in links and
//!   redirects or route by, is **part of the key**, as if the response had named it in
//!   `Vary` (see [`key`](crate::http::stored::key#forwarding-headers)): the values a load
//!   balancer sets on every request make one entry, and an attacker's value makes a variant
//!   that only requests with that same value read. `X-Forwarded-For`, `X-Real-IP` and the
//!   `for=` and `by=` of `Forwarded` name the client and the proxy, not the page: they are
//!   left out, or every client would be a variant of its own;
//! - a **method override** (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`),
//!   which many frameworks obey: a `GET` that the origin runs as a `DELETE`, passed. One that
//!   names an unsafe method also invalidates the URL as that method would (RFC 9111 §4.4), so
//!   the change it made is not hidden behind the page stored before;
//! - a **request body** (`Content-Length` other than 0, or `Transfer-Encoding`), which some
//!   frameworks read on a `GET` as they would on a `POST`: passed;
//! - any header the operator names as one the application reflects
//!   ([`pass_header`](crate::http::StampedeLayer::pass_header)): passed.
//!
//! A forwarding header that the operator's own load balancer sets on every request, replacing
//! whatever a client sent, cannot come from an attacker: naming it with
//! [`trust_header`](crate::http::StampedeLayer::trust_header) leaves it out of the key (its
//! value is then ignored); a trusted method override no longer passes.
//!
//! Each of these headers also passes when spelled with underscores (`X_Forwarded_Host`), even
//! a trusted one: servers that name headers the CGI way (`HTTP_X_FORWARDED_HOST`) read it as
//! the hyphenated one, and a load balancer overwrites only the hyphenated one.
//!
//! A body is known by its framing headers: an HTTP/2 or HTTP/3 request may carry one without
//! `Content-Length`, which the layer cannot see without reading it; an application that reads
//! the bodies of `GET`s should refuse such requests itself.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

use super::methods::invalidates_its_url;
use super::pass::{interned, Pass};

/// The method overrides: a `GET` or `HEAD` with one passes unless it is trusted.
const OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The well-known forwarding and rewrite headers: part of the key unless trusted.
const FORWARDING: [&str; 10] = [
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

/// [`FORWARDING`], spelled with underscores, as a pass names them.
const FORWARDING_UNDERSCORED: [&str; 10] = [
    "x_forwarded_host",
    "x_host",
    "x_forwarded_proto",
    "x_forwarded_scheme",
    "x_forwarded_ssl",
    "x_forwarded_port",
    "x_forwarded_prefix",
    "forwarded",
    "x_original_url",
    "x_rewrite_url",
];

/// Whether `test` holds for a value in `headers` of one of the fields `names`, found the
/// cheaper way for this request: a walk over its fields where it has fewer than `names` (as
/// the requests a hit answers mostly do), else a lookup of each name (a hash of each). The
/// same fields are found either way.
fn any_value_of(
    headers: &HeaderMap,
    names: &[HeaderName],
    mut test: impl FnMut(&HeaderValue) -> bool,
) -> bool {
    if headers.keys_len() < names.len() {
        headers
            .iter()
            .any(|(name, value)| names.contains(name) && test(value))
    } else {
        names
            .iter()
            .flat_map(|name| headers.get_all(name))
            .any(test)
    }
}

/// The request headers the origin may reflect in its page: those that make a `GET` or `HEAD`
/// pass, and the forwarding headers that are part of its key.
#[derive(Clone, Debug)]
pub(crate) struct Reflected {
    /// The method overrides not trusted, then the headers named by `pass_header`.
    passes: Vec<HeaderName>,
    /// The method overrides among `passes`.
    overrides: Vec<HeaderName>,
    /// The forwarding headers not trusted, in [`FORWARDING`]'s order.
    keyed: Vec<HeaderName>,
}

impl Default for Reflected {
    fn default() -> Self {
        Reflected {
            passes: OVERRIDES.map(HeaderName::from_static).to_vec(),
            overrides: OVERRIDES.map(HeaderName::from_static).to_vec(),
            keyed: FORWARDING.map(HeaderName::from_static).to_vec(),
        }
    }
}

impl Reflected {
    /// Requests with `name` no longer pass for it, and its value is not part of the key.
    pub(crate) fn trust(&mut self, name: &HeaderName) {
        self.passes.retain(|held| held != name);
        self.overrides.retain(|held| held != name);
        self.keyed.retain(|held| held != name);
    }

    /// Requests with `name` pass (a forwarding header too: it is then no longer keyed).
    pub(crate) fn pass(&mut self, name: HeaderName) {
        self.keyed.retain(|held| *held != name);
        if OVERRIDES.contains(&name.as_str()) && !self.overrides.contains(&name) {
            self.overrides.push(name.clone());
        }
        if !self.passes.contains(&name) {
            self.passes.push(name);
        }
    }

    /// The forwarding headers that are part of the key, in a fixed order.
    pub(crate) fn keyed(&self) -> &[HeaderName] {
        &self.keyed
    }

    /// Whether a request with these headers carries a forwarding header that is part of the
    /// key: it is then keyed by their values (see [`key`](crate::http::stored::key)).
    pub(crate) fn forwarded(&self, headers: &HeaderMap) -> bool {
        any_value_of(headers, &self.keyed, |_| true)
    }

    /// Why a `GET` or `HEAD` with these headers must pass, if it must: it has a body or one
    /// of the headers that pass (or a well-known one, trusted or not, spelled with
    /// underscores). One walk over the request's field names, which are few.
    pub(crate) fn passes(&self, headers: &HeaderMap) -> Option<Pass> {
        headers.keys().find_map(|name| {
            if *name == TRANSFER_ENCODING
                || (*name == CONTENT_LENGTH
                    && headers
                        .get_all(CONTENT_LENGTH)
                        .iter()
                        .any(|length| length.as_bytes().trim_ascii() != b"0"))
            {
                Some(Pass::Body)
            } else if self.passes.contains(name) {
                Some(self.named(name.as_str()))
            } else if name.as_str().contains('_') {
                self.underscored(name.as_str())
            } else {
                None
            }
        })
    }

    /// Whether a `GET` or `HEAD` with these headers carries a method override, not trusted,
    /// that names an unsafe method (any case; frameworks upper-case it): the origin runs it
    /// as that method, whose response invalidates the URL.
    pub(crate) fn overrides_to_unsafe(&self, headers: &HeaderMap) -> bool {
        any_value_of(headers, &self.overrides, |value| {
            let method = value.as_bytes().trim_ascii().to_ascii_uppercase();
            Method::from_bytes(&method).is_ok_and(|m| invalidates_its_url(&m))
        })
    }

    /// The pass for a header that passes, named hyphenated.
    fn named(&self, hyphenated: &str) -> Pass {
        if OVERRIDES.contains(&hyphenated) {
            Pass::MethodOverride
        } else {
            Pass::NamedHeader(interned(hyphenated))
        }
    }

    /// The pass for `name` spelled with underscores, if its underscores read as hyphens make
    /// one of the headers or a well-known one.
    fn underscored(&self, name: &str) -> Option<Pass> {
        let hyphenated = name.replace('_', "-");
        if let Some(i) = FORWARDING.iter().position(|f| *f == hyphenated) {
            return Some(Pass::ForwardingHeader(FORWARDING_UNDERSCORED[i]));
        }
        let known = OVERRIDES.contains(&hyphenated.as_str())
            || self.passes.iter().any(|held| held.as_str() == hyphenated)
            || self.keyed.iter().any(|held| held.as_str() == hyphenated);
        known.then(|| self.named(&hyphenated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::rules::tag_fields::tests::headers;

    #[test]
    fn overrides_and_bodies_pass_and_forwarding_headers_are_keyed_unless_trusted() {
        let mut reflected = Reflected::default();
        let plain = headers(&[("accept", "*/*"), ("content-length", "0")]);
        assert_eq!(reflected.passes(&plain), None);
        assert!(!reflected.forwarded(&plain));
        for name in OVERRIDES {
            let request = headers(&[(name, "x")]);
            assert_eq!(
                reflected.passes(&request),
                Some(Pass::MethodOverride),
                "{name}"
            );
        }
        for name in FORWARDING {
            let request = headers(&[(name, "x")]);
            assert_eq!(reflected.passes(&request), None, "{name}");
            assert!(reflected.forwarded(&request), "{name}");
        }
        assert!(!reflected.forwarded(&headers(&[
            ("x-forwarded-for", "192.0.2.1"),
            ("x-real-ip", "192.0.2.1")
        ])));
        for body in [
            &[("content-length", "7")][..],
            &[("content-length", "0"), ("content-length", "7")],
            &[("transfer-encoding", "chunked")],
        ] {
            assert_eq!(
                reflected.passes(&headers(body)),
                Some(Pass::Body),
                "{body:?}"
            );
        }
        let proto = HeaderName::from_static("x-forwarded-proto");
        reflected.trust(&proto);
        assert!(!reflected.forwarded(&headers(&[("x-forwarded-proto", "https")])));
        assert!(!reflected.keyed().contains(&proto));
        assert!(reflected.forwarded(&headers(&[("x-forwarded-host", "evil")])));
        reflected.pass(HeaderName::from_static("x-theme"));
        assert_eq!(
            reflected.passes(&headers(&[("x-theme", "dark")])),
            Some(Pass::NamedHeader("x-theme"))
        );
        reflected.pass(HeaderName::from_static("x-forwarded-prefix"));
        assert!(!reflected.forwarded(&headers(&[("x-forwarded-prefix", "/a")])));
        for (underscored, pass) in [
            (
                "x_forwarded_proto",
                Pass::ForwardingHeader("x_forwarded_proto"),
            ),
            (
                "x_forwarded-host",
                Pass::ForwardingHeader("x_forwarded_host"),
            ),
            ("x_theme", Pass::NamedHeader("x-theme")),
            ("x_http_method", Pass::MethodOverride),
        ] {
            let request = headers(&[(underscored, "x")]);
            assert_eq!(reflected.passes(&request), Some(pass), "{underscored}");
        }
        assert_eq!(reflected.passes(&headers(&[("x_request_id", "x")])), None);
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
            assert_eq!(
                reflected.overrides_to_unsafe(&overridden),
                unsafe_,
                "{value}"
            );
        }
        reflected.trust(&HeaderName::from_static("x-http-method"));
        assert!(!reflected.overrides_to_unsafe(&headers(&[("x-http-method", "DELETE")])));
        assert_eq!(
            reflected.passes(&headers(&[("x-http-method", "GET")])),
            None
        );
    }

    /// A request's forwarding headers and method overrides are found whether it carries
    /// fewer fields than the names looked for (its fields walked) or more (each name looked
    /// up); an override trusted and then named by `pass_header` is an override again.
    #[test]
    fn forwarding_headers_and_overrides_are_found_among_few_fields_or_many() {
        let mut reflected = Reflected::default();
        let with = |fields: &[(&'static str, &str)], padded: bool| {
            let mut map = headers(fields);
            for i in (0..12).filter(|_| padded) {
                let name = HeaderName::from_bytes(format!("x-filler-{i}").as_bytes());
                map.insert(name.expect("a field name"), HeaderValue::from_static("1"));
            }
            map
        };
        for padded in [false, true] {
            let proto = with(&[("x-forwarded-proto", "https")], padded);
            assert!(reflected.forwarded(&proto), "padded: {padded}");
            assert!(!reflected.forwarded(&with(&[("accept", "*/*")], padded)));
            let delete = with(&[("x-method-override", "delete")], padded);
            assert!(reflected.overrides_to_unsafe(&delete), "padded: {padded}");
            let get = with(&[("x-method-override", "GET")], padded);
            assert!(!reflected.overrides_to_unsafe(&get));
        }
        let name = HeaderName::from_static("x-http-method");
        reflected.trust(&name);
        let delete = headers(&[("x-http-method", "DELETE")]);
        assert!(!reflected.overrides_to_unsafe(&delete), "trusted");
        reflected.pass(name);
        assert!(reflected.overrides_to_unsafe(&delete), "passed again");
    }
}
