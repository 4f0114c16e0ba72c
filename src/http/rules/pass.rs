//! Why a request or a response passes the cache: one [`Pass`] per rule, returned by the
//! request rules and by the response rules alike. Its [`rule`](Pass::rule) is the `reason`
//! label of the pass metric and the `rule` of the warning, and, with the header it concerns
//! ([`detail`](Pass::detail)), what `Cache-Status`'s `detail` says (see
//! [`passes`](crate::http::serving::passes)).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Why a request passed: a request rule, or a response rule of its load.
///
/// A rule that names a header carries the header's name, as the request spelled it (for a
/// forwarding header spelled with underscores) or as the operator named it (for a
/// [`pass_header`](crate::http::StampedeLayer::pass_header)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    // The request's rules.
    /// A method override (`X-HTTP-Method-Override`, ...): `method-override`.
    MethodOverride,
    /// A `GET` or `HEAD` with a body: `body`.
    Body,
    /// A forwarding header spelled with underscores, which a load balancer does not
    /// overwrite: `forwarding-header:x_forwarded_host`.
    ForwardingHeader(&'static str),
    /// A header the operator named with `pass_header`: `pass-header:x-theme`.
    NamedHeader(&'static str),
    /// The request's set of forwarding values has no place among the URL's (see
    /// [`ForwardedVariants`](crate::http::stored::key::ForwardedVariants)): its load was handed
    /// to the requests that waited for it, not stored: `too-many-variants`.
    TooManyVariants,
    /// The request's `Cache-Control: no-store`: `no-store-request`.
    NoStoreRequest,
    /// A reload the layer honours (`no-cache`, `max-age=0`): `client-no-cache`.
    ClientNoCache,
    /// `Range`: `range`.
    Range,
    /// `If-Match`, `If-Unmodified-Since`, `If-Range`: `precondition`.
    Precondition,
    /// The [`MakeKey`](crate::http::MakeKey) could not describe the request: `no-key`.
    NoKey,
    // The response's rules.
    /// The request had credentials and the response does not say it may be shared:
    /// `credentials`.
    Credentials,
    /// `Cache-Control: private`: `private`.
    Private,
    /// `Cache-Control: no-store`: `no-store`.
    NoStore,
    /// `Set-Cookie`: `set-cookie`.
    SetCookie,
    /// `no-cache` without a validator, or where the cache keeps no values to revalidate:
    /// `no-cache`.
    NoCache,
    /// No explicit freshness, and no default TTL for it (or a freshness of 0): `no-freshness`.
    NoFreshness,
    /// A status that is never stored (`206`, `304`, informational): `status`.
    Status,
    /// `Vary: *`, or a `Vary` the layer cannot key: `vary-star`.
    VaryStar,
    /// A body over `max_body_bytes`: `too-large`.
    TooLarge,
    /// A body over `max_relay_bytes`, which the requests that waited for its load could not
    /// be handed: `relay-full`.
    RelayFull,
    /// Header fields over `max_header_bytes`: `headers-too-large`.
    HeadersTooLarge,
    /// A body that ended with trailers: `trailers`.
    Trailers,
    /// A body that failed: `body-error`.
    BodyError,
    /// More tags than a stored response may carry: `too-many-tags`.
    TooManyTags,
    /// A response the codec cannot hold: `not-encodable`.
    NotEncodable,
    /// Another request's load of the URL was not stored (a "pass" marker said so), so this
    /// one went to the origin itself: `uncacheable`.
    Uncacheable,
    /// A policy of the operator's own passed the response: `policy`.
    Policy,
}

impl Pass {
    /// The rule's name, without a header.
    pub(crate) fn rule(self) -> &'static str {
        match self {
            Pass::MethodOverride => "method-override",
            Pass::Body => "body",
            Pass::ForwardingHeader(_) => "forwarding-header",
            Pass::NamedHeader(_) => "pass-header",
            Pass::TooManyVariants => "too-many-variants",
            Pass::NoStoreRequest => "no-store-request",
            Pass::ClientNoCache => "client-no-cache",
            Pass::Range => "range",
            Pass::Precondition => "precondition",
            Pass::NoKey => "no-key",
            Pass::Credentials => "credentials",
            Pass::Private => "private",
            Pass::NoStore => "no-store",
            Pass::SetCookie => "set-cookie",
            Pass::NoCache => "no-cache",
            Pass::NoFreshness => "no-freshness",
            Pass::Status => "status",
            Pass::VaryStar => "vary-star",
            Pass::TooLarge => "too-large",
            Pass::RelayFull => "relay-full",
            Pass::HeadersTooLarge => "headers-too-large",
            Pass::Trailers => "trailers",
            Pass::BodyError => "body-error",
            Pass::TooManyTags => "too-many-tags",
            Pass::NotEncodable => "not-encodable",
            Pass::Uncacheable => "uncacheable",
            Pass::Policy => "policy",
        }
    }

    /// What the operator can do about the rule, as its warning says.
    pub(crate) fn remedy(self) -> &'static str {
        match self {
            Pass::NoFreshness => {
                "the response declares no freshness: send Cache-Control: max-age (or \
                 s-maxage), or give the layer a default with RfcPolicy::default_ttl"
            }
            Pass::Credentials => {
                "the request had Authorization or a cookie: send Cache-Control: public or \
                 s-maxage where the page may be shared, or ignore a cookie that names no user \
                 with RfcPolicy::ignore_cookie"
            }
            Pass::TooLarge => "raise StampedeLayer::max_body_bytes to store bodies this large",
            Pass::RelayFull => "raise StampedeLayer::max_relay_bytes to share bodies this large",
            Pass::HeadersTooLarge => "raise StampedeLayer::max_header_bytes",
            Pass::TooManyVariants => {
                "more sets of forwarding values than a URL keeps: trust the headers your load \
                 balancer overwrites with StampedeLayer::trust_header"
            }
            Pass::ForwardingHeader(_) => {
                "a forwarding header spelled with underscores, which no load balancer \
                 overwrites: drop it before the layer"
            }
            Pass::NamedHeader(_) => "a header named with StampedeLayer::pass_header",
            Pass::MethodOverride | Pass::Body => {
                "a GET or HEAD the origin may not answer as one: sent to it untouched"
            }
            Pass::Private | Pass::NoStore | Pass::SetCookie => {
                "the response is private to its request, as it says"
            }
            Pass::NoCache => {
                "no-cache needs a validator (ETag, Last-Modified) and \
                 CacheBuilder::keep_for_revalidation"
            }
            Pass::Trailers | Pass::BodyError => {
                "the body ended with trailers, or failed: streamed through intact, not stored"
            }
            Pass::Status | Pass::VaryStar | Pass::TooManyTags | Pass::NotEncodable => {
                "the response cannot be stored as it is"
            }
            Pass::Uncacheable => "another request's load of the URL was not stored",
            Pass::Policy => "your Policy passed it",
            Pass::NoStoreRequest | Pass::ClientNoCache | Pass::Range | Pass::Precondition => {
                "the request asked for it"
            }
            Pass::NoKey => "your MakeKey could not describe the request",
        }
    }

    /// The header the rule names, if it names one.
    pub(crate) fn header(self) -> Option<&'static str> {
        match self {
            Pass::ForwardingHeader(name) | Pass::NamedHeader(name) => Some(name),
            _ => None,
        }
    }

    /// Whether the cache is configured not to handle the request (RFC 9211 §2.2's
    /// `fwd=bypass`): a safety rule of the layer's, or the operator's, rather than the
    /// request's own directives or what the response said of itself. Credentials count: the
    /// layer does not share what a signed-in user sent unless the response says it may.
    pub(crate) fn configured(self) -> bool {
        matches!(
            self,
            Pass::MethodOverride
                | Pass::Body
                | Pass::ForwardingHeader(_)
                | Pass::NamedHeader(_)
                | Pass::NoKey
                | Pass::Credentials
                | Pass::Policy
        )
    }

    /// The rule and its header, as `Cache-Status`'s `detail` says it: `rule` or
    /// `rule:header`. Header names are lowercase tokens, so this is an RFC 8941 Token (which
    /// allows `:`), as RFC 9211 §2.8 asks of `detail`.
    pub(crate) fn detail(self) -> String {
        match self.header() {
            Some(header) => format!("{}:{header}", self.rule()),
            None => self.rule().to_owned(),
        }
    }
}

/// A header name the operator configured, held for the life of the process so that a
/// [`Pass`] naming it stays `Copy`. Each distinct name is held once: their number is that of
/// the names ever given to `pass_header`, a handful.
pub(crate) fn interned(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = crate::sync::lock(NAMES.get_or_init(Mutex::default));
    if let Some(held) = names.get(name) {
        return held;
    }
    let held: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(held);
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_a_token_naming_the_rule_and_its_header() {
        assert_eq!(Pass::Credentials.detail(), "credentials");
        assert_eq!(
            Pass::ForwardingHeader("x_forwarded_host").detail(),
            "forwarding-header:x_forwarded_host"
        );
        assert_eq!(
            Pass::NamedHeader(interned("x-theme")).detail(),
            "pass-header:x-theme"
        );
        assert!(std::ptr::eq(interned("x-theme"), interned("x-theme")));
    }
}
