//! Early refresh (XFetch, Vattani et al., VLDB 2015): a hit on a value close to its expiry
//! may refresh it in the background, so that a hot key is reloaded by one caller a little
//! ahead of its expiry and nobody waits for it. One refresh per key runs in a process at a
//! time ([`Refreshing`]); across processes, the reload lock lets one of them load.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::entry::Entry;
use super::flight::BoxLoader;
use super::follower::{wait_for_fill, Backoff};
use super::leader::{spawn_release, Seen};
use super::telemetry::{self, LockEvent};
use super::Inner;
use crate::store::{KeyDigest, LockState, LockToken, LockWhen, StoreKey};

/// How much later than this process reckons the store may still call the value it early
/// refreshes due (the store's clock is read a round trip away).
const EARLY_REFRESH_SLACK: Duration = Duration::from_millis(5);

/// XFetch's test: whether a value with `left` until its expiry, whose load took `load_time`,
/// is refreshed now, with `β` = `beta` and `draw` giving a uniform number in [0, 1): when
/// `δ·β·(−ln u) ≥ left`, with `δ` the load time (at least 1 ms) and `u` = 1 − the draw.
fn xfetch_due(left: Duration, load_time: Duration, beta: f64, draw: impl FnOnce() -> f64) -> bool {
    if beta <= 0.0 {
        return false;
    }
    let delta = load_time.max(Duration::from_millis(1)).as_secs_f64() * beta;
    // −ln u is at most about 37 for a 53-bit u: far from expiry, skip the draw.
    let longest = Duration::try_from_secs_f64(delta * 37.0).unwrap_or(Duration::MAX);
    if longest < left {
        return false;
    }
    let u = 1.0 - draw();
    let gap = Duration::try_from_secs_f64(-delta * u.ln()).unwrap_or(Duration::MAX);
    gap >= left
}

/// Marks an early refresh of a key as over when dropped, however its task ends.
struct Refreshing {
    inner: Arc<Inner>,
    digest: KeyDigest,
}

impl Drop for Refreshing {
    fn drop(&mut self) {
        crate::sync::lock(&self.inner.refreshing).remove(&self.digest);
    }
}

impl Inner {
    /// XFetch: whether a hit on a value fresh until `fresh_until`, whose load took
    /// `load_time`, should refresh it early.
    pub(super) fn early_refresh_due(&self, fresh_until: Instant, load_time: Duration) -> bool {
        let left = fresh_until.saturating_duration_since(Instant::now());
        xfetch_due(
            left,
            load_time,
            self.config.early_refresh_beta,
            rand::random::<f64>,
        )
    }

    /// Starts an early refresh of the value of `digest` that is fresh until `fresh_until`, in
    /// the background, unless one is running in this process.
    pub(super) fn refresh_early(
        self: &Arc<Self>,
        digest: KeyDigest,
        loader: BoxLoader,
        fresh_until: Instant,
    ) {
        if !crate::sync::lock(&self.refreshing).insert(digest) {
            return;
        }
        self.counters
            .early_refreshes
            .fetch_add(1, Ordering::Relaxed);
        let refreshing = Refreshing {
            inner: Arc::clone(self),
            digest,
        };
        tokio::spawn(async move {
            refreshing.inner.refresh(digest, loader, fresh_until).await;
            drop(refreshing);
        });
    }

