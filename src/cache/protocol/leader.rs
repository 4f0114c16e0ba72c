//! [`Leader`]: the load under the reload lock (renewed by a watchdog while it runs), its
//! fenced fill, and the release of the lock on every path (the fill itself, an explicit
//! token-checked release or failure marker, the [`LockGuard`] drop guard of `lock.rs`, the
//! lock's TTL). A load as every role runs it is in `load.rs`; loads made without the lock in
//! `without_lock.rs`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use tokio::time::Instant;
use tracing::warn;

use super::load::{tagged, ReadyValue, TagsNotStorable};
use super::lock::LockGuard;
use super::soft;
use super::stale::{unchanged_since, StaleValue};
use crate::cache::carry::{Early, FlightPosts};
use crate::cache::config::Lives;
use crate::cache::entry::{self, Tagged};
use crate::cache::error::Error;
use crate::cache::fetched::Fetched;
use crate::cache::fetched::FlightResult;
use crate::cache::flight::BoxLoader;
use crate::cache::loaded::Loaded;
use crate::cache::loaded::LoadedKind;
use crate::cache::outcome::Outcome;
use crate::cache::parts::Parts;
use crate::cache::telemetry::LockEvent;
use crate::store::StoreExt;
use crate::store::{LockToken, Stamp, StoreError, StoreKey, TagClock};

/// What a leader knows of its key from the lookup that made it leader.
pub(in crate::cache) struct LeaderStart {
    /// What this process had heard of the key before that lookup.
    pub(in crate::cache) stamp: Option<Stamp>,
    /// Whether the key's last value carried tags (or was outdated by them).
    pub(in crate::cache) tagged: bool,
    /// An early refresh: speculative, the value still fresh and nobody waiting for it, so a
    /// failure is not shared (no failure marker: the lock is only released).
    pub(in crate::cache) speculative: bool,
    /// When that lookup was sent (the clock read before it): the lock's TTL runs from no
    /// earlier than this, and so do its renewals.
    pub(in crate::cache) asked_at: Instant,
}

/// A flight that holds its key's reload lock (or a batch's key whose lock the batch took):
/// its load, its fenced writes, and the end of the lock on every path. Owns the lock's guard,
/// what this process had heard of the key before the lock was taken, and the callers its
/// answer goes to.
pub(in crate::cache) struct Leader<'a> {
    pub(super) parts: &'a Parts,
    pub(super) guard: LockGuard,
    pub(super) stamp: Option<Stamp>,
    pub(super) flight: Option<&'a FlightPosts>,
}

impl<'a> Leader<'a> {
    /// The leader of a key whose lock `guard` holds: `stamp`, what this process had heard of
    /// the key before the lock was taken; `flight`, the callers its answer goes to (none for
    /// a batch's key).
    pub(super) fn holding(
        parts: &'a Parts,
        guard: LockGuard,
        stamp: Option<Stamp>,
        flight: Option<&'a FlightPosts>,
    ) -> Self {
        Leader {
            parts,
            guard,
            stamp,
            flight,
        }
    }

    /// The key whose lock it holds.
    pub(super) fn key(&self) -> &StoreKey {
        &self.guard.key
    }

    /// The leader: load, fill (fenced), and make sure the lock goes on every path. With a
    /// `stale` value, the flight's callers get it at once (through `early`) when refreshes run
    /// in the background, and in place of an error if the load fails (stale-if-error).
    pub(in crate::cache) async fn lead(
        parts: &'a Parts,
        seen: LeaderStart,
        key: StoreKey,
        token: LockToken,
        loader: BoxLoader,
        stale: Option<StaleValue>,
        early: Option<&'a FlightPosts>,
    ) -> FlightResult {
        let mut leader = Leader {
            parts,
            guard: LockGuard::new(&parts.store, key, token, seen.asked_at),
            stamp: seen.stamp,
            flight: early,
        };
        // Dropped before the guard: the renewals stop before a guard's release.
        let keys = vec![leader.key().clone()];
        let _watchdog = parts.renewals.watch(keys, token, seen.asked_at);
        let posted = stale.as_ref().is_some_and(|stale| leader.post_stale(stale));
        let clock = parts.tags().clock_for_load(seen.tagged).await;
        let (started, started_at) = (Instant::now(), crate::clock::now());
        let previous = leader.previous(stale.as_ref()).await;
        let had_previous = previous.is_some();
        let lives = &parts.lives;
        let soft = loader.soft_timeout();
        let soft = soft::for_leader(lives, soft, stale.as_ref(), early.is_some(), posted);
        let load = parts.load(loader, previous);
        let loaded = soft::within(load, soft, || {
            if let Some(stale) = &stale {
                leader.post_soft(stale);
            }
        })
        .await;
        let load_time = started.elapsed();
        let loaded = match for_callers(loaded, seen.speculative, stale.as_ref(), lives) {
            Ok(loaded) => loaded,
            Err(error) => return leader.failed(error, seen.speculative, stale).await,
        };
        if !loaded.tags.is_empty() {
            parts.known_tags.mark_seen();
        }
        let kept = stale.is_some();
        let life = loaded.life();
        if let (LoadedKind::NotModified { .. }, Some(stale), true) =
            (&loaded.kind, stale, had_previous)
        {
            return Ok(leader.renew(stale, life, started_at).await);
        }
        let load = (started_at, load_time);
        Ok(leader.store(loaded, clock, load, kept).await)
    }

