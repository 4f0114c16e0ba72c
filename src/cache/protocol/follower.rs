//! The leader/follower protocol of one flight: one lookup that finds a fresh value or takes
//! the lock (then this flight leads, see [`leader`](super::leader)); otherwise this flight
//! follows: it answers stale at once where the stale window allows, or waits, woken by the
//! store's "filled" notification or by a jittered backoff poll, and reads again until the
//! value is there, the lock is free (then it leads), or the wait times out
//! ([`WaitTimeoutPolicy`]).
//!
//! Past 500 lines: the loop of one flight reads every kind of entry (fresh, stale, corrupt, a
//! pass, a failure marker, a result for the waiters of a load) and is read best in one piece.
//! How a waiter tells its load's result from an earlier one is in [`waiters`](super::waiters).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::leader::{spawn_release, Seen};
use super::waiters::{Earlier, WaitersAnswer};
use crate::cache::carry::Posts;
use crate::cache::entry::{Corrupt, Entry, Tagged, Windows};
use crate::cache::flight::{BoxLoader, FlightResult, Reader};
use crate::cache::l1::TagStamps;
use crate::cache::telemetry::{self, LockEvent, WaitEnd};
use crate::cache::{
    Config, Error, ErrorKind, Fetched, Inner, Outcome, Previous, WaitTimeoutPolicy,
};
use crate::store::{
    FillWatch, KeyDigest, LockState, LockToken, LockWhen, Stamp, StoreError, StoreKey,
};

/// What one lookup found: the lock's state, and the value (decoded for the flight's caller)
/// with its remaining life in the store.
pub(in crate::cache) struct Found {
    pub(in crate::cache) lock: LockState,
    pub(in crate::cache) entry: Option<(Result<Entry, Corrupt>, Option<Duration>)>,
    /// The stamps of a valid tagged value's tags.
    pub(in crate::cache) tag_stamps: TagStamps,
    /// The value was this engine's, but one of its tags was invalidated since its load.
    pub(in crate::cache) outdated: bool,
}

impl Found {
    /// The value found, taken out, if the lookup calls it fresh (it did not ask for the lock)
    /// and it is a value this caller reads.
    fn take_fresh(&mut self) -> Option<FreshValue> {
        let fresh = self.lock == LockState::NotRequested
            && matches!(&self.entry, Some((Ok(Entry::Value { .. }), _)));
        let Some((
            Ok(Entry::Value {
                payload, load_time, ..
            }),
            ttl,
        )) = self.entry.take_if(|_| fresh)
        else {
            return None;
        };
        Some(FreshValue {
            payload,
            load_time,
            ttl,
            tag_stamps: std::mem::take(&mut self.tag_stamps),
        })
    }

    /// Whether the value found carried tags (or was outdated by them).
    pub(in crate::cache) fn tagged(&self) -> bool {
        self.outdated
            || matches!(
                &self.entry,
                Some((Ok(Entry::Value { tags: Some(_), .. }), _))
            )
    }
}

/// A fresh value a lookup found, with its remaining life in the store and its tags' stamps.
struct FreshValue {
    payload: Bytes,
    load_time: Duration,
    ttl: Option<Duration>,
    tag_stamps: TagStamps,
}

/// A flight's first lookup, made before the protocol's loop (see [`Inner::resolve`]), and what
/// the loop goes on with.
struct FirstRead<'a> {
    key: &'a StoreKey,
    token: LockToken,
    filled: Option<FillWatch<'a>>,
    /// When the flight first read the key.
    started: Instant,
    /// The stamp taken before that read.
    stamp: Option<Stamp>,
    found: Result<Found, StoreError>,
}

/// A value past its freshness that the store still keeps, what its header said, and how far
/// past its freshness it was when read.
pub(in crate::cache) struct StaleValue {
    pub(in crate::cache) payload: Bytes,
    pub(in crate::cache) load_time: Duration,
    pub(in crate::cache) tags: Option<Tagged>,
    pub(in crate::cache) windows: Option<Windows>,
    /// The stamps of its tags, taken before they were checked.
    pub(in crate::cache) tag_stamps: TagStamps,
    staleness: Duration,
    read_at: Instant,
}

