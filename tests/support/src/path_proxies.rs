//! One process's paths to every node of its store: a [`FaultProxy`] per node, made as the
//! store's resolver (`RedisStoreBuilder::dns_resolver`) meets the node's port, so that a
//! Cluster's nodes (found in `CLUSTER SLOTS` and redirections) and a Sentinel service's primary
//! (named by the sentinels, a new one after a failover) are reached through it too. A fault
//! set applies to every proxy, those made later included: a partition of the process is one
//! call.
//!
//! Addresses the store was given as they are (one server's URL, the sentinels', whose
//! questions redis-rs dials without the resolver) are given through [`proxy`](PathProxies::proxy)
//! ports; the resolver passes its own proxies' ports through.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use redis::io::AsyncDNSResolver;
use tokio::runtime::Handle;

use crate::fault_proxy::{Fault, FaultProxy, Kind};

/// A process's fault proxies, one per node port; cheap to clone.
#[derive(Clone)]
pub struct PathProxies(Arc<Inner>);

struct Inner {
    seed: u64,
    /// The runtime the proxies run on: the test's, which outlives a killed instance's.
    runtime: Handle,
    state: Mutex<State>,
}

struct State {
    /// By the node's port.
    proxies: HashMap<u16, FaultProxy>,
    /// What the commands' connections and the subscriber's get now, and new proxies too.
    commands: Fault,
    subscriber: Fault,
}

impl PathProxies {
    /// No proxy yet; they run on the current runtime, and their jitter is drawn from `seed`
    /// and the node's port.
    pub fn new(seed: u64) -> Self {
        PathProxies(Arc::new(Inner {
            seed,
            runtime: Handle::current(),
            state: Mutex::new(State {
                proxies: HashMap::new(),
                commands: Fault::Pass,
                subscriber: Fault::Pass,
            }),
        }))
    }

    /// The port of the proxy to the node on `upstream`, made if there is none yet.
    pub async fn proxy(&self, upstream: u16) -> u16 {
        if let Some(proxy) = self.0.state.lock().unwrap().proxies.get(&upstream) {
            return proxy.port();
        }
        let seed = self.0.seed ^ (u64::from(upstream) << 32);
        let made = self
            .0
            .runtime
            .spawn(FaultProxy::start(upstream, seed))
            .await
            .expect("a proxy starts");
        let mut state = self.0.state.lock().unwrap();
        if let Some(proxy) = state.proxies.get(&upstream) {
            return proxy.port();
        }
        made.set(Kind::Commands, state.commands);
        made.set(Kind::Subscriber, state.subscriber);
        let port = made.port();
        state.proxies.insert(upstream, made);
        port
    }

    /// Applies `fault` to the connections of `kind` on every path, now and made later.
    pub fn set(&self, kind: Kind, fault: Fault) {
        let mut state = self.0.state.lock().unwrap();
        if kind != Kind::Subscriber {
            state.commands = fault;
        }
        if kind != Kind::Commands {
            state.subscriber = fault;
        }
        for proxy in state.proxies.values() {
            proxy.set(kind, fault);
        }
    }

    /// Lifts every fault on every path.
    pub fn heal(&self) {
        self.set(Kind::All, Fault::Pass);
    }

    /// The node ports proxied so far.
    pub fn upstreams(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .0
            .state
            .lock()
            .unwrap()
            .proxies
            .keys()
            .copied()
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Whether `port` is one of these proxies'.
    fn is_proxy(&self, port: u16) -> bool {
        let state = self.0.state.lock().unwrap();
        state.proxies.values().any(|proxy| proxy.port() == port)
    }
}

/// Every node is on the loopback: its port is what tells it apart.
impl AsyncDNSResolver for PathProxies {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        _host: &'b str,
        port: u16,
    ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        Box::pin(async move {
            let port = if self.is_proxy(port) {
                port
            } else {
                self.proxy(port).await
            };
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            Ok(Box::new(std::iter::once(addr)) as Box<dyn Iterator<Item = SocketAddr> + Send>)
        })
    }
}
