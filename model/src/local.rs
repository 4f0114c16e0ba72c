//! In-process coordination, as the code does it with its mutexes and `SeqCst` atomics (each
//! action is one atomic step: one atomic operation, or one critical section): the notifier's
//! watches (`src/store/notify.rs`), and the circuit breaker's single probe
//! (`src/cache/breaker.rs`).
//!
//! Tokio's `watch` channel is taken as a correct primitive (tokio checks it with loom): a
//! version number that a receiver compares with the one it last saw. The crate's tokio tasks
//! are not scheduled by the checker: these models check the algorithms the code implements,
//! step for step, not the compiled code (shuttle and loom cannot schedule tokio's timers,
//! which the breaker and the followers wait on).

use stateright::{Model, Property};

/// A deliberately broken variant, to show that the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFlaw {
    /// `Notifier::notify` wakes the registered watchers before it counts the notification.
    WakeBeforeCount,
    /// A `FillWatch` dropped removes its key's sender even while other watchers use it.
    DropRemovesShared,
}

/// Two followers of one key wait for its fill, which a filler makes and notifies; another
/// key of the same bucket is notified meanwhile (an early wake).
#[derive(Clone, Debug)]
pub struct WatchModel {
    /// A broken variant, or none.
    pub flaw: Option<WatchFlaw>,
}

/// A follower's place in `resolve_key`'s loop (`look_up`, then `wait_for_fill`, with no poll:
/// in-process notifications alone must wake it).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Follower {
    /// About to mark its watch seen (`FillWatch::mark_seen`).
    Mark,
    /// About to read the store.
    Read,
    /// `FillWatch::changed`, first wait: about to register (`Notifier::register`).
    Register,
    /// Registered: about to compare the bucket's count with the one it marked.
    Compare,
    /// Waiting on its receiver for a version past `seen`.
    Blocked,
    /// Answered; its watch is about to be dropped (`Drop for FillWatch`).
    Dropping,
    /// Done.
    Done,
}

/// A follower and its watch.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Watcher {
    /// Where it is.
    pub pc: Follower,
    /// The bucket count when marked seen (before registering).
    pub marked: u8,
    /// Its receiver, once registered: the channel generation it belongs to and the version
    /// it last saw.
    pub receiver: Option<(u8, u8)>,
}

/// The notifier's state, the store's, and the threads'.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct WatchState {
    /// The bucket's count (`Buckets`).
    pub sent: u8,
    /// The key's sender in the `watched` map: its generation (a new channel each time the
    /// key is registered afresh), its version, and its receivers.
    pub sender: Option<(u8, u8, u8)>,
    /// Generations used so far.
    pub generations: u8,
    /// Whether the store holds the fill.
    pub filled: bool,
    /// The filler: 0 fill, 1 and 2 its notification's two steps, 3 done.
    pub filler: u8,
    /// The other key's notification: 0 count, 1 done (nobody watches it).
    pub other: u8,
    /// The followers.
    pub followers: [Watcher; 2],
}

/// One atomic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchAction {
    /// A follower's step.
    Follower(usize),
    /// The filler's step.
    Filler,
    /// The other key's notification.
    Other,
}

impl WatchModel {
    /// `notify`'s count: `sent.fetch_add(1)`.
    fn count(state: &mut WatchState) {
        state.sent += 1;
    }

    /// `notify`'s wake: the sender, if the key is registered, moves its version on.
    fn wake(state: &mut WatchState) {
        if let Some((generation, version, receivers)) = state.sender {
            state.sender = Some((generation, version + 1, receivers));
        }
    }
}

impl Model for WatchModel {
    type State = WatchState;
    type Action = WatchAction;

    fn init_states(&self) -> Vec<WatchState> {
        let watcher = Watcher {
            pc: Follower::Mark,
            marked: 0,
            receiver: None,
        };
        vec![WatchState {
            sent: 0,
            sender: None,
            generations: 0,
            filled: false,
            filler: 0,
            other: 0,
            followers: [watcher; 2],
        }]
    }

