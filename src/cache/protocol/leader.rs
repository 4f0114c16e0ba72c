//! Loading: the leader's load under the reload lock (renewed by a watchdog while it runs),
//! its fenced fill, and the release of the lock on every path (the fill itself, an explicit
//! token-checked release or failure marker, the [`LockGuard`] drop guard of `lock.rs`, the
//! lock's TTL).
//! Loads made without the lock are in `without_lock.rs`.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;
use tracing::warn;

use super::lock::LockGuard;
use super::stale::{unchanged_since, StaleValue};
use crate::cache::carry::{Early, FlightPosts};
use crate::cache::entry::{self, Tagged, Windows};
use crate::cache::fetched::FlightResult;
use crate::cache::flight::BoxLoader;
use crate::cache::l1::TagStamps;
use crate::cache::loaded::{Life, LoadedKind};
use crate::cache::telemetry::LockEvent;
use crate::cache::{BoxError, Error, ErrorKind, Fetched, Inner, Loaded, Outcome, Previous};
use crate::store::{BoxFuture, KeyDigest, LockToken, Stamp, StoreError, StoreKey, TagClock};

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

/// Tags a loaded value cannot be stored with: the store did not answer the tag clock read
/// before the load (so the value would carry no generation), or there are more than
/// [`entry::MAX_TAGS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TagsNotStorable;

/// The tags of a loaded (or written) value, with the tag clock read before its load. A value
/// without tags carries the clock too (with no tags), for its generation: a
/// [clear](crate::Cache::clear) after the clock was read outdates it, as a tag invalidation
/// outdates a tagged value. Where the clock could not be read (the store failing), no value
/// is stored, tagged or not: one stored without a generation would outlive a clear.
pub(super) fn tagged(
    tags: Vec<KeyDigest>,
    clock: Option<TagClock>,
) -> Result<Tagged, TagsNotStorable> {
    match clock {
        Some(clock) if tags.len() <= entry::MAX_TAGS => Ok(Tagged {
            generation: Some(clock.generation),
            clock: clock.clock,
            tags,
        }),
        _ => Err(TagsNotStorable),
    }
}

/// A loaded value made ready for the store: the bytes the store keeps, the payload (a slice of
/// the same buffer), how long it is fresh, and how long the store keeps it (fresh, then stale).
pub(in crate::cache) struct ReadyValue {
    pub(in crate::cache) encoded: Bytes,
    pub(in crate::cache) value: Bytes,
    pub(in crate::cache) fresh_for: Duration,
    pub(in crate::cache) store_ttl: Duration,
    /// How long the value took to load (or, renewed, took when it was loaded).
    pub(in crate::cache) load_time: Duration,
}

/// A flight that holds its key's reload lock (or a batch's key whose lock the batch took):
/// its load, its fenced writes, and the end of the lock on every path. Owns the lock's guard,
/// what this process had heard of the key before the lock was taken, and the callers its
/// answer goes to.
pub(in crate::cache) struct Leader<'a> {
    pub(super) inner: &'a Inner,
    pub(super) guard: LockGuard,
    pub(super) stamp: Option<Stamp>,
    pub(super) flight: Option<&'a FlightPosts>,
}

impl Inner {
    /// Encodes a loaded value with its load's start and time (and tags, and stale windows),
    /// fresh for its `life`: its TTL (or the default TTL), plus a random share of its jitter
    /// (or the cache's).
    pub(in crate::cache) fn ready_to_store(
        &self,
        bytes: &[u8],
        life: Life,
        (started, load_time): (SystemTime, Duration),
        tagged: Option<&Tagged>,
        windows: Option<Windows>,
    ) -> ReadyValue {
        let fresh_for = self.config.lives.fresh_for(life);
        let (encoded, value) = entry::encode_value(bytes, started, load_time, tagged, windows);
        ReadyValue {
            value,
            encoded,
            fresh_for,
            store_ttl: fresh_for.saturating_add(self.config.lives.keep()),
            load_time,
        }
    }

