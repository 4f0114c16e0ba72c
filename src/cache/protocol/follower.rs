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

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::leader::{Leader, LeaderStart};
use super::lock::spawn_release;
use super::lookup::{FreshValue, LookupFound};
use super::soft;
use super::stale::StaleValue;
use super::wait::Backoff;
use super::waiters::{EarlierAnswer, WaitersAnswer};
use crate::cache::carry::FlightPosts;
use crate::cache::config::WaitTimeoutPolicy;
use crate::cache::entry::{Corrupt, Entry};
use crate::cache::error::{Error, ErrorKind};
use crate::cache::fetched::Fetched;
use crate::cache::fetched::FlightResult;
use crate::cache::flight::{BoxLoader, Reader};
use crate::cache::outcome::Outcome;
use crate::cache::parts::Parts;
use crate::cache::telemetry::{LockEvent, WaitEnd};
use crate::store::{
    FillWatch, KeyDigest, LockState, LockToken, LockWhen, Stamp, StoreError, StoreKey,
};

/// A flight that missed L1: its lookups and, where another leader holds the lock, the
/// follower's loop. Made by [`Follower::resolve`] for one key, it owns what the flight needs
/// between its lookups: the key's lock token and fills' watch, its callers' posts, which lookup
/// it makes next, and whether it follows another leader's load.
pub(in crate::cache) struct Follower<'a> {
    pub(super) parts: &'a Arc<Parts>,
    pub(super) key: &'a StoreKey,
    token: LockToken,
    filled: Option<FillWatch<'a>>,
    /// When this flight first read the key.
    pub(super) started: Instant,
    /// Where the flight posts for its callers: an early answer, and whether a change of this
    /// process overtook it.
    pub(super) early: &'a FlightPosts,
    next: NextLookup,
    following: Option<Following>,
    /// The caller's soft timeout, if it gave one.
    soft_timeout: Option<Duration>,
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

/// What one lookup found, and when it was read.
struct Seen {
    read_at: Instant,
    /// L1's stamp of the key, taken before the read.
    stamp: Option<Stamp>,
    found: LookupFound,
    /// Whether the lookup took the lock to overwrite what the one before found.
    overwriting: bool,
}

/// How one step of the protocol's loop ends.
enum Next {
    /// The flight's answer.
    Answer(FlightResult),
    /// A fresh value, answered (and maybe refreshed early) with the flight's loader.
    Fresh(FreshValue, Seen),
    /// This flight holds the lock: it leads the load.
    Lead(LeaderStart, Option<StaleValue>),
    /// A load with in-process protection only, with this outcome.
    LoadAlone(Outcome),
    /// A follower that waited `wait_timeout`: the policy decides (with L1's stamp of the key
    /// and the stale value last seen).
    TimedOut(Option<Stamp>, Option<StaleValue>),
    /// Another lookup.
    LookAgain(NextLookup),
}

impl<'a> Follower<'a> {
    /// The leader/follower protocol for one key: ends with a value, a pass, or an error.
    ///
    /// `early` takes an answer before the flight ends: the stale value a leader serves while
    /// it refreshes in the background.
    pub(in crate::cache) async fn resolve(
        parts: &Arc<Parts>,
        digest: KeyDigest,
        loader: BoxLoader,
        early: &FlightPosts,
    ) -> FlightResult {
        let key = StoreKey::new(Arc::clone(&parts.namespace), digest);
        let token = LockToken::random();
        let mut filled = parts.lookups().watch_fills_subscribed(&key).await;
        // When this flight first read the key. Each lookup's clock reading (this one for the
        // first) also times what it finds: a hit is fresh for what the store says is left,
        // counted from just before the request, which errs by one round trip on the safe side.
        let started = Instant::now();
        // Taken before the read, so that a change heard after it keeps the value out of L1.
        let stamp = parts.l1.stamp(&digest);
        let lock_when = LockWhen::LifeAtMost(parts.lives.keep());
        let reader = loader.reader();
        let mut found = parts
            .lookups()
            .look_up(started, &key, token, lock_when, reader, &mut filled)
            .await;
        // The common case, a fresh value, is answered here: the protocol's loop, whose state
        // is over a kilobyte, starts (in a box) only for what else a lookup finds.
        if let Ok(Some(fresh)) = found.as_mut().map(LookupFound::take_fresh) {
            return Ok(fresh.answer(parts, digest, stamp, started, loader, false));
        }
        let mut follower = Follower {
            parts,
            key: &key,
            token,
            filled,
            started,
            early,
            next: NextLookup::First(stamp, found),
            following: None,
            soft_timeout: loader.soft_timeout(),
        };
        let answer = Box::pin(follower.run(loader)).await;
        if let Some(Following {
            since,
            ended: Some(ended),
            ..
        }) = follower.following
        {
            let waited = since.elapsed();
            debug!(key = ?digest, ?waited, ended = ended.label(), "followed another leader");
            parts.meter.follower_wait(waited, ended);
        }
        answer
    }

