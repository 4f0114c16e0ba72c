//! Early refresh (XFetch, Vattani et al., VLDB 2015): a hit on a value close to its expiry
//! may refresh it in the background, so that a hot key is reloaded by one caller a little
//! ahead of its expiry and nobody waits for it. One refresh per key runs in a process at a
//! time ([`Refreshes`](crate::cache::refreshes::Refreshes)); across processes, the reload
//! lock lets one of them load.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::leader::{Leader, LeaderStart};
use super::lock::spawn_release;
use super::lookup::FreshValue;
use super::wait::Backoff;
use crate::cache::entry::Entry;
use crate::cache::fetched::Fetched;
use crate::cache::flight::BoxLoader;
use crate::cache::outcome::Outcome;
use crate::cache::parts::Parts;
use crate::cache::telemetry::LockEvent;
use crate::store::{KeyDigest, LockState, LockToken, LockWhen, Stamp, StoreKey};

/// How much later than this process reckons the store may still call the value it early
/// refreshes due (the store's clock is read a round trip away).
const EARLY_REFRESH_SLACK: Duration = Duration::from_millis(5);

/// An early refresh of one key: a flight of its own, in the background, with the loader of
/// the hit that found the value due.
pub(in crate::cache) struct EarlyRefresh {
    parts: Arc<Parts>,
    digest: KeyDigest,
    loader: BoxLoader,
    /// When the value it refreshes stops being fresh, as this process knows it.
    fresh_until: Instant,
}

impl EarlyRefresh {
    /// Starts an early refresh of the value of `digest` that is fresh until `fresh_until`, in
    /// the background, unless one is running in this process.
    pub(in crate::cache) fn start(
        parts: &Arc<Parts>,
        digest: KeyDigest,
        loader: BoxLoader,
        fresh_until: Instant,
    ) {
        let Some(running) = parts.refreshes.start(digest) else {
            return;
        };
        let refresh = EarlyRefresh {
            parts: Arc::clone(parts),
            digest,
            loader,
            fresh_until,
        };
        tokio::spawn(async move {
            refresh.run().await;
            drop(running);
        });
    }

    /// The lookup's terms: the lock, only while the store holds the value this refresh is for
    /// (its remaining life, give or take a round trip, is below what a newer value has: a
    /// whole TTL) and it is still fresh there.
    fn lock_when(&self) -> LockWhen {
        let keep = self.parts.lives.keep();
        let left = self.fresh_until.saturating_duration_since(Instant::now());
        LockWhen::Early {
            life: keep
                .saturating_add(left)
                .saturating_add(EARLY_REFRESH_SLACK),
            fresh_above: keep,
        }
    }

    /// An early refresh of the value that is fresh until `fresh_until`: takes the lock if the
    /// store still holds that value (not a newer one, refreshed by another process) and no one
    /// else holds the lock, then leads as any reload does. If another process is refreshing
    /// it, waits for that fill (while the value is still fresh) and takes the new value into
    /// L1, so this process does not start refresh after refresh meanwhile.
    async fn run(self) {
        let lock_when = self.lock_when();
        let (parts, digest, loader) = (self.parts, self.digest, self.loader);
        let parts = &parts;
        let key = StoreKey::new(Arc::clone(&parts.namespace), digest);
        let token = LockToken::random();
        let mut filled = parts.lookups().watch_fills(&key);
        let mut backoff = Backoff::new(&parts.waits);
        let mut fresh_until = None;
        loop {
            let stamp = parts.l1.stamp(&digest);
            let (reader, asked_at) = (loader.reader(), Instant::now());
            let found = match parts
                .lookups()
                .look_up(asked_at, &key, token, lock_when, reader, &mut filled)
                .await
            {
                Ok(found) => found,
                Err(error) => {
                    debug!(error = &error as &dyn std::error::Error, key = ?digest, "early refresh: store lookup failed");
                    if !error.skipped() {
                        spawn_release(&parts.store, &key, token);
                    }
                    return;
                }
            };
            let tagged = found.tagged();
            match (found.lock, found.entry) {
                (LockState::Acquired, _) => {
                    // The leader waits for no fill: its watch (which borrows the key) ends.
                    drop(filled);
                    let seen = LeaderStart {
                        stamp,
                        tagged,
                        speculative: true,
                        asked_at,
                    };
                    return lead(parts, seen, key, token, loader).await;
                }
                (
                    LockState::NotRequested,
                    Some((
                        Ok(Entry::Value {
                            payload, load_time, ..
                        }),
                        ttl,
                    )),
                ) => {
                    // Refreshed by another process: take its value.
                    let fresh_for = ttl.unwrap_or_default().saturating_sub(parts.lives.keep());
                    let tags = found.tag_stamps;
                    parts.l1_insert(stamp, tags, digest, &payload, fresh_for, load_time);
                    return;
                }
                (LockState::HeldElsewhere, Some((_, ttl))) => {
                    // Being refreshed elsewhere: follow it while the value is fresh.
                    let until = *fresh_until.get_or_insert_with(|| {
                        let fresh_for = ttl.unwrap_or_default().saturating_sub(parts.lives.keep());
                        crate::sync::later(Instant::now(), fresh_for)
                    });
                    let now = Instant::now();
                    if now >= until {
                        return;
                    }
                    let notifier = parts.l1.notifier();
                    let _ = backoff
                        .wait_between_reads(&mut filled, notifier, until - now)
                        .await;
                }
                // Gone, or recently failed: ordinary flights deal with it.
                _ => return,
            }
        }
    }
}

/// An early refresh that took the lock: it leads as any reload does, speculative (a failure
/// is not shared: the value it refreshes stays).
async fn lead(
    parts: &Parts,
    seen: LeaderStart,
    key: StoreKey,
    token: LockToken,
    loader: BoxLoader,
) {
    parts.meter.lock(LockEvent::Acquired);
    let digest = *key.digest();
    debug!(key = ?digest, "refreshing early");
    if let Err(error) = Leader::lead(parts, seen, key, token, loader, None, None).await {
        warn!(key = ?digest, error = &error as &dyn std::error::Error, "early refresh failed");
    }
}

impl FreshValue {
    /// This fresh value, found in the store, as a flight's answer (through L1, and with an early
    /// refresh where one is due); `followed`: the flight waited for another leader's load.
    pub(super) fn answer(
        self,
        parts: &Arc<Parts>,
        digest: KeyDigest,
        stamp: Option<Stamp>,
        read_at: Instant,
        loader: BoxLoader,
        followed: bool,
    ) -> Fetched {
        let FreshValue {
            payload,
            load_time,
            ttl,
            tag_stamps,
        } = self;
        let fresh_for = ttl.unwrap_or_default().saturating_sub(parts.lives.keep());
        parts.l1_insert(stamp, tag_stamps, digest, &payload, fresh_for, load_time);
        let fresh_until = crate::sync::later(read_at, fresh_for);
        if parts.refreshes.due(read_at, fresh_until, load_time) {
            EarlyRefresh::start(parts, digest, loader, fresh_until);
        }
        let outcome = if followed {
            Outcome::Follower
        } else {
            Outcome::L2Hit
        };
        Fetched::cached(payload, outcome, Some(fresh_until))
    }
}
