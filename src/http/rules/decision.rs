//! What a [`Policy`](crate::http::Policy) decides for a response: [`Decision`], and the
//! [`Staleness`] of a stored one.

use std::time::Duration;

/// What the layer does with a response from the inner service; see [`Policy`](crate::http::Policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Store the response, fresh for this long from now (0 is the same as [`Pass`](Self::Pass)).
    /// Past its freshness it may be served under the cache's own
    /// [`stale`](crate::CacheBuilder::stale) windows.
    Store(Duration),
    /// Store the response, fresh for `fresh_for` from now, with stale rules of its own. A
    /// freshness of 0 stores a response that is never served without revalidating it first
    /// (`no-cache`), if the cache keeps values for revalidation
    /// ([`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)); otherwise it
    /// is passed.
    StoreWith {
        /// How long the response is fresh.
        fresh_for: Duration,
        /// How it may be served once it is not.
        stale: Staleness,
    },
    /// Hand the response to the request that loaded it and store nothing; the requests
    /// waiting for it go to the inner service themselves (a short "pass" marker tells
    /// them, see [`pass_ttl`](crate::CacheBuilder::pass_ttl)), unless the policy says it may
    /// still go to them ([`Policy::shares_with_waiters`](crate::http::Policy::shares_with_waiters)).
    Pass,
    /// A failed load that is private to its request: hand the response to the request that
    /// loaded it, store nothing, and answer the requests waiting for it with a stale response
    /// if there is one (see [`stale_if_error`](crate::CacheBuilder::stale_if_error)), else the
    /// layer's own `502 Bad Gateway`, for the [`failure_ttl`](crate::CacheBuilder::failure_ttl).
    /// [`RfcPolicy`](crate::http::RfcPolicy) says so of a server error with `no-store`, `private` or `Set-Cookie`, or
    /// to a request with credentials it may not share.
    Fail,
    /// A failed load whose response may go to others (a server error without explicit
    /// freshness): store nothing, and hand the origin's response (status, headers, body) to the
    /// request that loaded it and to the requests that waited for this load, in every process;
    /// a request that comes after the load ended loads again (one load at a time, as for any
    /// miss). A stale response stands in for it where
    /// [`stale_if_error`](crate::CacheBuilder::stale_if_error) allows. A body over
    /// [`max_body_bytes`](crate::http::StampedeLayer::max_body_bytes) cannot be shared: the waiting
    /// requests then get the layer's own `502 Bad Gateway`, as for [`Fail`](Self::Fail).
    Share,
}

impl Decision {
    /// The decision with [`Store`](Self::Store) written out: `Store(d)` is
    /// `StoreWith { fresh_for: d, stale: Staleness::cache_default() }`, and `Store` of 0 is
    /// `Pass`. The layer acts on this form only, so the two spellings cannot drift apart.
    pub(crate) fn in_full(self) -> Decision {
        match self {
            Decision::Store(fresh_for) if fresh_for.is_zero() => Decision::Pass,
            Decision::Store(fresh_for) => Decision::StoreWith {
                fresh_for,
                stale: Staleness::cache_default(),
            },
            decision => decision,
        }
    }
}

/// How a stored response may be served past its freshness: its own stale-while-revalidate
/// and stale-if-error windows (RFC 5861 §3, §4; `None`: the cache's), within the layer's
/// [`max_response_stale`](crate::http::StampedeLayer::max_response_stale).
/// [`must_revalidate`](Self::must_revalidate) forbids both (RFC 9111 §4.2.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Staleness {
    /// How long past its freshness the response may be served while a reload revalidates it.
    pub while_revalidating: Option<Duration>,
    /// How long past its freshness the response may stand in for a reload that failed.
    pub if_error: Option<Duration>,
}

impl Staleness {
    /// The cache's windows: the response says nothing of its own.
    pub fn cache_default() -> Self {
        Staleness::default()
    }

    /// Never served stale: `must-revalidate`, `proxy-revalidate`, `s-maxage`, `no-cache`.
    pub fn must_revalidate() -> Self {
        Staleness {
            while_revalidating: Some(Duration::ZERO),
            if_error: Some(Duration::ZERO),
        }
    }

    /// With a stale-while-revalidate window of its own.
    #[must_use]
    pub fn while_revalidating(mut self, window: Duration) -> Self {
        self.while_revalidating = Some(window);
        self
    }

    /// With a stale-if-error window of its own.
    #[must_use]
    pub fn if_error(mut self, window: Duration) -> Self {
        self.if_error = Some(window);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_is_store_with_the_cache_s_staleness_and_0_is_a_pass() {
        let minute = Duration::from_secs(60);
        assert_eq!(
            Decision::Store(minute).in_full(),
            Decision::StoreWith {
                fresh_for: minute,
                stale: Staleness::cache_default(),
            }
        );
        assert_eq!(Decision::Store(Duration::ZERO).in_full(), Decision::Pass);
        let no_cache = Decision::StoreWith {
            fresh_for: Duration::ZERO,
            stale: Staleness::must_revalidate(),
        };
        for kept in [no_cache, Decision::Pass, Decision::Fail, Decision::Share] {
            assert_eq!(kept.in_full(), kept);
        }
    }
}
