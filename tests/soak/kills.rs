//! The instances killed mid-load, and what the others owe them: no call of the key the dead
//! instance was loading waits past its lock's TTL (plus [`KILL_MARGIN`]), and no other
//! instance loads that key before the lock could have expired, nor twice while taking over.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::faults::KILL_MARGIN;
use crate::instances::LOCK_TTL;
use crate::origin::{key_name, Origin};
use crate::timeline::Timeline;

/// How much earlier than the load a leader's lock may have been taken: its lookup's reply,
/// then the flight that starts the load, on a busy machine.
const LOCK_BEFORE_LOAD: Duration = Duration::from_millis(200);

/// An instance killed while it loaded `key`, holding its lock in the store.
///
/// A held load whose lock the store did not hold at the kill (the instance's lookup had
/// failed, so it loaded with in-process protection only) owes the others nothing: they may
/// load at once, and such a kill is not recorded (see `kill_mid_load`).
#[derive(Clone, Copy)]
pub struct Kill {
    pub instance: usize,
    pub key: usize,
    pub load_started: Instant,
    pub killed_at: Instant,
    /// When the fault began (its own span does not excuse the checks).
    pub fault_began: Instant,
    /// When the killed instance's replacement first had an answer from the store; `None` if
    /// not within the check's window. Until then its calls fail at once, and its loads have
    /// in-process protection only: they do not break the dead lock, and are not counted.
    pub replacement_answered: Option<Instant>,
}

impl Kill {
    /// By when every call of the key by another instance has an answer.
    fn answered_by(&self) -> Instant {
        self.killed_at + LOCK_TTL + KILL_MARGIN
    }
}

#[derive(Default)]
pub struct Kills(Mutex<Vec<Kill>>);

impl Kills {
    pub fn add(&self, kill: Kill) {
        self.0.lock().unwrap().push(kill);
    }

    /// A violation, if a call of `key` by `instance` from `started` until `ended` waited on a
    /// dead instance's lock past its TTL and the margin, with no other fault near.
    pub fn check_wait(
        &self,
        timeline: &Timeline,
        instance: usize,
        key: usize,
        started: Instant,
        ended: Instant,
    ) -> Option<String> {
        let kills = self.0.lock().unwrap();
        let kill = kills.iter().find(|k| {
            k.key == key
                && k.instance != instance
                && k.load_started <= started
                && started <= k.killed_at + LOCK_TTL
        })?;
        if ended <= kill.answered_by()
            || timeline.other_fault_during(kill.fault_began, kill.load_started, ended)
        {
            return None;
        }
        Some(format!(
            "waited on a dead lock: instance {instance} {} from {:.3}s to {:.3}s, instance {} killed loading it at {:.3}s (lock TTL {} ms)",
            key_name(key),
            timeline.since_start(started),
            timeline.since_start(ended),
            kill.instance,
            timeline.since_start(kill.killed_at),
            LOCK_TTL.as_millis()
        ))
    }

    /// The violations of the loads of each killed instance's key: another load before its
    /// lock could expire, or two within half a TTL while the others take over, with no change
    /// of the key and no other fault near. Also returns how many kills were checked.
    pub fn check_loads(
        &self,
        origin: &Origin,
        timeline: &Timeline,
        ttl: Duration,
    ) -> (usize, Vec<(Instant, usize, String)>) {
        let mut checked = 0;
        let mut violations = Vec::new();
        for kill in self.0.lock().unwrap().iter() {
            let until = kill.answered_by();
            let changed = origin
                .changes(kill.key)
                .iter()
                .any(|at| kill.load_started - ttl <= *at && *at <= until);
            if changed || timeline.other_fault_during(kill.fault_began, kill.load_started, until) {
                continue;
            }
            checked += 1;
            let connecting = |at: Instant, by: usize| {
                by == kill.instance
                    && kill
                        .replacement_answered
                        .is_none_or(|answered| at < answered)
            };
            let mut loads: Vec<Instant> = origin
                .loads_of(kill.key)
                .into_iter()
                .filter(|(at, by)| kill.load_started < *at && *at <= until && !connecting(*at, *by))
                .map(|(at, _)| at)
                .collect();
            loads.sort();
            let earliest = kill.load_started + LOCK_TTL - LOCK_BEFORE_LOAD;
            let early = loads.iter().find(|at| **at < earliest);
            let twice = loads.windows(2).find(|pair| pair[1] - pair[0] < ttl / 2);
            if let Some(at) = early.or(twice.map(|pair| &pair[1])) {
                let at = *at;
                violations.push((
                    at,
                    kill.key,
                    format!(
                        "loads after a kill: {} loaded at {:?} s after instance {} was killed loading it (started at {:.3}s, lock TTL {} ms)",
                        key_name(kill.key),
                        loads.iter().map(|l| format!("{:.3}", timeline.since_start(*l))).collect::<Vec<_>>(),
                        kill.instance,
                        timeline.since_start(kill.load_started),
                        LOCK_TTL.as_millis()
                    ),
                ));
            }
        }
        (checked, violations)
    }
}
