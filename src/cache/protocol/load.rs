//! A load, as every role runs it: the loader in a task of its own, bounded by the load
//! timeout and counted; the tag clock read before it; its value made ready for the store, and
//! kept in L1 where its tags still hold. The services `Leader`, `Follower` and `Batch` share.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;

use crate::cache::carry::FlightPosts;
use crate::cache::config::Life;
use crate::cache::entry::{self, Tagged, Windows};
use crate::cache::error::{BoxError, Error, ErrorKind};
use crate::cache::flight::BoxLoader;
use crate::cache::loaded::LoadedKind;
use crate::cache::loaded::{Loaded, Previous};
use crate::cache::parts::Parts;
use crate::store::{BoxFuture, KeyDigest, Stamp, TagClock};

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

impl Parts {
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
        let fresh_for = self.lives.fresh_for(life);
        let (encoded, value) = entry::encode_value(bytes, started, load_time, tagged, windows);
        ReadyValue {
            value,
            encoded,
            fresh_for,
            store_ttl: fresh_for.saturating_add(self.lives.keep()),
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
        if let Some(tags) = self.tags().loaded_tags_hold(tagged, flight).await {
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
        let started = Instant::now();
        let mut task = tokio::spawn(load);
        let joined = tokio::time::timeout(self.loads.load_timeout, &mut task).await;
        self.meter.load(started.elapsed());
        match joined {
            Ok(Ok(Ok(loaded))) => Ok(loaded),
            Ok(Ok(Err(error))) => Err(Error::load(error)),
            Ok(Err(joined)) => Err(match joined.try_into_panic() {
                Ok(payload) => Error::panicked(&*payload),
                // Cancelled: its runtime shut down under it.
                Err(_) => Error::new(ErrorKind::LoadPanicked),
            }),
            Err(_) => {
                task.abort();
                Err(Error::load_timeout(self.loads.load_timeout))
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
        let parts = &cache.inner.parts;
        let ready = parts.ready_to_store(b"v", Life::default(), load, None, None);
        assert_eq!(ready.fresh_for, Duration::from_secs(60), "the default TTL");
        assert_eq!(ready.store_ttl, Duration::from_secs(90));
        assert_eq!(&ready.value[..], b"v");
        let five = Life {
            ttl: Some(Duration::from_secs(5)),
            jitter: None,
        };
        let ready = parts.ready_to_store(b"v", five, load, None, None);
        assert_eq!(ready.store_ttl, Duration::from_secs(35), "the loader's TTL");
    }
}
