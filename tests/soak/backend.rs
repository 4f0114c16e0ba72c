//! What the soak's instances share: one redis-server, or (`--cluster`, feature `cluster`) a
//! Redis Cluster of three masters with a replica each; and the commands the faults and the
//! bounds send to its nodes, each on a connection of its own (the injector's own connection
//! would be killed with the others).
//!
//! Every instance connects as an ACL user of its own (`soak<i>`), so that `CLIENT LIST` tells
//! its connections from the others'.

use std::collections::BTreeMap;
use std::time::Duration;

#[cfg(feature = "cluster")]
use support::RedisCluster;
use support::RedisServer;

pub enum Backend {
    Server(RedisServer),
    #[cfg(feature = "cluster")]
    Cluster(RedisCluster),
}

/// The ACL user instance `i` connects as.
pub fn user(i: usize) -> String {
    format!("soak{i}")
}

impl Backend {
    /// One server, or with `cluster` a Cluster with replicas; either knows the users of
    /// `instances` instances (and `default`, for the faults and `redis-cli`).
    pub fn start(cluster: bool, instances: usize) -> Self {
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
        if cluster {
            #[cfg(feature = "cluster")]
            return Backend::Cluster(RedisCluster::start_with_replicas_and(&users));
            #[cfg(not(feature = "cluster"))]
            panic!("--cluster needs the `cluster` feature (./scripts/soak.sh turns it on)");
        }
        Backend::Server(RedisServer::start_with(&users))
    }

    pub fn is_cluster(&self) -> bool {
        !matches!(self, Backend::Server(_))
    }

    /// The URLs instance `i` connects to: the server's, or the cluster's seeds.
    pub fn urls(&self, i: usize) -> Vec<String> {
        let ports = match self {
            Backend::Server(server) => vec![server.port()],
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.ports(),
        };
        ports
            .into_iter()
            .map(|port| format!("redis://{}:x@127.0.0.1:{port}/", user(i)))
            .collect()
    }

    /// The ports of the nodes that run now (the one server's, even while it is down).
    pub fn live_ports(&self) -> Vec<u16> {
        match self {
            Backend::Server(server) => vec![server.port()],
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.live_ports(),
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