    fn actions(&self, state: &WatchState, actions: &mut Vec<WatchAction>) {
        for (f, follower) in state.followers.iter().enumerate() {
            let blocked = follower.pc == Follower::Blocked
                && match (follower.receiver, state.sender) {
                    // Woken once the sender's version moves past the one it saw.
                    (Some((mine, seen)), Some((generation, version, _))) => {
                        mine != generation || version == seen
                    }
                    _ => true,
                };
            // A receiver whose sender is gone never wakes (`changed()` pends for good).
            let orphaned = follower.pc == Follower::Blocked
                && follower
                    .receiver
                    .is_some_and(|(mine, _)| state.sender.is_none_or(|(g, _, _)| g != mine));
            if follower.pc != Follower::Done && !blocked && !orphaned {
                actions.push(WatchAction::Follower(f));
            }
        }
        if state.filler < 3 {
            actions.push(WatchAction::Filler);
        }
        if state.other < 1 {
            actions.push(WatchAction::Other);
        }
    }

    fn next_state(&self, last: &WatchState, action: WatchAction) -> Option<WatchState> {
        let mut state = last.clone();
        match action {
            WatchAction::Follower(f) => {
                let me = state.followers[f];
                let next = match me.pc {
                    Follower::Mark => {
                        match (me.receiver, state.sender) {
                            // `borrow_and_update`.
                            (Some((mine, _)), Some((generation, version, _)))
                                if mine == generation =>
                            {
                                state.followers[f].receiver = Some((mine, version));
                            }
                            (Some(_), _) => {}
                            (None, _) => state.followers[f].marked = state.sent,
                        }
                        Follower::Read
                    }
                    Follower::Read if state.filled => Follower::Dropping,
                    Follower::Read if me.receiver.is_some() => Follower::Blocked,
                    Follower::Read => Follower::Register,
                    Follower::Register => {
                        // `register`: subscribe to the key's sender, or make one.
                        let (generation, version, receivers) = match state.sender {
                            Some(sender) => sender,
                            None => {
                                state.generations += 1;
                                (state.generations, 0, 0)
                            }
                        };
                        state.sender = Some((generation, version, receivers + 1));
                        state.followers[f].receiver = Some((generation, version));
                        Follower::Compare
                    }
                    // A count moved since the mark: wake at once.
                    Follower::Compare if state.sent != me.marked => Follower::Mark,
                    Follower::Compare => Follower::Blocked,
                    // Woken (`actions` only offers this step once the version moved).
                    Follower::Blocked => Follower::Mark,
                    Follower::Dropping => {
                        if let (Some((mine, _)), Some((generation, version, receivers))) =
                            (me.receiver, state.sender)
                        {
                            if mine == generation {
                                let last = receivers <= 1;
                                state.sender =
                                    if last || self.flaw == Some(WatchFlaw::DropRemovesShared) {
                                        None
                                    } else {
                                        Some((generation, version, receivers - 1))
                                    };
                            }
                        }
                        state.followers[f].receiver = None;
                        Follower::Done
                    }
                    Follower::Done => return None,
                };
                state.followers[f].pc = next;
            }
            WatchAction::Filler => {
                let wake_first = self.flaw == Some(WatchFlaw::WakeBeforeCount);
                match state.filler {
                    0 => state.filled = true,
                    1 if wake_first => Self::wake(&mut state),
                    1 => Self::count(&mut state),
                    2 if wake_first => Self::count(&mut state),
                    _ => Self::wake(&mut state),
                }
                state.filler += 1;
            }
            WatchAction::Other => {
                Self::count(&mut state);
                state.other += 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::eventually(
                "every follower is woken and answers",
                |_, s: &WatchState| s.followers.iter().all(|f| f.pc == Follower::Done),
            ),
            Property::sometimes("a follower blocks on its receiver", |_, s: &WatchState| {
                s.followers.iter().any(|f| f.pc == Follower::Blocked)
            }),
        ]
    }
}

/// A deliberately broken breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerFlaw {
    /// `admit` hands out a probe without marking one under way.
    ProbeNotMarked,
    /// A trial torn down before it reports (its task dropped) reports nothing (no `Drop for
    /// Trial`).
    DroppedTrialSilent,
}

