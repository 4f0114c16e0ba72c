//! Whether a stale value a flight read still stands when it is served: as an early answer
//! while its reload runs, or in place of a load (stale-if-error, or after a wait timeout). An
//! invalidated value is never served, stale or not, so a change made since the read, here or
//! in another process, by key or by tag, rules it out.

use super::follower::StaleValue;
use crate::cache::entry::Entry;
use crate::cache::l1::TagStamps;
use crate::cache::Inner;
use crate::store::{KeyDigest, Stamp, StoreKey};

impl Inner {
    /// A test that nothing was heard of the key `digest` (since `stamp`) nor of the tags
    /// (since their stamps) of a stale value read from it: for an early answer, which a change
    /// made in another process must withdraw once this process hears of it. `None` (no test)
    /// where notifications are off or lost: then the stale window alone bounds it.
    pub(in crate::cache) fn unchanged_since(
        &self,
        digest: KeyDigest,
        stamp: Option<Stamp>,
        tags: &TagStamps,
    ) -> Option<Box<dyn Fn() -> bool + Send + Sync>> {
        let (notifier, stamp) = (self.l1.notifier()?.clone(), stamp?);
        let tags = tags.clone();
        Some(Box::new(move || {
            notifier.stamp(&digest) == Some(stamp)
                && tags
                    .iter()
                    .all(|(tag, stamp)| notifier.stamp_anyway(tag) == *stamp)
        }))
    }

    /// Whether `stale`, read from `key`, may still be served: no change of this process has
    /// overtaken the flight that read it (`overtaken`), the store still keeps the same value
    /// (an invalidation removed it, a write replaced it), and none of its tags was invalidated
    /// since its load. One or two store calls, on the failure path only. A check that cannot
    /// be made (the store fails) rules the value out: an error rather than a value that may
    /// have been invalidated.
    pub(in crate::cache) async fn still_stands(
        &self,
        key: &StoreKey,
        stale: &StaleValue,
        overtaken: bool,
    ) -> bool {
        if overtaken {
            return false;
        }
        let Ok(Some(stored)) = self.breaker.call(self.store.get(key)).await else {
            return false;
        };
        let same = matches!(
            crate::cache::entry::decode(stored.bytes),
            Ok(Entry::Value { payload, .. }) if payload == stale.payload
        );
        if !same {
            return false;
        }
        match &stale.tags {
            Some(tagged) => matches!(self.tags_valid(tagged).await, Ok(Some(_))),
            None => true,
        }
    }
}
