//! The Redis a scale cell runs on (`benches/scale.rs`, included with `#[path]`): one
//! `redis-server`, or a Redis Cluster of three masters whose stores publish with sharded or
//! classic pub/sub; how a worker's store reaches it; and what it counts, summed over its
//! masters: commands (`INFO commandstats`), pub/sub messages published and delivered, and the
//! messages that crossed the cluster bus.
//!
//! Delivered messages are counted where they are sent, since Redis keeps no count of them: a
//! classic `PUBLISH`, on any node of a cluster, reaches the classic channel's subscribers of
//! every node (`PUBSUB NUMSUB` summed over the nodes); an `SPUBLISH` reaches the subscribers of
//! its shard channel on its own master only (`PUBSUB SHARDNUMSUB` there). A fill's script
//! publishes on the first of the namespace's shard channels that its master serves, and the
//! channels' tags are ordered by slot, so that is the one with the lowest slot among the
//! master's shard channels (`PUBSUB SHARDCHANNELS`).

use std::collections::BTreeMap;

use support::{RedisCluster, RedisServer};
use tower_stampede::store::RedisStore;

/// Commands the coordinator itself sends between two counts, left out of the costs; the
/// workers' own `CLUSTER` calls (a cluster client's topology reads) stay in.
const OWN_COMMANDS: &[&str] = &["info", "cluster|info", "client|setinfo"];

/// Where the cells run.
pub enum Deployment {
    Server(RedisServer),
    /// Three masters (no replicas); `sharded`: the stores' `sharded_notifications`.
    Cluster {
        cluster: RedisCluster,
        sharded: bool,
    },
}

/// What the masters counted at one moment, by node.
pub struct Counts {
    nodes: Vec<NodeCounts>,
}

struct NodeCounts {
    /// `calls` and `rejected_calls` of each command.
    calls: BTreeMap<String, (u64, u64)>,
    /// Pub/sub messages this node sent over the cluster bus (`cluster_stats_messages_publish_sent`
    /// and `..._publishshard_sent`): a count made as each is queued, so it is complete as soon
    /// as the publish returned.
    bus_sent: u64,
}

/// What a stampede cost, from two [`Counts`].
pub struct Cost {
    /// Calls of each command, the coordinator's own left out.
    pub calls: BTreeMap<String, u64>,
    /// Calls refused inside scripts (an `SPUBLISH` on a shard channel another master serves).
    pub refused: BTreeMap<String, u64>,
    /// `PUBLISH` and `SPUBLISH` calls.
    pub publishes: u64,
    /// Each publish times its channel's subscribers.
    pub delivered: u64,
    /// What each master delivered to its own subscribers, in the order of the masters.
    pub delivered_by_master: Vec<u64>,
    /// The calls each master counted (the coordinator's own left out), in the same order.
    pub commands_by_master: Vec<u64>,
    /// Pub/sub messages sent over the cluster bus (none on one server).
    pub bus: Option<u64>,
}

impl Deployment {
    /// One server, or with `--cluster` a cluster (`--classic`: its stores publish with classic
    /// pub/sub).
    pub fn from_args(args: &[String]) -> Self {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        if !has("--cluster") {
            assert!(!has("--classic"), "--classic goes with --cluster");
            return Deployment::Server(RedisServer::start());
        }
        if cfg!(not(feature = "cluster")) {
            panic!("--cluster needs the bench built with --features cluster");
        }
        Deployment::Cluster {
            cluster: RedisCluster::start(),
            sharded: !has("--classic"),
        }
    }

    /// What the table's title says of it.
    pub fn describe(&self) -> &'static str {
        match self {
            Deployment::Server(_) => "one redis-server",
            Deployment::Cluster { sharded: true, .. } => {
                "a Redis Cluster of 3 masters, sharded pub/sub (SPUBLISH)"
            }
            Deployment::Cluster { sharded: false, .. } => {
                "a Redis Cluster of 3 masters, classic pub/sub (sharded_notifications(false))"
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Deployment::Cluster { .. })
    }

    /// What a worker is given to reach it, for [`connect`](Self::connect).
    pub fn address(&self) -> String {
        match self {
            Deployment::Server(server) => server.url(),
            Deployment::Cluster { cluster, sharded } => {
                let mode = if *sharded { "sharded" } else { "classic" };
                format!("cluster-{mode}:{}", cluster.urls().join(","))
            }
        }
    }

    /// A store over the Redis at `address` (from [`address`](Self::address)).
    pub async fn connect(address: &str) -> RedisStore {
        let cluster = address
            .strip_prefix("cluster-sharded:")
            .map(|urls| (urls, true))
            .or_else(|| {
                address
                    .strip_prefix("cluster-classic:")
                    .map(|urls| (urls, false))
            });
        let Some((urls, sharded)) = cluster else {
            return RedisStore::connect(address).await.expect("a store");
        };
        #[cfg(feature = "cluster")]
        return RedisStore::cluster_builder(urls.split(','))
            .sharded_notifications(sharded)
            .connect()
            .await
            .expect("a cluster store");
        #[cfg(not(feature = "cluster"))]
        panic!("{urls} (sharded {sharded}): a cluster needs --features cluster");
    }

    /// A connection to the node that holds `key` (the only one, or its master).
    pub fn connection_for(&self, key: &str) -> redis::Connection {
        let port = match self {
            Deployment::Server(server) => server.port(),
            Deployment::Cluster { cluster, .. } => cluster.node_of(key),
        };
        connection(port)
    }

    /// The ports of the masters.
    fn ports(&self) -> Vec<u16> {
        match self {
            Deployment::Server(server) => vec![server.port()],
            Deployment::Cluster { cluster, .. } => cluster.ports(),
        }
    }