/// Two callers make store calls through the breaker while the store is down, then back; the
/// timer task probes while the breaker is open.
#[derive(Clone, Debug)]
pub struct BreakerModel {
    /// Store calls each caller makes.
    pub calls: u8,
    /// A broken variant, or none.
    pub flaw: Option<BreakerFlaw>,
}

/// The breaker's state (`breaker::State`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Breaker {
    /// Closed, after this many failures in a row.
    Closed(u8),
    /// Open; `due`: `open_for` has passed; `probing`: a trial is under way.
    Open {
        /// `open_for` has passed.
        due: bool,
        /// A trial is under way.
        probing: bool,
    },
}

/// A caller's or the timer's place.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Caller {
    /// About to ask the breaker (`admit`).
    Admit,
    /// Calling the store; `trial`: as the breaker's trial. `hung`: the call never answers,
    /// so the store timeout ends it as a failure.
    Calling {
        /// Admitted as the trial.
        trial: bool,
        /// The call started while the store was down.
        hung: bool,
    },
    /// Done with its calls (a caller), or stopped (the timer, once the breaker closed).
    Done,
}

/// The breaker, the store, the callers and the timer.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct BreakerState {
    /// The breaker.
    pub breaker: Breaker,
    /// Whether the store answers.
    pub store_up: bool,
    /// The callers: where each is, and its calls left.
    pub callers: [(Caller, u8); 2],
    /// The timer task (`probe_while_open`), once started.
    pub timer: Option<Caller>,
    /// Times `open_for` may still pass while the store is down.
    pub ticks: u8,
}

/// One atomic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerAction {
    /// A caller's step.
    Caller(usize),
    /// A caller's task is torn down in the middle of its call.
    Drop(usize),
    /// The timer's step.
    Timer,
    /// `open_for` passes.
    Tick,
    /// The store answers again.
    Recover,
}

const THRESHOLD: u8 = 2;

impl BreakerModel {
    /// `Breaker::admit`.
    fn admit(&self, state: &mut BreakerState) -> Option<bool> {
        match &mut state.breaker {
            Breaker::Closed(_) => Some(false),
            Breaker::Open { due, probing } => {
                if *probing || !*due {
                    None
                } else {
                    *probing = self.flaw != Some(BreakerFlaw::ProbeNotMarked);
                    Some(true)
                }
            }
        }
    }

    /// `Breaker::record` of a call admitted while closed; `true` if it opened the breaker.
    fn record(state: &mut BreakerState, ok: bool) -> bool {
        if let Breaker::Closed(failures) = &mut state.breaker {
            if ok {
                *failures = 0;
            } else {
                *failures += 1;
                if *failures >= THRESHOLD {
                    state.breaker = Breaker::Open {
                        due: false,
                        probing: false,
                    };
                    return true;
                }
            }
        }
        false
    }

    /// `Breaker::probed`.
    fn probed(state: &mut BreakerState, ok: bool) {
        state.breaker = if ok {
            Breaker::Closed(0)
        } else {
            Breaker::Open {
                due: false,
                probing: false,
            }
        };
    }

    fn trials(state: &BreakerState) -> usize {
        state
            .callers
            .iter()
            .map(|(caller, _)| caller)
            .chain(state.timer.as_ref())
            .filter(|caller| matches!(caller, Caller::Calling { trial: true, .. }))
            .count()
    }
}

impl Model for BreakerModel {
    type State = BreakerState;
    type Action = BreakerAction;

    fn init_states(&self) -> Vec<BreakerState> {
        vec![BreakerState {
            breaker: Breaker::Closed(0),
            store_up: false,
            callers: [(Caller::Admit, self.calls); 2],
            timer: None,
            ticks: 2,
        }]
    }