    /// The protocol's loop, from the flight's first lookup: a lookup, then a [`step`] on what
    /// it found, until a step ends the flight.
    ///
    /// [`step`]: Self::step
    async fn run(&mut self, loader: BoxLoader) -> FlightResult {
        let parts = self.parts;
        let mut backoff = Backoff::new(&parts.waits);
        let reader = loader.reader();
        loop {
            let next = match self.look_up(reader).await {
                Ok(seen) => self.step(seen, reader, &mut backoff).await,
                Err(outcome) => Next::LoadAlone(outcome),
            };
            match next {
                Next::Answer(answer) => return answer,
                Next::Fresh(fresh, Seen { read_at, stamp, .. }) => {
                    let (digest, followed) = (*self.key.digest(), self.following.is_some());
                    return Ok(fresh.answer(parts, digest, stamp, read_at, loader, followed));
                }
                Next::Lead(seen, stale) => {
                    // The leader waits for no fill: its watch ends.
                    self.filled = None;
                    let (key, token, early) = (self.key.clone(), self.token, Some(self.early));
                    return Box::pin(Leader::lead(parts, seen, key, token, loader, stale, early))
                        .await;
                }
                Next::LoadAlone(outcome) => {
                    return Box::pin(self.load_alone(loader, outcome)).await;
                }
                Next::TimedOut(stamp, last_stale) => {
                    let after = self.after_wait_timeout(stamp, loader, last_stale);
                    return Box::pin(after).await;
                }
                Next::LookAgain(next) => self.next = next,
            }
        }
    }

    /// The flight's next lookup (the first was made before the loop); or, where the store
    /// did not answer, the outcome of a load with in-process protection.
    async fn look_up(&mut self, reader: Reader<'_>) -> Result<Seen, Outcome> {
        let parts = self.parts;
        let (key, digest) = (self.key, *self.key.digest());
        let next = std::mem::replace(&mut self.next, NextLookup::Plain);
        let overwriting = matches!(next, NextLookup::Overwrite);
        let (read_at, stamp, found) = match next {
            NextLookup::First(stamp, found) => (self.started, stamp, found),
            NextLookup::Plain | NextLookup::Overwrite => {
                let read_at = Instant::now();
                // Taken before the read (as the first lookup's).
                let stamp = parts.l1.stamp(&digest);
                let lock_when = if overwriting {
                    LockWhen::Always
                } else {
                    LockWhen::LifeAtMost(parts.lives.keep())
                };
                let token = self.token;
                let found = parts
                    .lookups()
                    .look_up(read_at, key, token, lock_when, reader, &mut self.filled)
                    .await;
                (read_at, stamp, found)
            }
        };
        match found {
            Ok(found) => Ok(Seen {
                read_at,
                stamp,
                found,
                overwriting,
            }),
            Err(error) if error.skipped() => {
                debug!(key = ?digest, "circuit open; loading with in-process protection only");
                Err(Outcome::Degraded)
            }
            Err(error) => {
                warn!(error = &error as &dyn std::error::Error, key = ?digest, "store lookup failed; loading with in-process protection only");
                // A lookup that timed out may still have taken the lock: free it, or every
                // other process would wait for its TTL.
                spawn_release(&parts.store, key, self.token);
                Err(Outcome::Degraded)
            }
        }
    }

    /// What the flight does with what one lookup found: answer it (fresh, stale, or a load's
    /// answer for its waiters), or go on by the lock and the entry ([`route`](Self::route)).
    async fn step(&mut self, mut seen: Seen, reader: Reader<'_>, backoff: &mut Backoff) -> Next {
        let parts = self.parts;
        let keep = parts.lives.keep();
        if seen.overwriting && seen.found.lock == LockState::Acquired {
            // The lock was taken to overwrite a corrupt entry; if another leader has
            // overwritten it since, use its value instead of loading again.
            // (Not a tagged one: its tags would need checking; this flight reloads it.)
            if let Some((Ok(Entry::Value { tags, .. }), Some(ttl))) = &seen.found.entry {
                if *ttl > keep && parts.tags().untagged_valid(tags.as_ref()).await {
                    spawn_release(&parts.store, self.key, self.token);
                    seen.found.lock = LockState::NotRequested;
                }
            }
        }
        match seen.found.lock {
            LockState::Acquired => parts.meter.lock(LockEvent::Acquired),
            LockState::HeldElsewhere => parts.meter.lock(LockEvent::Contended),
            _ => {}
        }
        if let Some(fresh) = seen.found.take_fresh() {
            return Next::Fresh(fresh, seen);
        }
        let mut stale = StaleValue::of(&seen.found, keep);
        let serve_stale = stale.as_ref().is_some_and(|stale| match seen.found.lock {
            // Serve-while-updating: another leader refreshes it.
            LockState::HeldElsewhere => stale.serves_while_updating(&parts.lives),
            // Stale-if-error: the last refresh failed a moment ago.
            LockState::Failed => stale.serves_on_error(&parts.lives),
            _ => false,
        });
        if let Some(stale) = stale.take_if(|_| serve_stale) {
            return Next::Answer(Ok(stale.answer()));
        }
        if let Some(next) = self.for_waiters(&seen, stale.is_some(), reader).await {
            return next;
        }
        self.route(seen, stale, reader, backoff).await
    }

