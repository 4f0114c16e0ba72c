//! What becomes of a loaded response beyond its own request's answer ([`Outlet`]): stored,
//! or handed to the requests that waited for its load; and the layer's limits that decide it
//! (the policy's decision made whole, the header and relay limits, the entry to store).

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;

use crate::cache::{Cache, Loaded};
use crate::http::rules::decision::{Decision, Staleness};
use crate::http::rules::pass::Pass;
use crate::http::serving::config::HttpConfig;

/// What becomes of a response the policy lets go beyond its own request.
#[derive(Clone, Copy)]
pub(super) enum Outlet {
    /// Stored, fresh for this long.
    Store(Duration),
    /// Not stored: handed to the requests that waited for its load, here and elsewhere.
    /// `failed`: a server error, for which a stale response may stand in, and which fails its
    /// waiters where it cannot be handed to them.
    Waiters { failed: bool },
}

impl HttpConfig {
    /// What the policy decides for `response`, [in full](Decision::in_full), and why if it
    /// is not stored: a freshness of 0 is stored only with stale rules of its own, and only
    /// where `cache` keeps values to revalidate them.
    pub(super) fn decide(
        &self,
        cache: &Cache,
        asked: &http::request::Parts,
        response: &http::response::Parts,
    ) -> (Decision, Pass) {
        let (decision, why) = self.judge(asked, response);
        match decision.in_full() {
            Decision::StoreWith { fresh_for, .. }
                if fresh_for.is_zero() && cache.keep().is_zero() =>
            {
                (Decision::Pass, why)
            }
            decision => (decision, why),
        }
    }

    /// Whether a body over the size limit, of which the origin says `hint`, is relayed to the
    /// requests that waited for its load (see [`relay`](super::relay)).
    pub(super) fn relays(&self, hint: http_body::SizeHint) -> bool {
        self.max_relay_bytes > 0 && hint.lower() <= self.max_relay_bytes as u64
    }

    /// Whether a response's header fields are within
    /// [`max_header_bytes`](crate::http::StampedeLayer::max_header_bytes).
    pub(super) fn headers_fit(&self, headers: &HeaderMap) -> bool {
        let mut bytes = 0usize;
        headers.iter().all(|(name, value)| {
            bytes = bytes.saturating_add(name.as_str().len() + value.len() + 4);
            bytes <= self.max_header_bytes
        })
    }

    /// A response's entry to store for `ttl`, with its stale windows (within the layer's
    /// maximum) and tags.
    pub(super) fn to_store(
        &self,
        entry: Bytes,
        ttl: Duration,
        stale: Staleness,
        tags: &[Vec<u8>],
    ) -> Loaded {
        let max = self.max_response_stale;
        let mut loaded = exactly(entry, ttl).tags(tags);
        if let Some(window) = stale.while_revalidating {
            loaded = loaded.stale_while_revalidate(window.min(max));
        }
        if let Some(window) = stale.if_error {
            loaded = loaded.stale_if_error(window.min(max));
        }
        loaded
    }
}

/// An entry to store fresh for `ttl` exactly: a response's freshness is the origin's (RFC 9111
/// §4.2.1), which the cache's TTL jitter must not lengthen.
pub(super) fn exactly(entry: Bytes, ttl: Duration) -> Loaded {
    Loaded::value_with_ttl(entry, ttl).ttl_jitter(Duration::ZERO)
}
