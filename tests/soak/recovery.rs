//! After the faults: the last part of a run injects none, and from a stated time after the
//! last fault ended ([`RECOVERY`]) every instance reports the store healthy
//! (`Cache::health()`), checked every half second until the end; the loads of that part are
//! checked without excuse ([`Checks::check_loads`](crate::checks::Checks::check_loads)). Before
//! the run, every instance is waited for until it is healthy ([`ready`]).

use std::time::{Duration, Instant};

use crate::instances::Instances;
use crate::workload::Workload;

/// How long after the last fault ends the system is whole again: broken connections back, a
/// circuit breaker open for 1 s closed again, locks of 1 s expired, and the values loaded by
/// each instance alone (at most two TTLs of 1 s) expired.
pub fn recovery(ttl: Duration) -> Duration {
    Duration::from_secs(3) + ttl * 2
}

/// Checks every instance's health from `recovered` until the workload's end.
/// Waits until every instance reports its store healthy (answering, notifications live), for
/// at most 30 s: a run that starts unhealthy shows it in its checks.
pub async fn ready(instances: &Instances) {
    let limit = Instant::now() + Duration::from_secs(30);
    for i in 0..instances.len() {
        while !instances.get(i).health().await.is_healthy() && Instant::now() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub async fn check_health(workload: &Workload, recovered: Instant) {
    let checks = &workload.checks;
    let timeline = &workload.timeline;
    if recovered + Duration::from_secs(1) > workload.until {
        let what = format!(
            "no recovery: the last fault's effects last until {:.3}s, past the end",
            timeline.since_start(recovered)
        );
        checks.violation(timeline, recovered, None, what);
        return;
    }
    tokio::time::sleep_until(recovered.into()).await;
    timeline.event("recovered: no fault from here on".to_owned());
    while Instant::now() + Duration::from_millis(500) < workload.until {
        for i in 0..workload.instances.len() {
            let health = workload.instances.get(i).health().await;
            checks.count("health checks after recovery".to_owned());
            if !health.is_healthy() {
                let what = format!("unhealthy after recovery: instance {i} {health:?}");
                checks.violation(timeline, Instant::now(), None, what);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
