//! The bound on invalidation by unsafe requests (RFC 9111 §4.4): at most one per URL per
//! [`interval`](crate::http::StampedeLayer::invalidation_interval) in each process, so that no
//! client, signed in or not, can empty a hot page at will, one `POST` each, and turn the cache
//! off for it.
//!
//! The first unsafe request of a URL invalidates it at once: the client that changed a
//! resource reads its change next. Those that follow within the interval are coalesced: one
//! invalidation, at the interval's end, for all of them, so that the last change is seen at
//! most one interval late, and a flood of `POST`s costs the origin one reload per interval
//! rather than one per request. Each says which it got (`detail=invalidated` or
//! `detail=invalidation-coalesced`).

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::remove::invalidate_keys;
use crate::cache::Cache;

/// How many URLs the bound is kept for, the least recently used forgotten first (a forgotten
/// URL's next invalidation goes at once; a coalesced one already waiting still goes).
const URLS: u64 = 10_000;

/// What an unsafe request's invalidation became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invalidated {
    /// Now, before its response is sent on.
    Now,
    /// With the others of its interval, at the interval's end.
    Coalesced,
}

/// The invalidation windows of each URL, in this process. Cheap to clone (the clones share
/// them).
#[derive(Clone)]
pub(crate) struct Invalidations {
    interval: Duration,
    windows: moka::sync::Cache<u64, Arc<Mutex<Window>>>,
    hasher: std::collections::hash_map::RandomState,
}

/// One URL's window: until when its next invalidation must wait, and the keys of the one
/// waiting for that, if one is.
struct Window {
    until: Instant,
    waiting: Option<Vec<String>>,
}

impl std::fmt::Debug for Invalidations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invalidations")
            .field("interval", &self.interval)
            .field("urls", &self.windows.entry_count())
            .finish()
    }
}

impl Invalidations {
    /// At most one invalidation per URL per `interval` (zero: each goes at once).
    pub(crate) fn new(interval: Duration) -> Self {
        Invalidations {
            interval,
            windows: moka::sync::Cache::builder()
                .max_capacity(URLS)
                .time_to_idle(interval.max(Duration::from_secs(1)) * 2)
                .build(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Invalidates `keys` (the first is the URL's own), now if the URL's interval allows,
    /// else with the others of its interval at its end; says which.
    pub(crate) async fn invalidate(&self, cache: &Cache, keys: Vec<String>) -> Invalidated {
        let Some(url) = keys.first() else {
            return Invalidated::Now;
        };
        if self.interval.is_zero() {
            now(cache, keys).await;
            return Invalidated::Now;
        }
        let window = self
            .windows
            .get_with(self.hasher.hash_one(url), Arc::default);
        let at = Instant::now();
        let wait_until = {
            let mut window = crate::sync::lock(&window);
            if at >= window.until && window.waiting.is_none() {
                window.until = at + self.interval;
                None
            } else if let Some(waiting) = &mut window.waiting {
                for key in keys.iter() {
                    if !waiting.contains(key) {
                        waiting.push(key.clone());
                    }
                }
                return Invalidated::Coalesced;
            } else {
                window.waiting = Some(keys.clone());
                Some(window.until)
            }
        };
        let Some(until) = wait_until else {
            now(cache, keys).await;
            return Invalidated::Now;
        };
        let (cache, interval) = (cache.clone(), self.interval);
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let keys = {
                let mut window = crate::sync::lock(&window);
                window.until = Instant::now() + interval;
                window.waiting.take()
            };
            if let Some(keys) = keys {
                now(&cache, keys).await;
            }
        });
        Invalidated::Coalesced
    }
}

impl Default for Window {
    fn default() -> Self {
        Window {
            until: Instant::now(),
            waiting: None,
        }
    }
}

/// Invalidates `keys` now; a store that cannot be reached is logged.
async fn now(cache: &Cache, keys: Vec<String>) {
    if let Err(error) = invalidate_keys(cache, keys).await {
        // The URL may hold credentials in its query: not logged.
        warn!(
            error = &error as &dyn std::error::Error,
            "the stored responses of a changed URL could not be invalidated"
        );
    }
}
