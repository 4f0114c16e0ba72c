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
//! the invalidation announces. A value without tags carries the generation too, so that
//! [`Cache::clear`] (a new generation) outdates it; it is checked against the generation this
//! process read last, kept as tag versions are (below): no round trip while nothing is heard.
//!
//! L1 entries of tagged values also carry the stamps of their tags: the invalidation's
//! notifications (one per tag, as for a key with the tag's digest) drop them everywhere.
//!
//! The versions read are kept in-process
//! ([`KnownTags`]) under the same stamps, for at most
//! `l1_ttl_cap`, while notifications are received: a tagged value's L2 hit then costs
//! no second round trip as long as nothing was heard of its tags, exactly as an L1 entry
//! stays trusted. A tag invalidated elsewhere is re-read once its notification arrives (or
//! notifications are lost); without notifications, versions are always read from the store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::Breaker;
use super::carry::FlightPosts;
use super::engine::Cache;
use super::entry::Tagged;
use super::error::Error;
use super::flights::Overtaken;
use super::known_tags::{KnownTags, CLEARS};
use super::l1::{TagStamps, L1};
use super::parts::Parts;
use crate::store::{KeyDigest, Stamp, Store, StoreError, StoreKey, TagClock};

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
        let parts = &self.inner.parts;
        let digests: Vec<KeyDigest> = tags
            .into_iter()
            .map(|tag| KeyDigest::of_tag(tag.as_ref()))
            .collect();
        let keys: Vec<StoreKey> = digests
            .iter()
            .map(|tag| StoreKey::new(Arc::clone(&parts.namespace), *tag))
            .collect();
        let store = Arc::clone(&parts.store);
        let call = store.invalidate_tags(&parts.namespace, &digests);
        self.change_all(&keys, Overtaken::Every, call).await
    }
}

/// What a flight reads and asks of the store about tags and generations: the tag clock a
/// value is stamped with, and whether a value's tags (and generation) still hold. Made by
/// [`Parts::tags`](super::parts::Parts::tags) for one call; it borrows only the components that tags need.
pub(super) struct TagChecks<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) breaker: &'a Arc<Breaker>,
    pub(super) namespace: &'a str,
    pub(super) l1: &'a L1,
    pub(super) known: &'a KnownTags,
    /// How long what is read stays known without notifications (`l1_ttl_cap`).
    pub(super) ttl_cap: Duration,
    /// Whether the store keeps values past their freshness (stale windows).
    pub(super) keeps_stale: bool,
}

impl Parts {
    /// The tag and generation checks, over the components they read.
    pub(super) fn tags(&self) -> TagChecks<'_> {
        TagChecks {
            store: &*self.store,
            breaker: &self.breaker,
            namespace: &self.namespace,
            l1: &self.l1,
            known: &self.known_tags,
            ttl_cap: self.l1_settings.ttl_cap,
            keeps_stale: !self.lives.keep().is_zero(),
        }
    }
}

