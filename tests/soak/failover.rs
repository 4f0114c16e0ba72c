//! The faults of a Sentinel topology (`--sentinel`): the primary killed (a replica promoted by
//! the sentinels; the dead node restarted later, plainly or as a replica), paused past the
//! sentinels' `down-after-milliseconds`, or switched over (`SENTINEL FAILOVER`, no node
//! down). Each returns whether the old primary is a replica again, so that the next failover
//! has its two replicas.
//!
//! An old primary answers as a master for seconds after the sentinels named another: a node
//! restarted plainly is an empty master for about 11 s, a switched-over or paused one keeps
//! its data and takes writes until the sentinels demote it. Whatever a store writes there is
//! lost, so [`Stray`] watches it meanwhile: once the store had time to hear of the move
//! ([`STRAY_GRACE`]), an instance holding a connection to it is a violation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::RedisSentinel;

use crate::backend::{connections_per_user, on_node, Backend};
use crate::workload::Workload;

/// How long a failover, a switchover or a restart may take.
const LIMIT: Duration = Duration::from_secs(30);

/// How long after every sentinel names the new primary a store may still hold connections to
/// the old one: the `+switch-master` announcement (about 1 s after the sentinels agree), the
/// subscriber's next round (1 s), calls in flight on the old connection, on a busy machine.
const STRAY_GRACE: Duration = Duration::from_secs(5);

/// How often [`Stray`] looks at the old primary; a connection seen twice in a row is held,
/// not a reconnection already under way when the primary moved (dropped at once).
const STRAY_EVERY: Duration = Duration::from_millis(250);

/// Runs `what` on the topology, off the runtime (the starter's calls block), holding the
/// backend; `None` if it panicked (a starter's wait gave up).
async fn with_sentinel<T: Send + 'static>(
    backend: &Arc<Mutex<Backend>>,
    what: impl FnOnce(&mut RedisSentinel) -> T + Send + 'static,
) -> Option<T> {
    let backend = Arc::clone(backend);
    tokio::task::spawn_blocking(move || {
        let mut backend = backend.lock().unwrap_or_else(|e| e.into_inner());
        let Backend::Sentinel(sentinel) = &mut *backend else {
            unreachable!("a Sentinel fault on another Redis")
        };
        what(sentinel)
    })
    .await
    .ok()
}

/// Kills (SIGKILL) the primary, waits until the sentinels promote a replica, and after
/// `length` restarts the dead node: plainly (an empty master until the sentinels demote it)
/// or, with `as_replica`, as the new primary's replica.
pub async fn primary_killed(
    backend: &Arc<Mutex<Backend>>,
    workload: &Arc<Workload>,
    length: Duration,
    as_replica: bool,
) -> bool {
    let timeline = &workload.timeline;
    let killed = with_sentinel(backend, |s| {
        let killed = s.kill_primary();
        (killed, s.wait_promoted(LIMIT))
    })
    .await;
    let Some((killed, promoted)) = killed else {
        let what = "primary killed: the topology gave up".to_owned();
        workload
            .checks
            .violation(timeline, Instant::now(), None, what);
        return false;
    };
    let named_at = Instant::now();
    match promoted {
        Some(promoted) => timeline.event(format!(
            "primary on port {killed} killed, {promoted} promoted"
        )),
        None => {
            let what = format!("no replica promoted in {} s", LIMIT.as_secs());
            workload.checks.violation(timeline, named_at, None, what);
        }
    }
    tokio::time::sleep(length).await;
    let stray = Stray::watch(workload, killed, named_at);
    let how = if as_replica {
        "as a replica"
    } else {
        "plainly"
    };
    timeline.event(format!("node on port {killed} restarts {how}"));
    let back = with_sentinel(backend, move |s| s.restart_killed(LIMIT, as_replica)).await;
    stray.stop().await;
    let back = back == Some(true);
    timeline.event(format!(
        "node on port {killed} {}",
        if back {
            "a replica again"
        } else {
            "not a replica in 30 s"
        }
    ));
    if !back {
        timeline.count("primary-killed: node not back as a replica");
    }
    back && promoted.is_some()
}

