//! The store protocol of `RedisStore` (and `MemoryStore`, which has its semantics): P processes
//! look one key up, lead, fill, release, fail, answer their waiters and follow, against one
//! value, one lock slot and one waiters' slot, with every fault the protocol must survive.
//!
//! Each action stands for one Redis round trip, atomic as Redis runs it: a Lua script in
//! `src/store/redis/scripts.rs` or one command of the lookup pipeline in
//! `src/store/redis/store.rs` (a pipeline is not atomic: other clients' commands may run
//! between its `SET … NX GET` and its `GET`, so the model takes them as two steps). The engine
//! side follows `src/cache/follower.rs` (`resolve_key`), `leader.rs` (`lead`) and `refresh.rs`.
//!
//! Time is not counted: every TTL may run out at any moment (a lock's between any two steps,
//! however its leader's watchdog renews it, which covers a process paused past its lock's TTL:
//! the lock lapses, any lookup may take it, and until one does its holder may still fill; then
//! the lapsed lock's key itself;
//! a value's freshness, then the value itself; a failure marker). A follower's wait is a
//! bounded number of polls (its `wait_timeout`), and each notification may be lost.
//!
//! What the model leaves out: the tag clock (tags), `put` (the `LoadAndCache` policy, fenced
//! by load starts rather than by the lock, issue 16 #6), corrupt entries (`LockWhen::Always`),
//! the stale window (serving a stale value decides nothing about the lock), the age of a
//! waiters' answer (a follower takes any answer it finds; the code takes one written since it
//! began to wait), and the value's `GET` and `PTTL` are read in one step.

use std::fmt;

use stateright::{Model, Property, Representative};

/// A deliberately broken protocol, to show that the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// `FILL` writes without checking that the lock holds its token.
    UnfencedFill,
    /// `INVALIDATE` removes the value but leaves a lock that lapsed in place (as if only a
    /// held lock were voided), so its holder still fills after the invalidation.
    InvalidateSparesLapsedLock,
    /// `RELEASE` (and `REPAIR`, which shares its compare-and-release) unlocks whatever the
    /// lock holds.
    ReleaseIgnoresToken,
    /// A follower's wait has no poll and no timer: only a notification ends it.
    NoPoll,
    /// `ANSWER` writes the waiters' answer in the value's place (as `FILL` would), so the
    /// value kept for revalidation is gone.
    AnswerReplacesValue,
}

/// The model's bounds.
#[derive(Clone, Debug)]
pub struct StoreModel {
    /// How many processes share the store (at most 8).
    pub processes: usize,
    /// How many flights (lookups of the key) each process makes, one after the other (at
    /// most 8).
    pub flights: u8,
    /// How many polls a follower makes before its wait times out.
    pub polls: u8,
    /// Whether a flight may be an early refresh (speculative, `LockWhen::Early`).
    pub early_refresh: bool,
    /// How many invalidations (`INVALIDATE`) and writes (`SET`) may happen, each.
    pub invalidations: u8,
    /// How many times Redis may restart empty.
    pub restarts: u8,
    /// A broken protocol, or none.
    pub flaw: Option<Flaw>,
}

/// A lock token: one per flight (`LockToken::random()` in `resolve_key`), `process * 8 + flight`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Token(u8);

impl Token {
    fn bit(self) -> u64 {
        1 << self.0
    }
}

/// What the lock key holds (`src/store/redis/mod.rs`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lock {
    /// Nothing: a lookup may take the lock.
    Free,
    /// `fresh`: the value is fresh; `SET … NX` fails on it.
    Fresh,
    /// `<token>:<bound>:<kept>`: a leader's lock.
    Held(Token),
    /// A leader's lock whose TTL ran out while nobody took it: the lookup script takes it as
    /// free, and its holder's fenced scripts still take it as held (`owns`).
    Lapsed(Token),
    /// `failed`: the last load failed.
    Failed,
}

