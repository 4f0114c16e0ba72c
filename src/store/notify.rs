//! Fill notifications fanned out to the followers of this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::StoreKey;

/// Wakes this process's followers of a key when the key is filled or its lock released.
///
/// A store keeps one `Notifier` and calls [`notify`](Self::notify) for each "filled" it learns
/// of (its own writes for [`MemoryStore`](super::MemoryStore), pub/sub messages for
/// `RedisStore`); followers [`watch`](Self::watch) the key they wait for. Keys nobody watches
/// cost nothing: a notification for them is dropped at once.
#[derive(Clone, Default)]
pub struct Notifier {
    watched: Arc<Mutex<HashMap<StoreKey, watch::Sender<u64>>>>,
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
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching `key`: the returned [`FillWatch`] wakes on every later notification.
    pub fn watch(&self, key: &StoreKey) -> FillWatch {
        let mut watched = self.watched();
        let receiver = match watched.get(key) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                watched.insert(key.clone(), sender);
                receiver
            }
        };
        FillWatch {
            notifier: self.clone(),
            key: key.clone(),
            receiver,
        }
    }

    /// Wakes every watcher of `key`.
    pub fn notify(&self, key: &StoreKey) {
        if let Some(sender) = self.watched().get(key) {
            sender.send_modify(|generation| *generation = generation.wrapping_add(1));
        }
    }

    /// How many keys are watched (for tests and metrics).
    pub fn watched_keys(&self) -> usize {
        self.watched().len()
    }
}

/// A follower's subscription to one key's fill notifications; see [`Notifier::watch`].
///
/// Call [`mark_seen`](Self::mark_seen) before reading the store, then wait on
/// [`changed`](Self::changed): a notification sent between the two is not lost.
pub struct FillWatch {
    notifier: Notifier,
    key: StoreKey,
    receiver: watch::Receiver<u64>,
}

impl FillWatch {
    /// Forgets every notification so far.
    pub fn mark_seen(&mut self) {
        self.receiver.borrow_and_update();
    }

    /// Waits for a notification sent since the last [`mark_seen`](Self::mark_seen).
    pub async fn changed(&mut self) {
        if self.receiver.changed().await.is_err() {
            // The sender is gone only once this watch is dropped; never wake spuriously.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for FillWatch {
    fn drop(&mut self) {
        let mut watched = self.notifier.watched();
        // This watch's receiver still counts: remove the key when it is the last one.
        if watched
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            watched.remove(&self.key);
        }
    }
}

impl std::fmt::Debug for FillWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillWatch").field("key", &self.key).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyDigest;
    use std::time::Duration;

    fn key(name: &str) -> StoreKey {
        StoreKey::new(Arc::from("ns"), KeyDigest::of(name.as_bytes()))
    }

    #[tokio::test]
    async fn a_notification_between_mark_and_wait_is_not_lost() {
        let notifier = Notifier::new();
        let mut watch = notifier.watch(&key("a"));
        watch.mark_seen();
        notifier.notify(&key("b"));
        notifier.notify(&key("a"));
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

    #[test]
    fn keys_are_forgotten_with_their_last_watch() {
        let notifier = Notifier::new();
        let first = notifier.watch(&key("a"));
        let second = notifier.watch(&key("a"));
        assert_eq!(notifier.watched_keys(), 1);
        drop(first);
        assert_eq!(notifier.watched_keys(), 1);
        drop(second);
        assert_eq!(notifier.watched_keys(), 0);
        notifier.notify(&key("a"));
    }
}
