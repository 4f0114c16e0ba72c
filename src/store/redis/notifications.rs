//! Fill notifications over Redis pub/sub: the process's one subscriber connection, the
//! channels it listens on (a namespace's classic channel, and on a Redis Cluster its shard
//! channels, see [`SHARD_TAGS`](super::names::SHARD_TAGS)), and how a message wakes this
//! process's followers.
//!
//! Pub/sub is lossy (a message sent while the subscriber reconnects is gone), so followers poll
//! as well: a lost message costs latency, never correctness. One server's subscriber is
//! watched: a connection gone silent without closing is noticed and replaced (see
//! [`liveness`](super::liveness)).

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
#[cfg(feature = "cluster")]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use redis::{PushInfo, PushKind, RedisResult, Value};
use tracing::{debug, warn};

use super::connection::Connection;
use super::liveness::{Generation, Listener, Pushes};
#[cfg(feature = "cluster")]
use super::names::shard_channels;
use super::names::{channel, namespace_of, CLEARED};
pub(super) use super::subscriber::Subscriber;
use crate::store::key::{KeyDigest, StoreKey};
use crate::store::notify::Notifier;

/// The process's one subscriber connection (RESP3, resubscribing by itself after a
/// reconnect) and the followers it wakes.
#[derive(Clone)]
pub(super) struct Notifications {
    subscriber: Subscriber,
    pub(super) notifier: Notifier,
    channels: Arc<Mutex<Channels>>,
    /// What this store's messages say after the digest (`:` and 16 random hex digits), so its
    /// subscriber knows its own: the store told its notifier when the change was made.
    pub(super) origin: Arc<[u8; 17]>,
    /// The store's choice of sharded pub/sub (see `RedisStore::sharded`): the shard channels
    /// are subscribed to while it holds, and it is cleared if the server refuses them.
    sharded: Arc<AtomicBool>,
}

/// A random origin tag, `:` and 16 hex digits.
fn new_origin() -> [u8; 17] {
    let mut origin = [b':'; 17];
    let hex = format!("{:016x}", rand::random::<u64>());
    origin[1..].copy_from_slice(hex.as_bytes());
    origin
}

/// The namespaces whose channel is subscribed (or being subscribed), and how many
/// subscriptions are still on their way: until none is, notifications may be missed, and the
/// notifier says so (nothing read meanwhile enters L1).
#[derive(Default)]
struct Channels {
    names: HashSet<Arc<str>>,
    /// Every namespace ever subscribed, forgotten or not: what a watched subscriber subscribes
    /// again by itself.
    wanted: HashSet<Arc<str>>,
    /// Whether the subscriber's connection left a `PING` unanswered (see
    /// [`liveness`](super::liveness)): notifications are lost until it answers, whatever the
    /// subscriptions say.
    silent: bool,
    /// The namespace of `names` that was watched last: a store serves one namespace more
    /// often than not, and this is one comparison where the set would hash the name.
    last: Option<Arc<str>>,
    pending: usize,
}

impl Channels {
    /// Whether `namespace`'s channel is subscribed (or being subscribed).
    fn has(&mut self, namespace: &str) -> bool {
        if self.last.as_deref() == Some(namespace) {
            return true;
        }
        let Some(name) = self.names.get(namespace) else {
            return false;
        };
        self.last = Some(Arc::clone(name));
        true
    }

    /// Forgets `namespace`'s channel (or all of them), so the next watch subscribes again.
    fn forget(&mut self, namespace: Option<&str>) {
        match namespace {
            Some(namespace) => {
                self.names.remove(namespace);
            }
            None => self.names.clear(),
        }
        self.last = None;
    }
}

/// What a subscriber's pushes reach: the notifier, the channels, the store's own origin tag,
/// and the store's connection (checked when the subscriber's drops).
#[derive(Clone)]
pub(super) struct Parts {
    pub(super) notifier: Notifier,
    channels: Arc<Mutex<Channels>>,
    origin: Arc<[u8; 17]>,
    store: Connection,
}

impl Parts {
    pub(super) fn new(store: &Connection) -> Self {
        Parts {
            notifier: Notifier::new(),
            channels: Arc::default(),
            origin: Arc::new(new_origin()),
            store: store.clone(),
        }
    }

