//! The resources the instances hold, sampled every second through the faults, each under a
//! stated bound: each instance's connections to Redis (`CLIENT LIST` by its ACL user, over
//! every live data node), the instances' connections to the sentinels (in all: the sentinels
//! know no per-instance user), the tasks on each runtime, and the process's resident memory
//! (the instances share one process). Once the callers are done, each instance's tasks come
//! back to what an idle instance holds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{connections_per_user, sentinel_clients, user, Backend};
use crate::workload::Workload;

/// Connections of one instance per live data node: its data connection and its subscriber;
/// twice that while a restarted instance's old calls finish on the old ones; and two more for
/// a reconnection whose old socket the server has not closed yet. Over Sentinel, every one is
/// on the primary (or, for a moment after a switch, on the old one), and each re-dial opens
/// one more, short-lived, to check that the node the sentinels name says `ROLE` master.
pub const CONNECTIONS_PER_NODE: usize = 6;
/// Connections of one instance to the sentinels, in all: the store's lookups keep one to each
/// of the 3 sentinels, and it listens to one for `+switch-master`; twice that while a
/// restarted instance's old store lives on.
pub const SENTINEL_CONNECTIONS: usize = 8;
/// Connections of one idle instance to the sentinels, in all: its lookups' (one to each of
/// the 3 sentinels) and its listener's; nothing of a store it no longer uses.
pub const SENTINEL_CONNECTIONS_IDLE: usize = 4;
/// Connections to the sentinels that are no instance's: the faults' own questions.
pub const SENTINEL_CONNECTIONS_OTHERS: usize = 2;
/// Tasks on one instance's runtime: its 4 callers, their flights and loads, its connections'
/// tasks, with room for the releases and refreshes of an outage.
pub const TASKS: usize = 200;
/// Tasks on an idle instance's runtime, per node it is connected to (a live node, or over
/// Sentinel the primary and each sentinel): its connections' tasks, and nothing per key or per
/// call; plus a few of the store's own.
pub const IDLE_TASKS_PER_NODE: usize = 3;
pub const IDLE_TASKS: usize = 4;
/// The process's resident memory: every instance's L1 holds a few hundred short values.
pub const RSS_MIB: usize = 512;

/// Samples the bounds every second until the workload's end.
pub async fn sample(backend: Arc<Mutex<Backend>>, workload: Arc<Workload>) {
    let checks = &workload.checks;
    let timeline = &workload.timeline;
    let (mut ports, sentinels) = {
        let backend = backend.lock().unwrap();
        (backend.live_ports(), backend.sentinel_ports())
    };
    while Instant::now() + Duration::from_secs(1) < workload.until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Instant::now();
        // A fault that holds the backend (a master killed, a restart) holds it for seconds:
        // the nodes are those it left live (a sample that finds one dead is skipped).
        if let Ok(backend) = backend.try_lock() {
            ports = backend.live_ports();
        }
        if let Some(n) = sentinel_clients(&sentinels)
            .await
            .filter(|_| !sentinels.is_empty())
        {
            let instances = workload.instances.len();
            let bound = SENTINEL_CONNECTIONS * instances + SENTINEL_CONNECTIONS_OTHERS;
            checks.max(
                "max connections to the sentinels, all instances".to_owned(),
                n,
            );
            if n > bound {
                let what = format!("connections: the sentinels hold {n} (bound {bound})");
                checks.violation(timeline, now, None, what);
            }
        }
        if let Some(connections) = connections_per_user(&ports).await {
            let bound = CONNECTIONS_PER_NODE * ports.len();
            for i in 0..workload.instances.len() {
                let n = connections.get(&user(i)).copied().unwrap_or(0);
                checks.max(format!("max connections, instance {i}"), n);
                if n > bound {
                    let what = format!("connections: instance {i} holds {n} (bound {bound})");
                    checks.violation(timeline, now, None, what);
                }
            }
        }
        for i in 0..workload.instances.len() {
            let tasks = workload.instances.handle(i).metrics().num_alive_tasks();
            checks.max(format!("max tasks, instance {i}"), tasks);
            if tasks > TASKS {
                let what = format!("tasks: instance {i} runs {tasks} (bound {TASKS})");
                checks.violation(timeline, now, None, what);
            }
        }
        if let Some(rss) = rss_mib() {
            checks.max("max RSS of the process, MiB".to_owned(), rss);
            if rss > RSS_MIB {
                let what = format!("memory: the process holds {rss} MiB (bound {RSS_MIB})");
                checks.violation(timeline, now, None, what);
            }
        }
    }
}

/// Once the callers are done: each instance's tasks come down to [`IDLE_TASKS`] and
/// [`IDLE_TASKS_PER_NODE`] for each of the `nodes` it is connected to, and the instances'
/// connections to the `sentinels` (if any) to [`SENTINEL_CONNECTIONS_IDLE`] each, within 5 s.
pub async fn check_idle(workload: &Workload, nodes: usize, sentinels: &[u16]) {
    let limit = Instant::now() + Duration::from_secs(5);
    if !sentinels.is_empty() {
        let bound = SENTINEL_CONNECTIONS_IDLE * workload.instances.len();
        let held = loop {
            let held = sentinel_clients(sentinels).await;
            if held.is_some_and(|n| n <= bound) || Instant::now() >= limit {
                break held;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if let Some(held) = held {
            let what = "connections to the sentinels when idle, all instances".to_owned();
            workload.checks.max(what, held);
        }
        if held.is_none_or(|held| held > bound) {
            let held = held.map_or("a sentinel did not answer".to_owned(), |n| n.to_string());
            let what = format!(
                "connections: the instances still hold {held} to the sentinels when idle (bound {bound})"
            );
            workload
                .checks
                .violation(&workload.timeline, Instant::now(), None, what);
        }
    }
    let bound = IDLE_TASKS + IDLE_TASKS_PER_NODE * nodes;
    for i in 0..workload.instances.len() {
        let tasks = loop {
            let tasks = workload.instances.handle(i).metrics().num_alive_tasks();
            if tasks <= bound || Instant::now() >= limit {
                break tasks;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        workload
            .checks
            .max(format!("tasks when idle, instance {i}"), tasks);
        if tasks > bound {
            let what = format!("tasks: instance {i} still runs {tasks} when idle (bound {bound})");
            workload
                .checks
                .violation(&workload.timeline, Instant::now(), None, what);
        }
    }
}

/// The process's resident memory (`VmRSS` of `/proc/self/status`), where there is one.
fn rss_mib() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}
