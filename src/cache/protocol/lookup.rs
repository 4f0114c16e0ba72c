//! One lookup: "the value, or the lock" in one store call, and what it found, decoded for
//! the flight's caller and checked against its tags.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::cache::breaker::Breaker;
use crate::cache::entry::{Corrupt, Entry};
use crate::cache::flight::Reader;
use crate::cache::l1::{TagStamps, L1};
use crate::cache::parts::Parts;
use crate::cache::tags::TagChecks;
use crate::store::{
    FillWatch, LockState, LockToken, LockWhen, Lookup, Store, StoreError, StoreKey,
};

/// What one lookup found: the lock's state, and the value (decoded for the flight's caller)
/// with its remaining life in the store.
pub(in crate::cache) struct LookupFound {
    pub(in crate::cache) lock: LockState,
    pub(in crate::cache) entry: Option<(Result<Entry, Corrupt>, Option<Duration>)>,
    /// The stamps of a valid tagged value's tags.
    pub(in crate::cache) tag_stamps: TagStamps,
    /// The value was this engine's, but one of its tags was invalidated since its load.
    pub(in crate::cache) outdated: bool,
}

impl LookupFound {
    /// The value found, taken out, if the lookup calls it fresh (it did not ask for the lock)
    /// and it is a value this caller reads.
    pub(super) fn take_fresh(&mut self) -> Option<FreshValue> {
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

    /// Whether the value found carried tags (or was outdated by them or by a clear).
    pub(in crate::cache) fn tagged(&self) -> bool {
        self.outdated
            || matches!(
                &self.entry,
                Some((Ok(Entry::Value { tags: Some(tagged), .. }), _)) if !tagged.tags.is_empty()
            )
    }
}

/// A fresh value a lookup found, with its remaining life in the store and its tags' stamps.
pub(super) struct FreshValue {
    pub(super) payload: Bytes,
    pub(super) load_time: Duration,
    pub(super) ttl: Option<Duration>,
    pub(super) tag_stamps: TagStamps,
}

/// The lookups of one flight (or peek, or batch): they read the store through the breaker,
/// watch its fills, and check what they find against its tags. Made by
/// [`Parts::lookups`](crate::cache::parts::Parts::lookups).
pub(in crate::cache) struct Lookups<'a> {
    pub(in crate::cache) store: &'a dyn Store,
    pub(in crate::cache) breaker: &'a Arc<Breaker>,
    pub(in crate::cache) l1: &'a L1,
    pub(in crate::cache) tags: TagChecks<'a>,
    pub(in crate::cache) lock_ttl: Duration,
    /// Whether the store's notifications are used (wake waits, keep L1 in step).
    pub(in crate::cache) notifications: bool,
    pub(in crate::cache) store_timeout: Duration,
}

impl Parts {
    /// The lookups of a flight, over the components they read.
    pub(in crate::cache) fn lookups(&self) -> Lookups<'_> {
        Lookups {
            store: &*self.store,
            breaker: &self.breaker,
            l1: &self.l1,
            tags: self.tags(),
            lock_ttl: self.loads.lock_ttl,
            notifications: self.l1_settings.notifications,
            store_timeout: self.breaker_settings.store_timeout,
        }
    }
}

impl<'a> Lookups<'a> {
    /// A watch of `key`'s fills, when notifications are on. Taken before the first read, so a
    /// fill that lands between a read and the wait wakes the wait; the backoff poll stays as
    /// the fallback for lost notifications.
    pub(in crate::cache) fn watch_fills(&self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        if self.notifications {
            self.store.subscribe(key)
        } else {
            None
        }
    }

    /// [`watch_fills`](Self::watch_fills), and then, if the store's subscription is on its way
    /// (a namespace's first, or one made again after its connection dropped), a wait of at
    /// most `store_timeout` for it: what is read before it is in place cannot enter L1, so the
    /// first reads of a new process would all be missed by L1. No wait while store calls fail
    /// (the breaker open, or a call failed since the store last answered): the lookup will not
    /// be made or will most likely fail too, and a subscription cannot complete while the
    /// store is down, so the wait would only add `store_timeout` to every call.
    pub(in crate::cache) async fn watch_fills_subscribed(
        &self,
        key: &'a StoreKey,
    ) -> Option<FillWatch<'a>> {
        let filled = self.watch_fills(key);
        if let (Some(_), Some(notifier)) = (&filled, self.l1.notifier()) {
            if !notifier.receiving() && self.breaker.answering() {
                // Boxed: a rare wait, kept out of every lookup's state.
                Box::pin(notifier.received_within(self.store_timeout)).await;
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
    ) -> Result<LookupFound, StoreError> {
        if let Some(filled) = filled.as_mut() {
            filled.mark_seen();
        }
        let lookup = self
            .breaker
            .call_from(now, self.store.lookup(key, token, self.lock_ttl, lock_when))
            .await?;
        self.found(lookup, reader).await
    }

    /// What a lookup found, decoded for `reader`'s caller and checked against its tags.
    pub(in crate::cache) async fn found(
        &self,
        lookup: Lookup,
        reader: Reader<'_>,
    ) -> Result<LookupFound, StoreError> {
        let mut found = LookupFound {
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

    /// Checks the tags of a tagged value a lookup found: a value whose tags were invalidated
    /// since its load becomes a miss that this flight overwrites (as a corrupt entry is, but
    /// not counted as one). Where the lookup took the lock, only if the store keeps values
    /// past their freshness: the flight reloads the value anyway, but would serve it stale
    /// meanwhile, in place of a failed load, or hand it to a revalidating loader.
    async fn check_tags(&self, found: &mut LookupFound) -> Result<(), StoreError> {
        if found.lock == LockState::Acquired && !self.tags.keeps_stale {
            return Ok(());
        }
        let Some((
            Ok(Entry::Value {
                tags: Some(tagged), ..
            }),
            ttl,
        )) = &found.entry
        else {
            return Ok(());
        };
        if self.tags.known_valid(tagged) {
            return Ok(());
        }
        // Boxed: a lookup's state stays small without this wait.
        match Box::pin(self.tags.tags_valid(tagged)).await? {
            Some(stamps) => found.tag_stamps = stamps,
            None => {
                found.entry = Some((Err(Corrupt), *ttl));
                found.outdated = true;
            }
        }
        Ok(())
    }
}