    /// What the subscriber does with a push: a message wakes followers; a dropped connection
    /// (or a shard channel gone elsewhere) counts notifications as lost. A push from a manager
    /// of another `generation` than the subscriber's current one (replaced since) is ignored.
    pub(super) fn on_push(
        &self,
        generation: Option<Generation>,
    ) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
        let (wake, forget, own) = (
            self.notifier.clone(),
            Arc::clone(&self.channels),
            Arc::clone(&self.origin),
        );
        let store = self.store.clone();
        move |push: PushInfo| {
            if generation.as_ref().is_some_and(|mine| !mine.is_current()) {
                return Ok(());
            }
            // This crate never unsubscribes: an `SUNSUBSCRIBE` comes from a node whose slot,
            // with the shard channel in it, went elsewhere.
            if matches!(push.kind, PushKind::Disconnection | PushKind::SUnsubscribe) {
                // The connection resubscribes when it reconnects, but a cluster's may have to
                // find the channel's slot on another node: forget the channels, so the next
                // watch subscribes again (and so reconnects). Meanwhile, followers poll, and
                // L1 trusts nothing it held (messages may be lost while the link is down).
                crate::sync::lock(&forget).forget(None);
                wake.lost();
                // The server may be gone: the store's connection is checked now, so that one
                // the server closed while nobody used it reconnects before the next call.
                store.check();
            } else {
                wake_followers(&wake, &own[..], push);
            }
            Ok(())
        }
    }

    /// Where the pushes of each of a watched subscriber's managers go: here, each manager's
    /// tagged with its generation.
    pub(super) fn pushes(&self) -> Pushes {
        let parts = self.clone();
        Arc::new(move |generation| Arc::new(parts.on_push(Some(generation))))
    }
}

impl Notifications {
    /// The notifications of `subscriber`, whose pushes reach `parts`.
    pub(super) fn of(subscriber: Subscriber, parts: &Parts, sharded: Arc<AtomicBool>) -> Self {
        Notifications {
            subscriber,
            notifier: parts.notifier.clone(),
            channels: Arc::clone(&parts.channels),
            origin: Arc::clone(&parts.origin),
            sharded,
        }
    }
}

impl Notifications {
    /// Subscribes to a namespace's channel the first time one of its keys is watched. Until
    /// the subscription is in place, followers of that namespace poll.
    ///
    /// Until every subscription asked for is in place (a namespace's first, or all of them
    /// again after a dropped connection), the notifier counts notifications as lost, so that
    /// L1 trusts nothing read meanwhile: a message sent before the subscription is in place
    /// would be missed, and an old value kept in L1 for up to `l1_ttl_cap`.
    pub(super) fn ensure_subscribed(&self, namespace: &str) {
        let mut channels = crate::sync::lock(&self.channels);
        if channels.has(namespace) {
            return;
        }
        let namespace: Arc<str> = Arc::from(namespace);
        channels.names.insert(Arc::clone(&namespace));
        channels.wanted.insert(Arc::clone(&namespace));
        channels.pending += 1;
        // Counted as pending first: only the completion of the last pending subscription,
        // this one's or a later one's, restores the notifier.
        self.notifier.lost();
        drop(channels);
        let (subscriber, channels) = (self.subscriber.connection(), Arc::clone(&self.channels));
        let (notifier, sharded) = (self.notifier.clone(), Arc::clone(&self.sharded));
        tokio::spawn(async move {
            let subscribed = match &subscriber {
                Ok(subscriber) => subscribe(subscriber, &namespace, &sharded).await,
                Err(error) => Err(error.clone()),
            };
            let mut channels = crate::sync::lock(&channels);
            channels.pending = channels.pending.saturating_sub(1);
            match subscribed {
                Ok(())
                    if channels.pending == 0
                        && !channels.silent
                        && channels.names.contains(&namespace) =>
                {
                    notifier.restored();
                }
                Ok(()) => {}
                Err(error) => {
                    warn!(%error, %namespace, "cannot subscribe to fill notifications; followers poll");
                    // Forget it, so the next watch tries again.
                    channels.forget(Some(&namespace));
                    notifier.subscription_failed();
                }
            }
        });
    }
}

impl Listener for Notifications {
    /// The subscriber's connection left a `PING` unanswered: notifications count as lost
    /// until it [answers](Self::answered) or is [replaced](Self::replaced).
    fn silent(&self) {
        let mut channels = crate::sync::lock(&self.channels);
        if !channels.silent {
            channels.silent = true;
            self.notifier.lost();
        }
    }

    /// The subscriber's connection answered a `PING`: every namespace wanted and not
    /// subscribed (its subscription failed, or the connection dropped) is subscribed again,
    /// and once none is on its way, notifications are received again.
    fn answered(&self) {
        let mut channels = crate::sync::lock(&self.channels);
        channels.silent = false;
        let missing: Vec<Arc<str>> = channels
            .wanted
            .iter()
            .filter(|namespace| !channels.names.contains(*namespace))
            .cloned()
            .collect();
        if missing.is_empty() && channels.pending == 0 {
            self.notifier.restored();
        }
        drop(channels);
        for namespace in missing {
            self.ensure_subscribed(&namespace);
        }
    }

