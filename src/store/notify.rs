//! Notifications fanned out in this process: to the followers waiting for a key, and to L1,
//! whose entries are stamped with what this process had heard of their key when they were
//! read ([`Stamp`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::key::{KeyDigest, StoreKey};

/// Wakes this process's followers of a key when the key is filled or its lock released.
///
/// A store keeps one `Notifier` and calls [`notify`](Self::notify) for each "filled" it learns
/// of (its own writes for [`MemoryStore`](super::MemoryStore), pub/sub messages for
/// `RedisStore`); followers [`watch`](Self::watch) the key they wait for. Keys nobody watches
/// cost nothing: a notification for them is dropped at once.
///
/// A watch costs nothing until its follower waits: watching reads one counter (the count of
/// notifications for the key's bucket of keys), and only the first wait registers the key.
/// A notification sent between the watch and that registration moved the counter, so the
/// wait ends at once instead of missing it. Lookups that find their value, the common case,
/// never register anything.
///
/// The same counts stamp L1 entries: an entry read before a notification of its key's
/// bucket is no longer trusted ([`stamp`](Self::stamp)), and neither is any entry read before
/// notifications were [lost](Self::lost).
///
/// Cloned into the store's tasks: one shared allocation, so a clone is one count.
#[derive(Clone, Default)]
pub struct Notifier(Arc<Shared>);

/// What the clones of a [`Notifier`] share.
struct Shared {
    watched: Mutex<HashMap<StoreKey, watch::Sender<u64>>>,
    sent: Buckets,
    /// Counts the times notifications may have been lost (and came back).
    epoch: AtomicU64,
    /// Whether notifications are being received, so that what L1 holds can be kept in step.
    live: AtomicBool,
    /// Woken when they are [restored](Notifier::restored).
    back: Notify,
    /// Woken when they are [lost](Notifier::lost).
    gone: Notify,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            watched: Mutex::default(),
            sent: Buckets::default(),
            epoch: AtomicU64::new(0),
            live: AtomicBool::new(true),
            back: Notify::new(),
            gone: Notify::new(),
        }
    }
}

/// What this process had heard of a key's changes when its value was read: equal stamps mean
/// that no notification of the key (or of another key of its bucket) arrived in between, and
/// that none can have been lost. See [`Notifier::stamp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    epoch: u64,
    bucket: u64,
}

impl Stamp {
    /// The stamp of a store that sends no notifications: always current, so an L1 entry lives
    /// until its TTL (at most the engine's `l1_ttl_cap`).
    pub(crate) const UNTRACKED: Stamp = Stamp {
        epoch: u64::MAX,
        bucket: u64::MAX,
    };

    /// Whether a notification of the key (or of another key of its bucket) arrived between
    /// `earlier` and this stamp of the same key, whatever became of notifications meanwhile:
    /// a change heard, not one that may have been missed.
    pub(crate) fn heard_since(self, earlier: Stamp) -> bool {
        self.bucket != earlier.bucket
    }

    /// The stamp a key has once its own change (this process's fill or write) is notified, if
    /// nothing else is heard meanwhile: a store notifies its own changes exactly once, in this
    /// process, before the call returns.
    pub(crate) fn after_own_change(self) -> Stamp {
        if self == Stamp::UNTRACKED {
            return self;
        }
        Stamp {
            epoch: self.epoch,
            bucket: self.bucket.wrapping_add(1),
        }
    }
}

/// How many buckets of keys count their notifications. A notification for another key of the
/// same bucket can wake a follower that is not yet registered (one early read), or make an L1
/// entry of the bucket untrusted (one store read).
const BUCKETS: usize = 8192;

/// Notification counts by bucket of keys.
struct Buckets([AtomicU64; BUCKETS]);