/// Asks the sentinels for a switchover (`SENTINEL FAILOVER`), waits until they name a new
/// primary, then until they demote the old one (it answers as a master meanwhile).
pub async fn switchover(backend: &Arc<Mutex<Backend>>, workload: &Arc<Workload>) -> bool {
    let timeline = &workload.timeline;
    let moved = with_sentinel(backend, |s| {
        let old = s.failover();
        (old, s.wait_moved_from(old, LIMIT))
    })
    .await;
    let Some((old, Some(new))) = moved else {
        let what = format!("no switchover in {} s", LIMIT.as_secs());
        workload
            .checks
            .violation(timeline, Instant::now(), None, what);
        return false;
    };
    timeline.event(format!("switchover: the sentinels name {new}, not {old}"));
    demoted(workload, old, Instant::now()).await
}

/// Pauses (SIGSTOP) the primary for `length`, then resumes it (SIGCONT); past the sentinels'
/// `down-after-milliseconds` they may fail over meanwhile, or just after.
pub async fn primary_paused(
    backend: &Arc<Mutex<Backend>>,
    workload: &Arc<Workload>,
    length: Duration,
) -> bool {
    let timeline = &workload.timeline;
    let Some(old) = with_sentinel(backend, |s| s.primary_port()).await else {
        return false;
    };
    let Some(pid) = process_id(old).await else {
        timeline.event(format!("primary on port {old} did not say its pid"));
        return true;
    };
    support::signal(pid, support::Signal::STOP);
    timeline.event(format!("primary on port {old} paused"));
    tokio::time::sleep(length).await;
    support::signal(pid, support::Signal::CONT);
    timeline.event(format!("primary on port {old} resumed"));
    // A failover started while it was paused goes on: wait until the sentinels are done.
    let (sentinels, service) = {
        let backend = backend.lock().unwrap();
        (
            backend.sentinel_ports(),
            backend.service().unwrap_or_default(),
        )
    };
    let new = match settled(&sentinels, &service).await {
        Some(new) if new == old => {
            timeline.event(format!("no failover: {old} is still the primary"));
            return true;
        }
        Some(new) => new,
        None => {
            let what = format!(
                "primary paused: no settled primary in {} s",
                LIMIT.as_secs()
            );
            workload
                .checks
                .violation(timeline, Instant::now(), None, what);
            return false;
        }
    };
    timeline.event(format!("failover: the sentinels name {new}, not {old}"));
    timeline.count("primary-paused: failed over");
    demoted(workload, old, Instant::now()).await
}