    /// With a stale value and refreshes in the background, posts it for the flight's callers
    /// while it is within its stale window; whether it did.
    fn post_stale(&mut self, stale: &StaleValue) -> bool {
        let parts = self.parts;
        if !parts.loads.refresh_in_background {
            return false;
        }
        // Servable to the callers that join this flight only while it is within the stale
        // window; later joiners wait for the load's answer.
        match stale.window_left(&parts.lives) {
            Some(left) => self.post_early(stale, left),
            None => false,
        }
    }

    /// A failed load: told to the store (a failure marker, unless `speculative`), and
    /// answered with the stale value where stale-if-error allows and it still stands.
    async fn failed(
        &mut self,
        error: Error,
        speculative: bool,
        stale: Option<StaleValue>,
    ) -> FlightResult {
        self.tell_failure(speculative).await;
        let overtaken = self.flight.is_some_and(FlightPosts::is_overtaken);
        let parts = self.parts;
        match stale {
            Some(stale)
                if stale.serves_on_error(&parts.lives)
                    && stale
                        .still_stands(&parts.lookups(), &self.guard.key, overtaken)
                        .await =>
            {
                warn!(key = ?self.guard.key, error = &error as &dyn std::error::Error, "load failed; serving the stale value");
                Ok(stale.answer())
            }
            _ => Err(error),
        }
    }

    /// Stores what the load gave, as its kind asks: a value (fenced, tagged with `clock`), an
    /// answer for the waiters (beside the value `kept` for revalidation, or in its place), or
    /// a pass; `load` is when it started and how long it took.
    async fn store(
        &mut self,
        loaded: Loaded,
        clock: Option<TagClock>,
        load: (SystemTime, Duration),
        kept: bool,
    ) -> Fetched {
        let parts = self.parts;
        let life = loaded.life();
        match (loaded.kind, tagged(loaded.tags, clock)) {
            (LoadedKind::Value { bytes, .. }, Err(TagsNotStorable)) => {
                warn!(key = ?self.guard.key, "a value without the namespace's generation (the tag clock), or with too many tags, is not stored");
                self.release_lock().await;
                Fetched::loaded(bytes, Outcome::Leader)
            }
            (LoadedKind::Value { bytes, .. }, Ok(tagged)) => {
                let fill =
                    parts.ready_to_store(&bytes, life, load, Some(&tagged), Some(loaded.windows));
                self.fill_value(&fill, Some(&tagged)).await;
                Fetched::loaded(fill.value, Outcome::Leader)
            }
            (LoadedKind::ForWaiters { bytes, .. }, _) => {
                self.fill_for_waiters(&bytes, load, kept).await;
                Fetched::loaded(bytes, Outcome::Leader)
            }
            // `load` lets "not modified" through only with a previous value, which renewed.
            (kind @ (LoadedKind::Pass { .. } | LoadedKind::NotModified { .. }), _) => {
                let (handoff, shared) = match kind {
                    LoadedKind::Pass { handoff, shared } => (handoff, shared),
                    _ => (None, false),
                };
                let pass = entry::encode_pass(load.0, shared);
                let (key, token) = (&self.guard.key, self.guard.token);
                let filled = parts.store.fill(key, token, pass, parts.lives.pass_ttl);
                if let Ok(true | false) = parts.breaker.finish(filled).await {
                    self.guard.disarm();
                }
                Fetched::pass_with(handoff)
            }
        }
    }

    /// Writes a load's answer for its waiters, kept for as long as they take to read it and
    /// never in L1. A value `kept` past its freshness stays in its place, for the next load to
    /// revalidate: the answer goes beside it (the followers that find it still stale look
    /// there); else it takes the value's place, where followers find it at once.
    async fn fill_for_waiters(
        &mut self,
        bytes: &Bytes,
        (started_at, took): (SystemTime, Duration),
        kept: bool,
    ) {
        let parts = self.parts;
        let ttl = parts.waiters_ttl;
        let answer = entry::encode_for_waiters(bytes, started_at, took, ttl);
        let (key, token) = (&self.guard.key, self.guard.token);
        let written = if kept {
            parts.store.answer_waiters(key, token, answer, ttl)
        } else {
            parts.store.fill(key, token, answer, ttl)
        };
        if let Ok(filled) = parts.breaker.finish(written).await {
            self.guard.disarm();
            if !filled {
                parts.meter.lock(LockEvent::Lost);
            }
        }
    }