impl Default for Buckets {
    fn default() -> Self {
        Buckets(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Buckets {
    fn of(&self, key: &StoreKey) -> &AtomicU64 {
        self.of_digest(key.digest())
    }

    fn of_digest(&self, digest: &KeyDigest) -> &AtomicU64 {
        let digest = digest.as_bytes();
        let index = usize::from(u16::from_le_bytes([digest[0], digest[1]])) % BUCKETS;
        &self.0[index]
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("watched", &self.watched().len())
            .finish()
    }
}

impl Notifier {
    /// A notifier with no watchers.
    pub fn new() -> Self {
        Notifier::default()
    }

    fn watched(&self) -> MutexGuard<'_, HashMap<StoreKey, watch::Sender<u64>>> {
        // Nothing panics while the map is locked; a poisoned map is still consistent.
        crate::sync::lock(&self.0.watched)
    }

    /// Starts watching `key`: the returned [`FillWatch`] wakes on every later notification.
    /// It borrows the notifier and the key: making one reads a counter and nothing more.
    pub fn watch<'a>(&'a self, key: &'a StoreKey) -> FillWatch<'a> {
        FillWatch {
            notifier: self,
            key,
            seen: self.0.sent.of(key).load(Ordering::SeqCst),
            receiver: None,
        }
    }

    /// Registers a waiting follower of `key`.
    fn register(&self, key: &StoreKey) -> watch::Receiver<u64> {
        let mut watched = self.watched();
        match watched.get(key) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                watched.insert(key.clone(), sender);
                receiver
            }
        }
    }

    /// Wakes every watcher of `key`, and moves the stamp of its bucket on.
    pub fn notify(&self, key: &StoreKey) {
        // Count first, then wake the registered: a follower that registers after the count
        // sees it moved, one that registered before is woken.
        self.0.sent.of(key).fetch_add(1, Ordering::SeqCst);
        if let Some(sender) = self.watched().get(key) {
            sender.send_modify(|generation| *generation = generation.wrapping_add(1));
        }
    }

    /// What this process has heard of the key `digest` so far, or `None` while notifications
    /// are not being received (then nothing read now may be kept in L1).
    pub fn stamp(&self, digest: &KeyDigest) -> Option<Stamp> {
        // Epoch first: a loss after this read moves it, so the stamp goes out of date.
        let stamp = self.stamp_anyway(digest);
        self.receiving().then_some(stamp)
    }

    /// What this process has heard of the key `digest` so far, even while notifications are
    /// lost: such a stamp goes out of date when they are [`restored`](Self::restored).
    ///
    /// For tests that wait until a notification of a key is heard; the engine and stores use
    /// [`stamp`](Self::stamp).
    #[doc(hidden)]
    pub fn stamp_anyway(&self, digest: &KeyDigest) -> Stamp {
        Stamp {
            epoch: self.0.epoch.load(Ordering::SeqCst),
            bucket: self.0.sent.of_digest(digest).load(Ordering::SeqCst),
        }
    }

    /// Anything may have changed (a namespace was [cleared](super::Store::clear)): every stamp
    /// taken so far goes out of date, so every L1 entry is dropped at its next read, whatever
    /// its key. Notifications stay received.
    pub fn cleared(&self) {
        self.0.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Notifications may be lost from now on (the subscription dropped, or is not in place
    /// yet): every stamp taken so far goes out of date, and none is given until
    /// [`restored`](Self::restored).
    pub fn lost(&self) {
        self.0.live.store(false, Ordering::SeqCst);
        self.0.epoch.fetch_add(1, Ordering::SeqCst);
        self.0.gone.notify_waiters();
    }

    /// Notifications are received again, if they were [lost](Self::lost): what was read
    /// meanwhile goes out of date too.
    pub fn restored(&self) {
        if !self.receiving() {
            self.0.epoch.fetch_add(1, Ordering::SeqCst);
            self.0.live.store(true, Ordering::SeqCst);
            self.0.back.notify_waiters();
        }
    }

    /// Whether notifications are being received (not [lost](Self::lost) since they were last
    /// [restored](Self::restored)).
    pub fn receiving(&self) -> bool {
        self.0.live.load(Ordering::SeqCst)
    }

    /// Waits at most `limit` for notifications to be received (a subscription on its way),
    /// and answers whether they are: a reader that waits for a namespace's first subscription
    /// can keep what it reads in L1.
    pub(crate) async fn received_within(&self, limit: Duration) -> bool {
        if self.receiving() {
            return true;
        }
        let back = self.0.back.notified();
        tokio::pin!(back);
        // Registered before the second look, so a restore in between is not missed.
        back.as_mut().enable();
        if !self.receiving() {
            let _ = tokio::time::timeout(limit, back).await;
        }
        self.receiving()
    }

    /// Ends once notifications are not being received (at once if they are not now): a
    /// follower that waits for one polls again from then on.
    pub(crate) async fn until_lost(&self) {
        let gone = self.0.gone.notified();
        tokio::pin!(gone);
        // Registered before the look, so a loss in between is not missed.
        gone.as_mut().enable();
        if self.receiving() {
            gone.await;
        }
    }

    /// A subscription failed: readers waiting for notifications to be received (a lookup's
    /// first one in a namespace) stop waiting (notifications stay [lost](Self::lost) until one succeeds).
    pub fn subscription_failed(&self) {
        self.0.back.notify_waiters();
    }

    /// How many keys are watched.
    #[cfg(test)]
    pub(crate) fn watched_keys(&self) -> usize {
        self.watched().len()
    }
}

/// A follower's subscription to one key's fill notifications; see [`Notifier::watch`].
///
/// Call [`mark_seen`](Self::mark_seen) before reading the store, then wait on
/// [`changed`](Self::changed): a notification sent between the two is not lost.
pub struct FillWatch<'a> {
    notifier: &'a Notifier,
    key: &'a StoreKey,
    /// The key's bucket count when last marked seen.
    seen: u64,
    /// Set by the first wait.
    receiver: Option<watch::Receiver<u64>>,
}

impl FillWatch<'_> {
    /// Forgets every notification so far.
    pub fn mark_seen(&mut self) {
        match self.receiver.as_mut() {
            Some(receiver) => {
                receiver.borrow_and_update();
            }
            None => self.seen = self.notifier.0.sent.of(self.key).load(Ordering::SeqCst),
        }
    }

