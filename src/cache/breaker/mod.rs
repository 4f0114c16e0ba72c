//! The circuit breaker in front of the store.
//!
//! After `threshold` store calls in a row have failed (or timed out), the breaker opens: for
//! `open_for`, no store call is made and every flight loads with in-process protection at
//! once, instead of paying the store timeout. Then ONE trial asks the store (half-open): the
//! next store call, made for real (the flight that makes it keeps its answer, so a lookup
//! that takes the lock leads as usual), or a timer's read of a probe key, which runs every
//! `open_for` from the first failed call until the store answers, with or without traffic. If
//! the store answers, the breaker closes and protection across processes resumes; if not, it
//! stays open for another `open_for`. So the first stampede after the store returns is
//! protected across processes even if nothing was asked of it meanwhile. Each change of state
//! is logged once.
//!
//! The breaker also keeps what a health check reads: when the store last answered, and how
//! many times it answered again after failing (L1 drops what it loaded while the store
//! failed, once the store answers again).
//!
//! Every store call of the engine goes through [`Breaker::call`], which bounds it by the
//! store timeout, counts its failures, and asks the breaker first. The breaker holds the
//! store for its own probe.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | `Breaker`: its states, every store call, the background check and the trial |
//! | `tests.rs` | its tests |

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{info, warn};

use super::config::BreakerSettings;
use super::{store_timeout, telemetry::Meter};
use crate::store::{CallLimit, KeyDigest, Store, StoreError, StoreKey};

/// What the breaker lets a store call do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: make the call.
    Call,
    /// Open: skip the call.
    Skip,
    /// Open, and time for the trial: make the call, and report it with
    /// [`probed`](Breaker::probed).
    Probe,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, probing: bool },
}

/// The breaker's state, and what the health check reads.
#[derive(Debug)]
struct Status {
    state: State,
    /// Whether the background check runs: from the first failure of a spell until the store
    /// answers again.
    checking: bool,
    /// When the store last answered a call (when that call was made).
    answered: Option<Instant>,
}

/// What the background check is to do now.
enum Check {
    /// The store answers: the check ends.
    Done,
    /// The breaker is open, its trial not due or under way: wait.
    Wait,
    /// Calls have failed, the breaker is closed: ask the store.
    Ask,
    /// The breaker is open, and its trial is due: this is it.
    Trial,
}

/// What [`Breaker::record`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The call opened the breaker.
    pub(crate) opened: bool,
    /// The call is the first failure of a spell: the caller starts the background check.
    pub(crate) start_check: bool,
}

/// The breaker in front of `store`: its state, the store calls it counted, and what its
/// probe reads.
pub(crate) struct Breaker {
    threshold: u32,
    open_for: Duration,
    /// How long a store call may take.
    timeout: Duration,
    status: Mutex<Status>,
    /// How many times the store answered again after failing: a value loaded while it was
    /// failing is kept in L1 only until this moves on.
    recoveries: AtomicU64,
    store: Arc<dyn Store>,
    /// The key the probe reads.
    probe_key: StoreKey,
    /// Store calls that failed or timed out.
    errors: AtomicU64,
    /// Store calls not made because the breaker was open.
    skipped: AtomicU64,
    /// Times the breaker opened.
    opened: AtomicU64,
    meter: Meter,
    /// The room for calls out at once: the store's, shared with every cache over it, or one
    /// of this cache's own. Lookups go in one lane; the calls of flights past their lookup
    /// (the tag clock read before a load, fills, renewals, releases) in another, so that they
    /// never wait behind a burst of lookups while their locks run out.
    in_flight: CallLimit,
    /// The calls the store answered: what tells a queued call from a stuck one.
    answers: store_timeout::Answers,
}

/// What [`Breaker::counts`] tells of the store calls.
pub(super) struct CallCounts {
    pub(super) errors: u64,
    pub(super) skipped: u64,
    pub(super) opened: u64,
}