    /// Fills a loaded value under the lock, and keeps it in L1 where the fill took; the
    /// `flight` it answers is marked if the value is outdated by its tags.
    pub(in crate::cache) async fn fill_value(
        &mut self,
        fill: &ReadyValue,
        tagged: Option<&Tagged>,
    ) {
        let (parts, guard) = (self.parts, &self.guard);
        let encoded = fill.encoded.clone();
        let filled = parts
            .breaker
            .finish(
                parts
                    .store
                    .fill(&guard.key, guard.token, encoded, fill.store_ttl),
            )
            .await;
        self.after_write(filled, fill, tagged).await;
    }

    /// After a fenced write of `fill` (a fill, or a renewal): the lock is gone if the write
    /// answered, and the value goes to L1 if it took (or, if the store failed, to L1 only).
    /// Whatever became of the write, the `flight` it answers is marked if the value is
    /// outdated by its tags.
    pub(super) async fn after_write(
        &mut self,
        written: Result<bool, StoreError>,
        fill: &ReadyValue,
        tagged: Option<&Tagged>,
    ) {
        let (parts, stamp, flight) = (self.parts, self.stamp, self.flight);
        let guard = &mut self.guard;
        let digest = *guard.key.digest();
        match written {
            Ok(written) => {
                // The write dropped the lock, or the lock was no longer ours.
                guard.disarm();
                if written {
                    // The write's own notification moved the stamp on once.
                    let stamp = stamp.map(|stamp| parts.l1.after_own_write(stamp));
                    parts.keep_loaded(stamp, digest, fill, tagged, flight).await;
                } else {
                    parts.meter.lock(LockEvent::Lost);
                    warn!(key = ?guard.key, "lock lost before the fill; a newer leader owns the key");
                    // Not kept, but it still answers the flight.
                    parts.tags().loaded_tags_hold(tagged, flight).await;
                }
            }
            Err(error) => {
                warn!(key = ?guard.key, error = &error as &dyn std::error::Error, "fill failed; value kept in this process only");
                parts.keep_loaded(stamp, digest, fill, tagged, flight).await;
            }
        }
    }

    /// After a failed load: tells every follower, here and elsewhere (a failure marker,
    /// unless failures are not remembered or the load was `speculative`: then the lock is
    /// released), instead of letting each of them take the lock and call the failing backend
    /// in turn.
    pub(super) async fn tell_failure(&mut self, speculative: bool) {
        let (parts, guard) = (self.parts, &mut self.guard);
        let (key, token) = (&guard.key, guard.token);
        let failure_ttl = parts.lives.failure_ttl;
        let told = if failure_ttl.is_zero() || speculative {
            parts.breaker.finish(parts.store.release(key, token)).await
        } else {
            let failed = parts.store.fail(key, token, failure_ttl);
            parts.breaker.finish(failed).await
        };
        if told.is_ok() {
            guard.disarm();
        }
    }

    /// Releases the lock of a load that has nothing to write (token-checked).
    pub(super) async fn release_lock(&mut self) {
        let (parts, guard) = (self.parts, &mut self.guard);
        let released = parts.store.release(&guard.key, guard.token);
        if parts.breaker.finish(released).await.is_ok() {
            guard.disarm();
        }
    }

    /// Posts `stale` as the early answer of its flight (its soft timeout passed), servable
    /// for the rest of its window and while nothing was heard of its key or tags.
    pub(super) fn post_soft(&self, stale: &StaleValue) {
        if let Some(left) = stale.error_window_left(&self.parts.lives) {
            self.post_early(stale, left);
        }
    }

    /// Posts `stale` as the early answer of its flight, if it has one (whether it did):
    /// servable for `left` more, and while nothing was heard of its key or tags since it was
    /// read.
    fn post_early(&self, stale: &StaleValue, left: Duration) -> bool {
        let Some(flight) = self.flight else {
            return false;
        };
        let until = crate::sync::later(Instant::now(), left);
        let digest = *self.key().digest();
        let notifier = self.parts.l1.notifier();
        let holds = unchanged_since(notifier, digest, self.stamp, &stale.tag_stamps);
        let answer = Fetched::cached(stale.payload.clone(), Outcome::Stale, stale.fresh_until());
        flight.post(Some((Ok(answer), Some(Early { until, holds }))));
        true
    }
}

/// A load's result as the flight's callers take it: an answer for the waiters only is a
/// failed load for an early refresh (`speculative`: nobody waits, and the value it refreshes
/// stays), and, for a failure's answer, where a stale value stands in for it.
fn for_callers(
    loaded: Result<Loaded, Error>,
    speculative: bool,
    stale: Option<&StaleValue>,
    lives: &Lives,
) -> Result<Loaded, Error> {
    match loaded {
        Ok(Loaded {
            kind: LoadedKind::ForWaiters { failed, .. },
            ..
        }) if speculative
            || (failed && stale.is_some_and(|stale| stale.serves_on_error(lives))) =>
        {
            Err(Error::load(
                "the load's result is for its waiters only".into(),
            ))
        }
        loaded => loaded,
    }
}