    /// Waits for a notification sent since the last [`mark_seen`](Self::mark_seen).
    pub async fn changed(&mut self) {
        let receiver = match self.receiver.as_mut() {
            Some(receiver) => receiver,
            None => {
                let receiver = self.receiver.insert(self.notifier.register(self.key));
                let sent = self.notifier.0.sent.of(self.key).load(Ordering::SeqCst);
                if sent != self.seen {
                    // Something of this key's bucket was notified since the mark, perhaps
                    // this key: wake now rather than risk a lost notification.
                    return;
                }
                receiver
            }
        };
        if receiver.changed().await.is_err() {
            // The sender is gone only once this watch is dropped; never wake spuriously.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for FillWatch<'_> {
    fn drop(&mut self) {
        if self.receiver.is_none() {
            // Never registered.
            return;
        }
        let mut watched = self.notifier.watched();
        // This watch's receiver still counts: remove the key when it is the last one.
        if watched
            .get(self.key)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            watched.remove(self.key);
        }
    }
}

impl std::fmt::Debug for FillWatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillWatch").field("key", &self.key).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::key::KeyDigest;
    use std::time::Duration;

    fn key(name: &str) -> StoreKey {
        StoreKey::new(Arc::from("ns"), KeyDigest::of(name.as_bytes()))
    }

    /// The watch wakes, and (marked seen again) does not wake a second time.
    async fn woken_once(watch: &mut FillWatch<'_>) {
        tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("woken");
        watch.mark_seen();
        let waited = tokio::time::timeout(Duration::from_millis(20), watch.changed()).await;
        assert!(
            waited.is_err(),
            "no second wake without a second notification"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_notification_between_mark_and_wait_is_not_lost() {
        let (notifier, a) = (Notifier::new(), key("a"));
        let mut watch = notifier.watch(&a);
        watch.mark_seen();
        notifier.notify(&key("b"));
        notifier.notify(&key("a"));
        woken_once(&mut watch).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_notification_before_the_first_wait_is_not_lost() {
        let (notifier, a) = (Notifier::new(), key("a"));
        let mut watch = notifier.watch(&a);
        watch.mark_seen();
        // Sent while the follower was reading the store, before it registered by waiting.
        notifier.notify(&key("a"));
        assert_eq!(
            notifier.watched_keys(),
            0,
            "nothing registered before a wait"
        );
        woken_once(&mut watch).await;
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_forgotten_with_their_last_watch() {
        let (notifier, a) = (Notifier::new(), key("a"));
        let mut first = notifier.watch(&a);
        let mut second = notifier.watch(&a);
        let unregistered = notifier.watch(&a);
        for watch in [&mut first, &mut second] {
            let _ = tokio::time::timeout(Duration::from_millis(1), watch.changed()).await;
        }
        assert_eq!(notifier.watched_keys(), 1);
        drop(unregistered);
        drop(first);
        assert_eq!(notifier.watched_keys(), 1);
        drop(second);
        assert_eq!(notifier.watched_keys(), 0);
        notifier.notify(&key("a"));
    }
}