impl TagChecks<'_> {
    /// The namespace's tag generation and clock, read before a load; `None` if the store did
    /// not answer (then a tagged value cannot be stored). A call of a flight past its lookup.
    ///
    /// The generation it carries is not kept for checking values: read before a load, it
    /// would vouch for that load's own value, whatever a clear did while the load ran.
    pub(super) async fn tag_clock(&self) -> Option<TagClock> {
        self.breaker
            .finish(self.store.tag_clock(self.namespace))
            .await
            .ok()
    }

    /// The tag clock a load's value is stamped with, read before the load: where tags may
    /// come back (`tagged`: the key's last value had tags; or a loader of this process has
    /// returned tags), the current clock, so that a tag invalidation after this read
    /// outdates the value. Elsewhere (an application without tags) no round trip but the
    /// process's first load's: the clock it read then stands in, which is no later than the
    /// clock at this load's start, so an invalidation since (or a new generation) outdates
    /// the value, never the other way round.
    pub(super) async fn clock_for_load(&self, tagged: bool) -> Option<TagClock> {
        if tagged || self.known.seen() {
            self.tag_clock().await
        } else {
            self.first_tag_clock().await
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

    /// A tag clock for a load that does not expect tags: the one read last, unless a clear
    /// (or a loss of notifications) was heard of since, or the store was found in another
    /// generation (see [`KnownTags::first_clock`]).
    /// `None` while the store does not answer.
    pub(super) async fn first_tag_clock(&self) -> Option<TagClock> {
        let stamp = self.l1.stamp(&CLEARS);
        self.known.first_clock(stamp, self.tag_clock()).await
    }

    /// The tag clock a value written outside a load ([`Cache::set`], a batch's fills) is
    /// stamped with, for its generation: as [`first_tag_clock`](Self::first_tag_clock), with
    /// the store's error where it could not be read (then nothing is written: a value without
    /// a generation would outlive a clear).
    pub(super) async fn clock_for_write(&self) -> Result<TagClock, StoreError> {
        let stamp = self.l1.stamp(&CLEARS);
        let mut failed = None;
        let read = async {
            let read = self
                .breaker
                .call(self.store.tag_clock(self.namespace))
                .await;
            read.map_err(|error| failed = Some(error)).ok()
        };
        let clock = self.known.first_clock(stamp, read).await;
        clock.ok_or_else(|| {
            failed.unwrap_or_else(|| StoreError::new("the namespace's generation was not read"))
        })
    }

    /// The stamps of `tags`, taken before their versions are read.
    pub(super) fn tag_stamps(&self, tags: &[KeyDigest]) -> TagStamps {
        tags.iter()
            .map(|tag| (*tag, self.l1.stamp_anyway(tag)))
            .collect()
    }

    /// Whether a value of `tagged` is still valid: the store is still in its generation (not
    /// cleared, its tag state not lost), and none of its tags was invalidated since its clock.
    /// The stamps of its tags, taken before the versions are read, go with a valid one.
    ///
    /// The generation and versions come from [`KnownTags`]
    /// where they are known and nothing has been heard since they were read (no round trip),
    /// else from the store.
    pub(super) async fn tags_valid(
        &self,
        tagged: &Tagged,
    ) -> Result<Option<TagStamps>, StoreError> {
        let stamps = self.tag_stamps(&tagged.tags);
        // Taken before the read, as the stamps: a change notified after them outdates what
        // is learnt. `None` while notifications are off or lost: then nothing is kept.
        let live: Option<Vec<Stamp>> = self
            .l1
            .notifier()
            .and_then(|notifier| tagged.tags.iter().map(|tag| notifier.stamp(tag)).collect());
        // Without notifications, the generation is kept as L1 entries are: `l1_ttl_cap`.
        let clears = self.l1.stamp(&CLEARS);
        let now = Instant::now();
        // A value of no generation is outdated whatever the store says.
        let Some(generation) = tagged.generation else {
            return Ok(None);
        };
        if let Some(current) = self.known.generation(clears, now) {
            if current != generation {
                return Ok(None);
            }
            let known = match &live {
                Some(live) => self.known.versions(generation, &tagged.tags, live, now),
                None => None,
            };
            if let Some(versions) = known {
                return Ok(valid(&versions, tagged.clock).then_some(stamps));
            }
        }
        // A value without tags needs the generation alone: one read of it at a time, sent
        // after this value was read.
        let _reading = match (tagged.tags.is_empty(), clears) {
            (true, Some(_)) => match self.known.read_tag_state(Some(now)).await {
                Some(reading) => Some(reading),
                None => {
                    let read = self
                        .known
                        .generation(self.l1.stamp(&CLEARS), Instant::now());
                    if let Some(current) = read {
                        return Ok((current == generation).then_some(stamps));
                    }
                    // That read failed: this one asks again.
                    None
                }
            },
            _ => None,
        };
        let versions = self
            .breaker
            .call(self.store.tag_versions(self.namespace, &tagged.tags))
            .await?;
        let until = crate::sync::later(now, self.ttl_cap);
        if let Some(versions) = &versions {
            self.known
                .learn_generation(versions.generation, clears, until);
        }
        // No tag state, or another generation: it was lost or cleared since the value's load.
        let Some(versions) = versions.filter(|versions| versions.generation == generation) else {
            return Ok(None);
        };
        if let Some(live) = live {
            self.known.learn(&tagged.tags, &versions, &live, until);
        }
        Ok(valid(&versions.versions, tagged.clock).then_some(stamps))
    }

    /// Whether a value found with `tags` is valid without reading any tag's version: a value
    /// without tags, of no generation or of the namespace's current one (asked of the store
    /// where this process does not know it). A value with tags is not: they need checking.
    pub(in crate::cache) async fn untagged_valid(&self, tags: Option<&Tagged>) -> bool {
        match tags {
            None => true,
            Some(tagged) if tagged.tags.is_empty() => {
                matches!(Box::pin(self.tags_valid(tagged)).await, Ok(Some(_)))
            }
            Some(_) => false,
        }
    }

    /// Whether a value of `tagged` is valid without a round trip: it has no tags, and the
    /// generation it carries is the one this process knows (most values).
    pub(super) fn known_valid(&self, tagged: &Tagged) -> bool {
        tagged.tags.is_empty()
            && tagged.generation.is_some()
            && self
                .known
                .generation(self.l1.stamp(&CLEARS), Instant::now())
                == tagged.generation
    }
}

/// Whether a value loaded at `clock` survives tags at `versions`: none was invalidated later.
fn valid(versions: &[u64], clock: u64) -> bool {
    !versions.iter().any(|version| *version > clock)
}
