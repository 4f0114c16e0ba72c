//! The application's resolver of the addresses the nodes announce (a Cluster's in
//! `CLUSTER SLOTS` and its redirections, a Sentinel service's primary as the sentinels name
//! it): for nodes that announce addresses the application cannot reach as they are (NAT,
//! containers, a proxy per process).
//!
//! redis-rs takes a resolver on a Cluster client and on one multiplexed connection, but not
//! on a `ConnectionManager` (1.8), which a Sentinel service's data link and subscriber are.
//! There the store resolves the primary's address itself, once per connection made (the
//! keeper makes a new one for each, see `sentinel.rs`), and dials the address resolved. That
//! address is an IP, so a certificate naming the host could not be checked: a resolver is
//! refused over TLS to a Sentinel service. Nor does redis-rs's `SentinelClient` take one:
//! the questions to the sentinels go to their URLs as given.

use std::net::SocketAddr;
use std::sync::Arc;

use redis::io::AsyncDNSResolver;
use redis::RedisFuture;
#[cfg(feature = "sentinel")]
use redis::{ConnectionAddr, ConnectionInfo, RedisResult};

/// The application's resolver, shared by every client a store makes.
#[derive(Clone)]
pub(super) struct Resolver(Arc<dyn AsyncDNSResolver>);

impl Resolver {
    pub(super) fn new(resolver: impl AsyncDNSResolver) -> Self {
        Resolver(Arc::new(resolver))
    }

    /// `info` at the first address its host resolves to (a Unix socket's unchanged).
    #[cfg(feature = "sentinel")]
    pub(super) async fn reachable(&self, info: ConnectionInfo) -> RedisResult<ConnectionInfo> {
        let (host, port) = match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            _ => return Ok(info),
        };
        let first = self.0.resolve(&host, port).await?.next();
        let Some(resolved) = first else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the DNS resolver gave no address",
            )));
        };
        let addr = match info.addr().clone() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: resolved.ip().to_string(),
                port: resolved.port(),
                insecure,
                tls_params,
            },
            _ => ConnectionAddr::Tcp(resolved.ip().to_string(), resolved.port()),
        };
        Ok(info.set_addr(addr))
    }
}

impl AsyncDNSResolver for Resolver {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        host: &'b str,
        port: u16,
    ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        self.0.resolve(host, port)
    }
}

/// `info`, reachable through `resolver` where there is one.
#[cfg(feature = "sentinel")]
pub(super) async fn reachable(
    resolver: Option<&Resolver>,
    info: ConnectionInfo,
) -> RedisResult<ConnectionInfo> {
    match resolver {
        Some(resolver) => resolver.reachable(info).await,
        None => Ok(info),
    }
}

#[cfg(all(test, feature = "sentinel"))]
mod tests {
    use redis::IntoConnectionInfo;

    use super::*;

    /// Every name is at 10.0.0.9, one port up.
    struct Shifted;

    impl AsyncDNSResolver for Shifted {
        fn resolve<'a, 'b: 'a>(
            &'a self,
            _host: &'b str,
            port: u16,
        ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
            let addr = SocketAddr::from(([10, 0, 0, 9], port + 1));
            Box::pin(async move {
                Ok(Box::new(std::iter::once(addr)) as Box<dyn Iterator<Item = SocketAddr> + Send>)
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_is_dialled_where_the_resolver_says_with_its_settings() {
        let info = "redis://app:pw@node-7:6379/3"
            .into_connection_info()
            .unwrap();
        let reached = reachable(Some(&Resolver::new(Shifted)), info.clone())
            .await
            .unwrap();
        assert_eq!(
            reached.addr(),
            &ConnectionAddr::Tcp("10.0.0.9".to_owned(), 6380)
        );
        assert_eq!(reached.redis_settings().db(), 3);
        assert_eq!(reached.redis_settings().password(), Some("pw"));
        let unchanged = reachable(None, info.clone()).await.unwrap();
        assert_eq!(unchanged.addr(), info.addr());
    }
}
