//! What this process knows of tags: whether its loaders return any, the tag clock it read for
//! loads that expect none, the namespace's generation, and the tag versions it read, kept
//! while notifications keep them right (see the `tags` module for how values are checked
//! against them).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::{KeyDigest, Stamp, TagClock, TagVersions};

/// How many tags' versions a process keeps; past it, it forgets them all and reads again.
const MAX_KNOWN_TAGS: usize = 4096;

/// What this process knows of tags; see the module docs.
#[derive(Default)]
pub(super) struct KnownTags {
    /// Whether a loader of this process has returned tags: from then on every leader reads
    /// the tag clock before its load.
    seen: AtomicBool,
    /// The tag clock read for loads that expect no tags, with the stamp of
    /// [`CLEARS`] taken before the read: kept while that stamp is current and the store is
    /// not found in another generation.
    first_clock: Mutex<Option<(TagClock, Stamp)>>,
    /// The namespace's generation as last read, with the stamp of [`CLEARS`] taken before the
    /// read, and how long it may be kept.
    generation: Mutex<Option<(u64, Stamp, Instant)>>,
    /// The tag versions read, each with the stamp its tag had just before the read and how
    /// long it may be kept.
    versions: Mutex<HashMap<KeyDigest, Known>>,
    /// Whether a read of the tag state is under way, and its end: the other readers of values
    /// without tags, and loads that expect none, wait for it rather than each read it.
    reading: AtomicBool,
    read_ended: Notify,
    /// When the last read of the tag state was sent.
    read_sent: Mutex<Option<Instant>>,
}

struct Known {
    generation: u64,
    version: u64,
    stamp: Stamp,
    until: Instant,
}

/// A read of the tag state under way (see [`KnownTags::read_tag_state`]): dropped, answered
/// or not, it lets the waiting readers go.
pub(super) struct TagStateRead<'a>(&'a KnownTags);

impl Drop for TagStateRead<'_> {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::Release);
        self.0.read_ended.notify_waiters();
    }
}

/// The digest whose stamp stands for the namespace's generation: a clear moves every stamp on
/// (see [`Notifier::cleared`](crate::store::Notifier::cleared)), so any key's would do; this
/// one is nobody's.
pub(super) const CLEARS: KeyDigest = KeyDigest::from_bytes([0; 32]);

impl KnownTags {
    /// Whether a loader of this process has returned tags.
    pub(super) fn seen(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }

    /// Notes that a loader returned tags.
    pub(super) fn mark_seen(&self) {
        self.seen.store(true, Ordering::Relaxed);
    }

    /// A tag clock for a load that does not expect tags: the one read last, while `stamp` (of
    /// [`CLEARS`], taken now) is the one taken before that read, else one read now with `read`.
    /// A clock no later than the current one, in the current generation (as far as this
    /// process has heard), so an application without tags pays for tags one round trip per
    /// clear heard of, not one per load (and the loads that start together share it). `None`
    /// while the store does not answer.
    pub(super) async fn first_clock(
        &self,
        stamp: Option<Stamp>,
        read: impl Future<Output = Option<TagClock>>,
    ) -> Option<TagClock> {
        if let Some(clock) = self.kept_clock(stamp) {
            return Some(clock);
        }
        let _reading = match stamp {
            Some(_) => match self.read_tag_state(None).await {
                Some(reading) => Some(reading),
                None => {
                    if let Some(clock) = self.kept_clock(stamp) {
                        return Some(clock);
                    }
                    // That read failed, or read the generation alone: this one reads.
                    None
                }
            },
            None => None,
        };
        let clock = read.await?;
        if let Some(stamp) = stamp {
            *crate::sync::lock(&self.first_clock) = Some((clock, stamp));
        }
        Some(clock)
    }

    /// The clock kept for loads, if it was read under `stamp` (of [`CLEARS`], taken now).
    fn kept_clock(&self, stamp: Option<Stamp>) -> Option<TagClock> {
        let (clock, at) = (*crate::sync::lock(&self.first_clock))?;
        (Some(at) == stamp).then_some(clock)
    }