impl StaleValue {
    /// The value of an entry that a lookup did not call fresh, if the store keeps values past
    /// their freshness (`keep` is not zero): it is past its freshness by `keep` less its
    /// remaining life.
    fn of(found: &Found, keep: Duration) -> Option<Self> {
        match &found.entry {
            Some((
                Ok(Entry::Value {
                    payload,
                    load_time,
                    tags,
                    windows,
                }),
                ttl,
            )) if found.lock != LockState::NotRequested && !keep.is_zero() => Some(StaleValue {
                payload: payload.clone(),
                load_time: *load_time,
                tags: tags.clone(),
                windows: *windows,
                tag_stamps: found.tag_stamps.clone(),
                staleness: keep.saturating_sub(ttl.unwrap_or_default()),
                read_at: Instant::now(),
            }),
            _ => None,
        }
    }

    fn staleness(&self) -> Duration {
        self.staleness.saturating_add(self.read_at.elapsed())
    }

    /// The value as a revalidating loader is handed it.
    pub(in crate::cache) fn previous(&self) -> Previous {
        Previous {
            value: self.payload.clone(),
            staleness: self.staleness(),
            tags: self.tags.as_ref().map_or_else(Vec::new, |t| t.tags.clone()),
        }
    }

    /// The stale value as a flight's answer.
    pub(in crate::cache) fn answer(self) -> Fetched {
        let fresh_until = self.fresh_until();
        Fetched::cached(self.payload, Outcome::Stale, fresh_until)
    }

    /// When the value stopped being fresh (as near as the store's TTL says).
    pub(in crate::cache) fn fresh_until(&self) -> Option<Instant> {
        self.read_at.checked_sub(self.staleness)
    }
}

/// A follower's pause: `pause` long, or until the key's fill (or release) is notified.
pub(in crate::cache) async fn wait_for_fill(
    filled: &mut Option<FillWatch<'_>>,
    pause: Duration,
) -> WaitEnd {
    let pause = tokio::time::sleep(pause);
    match filled {
        Some(filled) => {
            tokio::select! {
                () = pause => WaitEnd::Polled,
                () = filled.changed() => WaitEnd::Notified,
            }
        }
        None => {
            pause.await;
            WaitEnd::Polled
        }
    }
}

/// How a flight waited for other leaders, for the follower-wait metric.
#[derive(Default)]
struct Waiting {
    since: Option<Instant>,
    ended: Option<WaitEnd>,
}

/// The shortest step between a follower's re-reads, whatever the settings.
const MIN_PAUSE: Duration = Duration::from_millis(1);

/// Pauses between a follower's re-reads: exponential, capped, jittered.
pub(in crate::cache) struct Backoff {
    next: Duration,
    multiplier: f64,
    max: Duration,
}

impl Backoff {
    pub(in crate::cache) fn new(config: &Config) -> Self {
        // A zero step would make followers spin on the store: at least a millisecond.
        let initial = config.backoff_initial.max(MIN_PAUSE);
        Backoff {
            next: initial,
            multiplier: config.backoff_multiplier,
            max: config.backoff_max.max(initial),
        }
    }

    /// The next pause: between half and all of the current step, then the step grows.
    pub(in crate::cache) fn pause(&mut self) -> Duration {
        self.pause_with(rand::random::<f64>())
    }

    /// The next pause for a draw `jitter` in [0, 1).
    fn pause_with(&mut self, jitter: f64) -> Duration {
        let step = self.next;
        self.next = Duration::try_from_secs_f64(step.as_secs_f64() * self.multiplier)
            .unwrap_or(self.max)
            .min(self.max);
        let half = step / 2;
        half + half.mul_f64(jitter)
    }
}

