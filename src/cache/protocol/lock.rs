//! The reload lock a leader holds: its guard, released when dropped unless the fill or an
//! explicit release (the leader's, in `leader.rs`) took it. And a batch's pending locks: those
//! its lookup may have taken, released if the batch goes away before it knows which (a drop
//! guard, as a single key's flight carries on to its end).

use std::sync::Arc;

use tokio::time::Instant;

use crate::store::StoreExt;
use crate::store::{LockToken, Store, StoreKey};

/// The leader's lock, released when dropped unless the fill or an explicit release took it.
pub(in crate::cache) struct LockGuard {
    store: Arc<dyn Store>,
    pub(in crate::cache) key: StoreKey,
    pub(in crate::cache) token: LockToken,
    /// When the lock was asked for (the clock read before its lookup was sent): the store
    /// took it no earlier, so its TTL runs from no earlier than this.
    pub(in crate::cache) asked_at: Instant,
    armed: bool,
}

impl LockGuard {
    /// The guard of the lock of `key` that `token` holds, asked for at `asked_at`.
    pub(in crate::cache) fn new(
        store: &Arc<dyn Store>,
        key: StoreKey,
        token: LockToken,
        asked_at: Instant,
    ) -> Self {
        LockGuard {
            store: Arc::clone(store),
            key,
            token,
            asked_at,
            armed: true,
        }
    }

    pub(in crate::cache) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.armed {
            // The backstop for a flight torn down mid-load.
            spawn_release(&self.store, &self.key, self.token);
        }
    }
}

/// A best-effort, token-checked release in a task of its own; without a runtime, the lock's
/// TTL frees it.
pub(in crate::cache) fn spawn_release(store: &Arc<dyn Store>, key: &StoreKey, token: LockToken) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (store, key) = (Arc::clone(store), key.clone());
        runtime.spawn(async move {
            let _ = store.release(&key, token).await;
        });
    }
}

/// The locks a batch's lookup may take, under its token, until the lookup's answer hands each
/// key on: dropped before then (the batch's caller gone, or the lookup failed), it releases
/// those left (token-checked), so other processes do not wait for their TTL.
pub(super) struct PendingLocks {
    store: Arc<dyn Store>,
    keys: Vec<Option<StoreKey>>,
    token: LockToken,
}

impl PendingLocks {
    /// The locks of `keys` that a lookup under `token` is about to take.
    pub(super) fn new(store: &Arc<dyn Store>, keys: Vec<StoreKey>, token: LockToken) -> Self {
        PendingLocks {
            store: Arc::clone(store),
            keys: keys.into_iter().map(Some).collect(),
            token,
        }
    }

    /// The key of the `index`th lock, handed on: its lock is no longer this guard's.
    pub(super) fn take(&mut self, index: usize) -> Option<StoreKey> {
        self.keys.get_mut(index).and_then(Option::take)
    }

    /// Forgets every lock: the lookup was never sent (the breaker open), so it took none.
    pub(super) fn never_sent(mut self) {
        self.keys.clear();
    }
}

impl Drop for PendingLocks {
    fn drop(&mut self) {
        for key in self.keys.iter().flatten() {
            spawn_release(&self.store, key, self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{KeyDigest, LockState, LockWhen, MemoryStore};

    const LOCK_TTL: Duration = Duration::from_secs(5);

    /// Takes the lock of `key` for `token`: whether it was free.
    async fn take(store: &Arc<dyn Store>, key: &StoreKey, token: LockToken) -> bool {
        let lookup = store
            .lookup(key, token, LOCK_TTL, LockWhen::Always)
            .await
            .expect("the embedded store answers");
        lookup.lock == LockState::Acquired
    }

    /// A store whose key `k`'s lock a leader holds, the key, and the leader's token.
    async fn locked() -> (Arc<dyn Store>, StoreKey, LockToken) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let key = StoreKey::new(Arc::from("t"), KeyDigest::of(b"k"));
        let leader = LockToken::random();
        assert!(take(&store, &key, leader).await);
        (store, key, leader)
    }

    fn guard_of(store: &Arc<dyn Store>, key: &StoreKey, token: LockToken) -> LockGuard {
        LockGuard::new(store, key.clone(), token, Instant::now())
    }

    /// A leader torn down mid-load (its flight dropped) leaves the lock to the next flight at
    /// once, not after the lock's TTL.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_leader_s_guard_frees_the_lock_for_the_next_flight() {
        let (store, key, leader) = locked().await;
        assert!(!take(&store, &key, LockToken::random()).await, "held");
        drop(guard_of(&store, &key, leader));
        // The release runs in a task of its own: let it run.
        let mut freed = false;
        for _ in 0..10 {
            tokio::task::yield_now().await;
            freed = take(&store, &key, LockToken::random()).await;
            if freed {
                break;
            }
        }
        assert!(freed, "the guard released the lock");
    }

    #[tokio::test(start_paused = true)]
    async fn a_disarmed_guard_leaves_the_lock_to_whoever_holds_it() {
        let (store, key, leader) = locked().await;
        let mut guard = guard_of(&store, &key, leader);
        guard.disarm();
        drop(guard);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!take(&store, &key, LockToken::random()).await, "still held");
    }
}
