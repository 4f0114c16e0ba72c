//! `RedisStoreBuilder`: the settings a user gives a `RedisStore` (where it connects, its
//! timeouts, TLS, notifications), and connecting or opening it. How it dials is `dial.rs`.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::RedisResult;
use tracing::warn;

#[cfg(feature = "cluster")]
use super::cluster::Cluster;
#[cfg(feature = "cluster")]
use super::cluster_link::ClusterLink;
use super::connection::{store_error, Connection};
use super::dial::{Dial, Target};
use super::link::Link;
use super::notifications::Notifications;
#[cfg(feature = "sentinel")]
use super::sentinel::Primary;
use super::RedisStore;
use crate::store::error::{StoreError, StoreErrorKind};

/// Builds a [`RedisStore`]; see [`RedisStore::builder`] (one server) and
/// `RedisStore::cluster_builder` (a Redis Cluster, feature `cluster`).
#[must_use]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    dial: Dial,
    notifications: bool,
    /// Whether a cluster's notifications use sharded pub/sub.
    sharded_notifications: bool,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisStoreBuilder");
        match &self.dial.target {
            Target::Server(_) => debug.field("url", &self.dial.target.address()),
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => debug.field("cluster", &self.dial.target.address()),
            #[cfg(feature = "sentinel")]
            Target::Sentinel { service, .. } => debug
                .field("sentinels", &self.dial.target.address())
                .field("service", service)
                .field(
                    "primary_credentials",
                    &if self.dial.primary_auth.password.is_some() {
                        "set"
                    } else {
                        "not set"
                    },
                ),
        };
        debug
            .field("connection_timeout", &self.dial.connection_timeout)
            .field("response_timeout", &self.dial.response_timeout)
            .field("notifications", &self.notifications)
            .field("sharded_notifications", &self.sharded_notifications);
        #[cfg(any(feature = "cluster", feature = "sentinel"))]
        debug.field(
            "dns_resolver",
            &if self.dial.resolver.is_some() {
                "set"
            } else {
                "not set"
            },
        );
        #[cfg(feature = "tls")]
        debug.field(
            "tls_root_certificates",
            &if self.dial.root_certificates.is_some() {
                "set"
            } else {
                "not set"
            },
        );
        debug.finish()
    }
}

impl RedisStoreBuilder {
    pub(super) fn new(target: Target) -> Self {
        RedisStoreBuilder {
            dial: Dial::new(target),
            notifications: true,
            sharded_notifications: true,
        }
    }

