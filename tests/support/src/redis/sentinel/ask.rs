//! Questions to a topology's processes over plain connections of their own: a node's role and
//! replication, what a sentinel names, and the clients connected to either.

use std::time::{Duration, Instant};

use super::SERVICE;

/// The lines of `CLIENT LIST` (with `args`, e.g. `TYPE pubsub`) of the server or sentinel on
/// `port`, but the one that asks; none if it does not answer.
pub async fn client_list(port: u16, args: &[&str]) -> Vec<String> {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return Vec::new();
    };
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
        return Vec::new();
    };
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg(args)
        .query_async(&mut connection)
        .await
        .unwrap_or_default();
    list.lines()
        .filter(|line| !line.contains(" cmd=client|list "))
        .map(str::to_owned)
        .collect()
}

/// The app's connections to the server or sentinel on `port` ([`client_list`] with `args`):
/// unnamed (a sentinel names its links), not a replica's nor a replica's link to its primary.
pub async fn app_clients(port: u16, args: &[&str]) -> usize {
    let lines = client_list(port, args).await;
    lines
        .iter()
        .filter(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
            };
            field("name").is_empty() && !field("flags").contains(['S', 'M'])
        })
        .count()
}

/// Waits, for at most `limit`, until the node on `port` is a replica whose link is up.
pub(super) fn wait_replica(port: u16, limit: Duration) -> bool {
    poll(limit, || {
        let info: String =
            query_node(port, redis::cmd("INFO").arg("replication")).unwrap_or_default();
        info.contains("role:slave") && info.contains("master_link_status:up")
    })
}

/// Runs `done` every 20 ms until it holds, for at most `limit`; whether it held.
pub(super) fn poll(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if done() {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `SENTINEL <subcommand> mymaster`.
pub(super) fn sentinel_cmd(subcommand: &str) -> redis::Cmd {
    let mut command = redis::cmd("SENTINEL");
    command.arg(subcommand).arg(SERVICE);
    command
}

/// The value of `name` in a sentinel's description of a node (a flat list of names and values).
pub(super) fn field<'a>(pairs: &'a [String], name: &str) -> Option<&'a str> {
    pairs
        .chunks(2)
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair.get(1).map(String::as_str))
}

/// The port of the primary the sentinel on `sentinel` names, if it answers.
pub(super) fn named_primary(sentinel: u16) -> Option<u16> {
    let address: Vec<String> =
        query_node(sentinel, &sentinel_cmd("GET-MASTER-ADDR-BY-NAME")).ok()?;
    address.get(1)?.parse().ok()
}

/// The port of the primary the sentinel on `sentinel` names, once it is settled on it: no
/// failover in progress, the node not down, and its last `PING` answered (`last-ping-sent` 0).
/// A sentinel that has just switched talks to the new primary over a new link, and one whose
/// first answer there took over 1 s took it for down and failed over again (once in 25 runs of
/// the test below, when the first switch was taken as done).
pub(super) fn settled_primary(sentinel: u16) -> Option<u16> {
    let master: Vec<String> = query_node(sentinel, &sentinel_cmd("MASTER")).ok()?;
    let settled =
        field(&master, "flags") == Some("master") && field(&master, "last-ping-sent") == Some("0");
    settled.then(|| field(&master, "port")?.parse().ok())?
}

/// The first field of the node's `ROLE` (`master` or `slave`), if it answers.
pub fn role(port: u16) -> Option<String> {
    let role: Vec<redis::Value> = query_node(port, &redis::cmd("ROLE")).ok()?;
    redis::from_redis_value(role.first()?.clone()).ok()
}

/// `command` on the node (or sentinel) on `port`, over a connection of its own, each step
/// bounded by 2 s.
pub fn query_node<T: redis::FromRedisValue>(
    port: u16,
    command: &redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let limit = Duration::from_secs(2);
    let mut connection = client.get_connection_with_timeout(limit)?;
    connection.set_read_timeout(Some(limit))?;
    connection.set_write_timeout(Some(limit))?;
    command.query(&mut connection)
}
