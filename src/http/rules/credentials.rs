//! Which credentials a request carries, as far as sharing its responses goes: `Authorization`
//! (RFC 9111 §3.5) and cookies, which most applications use to tell users apart and which the
//! layer treats the same way by default. The [`RfcPolicy`](crate::http::RfcPolicy) holds the
//! [`CookieRule`] (cookie names that personalise nothing); the layer keys requests with
//! credentials apart, and the policy stores a response to one only when the response says it
//! may be shared.

use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderMap;

/// The cookies that analytics and advertising scripts set, which personalise no page: ignored
/// unless [`RfcPolicy::ignore_analytics_cookies`](crate::http::RfcPolicy::ignore_analytics_cookies)
/// turns them off. Those that Varnish and CDN guides strip, each named as its script names
/// it (cookie names are case-sensitive): Google Analytics (`_ga`, `_ga_<id>`, `_gid`,
/// `_gat`, `_gat_<id>`, `_gac_<id>`, and urchin's `__utma`, `__utmb`, `__utmc`, `__utmt`,
/// `__utmv`, `__utmz`), Google Ads (`_gcl_<x>`), Meta (`_fbp`, `_fbc`), Hotjar (`_hj<x>`),
/// Microsoft Clarity (`_clck`, `_clsk`) and Ads (`_uetsid`, `_uetvid`), Segment
/// (`ajs_anonymous_id`, `ajs_user_id`, `ajs_group_id`) and Mixpanel (`mp_<token>_mixpanel`).
pub(crate) const ANALYTICS_COOKIES: Analytics = Analytics {
    exact: &[
        "_ga",
        "_gid",
        "_gat",
        "_fbp",
        "_fbc",
        "_clck",
        "_clsk",
        "_uetsid",
        "_uetvid",
        "ajs_anonymous_id",
        "ajs_user_id",
        "ajs_group_id",
    ],
    prefixes: &["_ga_", "_gat_", "_gac_", "__utm", "_gcl_", "_hj"],
    // Mixpanel's name holds the project's token: `mp_<token>_mixpanel`.
    framed: &[("mp_", "_mixpanel")],
};

/// Cookie names, by exact name, prefix, or prefix and suffix together.
#[derive(Debug)]
pub(crate) struct Analytics {
    exact: &'static [&'static str],
    prefixes: &'static [&'static str],
    framed: &'static [(&'static str, &'static str)],
}

impl Analytics {
    /// Whether a cookie named `name` is one of these.
    fn names(&self, name: &[u8]) -> bool {
        self.exact.iter().any(|exact| exact.as_bytes() == name)
            || self
                .prefixes
                .iter()
                .any(|prefix| name.len() > prefix.len() && name.starts_with(prefix.as_bytes()))
            || self.framed.iter().any(|(prefix, suffix)| {
                name.len() > prefix.len() + suffix.len()
                    && name.starts_with(prefix.as_bytes())
                    && name.ends_with(suffix.as_bytes())
            })
    }
}

/// Which cookies count as credentials: by default, every one but the
/// [analytics cookies](ANALYTICS_COOKIES).
#[derive(Clone, Debug)]
pub(crate) struct CookieRule {
    /// Names of cookies that do not personalise a response (analytics, consent).
    ignored: Vec<Box<[u8]>>,
    /// Whether the [analytics cookies](ANALYTICS_COOKIES) are ignored.
    ignore_analytics: bool,
    /// No cookie counts: the service's responses never depend on them.
    ignore_all: bool,
}

impl Default for CookieRule {
    fn default() -> Self {
        CookieRule {
            ignored: Vec::new(),
            ignore_analytics: true,
            ignore_all: false,
        }
    }
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

    /// Ignores the [analytics cookies](ANALYTICS_COOKIES), or counts them.
    pub(crate) fn ignore_analytics(&mut self, on: bool) {
        self.ignore_analytics = on;
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
                let name = name.trim_ascii();
                !(self.ignored.iter().any(|ignored| **ignored == *name)
                    || (self.ignore_analytics && ANALYTICS_COOKIES.names(name)))
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
    use crate::http::rules::tag_fields::tests::headers;

    #[test]
    fn every_cookie_counts_but_those_ignored() {
        // Without the analytics cookies, which the next test covers: an ignored name is
        // matched exactly.
        let mut rule = CookieRule::default();
        rule.ignore_analytics(false);
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

    #[test]
    fn analytics_cookies_count_for_nothing_unless_turned_off() {
        let mut rule = CookieRule::default();
        let of = |rule: &CookieRule, cookie| Credentials::of(&headers(&[("cookie", cookie)]), rule);
        for analytics in [
            "_ga=GA1.2.3; _gid=GA1.2.4",
            "_ga_ABC123=GS1; _gat=1; _gat_UA1=1; _gac_UA1=1",
            "__utma=1; __utmb=2; __utmc=3; __utmt=4; __utmv=5; __utmz=6",
            "_gcl_au=1; _fbp=fb.1; _fbc=fb.2; _hjSessionUser_1=x; _hjid=y",
            "_clck=a; _clsk=b; _uetsid=c; _uetvid=d",
            "ajs_anonymous_id=e; ajs_user_id=f; ajs_group_id=g; mp_0123abc_mixpanel=h",
        ] {
            assert!(!of(&rule, analytics).any(), "{analytics}");
        }
        for personal in [
            "_ga=1; session=alice",
            "_GA=1",
            "ga=1",
            "_ga_",
            "_hj",
            "mp_session=x",
            "mp__mixpanel=x",
            "ajs_user=x",
            "__ut=1",
        ] {
            assert!(of(&rule, personal).cookies, "{personal}");
        }
        rule.ignore_analytics(false);
        assert!(of(&rule, "_ga=GA1.2.3").cookies);
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