impl Breaker {
    /// A closed breaker over `store`, as `config` sets it; a threshold of 0 never opens.
    pub(crate) fn new(
        settings: &BreakerSettings,
        namespace: &Arc<str>,
        store: Arc<dyn Store>,
    ) -> Self {
        let in_flight = store.call_limit().cloned().unwrap_or_default();
        Breaker {
            threshold: settings.threshold,
            open_for: settings.open_for,
            timeout: settings.store_timeout,
            status: Mutex::new(Status {
                state: State::Closed { failures: 0 },
                checking: false,
                answered: None,
            }),
            recoveries: AtomicU64::new(0),
            store,
            probe_key: StoreKey::new(
                Arc::clone(namespace),
                KeyDigest::of(b"tower-stampede:probe"),
            ),
            errors: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            meter: Meter::new(namespace),
            in_flight,
            answers: store_timeout::Answers::default(),
        }
    }

    /// The store calls counted so far.
    pub(super) fn counts(&self) -> CallCounts {
        CallCounts {
            errors: self.errors.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            opened: self.opened.load(Ordering::Relaxed),
        }
    }

    /// The key the engine reads to ask the store whether it answers.
    pub(super) fn probe_key(&self) -> &StoreKey {
        &self.probe_key
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        // No code path panics while holding the lock, and every state is valid.
        crate::sync::lock(&self.status)
    }

