//! Tags: a loader attaches tags to a value ([`Loaded::tags`](super::Loaded::tags)), and
//! [`Cache::invalidate_tag`] makes every value carrying one of them a miss, in every process,
//! with a constant number of store calls (never a scan of keys).
//!
//! The store keeps, per namespace, a tag generation, a tag clock that each tag invalidation
//! moves on, and the clock at which each tag was last invalidated (see
//! [`store::tags`](crate::store::tags)). A leader reads the generation and clock before its
//! load and stores them with the value's tags; a read of a tagged value asks for its tags'
//! versions (one more round trip, for tagged values only) and treats the value as a miss if
//! the store is in another generation (its tag state was lost and started again) or any tag
//! was invalidated at a later clock: the value may have been loaded before the change that
//! the invalidation announces. Untagged values never pay for tags but the leader's clock read.
//!
//! L1 entries of tagged values also carry the stamps of their tags: the invalidation's
//! notifications (one per tag, as for a key with the tag's digest) drop them everywhere.
//!
//! The versions read are kept in-process ([`KnownVersions`]) under the same stamps, for at
//! most `l1_ttl_cap`, while notifications are received: a tagged value's L2 hit then costs
//! no second round trip as long as nothing was heard of its tags, exactly as an L1 entry
//! stays trusted. A tag invalidated elsewhere is re-read once its notification arrives (or
//! notifications are lost); without notifications, versions are always read from the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::entry::{Corrupt, Entry, Tagged};
use super::flight::Overtaken;
use super::follower::Found;
use super::l1::TagStamps;
use super::{Cache, Error, Inner};
use crate::store::{KeyDigest, LockState, Stamp, StoreError, StoreKey, TagClock, TagVersions};

impl Cache {
    /// Makes every value that carries `tag` a miss, in every process: see
    /// [`invalidate_tags`](Self::invalidate_tags).
    ///
    /// # Errors
    ///
    /// As for [`invalidate`](Self::invalidate).
    pub async fn invalidate_tag(&self, tag: impl AsRef<[u8]>) -> Result<(), Error> {
        self.invalidate_tags([tag]).await
    }

    /// Makes every value that carries one of `tags` a miss, in every process: the next read
    /// loads it again (one load per stampede, as for any miss). One store call, however many
    /// values carry the tags. A load that started before and fills after still fills, but
    /// its value counts as a miss at once, as its clock is older than the invalidation.
    ///
    /// # Errors
    ///
    /// As for [`invalidate`](Self::invalidate): this process's L1 has forgotten the tagged
    /// values all the same.
    pub async fn invalidate_tags<I, T>(&self, tags: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let inner = &self.inner;
        let digests: Vec<KeyDigest> = tags
            .into_iter()
            .map(|tag| KeyDigest::of_tag(tag.as_ref()))
            .collect();
        let keys: Vec<StoreKey> = digests
            .iter()
            .map(|tag| StoreKey::new(Arc::clone(&inner.config.namespace), *tag))
            .collect();
        let store = Arc::clone(&inner.store);
        inner
            .correct_all(
                &keys,
                Overtaken::Every,
                store.invalidate_tags(&inner.config.namespace, &digests),
            )
            .await
    }
}

impl Inner {
    /// The namespace's tag generation and clock, read before a load; `None` if the store did
    /// not answer (then a tagged value cannot be stored).
    pub(super) async fn tag_clock(&self) -> Option<TagClock> {
        self.store_call(self.store.tag_clock(&self.config.namespace))
            .await
            .ok()
    }

    /// The tag clock this process read first (reading it if none was read yet): a clock no
    /// later than the current one, in the generation of then, for a load that does not expect
    /// tags. One round trip in a process's life, so an application without tags pays for
    /// tags that once. `None` while the store does not answer.
    pub(super) async fn first_tag_clock(&self) -> Option<TagClock> {
        self.first_tag_clock
            .get_or_try_init(|| async { self.tag_clock().await.ok_or(()) })
            .await
            .ok()
            .copied()
    }