    /// Keeps a value this process loaded in its L1, after its write to the store (a fill or
    /// a put) succeeded or failed: `stamp` is what the process had heard of the key before
    /// the load. One rule whatever became of the write: a tagged value is kept only if none
    /// of its tags was invalidated since its clock (one round trip; none for an untagged
    /// value), so a value outdated during its load is never kept, even while the store fails;
    /// and the `flight` it answers is marked [outdated](FlightPosts::outdated).
    pub(super) async fn keep_loaded(
        &self,
        stamp: Option<Stamp>,
        digest: KeyDigest,
        ready: &ReadyValue,
        tagged: Option<&Tagged>,
        flight: Option<&FlightPosts>,
    ) {
        if let Some(tags) = self.loaded_tags_hold(tagged, flight).await {
            self.l1_insert(
                stamp,
                tags,
                digest,
                &ready.value,
                ready.fresh_for,
                ready.load_time,
            );
        }
    }

    /// The stamps of a loaded value's tags if none of them was invalidated since its clock
    /// (one round trip; none for an untagged value). If one was, the `flight` the value
    /// answers is marked [outdated](FlightPosts::outdated) before its answer is posted, so
    /// that its joiners, who may have come after the invalidation, fetch again. Every path
    /// that answers a flight with a value it loaded under a tag clock goes through here.
    pub(super) async fn loaded_tags_hold(
        &self,
        tagged: Option<&Tagged>,
        flight: Option<&FlightPosts>,
    ) -> Option<TagStamps> {
        let Some(tagged) = tagged else {
            return Some(TagStamps::default());
        };
        let tags = self.tags_valid(tagged).await;
        if let (Ok(None), Some(flight)) = (&tags, flight) {
            flight.outdated();
        }
        tags.ok().flatten()
    }

    /// Runs a loader in a task of its own, handed the `previous` value if there is one,
    /// bounded by the load timeout (a leader's [watchdog](crate::cache::renewals::Watchdog) renews its
    /// lock meanwhile). A loader that answers "not modified" without a previous value fails.
    pub(in crate::cache) async fn load(
        &self,
        loader: BoxLoader,
        previous: Option<Previous>,
    ) -> Result<Loaded, Error> {
        let had_previous = previous.is_some();
        match self.load_watched(loader.run(previous)).await {
            Ok(Loaded {
                kind: LoadedKind::NotModified { .. },
                ..
            }) if !had_previous => Err(Error::load(
                "the loader answered \"not modified\" without a previous value".into(),
            )),
            loaded => loaded,
        }
    }

    /// Runs a load in a task of its own, counted, bounded by the load timeout.
    pub(in crate::cache) async fn load_watched<T: Send + 'static>(
        &self,
        load: BoxFuture<'static, Result<T, BoxError>>,
    ) -> Result<T, Error> {
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        let config = &self.config;
        let started = Instant::now();
        let mut task = tokio::spawn(load);
        let joined = tokio::time::timeout(config.loads.load_timeout, &mut task).await;
        self.meter.load(started.elapsed());
        match joined {
            Ok(Ok(Ok(loaded))) => Ok(loaded),
            Ok(Ok(Err(error))) => Err(Error::load(error)),
            Ok(Err(_)) => Err(Error::new(ErrorKind::LoadPanicked)),
            Err(_) => {
                task.abort();
                Err(Error::load_timeout(config.loads.load_timeout))
            }
        }
    }

    /// The tag clock a load's value is stamped with, read before the load: where tags may
    /// come back (`tagged`: the key's last value had tags; or a loader of this process has
    /// returned tags), the current clock, so that a tag invalidation after this read
    /// outdates the value. Elsewhere (an application without tags) no round trip but the
    /// process's first load's: the clock it read then stands in, which is no later than the
    /// clock at this load's start, so an invalidation since (or a new generation) outdates
    /// the value, never the other way round.
    pub(super) async fn clock_for_load(&self, tagged: bool) -> Option<TagClock> {
        if tagged || self.known_tags.seen() {
            self.tag_clock().await
        } else {
            self.first_tag_clock().await
        }
    }
}

