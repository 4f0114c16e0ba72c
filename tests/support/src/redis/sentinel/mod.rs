//! A primary with two replicas under three Redis Sentinels, on free loopback ports, set for a
//! quick failover (to kill the primary, or switch it over, and watch a replica take over).
//!
//! Plain `redis-server` processes: the sentinels are `redis-server <conf> --sentinel`, and are
//! asked with plain commands (`SENTINEL …`), so no `redis-sentinel` binary and no redis-rs
//! `sentinel` feature are needed.

//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`RedisSentinel`]: start, ask, kill, restart, fail over |
//! | `nodes.rs` | the processes: a data node or a sentinel on free ports, with TLS if asked |
//! | `ask.rs` | questions to one process: roles, the named primary, its clients |

mod ask;
mod nodes;

use std::time::{Duration, Instant};

use super::{spawn, ServerOptions, TlsFiles};
use ask::{field, named_primary, poll, role, sentinel_cmd, settled_primary, wait_replica};
use nodes::{data_command, start_data_node, start_sentinel, wait_up, Node};

pub use ask::{app_clients, client_list, query_node, role as node_role};

/// The name the sentinels monitor the primary under.
pub(super) const SERVICE: &str = "mymaster";

/// How long a start may take in all (replicas in sync, sentinels aware of each other): a bound
/// for a busy machine; about 2 s on an idle one.
const START_LIMIT: Duration = Duration::from_secs(30);

/// One primary and two replicas (`redis-server`, each in a temporary directory of its own) under
/// three sentinels that agree on the primary with a quorum of 2, mark a node down after 1 s of
/// silence (`down-after-milliseconds 1000`) and give a failover 3 s (`failover-timeout 3000`).
/// Every process is killed, and its directory removed, on drop.
pub struct RedisSentinel {
    /// The primary first, then the replicas, as started; a failover changes which is which.
    data: Vec<Node>,
    sentinels: Vec<Node>,
    /// The ports of the data nodes killed by [`kill_primary`](Self::kill_primary) and not yet
    /// restarted.
    killed: Vec<u16>,
    /// How the data nodes are started, besides their port, directory and `--replicaof`.
    options: ServerOptions,
    /// With TLS, every node and sentinel also has a TLS port ([`Node::announced`]).
    tls: Option<TlsFiles>,
}