    /// The stamps of `tags`, taken before their versions are read.
    pub(super) fn tag_stamps(&self, tags: &[KeyDigest]) -> TagStamps {
        tags.iter()
            .map(|tag| (*tag, self.stamp_anyway(tag)))
            .collect()
    }

    /// Whether a value of `tagged` is still valid: none of its tags was invalidated since its
    /// clock. The stamps of its tags, taken before the versions are read, go with a valid one.
    ///
    /// The versions come from [`KnownVersions`] when every tag's is known and nothing has been
    /// heard of the tag since it was read (no round trip), else from the store.
    pub(super) async fn tags_valid(
        &self,
        tagged: &Tagged,
    ) -> Result<Option<TagStamps>, StoreError> {
        let stamps = self.tag_stamps(&tagged.tags);
        // Taken before the read, as the stamps: a change notified after them outdates what
        // is learnt. `None` while notifications are off or lost: then nothing is kept.
        let live: Option<Vec<Stamp>> = self
            .notifier()
            .and_then(|notifier| tagged.tags.iter().map(|tag| notifier.stamp(tag)).collect());
        let now = Instant::now();
        // A value of no generation is outdated whatever the store says.
        let Some(generation) = tagged.generation else {
            return Ok(None);
        };
        if let Some(live) = &live {
            if let Some(versions) = self.known_versions.get(generation, &tagged.tags, live, now) {
                return Ok(valid(&versions, tagged.clock).then_some(stamps));
            }
        }
        let versions = self
            .store_call(
                self.store
                    .tag_versions(&self.config.namespace, &tagged.tags),
            )
            .await?;
        // No tag state, or another generation: it was lost since the value's load.
        let Some(versions) = versions.filter(|versions| versions.generation == generation) else {
            return Ok(None);
        };
        if let Some(live) = live {
            let until = crate::sync::later(now, self.config.l1_ttl_cap);
            self.known_versions
                .learn(&tagged.tags, &versions, &live, until);
        }
        Ok(valid(&versions.versions, tagged.clock).then_some(stamps))
    }

    /// Checks the tags of a tagged value a lookup found: a value whose tags were invalidated
    /// since its load becomes a miss that this flight overwrites (as a corrupt entry is, but
    /// not counted as one). Where the lookup took the lock, only if the store keeps values
    /// past their freshness: the flight reloads the value anyway, but would serve it stale
    /// meanwhile, in place of a failed load, or hand it to a revalidating loader.
    pub(super) async fn check_tags(&self, found: &mut Found) -> Result<(), StoreError> {
        if found.lock == LockState::Acquired && self.config.keep().is_zero() {
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
        // Boxed: most values have no tags, and a lookup's state stays small without this wait.
        match Box::pin(self.tags_valid(tagged)).await? {
            Some(stamps) => found.tag_stamps = stamps,
            None => {
                found.entry = Some((Err(Corrupt), *ttl));
                found.outdated = true;
            }
        }
        Ok(())
    }
}

/// Whether a value loaded at `clock` survives tags at `versions`: none was invalidated later.
fn valid(versions: &[u64], clock: u64) -> bool {
    !versions.iter().any(|version| *version > clock)
}

/// How many tags' versions a process keeps; past it, it forgets them all and reads again.
const MAX_KNOWN_TAGS: usize = 4096;

/// The tag versions this process has read, each with the stamp its tag had just before the
/// read and how long it may be kept; see the module docs.
#[derive(Default)]
pub(super) struct KnownVersions(Mutex<HashMap<KeyDigest, Known>>);

struct Known {
    generation: u64,
    version: u64,
    stamp: Stamp,
    until: Instant,
}

impl KnownVersions {
    /// The versions of `tags` in `generation`, if every one is known in it under its current
    /// stamp (`live`). Known in another generation, a version is read again: the store's
    /// generation may have changed since either was read, and only the store can say.
    fn get(
        &self,
        generation: u64,
        tags: &[KeyDigest],
        live: &[Stamp],
        now: Instant,
    ) -> Option<Vec<u64>> {
        let known = crate::sync::lock(&self.0);
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
    fn learn(&self, tags: &[KeyDigest], versions: &TagVersions, live: &[Stamp], until: Instant) {
        let mut known = crate::sync::lock(&self.0);
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
