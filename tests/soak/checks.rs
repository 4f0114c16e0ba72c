//! What the soak checks, from the callers' side and the origin's counters only:
//! - no call fails but for the origin's own failures (`Load`, `LoadTimeout`, and
//!   `RecentFailure` that shares one), counted by kind;
//! - every answer is a value the origin stamped for that key;
//! - no answer is older than a change acknowledged before the call started, beyond the
//!   README's bound for a lost notification (`l1_ttl_cap`) plus [`DELIVERY`]; and, while no
//!   fault is near, beyond [`DELIVERY`] alone (the time pub/sub takes);
//!   During a failover (a Cluster master killed; a Sentinel primary killed, paused or switched
//!   over), a change acknowledged by the old master may be lost, so near one the bound is the
//!   life of a value loaded before the change (see [`Bounds`]);
//! - while no fault is near, no key is loaded twice within half a TTL without a change of it,
//!   and that holds without exception once the faults are over ([`Checks::check_loads`]);
//! - an instance killed mid-load costs the others no wait and no load beyond its lock's TTL
//!   ([`kills`](crate::kills)).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tower_stampede::{Error, ErrorKind, Fetched};

use crate::faults::FAILOVERS;
use crate::kills::{Kill, Kills};
use crate::origin::{key_name, read_stamp, Origin};
use crate::timeline::Timeline;

/// How long a change may take to reach another process's L1 when its notification is not
/// lost: pub/sub delivery on a busy machine.
const DELIVERY: Duration = Duration::from_millis(500);

/// How many of a key's last answers a violation report shows.
const RECENT: usize = 16;

/// How old an answer may be, after a change acknowledged before the call started.
pub struct Bounds {
    /// The README's bound for a lost notification: `l1_ttl_cap`.
    pub lost_notification: Duration,
    /// A change lost with an old master (a dying Cluster master, a Sentinel primary killed or
    /// switched over: replication is asynchronous, and a store writes to the old primary until
    /// it hears of the new one): a value loaded before the change may be filled on the new
    /// master and served for its whole life, `load_timeout` + TTL + the stale window.
    pub failover: Duration,
}

pub struct Checks {
    bounds: Bounds,
    counts: Mutex<BTreeMap<String, usize>>,
    violations: Mutex<Vec<(Instant, Option<usize>, String)>>,
    kills: Kills,
    /// The last answers of each key, for the report around a violation.
    recent: Mutex<HashMap<usize, VecDeque<(Instant, String)>>>,
}

impl Checks {
    pub fn new(bounds: Bounds) -> Self {
        Checks {
            bounds,
            counts: Mutex::default(),
            violations: Mutex::default(),
            kills: Kills::default(),
            recent: Mutex::default(),
        }
    }

    pub fn count(&self, what: String) {
        self.add(what, 1);
    }

    fn add(&self, what: String, n: usize) {
        *self.counts.lock().unwrap().entry(what).or_default() += n;
    }

    /// Keeps the largest `value` seen under `what`.
    pub fn max(&self, what: String, value: usize) {
        let mut counts = self.counts.lock().unwrap();
        let max = counts.entry(what).or_default();
        *max = (*max).max(value);
    }

    /// Records an instance killed mid-load, for the checks of the others' calls and loads.
    pub fn kill(&self, kill: Kill) {
        self.kills.add(kill);
    }

    /// Records a violation at `at`, of `key`'s calls if it is about one key.
    pub fn violation(&self, timeline: &Timeline, at: Instant, key: Option<usize>, what: String) {
        timeline.event(format!("VIOLATION {what}"));
        self.count(format!(
            "violation: {}",
            what.split(':').next().unwrap_or("")
        ));
        self.violations.lock().unwrap().push((at, key, what));
    }

    fn remember(&self, key: usize, started: Instant, what: String) {
        let mut recent = self.recent.lock().unwrap();
        let answers = recent.entry(key).or_default();
        if answers.len() == RECENT {
            answers.pop_front();
        }
        answers.push_back((started, what));
    }

    pub fn violations(&self) -> usize {
        self.violations.lock().unwrap().len()
    }

