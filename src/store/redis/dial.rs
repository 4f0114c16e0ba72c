//! How a `RedisStore` reaches its servers: the target (one server's URL or a cluster's seeds),
//! the connection and response timeouts, TLS (feature `tls`), the clients made from them, and
//! URLs redacted for `Debug` and error messages. The builder and the subscriber both dial
//! through it.

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisResult};

#[cfg(any(feature = "cluster", feature = "sentinel"))]
use super::resolver::Resolver;
use crate::store::error::{StoreError, StoreErrorKind};

/// Where a store connects, as the user gave it (credentials included: never print it).
#[derive(Clone)]
pub(super) enum Target {
    /// One server.
    Server(Nodes),
    /// Some of a cluster's nodes.
    #[cfg(feature = "cluster")]
    Cluster(Nodes),
    /// Sentinels, and the name of the service whose primary they watch.
    #[cfg(feature = "sentinel")]
    Sentinel { sentinels: Nodes, service: String },
}

/// Servers as the user named them.
#[derive(Clone)]
pub(super) enum Nodes {
    /// Their URLs.
    Urls(Vec<String>),
    /// The connection settings of clients the application made (`redis::Client`, a
    /// `ConnectionInfo`, anything `IntoConnectionInfo`): address, credentials, database,
    /// protocol and TLS settings; or why they could not be read.
    Infos(Result<Vec<ConnectionInfo>, redis::RedisError>),
}

impl Nodes {
    /// Nodes read from anything redis-rs reads connection settings from.
    pub(super) fn infos<T: IntoConnectionInfo>(nodes: impl IntoIterator<Item = T>) -> Self {
        Nodes::Infos(
            nodes
                .into_iter()
                .map(IntoConnectionInfo::into_connection_info)
                .collect(),
        )
    }
}

impl Target {
    fn nodes(&self) -> &Nodes {
        match self {
            Target::Server(nodes) => nodes,
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => nodes,
            #[cfg(feature = "sentinel")]
            Target::Sentinel { sentinels, .. } => sentinels,
        }
    }

    /// The URLs without credentials, comma-separated (a sentinel's: the sentinels').
    pub(super) fn address(&self) -> String {
        let shown: Vec<String> = match self.nodes() {
            Nodes::Urls(urls) => urls.iter().map(|url| redact(url)).collect(),
            Nodes::Infos(Ok(infos)) => infos.iter().map(info_address).collect(),
            Nodes::Infos(Err(_)) => vec!["<invalid connection settings>".to_owned()],
        };
        shown.join(",")
    }
}

/// The address of a client's settings as a URL without credentials: `redis://host:6379/0`.
fn info_address(info: &ConnectionInfo) -> String {
    let scheme = match info.addr() {
        redis::ConnectionAddr::TcpTls { .. } => "rediss",
        redis::ConnectionAddr::Unix(_) => "redis+unix",
        _ => "redis",
    };
    format!("{scheme}://{}/{}", info.addr(), info.redis_settings().db())
}

/// How long a keeper waits between two attempts that found no server (or no primary).
pub(super) const KEEPER_PAUSE: Duration = Duration::from_millis(250);

/// How often a connection that only waits for pushes (the subscriber's, a sentinel listener's)
/// is asked for a `PING`, so that one gone silent without closing is found.
pub(super) const PING_EVERY: Duration = Duration::from_secs(1);

/// The credentials and database of a Sentinel service's data nodes, which the sentinels'
/// URLs do not carry.
#[cfg(feature = "sentinel")]
#[derive(Clone, Default)]
pub(super) struct PrimaryAuth {
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: i64,
}

/// The error of a target without a URL.
pub(super) fn no_url() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no URL given"))
}

/// How to reach the servers: where, within what time, and which certificates to trust.
#[derive(Clone)]
pub(super) struct Dial {
    pub(super) target: Target,
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
    /// PEM root certificates to trust instead of the system's.
    #[cfg(feature = "tls")]
    pub(super) root_certificates: Option<Vec<u8>>,
    /// The data nodes' credentials and database, where the URLs are the sentinels'.
    #[cfg(feature = "sentinel")]
    pub(super) primary_auth: PrimaryAuth,
    /// Where the nodes' announced addresses are dialled, if the application says.
    #[cfg(any(feature = "cluster", feature = "sentinel"))]
    pub(super) resolver: Option<Resolver>,
}