    /// The answer a load that kept nothing (or kept a value for revalidation) left for the
    /// calls that waited for it, if this flight waited for that load; or a look again where an
    /// earlier load's answer stands in place of the value.
    async fn for_waiters(&self, seen: &Seen, stale: bool, reader: Reader<'_>) -> Option<Next> {
        let found = &seen.found;
        let release = || spawn_release(&self.parts.store, self.key, self.token);
        let earlier = self.following.as_ref().map(|following| &following.earlier);
        if let (Some(earlier), LockState::Acquired, true) = (earlier, found.lock, stale) {
            // The load this flight waited for ended without a new value: it may have
            // answered its waiters beside the value it kept for revalidation.
            let answer = self.waiters_answer(reader, earlier);
            if let Some(payload) = Box::pin(answer).await {
                release();
                return Some(Next::Answer(Ok(Fetched::loaded(
                    payload,
                    Outcome::Follower,
                ))));
            }
        }
        let in_place = found.entry.as_ref();
        let answer = in_place.and_then(|(entry, ttl)| WaitersAnswer::of(entry, *ttl))?;
        let waiters_ttl = self.parts.waiters_ttl;
        if earlier.is_some_and(|earlier| {
            answer.taken_by(earlier, self.started, seen.read_at, waiters_ttl)
        }) {
            if found.lock == LockState::Acquired {
                release();
            }
            return Some(Next::Answer(Ok(Fetched::loaded(
                answer.payload,
                Outcome::Follower,
            ))));
        }
        // An earlier load's result: this call loads (or follows the load that does), although
        // the store calls the key fresh.
        (found.lock == LockState::NotRequested && !seen.overwriting)
            .then_some(Next::LookAgain(NextLookup::Overwrite))
    }

    /// Where the lock and the entry send the flight: it leads, passes, loads alone, looks
    /// again to overwrite what it cannot read, fails as the last load did, or follows another
    /// leader's load ([`follow`](Self::follow)).
    async fn route(
        &mut self,
        seen: Seen,
        stale: Option<StaleValue>,
        reader: Reader<'_>,
        backoff: &mut Backoff,
    ) -> Next {
        let digest = *self.key.digest();
        let tagged = seen.found.tagged();
        let start = LeaderStart {
            stamp: seen.stamp,
            tagged,
            speculative: false,
            asked_at: seen.read_at,
        };
        match (seen.found.lock, seen.found.entry) {
            (LockState::Acquired, _) => Next::Lead(start, stale),
            (_, Some((Ok(Entry::Pass { shared: false }), _))) => Next::Answer(Ok(Fetched::pass())),
            // A load that stored nothing, whose result may be shared within a process: this
            // flight loads once, for every caller that joined it.
            (_, Some((Ok(Entry::Pass { shared: true }), _))) => Next::LoadAlone(Outcome::Uncached),
            (_, Some((Err(Corrupt), _))) if !seen.overwriting => {
                if seen.found.outdated {
                    debug!(key = ?digest, "a tag of the stored value was invalidated; reloading");
                } else {
                    self.parts.corrupt_entry(&digest);
                }
                Next::LookAgain(NextLookup::Overwrite)
            }
            (LockState::Failed, _) => Next::Answer(Err(Error::new(ErrorKind::RecentFailure))),
            (LockState::HeldElsewhere, entry) => {
                let following = match self.following.take() {
                    Some(following) => following,
                    None => {
                        let earlier = if stale.is_some() {
                            // The load's answer would go beside the value it keeps.
                            Box::pin(self.earlier_answer(reader)).await
                        } else {
                            EarlierAnswer::in_place(entry.as_ref())
                        };
                        let (since, ended) = (Instant::now(), None);
                        Following {
                            since,
                            earlier,
                            ended,
                        }
                    }
                };
                // The stale value this lookup found, for `WaitTimeoutPolicy::ServeStale`: the
                // latest lookup's, so a value gone since (invalidated) is not served.
                self.follow(following, stale, backoff).await
            }
            (state, _) => {
                // Only a store that breaks the lookup contract gets here.
                warn!(?state, key = ?digest, "unexpected store lookup; loading with in-process protection only");
                Next::LoadAlone(Outcome::Degraded)
            }
        }
    }

