//! The circuit breaker in front of the store.
//!
//! After `threshold` store calls in a row have failed (or timed out), the breaker opens: for
//! `open_for`, no store call is made and every flight loads with in-process protection at
//! once, instead of paying the store timeout. Then ONE trial asks the store (half-open): the
//! next store call, made for real (the flight that makes it keeps its answer, so a lookup
//! that takes the lock leads as usual), or a timer's read of a probe key, which runs every
//! `open_for` while the breaker is open, with or without traffic. If the store answers, the
//! breaker closes and protection across processes resumes; if not, it stays open for another
//! `open_for`. So the first stampede after the store returns is protected across processes
//! even if nothing was asked of it meanwhile. Each change of state is logged once.
//!
//! Every store call of the engine goes through [`Inner::store_call`], which bounds it by the
//! store timeout, counts its failures, and asks the breaker first.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{telemetry, Inner};
use crate::store::{KeyDigest, StoreError, StoreKey};

/// What the breaker lets a store call do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: make the call.
    Call,
    /// Open: skip the call.
    Skip,
    /// Open, and time for the trial: make the call, and report it with
    /// [`probed`](Breaker::probed).
    /// Open, and time to probe: skip the call, and start the probe.
    Probe,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, probing: bool },
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// A closed breaker; a `threshold` of 0 never opens.
    pub(crate) fn new(threshold: u32, open_for: Duration) -> Self {
        Breaker {
            threshold,
            open_for,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock, and every state is valid.
        crate::sync::lock(&self.state)
    }

    /// Whether the store is believed to answer (the breaker is closed).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(*self.state(), State::Closed { .. })
    }

    /// Asks to make a store call.
    pub(crate) fn admit(&self) -> Admit {
        let mut state = self.state();
        match &mut *state {
            State::Closed { .. } => Admit::Call,
            State::Open { until, probing } => {
                if *probing || Instant::now() < *until {
                    Admit::Skip
                } else {
                    *probing = true;
                    Admit::Probe
                }
            }
        }
    }

    /// Records the outcome of a call that was made; returns `true` if it opened the breaker.
    pub(crate) fn record(&self, ok: bool) -> bool {
        let mut state = self.state();
        match (&mut *state, ok) {
            (State::Closed { failures }, true) => {
                *failures = 0;
                false
            }
            (State::Closed { failures }, false) => {
                *failures = failures.saturating_add(1);
                if self.threshold == 0 || *failures < self.threshold {
                    return false;
                }
                warn!(
                    failures = *failures,
                    open_for = ?self.open_for,
                    "store failing: circuit open, loading with in-process protection only"
                );
                *state = State::Open {
                    until: crate::sync::later(Instant::now(), self.open_for),
                    probing: false,
                };
                telemetry::breaker_open(true);
                true
            }
            // A call admitted before the breaker opened: it changes nothing now.
            (State::Open { .. }, _) => false,
        }
    }

    /// Records the outcome of a probe.
    pub(crate) fn probed(&self, ok: bool) {
        let mut state = self.state();
        if ok {
            info!("store answering again: circuit closed, protection across processes resumes");
            *state = State::Closed { failures: 0 };
            telemetry::breaker_open(false);
        } else {
            *state = State::Open {
                until: crate::sync::later(Instant::now(), self.open_for),
                probing: false,
            };
        }
    }
}

impl Inner {
    /// One store call, bounded by the store timeout, counted if it fails, and not made at all
    /// while the circuit breaker is open.
    pub(super) async fn store_call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.store_call_from(Instant::now(), call).await
    }

    /// [`store_call`](Self::store_call), its timeout counted from `now`, a clock reading its
    /// caller has just taken (and uses for what the call answers: one reading, not two).
    pub(super) async fn store_call_from<T>(
        &self,
        now: Instant,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let trial = match self.breaker.admit() {
            Admit::Call => None,
            Admit::Probe => Some(Trial {
                breaker: &self.breaker,
                reported: false,
            }),
            Admit::Skip => {
                self.counters
                    .store_calls_skipped
                    .fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::circuit_open());
            }
        };
        let timeout = self.config.store_timeout;
        let result = match tokio::time::timeout_at(crate::sync::later(now, timeout), call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(timeout)),
        };
        if result.is_err() {
            self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
            telemetry::store_error();
        }
        match trial {
            Some(mut trial) => trial.report(result.is_ok()),
            None if self.breaker.record(result.is_ok()) => {
                self.counters.breaker_opened.fetch_add(1, Ordering::Relaxed);
                self.probe_while_open();
            }
            None => {}
        }
        result
    }

    /// While the breaker is open, asks the store every `open_for` whether it answers again (a
    /// read of a probe key, bounded by the store timeout), unless a call's trial is under way;
    /// ends once the breaker is closed. Without a runtime, calls' trials alone close it.
    fn probe_while_open(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, breaker) = (Arc::clone(&self.store), Arc::clone(&self.breaker));
        let key = StoreKey::new(
            Arc::clone(&self.config.namespace),
            KeyDigest::of(b"tower-stampede:probe"),
        );
        let (timeout, open_for) = (self.config.store_timeout, self.config.breaker_open_for);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(open_for).await;
                match breaker.admit() {
                    Admit::Call => return,
                    Admit::Skip => continue,
                    Admit::Probe => {
                        let mut trial = Trial {
                            breaker: &breaker,
                            reported: false,
                        };
                        let answered = matches!(
                            tokio::time::timeout(timeout, store.get(&key)).await,
                            Ok(Ok(_))
                        );
                        trial.report(answered);
                        if answered {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// A trial of the store while the breaker is half-open: its outcome closes or reopens the
/// breaker, and a trial dropped unfinished (its task torn down) counts as failed, so the
/// breaker never waits for a trial that will not report.
struct Trial<'a> {
    breaker: &'a Breaker,
    reported: bool,
}

impl Trial<'_> {
    fn report(&mut self, answered: bool) {
        self.reported = true;
        self.breaker.probed(answered);
    }
}

impl Drop for Trial<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.probed(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_probes_once_and_closes() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        assert!(!breaker.record(false));
        assert!(!breaker.record(true));
        // Failures must be consecutive.
        assert!(!breaker.record(false));
        assert!(!breaker.record(false));
        assert!(breaker.record(false), "the third failure in a row opens it");
        assert!(!breaker.is_closed());
        assert_eq!(breaker.admit(), Admit::Skip);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.admit(), Admit::Probe);
        assert_eq!(breaker.admit(), Admit::Skip, "one probe at a time");
        breaker.probed(false);
        assert_eq!(breaker.admit(), Admit::Skip, "open for another second");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(breaker.admit(), Admit::Probe);
        breaker.probed(true);
        assert!(breaker.is_closed());
        assert_eq!(breaker.admit(), Admit::Call);
    }

    #[test]
    fn a_zero_threshold_never_opens() {
        let breaker = Breaker::new(0, Duration::from_secs(1));
        for _ in 0..100 {
            assert!(!breaker.record(false));
        }
        assert_eq!(breaker.admit(), Admit::Call);
    }
}
