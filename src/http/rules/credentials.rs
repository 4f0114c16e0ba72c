//! Which credentials a request carries, as far as sharing its responses goes: `Authorization`
//! (RFC 9111 §3.5) and cookies, which most applications use to tell users apart and which the
//! layer treats the same way by default. The [`RfcPolicy`](crate::http::RfcPolicy) holds the
//! [`CookieRule`] (cookie names that personalise nothing); the layer keys requests with
//! credentials apart, and the policy stores a response to one only when the response says it
//! may be shared.

use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderMap;

/// Which cookies count as credentials: by default, every one.
#[derive(Clone, Debug, Default)]
pub(crate) struct CookieRule {
    /// Names of cookies that do not personalise a response (analytics, consent).
    ignored: Vec<Box<[u8]>>,
    /// No cookie counts: the service's responses never depend on them.
    ignore_all: bool,
}

impl CookieRule {
    /// Ignores cookies named `name` (compared byte for byte, as cookie names are).
    pub(crate) fn ignore(&mut self, name: &str) {
        let name: Box<[u8]> = name.trim().as_bytes().into();
        if !self.ignored.contains(&name) {
            self.ignored.push(name);
        }
    }

    /// Ignores every cookie, or none but those named.
    pub(crate) fn ignore_all(&mut self, on: bool) {
        self.ignore_all = on;
    }

    /// Whether `headers` hold a cookie this rule does not ignore. A cookie is a `;`-separated
    /// member of any `Cookie` field line (RFC 6265 §4.2.1, and RFC 9113 §8.2.3 for HTTP/2's
    /// split lines); its name is what comes before `=`. An empty member is no cookie. A `,`
    /// separates members too: RFC 2965 §3.3.4 allowed it, some origins still read
    /// `_ga=1,session=x` as two cookies, and no ignored cookie may hide a personal one (a `,`
    /// in a value only makes the request count as one with credentials).
    fn counts(&self, headers: &HeaderMap) -> bool {
        if self.ignore_all {
            return false;
        }
        headers
            .get_all(COOKIE)
            .iter()
            .flat_map(|line| line.as_bytes().split(|&b| b == b';' || b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|member| !member.is_empty())
            .any(|member| {
                let name = member.split(|&b| b == b'=').next().unwrap_or(member);
                !self
                    .ignored
                    .iter()
                    .any(|ignored| **ignored == *name.trim_ascii())
            })
    }
}

/// The credentials a request carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// It has `Authorization`.
    pub(crate) authorization: bool,
    /// It has a cookie that the [`CookieRule`] does not ignore.
    pub(crate) cookies: bool,
}

impl Credentials {
    /// The credentials in a request's `headers`.
    pub(crate) fn of(headers: &HeaderMap, cookies: &CookieRule) -> Self {
        Credentials {
            authorization: headers.contains_key(AUTHORIZATION),
            cookies: cookies.counts(headers),
        }
    }

    /// The credentials in a request's `headers` when every cookie counts.
    pub(crate) fn any_in(headers: &HeaderMap) -> bool {
        headers.contains_key(AUTHORIZATION) || headers.contains_key(COOKIE)
    }

    /// Whether there are any: the request is keyed apart from those without.
    pub(crate) fn any(self) -> bool {
        self.authorization || self.cookies
    }

    /// Whether a response to the request may be stored. Without credentials, yes. With them,
    /// the response must say it may be shared (`shared`: `public`, `s-maxage`,
    /// `must-revalidate`; RFC 9111 §3.5). `Authorization` alone may also be shared by the
    /// operator's choice (`share_authorized`); cookies alone by a response that varies on
    /// `Cookie`, which is then stored per cookie value and never reaches another user.
    pub(crate) fn allow(
        self,
        shared: bool,
        share_authorized: bool,
        varies_on_cookie: bool,
    ) -> bool {
        (!self.authorization || shared || share_authorized)
            && (!self.cookies || shared || varies_on_cookie)
    }

    /// Whether a response to the request may be given a freshness it does not state (a
    /// default TTL): only without credentials, or with `Authorization` the operator shares.
    /// A response for a user is stored only for as long as it says.
    pub(crate) fn may_invent_freshness(self, share_authorized: bool) -> bool {
        !self.cookies && (!self.authorization || share_authorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::invalidation::tag_fields::tests::headers;

    #[test]
    fn every_cookie_counts_but_those_ignored() {
        let mut rule = CookieRule::default();
        let of = |rule: &CookieRule, pairs| Credentials::of(&headers(pairs), rule);
        assert!(!of(&rule, &[]).any());
        assert!(!of(&rule, &[("cookie", ""), ("cookie", " ; ")]).any());
        assert!(of(&rule, &[("cookie", "_ga=1")]).cookies);
        assert!(of(&rule, &[("cookie", "flag")]).cookies, "a name alone");
        rule.ignore("_ga");
        rule.ignore(" consent ");
        assert!(!of(&rule, &[("cookie", "_ga=1; consent=yes")]).any());
        assert!(!of(&rule, &[("cookie", "_ga=1"), ("cookie", "consent=a=b")]).any());
        assert!(!of(&rule, &[("cookie", "_ga=1, consent=yes,")]).any());
        for personal in [
            &[("cookie", "_ga=1; session=alice")][..],
            &[("cookie", "_ga=1"), ("cookie", "session=alice")],
            &[("cookie", "_GA=1")],
            &[("cookie", "_ga_x=1")],
            &[("cookie", "=alice")],
            &[("cookie", "_ga=1,session=alice")],
        ] {
            assert!(of(&rule, personal).cookies, "{personal:?}");
        }
        rule.ignore_all(true);
        assert!(!of(&rule, &[("cookie", "session=alice")]).any());
        assert!(of(&rule, &[("authorization", "Bearer a")]).authorization);
    }

    /// RFC 9111 §3.5 for `Authorization`, and the same for cookies, but for `Vary: Cookie`.
    #[test]
    fn credentials_need_the_response_to_allow_sharing() {
        let none = Credentials::default();
        let authorization = Credentials {
            authorization: true,
            cookies: false,
        };
        let cookies = Credentials {
            authorization: false,
            cookies: true,
        };
        let both = Credentials {
            authorization: true,
            cookies: true,
        };
        assert!(none.allow(false, false, false) && none.may_invent_freshness(false));
        for credentials in [authorization, cookies, both] {
            assert!(!credentials.allow(false, false, false), "{credentials:?}");
            assert!(credentials.allow(true, false, false), "{credentials:?}");
            assert!(!credentials.may_invent_freshness(false), "{credentials:?}");
        }
        assert!(authorization.allow(false, true, false));
        assert!(authorization.may_invent_freshness(true));
        assert!(!authorization.allow(false, false, true));
        assert!(cookies.allow(false, false, true));
        assert!(!cookies.allow(false, true, false));
        assert!(!cookies.may_invent_freshness(true));
        for one_permission in [(true, false), (false, true)] {
            let (share_authorized, varies_on_cookie) = one_permission;
            assert!(
                !both.allow(false, share_authorized, varies_on_cookie),
                "each needs its own permission: {one_permission:?}"
            );
        }
    }
}