impl RedisSentinel {
    /// Starts the primary, its two replicas (and waits until both are in sync), then the three
    /// sentinels, and waits until each sentinel knows both replicas and the two other sentinels
    /// (a failover needs their votes).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with more configuration for every data node, e.g. ACL users:
    /// `["--user", "app", "on", ">s3cret", "~*", "&*", "+@all"]` (the sentinels and the
    /// replication use `default`, which must stay on).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_sentinels(extra, "")
    }

    /// Like [`start_with`](Self::start_with), with `sentinel_conf` added to each sentinel's
    /// configuration, e.g. an ACL user of its own (`user app on >s3cret ~* &* +@all`; the
    /// sentinels and this starter use `default`, which must stay open).
    pub fn start_with_sentinels(extra: &[&str], sentinel_conf: &str) -> Self {
        Self::start_topology(extra, sentinel_conf, None)
    }

    /// Like [`start`](Self::start), with every data node and sentinel also on a TLS port with
    /// the certificate of `tls`, replicating and watched over TLS: the sentinels name the
    /// primary by its TLS port, and [`sentinel_urls`](Self::sentinel_urls) are `rediss://`.
    /// Plain ports stay open for this starter, which asks its questions there.
    pub fn start_tls(tls: &TlsFiles) -> Self {
        super::require_tls();
        Self::start_topology(&[], "", Some(tls.clone()))
    }

    fn start_topology(extra: &[&str], sentinel_conf: &str, tls: Option<TlsFiles>) -> Self {
        // Without the delay, every (re)sync waits 5 s for more replicas to join it.
        let options = ServerOptions {
            extra: ["--repl-diskless-sync-delay", "0"]
                .iter()
                .chain(extra)
                .map(|s| (*s).to_owned())
                .collect(),
            tls: None,
        };
        let started = Instant::now();
        let primary = start_data_node(&options, tls.as_ref(), None);
        let primary_at = primary.announced;
        let mut data = vec![primary];
        for _ in 0..2 {
            data.push(start_data_node(&options, tls.as_ref(), Some(primary_at)));
        }
        for replica in &data[1..] {
            let left = START_LIMIT.saturating_sub(started.elapsed());
            assert!(wait_replica(replica.port, left), "replica {}", replica.port);
        }
        // Started only now: a sentinel learns the replicas from the primary's `INFO`, which it
        // reads every 10 s once it has read it; a replica not yet linked could wait that long.
        let sentinels = (0..3)
            .map(|_| start_sentinel(primary_at, sentinel_conf, tls.as_ref()))
            .collect();
        let topology = RedisSentinel {
            data,
            sentinels,
            killed: Vec::new(),
            options,
            tls,
        };
        topology.wait_sentinels_agree(START_LIMIT.saturating_sub(started.elapsed()));
        topology
    }

    /// Waits until every sentinel's `SENTINEL MASTER` reports 2 replicas and 2 other sentinels.
    fn wait_sentinels_agree(&self, limit: Duration) {
        let agree = poll(limit, || {
            self.sentinels.iter().all(|sentinel| {
                let master: Vec<String> =
                    query_node(sentinel.port, &sentinel_cmd("MASTER")).unwrap_or_default();
                field(&master, "num-slaves") == Some("2")
                    && field(&master, "num-other-sentinels") == Some("2")
            })
        });
        assert!(agree, "the sentinels do not agree after {limit:?}");
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The sentinels' URLs, `redis://127.0.0.1:<port>`, or with TLS
    /// `rediss://127.0.0.1:<TLS port>`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.sentinels
            .iter()
            .map(|s| format!("{scheme}://127.0.0.1:{}", s.announced))
            .collect()
    }

    /// The TLS files the topology was started with ([`start_tls`](Self::start_tls)).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The plain port of the data node the sentinels know by `announced`.
    fn plain(&self, announced: u16) -> Option<u16> {
        let node = self.data.iter().find(|n| n.announced == announced)?;
        Some(node.port)
    }

    /// The name the sentinels know the primary by.
    pub fn service(&self) -> &str {
        SERVICE
    }

    /// The (plain) port of the primary, as the first sentinel that answers names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`): during a failover, maybe a dead one.
    pub fn primary_port(&self) -> u16 {
        self.plain(self.named_primary())
            .expect("the named primary is a node of this topology")
    }

    /// The primary as the first sentinel that answers names it: its announced port.
    fn named_primary(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|sentinel| named_primary(sentinel.port))
            .expect("a sentinel that names the primary")
    }

    /// The ports of every data node, killed or not: the first primary, then its replicas.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|n| n.port).collect()
    }

    /// The ports of the data nodes not killed.
    pub fn live_data_ports(&self) -> Vec<u16> {
        self.data_ports()
            .into_iter()
            .filter(|port| !self.killed.contains(port))
            .collect()
    }

    /// Kills (SIGKILL) the primary the sentinels name, and returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        let node = self
            .data
            .iter_mut()
            .find(|n| n.port == port)
            .expect("the primary is a node of this topology");
        let _ = node.child.kill();
        let _ = node.child.wait();
        self.killed.push(port);
        port
    }

    /// After [`kill_primary`](Self::kill_primary): [`wait_moved_from`](Self::wait_moved_from)
    /// the killed node.
    pub fn wait_promoted(&self, limit: Duration) -> Option<u16> {
        let killed = *self.killed.last().expect("a primary killed before");
        self.wait_moved_from(killed, limit)
    }

    /// Waits, for at most `limit`, until every sentinel names the same primary other than
    /// `old`, settled on it ([`settled_primary`]), and that node's `ROLE` says master (after a
    /// kill or a [`failover`](Self::failover)). Returns its port, or `None` if that did not
    /// happen.
    pub fn wait_moved_from(&self, old: u16, limit: Duration) -> Option<u16> {
        let mut moved = None;
        poll(limit, || {
            let mut named = self
                .sentinels
                .iter()
                .map(|s| settled_primary(s.port).and_then(|port| self.plain(port)));
            let first = named.next().flatten();
            moved = first.filter(|&port| {
                port != old && named.all(|n| n == first) && role(port).as_deref() == Some("master")
            });
            moved.is_some()
        });
        moved
    }

    /// Starts every node killed by [`kill_primary`](Self::kill_primary) again on its port and
    /// with its (empty) directory: a plain server, which answers as an empty primary until the
    /// sentinels turn it into a replica (about 11 s), or with `as_replica` one started with
    /// `--replicaof` the current primary (in sync within a second). Returns whether, within
    /// `limit`, each one reports `role:slave` and its link to its primary up; the nodes count
    /// as live either way.
    pub fn restart_killed(&mut self, limit: Duration, as_replica: bool) -> bool {
        let started = Instant::now();
        let primary = as_replica.then(|| self.named_primary());
        let mut back = true;
        for port in std::mem::take(&mut self.killed) {
            let Some(node) = self.data.iter_mut().find(|n| n.port == port) else {
                continue;
            };
            // The port may not be free again yet: start again until the node answers.
            let (options, tls) = (
                &self.options,
                self.tls.as_ref().map(|t| (t, node.announced)),
            );
            let up = poll(limit, || {
                let _ = node.child.kill();
                let _ = node.child.wait();
                let mut command = data_command(options, port, tls, &node.dir, primary);
                node.child = spawn(&mut command);
                wait_up(&mut node.child, port, |port| options.is_up(port))
            });
            assert!(up, "the data node on port {port} did not restart");
            back = back
                && wait_replica(port, limit.saturating_sub(started.elapsed()))
                && self.wait_sentinels_see_replica(port, limit.saturating_sub(started.elapsed()));
        }
        back
    }

    /// Waits, for at most `limit`, until every sentinel lists the node on `port` as a replica of
    /// the primary it names, linked and not down, with the role the node itself last reported.
    /// Until then a sentinel may still take a restarted node for a misconfigured primary and
    /// turn it into a replica again: a failover asked meanwhile could promote it, and be undone
    /// (seen once in four runs, the switch then taking 28 s).
    fn wait_sentinels_see_replica(&self, port: u16, limit: Duration) -> bool {
        let Some(announced) = self
            .data
            .iter()
            .find(|n| n.port == port)
            .map(|n| n.announced)
        else {
            return false;
        };
        poll(limit, || {
            self.sentinels.iter().all(|sentinel| {
                let primary = named_primary(sentinel.port);
                let replicas: Vec<Vec<String>> =
                    query_node(sentinel.port, &sentinel_cmd("REPLICAS")).unwrap_or_default();
                replicas.iter().any(|replica| {
                    let field = |name| field(replica, name);
                    field("port") == Some(&announced.to_string())
                        && field("flags") == Some("slave")
                        && field("role-reported") == Some("slave")
                        && field("master-link-status") == Some("ok")
                        && field("master-port").and_then(|p| p.parse().ok()) == primary
                })
            })
        })
    }

    /// Asks a sentinel for a planned failover (`SENTINEL FAILOVER`, no node killed): a replica
    /// is promoted, and the old primary turned into its replica. Returns the old primary's port
    /// (for [`wait_moved_from`](Self::wait_moved_from)).
    pub fn failover(&self) -> u16 {
        let old = self.primary_port();
        // A replica the sentinel has not judged good yet (`NOGOODSLAVE`): ask again.
        let asked = poll(START_LIMIT, || {
            query_node::<()>(self.sentinels[0].port, &sentinel_cmd("FAILOVER")).is_ok()
        });
        assert!(asked, "SENTINEL FAILOVER refused for {START_LIMIT:?}");
        old
    }

    /// Waits, for at most `limit`, until the data node on `port` reports `role:slave` and its
    /// link to its primary up (`INFO replication`).
    pub fn wait_replica(&self, port: u16, limit: Duration) -> bool {
        wait_replica(port, limit)
    }

    /// A planned failover ([`failover`](Self::failover)), then the wait for the sentinels to
    /// name another primary ([`wait_moved_from`](Self::wait_moved_from)): the old primary's
    /// port, and the new one's if that happened within `limit`.
    pub fn switch_over(&self, limit: Duration) -> (u16, Option<u16>) {
        let old = self.failover();
        (old, self.wait_moved_from(old, limit))
    }

    /// The role (`master`, `slave`) the node on `port` says it has, if it answers.
    pub fn role_of(&self, port: u16) -> Option<String> {
        role(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The starter itself, on real processes (so real time): the primary killed, a replica is
    /// promoted; the old primary restarted plain comes back, after a while as an empty
    /// primary, as a replica of the promoted one. Prints how long each step took.
    #[test]
    fn a_killed_primary_is_replaced_and_comes_back_as_a_replica() {
        let limit = Duration::from_secs(30);
        let started = Instant::now();
        let mut topology = RedisSentinel::start();
        eprintln!("started in {:?}", started.elapsed());
        assert_eq!(topology.sentinel_urls().len(), 3);
        assert_eq!(topology.primary_port(), topology.data_ports()[0]);

        let killed_at = Instant::now();
        let killed = topology.kill_primary();
        assert_eq!(topology.live_data_ports(), topology.data_ports()[1..]);
        let promoted = topology.wait_promoted(limit).expect("a replica promoted");
        let elapsed = killed_at.elapsed();
        eprintln!("port {promoted} promoted {elapsed:?} after the kill");
        assert!(topology.live_data_ports().contains(&promoted));

        // Meanwhile, how long the restarted node answers as a primary (the window a client
        // that reconnects to its old address, not through the sentinels, would write into).
        let restarted_at = Instant::now();
        let as_primary = std::sync::Mutex::new(None);
        let back = std::thread::scope(|scope| {
            let restarting = scope.spawn(|| topology.restart_killed(limit, false));
            while !restarting.is_finished() {
                if role(killed).as_deref() == Some("master") {
                    *as_primary.lock().unwrap() = Some(restarted_at.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            restarting.join().unwrap()
        });
        let (elapsed, as_primary) = (restarted_at.elapsed(), as_primary.into_inner().unwrap());
        eprintln!("restarted plain: a replica {elapsed:?} later, a primary until {as_primary:?}");
        assert!(back && as_primary.is_some(), "a primary, then a replica");
        assert_eq!(topology.live_data_ports().len(), 3);

        let switched_at = Instant::now();
        let old = topology.failover();
        assert_eq!(old, promoted);
        let next = topology.wait_moved_from(old, limit).expect("a switchover");
        let elapsed = switched_at.elapsed();
        eprintln!("port {next} primary {elapsed:?} after SENTINEL FAILOVER");
    }
}
