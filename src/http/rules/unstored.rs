//! Which responses that [`RfcPolicy`](super::RfcPolicy) does not store may still go to the requests that waited
//! for their load: those it could have stored with freshness of its own making.
//!
//! RFC 9111 §4 lets a cache "use a response that is stored or storable to satisfy multiple
//! requests, provided that it is allowed to reuse that response for the requests in question"
//! (request collapsing). A response is storable by a shared cache (§3) when nothing forbids it
//! (`no-store`, `private`, a request with credentials, §3.5) and its status is heuristically
//! cacheable; such a response without explicit freshness may be given heuristic freshness
//! (§4.2.2), which the requests that arrived during its load (its age: its own load time) are
//! well within. `no-cache` (§5.2.2.4) asks for validation before any reuse, and an explicit
//! freshness of 0 (`max-age=0`, an `Expires` in the past) makes it stale at once (§4.2): those
//! are not collapsed. Nor is a `Set-Cookie` (the layer never shares one) or `Vary: *`.
//!
//! What it changes: a response generated for one request is served to the others that
//! arrived during its load, as a stored one would be; it is not kept, so a request after the
//! load goes to the origin again.

use http::header::{EXPIRES, SET_COOKIE};
use http::{response, StatusCode};

use super::methods::cacheable_by_default;
use super::parse::{self, Directive};

/// Whether `response`, which [`RfcPolicy`](super::RfcPolicy) does not store, may go to the
/// requests that waited for its load to a request (`credentialed` if it carried credentials);
/// `directives`, the policy's reading of its freshness fields, and whether `Expires` counts
/// beside them; see the [module docs](self).
pub(super) fn goes_to_waiters(
    credentialed: bool,
    (directives, expires_counts): (Vec<Directive>, bool),
    response: &response::Parts,
) -> bool {
    let (status, headers) = (response.status, &response.headers);
    if credentialed
        || !cacheable_by_default(status)
        || status == StatusCode::PARTIAL_CONTENT
        || headers.contains_key(SET_COOKIE)
        || matches!(parse::vary(headers), parse::Vary::Unkeyable)
    {
        return false;
    }
    let forbids = |Directive { name, .. }: &Directive| {
        matches!(
            name.as_str(),
            "no-store" | "private" | "no-cache" | "max-age" | "s-maxage"
        )
    };
    // The directives of `Cache-Control` too where a targeted field governs: the stricter
    // reading, for a response that is not stored at all.
    let forbidden = directives.iter().any(forbids)
        || parse::directives(headers).any(|directive| forbids(&directive))
        || (expires_counts && headers.contains_key(EXPIRES));
    !forbidden
}

#[cfg(test)]
mod tests {
    use http::{request, Request, Response};

    use super::*;
    use crate::http::rules::{Decision, Policy, RfcPolicy};

    /// Header fields, as name and value.
    type Fields<'a> = &'a [(&'a str, &'a str)];

    fn parts(
        request: &[(&str, &str)],
        status: u16,
        response: &[(&str, &str)],
    ) -> (request::Parts, response::Parts) {
        let mut asked = Request::get("/").body(()).unwrap();
        for (name, value) in request {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            asked.headers_mut().append(name, value.parse().unwrap());
        }
        let mut answer = Response::new(());
        *answer.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in response {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            answer.headers_mut().append(name, value.parse().unwrap());
        }
        (asked.into_parts().0, answer.into_parts().0)
    }

    /// RFC 9111 §3, §3.5, §4, §4.2, §4.2.2, §5.2.2.4: what goes to the waiters of a load that
    /// stored nothing. Each case is one the policy does not store.
    #[test]
    fn only_a_response_that_could_be_stored_goes_to_the_waiters() {
        let policy = RfcPolicy::new().ignore_cookie("_ga");
        let cases: [(Fields, u16, Fields, bool); 16] = [
            (&[], 200, &[], true),
            (&[], 404, &[("vary", "accept-language")], true),
            (&[("cookie", "_ga=1")], 200, &[], true),
            (&[], 200, &[("cache-control", "public")], true),
            (&[], 200, &[("cache-control", "must-revalidate")], true),
            (&[("cookie", "session=1")], 200, &[], false),
            (&[("authorization", "Bearer a")], 200, &[], false),
            (&[], 200, &[("cache-control", "private")], false),
            (&[], 200, &[("cache-control", "no-store")], false),
            (&[], 200, &[("cache-control", "no-cache")], false),
            (&[], 200, &[("cache-control", "max-age=0")], false),
            (&[], 200, &[("expires", "0")], false),
            (&[], 200, &[("set-cookie", "a=1")], false),
            (&[], 200, &[("vary", "*")], false),
            (&[], 302, &[], false),
            (&[], 200, &[("cdn-cache-control", "no-store")], false),
        ];
        for (asked, status, answered, goes) in cases {
            let (request, response) = parts(asked, status, answered);
            assert!(
                !matches!(
                    policy.decide(&request, &response),
                    Decision::Store(_) | Decision::StoreWith { .. }
                ),
                "{asked:?} {status} {answered:?} is stored"
            );
            assert_eq!(
                policy.shares_with_waiters(&request, &response),
                goes,
                "{asked:?} {status} {answered:?}"
            );
        }
        // A policy that stores nothing of its own says no by default.
        let closure = |_: &request::Parts, _: &response::Parts| Decision::Pass;
        let (request, response) = parts(&[], 200, &[]);
        assert!(!closure.shares_with_waiters(&request, &response));
    }
}
