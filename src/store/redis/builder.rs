//! `RedisStoreBuilder`: where a `RedisStore` connects (one server's URL or a cluster's seeds),
//! its timeouts, TLS (feature `tls`), and URLs redacted for `Debug` and error messages.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisResult};
use tracing::warn;

#[cfg(feature = "cluster")]
use super::cluster::Cluster;
#[cfg(feature = "cluster")]
use super::cluster_link::ClusterLink;
use super::connection::{store_error, Connection};
use super::link::Link;
use super::notifications::Notifications;
use super::RedisStore;
use crate::store::{StoreError, StoreErrorKind};

/// Where a store connects, as the user gave it (credentials included: never print it).
#[derive(Clone)]
pub(super) enum Target {
    /// One server's URL.
    Server(String),
    /// URLs of some of a cluster's nodes.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

impl Target {
    fn urls(&self) -> &[String] {
        match self {
            Target::Server(url) => std::slice::from_ref(url),
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => urls,
        }
    }

    /// The URLs without credentials, comma-separated.
    pub(super) fn address(&self) -> String {
        let urls: Vec<String> = self.urls().iter().map(|url| redact(url)).collect();
        urls.join(",")
    }
}

/// The error of a target without a URL.
pub(super) fn no_url() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no URL given"))
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`] (one server) and
/// `RedisStore::cluster_builder` (a Redis Cluster, feature `cluster`).
#[must_use]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    pub(super) target: Target,
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
    notifications: bool,
    /// Whether a cluster's notifications use sharded pub/sub.
    sharded_notifications: bool,
    /// PEM root certificates to trust instead of the system's.
    #[cfg(feature = "tls")]
    root_certificates: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisStoreBuilder");
        match &self.target {
            Target::Server(_) => debug.field("url", &self.target.address()),
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => debug.field("cluster", &self.target.address()),
        };
        debug
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("notifications", &self.notifications)
            .field("sharded_notifications", &self.sharded_notifications);
        #[cfg(feature = "tls")]
        debug.field(
            "tls_root_certificates",
            &if self.root_certificates.is_some() {
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
            target,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(3),
            notifications: true,
            sharded_notifications: true,
            #[cfg(feature = "tls")]
            root_certificates: None,
        }
    }

    /// How long one attempt to connect may take. Default: 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
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
        self.response_timeout = timeout;
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

    /// Trusts these root certificates (PEM, one or more) for `rediss://` connections, instead
    /// of the system's: for a server whose certificate a private CA signed. Feature `tls`.
    ///
    /// The server's certificate must name the host of the URL (a DNS name or an IP address).
    /// Connecting fails if a URL is not `rediss://`, or if the PEM holds no certificate.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(pem.into());
        self
    }

    /// Connects to Redis; fails if a URL is invalid or no server can be reached. To start
    /// while the server may be down, see [`open`](Self::open).
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let address = self.target.address();
        let infos = self.connection_infos()?;
        let connection = match &self.target {
            Target::Server(_) => {
                let client = self.server_client(&infos, &address)?;
                let connection = ConnectionManager::new_with_config(client, self.manager_config())
                    .await
                    .map_err(|e| store_error(format_args!("cannot connect to {address}"), e))?;
                Connection::Server(Link::watched(connection, address.clone(), self.ping_wait()))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let client = self.built_cluster_client(&infos, &address)?;
                let connection = client.get_async_connection().await.map_err(|e| {
                    store_error(
                        format_args!("cannot connect to the Redis Cluster at {address}"),
                        e,
                    )
                })?;
                Connection::Cluster(Cluster::new(ClusterLink::connected(connection)))
            }
        };
        let sharded = self.sharded();
        let notifications = if self.notifications {
            let connected =
                Notifications::connect(&self, &infos, Arc::clone(&sharded), &connection).await;
            without_notifications_if_refused(connected, &address)
        } else {
            None
        };
        Ok(RedisStore::new(connection, address, notifications, sharded))
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
        let address = self.target.address();
        let infos = self.connection_infos()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "RedisStore::open needs a tokio runtime (it connects in the background)",
            ));
        }
        let connection = match &self.target {
            Target::Server(_) => {
                let client = self.server_client(&infos, &address)?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, self.manager_config())
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
                    self.ping_wait(),
                ))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let client = self.built_cluster_client(&infos, &address)?;
                let link = ClusterLink::opening(client, address.clone(), self.ping_wait());
                Connection::Cluster(Cluster::new(link))
            }
        };
        let sharded = self.sharded();
        let notifications = if self.notifications {
            let opened = Notifications::open(&self, &infos, Arc::clone(&sharded), &connection);
            without_notifications_if_refused(opened, &address)
        } else {
            None
        };
        Ok(RedisStore::new(connection, address, notifications, sharded))
    }

    /// The client of a cluster's store; invalid settings are a configuration error.
    #[cfg(feature = "cluster")]
    fn built_cluster_client(
        &self,
        infos: &[ConnectionInfo],
        address: &str,
    ) -> Result<redis::cluster::ClusterClient, StoreError> {
        self.cluster_client(infos.iter().cloned())
            .build()
            .map_err(|e| {
                StoreError::with_source(
                    StoreErrorKind::Configuration,
                    format_args!("invalid Redis Cluster settings for {address}"),
                    e,
                )
            })
    }

    /// The client of one server's store.
    fn server_client(
        &self,
        infos: &[ConnectionInfo],
        address: &str,
    ) -> Result<redis::Client, StoreError> {
        let info = infos.first().cloned().ok_or_else(no_url);
        info.and_then(|info| self.client(info)).map_err(|e| {
            StoreError::with_source(
                StoreErrorKind::Configuration,
                format_args!("invalid Redis settings for {address}"),
                e,
            )
        })
    }

    /// How long the keeper of a lost connection waits for one `PING`: a connection attempt
    /// and a reply.
    pub(super) fn ping_wait(&self) -> Duration {
        self.connection_timeout
            .saturating_add(self.response_timeout)
    }

    /// Whether the store publishes on shard channels: on a cluster, unless told otherwise.
    fn sharded(&self) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(
            self.sharded_notifications && !matches!(self.target, Target::Server(_)),
        ))
    }

    /// Parses the URLs, and checks that TLS is available where they ask for it.
    fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, StoreError> {
        let mut infos = Vec::with_capacity(self.target.urls().len());
        for url in self.target.urls() {
            let address = redact(url);
            let info = url.as_str().into_connection_info().map_err(|e| {
                if cfg!(not(feature = "tls")) && address.starts_with("rediss://") {
                    StoreError::of_kind(
                        StoreErrorKind::Configuration,
                        format_args!(
                            "invalid Redis URL {address}: rediss:// (TLS) needs the `tls` feature of tower-stampede"
                        ),
                    )
                } else {
                    StoreError::with_source(
                        StoreErrorKind::Configuration,
                        format_args!("invalid Redis URL {address}"),
                        e,
                    )
                }
            })?;
            #[cfg(feature = "tls")]
            self.prepare_tls(&info, &address)?;
            infos.push(info);
        }
        if infos.is_empty() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "no Redis URL given",
            ));
        }
        Ok(infos)
    }

    /// Readies rustls for a `rediss://` URL; refuses a plain one when root certificates are
    /// set (they would be silently unused).
    #[cfg(feature = "tls")]
    fn prepare_tls(&self, info: &ConnectionInfo, address: &str) -> Result<(), StoreError> {
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            install_crypto_provider();
        } else if self.root_certificates.is_some() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                format_args!(
                    "invalid Redis URL {address}: TLS root certificates are set, so it must be rediss://"
                ),
            ));
        }
        if let Some(pem) = &self.root_certificates {
            use rustls::pki_types::{pem::PemObject, CertificateDer};
            if !CertificateDer::pem_slice_iter(pem).any(|cert| cert.is_ok()) {
                return Err(StoreError::of_kind(
                    StoreErrorKind::Configuration,
                    "the TLS root certificates hold no PEM certificate",
                ));
            }
        }
        Ok(())
    }

    pub(super) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1))
    }

    /// A client for one server, trusting the configured root certificates.
    pub(super) fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(root_cert) = &self.root_certificates {
            return redis::Client::build_with_tls(info, self.certificates(root_cert));
        }
        redis::Client::open(info)
    }

    #[cfg(feature = "tls")]
    fn certificates(&self, root_cert: &[u8]) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert.to_vec()),
        }
    }

    /// A cluster client builder for these nodes, with this builder's settings.
    #[cfg(feature = "cluster")]
    pub(super) fn cluster_client(
        &self,
        infos: impl IntoIterator<Item = ConnectionInfo>,
    ) -> ClusterClientBuilder {
        let builder = ClusterClientBuilder::new(infos)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout);
        #[cfg(feature = "tls")]
        if let Some(root_cert) = &self.root_certificates {
            return builder.certs(self.certificates(root_cert));
        }
        builder
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

