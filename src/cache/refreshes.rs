//! The early refreshes of this process: when a value is due for one (XFetch, Vattani et al.,
//! VLDB 2015), and which keys have one running, so a hot key is refreshed by one task at a
//! time in a process. The refresh itself is part of the protocol (`protocol::refresh`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::KeyDigest;

/// How many load times ahead of its expiry a refresh starts at the least.
const MARGIN: f64 = 1.1;

/// More than the most `−ln u` can be in [`lead_time`]: `u` is at least 2⁻⁵³ (one less a draw
/// of `rand`'s 53-bit floats in [0, 1)), and 53·ln 2 is about 36.74.
const MOST_NEG_LN: f64 = 37.0;

/// The early refreshes of a cache: its `β`, the keys being refreshed, and how many were
/// started.
pub(super) struct Refreshes {
    /// XFetch's `β`: how far ahead of its expiry a value is refreshed, in load times; not
    /// positive turns early refresh off.
    beta: f64,
    /// Keys with an early refresh in progress in this process.
    running: Arc<Mutex<HashSet<KeyDigest>>>,
    started: AtomicU64,
}

/// An early refresh of one key in progress: the key is marked as refreshed until this is
/// dropped, however the refresh's task ends.
pub(super) struct Running {
    running: Arc<Mutex<HashSet<KeyDigest>>>,
    digest: KeyDigest,
}

impl Drop for Running {
    fn drop(&mut self) {
        crate::sync::lock(&self.running).remove(&self.digest);
    }
}

impl Refreshes {
    /// Early refreshes with XFetch's `beta` (not positive: none).
    pub(super) fn new(beta: f64) -> Self {
        Refreshes {
            beta,
            running: Arc::default(),
            started: AtomicU64::new(0),
        }
    }

    /// When a value fresh until `fresh_until`, whose load took `load_time`, is refreshed
    /// early (see [`lead_time`]): drawn once per value and process, when the value is read
    /// from the store, so the rate of hits does not change it. `None` without early refresh.
    pub(super) fn point(&self, fresh_until: Instant, load_time: Duration) -> Option<Instant> {
        let lead = lead_time(load_time, self.beta, rand::random::<f64>)?;
        Some(fresh_until.checked_sub(lead).unwrap_or_else(Instant::now))
    }

    /// Whether a value read at `now`, fresh until `fresh_until`, whose load took `load_time`,
    /// is due for an early refresh: its [`point`](Self::point) is past, drawn only where a
    /// draw could make it so.
    pub(super) fn due(&self, now: Instant, fresh_until: Instant, load_time: Duration) -> bool {
        let fresh_for = fresh_until.saturating_duration_since(now);
        may_be_due(fresh_for, load_time, self.beta)
            && self
                .point(fresh_until, load_time)
                .is_some_and(|at| now >= at)
    }

    /// Marks an early refresh of `digest` as started and counts it, unless one is running in
    /// this process (then `None`). The key stays marked while the answer lives.
    pub(super) fn start(&self, digest: KeyDigest) -> Option<Running> {
        if !crate::sync::lock(&self.running).insert(digest) {
            return None;
        }
        self.started.fetch_add(1, Ordering::Relaxed);
        Some(Running {
            running: Arc::clone(&self.running),
            digest,
        })
    }

    /// How many early refreshes this process started.
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

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

/// Whether a value fresh for `fresh_for` more, whose load took `load_time`, may be due for an
/// early refresh: whether the longest lead [`lead_time`] can draw reaches it. Where it cannot
/// (most hits: a value is seldom within a few load times of its expiry), nothing need be
/// drawn.
fn may_be_due(fresh_for: Duration, load_time: Duration, beta: f64) -> bool {
    lead(load_time, beta, || MOST_NEG_LN).is_some_and(|longest| fresh_for <= longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn never_drawn() -> f64 {
        panic!("no draw expected")
    }

    #[test]
    fn one_refresh_per_key_at_a_time_until_its_guard_drops() {
        let refreshes = Refreshes::new(1.0);
        let (a, b) = (KeyDigest::of(b"a"), KeyDigest::of(b"b"));
        let running = refreshes.start(a).expect("none running");
        assert!(refreshes.start(a).is_none(), "one at a time per key");
        let other = refreshes.start(b).expect("another key runs alongside");
        drop(running);
        assert!(refreshes.start(a).is_some(), "free again once dropped");
        drop(other);
        assert_eq!(refreshes.started(), 3, "the refused start is not counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_far_from_its_expiry_is_not_due_and_one_past_its_point_is() {
        let now = Instant::now();
        let refreshes = Refreshes::new(1.0);
        assert!(!refreshes.due(now, now + Duration::from_secs(3600), MS * 10));
        assert!(
            refreshes.due(now, now, MS * 10),
            "no time left: due whatever the draw"
        );
        assert!(!Refreshes::new(0.0).due(now, now, MS * 10), "off");
        assert_eq!(Refreshes::new(0.0).point(now, MS), None);
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