    /// What every master counted so far.
    pub fn counts(&self) -> Counts {
        let nodes = self
            .ports()
            .into_iter()
            .map(|port| {
                let mut redis = connection(port);
                NodeCounts {
                    calls: command_calls(&mut redis),
                    bus_sent: if self.is_cluster() {
                        bus_sent(&mut redis)
                    } else {
                        0
                    },
                }
            })
            .collect();
        Counts { nodes }
    }

    /// The cost of what happened between `before` and `after`, with the subscribers of
    /// `namespace`'s channels as they are now (the workers still subscribed).
    pub fn cost(&self, namespace: &str, before: &Counts, after: &Counts) -> Cost {
        let nodes: Vec<NodeCost> = before
            .nodes
            .iter()
            .zip(&after.nodes)
            .map(|(earlier, later)| node_cost(earlier, later))
            .collect();
        // A classic publish on any node reaches every node's subscribers.
        let classic: u64 = nodes.iter().map(|node| node.calls("publish")).sum();
        let classic_channel = format!("{namespace}:filled");
        let mut cost = Cost {
            calls: BTreeMap::new(),
            refused: BTreeMap::new(),
            publishes: 0,
            delivered: 0,
            delivered_by_master: Vec::new(),
            commands_by_master: Vec::new(),
            bus: self.is_cluster().then_some(0),
        };
        for (node, port) in nodes.into_iter().zip(self.ports()) {
            let mut redis = connection(port);
            let spublish = node.calls("spublish");
            let mut delivered = classic * subscribers(&mut redis, "NUMSUB", &classic_channel);
            if spublish > 0 {
                delivered += spublish * first_shard_subscribers(&mut redis, namespace);
            }
            cost.publishes += node.calls("publish") + spublish;
            cost.delivered += delivered;
            cost.delivered_by_master.push(delivered);
            if let Some(bus) = &mut cost.bus {
                *bus += node.bus_sent;
            }
            let mut commands = 0;
            for (command, (calls, refused)) in node.calls {
                if OWN_COMMANDS.contains(&command.as_str()) {
                    continue;
                }
                commands += calls;
                if calls > 0 {
                    *cost.calls.entry(command.clone()).or_default() += calls;
                }
                if refused > 0 {
                    *cost.refused.entry(command).or_default() += refused;
                }
            }
            cost.commands_by_master.push(commands);
        }
        cost
    }
}

impl Cost {
    /// The calls by command, the calls refused inside scripts, and on a cluster the calls and
    /// the deliveries of each master.
    pub fn breakdown(&self) -> String {
        let listed = |counts: &BTreeMap<String, u64>| {
            counts
                .iter()
                .map(|(command, n)| format!("{command} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut breakdown = listed(&self.calls);
        if !self.refused.is_empty() {
            breakdown += &format!("; refused in scripts: {}", listed(&self.refused));
        }
        if self.bus.is_some() {
            breakdown += &format!(
                "; by master: commands {:?}, delivered {:?}",
                self.commands_by_master, self.delivered_by_master
            );
        }
        breakdown
    }
}

/// What one node did between two counts.
struct NodeCost {
    /// Calls and refused calls of each command.
    calls: BTreeMap<String, (u64, u64)>,
    bus_sent: u64,
}

impl NodeCost {
    fn calls(&self, command: &str) -> u64 {
        self.calls.get(command).map_or(0, |(calls, _)| *calls)
    }
}

fn node_cost(before: &NodeCounts, after: &NodeCounts) -> NodeCost {
    let calls = after
        .calls
        .iter()
        .map(|(command, (calls, refused))| {
            let (calls0, refused0) = before.calls.get(command).copied().unwrap_or((0, 0));
            (command.clone(), (calls - calls0, refused - refused0))
        })
        .collect();
    NodeCost {
        calls,
        bus_sent: after.bus_sent - before.bus_sent,
    }
}

fn connection(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|client| client.get_connection())
        .expect("a connection to a node")
}

/// `cmdstat_*` calls and rejected calls by command.
fn command_calls(redis: &mut redis::Connection) -> BTreeMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(redis)
        .expect("INFO");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|rest| {
            let (command, stats) = rest.split_once(':')?;
            let field = |name: &str| {
                stats
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|n| n.parse().ok())
            };
            Some((
                command.to_owned(),
                (field("calls")?, field("rejected_calls").unwrap_or(0)),
            ))
        })
        .collect()
}

/// Pub/sub messages the node sent over the cluster bus so far, classic and sharded.
fn bus_sent(redis: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(redis)
        .expect("CLUSTER INFO");
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| {
            matches!(
                *name,
                "cluster_stats_messages_publish_sent" | "cluster_stats_messages_publishshard_sent"
            )
        })
        .map(|(_, count)| count.parse::<u64>().expect("a count"))
        .sum()
}

/// `PUBSUB NUMSUB` or `SHARDNUMSUB` of one channel on this node.
fn subscribers(redis: &mut redis::Connection, which: &str, channel: &str) -> u64 {
    redis::cmd("PUBSUB")
        .arg(which)
        .arg(channel)
        .query::<(String, u64)>(redis)
        .map_or(0, |(_, n)| n)
}

/// The subscribers of the shard channel this master's scripts publish on: of the namespace's
/// shard channels subscribed here, the one of the lowest slot.
fn first_shard_subscribers(redis: &mut redis::Connection, namespace: &str) -> u64 {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{namespace}:filled{{*"))
        .query(redis)
        .expect("PUBSUB SHARDCHANNELS");
    let first = channels.into_iter().min_by_key(|channel| {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(channel)
            .query::<u16>(redis)
            .expect("CLUSTER KEYSLOT")
    });
    first.map_or(0, |channel| subscribers(redis, "SHARDNUMSUB", &channel))
}
