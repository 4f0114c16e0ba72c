//! What this process knows of tags: whether its loaders return any, the first tag clock it
//! read, and the tag versions it read, kept while notifications keep them right (see the
//! `tags` module for how values are checked against them).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::OnceCell;
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
    /// The first tag clock this process read, for its loads before then.
    first_clock: OnceCell<TagClock>,
    /// The tag versions read, each with the stamp its tag had just before the read and how
    /// long it may be kept.
    versions: Mutex<HashMap<KeyDigest, Known>>,
}

struct Known {
    generation: u64,
    version: u64,
    stamp: Stamp,
    until: Instant,
}

/// The store did not tell the tag clock.
struct NoClock;

impl KnownTags {
    /// Whether a loader of this process has returned tags.
    pub(super) fn seen(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }

    /// Notes that a loader returned tags.
    pub(super) fn mark_seen(&self) {
        self.seen.store(true, Ordering::Relaxed);
    }

    /// The tag clock this process read first, reading it with `read` if none was read yet:
    /// a clock no later than the current one, in the generation of then, for a load that does
    /// not expect tags. One round trip in a process's life, so an application without tags
    /// pays for tags that once. `None` while the store does not answer.
    pub(super) async fn first_clock(
        &self,
        read: impl Future<Output = Option<TagClock>>,
    ) -> Option<TagClock> {
        self.first_clock
            .get_or_try_init(|| async { read.await.ok_or(NoClock) })
            .await
            .ok()
            .copied()
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

    #[tokio::test]
    async fn the_first_clock_is_read_once_and_a_missing_answer_is_asked_again() {
        let known = KnownTags::default();
        assert!(!known.seen());
        assert_eq!(known.first_clock(async { None }).await, None);
        let clock = TagClock {
            generation: 1,
            clock: 2,
        };
        assert_eq!(known.first_clock(async { Some(clock) }).await, Some(clock));
        let later = TagClock {
            generation: 1,
            clock: 3,
        };
        assert_eq!(known.first_clock(async { Some(later) }).await, Some(clock));
        known.mark_seen();
        assert!(known.seen());
    }
}
