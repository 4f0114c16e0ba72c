//! A three-master Redis Cluster on free loopback ports, with or without a replica per master
//! (to kill a master and watch its replica take over).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, spawn, ServerOptions, TempDir, TlsFiles};

/// A Redis Cluster of three masters (and, from [`start_with_replicas`](Self::start_with_replicas),
/// a replica each) on free loopback ports, each node in a temporary directory of its own; every
/// node is killed, and its directory removed, on drop.
pub struct RedisCluster {
    /// The masters first, then the replicas (as `redis-cli --cluster create` assigns them).
    nodes: Vec<ClusterNode>,
    /// The ports of the nodes killed by [`kill_master_of`](Self::kill_master_of).
    killed: Vec<u16>,
    /// How the nodes are started, besides their ports and cluster settings.
    options: ServerOptions,
    /// `redis-cli` arguments that reach a node (TLS, credentials).
    cli: Vec<String>,
    /// What precedes `host:port` in a node's URL: scheme and credentials.
    url_prefix: String,
}

struct ClusterNode {
    child: Child,
    port: u16,
    /// The cluster bus port, kept for a restart.
    bus_port: u16,
    /// The node's files (its cluster configuration among them), removed when it is dropped.
    dir: TempDir,
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisCluster {
    /// Starts three `redis-server --cluster-enabled yes`, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with(
            ServerOptions::default(),
            Vec::new(),
            "redis://".to_owned(),
            0,
        )
    }

    /// Three masters whose `SPUBLISH` and `SSUBSCRIBE` are renamed away, as on a server without
    /// sharded pub/sub (before Redis 7.0).
    pub fn start_without_sharded_pubsub() -> Self {
        let options = ServerOptions {
            extra: [
                "--rename-command",
                "SPUBLISH",
                "",
                "--rename-command",
                "SSUBSCRIBE",
                "",
            ]
            .map(str::to_owned)
            .to_vec(),
            tls: None,
        };
        Self::start_with(options, Vec::new(), "redis://".to_owned(), 0)
    }

    /// Three masters with a replica each, set for a quick failover: a node that answers no
    /// ping for 1 s is failed, and a replica takes over however long ago it last heard its
    /// master (`cluster-replica-validity-factor 0`). Returns once every replica is in sync.
    pub fn start_with_replicas() -> Self {
        Self::start_with_replicas_and(&[])
    }

    /// Like [`start_with_replicas`](Self::start_with_replicas), with more configuration for
    /// every node, e.g. ACL users: `["--user", "app", "on", "nopass", "~*", "&*", "+@all"]`.
    pub fn start_with_replicas_and(extra: &[&str]) -> Self {
        let options = ServerOptions {
            extra: [
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
            ]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect(),
            tls: None,
        };
        let cluster = Self::start_with(options, Vec::new(), "redis://".to_owned(), 1);
        cluster.wait_replicas_in_sync(Duration::from_secs(30));
        cluster
    }

    /// Like [`start`](Self::start), but every node speaks TLS only (the cluster bus too), with
    /// the certificate of `tls`, and knows only the ACL user `user` (`default` is off).
    pub fn start_secure(tls: &TlsFiles, user: &str, password: &str) -> Self {
        super::require_tls();
        let acl = ["--user", "default", "off", "--user", user, "on"];
        let mut extra: Vec<String> = acl.iter().map(|s| (*s).to_owned()).collect();
        extra.extend([
            format!(">{password}"),
            "~*".into(),
            "&*".into(),
            "+@all".into(),
        ]);
        extra.extend(["--tls-cluster".into(), "yes".into()]);
        let cli = vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            tls.ca_cert.display().to_string(),
            "--user".to_owned(),
            user.to_owned(),
            "--pass".to_owned(),
            password.to_owned(),
            "--no-auth-warning".to_owned(),
        ];
        let options = ServerOptions {
            extra,
            tls: Some(tls.clone()),
        };
        Self::start_with(options, cli, format!("rediss://{user}:{password}@"), 0)
    }

    /// Like [`start`](Self::start), on the given three ports (found with
    /// [`free_port`](super::free_port) before, e.g. for a client made while no node runs).
    pub fn start_on(ports: [u16; 3]) -> Self {
        let options = ServerOptions::default();
        let nodes = ports
            .iter()
            .map(|port| ClusterNode::start_on(&options, *port))
            .collect();
        Self::create(nodes, options, Vec::new(), "redis://".to_owned(), 0)
    }

    fn start_with(
        options: ServerOptions,
        cli: Vec<String>,
        url_prefix: String,
        replicas: usize,
    ) -> Self {
        let nodes = (0..3 * (1 + replicas))
            .map(|_| ClusterNode::start(&options))
            .collect();
        Self::create(nodes, options, cli, url_prefix, replicas)
    }

    /// Joins started nodes into a cluster, and waits until it is ready.
    fn create(
        nodes: Vec<ClusterNode>,
        options: ServerOptions,
        cli: Vec<String>,
        url_prefix: String,
        replicas: usize,
    ) -> Self {
        let cluster = RedisCluster {
            nodes,
            killed: Vec::new(),
            options,
            cli,
            url_prefix,
        };
        let addresses = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port));
        let output = cluster.redis_cli(
            &["--cluster", "create"]
                .into_iter()
                .map(str::to_owned)
                .chain(addresses)
                .chain([
                    "--cluster-replicas".to_owned(),
                    replicas.to_string(),
                    "--cluster-yes".to_owned(),
                ])
                .collect::<Vec<_>>(),
        );
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Runs `redis-cli` with the arguments that reach the nodes, then `args`.
    fn redis_cli(&self, args: &[String]) -> std::process::Output {
        Command::new("redis-cli")
            .args(&self.cli)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-cli ({e}); install redis-tools, e.g. with ./scripts/test.sh"
                )
            })
    }

    /// Waits until every live node reports `cluster_state:ok`, knows every node, and has a bus
    /// link to and from each other node.
    ///
    /// The links both ways matter to classic pub/sub: Valkey (8 and later) sends a `PUBLISH`
    /// over the bus with a light header that does not name its sender, and a node drops one
    /// that comes on an inbound link it has not yet tied to a node (it counts it received all
    /// the same). `cluster_state:ok` comes before every inbound link is tied, so without this
    /// wait a fill on one node reaches no subscriber on another for the cluster's first
    /// second or so. `CLUSTER LINKS` lists an inbound link under its node (`from`) once tied.
    fn wait_ok(&self, limit: Duration) {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        self.wait_for_each(limit, &["CLUSTER", "INFO"], |info| {
            info.contains("cluster_state:ok") && info.contains(&known)
        });
        let others = self.nodes.len() - 1;
        self.wait_for_each(limit, &["CLUSTER", "LINKS"], |links| {
            let count = |direction: &str| links.lines().filter(|l| l.trim() == direction).count();
            count("to") >= others && count("from") >= others
        });
    }

    /// Waits until every replica's link to its master is up (the masters say so too).
    fn wait_replicas_in_sync(&self, limit: Duration) {
        self.wait_for_each(limit, &["INFO", "REPLICATION"], |info| {
            info.contains("role:master") || info.contains("master_link_status:up")
        });
    }

    /// Runs `command` on every live node until its output satisfies `ok`, for at most `limit`
    /// in all.
    fn wait_for_each(&self, limit: Duration, command: &[&str], ok: impl Fn(&str) -> bool) {
        let started = Instant::now();
        for node in self.live_nodes() {
            let args: Vec<String> = ["-p".to_owned(), node.port.to_string()]
                .into_iter()
                .chain(command.iter().map(|s| (*s).to_owned()))
                .collect();
            loop {
                let info = String::from_utf8_lossy(&self.redis_cli(&args).stdout).into_owned();
                if ok(&info) {
                    break;
                }
                assert!(
                    started.elapsed() < limit,
                    "the cluster is not ready after {limit:?}: node {} says {info:?}",
                    node.port
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn live_nodes(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes.iter().filter(|n| !self.killed.contains(&n.port))
    }

    /// The ports of the nodes not killed, masters and replicas.
    pub fn live_ports(&self) -> Vec<u16> {
        self.live_nodes().map(|n| n.port).collect()
    }

    /// Restarts every node killed by [`kill_master_of`](Self::kill_master_of) on its ports,
    /// with its cluster configuration file: a master whose replica took over rejoins as the
    /// replica of its successor. Returns whether, within `limit`, each one came back and
    /// reports its link to its new master up; the nodes count as live either way.
    pub fn restart_killed(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        let mut back = true;
        for port in std::mem::take(&mut self.killed) {
            let options = &self.options;
            let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) else {
                continue;
            };
            node.child = spawn(&mut node.command(options));
            let args = [
                "-p".to_owned(),
                port.to_string(),
                "INFO".into(),
                "REPLICATION".into(),
            ];
            loop {
                let info = String::from_utf8_lossy(&self.redis_cli(&args).stdout).into_owned();
                if info.contains("role:slave") && info.contains("master_link_status:up") {
                    break;
                }
                if started.elapsed() >= limit {
                    back = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        back
    }

    /// Kills (SIGKILL) the master that serves `key`'s slot, and returns its port.
    pub fn kill_master_of(&mut self, key: &str) -> u16 {
        let port = self.node_of(key);
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        let _ = node.child.kill();
        let _ = node.child.wait();
        self.killed.push(port);
        port
    }

    /// Freezes (`SIGSTOP`, with `true`) or thaws (`SIGCONT`) the node on `port`: frozen, it keeps
    /// its connections and answers nothing, while the other nodes go on.
    pub fn pause(&self, port: u16, frozen: bool) {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        let signal = if frozen {
            crate::Signal::STOP
        } else {
            crate::Signal::CONT
        };
        crate::signal(node.child.id(), signal);
    }

    /// Waits, for at most `limit`, until a live node serves `key`'s slot as its master and
    /// every live node reports `cluster_state:ok` (after [`kill_master_of`](Self::kill_master_of):
    /// the failed master's replica has been promoted). Returns the port of the new master.
    pub fn wait_promoted(&self, key: &str, limit: Duration) -> u16 {
        let started = Instant::now();
        loop {
            let all_ok = self.live_nodes().all(|node| {
                let args = [
                    "-p".to_owned(),
                    node.port.to_string(),
                    "CLUSTER".into(),
                    "INFO".into(),
                ];
                String::from_utf8_lossy(&self.redis_cli(&args).stdout).contains("cluster_state:ok")
            });
            if all_ok {
                let master = self.node_of(key);
                if !self.killed.contains(&master) {
                    return master;
                }
            }
            assert!(
                started.elapsed() < limit,
                "no replica took over the slot of {key:?} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Pub/sub messages the live nodes received from each other over the cluster bus so far
    /// (classic and sharded: `cluster_stats_messages_publish[shard]_received` of `CLUSTER
    /// INFO`); a node counts its messages once its bus has read them.
    pub fn bus_publish_messages(&self) -> u64 {
        self.live_nodes()
            .map(|node| {
                let info: String = self
                    .query(node, redis::cmd("CLUSTER").arg("INFO"))
                    .expect("CLUSTER INFO");
                info.lines()
                    .filter_map(|line| line.trim().split_once(':'))
                    .filter(|(name, _)| {
                        matches!(
                            *name,
                            "cluster_stats_messages_publish_received"
                                | "cluster_stats_messages_publishshard_received"
                        )
                    })
                    .map(|(_, count)| count.parse::<u64>().expect("a count"))
                    .sum::<u64>()
            })
            .sum()
    }

    /// The URLs of the nodes (seeds for a cluster client), with the credentials of a secure
    /// cluster.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .into_iter()
            .map(|port| format!("{}127.0.0.1:{port}/", self.url_prefix))
            .collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The port of the master that serves `key`'s slot, as a live node sees it (plain clusters
    /// only).
    pub fn node_of(&self, key: &str) -> u16 {
        let node = self.live_nodes().next().expect("a live node");
        let slot: i64 = self
            .query(node, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .expect("CLUSTER KEYSLOT");
        let slots: redis::Value = self
            .query(node, redis::cmd("CLUSTER").arg("SLOTS"))
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = slots else {
            panic!("unexpected CLUSTER SLOTS reply {slots:?}");
        };
        for range in ranges {
            let redis::Value::Array(range) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(first)),
                Some(redis::Value::Int(last)),
                Some(redis::Value::Array(master)),
            ) = (range.first(), range.get(1), range.get(2))
            else {
                continue;
            };
            if (*first..=*last).contains(&slot) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return u16::try_from(*port).expect("a port");
                }
            }
        }
        panic!("no node serves slot {slot} of {key:?}");
    }

    /// Empties every node's script cache, as a restart or a failover to a fresh node would
    /// (plain clusters only).
    pub fn flush_scripts(&self) {
        for node in self.live_nodes() {
            self.query::<()>(node, redis::cmd("SCRIPT").arg("FLUSH"))
                .expect("SCRIPT FLUSH");
        }
    }

    /// How many keys each node holds, in the order of [`ports`](Self::ports) (plain clusters
    /// without replicas only).
    pub fn keys_per_node(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|node| self.query(node, &redis::cmd("DBSIZE")).expect("DBSIZE"))
            .collect()
    }

    /// Reads from clients each master has processed so far (`total_reads_processed` of
    /// `INFO stats`), in the order of [`ports`](Self::ports); the `INFO` that asks counts one
    /// (plain clusters without replicas only).
    pub fn reads_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|node| {
                let info: String = self
                    .query(node, redis::cmd("INFO").arg("stats"))
                    .expect("INFO stats");
                info.lines()
                    .find_map(|line| line.trim().strip_prefix("total_reads_processed:"))
                    .map(|reads| reads.parse().expect("a count"))
                    .expect("total_reads_processed in INFO stats")
            })
            .collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self.live_nodes().next().expect("a live node");
        self.query(node, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .expect("CLUSTER KEYSLOT")
    }

    /// Gives an empty `slot` to the master on `port` (`CLUSTER SETSLOT … NODE` on every node,
    /// the new owner first), as a resharding would; clients learn it from `MOVED` replies
    /// (plain clusters only).
    pub fn move_empty_slot(&self, slot: u16, port: u16) {
        let owner = self
            .live_nodes()
            .find(|n| n.port == port)
            .expect("a live node on that port");
        let id: String = self
            .query(owner, redis::cmd("CLUSTER").arg("MYID"))
            .expect("CLUSTER MYID");
        let others = self.live_nodes().filter(|n| n.port != port);
        for node in std::iter::once(owner).chain(others) {
            self.query::<()>(
                node,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&id),
            )
            .expect("CLUSTER SETSLOT NODE");
        }
        self.wait_ok(Duration::from_secs(30));
    }

    fn query<T: redis::FromRedisValue>(
        &self,
        node: &ClusterNode,
        command: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        assert!(
            self.options.tls.is_none(),
            "direct queries are for plain clusters"
        );
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", node.port))?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
        command.query(&mut connection)
    }
}

impl ClusterNode {
    fn start(options: &ServerOptions) -> Self {
        for _ in 0..20 {
            if let Some(node) = Self::try_start(options, free_port()) {
                return node;
            }
            // Lost a port to another test: try others.
        }
        panic!("a cluster node did not start on any of 20 port pairs");
    }

    /// A node on `port` (its bus port free), trying a few bus ports.
    fn start_on(options: &ServerOptions, port: u16) -> Self {
        for _ in 0..20 {
            if let Some(node) = Self::try_start(options, port) {
                return node;
            }
        }
        panic!("a cluster node did not start on port {port}");
    }

    /// The command that starts this node again, on its ports and with its files.
    fn command(&self, options: &ServerOptions) -> Command {
        Self::command_in(options, self.port, self.bus_port, &self.dir)
    }

    fn command_in(options: &ServerOptions, port: u16, bus_port: u16, dir: &TempDir) -> Command {
        let mut command = options.command(port);
        command
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &bus_port.to_string()])
            .arg("--cluster-config-file")
            .arg(dir.path().join(format!("nodes-{port}.conf")))
            .arg("--dir")
            .arg(dir.path());
        command
    }

    /// A node on `port` and a free bus port, or none if it did not come up (a port lost to
    /// another test: the drop kills it).
    fn try_start(options: &ServerOptions, port: u16) -> Option<Self> {
        let bus_port = free_port();
        if port == bus_port {
            return None;
        }
        let dir = TempDir::new("cluster");
        let child = spawn(&mut Self::command_in(options, port, bus_port, &dir));
        let mut node = ClusterNode {
            child,
            port,
            bus_port,
            dir,
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = node.child.try_wait() {
                break;
            }
            if options.is_up(port) {
                return Some(node);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}