/// The value key (who wrote it matters to no property: the fill's ghosts judge it as it
/// lands).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Value {
    /// Whether its remaining life is above the stale period.
    pub fresh: bool,
}

/// What a flight is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A caller's miss (`resolve_key`).
    Request,
    /// An early refresh of a value still fresh (`refresh`): speculative, nobody waits for it.
    Refresh,
}

/// Where a process is in its flight.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pc {
    /// Between flights.
    Idle,
    /// About to send the lookup pipeline (its watch marked seen first).
    Taking,
    /// Sent `SET lock token NX PX … GET`, which found `held` (`None`: the lock is now ours);
    /// about to read the value (`GET`, `PTTL`).
    Reading {
        /// What the `SET … NX GET` found.
        held: Option<Lock>,
    },
    /// About to run the `LOOKUP` script.
    Scripting,
    /// Took the lock of a fresh value: about to put the marker back (`REPAIR`).
    Repairing,
    /// A leader loading.
    Loading {
        /// Ghost: an invalidation (or `SET`) completed since the load started.
        outdated: bool,
        /// The lookup that made it leader found a value (stale): kept for revalidation, so a
        /// result for the waiters only goes beside it (`ANSWER`), not in its place.
        kept: bool,
    },
    /// A follower that waited took the lock of a value still stale: about to read the
    /// waiters' key (`Store::waiters_answer`) before it loads.
    ReadingAnswer,
    /// A follower waiting for a notification or its poll.
    Waiting,
}

/// One process's flight.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Proc {
    /// Where it is.
    pub pc: Pc,
    /// What the current flight is.
    pub kind: Kind,
    /// Flights started so far.
    pub started: u8,
    /// Polls left before the wait times out.
    pub polls: u8,
    /// A "filled" notification arrived since the watch was marked seen.
    pub heard: bool,
    /// The flight has waited for another leader.
    pub followed: bool,
}

/// The whole system, with ghost variables that record what the properties judge.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The value key.
    pub value: Option<Value>,
    /// The lock key.
    pub lock: Lock,
    /// The waiters' key holds a load's answer for its waiters (`ANSWER`).
    pub answer: bool,
    /// The processes.
    pub procs: Vec<Proc>,
    /// Invalidations left.
    pub invalidations: u8,
    /// `SET`s left.
    pub sets: u8,
    /// Restarts left.
    pub restarts: u8,
    /// Ghost: the tokens whose lock was taken by another, expired for good, or was voided (by
    /// an invalidation, a `SET` or a restart), as bits; forgotten when their flight ends. A
    /// lock that lapsed while nobody took it is not dead.
    pub dead: u64,
    /// Ghost: a fill landed from a dead token.
    pub dead_fill: bool,
    /// Ghost: a fill landed from a lock that had lapsed.
    pub lapsed_fill: bool,
    /// Ghost: a fill landed from a load that started before a completed invalidation.
    pub old_fill: bool,
    /// Ghost: an answer for the waiters took the place of the value it found kept.
    pub kept_lost: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A process starts a flight of this kind.
    Start(usize, Kind),
    /// The lookup pipeline's `SET lock token NX PX … GET`.
    Take(usize),
    /// The lookup pipeline's `GET value`, `PTTL value`; for an early refresh, `true` if the
    /// value's remaining life is within the refresh's bound.
    Read(usize, bool),
    /// The `LOOKUP` script (same bound).
    Script(usize, bool),
    /// `REPAIR` of the lock just taken, to put the `fresh` marker back.
    Repair(usize),
    /// The load succeeds: `FILL`.
    Fill(usize),
    /// The load's result is for its waiters only, and the value it found is kept: `ANSWER`
    /// (the result in the waiters' key, the value untouched, the lock freed as `RELEASE`
    /// frees it, publish).
    Answer(usize),
    /// The follower reads the waiters' key: with an answer there, it takes it and frees the
    /// lock it just took (`RELEASE`); else it leads.
    ReadAnswer(usize),
    /// The waiters' key's TTL runs out.
    AnswerExpires,
    /// The load fails: `FAIL` (a request) or `RELEASE` (a speculative refresh).
    LoadFails(usize),
    /// A notification wakes the waiting follower.
    Notified(usize),
    /// The follower's poll.
    Poll(usize),
    /// A process's subscriber loses a notification.
    LoseNotification(usize),
    /// The lock's TTL runs out (it lapses), or the key of a lapsed lock (or a failure marker)
    /// expires.
    LockExpires,
    /// The value's freshness ends (its `fresh` marker expires with it).
    FreshnessEnds,
    /// The value's TTL runs out.
    ValueExpires,
    /// `Store::invalidate` (the `INVALIDATE` script).
    Invalidate,
    /// `Store::set` (the `SET` script).
    Set,
    /// Redis restarts empty.
    Restart,
}

