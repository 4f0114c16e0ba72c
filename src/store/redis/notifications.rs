//! Fill notifications over Redis pub/sub: the process's one subscriber connection, the
//! channels it listens on, and how a message wakes this process's followers.
//!
//! Pub/sub is lossy (a message sent while the subscriber reconnects is gone), so followers poll
//! as well: a lost message costs latency, never correctness.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionManager;
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tracing::{debug, warn};

use super::builder::{no_url, RedisStoreBuilder, Target};
use super::connection::Connection;
use super::names::{channel, namespace_of};
use crate::store::{KeyDigest, Notifier, StoreKey};

/// The process's one subscriber connection (RESP3, resubscribing by itself after a
/// reconnect) and the followers it wakes.
#[derive(Clone)]
pub(super) struct Notifications {
    subscriber: Connection,
    pub(super) notifier: Notifier,
    /// Namespaces whose channel is subscribed (or being subscribed).
    channels: Arc<Mutex<HashSet<Arc<str>>>>,
}

impl Notifications {
    /// Opens the subscriber connection, with the builder's settings and RESP3. A server that
    /// refuses it (before Redis 6, or these credentials) is an error: no notifications.
    pub(super) async fn connect(
        builder: &RedisStoreBuilder,
        infos: &[ConnectionInfo],
    ) -> RedisResult<Self> {
        let notifier = Notifier::new();
        let channels: Arc<Mutex<HashSet<Arc<str>>>> = Arc::default();
        let (wake, forget) = (notifier.clone(), Arc::clone(&channels));
        let on_push = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                // The connection resubscribes when it reconnects, but a single server's
                // reconnects only when it is used, and a cluster's may have to find the
                // channel's slot on another node: forget the channels, so the next watch
                // subscribes again (and so reconnects). Meanwhile, followers poll.
                crate::sync::lock(&forget).clear();
            } else {
                wake_followers(&wake, push);
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let subscriber = match &builder.target {
            Target::Server(_) => {
                let info = resp3(infos.first().cloned().ok_or_else(no_url)?);
                let config = builder
                    .manager_config()
                    .set_push_sender(on_push)
                    .set_automatic_resubscription()
                    // Keep trying to reconnect the subscriber through an outage of any length.
                    .set_number_of_retries(usize::MAX);
                let client = builder.client(info)?;
                // The manager retries without end, its first connection too: try once first,
                // so that a server that refuses RESP3 or these credentials means no
                // notifications (and a warning) instead of a `connect` that never returns.
                let probe = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(builder.connection_timeout))
                    .set_response_timeout(Some(builder.response_timeout));
                drop(
                    client
                        .get_multiplexed_async_connection_with_config(&probe)
                        .await?,
                );
                // Lazy: it connects on the first subscription.
                Connection::Server(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let infos = infos.iter().cloned().map(resp3);
                let client = builder
                    .cluster_client(infos)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(on_push)
                    .build()?;
                Connection::Cluster(client.get_async_connection().await?)
            }
        };
        Ok(Notifications {
            subscriber,
            notifier,
            channels,
        })
    }

    /// Subscribes to a namespace's channel the first time one of its keys is watched. Until
    /// the subscription is in place, followers of that namespace poll.
    pub(super) fn ensure_subscribed(&self, namespace: &str) {
        let mut channels = crate::sync::lock(&self.channels);
        if channels.contains(namespace) {
            return;
        }
        let namespace: Arc<str> = Arc::from(namespace);
        channels.insert(Arc::clone(&namespace));
        let (subscriber, channels) = (self.subscriber.clone(), Arc::clone(&self.channels));
        tokio::spawn(async move {
            if let Err(error) = subscriber.subscribe(channel(&namespace)).await {
                warn!(%error, %namespace, "cannot subscribe to fill notifications; followers poll");
                // Forget it, so the next watch tries again.
                crate::sync::lock(&channels).remove(&namespace);
            }
        });
    }
}

/// The same connection settings, speaking RESP3 (which carries pub/sub messages as pushes).
fn resp3(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.set_redis_settings(settings)
}

/// A pub/sub message `[channel, digest]` wakes the followers of that key in this process.
fn wake_followers(notifier: &Notifier, push: PushInfo) {
    if push.kind != PushKind::Message {
        return;
    }
    let [Value::BulkString(channel), Value::BulkString(digest)] = push.data.as_slice() else {
        return;
    };
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