/// Waits, for at most [`LIMIT`], until the sentinels on `sentinels` agree on the primary of
/// `service`, which says it is a master, with no failover in progress and no node down as
/// far as they know, for 1.5 s in a row (a sentinel pings each node once a second); its port.
async fn settled(sentinels: &[u16], service: &str) -> Option<u16> {
    let limit = Instant::now() + LIMIT;
    let mut since: Option<(u16, Instant)> = None;
    while Instant::now() < limit {
        let mut ports = Vec::new();
        for sentinel in sentinels {
            let master: Option<Vec<String>> =
                on_node(*sentinel, redis::cmd("SENTINEL").arg("MASTER").arg(service)).await;
            let master = master.unwrap_or_default();
            let field = |name: &str| {
                let pair = master.chunks(2).find(|pair| pair[0] == name)?;
                pair.get(1).cloned()
            };
            let calm = field("flags").as_deref() == Some("master");
            ports.push(field("port").filter(|_| calm).and_then(|p| p.parse().ok()));
        }
        let first = ports.first().copied().flatten();
        let agreed = match first {
            Some(port) if ports.iter().all(|p| *p == first) => {
                role(port).await.as_deref() == Some("master")
            }
            _ => false,
        };
        since = match (agreed, since, first) {
            (true, Some((port, at)), Some(now)) if port == now => Some((port, at)),
            (true, _, Some(now)) => Some((now, Instant::now())),
            _ => None,
        };
        if let Some((port, at)) = since {
            if at.elapsed() >= Duration::from_millis(1500) {
                return Some(port);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits until the old primary on `old`, which the sentinels stopped naming at `named_at`,
/// is a replica with its link up, watching it for the instances' connections meanwhile.
async fn demoted(workload: &Arc<Workload>, old: u16, named_at: Instant) -> bool {
    let stray = Stray::watch(workload, old, named_at);
    let limit = Instant::now() + LIMIT;
    let demoted = loop {
        let info: Option<String> = on_node(old, redis::cmd("INFO").arg("replication")).await;
        if info.is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up")) {
            break true;
        }
        if Instant::now() >= limit {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stray.stop().await;
    workload.timeline.event(format!(
        "old primary on port {old} {} {:.1} s after the switch",
        if demoted {
            "a replica"
        } else {
            "not a replica"
        },
        named_at.elapsed().as_secs_f64()
    ));
    if !demoted {
        workload.timeline.count("old primary not demoted in 30 s");
    }
    demoted
}

/// A watch on an old primary, which the sentinels stopped naming at `named_at`: while it
/// answers as a master, from [`STRAY_GRACE`] on, no instance holds a connection to it. Before
/// that it is watched too, to tell when the instances left it.
struct Stray {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Stray {
    fn watch(workload: &Arc<Workload>, port: u16, named_at: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (workload, stopped) = (Arc::clone(workload), Arc::clone(&stop));
        let task = tokio::spawn(async move {
            let (mut seen_before, mut reported) = (Vec::new(), Vec::new());
            // When it was first and last seen answering as a master, and an instance's
            // connection to it last seen.
            let (mut as_master, mut held): (Option<(Instant, Instant)>, Option<Instant>) =
                (None, None);
            while !stopped.load(Ordering::Relaxed) {
                tokio::time::sleep(STRAY_EVERY).await;
                if role(port).await.as_deref() != Some("master") {
                    seen_before.clear();
                    continue;
                }
                let now = Instant::now();
                as_master = Some((as_master.map_or(now, |(first, _)| first), now));
                let Some(users) = connections_per_user(&[port]).await else {
                    continue;
                };
                let seen: Vec<usize> = (0..workload.instances.len())
                    .filter(|i| users.contains_key(&crate::backend::user(*i)))
                    .collect();
                if !seen.is_empty() {
                    held = Some(now);
                }
                if now < named_at + STRAY_GRACE {
                    continue;
                }
                workload
                    .checks
                    .count("old primary looked at for connections".to_owned());
                for &i in seen.iter().filter(|i| seen_before.contains(*i)) {
                    if reported.contains(&i) {
                        continue;
                    }
                    reported.push(i);
                    let what = format!(
                        "stray connection: instance {i} on port {port}, a master the sentinels no longer name"
                    );
                    let timeline = &workload.timeline;
                    workload.checks.violation(timeline, now, None, what);
                }
                seen_before = seen;
            }
            let timeline = &workload.timeline;
            if let Some((first, last)) = as_master {
                timeline.event(format!(
                    "port {port} answered as a master the sentinels no longer name from {:.3}s to {:.3}s; an instance's connection last seen there {}",
                    timeline.since_start(first),
                    timeline.since_start(last),
                    held.map_or("never".to_owned(), |at| format!(
                        "{:.1} s after the sentinels named another",
                        at.saturating_duration_since(named_at).as_secs_f64()
                    ))
                ));
            }
        });
        Stray { stop, task }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

/// The first field of the node's `ROLE` (`master`, `slave`), if it answers.
async fn role(port: u16) -> Option<String> {
    let role: Vec<redis::Value> = on_node(port, &redis::cmd("ROLE")).await?;
    redis::from_redis_value(role.first()?.clone()).ok()
}

/// The pid of the server on `port` (`INFO server`).
async fn process_id(port: u16) -> Option<u32> {
    let info: String = on_node(port, redis::cmd("INFO").arg("server")).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()
}
