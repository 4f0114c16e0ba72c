//! Loads made without the reload lock: after a follower's wait timed out (the configured
//! policy loads and stores, or loads for the caller alone), or while the store fails (one
//! load per key in this process). A leader's tag check applies to them as far as the store
//! answers.

use tokio::time::Instant;
use tracing::{debug, warn};

use super::load::tagged;

use super::follower::Follower;
use crate::cache::fetched::Fetched;
use crate::cache::fetched::FlightResult;
use crate::cache::flight::BoxLoader;
use crate::cache::loaded::LoadedKind;
use crate::cache::outcome::Outcome;
use crate::store::Stamp;
use crate::store::StoreExt;

impl Follower<'_> {
    /// Loads without the store's lock, for the flight's callers: after a wait timeout (the store
    /// answering: a loaded value's tags are checked as a leader's are, so that one invalidated
    /// during the load marks the flight outdated), or while the store is failing
    /// ([`Outcome::Degraded`]: nothing can be checked; the value is kept in L1 with its tags'
    /// stamps, unless a change of this process overtook the flight meanwhile).
    pub(super) async fn load_alone(&self, loader: BoxLoader, outcome: Outcome) -> FlightResult {
        let (parts, digest, flight) = (self.parts, *self.key.digest(), self.early);
        let degraded = outcome == Outcome::Degraded;
        let clock = match degraded {
            false => parts.tags().clock_for_load(false).await,
            true => None,
        };
        let started = Instant::now();
        // Kept in L1 even while notifications are lost (the store is failing), until the
        // store answers again or notifications come back.
        let vouch = (parts.l1.stamp_anyway(&digest), parts.breaker.recoveries());
        let loaded = parts.load(loader, None).await?;
        if !loaded.tags.is_empty() {
            parts.known_tags.mark_seen();
        }
        match loaded.kind {
            LoadedKind::Value { bytes, ttl } if degraded => {
                // Taken after the load (its tags are known only now): a tag invalidation of
                // this process before it overtook the flight, and one after it moves them on.
                let tags = parts.tags().tag_stamps(&loaded.tags);
                if !flight.is_overtaken() {
                    // Keep this process from reloading while the store is down.
                    let ttl = ttl.unwrap_or(parts.lives.ttl);
                    parts.l1_insert_alone(vouch, tags, digest, &bytes, ttl, started.elapsed());
                }
                Ok(Fetched::loaded(bytes, outcome))
            }
            LoadedKind::Value { bytes, .. } => {
                if let Ok(tagged) = tagged(loaded.tags, clock) {
                    parts
                        .tags()
                        .loaded_tags_hold(Some(&tagged), Some(flight))
                        .await;
                }
                Ok(Fetched::loaded(bytes, outcome))
            }
            LoadedKind::ForWaiters { bytes, .. } => Ok(Fetched::loaded(bytes, outcome)),
            LoadedKind::Pass { handoff, .. } => Ok(Fetched::pass_with(handoff)),
            LoadedKind::NotModified { .. } => Ok(Fetched::pass()),
        }
    }

    /// Loads without the store's lock after a wait timeout, and stores the value anyway
    /// ([`WaitTimeoutPolicy::LoadAndCache`](crate::cache::WaitTimeoutPolicy::LoadAndCache)).
    pub(super) async fn load_and_put(
        &self,
        stamp: Option<Stamp>,
        loader: BoxLoader,
    ) -> FlightResult {
        let (parts, key, flight) = (self.parts, self.key, self.early);
        let clock = parts.tags().tag_clock().await;
        let (started, started_at) = (Instant::now(), crate::clock::now());
        let loaded = parts.load(loader, None).await?;
        let life = loaded.life();
        let bytes = match loaded.kind {
            LoadedKind::Value { bytes, .. } => bytes,
            LoadedKind::ForWaiters { bytes, .. } => {
                return Ok(Fetched::loaded(bytes, Outcome::Leader))
            }
            LoadedKind::Pass { handoff, .. } => return Ok(Fetched::pass_with(handoff)),
            LoadedKind::NotModified { .. } => return Ok(Fetched::pass()),
        };
        let Ok(tagged) = tagged(loaded.tags, clock) else {
            warn!(
                ?key,
                "a value without the namespace's generation (the tag clock), or with too many tags, is not stored"
            );
            return Ok(Fetched::loaded(bytes, Outcome::Leader));
        };
        let load_time = started.elapsed();
        let fill = parts.ready_to_store(
            &bytes,
            life,
            (started_at, load_time),
            Some(&tagged),
            Some(loaded.windows),
        );
        let stamp = match parts
            .breaker
            .call(parts.store.put(key, fill.encoded.clone(), fill.store_ttl))
            .await
        {
            Ok(true) => Some(stamp.map(|stamp| parts.l1.after_own_write(stamp))),
            Ok(false) => {
                // A value whose load started later is stored: ours is older; it answers this
                // flight's callers only.
                debug!(
                    ?key,
                    "a newer value is stored; the load after a wait timeout is not"
                );
                None
            }
            Err(error) => {
                warn!(
                    ?key,
                    error = &error as &dyn std::error::Error,
                    "write after a wait timeout failed; value kept in this process only"
                );
                Some(stamp)
            }
        };
        match stamp {
            Some(stamp) => {
                let digest = *key.digest();
                parts
                    .keep_loaded(stamp, digest, &fill, Some(&tagged), Some(flight))
                    .await;
            }
            // Not kept, but it still answers the flight.
            None => {
                parts
                    .tags()
                    .loaded_tags_hold(Some(&tagged), Some(flight))
                    .await;
            }
        }
        Ok(Fetched::loaded(fill.value, Outcome::Leader))
    }
}
