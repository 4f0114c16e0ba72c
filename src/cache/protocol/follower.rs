//! The leader/follower protocol of one flight: one lookup that finds a fresh value or takes
//! the lock (then this flight leads, see [`leader`](super::leader)); otherwise this flight
//! follows: it answers stale at once where the stale window allows, or waits, woken by the
//! store's "filled" notification or by a poll (see [`wait`](super::wait)), and reads again until the
//! value is there, the lock is free (then it leads), or the wait times out
//! ([`WaitTimeoutPolicy`]).
//!
//! How a follower waits is in [`wait`](super::wait), what it makes of a stale value in
//! [`stale`](super::stale), and how a waiter tells its load's result from an earlier one in
//! [`waiters`](super::waiters).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::leader::LeaderStart;
use super::lock::spawn_release;
use super::lookup::{FreshValue, LookupFound};
use super::stale::StaleValue;
use super::wait::Backoff;
use super::waiters::{EarlierAnswer, WaitersAnswer};
use crate::cache::carry::FlightPosts;
use crate::cache::entry::{Corrupt, Entry};
use crate::cache::fetched::FlightResult;
use crate::cache::flight::BoxLoader;
use crate::cache::telemetry::{LockEvent, WaitEnd};
use crate::cache::{Error, ErrorKind, Fetched, Inner, Outcome, WaitTimeoutPolicy};
use crate::store::{
    FillWatch, KeyDigest, LockState, LockToken, LockWhen, Stamp, StoreError, StoreKey,
};

/// What the protocol's loop goes on with from a flight's first lookup, made before the loop
/// (see [`Inner::resolve`]).
struct FirstRead<'a> {
    key: &'a StoreKey,
    token: LockToken,
    filled: Option<FillWatch<'a>>,
    /// When the flight first read the key.
    started: Instant,
}

/// Where a flight stands in the protocol's loop between its lookups: which lookup it makes
/// next, and whether it follows another leader's load. Owned by [`Inner::resolve`], which
/// reports the wait once the flight has its answer, however the loop ended.
struct FollowerState {
    next: NextLookup,
    following: Option<Following>,
}

/// The lookup a flight makes next.
enum NextLookup {
    /// None: the first, made before the loop, found this (with the stamp taken before it).
    First(Option<Stamp>, Result<LookupFound, StoreError>),
    /// One that takes the lock where the value is stale or absent.
    Plain,
    /// One that counts every value as stale, so it takes the lock to overwrite what it found
    /// (a corrupt entry, or an earlier load's answer for its waiters).
    Overwrite,
}

/// A flight that follows another leader's load: since when, what it found in the waiters'
/// slot then, and how its last wait ended.
struct Following {
    since: Instant,
    earlier: EarlierAnswer,
    ended: Option<WaitEnd>,
}

impl Inner {
    /// The leader/follower protocol for one key: ends with a value, a pass, or an error.
    ///
    /// `early` takes an answer before the flight ends: the stale value a leader serves while
    /// it refreshes in the background.
    pub(in crate::cache) async fn resolve(
        self: &Arc<Self>,
        digest: KeyDigest,
        loader: BoxLoader,
        early: &FlightPosts,
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
        let lock_when = LockWhen::LifeAtMost(self.config.lives.keep());
        let reader = loader.reader();
        let mut found = self
            .look_up(started, &key, token, lock_when, reader, &mut filled)
            .await;
        // The common case, a fresh value, is answered here: the protocol's loop, whose state
        // is over a kilobyte, starts (in a box) only for what else a lookup finds.
        if let Ok(Some(fresh)) = found.as_mut().map(LookupFound::take_fresh) {
            return Ok(self.stored_hit(digest, fresh, stamp, started, loader, false));
        }
        let first = FirstRead {
            key: &key,
            token,
            filled,
            started,
        };
        let mut state = FollowerState {
            next: NextLookup::First(stamp, found),
            following: None,
        };
        let answer = Box::pin(self.resolve_key(first, loader, early, &mut state)).await;
        if let Some(Following {
            since,
            ended: Some(ended),
            ..
        }) = state.following
        {
            let waited = since.elapsed();
            debug!(key = ?digest, ?waited, ended = ended.label(), "followed another leader");
            self.meter.follower_wait(waited, ended);
        }
        answer
    }

