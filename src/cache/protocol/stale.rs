//! Whether a stale value a flight read still stands when it is served: as an early answer
//! while its reload runs, or in place of a load (stale-if-error, or after a wait timeout). An
//! invalidated value is never served, stale or not, so a change made since the read, here or
//! in another process, by key or by tag, rules it out. And how long its stale windows let it
//! be served.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::lookup::{LookupFound, Lookups};
use crate::cache::config::Lives;
use crate::cache::entry::{Entry, Tagged, Windows};
use crate::cache::fetched::Fetched;
use crate::cache::l1::TagStamps;
use crate::cache::loaded::Previous;
use crate::cache::outcome::Outcome;
use crate::store::{KeyDigest, LockState, Notifier, Stamp, StoreKey};

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
    pub(super) fn of(found: &LookupFound, keep: Duration) -> Option<Self> {
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

impl StaleValue {
    /// Whether the value may be served at once while another leader refreshes it.
    pub(in crate::cache) fn serves_while_updating(&self, lives: &Lives) -> bool {
        self.window_left(lives).is_some()
    }

    /// How long the value may still be served while a leader refreshes it, if it may.
    pub(in crate::cache) fn window_left(&self, lives: &Lives) -> Option<Duration> {
        let window = self
            .windows
            .and_then(|w| w.while_revalidating)
            .unwrap_or(lives.stale);
        let staleness = self.staleness();
        (!window.is_zero() && staleness <= window).then(|| window - staleness)
    }

    /// Whether the value may stand in for a failed or too slow load.
    pub(in crate::cache) fn serves_on_error(&self, lives: &Lives) -> bool {
        self.error_window_left(lives).is_some()
    }

    /// How long the value may still stand in for a failed or too slow load, if it may.
    pub(in crate::cache) fn error_window_left(&self, lives: &Lives) -> Option<Duration> {
        let max = self
            .windows
            .and_then(|w| w.if_error)
            .unwrap_or_else(|| lives.stale_if_error());
        let staleness = self.staleness();
        (!max.is_zero() && staleness <= max).then(|| max - staleness)
    }

    /// Whether the value, read from `key`, may still be served: no change of this process has
    /// overtaken the flight that read it (`overtaken`), the store still keeps the same value
    /// (an invalidation removed it, a write replaced it), and none of its tags was invalidated
    /// since its load. One or two store calls through the `lookups`' breaker, on the failure
    /// path only. A check that cannot be made (the store fails) rules the value out: an error
    /// rather than a value that may have been invalidated.
    pub(in crate::cache) async fn still_stands(
        &self,
        lookups: &Lookups<'_>,
        key: &StoreKey,
        overtaken: bool,
    ) -> bool {
        if overtaken {
            return false;
        }
        let Ok(Some(stored)) = lookups.breaker.call(lookups.store.get(key)).await else {
            return false;
        };
        let same = matches!(
            crate::cache::entry::decode(stored.bytes),
            Ok(Entry::Value { payload, .. }) if payload == self.payload
        );
        if !same {
            return false;
        }
        match &self.tags {
            Some(tagged) => matches!(lookups.tags.tags_valid(tagged).await, Ok(Some(_))),
            None => true,
        }
    }
}

/// A test that nothing was heard of the key `digest` (since `stamp`) nor of the tags (since
/// their stamps) of a stale value read from it, by `notifier`: for an early answer, which a
/// change made in another process must withdraw once this process hears of it. `None` (no
/// test) where notifications are off or lost: then the stale window alone bounds it.
pub(in crate::cache) fn unchanged_since(
    notifier: Option<&Notifier>,
    digest: KeyDigest,
    stamp: Option<Stamp>,
    tags: &TagStamps,
) -> Option<Box<dyn Fn() -> bool + Send + Sync>> {
    let (notifier, stamp) = (notifier?.clone(), stamp?);
    let tags = tags.clone();
    Some(Box::new(move || {
        notifier.stamp(&digest) == Some(stamp)
            && tags
                .iter()
                .all(|(tag, stamp)| notifier.stamp_anyway(tag) == *stamp)
    }))
}