/// rustls needs a process-wide crypto provider; install ring's unless the application has
/// installed one (or another crate did). Either will do, so losing a race is fine.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The URL without user name or password, for `Debug` and error messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsable URL>".to_owned();
    };
    // User info first: a password may hold `/`, `?` or `#` unescaped, and the host, port and
    // database never hold an `@`, so the last `@` ends it. Then the query, which may carry
    // credentials too.
    let (hidden, host) = match rest.rsplit_once('@') {
        Some((_, host)) => ("***@", host),
        None => ("", rest),
    };
    let host = host.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{hidden}{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(
            redact("redis://user:s3cret@host:6379/2"),
            "redis://***@host:6379/2"
        );
        assert_eq!(redact("redis://:pw@host"), "redis://***@host");
        assert_eq!(redact("redis://host:1/"), "redis://host:1/");
        assert_eq!(redact("garbage"), "<unparsable URL>");
        assert_eq!(redact("redis://u:pa/ss@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1/0?password=x"), "redis://h:1/0");
        assert_eq!(redact("redis://user:pa?ss@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://user:pa#ss@h:1"), "redis://***@h:1");
        let builder = RedisStore::builder("rediss://u:hunter2@h:1");
        assert!(!format!("{builder:?}").contains("hunter2"));
    }
}