    fn actions(&self, state: &BreakerState, actions: &mut Vec<BreakerAction>) {
        for (c, (caller, _)) in state.callers.iter().enumerate() {
            match caller {
                Caller::Done => {}
                Caller::Calling { .. } => {
                    actions.push(BreakerAction::Caller(c));
                    actions.push(BreakerAction::Drop(c));
                }
                Caller::Admit => actions.push(BreakerAction::Caller(c)),
            }
        }
        // The timer sleeps `open_for` between its looks: it looks once the breaker is due.
        // A look that would skip (a trial under way) changes nothing: it is left out.
        match (state.timer, state.breaker) {
            (
                Some(Caller::Admit),
                Breaker::Open {
                    due: true,
                    probing: false,
                }
                | Breaker::Closed(_),
            )
            | (Some(Caller::Calling { .. }), _) => actions.push(BreakerAction::Timer),
            _ => {}
        }
        if let Breaker::Open { due: false, .. } = state.breaker {
            // While the store is down `open_for` passes a bounded number of times; once it is
            // up, as often as it takes.
            if state.ticks > 0 || state.store_up {
                actions.push(BreakerAction::Tick);
            }
        }
        if !state.store_up {
            actions.push(BreakerAction::Recover);
        }
    }

    fn next_state(&self, last: &BreakerState, action: BreakerAction) -> Option<BreakerState> {
        let mut state = last.clone();
        match action {
            BreakerAction::Caller(c) => match state.callers[c].0 {
                Caller::Admit => match self.admit(&mut state) {
                    // `Admit::Skip`: in-process protection; the call is not made.
                    None => {
                        state.callers[c].1 -= 1;
                        if state.callers[c].1 == 0 {
                            state.callers[c].0 = Caller::Done;
                        }
                    }
                    Some(trial) => {
                        state.callers[c].0 = Caller::Calling {
                            trial,
                            hung: !state.store_up,
                        }
                    }
                },
                Caller::Calling { trial, hung } => {
                    // The call answers, or the store timeout ends it.
                    let ok = !hung;
                    if trial {
                        Self::probed(&mut state, ok);
                    } else if Self::record(&mut state, ok) && state.timer.is_none() {
                        state.timer = Some(Caller::Admit);
                    }
                    state.callers[c].1 -= 1;
                    state.callers[c].0 = if state.callers[c].1 == 0 {
                        Caller::Done
                    } else {
                        Caller::Admit
                    };
                }
                Caller::Done => return None,
            },
            BreakerAction::Drop(c) => {
                if let Caller::Calling { trial: true, .. } = state.callers[c].0 {
                    if self.flaw != Some(BreakerFlaw::DroppedTrialSilent) {
                        // `Drop for Trial`: an unfinished trial counts as failed.
                        Self::probed(&mut state, false);
                    }
                }
                state.callers[c] = (Caller::Done, 0);
            }
            BreakerAction::Timer => match state.timer {
                Some(Caller::Admit) => match self.admit(&mut state) {
                    Some(false) => state.timer = Some(Caller::Done),
                    // `Admit::Skip`: another trial is under way; sleep again.
                    None => {}
                    Some(true) => {
                        state.timer = Some(Caller::Calling {
                            trial: true,
                            hung: !state.store_up,
                        })
                    }
                },
                Some(Caller::Calling { hung, .. }) => {
                    Self::probed(&mut state, !hung);
                    state.timer = Some(if hung { Caller::Admit } else { Caller::Done });
                }
                _ => return None,
            },
            BreakerAction::Tick => {
                if !state.store_up {
                    state.ticks -= 1;
                }
                if let Breaker::Open { due, .. } = &mut state.breaker {
                    *due = true;
                }
            }
            BreakerAction::Recover => state.store_up = true,
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two probes at once", |_, s: &BreakerState| {
                BreakerModel::trials(s) <= 1
            }),
            Property::eventually(
                "once the store answers, the breaker closes",
                |_, s: &BreakerState| s.store_up && matches!(s.breaker, Breaker::Closed(_)),
            ),
            Property::sometimes("the breaker opens", |_, s: &BreakerState| {
                matches!(s.breaker, Breaker::Open { .. })
            }),
            Property::sometimes("a caller's call is the trial", |_, s: &BreakerState| {
                s.callers
                    .iter()
                    .any(|(c, _)| matches!(c, Caller::Calling { trial: true, .. }))
            }),
        ]
    }
}