impl Inner {
    /// A watch of `key`'s fills, when notifications are on. Taken before the first read, so a
    /// fill that lands between a read and the wait wakes the wait; the backoff poll stays as
    /// the fallback for lost notifications.
    pub(in crate::cache) fn watch_fills<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        if self.config.notifications {
            self.store.subscribe(key)
        } else {
            None
        }
    }

    /// [`watch_fills`](Self::watch_fills), and then, if the store's subscription is on its way
    /// (a namespace's first, or one made again after its connection dropped), a wait of at
    /// most `store_timeout` for it: what is read before it is in place cannot enter L1, so the
    /// first reads of a new process would all be missed by L1. No wait while the breaker is
    /// open (the lookup will not be made).
    pub(in crate::cache) async fn watch_fills_subscribed<'a>(
        &'a self,
        key: &'a StoreKey,
    ) -> Option<FillWatch<'a>> {
        let filled = self.watch_fills(key);
        if let (Some(_), Some(notifier)) = (&filled, self.l1.notifier()) {
            if !notifier.receiving() && self.breaker.is_closed() {
                // Boxed: a rare wait, kept out of every lookup's state.
                Box::pin(notifier.received_within(self.config.store_timeout)).await;
            }
        }
        filled
    }

    /// One lookup: "the value, or the lock" in one store call, with what it found decoded
    /// for the flight's caller. The watch is marked seen first, so only a fill after this
    /// read wakes the next wait. `now` is the clock read just before it: the store timeout
    /// runs from it.
    pub(in crate::cache) async fn look_up(
        &self,
        now: Instant,
        key: &StoreKey,
        token: LockToken,
        lock_when: LockWhen,
        reader: Reader<'_>,
        filled: &mut Option<FillWatch<'_>>,
    ) -> Result<Found, StoreError> {
        if let Some(filled) = filled.as_mut() {
            filled.mark_seen();
        }
        let lookup = self
            .breaker
            .call_from(
                now,
                self.store
                    .lookup(key, token, self.config.lock_ttl, lock_when),
            )
            .await?;
        let mut found = Found {
            lock: lookup.lock,
            entry: lookup
                .value
                .map(|stored| (reader.decode(stored.bytes), stored.ttl)),
            tag_stamps: TagStamps::default(),
            outdated: false,
        };
        self.check_tags(&mut found).await?;
        Ok(found)
    }

    /// Whether a stale value may be served at once while another leader refreshes it.
    pub(in crate::cache) fn serves_while_updating(&self, stale: &StaleValue) -> bool {
        self.stale_window_left(stale).is_some()
    }

    /// How long a stale value may still be served while a leader refreshes it, if it may.
    pub(in crate::cache) fn stale_window_left(&self, stale: &StaleValue) -> Option<Duration> {
        let window = stale
            .windows
            .and_then(|w| w.while_revalidating)
            .unwrap_or(self.config.stale);
        let staleness = stale.staleness();
        (!window.is_zero() && staleness <= window).then(|| window - staleness)
    }

    /// Whether a stale value may stand in for a failed or too slow load.
    pub(in crate::cache) fn serves_on_error(&self, stale: &StaleValue) -> bool {
        let max = stale
            .windows
            .and_then(|w| w.if_error)
            .unwrap_or_else(|| self.config.stale_if_error());
        !max.is_zero() && stale.staleness() <= max
    }

    /// The leader/follower protocol for one key: ends with a value, a pass, or an error.
    ///
    /// `early` takes an answer before the flight ends: the stale value a leader serves while
    /// it refreshes in the background.
    pub(in crate::cache) async fn resolve(
        self: &Arc<Self>,
        digest: KeyDigest,
        loader: BoxLoader,
        early: &Posts,
    ) -> FlightResult {
        let key = StoreKey::new(Arc::clone(&self.config.namespace), digest);
        let token = LockToken::random();
        let mut filled = self.watch_fills_subscribed(&key).await;
        // When this flight first read the key. Each lookup's clock reading (this one for the
        // first) also times what it finds: a hit is fresh for what the store says is left,
        // counted from just before the request, which errs by one round trip on the safe side.
        let started = Instant::now();
        // Taken before the read, so that a change heard after it keeps the value out of L1.
        let stamp = self.l1.stamp(&digest);
        let lock_when = LockWhen::LifeAtMost(self.config.keep());
        let reader = loader.reader();
        let mut found = self
            .look_up(started, &key, token, lock_when, reader, &mut filled)
            .await;
        // The common case, a fresh value, is answered here: the protocol's loop, whose state
        // is over a kilobyte, starts (in a box) only for what else a lookup finds.
        if let Ok(Some(fresh)) = found.as_mut().map(Found::take_fresh) {
            return Ok(self.stored_hit(digest, fresh, stamp, started, loader, false));
        }
        let first = FirstRead {
            key: &key,
            token,
            filled,
            started,
            stamp,
            found,
        };
        let mut waiting = Waiting::default();
        let answer = Box::pin(self.resolve_key(first, loader, early, &mut waiting)).await;
        if let (Some(since), Some(ended)) = (waiting.since, waiting.ended) {
            let waited = since.elapsed();
            debug!(key = ?digest, ?waited, ended = ended.label(), "followed another leader");
            telemetry::follower_wait(waited, ended);
        }
        answer
    }

    /// A fresh value found in the store as a flight's answer (through L1, and with an early
    /// refresh where one is due); `followed`: the flight waited for another leader's load.
    fn stored_hit(
        self: &Arc<Self>,
        digest: KeyDigest,
        fresh: FreshValue,
        stamp: Option<Stamp>,
        read_at: Instant,
        loader: BoxLoader,
        followed: bool,
    ) -> Fetched {
        let FreshValue {
            payload,
            load_time,
            ttl,
            tag_stamps,
        } = fresh;
        let fresh_for = ttl.unwrap_or_default().saturating_sub(self.config.keep());
        self.l1_insert(stamp, tag_stamps, digest, &payload, fresh_for, load_time);
        let fresh_until = crate::sync::later(read_at, fresh_for);
        if self.refreshes.due(read_at, fresh_until, load_time) {
            self.refresh_early(digest, loader, fresh_until);
        }
        let outcome = if followed {
            Outcome::Follower
        } else {
            Outcome::L2Hit
        };
        Fetched::cached(payload, outcome, Some(fresh_until))
    }

    /// The protocol's loop, from the flight's first lookup.
    async fn resolve_key(
        self: &Arc<Self>,
        first: FirstRead<'_>,
        loader: BoxLoader,
        early: &Posts,
        waiting: &mut Waiting,
    ) -> FlightResult {
        let config = &self.config;
        let keep = config.keep();
        let FirstRead {
            key,
            token,
            mut filled,
            started,
            stamp: first_stamp,
            found: first_found,
        } = first;
        let digest = *key.digest();
        let mut backoff = Backoff::new(config);
        // Set when a corrupt entry is seen: the next lookup (only) counts every value as
        // stale, so it takes the lock to overwrite the entry.
        let mut overwrite = false;
        // Whether this flight has waited for another leader.
        let mut followed = false;
        // The answer for waiters that stood when this flight first waited.
        let mut earlier = Earlier::Unknown;
        // The first lookup's, made before the loop.
        let mut first = Some((first_stamp, first_found));
        loop {
            let overwriting = std::mem::take(&mut overwrite);
            let (read_at, stamp, found) = match first.take() {
                Some((stamp, found)) => (started, stamp, found),
                None => {
                    let read_at = Instant::now();
                    // Taken before the read (as the first lookup's).
                    let stamp = self.l1.stamp(&digest);
                    let lock_when = if overwriting {
                        LockWhen::Always
                    } else {
                        LockWhen::LifeAtMost(keep)
                    };
                    let reader = loader.reader();
                    let found = self
                        .look_up(read_at, key, token, lock_when, reader, &mut filled)
                        .await;
                    (read_at, stamp, found)
                }
            };
            let mut found = match found {
                Ok(found) => found,
                Err(error) if error.skipped() => {
                    debug!(key = ?digest, "circuit open; loading with in-process protection only");
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
                Err(error) => {
                    warn!(%error, key = ?digest, "store lookup failed; loading with in-process protection only");
                    // A lookup that timed out may still have taken the lock: free it, or every
                    // other process would wait for its TTL.
                    spawn_release(&self.store, key, token);
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
            };
            if overwriting && found.lock == LockState::Acquired {
                // The lock was taken to overwrite a corrupt entry; if another leader has
                // overwritten it since, use its value instead of loading again.
                // (Not a tagged one: its tags would need checking; this flight reloads it.)
                if let Some((Ok(Entry::Value { tags: None, .. }), Some(ttl))) = &found.entry {
                    if *ttl > keep {
                        spawn_release(&self.store, key, token);
                        found.lock = LockState::NotRequested;
                    }
                }
            }
            match found.lock {
                LockState::Acquired => telemetry::lock(LockEvent::Acquired),
                LockState::HeldElsewhere => telemetry::lock(LockEvent::Contended),
                _ => {}
            }
            if let Some(fresh) = found.take_fresh() {
                return Ok(self.stored_hit(digest, fresh, stamp, read_at, loader, followed));
            }
            let mut stale = StaleValue::of(&found, keep);
            let serve_stale = stale.as_ref().is_some_and(|stale| match found.lock {
                // Serve-while-updating: another leader refreshes it.
                LockState::HeldElsewhere => self.serves_while_updating(stale),
                // Stale-if-error: the last refresh failed a moment ago.
                LockState::Failed => self.serves_on_error(stale),
                _ => false,
            });
            if let Some(stale) = stale.take_if(|_| serve_stale) {
                return Ok(stale.answer());
            }
            if followed && found.lock == LockState::Acquired && stale.is_some() {
                // The load this flight waited for ended without a new value: it may have
                // answered its waiters beside the value it kept for revalidation.
                let reader = loader.reader();
                let answer = self.waiters_answer(key, reader, &earlier, started);
                if let Some(payload) = Box::pin(answer).await {
                    spawn_release(&self.store, key, token);
                    return Ok(Fetched::loaded(payload, Outcome::Follower));
                }
            }
            let in_place = found.entry.as_ref();
            if let Some(answer) = in_place.and_then(|(entry, ttl)| WaitersAnswer::of(entry, *ttl)) {
                // The result of a load that kept nothing, for the calls that waited for it.
                if followed && self.takes_answer(&earlier, &answer, started, read_at) {
                    if found.lock == LockState::Acquired {
                        spawn_release(&self.store, key, token);
                    }
                    return Ok(Fetched::loaded(answer.payload, Outcome::Follower));
                }
                if found.lock == LockState::NotRequested && !overwriting {
                    // An earlier load's result: this call loads (or follows the load that
                    // does), although the store calls the key fresh.
                    overwrite = true;
                    continue;
                }
            }
            let tagged = found.tagged();
            // The stale value this lookup found, for `WaitTimeoutPolicy::ServeStale`: the
            // latest lookup's, so a value gone since (invalidated) is not served.
            let last_stale = match (found.lock, found.entry) {
                (LockState::Acquired, _) => {
                    let seen = Seen {
                        stamp,
                        tagged,
                        speculative: false,
                    };
                    // The leader waits for no fill: its watch ends.
                    drop(filled);
                    let key = key.clone();
                    return Box::pin(self.lead(seen, key, token, loader, stale, Some(early))).await;
                }
                (_, Some((Ok(Entry::Pass), _))) => return Ok(Fetched::pass()),
                (_, Some((Err(Corrupt), _))) if !overwriting => {
                    if found.outdated {
                        debug!(key = ?digest, "a tag of the stored value was invalidated; reloading");
                    } else {
                        self.corrupt_entry(&digest);
                    }
                    overwrite = true;
                    continue;
                }
                (LockState::Failed, _) => return Err(Error::new(ErrorKind::RecentFailure)),
                (LockState::HeldElsewhere, entry) => {
                    if !followed {
                        earlier = if stale.is_some() {
                            // The load's answer would go beside the value it keeps.
                            let reader = loader.reader();
                            Box::pin(self.earlier_answer(key, reader)).await
                        } else {
                            Earlier::in_place(entry.as_ref())
                        };
                    }
                    stale
                }
                (state, _) => {
                    // Only a store that breaks the lookup contract gets here.
                    warn!(?state, key = ?digest, "unexpected store lookup; loading with in-process protection only");
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
            };
            // A follower: another leader holds the lock.
            followed = true;
            waiting.since.get_or_insert_with(Instant::now);
            let waited = started.elapsed();
            if waited >= config.wait_timeout {
                waiting.ended = Some(WaitEnd::TimedOut);
                debug!(key = ?digest, ?waited, policy = ?config.on_wait_timeout, "wait timed out");
                let stamp = self.l1.stamp(&digest);
                let overtaken = early.is_overtaken();
                return Box::pin(
                    self.after_wait_timeout(stamp, key, loader, last_stale, overtaken),
                )
                .await;
            }
            let pause = backoff.pause().min(config.wait_timeout - waited);
            waiting.ended = Some(Box::pin(wait_for_fill(&mut filled, pause)).await);
        }
    }

    /// What a follower does once it has waited `wait_timeout`: the configured policy.
    async fn after_wait_timeout(
        &self,
        stamp: Option<Stamp>,
        key: &StoreKey,
        loader: BoxLoader,
        last_stale: Option<StaleValue>,
        overtaken: bool,
    ) -> FlightResult {
        match self.config.on_wait_timeout {
            WaitTimeoutPolicy::LoadUncached => {
                Box::pin(self.load_alone(*key.digest(), loader, Outcome::Uncached)).await
            }
            WaitTimeoutPolicy::LoadAndCache => {
                Box::pin(self.load_and_put(stamp, key, loader)).await
            }
            WaitTimeoutPolicy::ServeStale => match last_stale {
                Some(stale)
                    if self.serves_on_error(&stale)
                        && self.still_stands(key, &stale, overtaken).await =>
                {
                    Ok(stale.answer())
                }
                _ => Err(Error::new(ErrorKind::WaitTimeout)),
            },
            WaitTimeoutPolicy::Error => Err(Error::new(ErrorKind::WaitTimeout)),
        }
    }
}

impl Inner {
    /// Counts a value that this flight's caller cannot read (corrupt, foreign, or another
    /// type's), in [`Stats::corrupt_entries`](crate::cache::Stats::corrupt_entries) and its metric:
    /// it is treated as a miss, and overwritten by the load that follows.
    pub(in crate::cache) fn corrupt_entry(&self, digest: &KeyDigest) {
        self.counters
            .corrupt_entries
            .fetch_add(1, Ordering::Relaxed);
        telemetry::corrupt_entry();
        warn!(key = ?digest, "corrupt or foreign entry; treating it as a miss");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(initial_ms: u64, multiplier: f64, max_ms: u64) -> Backoff {
        Backoff {
            next: Duration::from_millis(initial_ms),
            multiplier,
            max: Duration::from_millis(max_ms),
        }
    }

    #[test]
    fn backoff_pauses_between_half_and_all_of_a_growing_capped_step() {
        let mut low = backoff(10, 2.0, 50);
        let lows: Vec<_> = (0..5).map(|_| low.pause_with(0.0)).collect();
        let ms = Duration::from_millis;
        assert_eq!(lows, [ms(5), ms(10), ms(20), ms(25), ms(25)]);
        let mut high = backoff(10, 2.0, 50);
        let highs: Vec<_> = (0..5).map(|_| high.pause_with(0.999_999)).collect();
        for (pause, step) in highs.iter().zip([10, 20, 40, 50, 50]) {
            assert!(
                *pause <= ms(step) && *pause > ms(step) * 99 / 100,
                "{pause:?}"
            );
        }
    }

    #[test]
    fn backoff_survives_hostile_settings() {
        // A multiplier that overflows a Duration stops at the cap; a zero step stays zero.
        let mut huge = backoff(1000, f64::MAX, 2000);
        huge.pause_with(0.5);
        assert_eq!(huge.next, Duration::from_millis(2000));
        let mut nan = backoff(1000, f64::NAN, 2000);
        nan.pause_with(0.5);
        assert_eq!(nan.next, Duration::from_millis(2000));
        // `backoff(0, 0)`: steps of at least a millisecond, never a spin on the store.
        let config = Config {
            backoff_initial: Duration::ZERO,
            backoff_max: Duration::ZERO,
            ..Config::default()
        };
        let mut zero = Backoff::new(&config);
        for _ in 0..5 {
            assert!(zero.pause_with(1.0) >= Duration::from_micros(999));
        }
    }
}
