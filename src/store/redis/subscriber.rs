//! Which connection a store's fill notifications come on, and how it is dialled: one
//! server's subscriber (watched, see [`liveness`](super::liveness); following the primary
//! of a Sentinel service), or a cluster's. What the messages do is `notifications.rs`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use redis::{ConnectionInfo, ProtocolVersion, RedisResult};

#[cfg(feature = "cluster")]
use super::cluster::Cluster;
#[cfg(feature = "cluster")]
use super::cluster_link::ClusterLink;
use super::connection::Connection;
#[cfg(feature = "cluster")]
use super::dial::Target;
use super::dial::{no_url, Dial};
use super::liveness::ServerSubscriber;
use super::notifications::{Notifications, Parts};

/// The subscriber's connection: one server's, replaced when it goes silent, or a cluster's.
#[derive(Clone)]
pub(super) enum Subscriber {
    Server(ServerSubscriber),
    #[cfg(feature = "cluster")]
    Cluster(Connection),
}

impl Subscriber {
    /// The connection to subscribe on; none while a following subscriber has not found the
    /// primary.
    pub(super) fn connection(&self) -> RedisResult<Connection> {
        match self {
            Subscriber::Server(server) => server.connection(),
            #[cfg(feature = "cluster")]
            Subscriber::Cluster(cluster) => Ok(cluster.clone()),
        }
    }
}

impl Notifications {
    /// Opens the subscriber connection, dialled as the store is, with RESP3. A server that
    /// refuses it (before Redis 6, or these credentials) is an error: no notifications.
    pub(super) async fn connect(
        dial: &Dial,
        infos: &[ConnectionInfo],
        sharded: Arc<AtomicBool>,
        store: &Connection,
    ) -> RedisResult<Self> {
        #[cfg(feature = "cluster")]
        if let Target::Cluster(_) = &dial.target {
            let parts = Parts::new(store);
            let client = cluster_subscriber(dial, infos, &parts)?;
            let link = ClusterLink::connected(client.get_async_connection().await?);
            let subscriber = Subscriber::Cluster(Connection::Cluster(Cluster::new(link)));
            return Ok(Notifications::of(subscriber, &parts, sharded));
        }
        // The manager retries without end, its first connection too: try once first, so that
        // a server that refuses RESP3 or these credentials means no notifications (and a
        // warning) instead of a subscription that never completes. A Sentinel service's
        // primary: where the store found it.
        #[cfg(feature = "sentinel")]
        let first = match store.primary() {
            Some(primary) => primary.current().0,
            None => infos.first().cloned(),
        };
        #[cfg(not(feature = "sentinel"))]
        let first = infos.first().cloned();
        let client = dial.client(resp3(first.ok_or_else(no_url)?))?;
        let probe = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(dial.connection_timeout))
            .set_response_timeout(Some(dial.response_timeout));
        drop(
            client
                .get_multiplexed_async_connection_with_config(&probe)
                .await?,
        );
        Self::open(dial, infos, sharded, store)
    }

    /// The subscriber, without connecting: one server's connects on the first subscription,
    /// a cluster's in the background; subscriptions wait for the server as long as it takes.
    pub(super) fn open(
        dial: &Dial,
        infos: &[ConnectionInfo],
        sharded: Arc<AtomicBool>,
        store: &Connection,
    ) -> RedisResult<Self> {
        let parts = Parts::new(store);
        #[cfg(feature = "cluster")]
        if let Target::Cluster(_) = &dial.target {
            let client = cluster_subscriber(dial, infos, &parts)?;
            let address = dial.target.address();
            let link = ClusterLink::opening(client, address, dial.ping_wait());
            let subscriber = Subscriber::Cluster(Connection::Cluster(Cluster::new(link)));
            return Ok(Notifications::of(subscriber, &parts, sharded));
        }
        let config = dial.manager_config().set_automatic_resubscription();
        #[cfg(feature = "sentinel")]
        if let Some(primary) = store.primary() {
            // Its retries stay the store's: a manager left on a dead primary must not keep
            // trying it for good once the watchman has moved the subscriber away.
            let (to_client, mover) = (resp3_client(dial), resp3_client(dial));
            let subscriber = ServerSubscriber::following(
                Arc::clone(primary),
                to_client,
                config,
                parts.pushes(),
            )?;
            let follow = move |subscriber: &ServerSubscriber| subscriber.follow(&mover);
            return Ok(Self::watched(subscriber, follow, dial, &parts, sharded));
        }
        let info = resp3(infos.first().cloned().ok_or_else(no_url)?);
        // Keep trying to reconnect the subscriber through an outage of any length.
        let config = config.set_number_of_retries(usize::MAX);
        let subscriber = ServerSubscriber::new(dial.client(info)?, config, parts.pushes())?;
        Ok(Self::watched(
            subscriber,
            |_: &_| Ok(false),
            dial,
            &parts,
            sharded,
        ))
    }

    /// The notifications of one server's `subscriber`, watched (see
    /// [`liveness`](super::liveness)), moved by `follow` where it follows a primary.
    fn watched(
        subscriber: ServerSubscriber,
        follow: impl Fn(&ServerSubscriber) -> RedisResult<bool> + Send + 'static,
        dial: &Dial,
        parts: &Parts,
        sharded: Arc<AtomicBool>,
    ) -> Self {
        let (watched, watched_sharded) = (parts.clone(), Arc::clone(&sharded));
        let listener = move |subscriber| {
            let subscriber = Subscriber::Server(subscriber);
            Notifications::of(subscriber, &watched, Arc::clone(&watched_sharded))
        };
        subscriber.keep_watch(listener, follow, dial.ping_wait());
        Notifications::of(Subscriber::Server(subscriber), parts, sharded)
    }
}

/// The client of a cluster's subscriber: the store's dial settings, RESP3, and pushes to `parts`.
#[cfg(feature = "cluster")]
fn cluster_subscriber(
    dial: &Dial,
    infos: &[ConnectionInfo],
    parts: &Parts,
) -> RedisResult<redis::cluster::ClusterClient> {
    dial.cluster_client(infos.iter().cloned().map(resp3))
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(parts.on_push(None))
        .build()
}

/// The same connection settings, speaking RESP3 (which carries pub/sub messages as pushes).
fn resp3(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.set_redis_settings(settings)
}

/// Makes clients of a following subscriber: the store's dial settings, RESP3.
#[cfg(feature = "sentinel")]
fn resp3_client(dial: &Dial) -> impl Fn(ConnectionInfo) -> RedisResult<redis::Client> + Send {
    let dial = dial.clone();
    move |info| dial.client(resp3(info))
}