    /// The subscriber's connection was replaced by a new one, which has no subscription yet:
    /// every namespace wanted is subscribed on it, and until then notifications are lost.
    fn replaced(&self) {
        let mut channels = crate::sync::lock(&self.channels);
        channels.silent = false;
        channels.forget(None);
        self.notifier.lost();
        let wanted: Vec<Arc<str>> = channels.wanted.iter().cloned().collect();
        drop(channels);
        for namespace in wanted {
            self.ensure_subscribed(&namespace);
        }
    }
}

/// Subscribes to the namespace's classic channel (every store publishes there where sharded
/// pub/sub is off or missing), then, while the store shards, to its shard channels.
async fn subscribe(
    subscriber: &Connection,
    namespace: &str,
    sharded: &AtomicBool,
) -> RedisResult<()> {
    subscriber.subscribe(channel(namespace)).await?;
    #[cfg(feature = "cluster")]
    if sharded.load(Ordering::Relaxed) {
        // One at a time: a command's channels must share a slot.
        for shard in shard_channels(namespace) {
            match subscriber.ssubscribe(shard).await {
                Ok(()) => {}
                Err(error)
                    if error.code() == Some("ERR")
                        && error.to_string().contains("unknown command") =>
                {
                    // Before Redis 7.0: the store publishes on the classic channel from now on
                    // (its scripts already fell back to it).
                    if sharded.swap(false, Ordering::Relaxed) {
                        warn!("the cluster has no sharded pub/sub (Redis before 7.0); notifications use classic pub/sub");
                    }
                    break;
                }
                Err(error) => return Err(error),
            }
        }
    }
    #[cfg(not(feature = "cluster"))]
    let _ = sharded;
    Ok(())
}

/// A pub/sub message `[channel, digest]`, classic or sharded, wakes the followers of that key
/// in this process.
///
/// A message is the key's digest, then (from this release on) its sender's origin tag: a
/// message of this store's own is skipped, since the store told its notifier when it made the
/// change (so the L1 entry a leader stamps after its own fill stays trusted). A message with
/// no tag (an older release) counts as another process's.
fn wake_followers(notifier: &Notifier, own: &[u8], push: PushInfo) {
    if !matches!(push.kind, PushKind::Message | PushKind::SMessage) {
        return;
    }
    let [Value::BulkString(channel), Value::BulkString(message)] = push.data.as_slice() else {
        return;
    };
    let (digest, origin) = message.split_at(message.len().min(64));
    if origin == own {
        return;
    }
    if digest == CLEARED.as_bytes() {
        notifier.cleared();
        return;
    }
    let namespace = std::str::from_utf8(channel).ok().and_then(namespace_of);
    let digest = std::str::from_utf8(digest)
        .ok()
        .and_then(KeyDigest::from_hex);
    if let (Some(namespace), Some(digest)) = (namespace, digest) {
        notifier.notify(&StoreKey::new(Arc::from(namespace), digest));
    } else {
        debug!("ignored a foreign message on a fill channel");
    }
}

#[cfg(test)]
mod tests {
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};

    use super::super::link::Link;
    use super::super::liveness::ServerSubscriber;
    use super::*;

    #[test]
    fn a_forgotten_channel_is_not_counted_subscribed_through_the_last_watched() {
        let mut channels = Channels::default();
        assert!(!channels.has("a"));
        channels.names.insert(Arc::from("a"));
        channels.names.insert(Arc::from("b"));
        assert!(channels.has("a"), "from the set");
        assert!(channels.has("a"), "as the last watched");
        channels.forget(Some("a"));
        assert!(!channels.has("a"), "forgotten");
        assert!(channels.has("b"));
        channels.forget(None);
        assert!(!channels.has("b"), "all forgotten");
    }

    /// A manager that was replaced may still deliver a message (a task of its own held it a
    /// moment longer): it changes nothing. The current manager's do. On real time, as it
    /// may be: it sets no timer.
    #[tokio::test]
    async fn a_replaced_managers_messages_are_ignored() {
        let client = redis::Client::open("redis://127.0.0.1:1/?protocol=resp3").unwrap();
        let config = ConnectionManagerConfig::new().set_automatic_resubscription();
        let store =
            ConnectionManager::new_lazy_with_config(client.clone(), ConnectionManagerConfig::new())
                .unwrap();
        let parts = Parts::new(&Connection::Server(Link::waiting(store)));
        let subscriber = ServerSubscriber::new(client, config, parts.pushes()).unwrap();
        let replaced = subscriber.generation();
        subscriber.replace().unwrap();
        let dropped = || PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        };

        let _ = parts.on_push(Some(replaced))(dropped());
        assert!(
            parts.notifier.receiving(),
            "the old manager's drop is ignored"
        );
        let _ = parts.on_push(Some(subscriber.generation()))(dropped());
        assert!(!parts.notifier.receiving(), "the current one's counts");
    }
}