    /// How long one attempt to connect may take. Default: 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.dial.connection_timeout = timeout;
        self
    }

    /// How long the connection waits for one reply before it gives up on it. Default: 3 s.
    /// On a cluster, this bounds a call with its redirections and retries.
    ///
    /// This is a backstop: the engine bounds every store call with its own timeout
    /// ([`CacheBuilder::store_timeout`](crate::CacheBuilder::store_timeout)), which a call
    /// queued behind others while the store answers may take up to ten times (2.5 s by
    /// default). Keep this above that, or it ends such calls first.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.dial.response_timeout = timeout;
        self
    }

    /// Whether to open the subscriber connection that wakes followers when a key is filled
    /// (one per store, shared by its clones). Without it followers only poll. Default: on.
    pub fn notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// On a Redis Cluster, whether changes are published with sharded pub/sub (`SPUBLISH`,
    /// Redis 7.0 and later: one message to the key's shard) rather than classic `PUBLISH`
    /// (broadcast to every node). Default: on; a server without it is found out at the first
    /// subscription, and classic pub/sub is used. One server always uses classic pub/sub:
    /// there, sharding would save nothing.
    ///
    /// Every store subscribes to both, so it hears stores of either setting (and of releases
    /// before this one, which publish on the classic channel); turn it off while a fleet is
    /// upgraded from such a release, so the older processes keep hearing the newer ones.
    pub fn sharded_notifications(mut self, on: bool) -> Self {
        self.sharded_notifications = on;
        self
    }

    /// The user name (`None`: the default user) and password the store gives the data nodes
    /// of a Sentinel service; the sentinels' own come in their URLs. Feature `sentinel`; on
    /// another target, connecting fails.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn primary_credentials(mut self, username: Option<&str>, password: &str) -> Self {
        self.dial.primary_auth.username = username.map(str::to_owned);
        self.dial.primary_auth.password = Some(password.to_owned());
        self
    }

    /// The database the store uses on the data nodes of a Sentinel service. Default: 0.
    /// Feature `sentinel`; on another target, connecting fails.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn primary_db(mut self, db: i64) -> Self {
        self.dial.primary_auth.db = db;
        self
    }

    /// Trusts these root certificates (PEM, one or more) for `rediss://` connections, instead
    /// of the system's: for a server whose certificate a private CA signed. Feature `tls`.
    ///
    /// The server's certificate must name the host of the URL (a DNS name or an IP address).
    /// Connecting fails if a URL is not `rediss://`, or if the PEM holds no certificate.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.dial.root_certificates = Some(pem.into());
        self
    }

    /// Where to dial the addresses the nodes announce: a Cluster's nodes (as `CLUSTER SLOTS`
    /// and redirections name them) and a Sentinel service's primary (as the sentinels name
    /// it). For nodes that announce addresses the application cannot reach as they are: a
    /// cluster behind NAT or in containers, announcing their own network's addresses; the
    /// resolver maps each `(host, port)` to an address that reaches it. Features `cluster`,
    /// `sentinel`.
    ///
    /// Every connection the store makes to a node is dialled through it: the data
    /// connections and the subscriber's, after a failover too (asked again for each new
    /// connection), and, on a Sentinel service, the connections that listen to the sentinels'
    /// announcements. The questions to the sentinels go to their URLs as given (redis-rs's
    /// `SentinelClient` takes no resolver), as one server's URL is dialled as given: the
    /// resolver is refused there. On a Sentinel service the primary is dialled at the IP
    /// address resolved, whose certificate could not be checked against its name, so it is
    /// refused over TLS too; a Cluster's TLS keeps the node's name.
    ///
    /// ```
    /// # #[cfg(feature = "cluster")] {
    /// use std::net::SocketAddr;
    /// use redis::io::AsyncDNSResolver;
    /// use tower_stampede::store::RedisStore;
    ///
    /// /// The nodes announce 10.1.0.x:6379; this host reaches node x at gateway port 7000 + x.
    /// struct Gateway;
    ///
    /// impl AsyncDNSResolver for Gateway {
    ///     fn resolve<'a, 'b: 'a>(
    ///         &'a self,
    ///         host: &'b str,
    ///         port: u16,
    ///     ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
    ///         let node: Option<u16> = host.strip_prefix("10.1.0.").and_then(|x| x.parse().ok());
    ///         let addr = match node {
    ///             Some(x) => SocketAddr::from(([192, 0, 2, 1], 7000 + x)),
    ///             None => SocketAddr::from(([127, 0, 0, 1], port)),
    ///         };
    ///         Box::pin(async move {
    ///             Ok(Box::new(std::iter::once(addr)) as Box<dyn Iterator<Item = SocketAddr> + Send>)
    ///         })
    ///     }
    /// }
    ///
    /// let builder = RedisStore::cluster_builder(["redis://10.1.0.1:6379/"]).dns_resolver(Gateway);
    /// # let _ = builder;
    /// # }
    /// ```
    #[cfg(any(feature = "cluster", feature = "sentinel"))]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "cluster", feature = "sentinel"))))]
    pub fn dns_resolver(mut self, resolver: impl redis::io::AsyncDNSResolver) -> Self {
        self.dial.resolver = Some(super::resolver::Resolver::new(resolver));
        self
    }

    /// Connects to Redis; fails if a URL is invalid or no server can be reached. To start
    /// while the server may be down, see [`open`](Self::open).
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        self.only_settings_the_target_uses()?;
        let address = self.dial.target.address();
        let infos = self.dial.connection_infos()?;
        let connection = match &self.dial.target {
            Target::Server(_) => {
                let client = self.dial.server_client(&infos, &address)?;
                let connection =
                    ConnectionManager::new_with_config(client, self.dial.manager_config())
                        .await
                        .map_err(|e| store_error(format_args!("cannot connect to {address}"), e))?;
                Connection::Server(Link::watched(
                    connection,
                    address.clone(),
                    self.dial.ping_wait(),
                ))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let client = self.dial.built_cluster_client(&infos, &address)?;
                let connection = client.get_async_connection().await.map_err(|e| {
                    store_error(
                        format_args!("cannot connect to the Redis Cluster at {address}"),
                        e,
                    )
                })?;
                Connection::Cluster(Cluster::new(ClusterLink::connected(connection)))
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel { service, .. } => {
                let primary = Primary::new(&self.dial, &infos, service, &self.dial.primary_auth)?;
                let first = primary.dial().await.map_err(|e| {
                    store_error(
                        format_args!("cannot connect to the primary of {address}"),
                        e,
                    )
                })?;
                let link =
                    Link::following(primary, Some(first), address.clone(), self.dial.ping_wait());
                Connection::Server(link)
            }
        };
        let sharded = self.sharded();
        let notifications = if self.notifications {
            let connected =
                Notifications::connect(&self.dial, &infos, Arc::clone(&sharded), &connection).await;
            without_notifications_if_refused(connected, &address)
        } else {
            None
        };
        Ok(self.store(connection, address, notifications, sharded))
    }

    /// The store, at once, without waiting for the server: it connects in the background,
    /// and keeps trying through an outage of any length, so an application can start while
    /// Redis is down. Until the server answers, the store's calls fail at once, and the engine
    /// loads with in-process protection (one load per key per process); once it answers,
    /// protection across processes is back by itself. Fails at once on what no server can
    /// fix: an invalid URL, TLS without the `tls` feature, no tokio runtime.
    ///
    /// A Redis Cluster store opens the same way: it discovers the cluster's nodes once a seed
    /// answers. Notifications are subscribed once the server answers; a server that refuses
    /// their protocol (RESP3, before Redis 6) never sends any, and followers poll.
    pub fn open(self) -> Result<RedisStore, StoreError> {
        self.only_settings_the_target_uses()?;
        let address = self.dial.target.address();
        let infos = self.dial.connection_infos()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "RedisStore::open needs a tokio runtime (it connects in the background)",
            ));
        }
        let connection = match &self.dial.target {
            Target::Server(_) => {
                let client = self.dial.server_client(&infos, &address)?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, self.dial.manager_config())
                        .map_err(|e| {
                            StoreError::with_source(
                                StoreErrorKind::Configuration,
                                format_args!("invalid Redis settings for {address}"),
                                e,
                            )
                        })?;
                Connection::Server(Link::starting_down(
                    manager,
                    address.clone(),
                    self.dial.ping_wait(),
                ))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let client = self.dial.built_cluster_client(&infos, &address)?;
                let link = ClusterLink::opening(client, address.clone(), self.dial.ping_wait());
                Connection::Cluster(Cluster::new(link))
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel { service, .. } => {
                let primary = Primary::new(&self.dial, &infos, service, &self.dial.primary_auth)?;
                Connection::Server(Link::following(
                    primary,
                    None,
                    address.clone(),
                    self.dial.ping_wait(),
                ))
            }
        };
        let sharded = self.sharded();
        let notifications = if self.notifications {
            let opened = Notifications::open(&self.dial, &infos, Arc::clone(&sharded), &connection);
            without_notifications_if_refused(opened, &address)
        } else {
            None
        };
        Ok(self.store(connection, address, notifications, sharded))
    }

    /// Refuses the settings a target would leave silently unused: the data nodes' of a
    /// Sentinel service elsewhere, a resolver on one server.
    fn only_settings_the_target_uses(&self) -> Result<(), StoreError> {
        #[cfg(feature = "sentinel")]
        if !matches!(self.dial.target, Target::Sentinel { .. })
            && (self.dial.primary_auth.password.is_some() || self.dial.primary_auth.db != 0)
        {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "primary_credentials and primary_db are for a Sentinel service (RedisStore::sentinel_builder)",
            ));
        }
        #[cfg(any(feature = "cluster", feature = "sentinel"))]
        if matches!(self.dial.target, Target::Server(_)) && self.dial.resolver.is_some() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "dns_resolver is for a Cluster's or a Sentinel service's announced addresses: one server's URL is dialled as given",
            ));
        }
        Ok(())
    }

    /// Whether the store publishes on shard channels: on a cluster, unless told otherwise.
    fn sharded(&self) -> Arc<AtomicBool> {
        #[cfg(feature = "cluster")]
        let cluster = matches!(self.dial.target, Target::Cluster(_));
        #[cfg(not(feature = "cluster"))]
        let cluster = false;
        Arc::new(AtomicBool::new(self.sharded_notifications && cluster))
    }

    /// The store over `connection`, with its notifications; a Sentinel service's listens to
    /// the sentinels' announcements of a new primary.
    fn store(
        &self,
        connection: Connection,
        address: String,
        notifications: Option<Notifications>,
        sharded: Arc<AtomicBool>,
    ) -> RedisStore {
        #[cfg(feature = "sentinel")]
        if let (Some(primary), Connection::Server(link)) = (connection.primary(), &connection) {
            primary.listen(link.mover());
        }
        RedisStore::new(connection, address, notifications, sharded)
    }
}

/// The store's notifications, or none (and a warning) if the server refused the subscriber.
fn without_notifications_if_refused(
    notifications: RedisResult<Notifications>,
    address: &str,
) -> Option<Notifications> {
    match notifications {
        Ok(notifications) => Some(notifications),
        Err(error) => {
            warn!(%error, %address, "no fill notifications (the subscriber needs RESP3: Redis 6+); followers poll");
            None
        }
    }
}