    /// The namespace's generation, if it was read under `stamp` (of [`CLEARS`], taken now)
    /// and may still be kept at `now`.
    pub(super) fn generation(&self, stamp: Option<Stamp>, now: Instant) -> Option<u64> {
        let (generation, at, until) = (*crate::sync::lock(&self.generation))?;
        (Some(at) == stamp && now < until).then_some(generation)
    }

    /// Lets one caller read the namespace's tag state (its generation, or its clock, which
    /// carries the generation) at a time: the guard of the read for the caller that makes it,
    /// which ends the others' wait when dropped; `None` for the others, once a read they may
    /// use has ended (then what it read is kept, if the store answered). A burst of readers
    /// of values without tags, or of loads that expect none, in a process that does not know
    /// the generation yet, so reads it once or twice rather than once each.
    ///
    /// A read sent before `after` does not do: what it read may be older than what the caller
    /// checks (a value read from the store at `after` must be checked against a generation
    /// read after it, or a clear between the two would go unseen). Such a caller waits for
    /// that read to end, then for the next, or makes it.
    pub(super) async fn read_tag_state(&self, after: Option<Instant>) -> Option<TagStateRead<'_>> {
        loop {
            let ended = self.read_ended.notified();
            tokio::pin!(ended);
            // Registered before the flag is looked at: a read that ends in between still
            // wakes it.
            ended.as_mut().enable();
            if !self.reading.swap(true, Ordering::AcqRel) {
                *crate::sync::lock(&self.read_sent) = Some(Instant::now());
                return Some(TagStateRead(self));
            }
            ended.await;
            let sent = *crate::sync::lock(&self.read_sent);
            if after.is_none_or(|after| sent.is_some_and(|sent| sent >= after)) {
                return None;
            }
        }
    }

    /// Keeps the namespace's `generation` just read, under `stamp` (of [`CLEARS`], taken
    /// before the read), until `until`; the clock kept for loads goes if it is of another.
    pub(super) fn learn_generation(&self, generation: u64, stamp: Option<Stamp>, until: Instant) {
        let mut first = crate::sync::lock(&self.first_clock);
        if first.is_some_and(|(clock, _)| clock.generation != generation) {
            *first = None;
        }
        drop(first);
        if let Some(stamp) = stamp {
            *crate::sync::lock(&self.generation) = Some((generation, stamp, until));
        }
    }

    /// Forgets the generation and the clock kept: this process cleared the namespace.
    pub(super) fn forget_generation(&self) {
        *crate::sync::lock(&self.first_clock) = None;
        *crate::sync::lock(&self.generation) = None;
    }

    /// The versions of `tags` in `generation`, if every one is known in it under its current
    /// stamp (`live`). Known in another generation, a version is read again: the store's
    /// generation may have changed since either was read, and only the store can say.
    pub(super) fn versions(
        &self,
        generation: u64,
        tags: &[KeyDigest],
        live: &[Stamp],
        now: Instant,
    ) -> Option<Vec<u64>> {
        let known = crate::sync::lock(&self.versions);
        tags.iter()
            .zip(live)
            .map(|(tag, stamp)| {
                known
                    .get(tag)
                    .filter(|known| {
                        known.generation == generation && known.stamp == *stamp && now < known.until
                    })
                    .map(|known| known.version)
            })
            .collect()
    }

    /// Keeps the versions of `tags` just read, under the stamps taken before the read.
    pub(super) fn learn(
        &self,
        tags: &[KeyDigest],
        versions: &TagVersions,
        live: &[Stamp],
        until: Instant,
    ) {
        let mut known = crate::sync::lock(&self.versions);
        if known.len() + tags.len() > MAX_KNOWN_TAGS {
            known.clear();
        }
        for ((tag, version), stamp) in tags.iter().zip(&versions.versions).zip(live) {
            known.insert(
                *tag,
                Known {
                    generation: versions.generation,
                    version: *version,
                    stamp: *stamp,
                    until,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{MemoryStore, Store};

    /// Two different stamps of one tag: before and after a change this process heard of.
    fn stamps(tag: &KeyDigest) -> (Stamp, Stamp) {
        let store = MemoryStore::new();
        let before = store.notifier().expect("a notifier").stamp_anyway(tag);
        (before, before.after_own_change())
    }

    #[tokio::test(start_paused = true)]
    async fn versions_are_known_under_their_stamp_generation_and_time() {
        let known = KnownTags::default();
        let (a, b) = (KeyDigest::of_tag(b"a"), KeyDigest::of_tag(b"b"));
        let (stamp, changed) = stamps(&a);
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        let read = TagVersions {
            generation: 7,
            versions: vec![3, 0],
        };
        known.learn(&[a, b], &read, &[stamp, stamp], until);
        assert_eq!(
            known.versions(7, &[a, b], &[stamp, stamp], now),
            Some(vec![3, 0])
        );
        assert_eq!(known.versions(8, &[a], &[stamp], now), None, "generation");
        assert_eq!(
            known.versions(7, &[a], &[changed], now),
            None,
            "heard since"
        );
        assert_eq!(
            known.versions(7, &[a], &[stamp], until),
            None,
            "kept too long"
        );
        let c = KeyDigest::of_tag(b"c");
        assert_eq!(
            known.versions(7, &[a, c], &[stamp, stamp], now),
            None,
            "one unknown"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_most_tags_it_forgets_them_all() {
        let known = KnownTags::default();
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        let stamp = Stamp::UNTRACKED;
        let tags: Vec<KeyDigest> = (0..MAX_KNOWN_TAGS as u32)
            .map(|i| KeyDigest::of_tag(&i.to_be_bytes()))
            .collect();
        let read = TagVersions {
            generation: 1,
            versions: vec![1; tags.len()],
        };
        known.learn(&tags, &read, &vec![stamp; tags.len()], until);
        assert!(known.versions(1, &tags[..1], &[stamp], now).is_some());
        let one_more = [KeyDigest::of_tag(b"one more")];
        let read = TagVersions {
            generation: 1,
            versions: vec![1],
        };
        known.learn(&one_more, &read, &[stamp], until);
        assert!(known.versions(1, &tags[..1], &[stamp], now).is_none());
        assert!(known.versions(1, &one_more, &[stamp], now).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_for_loads_is_kept_under_its_stamp_and_generation() {
        let known = KnownTags::default();
        assert!(!known.seen());
        let (stamp, changed) = stamps(&CLEARS);
        assert_eq!(known.first_clock(Some(stamp), async { None }).await, None);
        let clock = TagClock {
            generation: 1,
            clock: 2,
        };
        let later = TagClock {
            generation: 1,
            clock: 3,
        };
        let read = |clock| async move { Some(clock) };
        assert_eq!(
            known.first_clock(Some(stamp), read(clock)).await,
            Some(clock)
        );
        assert_eq!(
            known.first_clock(Some(stamp), read(later)).await,
            Some(clock)
        );
        // Heard of a change (a clear): read again.
        assert_eq!(
            known.first_clock(Some(changed), read(later)).await,
            Some(later)
        );
        // Notifications lost: read each time, nothing kept.
        let cleared = TagClock {
            generation: 9,
            clock: 0,
        };
        assert_eq!(known.first_clock(None, read(cleared)).await, Some(cleared));
        assert_eq!(
            known.first_clock(Some(changed), read(clock)).await,
            Some(later)
        );
        // The store found in another generation: the kept clock goes.
        let now = Instant::now();
        known.learn_generation(9, Some(changed), now + Duration::from_secs(1));
        assert_eq!(known.generation(Some(changed), now), Some(9));
        assert_eq!(known.generation(Some(stamp), now), None, "another stamp");
        assert_eq!(known.generation(None, now), None, "notifications lost");
        assert_eq!(
            known.first_clock(Some(changed), read(cleared)).await,
            Some(cleared)
        );
        known.forget_generation();
        assert_eq!(known.generation(Some(changed), now), None);
        known.mark_seen();
        assert!(known.seen());
    }
}