    /// Checks one call's answer; `started` is when the call was made.
    pub fn answer(
        &self,
        origin: &Origin,
        timeline: &Timeline,
        instance: usize,
        key: usize,
        started: Instant,
        answer: Result<Fetched, Error>,
    ) {
        let now = Instant::now();
        if let Some(what) = self.kills.check_wait(timeline, instance, key, started, now) {
            self.violation(timeline, now, Some(key), what);
        }
        let fetched = match answer {
            Ok(fetched) => fetched,
            Err(error) => {
                let kind = error.kind();
                self.remember(key, started, format!("instance {instance}: error {kind:?}"));
                if matches!(
                    kind,
                    ErrorKind::Load | ErrorKind::LoadTimeout | ErrorKind::RecentFailure
                ) {
                    self.count(format!("origin error {kind:?}"));
                } else {
                    self.violation(
                        timeline,
                        now,
                        Some(key),
                        format!(
                            "error {kind:?}: instance {instance} {}: {error}",
                            key_name(key)
                        ),
                    );
                }
                return;
            }
        };
        self.count(format!("ok {}", fetched.outcome().label()));
        self.remember(
            key,
            started,
            format!(
                "instance {instance}: {} {:?}",
                fetched.outcome().label(),
                fetched
                    .value()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            ),
        );
        let Some((stamped, version)) = fetched.value().and_then(|v| read_stamp(v)) else {
            self.violation(
                timeline,
                now,
                Some(key),
                format!(
                    "not a stamp: instance {instance} {} got {:?}",
                    key_name(key),
                    fetched.value()
                ),
            );
            return;
        };
        if stamped != key_name(key) {
            self.violation(
                timeline,
                now,
                Some(key),
                format!(
                    "cross-key: instance {instance} {} got {stamped} v{version}",
                    key_name(key)
                ),
            );
            return;
        }
        let bound = self.bounds.lost_notification + DELIVERY;
        let acked_long_ago = origin.acked_before(key, started - bound);
        let acked_a_moment_ago = origin.acked_before(key, started - DELIVERY);
        let old = |what: &str, acked: u64, before: Duration| {
            format!(
                "{what}: instance {instance} {} got v{version} ({}), v{acked} acked over {} ms before the call at {:.3}s",
                key_name(key),
                fetched.outcome().label(),
                before.as_millis(),
                timeline.since_start(started)
            )
        };
        let failover = self.bounds.failover + DELIVERY;
        let near_failover = || {
            FAILOVERS
                .iter()
                .any(|fault| timeline.fault_during(fault, started - failover, now))
        };
        if version < acked_long_ago {
            let acked_before_failover = origin.acked_before(key, started - failover);
            if version >= acked_before_failover && near_failover() {
                self.count("old within the failover bound".to_owned());
            } else {
                let what = old("old beyond bound", acked_long_ago, bound);
                self.violation(timeline, now, Some(key), what);
            }
        } else if version < acked_a_moment_ago {
            if timeline.unhealthy_during(started - bound, now) {
                self.count("old within the lost-notification bound, near a fault".to_owned());
            } else {
                let what = old("old while healthy", acked_a_moment_ago, DELIVERY);
                self.violation(timeline, now, Some(key), what);
            }
        }
    }

    /// Checks the origin's load counts: while no fault is near, two loads of one key less
    /// than half a TTL apart need a change of the key between them; from `recovered` on (a
    /// stated time after the last fault), a fault is no excuse. Then the loads after each
    /// instance killed mid-load.
    pub fn check_loads(
        &self,
        origin: &Origin,
        timeline: &Timeline,
        ttl: Duration,
        recovered: Option<Instant>,
    ) {
        let mut loads: Vec<(usize, Vec<Instant>)> = origin.loads().into_iter().collect();
        loads.sort_by_key(|(key, _)| *key);
        let mut total = 0;
        let mut checked = 0;
        let mut after_recovery = 0;
        for (key, mut starts) in loads {
            total += starts.len();
            starts.sort();
            let changes = origin.changes(key);
            for pair in starts.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let recovering = recovered.is_some_and(|from| from <= a);
                let near_fault = !recovering && timeline.unhealthy_during(a - ttl, b);
                if !near_fault {
                    checked += 1;
                }
                if recovering {
                    after_recovery += 1;
                }
                let excused = b.duration_since(a) >= ttl / 2
                    || near_fault
                    || changes
                        .iter()
                        .any(|at| a - ttl <= *at && *at <= b + Duration::from_secs(1));
                if !excused {
                    self.violation(
                        timeline,
                        b,
                        Some(key),
                        format!(
                            "two loads: {} at {:.3}s and {:.3}s, no change or fault near",
                            key_name(key),
                            timeline.since_start(a),
                            timeline.since_start(b)
                        ),
                    );
                }
            }
        }
        self.add("loads (origin)".to_owned(), total);
        self.add("load pairs checked, no fault near".to_owned(), checked);
        self.add(
            "load pairs checked after recovery".to_owned(),
            after_recovery,
        );
        let (kills, violations) = self.kills.check_loads(origin, timeline, ttl);
        self.add("kills mid-load checked".to_owned(), kills);
        for (at, key, what) in violations {
            self.violation(timeline, at, Some(key), what);
        }
    }

    /// The counts, the faults, and each violation with the time line around it.
    pub fn report(&self, timeline: &Timeline, origin: &Origin) -> String {
        let mut out = String::from("counts:\n");
        for (what, n) in self.counts.lock().unwrap().iter() {
            out += &format!("  {what}: {n}\n");
        }
        for (what, n) in timeline.counts.lock().unwrap().iter() {
            out += &format!("  {what}: {n}\n");
        }
        out += &format!(
            "  origin failed loads: {}\n",
            origin
                .failed_loads
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        let violations = self.violations.lock().unwrap();
        let recent = self.recent.lock().unwrap();
        for (at, key, what) in violations.iter().take(20) {
            out += &format!(
                "VIOLATION at {:.3}s: {what}\n  time line around it:\n{}",
                timeline.since_start(*at),
                timeline.around(*at, Duration::from_secs(3)),
            );
            let Some(key) = key else { continue };
            out += &format!("  last calls of {}:\n", key_name(*key));
            for (started, answer) in recent.get(key).into_iter().flatten() {
                out += &format!("    {:8.3}s {answer}\n", timeline.since_start(*started));
            }
        }
        if violations.len() > 20 {
            out += &format!("... and {} more\n", violations.len() - 20);
        }
        out
    }
}