    /// A follower's wait for another leader's load, until the next lookup: woken by its fill
    /// or by the backoff's poll, within what is left of the wait and of a soft timeout. Ends
    /// the flight where the wait has timed out, or the soft timeout has with a stale value.
    async fn follow(
        &mut self,
        following: Following,
        last_stale: Option<StaleValue>,
        backoff: &mut Backoff,
    ) -> Next {
        let parts = self.parts;
        let waits = &parts.waits;
        let waited = self.started.elapsed();
        let soft = self.soft_timeout;
        let soft = soft::left_for_follower(&parts.lives, soft, last_stale.as_ref(), waited);
        let following = self.following.insert(following);
        let digest = *self.key.digest();
        if waited >= waits.wait_timeout {
            following.ended = Some(WaitEnd::TimedOut);
            debug!(key = ?digest, ?waited, policy = ?waits.on_wait_timeout, "wait timed out");
            return Next::TimedOut(parts.l1.stamp(&digest), last_stale);
        }
        if let (Some(Duration::ZERO), Some(stale)) = (soft, last_stale) {
            return Next::Answer(Ok(stale.answer()));
        }
        let limit = (waits.wait_timeout - waited).min(soft.unwrap_or(Duration::MAX));
        let notifier = parts.l1.notifier();
        let wait = backoff.wait_between_reads(&mut self.filled, notifier, limit);
        following.ended = Some(Box::pin(wait).await);
        Next::LookAgain(NextLookup::Plain)
    }

    /// What a follower does once it has waited `wait_timeout`: the configured policy.
    async fn after_wait_timeout(
        &self,
        stamp: Option<Stamp>,
        loader: BoxLoader,
        last_stale: Option<StaleValue>,
    ) -> FlightResult {
        let parts = self.parts;
        match parts.waits.on_wait_timeout {
            WaitTimeoutPolicy::LoadUncached => {
                Box::pin(self.load_alone(loader, Outcome::Uncached)).await
            }
            WaitTimeoutPolicy::LoadAndCache => Box::pin(self.load_and_put(stamp, loader)).await,
            WaitTimeoutPolicy::ServeStale => match last_stale {
                Some(stale)
                    if stale.serves_on_error(&parts.lives)
                        && stale
                            .still_stands(&parts.lookups(), self.key, self.early.is_overtaken())
                            .await =>
                {
                    Ok(stale.answer())
                }
                _ => Err(Error::new(ErrorKind::WaitTimeout)),
            },
            WaitTimeoutPolicy::Error => Err(Error::new(ErrorKind::WaitTimeout)),
        }
    }

    /// What stands in the waiters' slot of the key (see
    /// [`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters)) for `reader`: one store
    /// read, made when the flight first waits for a load of a value kept past its freshness.
    pub(super) async fn earlier_answer(&self, reader: Reader<'_>) -> EarlierAnswer {
        self.read_waiters_answer(reader)
            .await
            .map_or(EarlierAnswer::Unknown, EarlierAnswer::stood)
    }

    /// The answer a load left for its waiters beside the value, if this flight, which first
    /// waited when `earlier` stood, takes it (see [`WaitersAnswer::taken_by`]) and its caller
    /// can read it. One store read, made only by a follower that finds the lock free and the
    /// value it waited for still stale.
    pub(super) async fn waiters_answer(
        &self,
        reader: Reader<'_>,
        earlier: &EarlierAnswer,
    ) -> Option<Bytes> {
        let asked = Instant::now();
        let answer = self.read_waiters_answer(reader).await.ok().flatten()?;
        answer
            .taken_by(earlier, self.started, asked, self.parts.waiters_ttl)
            .then_some(answer.payload)
    }

    /// Reads the waiters' slot of the key: the answer there that `reader`'s caller can read,
    /// if any; the store's error if it did not answer.
    async fn read_waiters_answer(
        &self,
        reader: Reader<'_>,
    ) -> Result<Option<WaitersAnswer>, StoreError> {
        let parts = self.parts;
        let stored = parts
            .breaker
            .call(parts.store.waiters_answer(self.key))
            .await?;
        Ok(stored.and_then(|stored| WaitersAnswer::of(&reader.decode(stored.bytes), stored.ttl)))
    }
}