    /// An early refresh of the value that is fresh until `fresh_until`: takes the lock if the
    /// store still holds that value (not a newer one, refreshed by another process) and no one
    /// else holds the lock, then leads as any reload does. If another process is refreshing
    /// it, waits for that fill (while the value is still fresh) and takes the new value into
    /// L1, so this process does not start refresh after refresh meanwhile.
    async fn refresh(&self, digest: KeyDigest, loader: BoxLoader, fresh_until: Instant) {
        let config = &self.config;
        let key = StoreKey::new(Arc::clone(&config.namespace), digest);
        let token = LockToken::random();
        // The store's remaining life of that value, give or take a round trip: a newer value
        // has a whole TTL left.
        let below = config
            .keep()
            .saturating_add(fresh_until.saturating_duration_since(Instant::now()))
            .saturating_add(EARLY_REFRESH_SLACK);
        let mut filled = self.watch_fills(&key);
        let mut backoff = Backoff::new(config);
        let mut fresh_until = None;
        loop {
            let stamp = self.stamp(&digest);
            let found = match self
                .look_up(
                    &key,
                    token,
                    LockWhen::Early {
                        life: below,
                        fresh_above: config.keep(),
                    },
                    loader.reader,
                    &mut filled,
                )
                .await
            {
                Ok(found) => found,
                Err(error) => {
                    debug!(%error, key = ?digest, "early refresh: store lookup failed");
                    if !error.skipped() {
                        spawn_release(&self.store, &key, token);
                    }
                    return;
                }
            };
            let tagged = found.tagged();
            match (found.lock, found.entry) {
                (LockState::Acquired, _) => {
                    telemetry::lock(LockEvent::Acquired);
                    debug!(key = ?digest, "refreshing early");
                    let seen = Seen {
                        stamp,
                        tagged,
                        speculative: true,
                    };
                    if let Err(error) = self.lead(seen, key, token, loader, None, None).await {
                        warn!(key = ?digest, error = &error as &dyn std::error::Error, "early refresh failed");
                    }
                    return;
                }
                (
                    LockState::NotRequested,
                    Some((
                        Ok(Entry::Value {
                            payload, load_time, ..
                        }),
                        ttl,
                    )),
                ) => {
                    // Refreshed by another process: take its value.
                    let fresh_for = ttl.unwrap_or_default().saturating_sub(config.keep());
                    self.l1_insert(
                        stamp,
                        found.tag_stamps,
                        digest,
                        payload,
                        fresh_for,
                        load_time,
                    )
                    .await;
                    return;
                }
                (LockState::HeldElsewhere, Some((_, ttl))) => {
                    // Being refreshed elsewhere: follow it while the value is fresh.
                    let until = *fresh_until.get_or_insert_with(|| {
                        Instant::now() + ttl.unwrap_or_default().saturating_sub(config.keep())
                    });
                    let now = Instant::now();
                    if now >= until {
                        return;
                    }
                    let _ = wait_for_fill(&mut filled, backoff.pause().min(until - now)).await;
                }
                // Gone, or recently failed: ordinary flights deal with it.
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn never_drawn() -> f64 {
        panic!("no draw expected")
    }

    #[test]
    fn a_zero_or_negative_beta_never_refreshes() {
        assert!(!xfetch_due(Duration::ZERO, MS * 100, 0.0, never_drawn));
        assert!(!xfetch_due(Duration::ZERO, MS * 100, -1.0, never_drawn));
    }

    #[test]
    fn far_from_expiry_there_is_no_draw() {
        // δ·β = 100 ms: no draw can reach 37 × 100 ms.
        assert!(!xfetch_due(MS * 3800, MS * 100, 1.0, never_drawn));
    }

    #[test]
    fn an_expired_value_is_always_due() {
        assert!(xfetch_due(Duration::ZERO, MS * 100, 1.0, || 0.0));
        assert!(xfetch_due(Duration::ZERO, Duration::ZERO, 1.0, || 0.999));
    }

    #[test]
    fn the_draw_decides_near_expiry() {
        // u = e^-1 gives a gap of exactly δ·β: due when δ·β is at least what is left.
        let draw = || 1.0 - (-1.0f64).exp();
        assert!(xfetch_due(MS * 90, MS * 100, 1.0, draw));
        assert!(!xfetch_due(MS * 110, MS * 100, 1.0, draw));
        // β scales δ.
        assert!(xfetch_due(MS * 190, MS * 100, 2.0, draw));
        // A load time under 1 ms counts as 1 ms.
        assert!(xfetch_due(
            Duration::from_micros(900),
            Duration::ZERO,
            1.0,
            draw
        ));
        assert!(!xfetch_due(MS * 2, Duration::ZERO, 1.0, draw));
        // u = 1 (a draw of 0) never comes early.
        assert!(!xfetch_due(MS, MS * 100, 1.0, || 0.0));
    }
}