    /// Whether the store is believed to answer (the breaker is closed).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.status().state, State::Closed { .. })
    }

    /// Whether the store answered the last call (the breaker is closed, and no call has
    /// failed since the store last answered).
    pub(crate) fn answering(&self) -> bool {
        matches!(self.status().state, State::Closed { failures: 0 })
    }

    /// When the store last answered a call of the engine, if it ever did.
    pub(crate) fn answered(&self) -> Option<Instant> {
        self.status().answered
    }

    /// How many times the store answered again after failing.
    pub(crate) fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::SeqCst)
    }

    /// Asks to make a store call.
    pub(crate) fn admit(&self) -> Admit {
        let mut status = self.status();
        match &mut status.state {
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

    /// Records the outcome of a call that was made at `at`.
    pub(crate) fn record(&self, ok: bool, at: Instant) -> Recorded {
        let mut status = self.status();
        if ok {
            status.answered = Some(at);
        }
        let mut recorded = Recorded::default();
        match (&mut status.state, ok) {
            (State::Closed { failures }, true) => {
                if *failures > 0 {
                    self.recoveries.fetch_add(1, Ordering::SeqCst);
                }
                *failures = 0;
            }
            (State::Closed { failures }, false) => {
                *failures = failures.saturating_add(1);
                if !status.checking {
                    status.checking = true;
                    recorded.start_check = true;
                }
                let State::Closed { failures } = status.state else {
                    return recorded;
                };
                if self.threshold == 0 || failures < self.threshold {
                    return recorded;
                }
                warn!(
                    failures,
                    open_for = ?self.open_for,
                    "store failing: circuit open, loading with in-process protection only"
                );
                status.state = State::Open {
                    until: crate::sync::later(Instant::now(), self.open_for),
                    probing: false,
                };
                self.meter.breaker_open(true);
                recorded.opened = true;
            }
            // A call admitted before the breaker opened: it changes nothing now.
            (State::Open { .. }, _) => {}
        }
        recorded
    }

    /// Records the outcome of a probe.
    pub(crate) fn probed(&self, ok: bool) {
        let mut status = self.status();
        if ok {
            info!("store answering again: circuit closed, protection across processes resumes");
            status.state = State::Closed { failures: 0 };
            status.answered = Some(Instant::now());
            self.recoveries.fetch_add(1, Ordering::SeqCst);
            self.meter.breaker_open(false);
        } else {
            status.state = State::Open {
                until: crate::sync::later(Instant::now(), self.open_for),
                probing: false,
            };
        }
    }

    /// What the background check does now; ends it (for the next failure to start another)
    /// once the store answers.
    fn check(&self) -> Check {
        let mut status = self.status();
        match &status.state {
            State::Closed { failures: 0 } => {
                status.checking = false;
                Check::Done
            }
            State::Closed { .. } => Check::Ask,
            State::Open { .. } => {
                drop(status);
                match self.admit() {
                    Admit::Probe => Check::Trial,
                    Admit::Call | Admit::Skip => Check::Wait,
                }
            }
        }
    }
}

impl Breaker {
    /// One store call, bounded by the store timeout (measured against the store: see
    /// [`store_timeout`]), counted if it fails, and not made at all while the circuit breaker
    /// is open. Past the store's [`CallLimit`] of calls out at once, it waits for room, and its
    /// timeout counts from when it is sent.
    pub(super) async fn call<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_from(Instant::now(), call).await
    }

    /// [`call`](Self::call), its timeout counted from `now`, a clock reading its
    /// caller has just taken (and uses for what the call answers: one reading, not two).
    pub(super) async fn call_from<T>(
        self: &Arc<Self>,
        now: Instant,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_in(self.in_flight.lookups(), now, call).await
    }

    /// [`call`](Self::call) for a flight past its lookup (the tag clock read before its load,
    /// its fill, renewal or release): in a lane of its own, ahead of the lookups that start
    /// flights. Behind them, the leaders of a burst over thousands of keys waited for as long
    /// as the burst's lookups took (on two cores shared by 32 processes, over 5 s), and their
    /// locks ran out: a second load of each such key.
    pub(super) async fn finish<T>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_in(self.in_flight.finishing(), Instant::now(), call)
            .await
    }

    async fn call_in<T>(
        self: &Arc<Self>,
        lane: &Semaphore,
        now: Instant,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Room first, so that a breaker opened meanwhile spares a call that waited for it.
        let (_sending, now) = store_timeout::send(lane, now).await;
        let trial = match self.admit() {
            Admit::Call => None,
            Admit::Probe => Some(Trial {
                breaker: self,
                reported: false,
            }),
            Admit::Skip => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::circuit_open());
            }
        };
        let timeout = self.timeout;
        let result = store_timeout::within(&self.answers, now, timeout, call)
            .await
            .unwrap_or_else(|| Err(StoreError::timeout(timeout)));
        if result.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
            self.meter.store_error();
        }
        match trial {
            Some(mut trial) => trial.report(result.is_ok()),
            None => {
                let recorded = self.record(result.is_ok(), now);
                if recorded.opened {
                    self.opened.fetch_add(1, Ordering::Relaxed);
                }
                if recorded.start_check {
                    self.check_while_failing();
                }
            }
        }
        result
    }

    /// From the first failed call of a spell until the store answers again, asks it every
    /// `open_for` whether it does (a read of a probe key, bounded by the store timeout): while
    /// the breaker is open, as its trial (unless a call's trial is under way); while it is
    /// closed, as a plain read. So the store's return is found out with or without traffic:
    /// the breaker closes, and what L1 kept while the store failed is dropped (see
    /// [`Breaker::recoveries`]). Without a runtime, calls alone find it out.
    fn check_while_failing(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let breaker = Arc::clone(self);
        runtime.spawn(async move {
            let open_for = breaker.open_for;
            loop {
                tokio::time::sleep(open_for).await;
                match breaker.check() {
                    Check::Done => return,
                    Check::Wait => continue,
                    Check::Ask => {
                        let asked = Instant::now();
                        let answered = breaker.probe_answered().await;
                        // A failed check is not a failed call: it neither opens the breaker
                        // nor counts in the stats.
                        if answered {
                            breaker.record(true, asked);
                        }
                    }
                    Check::Trial => {
                        let mut trial = Trial {
                            breaker: &breaker,
                            reported: false,
                        };
                        let answered = breaker.probe_answered().await;
                        trial.report(answered);
                    }
                }
            }
        });
    }
}

impl Breaker {
    /// Whether the store answers a read of the probe key within the store timeout.
    async fn probe_answered(&self) -> bool {
        let read = self.store.get(&self.probe_key);
        let answer = store_timeout::within(&self.answers, Instant::now(), self.timeout, read);
        matches!(answer.await, Some(Ok(_)))
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
mod tests;