impl<'a> Leader<'a> {
    /// The leader of a key whose lock `guard` holds: `stamp`, what this process had heard of
    /// the key before the lock was taken; `flight`, the callers its answer goes to (none for
    /// a batch's key).
    pub(super) fn holding(
        inner: &'a Inner,
        guard: LockGuard,
        stamp: Option<Stamp>,
        flight: Option<&'a FlightPosts>,
    ) -> Self {
        Leader {
            inner,
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
        inner: &'a Inner,
        seen: LeaderStart,
        key: StoreKey,
        token: LockToken,
        loader: BoxLoader,
        stale: Option<StaleValue>,
        early: Option<&'a FlightPosts>,
    ) -> FlightResult {
        let mut posted = false;
        if let (Some(stale), Some(early), true) =
            (&stale, early, inner.config.loads.refresh_in_background)
        {
            if let Some(left) = stale.window_left(&inner.config.lives) {
                posted = true;
                // Servable to the callers that join this flight only while it is within the
                // stale window, and nothing was heard of its key or tags since it was read;
                // later joiners wait for the load's answer.
                let until = crate::sync::later(Instant::now(), left);
                let holds = unchanged_since(
                    inner.l1.notifier(),
                    *key.digest(),
                    seen.stamp,
                    &stale.tag_stamps,
                );
                early.post(Some((
                    Ok(Fetched::cached(
                        stale.payload.clone(),
                        Outcome::Stale,
                        stale.fresh_until(),
                    )),
                    Some(Early { until, holds }),
                )));
            }
        }
        let _watchdog = inner
            .renewals
            .watch(vec![key.clone()], token, seen.asked_at);
        let mut leader = Leader {
            inner,
            guard: LockGuard::new(&inner.store, key, token, seen.asked_at),
            stamp: seen.stamp,
            flight: early,
        };
        let clock = inner.clock_for_load(seen.tagged).await;
        let (started, started_at) = (Instant::now(), crate::clock::now());
        let previous = leader.previous(stale.as_ref()).await;
        let had_previous = previous.is_some();
        let soft = leader.soft_timeout(loader.soft_timeout(), stale.as_ref(), posted);
        let load = inner.load(loader, previous);
        let loaded = super::soft::within(load, soft, || {
            if let Some(stale) = &stale {
                leader.post_soft(stale);
            }
        })
        .await;
        let load_time = started.elapsed();
        // A result for the waiters only is a failed load for an early refresh (nobody waits;
        // the value it refreshes stays), and, for a failure's answer, where a stale value
        // stands in for it.
        let loaded = match loaded {
            Ok(Loaded {
                kind: LoadedKind::ForWaiters { failed, .. },
                ..
            }) if seen.speculative
                || (failed
                    && stale
                        .as_ref()
                        .is_some_and(|stale| stale.serves_on_error(&inner.config.lives))) =>
            {
                Err(Error::load(
                    "the load's result is for its waiters only".into(),
                ))
            }
            loaded => loaded,
        };
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                leader.tell_failure(seen.speculative).await;
                let overtaken = early.is_some_and(FlightPosts::is_overtaken);
                return match stale {
                    Some(stale)
                        if stale.serves_on_error(&inner.config.lives)
                            && stale
                                .still_stands(inner, &leader.guard.key, overtaken)
                                .await =>
                    {
                        warn!(key = ?leader.guard.key, error = &error as &dyn std::error::Error, "load failed; serving the stale value");
                        Ok(stale.answer())
                    }
                    _ => Err(error),
                };
            }
        };
        if !loaded.tags.is_empty() {
            inner.known_tags.mark_seen();
        }
        let kept = stale.is_some();
        let life = loaded.life();
        if let (LoadedKind::NotModified { .. }, Some(stale), true) =
            (&loaded.kind, stale, had_previous)
        {
            return Ok(leader.renew(stale, life, started_at).await);
        }
        match (loaded.kind, tagged(loaded.tags, clock)) {
            (LoadedKind::Value { bytes, .. }, Err(TagsNotStorable)) => {
                warn!(key = ?leader.guard.key, "a value without the namespace's generation (the tag clock), or with too many tags, is not stored");
                leader.release_lock().await;
                Ok(Fetched::loaded(bytes, Outcome::Leader))
            }
            (LoadedKind::Value { bytes, .. }, Ok(tagged)) => {
                let load = (started_at, load_time);
                let fill =
                    inner.ready_to_store(&bytes, life, load, Some(&tagged), Some(loaded.windows));
                leader.fill_value(&fill, Some(&tagged)).await;
                Ok(Fetched::loaded(fill.value, Outcome::Leader))
            }
            (LoadedKind::ForWaiters { bytes, .. }, _) => {
                // Kept for as long as the followers take to read it; never in L1. A value
                // kept past its freshness stays in its place, for the next load to revalidate:
                // the answer goes beside it (the followers that find it still stale look
                // there); else it takes the value's place, where followers find it at once.
                let ttl = inner.config.waiters_ttl();
                let answer = entry::encode_for_waiters(&bytes, started_at, load_time, ttl);
                let written = if kept {
                    inner
                        .store
                        .answer_waiters(&leader.guard.key, token, answer, ttl)
                } else {
                    inner.store.fill(&leader.guard.key, token, answer, ttl)
                };
                if let Ok(filled) = inner.breaker.finish(written).await {
                    leader.guard.disarm();
                    if !filled {
                        inner.meter.lock(LockEvent::Lost);
                    }
                }
                Ok(Fetched::loaded(bytes, Outcome::Leader))
            }
            // `load` lets "not modified" through only with a previous value, which renewed.
            (kind @ (LoadedKind::Pass { .. } | LoadedKind::NotModified { .. }), _) => {
                let handoff = match kind {
                    LoadedKind::Pass { handoff } => handoff,
                    _ => None,
                };
                let pass = entry::encode_pass(started_at, handoff.is_some());
                if let Ok(true | false) = inner
                    .breaker
                    .finish(inner.store.fill(
                        &leader.guard.key,
                        token,
                        pass,
                        inner.config.lives.pass_ttl,
                    ))
                    .await
                {
                    leader.guard.disarm();
                }
                Ok(Fetched::pass_with(handoff))
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
        let (inner, guard) = (self.inner, &self.guard);
        let encoded = fill.encoded.clone();
        let filled = inner
            .breaker
            .finish(
                inner
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
        let (inner, stamp, flight) = (self.inner, self.stamp, self.flight);
        let guard = &mut self.guard;
        let digest = *guard.key.digest();
        match written {
            Ok(written) => {
                // The write dropped the lock, or the lock was no longer ours.
                guard.disarm();
                if written {
                    // The write's own notification moved the stamp on once.
                    let stamp = stamp.map(|stamp| inner.l1.after_own_write(stamp));
                    inner.keep_loaded(stamp, digest, fill, tagged, flight).await;
                } else {
                    inner.meter.lock(LockEvent::Lost);
                    warn!(key = ?guard.key, "lock lost before the fill; a newer leader owns the key");
                    // Not kept, but it still answers the flight.
                    inner.loaded_tags_hold(tagged, flight).await;
                }
            }
            Err(error) => {
                warn!(key = ?guard.key, %error, "fill failed; value kept in this process only");
                inner.keep_loaded(stamp, digest, fill, tagged, flight).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn values_are_stored_with_the_clock_read_before_the_load_and_only_then() {
        let clock = TagClock {
            generation: 9,
            clock: 4,
        };
        let tags = vec![KeyDigest::of_tag(b"a")];
        assert_eq!(
            tagged(Vec::new(), None),
            Err(TagsNotStorable),
            "untagged needs the clock too, for its generation"
        );
        assert_eq!(
            tagged(Vec::new(), Some(clock)),
            Ok(Tagged {
                generation: Some(9),
                clock: 4,
                tags: Vec::new(),
            }),
            "untagged carries the generation"
        );
        let stored = tagged(tags.clone(), Some(clock)).expect("storable");
        assert_eq!(
            stored,
            Tagged {
                generation: Some(9),
                clock: 4,
                tags: tags.clone(),
            }
        );
        assert_eq!(tagged(tags, None), Err(TagsNotStorable), "no clock");
        let too_many = (0..=entry::MAX_TAGS as u32)
            .map(|i| KeyDigest::of_tag(&i.to_be_bytes()))
            .collect();
        assert_eq!(tagged(too_many, Some(clock)), Err(TagsNotStorable));
    }

    #[test]
    fn a_value_ready_to_store_is_kept_past_its_freshness_for_the_stale_windows() {
        let cache = crate::Cache::builder(MemoryStore::new())
            .ttl(Duration::from_secs(60))
            .stale(Duration::from_secs(30))
            .build();
        let load = (SystemTime::UNIX_EPOCH, Duration::from_millis(3));
        let ready = cache
            .inner
            .ready_to_store(b"v", Life::default(), load, None, None);
        assert_eq!(ready.fresh_for, Duration::from_secs(60), "the default TTL");
        assert_eq!(ready.store_ttl, Duration::from_secs(90));
        assert_eq!(&ready.value[..], b"v");
        let five = Life {
            ttl: Some(Duration::from_secs(5)),
            jitter: None,
        };
        let ready = cache.inner.ready_to_store(b"v", five, load, None, None);
        assert_eq!(ready.store_ttl, Duration::from_secs(35), "the loader's TTL");
    }
}
