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

/// How many load times ahead of its expiry a refresh starts at the least.
const MARGIN: f64 = 1.1;

/// How long before its expiry a value whose load took `load_time` (δ, at least 1 ms) is
/// refreshed, for `β` = `beta` and `draw` a uniform number in [0, 1): `δ·(1.1 + β·(−ln u))`
/// with `u` = 1 − the draw, or `None` when β is not positive (no early refresh). A tenth more
/// than one load time ahead, so a refresh as long as the last load ends before the value does
/// (exactly one load time would tie with it); `β` scales a random share of mean `δ·β` on top,
/// which spreads refreshes (XFetch, Vattani et al., VLDB 2015, with one draw per
/// value instead of one per request).
fn lead_time(load_time: Duration, beta: f64, draw: impl FnOnce() -> f64) -> Option<Duration> {
    lead(load_time, beta, || -(1.0 - draw()).ln())
}

/// `δ·(1.1 + β·x)` for `x` = `neg_ln_u()` (taken only when β is positive), as [`lead_time`]
/// reckons it; `None` when β is not positive.
fn lead(load_time: Duration, beta: f64, neg_ln_u: impl FnOnce() -> f64) -> Option<Duration> {
    if beta <= 0.0 || beta.is_nan() {
        return None;
    }
    let delta = load_time.max(Duration::from_millis(1)).as_secs_f64();
    Some(Duration::try_from_secs_f64(delta * (MARGIN + beta * neg_ln_u())).unwrap_or(Duration::MAX))
}

/// More than the most `−ln u` can be in [`lead_time`]: `u` is at least 2⁻⁵³ (one less a draw
/// of `rand`'s 53-bit floats in [0, 1)), and 53·ln 2 is about 36.74.
const MOST_NEG_LN: f64 = 37.0;

/// Whether a value fresh for `fresh_for` more, whose load took `load_time`, may be due for an
/// early refresh: whether the longest lead [`lead_time`] can draw reaches it. Where it cannot
/// (most hits: a value is seldom within a few load times of its expiry), nothing need be
/// drawn.
fn may_be_due(fresh_for: Duration, load_time: Duration, beta: f64) -> bool {
    lead(load_time, beta, || MOST_NEG_LN).is_some_and(|longest| fresh_for <= longest)
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
    /// When a value fresh until `fresh_until`, whose load took `load_time`, is refreshed
    /// early (see [`lead_time`]): drawn once per value and process, when the value is read from
    /// the store, so the rate of hits does not change it. `None` without early refresh.
    pub(super) fn refresh_point(
        &self,
        fresh_until: Instant,
        load_time: Duration,
    ) -> Option<Instant> {
        let lead = lead_time(
            load_time,
            self.config.early_refresh_beta,
            rand::random::<f64>,
        )?;
        Some(fresh_until.checked_sub(lead).unwrap_or_else(Instant::now))
    }

    /// Whether a value read at `now`, fresh until `fresh_until`, whose load took `load_time`,
    /// is due for an early refresh: its [`refresh_point`](Self::refresh_point) is past, drawn
    /// only where a draw could make it so.
    pub(super) fn refresh_due(
        &self,
        now: Instant,
        fresh_until: Instant,
        load_time: Duration,
    ) -> bool {
        let fresh_for = fresh_until.saturating_duration_since(now);
        may_be_due(fresh_for, load_time, self.config.early_refresh_beta)
            && self
                .refresh_point(fresh_until, load_time)
                .is_some_and(|at| now >= at)
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
            let reader = loader.reader();
            let found = match self
                .look_up(
                    Instant::now(),
                    &key,
                    token,
                    LockWhen::Early {
                        life: below,
                        fresh_above: config.keep(),
                    },
                    reader,
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
                    // The leader waits for no fill: its watch (which borrows the key) ends.
                    drop(filled);
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
                        &payload,
                        fresh_for,
                        load_time,
                    );
                    return;
                }
                (LockState::HeldElsewhere, Some((_, ttl))) => {
                    // Being refreshed elsewhere: follow it while the value is fresh.
                    let until = *fresh_until.get_or_insert_with(|| {
                        crate::sync::later(
                            Instant::now(),
                            ttl.unwrap_or_default().saturating_sub(config.keep()),
                        )
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
    fn a_zero_negative_or_nan_beta_never_refreshes() {
        for beta in [0.0, -1.0, f64::NAN] {
            assert_eq!(lead_time(MS * 100, beta, never_drawn), None);
        }
    }

    #[test]
    fn more_than_one_load_time_ahead_and_beta_scales_the_rest() {
        let near = |got: Option<Duration>, want: Duration| {
            let got = got.unwrap();
            assert!(
                got.abs_diff(want) < Duration::from_micros(10),
                "{got:?} {want:?}"
            );
        };
        // u = 1 (a draw of 0): a tenth more than one load time.
        near(lead_time(MS * 100, 1.0, || 0.0), MS * 110);
        // u = e^-1: one more load time times β.
        let draw = || 1.0 - (-1.0f64).exp();
        near(lead_time(MS * 100, 1.0, draw), MS * 210);
        near(lead_time(MS * 100, 2.0, draw), MS * 310);
        // A load time under 1 ms counts as 1 ms.
        near(
            lead_time(Duration::ZERO, 1.0, draw),
            Duration::from_micros(2100),
        );
        // The largest draw is bounded, never a panic.
        assert!(lead_time(MS * 100, f64::MAX, || 0.999_999).is_some());
    }

    #[test]
    fn no_draw_is_needed_where_none_could_make_a_value_due() {
        // The largest draw `rand` makes: u = 2^-53.
        let largest = || 1.0 - f64::EPSILON / 2.0;
        for (load_ms, beta) in [(0, 1.0), (100, 1.0), (100, 4.0), (3_000, 0.5)] {
            let load = MS * load_ms;
            let longest = lead_time(load, beta, largest).expect("a lead");
            // Fresh for at most the longest lead: a draw decides.
            assert!(may_be_due(longest, load, beta), "{load:?} {beta}");
            // A little longer (the bound is 37 where the most is 36.74): no draw could make
            // it due.
            let beyond = longest + load.max(MS).mul_f64(beta * 0.3);
            assert!(!may_be_due(beyond, load, beta), "{load:?} {beta}");
        }
        assert!(!may_be_due(MS, MS, 0.0), "no early refresh at all");
    }
}
