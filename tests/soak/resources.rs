//! The resources the instances hold, sampled every second through the faults, each under a
//! stated bound: each instance's connections to Redis (`CLIENT LIST` by its ACL user, over
//! every live node), the tasks on its runtime, and the process's resident memory (the
//! instances share one process). Once the callers are done, each instance's tasks come back
//! to what an idle instance holds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{connections_per_user, user, Backend};
use crate::workload::Workload;

/// Connections of one instance per live node: its data connection and its subscriber; twice
/// that while a restarted instance's old calls finish on the old ones; and two more for a
/// reconnection whose old socket the server has not closed yet.
pub const CONNECTIONS_PER_NODE: usize = 6;
/// Tasks on one instance's runtime: its 4 callers, their flights and loads, its connections'
/// tasks, with room for the releases and refreshes of an outage.
pub const TASKS: usize = 200;
/// Tasks on an idle instance's runtime, per live node: its connections' tasks, and nothing
/// per key or per call; plus a few of the store's own.
pub const IDLE_TASKS_PER_NODE: usize = 3;
pub const IDLE_TASKS: usize = 4;
/// The process's resident memory: every instance's L1 holds a few hundred short values.
pub const RSS_MIB: usize = 512;

/// Samples the bounds every second until the workload's end.
pub async fn sample(backend: Arc<Mutex<Backend>>, workload: Arc<Workload>) {
    let checks = &workload.checks;
    let timeline = &workload.timeline;
    while Instant::now() + Duration::from_secs(1) < workload.until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Instant::now();
        // A fault that holds the backend (a master killed, a restart) holds it for seconds.
        let ports = match backend.try_lock() {
            Ok(backend) => backend.live_ports(),
            Err(_) => continue,
        };
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
/// [`IDLE_TASKS_PER_NODE`] within 5 s.
pub async fn check_idle(workload: &Workload, nodes: usize) {
    let limit = Instant::now() + Duration::from_secs(5);
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