impl Dial {
    /// `target`, with the default timeouts (connecting 1 s, a reply 3 s).
    pub(super) fn new(target: Target) -> Self {
        Dial {
            target,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(3),
            #[cfg(feature = "tls")]
            root_certificates: None,
            #[cfg(feature = "sentinel")]
            primary_auth: PrimaryAuth::default(),
            #[cfg(any(feature = "cluster", feature = "sentinel"))]
            resolver: None,
        }
    }

    /// The client of a cluster's store; invalid settings are a configuration error.
    #[cfg(feature = "cluster")]
    pub(super) fn built_cluster_client(
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
    pub(super) fn server_client(
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

    /// Parses the URLs, and checks that TLS is available where they ask for it.
    pub(super) fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, StoreError> {
        let urls = match self.target.nodes() {
            Nodes::Urls(urls) => urls,
            Nodes::Infos(infos) => return self.given_infos(infos),
        };
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
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

    /// The connection settings the application gave, checked as URLs are.
    fn given_infos(
        &self,
        infos: &Result<Vec<ConnectionInfo>, redis::RedisError>,
    ) -> Result<Vec<ConnectionInfo>, StoreError> {
        let infos = infos.as_ref().map_err(|e| {
            StoreError::with_source(
                StoreErrorKind::Configuration,
                "invalid Redis connection settings",
                e.clone(),
            )
        })?;
        #[cfg(feature = "tls")]
        for info in infos {
            self.prepare_tls(info, &info_address(info))?;
        }
        if infos.is_empty() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                "no Redis connection settings given",
            ));
        }
        Ok(infos.clone())
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

    /// The root certificates to trust, for a redis-rs client.
    #[cfg(feature = "tls")]
    pub(super) fn certificates(&self, root_cert: &[u8]) -> redis::TlsCertificates {
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
        let mut builder = ClusterClientBuilder::new(infos)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout);
        if let Some(resolver) = &self.resolver {
            builder = builder.async_dns_resolver(resolver.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(root_cert) = &self.root_certificates {
            return builder.certs(self.certificates(root_cert));
        }
        builder
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
    use crate::store::RedisStore;

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

    #[cfg(feature = "sentinel")]
    #[test]
    fn a_sentinel_builder_hides_both_credentials() {
        let builder = RedisStore::sentinel_builder(["redis://:s3ntinel@s1:26379"], "mymaster")
            .primary_credentials(Some("app"), "hunter2");
        let debug = format!("{builder:?}");
        assert!(
            debug.contains("mymaster") && debug.contains("redis://***@s1:26379"),
            "{debug}"
        );
        assert!(
            !debug.contains("hunter2") && !debug.contains("s3ntinel"),
            "{debug}"
        );
    }

    /// One server's URL is the application's own: a resolver there would be silently unused.
    #[cfg(feature = "cluster")]
    #[tokio::test(start_paused = true)]
    async fn a_resolver_is_refused_on_one_server() {
        struct Unused;
        impl redis::io::AsyncDNSResolver for Unused {
            fn resolve<'a, 'b: 'a>(
                &'a self,
                _host: &'b str,
                _port: u16,
            ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = std::net::SocketAddr> + Send + 'a>>
            {
                unreachable!("never asked")
            }
        }
        let open = RedisStore::builder("redis://127.0.0.1:1/")
            .dns_resolver(Unused)
            .open();
        let error = open.expect_err("refused");
        assert_eq!(error.kind(), crate::store::StoreErrorKind::Configuration);
        assert!(error.to_string().contains("dns_resolver"), "{error}");
    }

    /// The data nodes' settings are a Sentinel service's alone: elsewhere they would be
    /// silently unused, so building fails.
    #[cfg(feature = "sentinel")]
    #[tokio::test(start_paused = true)]
    async fn primary_settings_are_refused_on_another_target() {
        let open = RedisStore::builder("redis://127.0.0.1:1/")
            .primary_credentials(None, "pw")
            .open();
        let error = open.expect_err("refused");
        assert_eq!(error.kind(), crate::store::StoreErrorKind::Configuration);
        assert!(error.to_string().contains("sentinel_builder"), "{error}");
    }
}
