//! What the soak's instances share: one redis-server, or (`--cluster`, feature `cluster`) a
//! Redis Cluster of three masters with a replica each, or (`--sentinel`, feature `sentinel`) a
//! primary with two replicas under three sentinels; and the commands the faults and the bounds
//! send to its nodes, each on a connection of its own (the injector's own connection would be
//! killed with the others).
//!
//! Every instance connects to the data nodes as an ACL user of its own (`soak<i>`), so that
//! `CLIENT LIST` tells its connections from the others'. The sentinels know no such users:
//! their clients are told apart only from the sentinels' own links (see
//! [`sentinel_clients`]).

use std::collections::BTreeMap;
use std::time::Duration;

#[cfg(feature = "cluster")]
use support::RedisCluster;
#[cfg(feature = "sentinel")]
use support::RedisSentinel;
use support::RedisServer;

/// Which Redis the instances share.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Server,
    Cluster,
    Sentinel,
}

impl Topology {
    /// From `SOAK_CLUSTER=1` or `SOAK_SENTINEL=1` (not both).
    pub fn from_env() -> Self {
        let on = |name| std::env::var(name).is_ok_and(|v| v == "1");
        match (on("SOAK_CLUSTER"), on("SOAK_SENTINEL")) {
            (false, false) => Topology::Server,
            (true, false) => Topology::Cluster,
            (false, true) => Topology::Sentinel,
            (true, true) => panic!("SOAK_CLUSTER and SOAK_SENTINEL are exclusive"),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Topology::Server => "one server",
            Topology::Cluster => "a Redis Cluster (3 masters, a replica each)",
            Topology::Sentinel => "Redis Sentinel (a primary, 2 replicas, 3 sentinels)",
        }
    }

    /// The variable that replays a run in this mode, with a leading space, if any.
    pub fn env(self) -> &'static str {
        match self {
            Topology::Server => "",
            Topology::Cluster => " SOAK_CLUSTER=1",
            Topology::Sentinel => " SOAK_SENTINEL=1",
        }
    }
}

pub enum Backend {
    Server(RedisServer),
    #[cfg(feature = "cluster")]
    Cluster(RedisCluster),
    #[cfg(feature = "sentinel")]
    Sentinel(RedisSentinel),
}

/// The ACL user instance `i` connects as.
pub fn user(i: usize) -> String {
    format!("soak{i}")
}

impl Backend {
    /// One server, a Cluster with replicas, or a primary with replicas under sentinels; its
    /// data nodes know the users of `instances` instances (and `default`, for the faults,
    /// `redis-cli`, the replication and the sentinels).
    pub fn start(topology: Topology, instances: usize) -> Self {
        let users: Vec<String> = (0..instances)
            .flat_map(|i| {
                [
                    "--user".to_owned(),
                    user(i),
                    "on".to_owned(),
                    "nopass".to_owned(),
                    "~*".to_owned(),
                    "&*".to_owned(),
                    "+@all".to_owned(),
                ]
            })
            .collect();
        let users: Vec<&str> = users.iter().map(String::as_str).collect();
        match topology {
            Topology::Server => Backend::Server(RedisServer::start_with(&users)),
            #[cfg(feature = "cluster")]
            Topology::Cluster => Backend::Cluster(RedisCluster::start_with_replicas_and(&users)),
            #[cfg(feature = "sentinel")]
            Topology::Sentinel => Backend::Sentinel(RedisSentinel::start_with(&users)),
            #[allow(unreachable_patterns)]
            _ => panic!("this mode needs its feature (./scripts/soak.sh turns it on)"),
        }
    }

    pub fn topology(&self) -> Topology {
        match self {
            Backend::Server(_) => Topology::Server,
            #[cfg(feature = "cluster")]
            Backend::Cluster(_) => Topology::Cluster,
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(_) => Topology::Sentinel,
        }
    }

    /// The URLs instance `i` connects to: the server's, the cluster's seeds, or the sentinels'
    /// (which know no `soak<i>`: the instance names its user to the data nodes apart).
    pub fn urls(&self, i: usize) -> Vec<String> {
        let ports = match self {
            Backend::Server(server) => vec![server.port()],
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.ports(),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => return sentinel.sentinel_urls(),
        };
        ports
            .into_iter()
            .map(|port| format!("redis://{}:x@127.0.0.1:{port}/", user(i)))
            .collect()
    }

    /// The name the sentinels know the primary by (Sentinel mode only).
    pub fn service(&self) -> Option<String> {
        match self {
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => Some(sentinel.service().to_owned()),
            _ => None,
        }
    }

    /// The ports of the data nodes that run now (the one server's, even while it is down).
    pub fn live_ports(&self) -> Vec<u16> {
        match self {
            Backend::Server(server) => vec![server.port()],
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.live_ports(),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => sentinel.live_data_ports(),
        }
    }

    /// The sentinels' ports (none but in Sentinel mode).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        match self {
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => sentinel
                .sentinel_urls()
                .iter()
                .filter_map(|url| url.rsplit(':').next()?.trim_end_matches('/').parse().ok())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The nodes an idle instance holds connections to, for its idle tasks: the one server,
    /// every live node of a Cluster, or the primary and each sentinel (the store's lookups
    /// keep a connection to each, and it listens to one for `+switch-master`).
    pub fn connected_nodes(&self) -> usize {
        match self.topology() {
            Topology::Sentinel => 1 + self.sentinel_ports().len(),
            _ => self.live_ports().len(),
        }
    }
}

/// Runs `cmd` on the node on `port`, as `default`, within 2 s; errors are the fault's effect
/// (a node down, a replica that refuses a write) and are dropped.
pub async fn on_node<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let run = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        cmd.query_async::<T>(&mut conn).await
    };
    tokio::time::timeout(Duration::from_secs(2), run)
        .await
        .ok()?
        .ok()
}

/// Runs `cmd` on every node in `ports`.
pub async fn on_each_node(ports: &[u16], cmd: &redis::Cmd) {
    for port in ports {
        let _ = on_node::<redis::Value>(*port, cmd).await;
    }
}

/// The connections of each ACL user over the nodes in `ports` (`CLIENT LIST`), or `None` if a
/// node did not answer.
pub async fn connections_per_user(ports: &[u16]) -> Option<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for port in ports {
        let list: String = on_node(*port, redis::cmd("CLIENT").arg("LIST")).await?;
        for line in list.lines() {
            if let Some(user) = line
                .split(' ')
                .find_map(|field| field.strip_prefix("user="))
            {
                *counts.entry(user.to_owned()).or_default() += 1;
            }
        }
    }
    Some(counts)
}

/// The clients of the sentinels on `ports` other than the sentinels' links to each other
/// (named `sentinel-…`) and this call's own: the instances' lookup and `+switch-master`
/// connections, and a fault's short questions. `None` if a sentinel did not answer.
pub async fn sentinel_clients(ports: &[u16]) -> Option<usize> {
    let mut count = 0;
    for port in ports {
        let list: String = on_node(*port, redis::cmd("CLIENT").arg("LIST")).await?;
        count += list
            .lines()
            .filter(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                !fields.iter().any(|f| f.starts_with("name=sentinel-"))
                    && !fields.contains(&"cmd=client|list")
            })
            .count();
    }
    Some(count)
}