    /// A fresh value found in the store as a flight's answer (through L1, and with an early
    /// refresh where one is due); `followed`: the flight waited for another leader's load.
    pub(super) fn stored_hit(
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
        let fresh_for = ttl
            .unwrap_or_default()
            .saturating_sub(self.config.lives.keep());
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
        early: &FlightPosts,
        state: &mut FollowerState,
    ) -> FlightResult {
        let config = &self.config;
        let keep = config.lives.keep();
        let FirstRead {
            key,
            token,
            mut filled,
            started,
        } = first;
        let digest = *key.digest();
        let mut backoff = Backoff::new(&config.waits);
        loop {
            let next = std::mem::replace(&mut state.next, NextLookup::Plain);
            let overwriting = matches!(next, NextLookup::Overwrite);
            let (read_at, stamp, found) = match next {
                NextLookup::First(stamp, found) => (started, stamp, found),
                NextLookup::Plain | NextLookup::Overwrite => {
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
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded, early))
                        .await;
                }
                Err(error) => {
                    warn!(%error, key = ?digest, "store lookup failed; loading with in-process protection only");
                    // A lookup that timed out may still have taken the lock: free it, or every
                    // other process would wait for its TTL.
                    spawn_release(&self.store, key, token);
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded, early))
                        .await;
                }
            };
            if overwriting && found.lock == LockState::Acquired {
                // The lock was taken to overwrite a corrupt entry; if another leader has
                // overwritten it since, use its value instead of loading again.
                // (Not a tagged one: its tags would need checking; this flight reloads it.)
                if let Some((Ok(Entry::Value { tags, .. }), Some(ttl))) = &found.entry {
                    if *ttl > keep && self.untagged_valid(tags.as_ref()).await {
                        spawn_release(&self.store, key, token);
                        found.lock = LockState::NotRequested;
                    }
                }
            }
            match found.lock {
                LockState::Acquired => self.meter.lock(LockEvent::Acquired),
                LockState::HeldElsewhere => self.meter.lock(LockEvent::Contended),
                _ => {}
            }
            if let Some(fresh) = found.take_fresh() {
                let followed = state.following.is_some();
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
            let earlier = state.following.as_ref().map(|following| &following.earlier);
            if let (Some(earlier), LockState::Acquired, Some(_)) = (earlier, found.lock, &stale) {
                // The load this flight waited for ended without a new value: it may have
                // answered its waiters beside the value it kept for revalidation.
                let reader = loader.reader();
                let answer = self.waiters_answer(key, reader, earlier, started);
                if let Some(payload) = Box::pin(answer).await {
                    spawn_release(&self.store, key, token);
                    return Ok(Fetched::loaded(payload, Outcome::Follower));
                }
            }
            let in_place = found.entry.as_ref();
            if let Some(answer) = in_place.and_then(|(entry, ttl)| WaitersAnswer::of(entry, *ttl)) {
                // The result of a load that kept nothing, for the calls that waited for it.
                if earlier
                    .is_some_and(|earlier| self.takes_answer(earlier, &answer, started, read_at))
                {
                    if found.lock == LockState::Acquired {
                        spawn_release(&self.store, key, token);
                    }
                    return Ok(Fetched::loaded(answer.payload, Outcome::Follower));
                }
                if found.lock == LockState::NotRequested && !overwriting {
                    // An earlier load's result: this call loads (or follows the load that
                    // does), although the store calls the key fresh.
                    state.next = NextLookup::Overwrite;
                    continue;
                }
            }
            let tagged = found.tagged();
            // The stale value this lookup found, for `WaitTimeoutPolicy::ServeStale`: the
            // latest lookup's, so a value gone since (invalidated) is not served.
            let (last_stale, following) = match (found.lock, found.entry) {
                (LockState::Acquired, _) => {
                    let seen = LeaderStart {
                        stamp,
                        tagged,
                        speculative: false,
                        asked_at: read_at,
                    };
                    // The leader waits for no fill: its watch ends.
                    drop(filled);
                    let key = key.clone();
                    return Box::pin(self.lead(seen, key, token, loader, stale, Some(early))).await;
                }
                (_, Some((Ok(Entry::Pass { shared: false }), _))) => return Ok(Fetched::pass()),
                (_, Some((Ok(Entry::Pass { shared: true }), _))) => {
                    // A load that stored nothing, whose result may be shared within a
                    // process: this flight loads once, for every caller that joined it.
                    let load = self.load_alone(digest, loader, Outcome::Uncached, early);
                    return Box::pin(load).await;
                }
                (_, Some((Err(Corrupt), _))) if !overwriting => {
                    if found.outdated {
                        debug!(key = ?digest, "a tag of the stored value was invalidated; reloading");
                    } else {
                        self.corrupt_entry(&digest);
                    }
                    state.next = NextLookup::Overwrite;
                    continue;
                }
                (LockState::Failed, _) => return Err(Error::new(ErrorKind::RecentFailure)),
                (LockState::HeldElsewhere, entry) => {
                    let following = match state.following.take() {
                        Some(following) => following,
                        None => {
                            let earlier = if stale.is_some() {
                                // The load's answer would go beside the value it keeps.
                                let reader = loader.reader();
                                Box::pin(self.earlier_answer(key, reader)).await
                            } else {
                                EarlierAnswer::in_place(entry.as_ref())
                            };
                            Following {
                                since: Instant::now(),
                                earlier,
                                ended: None,
                            }
                        }
                    };
                    (stale, following)
                }
                (state, _) => {
                    // Only a store that breaks the lookup contract gets here.
                    warn!(?state, key = ?digest, "unexpected store lookup; loading with in-process protection only");
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded, early))
                        .await;
                }
            };
            // A follower: another leader holds the lock.
            let following = state.following.insert(following);
            let waited = started.elapsed();
            if waited >= config.waits.wait_timeout {
                following.ended = Some(WaitEnd::TimedOut);
                debug!(key = ?digest, ?waited, policy = ?config.waits.on_wait_timeout, "wait timed out");
                let stamp = self.l1.stamp(&digest);
                return Box::pin(self.after_wait_timeout(stamp, key, loader, last_stale, early))
                    .await;
            }
            let soft = self.follower_soft_left(loader.soft_timeout(), last_stale.as_ref(), waited);
            if let (Some(Duration::ZERO), Some(stale)) = (soft, last_stale) {
                return Ok(stale.answer());
            }
            let limit = (config.waits.wait_timeout - waited).min(soft.unwrap_or(Duration::MAX));
            let wait = self.wait_between_reads(&mut filled, &mut backoff, limit);
            following.ended = Some(Box::pin(wait).await);
        }
    }

    /// What a follower does once it has waited `wait_timeout`: the configured policy, for the
    /// callers of `flight`.
    async fn after_wait_timeout(
        &self,
        stamp: Option<Stamp>,
        key: &StoreKey,
        loader: BoxLoader,
        last_stale: Option<StaleValue>,
        flight: &FlightPosts,
    ) -> FlightResult {
        match self.config.waits.on_wait_timeout {
            WaitTimeoutPolicy::LoadUncached => {
                Box::pin(self.load_alone(*key.digest(), loader, Outcome::Uncached, flight)).await
            }
            WaitTimeoutPolicy::LoadAndCache => {
                Box::pin(self.load_and_put(stamp, key, loader, flight)).await
            }
            WaitTimeoutPolicy::ServeStale => match last_stale {
                Some(stale)
                    if self.serves_on_error(&stale)
                        && self.still_stands(key, &stale, flight.is_overtaken()).await =>
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
        self.meter.corrupt_entry();
        warn!(key = ?digest, "corrupt or foreign entry; treating it as a miss");
    }
}