impl StoreModel {
    /// The protocol as the code has it, with `processes` processes and every fault.
    pub fn new(processes: usize) -> Self {
        StoreModel {
            processes,
            flights: 1,
            polls: 2,
            early_refresh: true,
            invalidations: 1,
            restarts: 1,
            flaw: None,
        }
    }

    fn token(p: usize, started: u8) -> Token {
        // `processes` and `flights` are at most 8: tokens fit a u64 of bits.
        Token((p as u8) * 8 + started.saturating_sub(1))
    }

    /// Whether the lock of process `p`'s current flight expired or was voided.
    fn dead(state: &State, p: usize) -> bool {
        state.dead & Self::own(state, p).bit() != 0
    }

    /// The token of process `p`'s current flight.
    fn own(state: &State, p: usize) -> Token {
        Self::token(p, state.procs[p].started)
    }

    fn flawed(&self, flaw: Flaw) -> bool {
        self.flaw == Some(flaw)
    }

    /// The lock goes away other than by its owner's own script: its token is dead.
    fn void_lock(state: &mut State) {
        if let Lock::Held(t) | Lock::Lapsed(t) = state.lock {
            state.dead |= t.bit();
        }
        state.lock = Lock::Free;
    }

    /// An invalidation completed: every load running now is older than it.
    fn outdate_loads(state: &mut State) {
        for proc in &mut state.procs {
            if let Pc::Loading { outdated, .. } = &mut proc.pc {
                *outdated = true;
            }
        }
    }

    /// `PUBLISH` of "filled": every process's subscriber hears it (unless lost later).
    fn publish(state: &mut State) {
        for proc in &mut state.procs {
            // Between flights a process watches nothing.
            proc.heard = proc.pc != Pc::Idle;
        }
    }

    /// The `owns` check of the fenced scripts (`LOCK_FUNCTIONS`).
    fn owns(&self, state: &State, t: Token) -> bool {
        matches!(state.lock, Lock::Held(held) | Lock::Lapsed(held) if held == t)
    }

    /// `RELEASE`'s compare-and-release (which `REPAIR` shares) by process `p`'s token: the
    /// lock goes as `unlock` lets it go; returns whether it did.
    fn release(&self, state: &mut State, p: usize) -> bool {
        let me = Self::own(state, p);
        let releases = if self.flawed(Flaw::ReleaseIgnoresToken) {
            state.lock != Lock::Free
        } else {
            self.owns(state, me)
        };
        if releases {
            Self::unlock(state);
        }
        releases
    }

    /// `unlock`: the `fresh` marker while the value is fresh, else nothing.
    fn unlock(state: &mut State) {
        state.lock = match state.value {
            Some(Value { fresh: true, .. }) => Lock::Fresh,
            _ => Lock::Free,
        };
    }

    /// The flight ends with an answer.
    fn answer(state: &mut State, p: usize) {
        let me = Self::own(state, p);
        state.dead &= !me.bit();
        // Between flights only the count of flights matters.
        let proc = &mut state.procs[p];
        proc.pc = Pc::Idle;
        proc.kind = Kind::Request;
        proc.polls = 0;
        proc.heard = false;
        proc.followed = false;
    }

    /// The flight took the lock: a request that waited, finding the value still stale, reads
    /// the waiters' key first (`resolve_key`); otherwise the load starts, the value it found
    /// kept.
    fn lead(state: &mut State, p: usize) {
        let proc = &mut state.procs[p];
        let stale = state.value.is_some_and(|v| !v.fresh);
        proc.pc = if proc.followed && proc.kind == Kind::Request && stale {
            Pc::ReadingAnswer
        } else {
            Pc::Loading {
                outdated: false,
                kept: state.value.is_some(),
            }
        };
    }

    /// Another leader holds the lock: a request waits (or times out, after its last poll); a
    /// refresh follows while it has a value to keep, else gives up.
    fn follow(&self, state: &mut State, p: usize, had_value: bool) {
        let proc = &mut state.procs[p];
        match proc.kind {
            Kind::Refresh if !had_value => {}
            // `waited >= wait_timeout`: the policy (by default, load uncached).
            _ if proc.polls == 0 && !self.flawed(Flaw::NoPoll) => {}
            _ => {
                proc.pc = Pc::Waiting;
                proc.followed = true;
                return;
            }
        }
        Self::answer(state, p);
    }

    /// Whether a value read is fresh for this lookup: a request's bound is the stale period;
    /// an early refresh's is longer (`in_window`: the value's life is below it).
    fn fresh_for(kind: Kind, value: Option<Value>, in_window: bool) -> bool {
        value.is_some_and(|v| v.fresh) && !(kind == Kind::Refresh && in_window)
    }
}

impl Model for StoreModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Proc {
            pc: Pc::Idle,
            kind: Kind::Request,
            started: 0,
            polls: 0,
            heard: false,
            followed: false,
        };
        // Cold (no value) or warm (a fresh value whose marker stands).
        [
            (None, Lock::Free),
            (Some(Value { fresh: true }), Lock::Fresh),
        ]
        .into_iter()
        .map(|(value, lock)| State {
            value,
            lock,
            answer: false,
            procs: vec![idle; self.processes],
            invalidations: self.invalidations,
            sets: self.invalidations,
            restarts: self.restarts,
            dead: 0,
            dead_fill: false,
            lapsed_fill: false,
            old_fill: false,
            kept_lost: false,
        })
        .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (p, proc) in state.procs.iter().enumerate() {
            let refresh = proc.kind == Kind::Refresh;
            match proc.pc {
                Pc::Idle if proc.started < self.flights => {
                    actions.push(Action::Start(p, Kind::Request));
                    if self.early_refresh {
                        actions.push(Action::Start(p, Kind::Refresh));
                    }
                }
                Pc::Idle => {}
                Pc::Taking => actions.push(Action::Take(p)),
                Pc::Reading { .. } => {
                    actions.push(Action::Read(p, false));
                    if refresh {
                        actions.push(Action::Read(p, true));
                    }
                }
                Pc::Scripting => {
                    actions.push(Action::Script(p, false));
                    if refresh {
                        actions.push(Action::Script(p, true));
                    }
                }
                Pc::Repairing => actions.push(Action::Repair(p)),
                Pc::Loading { kept, .. } => {
                    actions.push(Action::Fill(p));
                    actions.push(Action::LoadFails(p));
                    if kept && !refresh {
                        actions.push(Action::Answer(p));
                    }
                }
                Pc::ReadingAnswer => actions.push(Action::ReadAnswer(p)),
                Pc::Waiting => {
                    if proc.heard {
                        actions.push(Action::Notified(p));
                    }
                    if proc.polls > 0 && !self.flawed(Flaw::NoPoll) {
                        actions.push(Action::Poll(p));
                    }
                }
            }
            if proc.heard && proc.pc != Pc::Idle {
                actions.push(Action::LoseNotification(p));
            }
        }
        if matches!(state.lock, Lock::Held(_) | Lock::Lapsed(_) | Lock::Failed) {
            actions.push(Action::LockExpires);
        }
        if state.answer {
            actions.push(Action::AnswerExpires);
        }
        match state.value {
            Some(Value { fresh: true, .. }) => actions.push(Action::FreshnessEnds),
            Some(Value { fresh: false, .. }) => actions.push(Action::ValueExpires),
            None => {}
        }
        if state.invalidations > 0 {
            actions.push(Action::Invalidate);
        }
        if state.sets > 0 {
            actions.push(Action::Set);
        }
        if state.restarts > 0 {
            actions.push(Action::Restart);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Start(p, kind) => {
                let proc = &mut state.procs[p];
                proc.kind = kind;
                proc.started += 1;
                proc.polls = self.polls;
                proc.pc = Pc::Taking;
            }
            Action::Take(p) => {
                // `look_up` marks the watch seen, then the pipeline's `SET lock token NX PX GET`.
                state.procs[p].heard = false;
                let held = if state.lock == Lock::Free {
                    state.lock = Lock::Held(Self::own(&state, p));
                    None
                } else {
                    Some(state.lock)
                };
                state.procs[p].pc = Pc::Reading { held };
            }
            Action::Read(p, in_window) => {
                // `GET value`, `PTTL value`, then `RedisStore::lookup`'s match on what the
                // `SET` found, then `resolve_key` (or `refresh`) on the lookup's answer.
                let Pc::Reading { held } = state.procs[p].pc else {
                    return None;
                };
                let kind = state.procs[p].kind;
                let fresh = Self::fresh_for(kind, state.value, in_window);
                match held {
                    None if fresh => state.procs[p].pc = Pc::Repairing,
                    _ if fresh => Self::answer(&mut state, p),
                    None => Self::lead(&mut state, p),
                    Some(Lock::Fresh) => state.procs[p].pc = Pc::Scripting,
                    // `LockState::Failed`: `RecentFailure` (or stale-if-error).
                    Some(Lock::Failed) => Self::answer(&mut state, p),
                    // `is_lock`: held elsewhere (a token of ours would be taken again, but
                    // the pipeline cannot find one: a flight never looks up again once it
                    // took the lock).
                    // Another leader's lock of this release (`may_lapse`): the script weighs
                    // whether it lapsed.
                    Some(Lock::Held(_) | Lock::Lapsed(_)) => state.procs[p].pc = Pc::Scripting,
                    Some(Lock::Free) => {
                        let had_value = state.value.is_some();
                        self.follow(&mut state, p, had_value);
                    }
                }
            }
            Action::Script(p, in_window) => {
                // `LOOKUP`.
                let me = Self::own(&state, p);
                let kind = state.procs[p].kind;
                if Self::fresh_for(kind, state.value, in_window) {
                    Self::answer(&mut state, p);
                } else {
                    match state.lock {
                        Lock::Failed => Self::answer(&mut state, p),
                        Lock::Free | Lock::Fresh => {
                            state.lock = Lock::Held(me);
                            Self::lead(&mut state, p);
                        }
                        // Lapsed: taken as free (its holder's fill is refused from now on).
                        Lock::Lapsed(t) => {
                            if t != me {
                                state.dead |= t.bit();
                            }
                            state.lock = Lock::Held(me);
                            Self::lead(&mut state, p);
                        }
                        Lock::Held(t) if t == me => Self::lead(&mut state, p),
                        Lock::Held(_) => {
                            let had_value = state.value.is_some();
                            self.follow(&mut state, p, had_value);
                        }
                    }
                }
            }
            Action::Repair(p) => {
                // `REPAIR` with our token: `RELEASE`'s compare-and-release, without a
                // publish (nothing changed); whatever it answers, the hit is the answer.
                self.release(&mut state, p);
                Self::answer(&mut state, p);
            }
            Action::Fill(p) => {
                // `FILL`: fenced write, `fresh` marker, publish.
                let Pc::Loading { outdated, .. } = state.procs[p].pc else {
                    return None;
                };
                let me = Self::own(&state, p);
                if self.owns(&state, me) || self.flawed(Flaw::UnfencedFill) {
                    state.lapsed_fill |= state.lock == Lock::Lapsed(me);
                    state.value = Some(Value { fresh: true });
                    state.lock = Lock::Fresh;
                    Self::publish(&mut state);
                    state.dead_fill |= state.dead & me.bit() != 0;
                    state.old_fill |= outdated;
                }
                Self::answer(&mut state, p);
            }
            Action::Answer(p) => {
                // `ANSWER`: fenced like `FILL`; the value stays, the lock goes as `RELEASE`
                // lets it go.
                let me = Self::own(&state, p);
                if self.owns(&state, me) {
                    state.answer = true;
                    let kept = state.value.is_some();
                    if self.flawed(Flaw::AnswerReplacesValue) {
                        state.value = None;
                    }
                    state.kept_lost |= kept && state.value.is_none();
                    Self::unlock(&mut state);
                    Self::publish(&mut state);
                }
                Self::answer(&mut state, p);
            }
            Action::ReadAnswer(p) => {
                if state.answer {
                    // The answer is the flight's; its lock is released (`RELEASE`, token
                    // checked), which publishes.
                    if self.release(&mut state, p) {
                        Self::publish(&mut state);
                    }
                    Self::answer(&mut state, p);
                } else {
                    state.procs[p].pc = Pc::Loading {
                        outdated: false,
                        kept: state.value.is_some(),
                    };
                }
            }
            Action::AnswerExpires => state.answer = false,
            Action::LoadFails(p) => {
                let me = Self::own(&state, p);
                match state.procs[p].kind {
                    // `FAIL`: the failure marker in place of our lock.
                    Kind::Request if self.owns(&state, me) => {
                        state.lock = Lock::Failed;
                        Self::publish(&mut state);
                    }
                    Kind::Request => {}
                    // A speculative refresh only releases (`RELEASE`).
                    Kind::Refresh => {
                        if self.release(&mut state, p) {
                            Self::publish(&mut state);
                        }
                    }
                }
                Self::answer(&mut state, p);
            }
            Action::Notified(p) => {
                state.procs[p].pc = Pc::Taking;
            }
            Action::Poll(p) => {
                state.procs[p].polls -= 1;
                state.procs[p].pc = Pc::Taking;
            }
            Action::LoseNotification(p) => {
                state.procs[p].heard = false;
            }
            Action::LockExpires => match state.lock {
                // The hold ends; the key stays, for its holder, until someone takes it.
                Lock::Held(t) => state.lock = Lock::Lapsed(t),
                _ => Self::void_lock(&mut state),
            },
            Action::FreshnessEnds => {
                // The marker's TTL is the value's life less the stale period: both end at once.
                if let Some(value) = &mut state.value {
                    value.fresh = false;
                }
                if state.lock == Lock::Fresh {
                    state.lock = Lock::Free;
                }
            }
            Action::ValueExpires => state.value = None,
            Action::Invalidate => {
                // `INVALIDATE`: `DEL value lock`, publish.
                state.invalidations -= 1;
                state.value = None;
                let spared = matches!(state.lock, Lock::Lapsed(_))
                    && self.flawed(Flaw::InvalidateSparesLapsedLock);
                if !spared {
                    Self::void_lock(&mut state);
                }
                Self::publish(&mut state);
                Self::outdate_loads(&mut state);
            }
            Action::Set => {
                // `SET`: the value, the `fresh` marker in place of any lock, publish.
                state.sets -= 1;
                state.value = Some(Value { fresh: true });
                Self::void_lock(&mut state);
                state.lock = Lock::Fresh;
                Self::publish(&mut state);
                Self::outdate_loads(&mut state);
            }
            Action::Restart => {
                // Everything is gone; subscribers reconnect (no message: followers poll).
                state.restarts -= 1;
                state.value = None;
                state.answer = false;
                Self::void_lock(&mut state);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a fill lands only under a lock nobody took or voided since",
                |_, s: &State| !s.dead_fill,
            ),
            Property::always(
                "while a lock lives, no second load starts",
                |_, s: &State| {
                    let loading = |p: &usize| matches!(s.procs[*p].pc, Pc::Loading { .. });
                    let live = (0..s.procs.len())
                        .filter(loading)
                        .filter(|p| !StoreModel::dead(s, *p))
                        .count();
                    live <= 1
                },
            ),
            Property::always(
                "no fill from a load older than a completed invalidation lands",
                |_, s: &State| !s.old_fill,
            ),
            Property::always(
                "an answer for the waiters leaves the value it found",
                |_, s: &State| !s.kept_lost,
            ),
            Property::always(
                "the fresh marker stands only on a fresh value",
                |_, s: &State| s.lock != Lock::Fresh || s.value.is_some_and(|v| v.fresh),
            ),
            Property::eventually("every flight answers", |m: &StoreModel, s: &State| {
                s.procs
                    .iter()
                    .all(|proc| proc.pc == Pc::Idle && proc.started == m.flights)
            }),
            Property::sometimes("a leader loads on after its lock died", |_, s: &State| {
                (0..s.procs.len())
                    .any(|p| matches!(s.procs[p].pc, Pc::Loading { .. }) && StoreModel::dead(s, p))
            }),
            Property::sometimes(
                "a fill lands from a lock that lapsed while nobody took it",
                |_, s: &State| s.lapsed_fill,
            ),
            Property::sometimes("two leaders load at once", |_, s: &State| {
                s.procs
                    .iter()
                    .filter(|proc| matches!(proc.pc, Pc::Loading { .. }))
                    .count()
                    >= 2
            }),
            Property::sometimes("a load outlives an invalidation", |_, s: &State| {
                s.procs
                    .iter()
                    .any(|proc| matches!(proc.pc, Pc::Loading { outdated: true, .. }))
            }),
            Property::sometimes("a follower makes its last lookup", |_, s: &State| {
                s.procs
                    .iter()
                    .any(|proc| proc.pc == Pc::Taking && proc.polls == 0 && proc.started > 0)
            }),
            Property::sometimes("a hit puts the fresh marker back", |_, s: &State| {
                s.procs.iter().any(|proc| proc.pc == Pc::Repairing)
            }),
            Property::sometimes(
                "a waiter finds the answer beside the kept value",
                |_, s: &State| {
                    s.answer
                        && s.value.is_some()
                        && s.procs.iter().any(|proc| proc.pc == Pc::ReadingAnswer)
                },
            ),
        ]
    }
}

impl Representative for State {
    /// Processes are interchangeable: the representative sorts them (with how their token
    /// stands towards the lock), renaming the tokens to match.
    fn representative(&self) -> Self {
        let key = |p: usize| {
            let proc = self.procs[p];
            let own = StoreModel::own(self, p);
            let mine = proc.pc != Pc::Idle
                && matches!(self.lock, Lock::Held(t) | Lock::Lapsed(t) if t == own);
            let dead = proc.pc != Pc::Idle && StoreModel::dead(self, p);
            (proc, mine, dead)
        };
        let mut order: Vec<usize> = (0..self.procs.len()).collect();
        order.sort_by_key(|p| key(*p));
        let rename = |t: Token| {
            let (p, flight) = (usize::from(t.0 / 8), t.0 % 8);
            let to = order.iter().position(|q| *q == p).unwrap_or(p);
            Token(to as u8 * 8 + flight)
        };
        let mut state = self.clone();
        state.procs = order.iter().map(|p| self.procs[*p]).collect();
        match self.lock {
            Lock::Held(t) => state.lock = Lock::Held(rename(t)),
            Lock::Lapsed(t) => state.lock = Lock::Lapsed(rename(t)),
            _ => {}
        }
        state.dead = (0..64u8)
            .filter(|bit| self.dead & (1 << bit) != 0)
            .fold(0, |dead, bit| dead | rename(Token(bit)).bit());
        state
    }
}

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
