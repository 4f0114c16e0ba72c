//! In-process flights overtaken by a change (`src/cache/flight.rs`, `src/cache/correct.rs`):
//! callers of one key in one process share a flight from the map of flights; a change
//! (`invalidate`) detaches the flights it overtakes, before its store call and after it, so a
//! caller that comes after the change returns never joins a load from before it.
//!
//! Each action is one atomic step, as the code takes it: a caller's look at the map of flights
//! (one critical section: join the flight there, or insert its own), a flight's store call
//! (one script: a lookup that takes the lock, a fenced fill), its read of the backend, its
//! landing (leaving the map, if it is still its entry); the change's application write, its
//! detaching of flights (one critical section), its store call (the value removed, the lock
//! voided). L1 is left out: it is checked by the stamps of the notifier, not here.
//!
//! The change may also be made by another process ([`FlightsModel::elsewhere`]): this process
//! detaches nothing when it is made, but hears of it (a notification, after the store call);
//! a flight keeps what the process had heard when it started, and a caller that has heard
//! more does not join it (`src/cache/flights.rs`). There "after the change" means after this
//! process heard of it.

use stateright::{Model, Property};

/// A deliberately broken variant, to show that the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightsFlaw {
    /// A change leaves the map of flights alone (issue 29, defect 1).
    NoDetach,
    /// A change detaches flights before its store call only: a flight that started during
    /// the call (and read the old value) stays joinable.
    DetachBeforeOnly,
    /// A caller joins the key's flight whatever the process heard since it started (a change
    /// made elsewhere, heard, overtakes no flight).
    HeardNotChecked,
}

/// Callers of one key in one process, and one `invalidate` of it after the backend moved
/// from version 1 to version 2.
#[derive(Clone, Debug)]
pub struct FlightsModel {
    /// How many callers.
    pub callers: usize,
    /// A broken variant, or none.
    pub flaw: Option<FlightsFlaw>,
    /// Whether the change is made by another process, and heard of here.
    pub elsewhere: bool,
}

/// Where a caller is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Caller {
    /// Not called yet.
    Idle,
    /// Waiting on a flight (the one it started, or joined), and whether it called after the
    /// change had returned.
    On(u8, bool),
    /// Answered a version, and whether it called after the change had returned.
    Answered(u8, bool),
}

/// Where a flight is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Flight {
    /// About to look the key up (again, as a follower).
    Lookup,
    /// The leader, about to read the backend.
    Load,
    /// Read this version, about to fill it (fenced).
    Fill(u8),
    /// Ended with this answer, still in the map until it lands.
    Landing(u8),
    /// Landed with this answer.
    Landed(u8),
}

/// Where the change is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Change {
    /// The application's write to the backend: version 2.
    Write,
    /// Detach the flights, before the store call.
    DetachBefore,
    /// The store call: remove the value, void the lock.
    Invalidate,
    /// Detach the flights, after the store call.
    DetachAfter,
    /// Returned.
    Returned,
}

/// The store's key, the backend, the process's map of flights, the flights and the callers.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct FlightsState {
    /// The backend's version.
    pub backend: u8,
    /// The stored value's version, if any.
    pub value: Option<u8>,
    /// The flight holding the key's lock, if any.
    pub lock: Option<u8>,
    /// The flight in the map of flights for the key, if any.
    pub map: Option<u8>,
    /// The flights started so far, by id.
    pub flights: Vec<Flight>,
    /// The callers.
    pub callers: Vec<Caller>,
    /// The change.
    pub change: Change,
    /// How many changes this process has heard of.
    pub heard: u8,
    /// What the process had heard when each flight started, by id.
    pub since: Vec<u8>,
}

/// One atomic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightsAction {
    /// A caller calls: joins the flight in the map, or starts one.
    Call(usize),
    /// A caller takes its flight's answer.
    Answer(usize),
    /// A flight's step.
    Flight(u8),
    /// The change's step.
    Change,
}

impl FlightsModel {
    /// The version a caller that called after the change returned must answer.
    const NEW: u8 = 2;
}

impl Model for FlightsModel {
    type State = FlightsState;
    type Action = FlightsAction;

    fn init_states(&self) -> Vec<FlightsState> {
        vec![FlightsState {
            backend: 1,
            value: None,
            lock: None,
            map: None,
            flights: Vec::new(),
            callers: vec![Caller::Idle; self.callers],
            change: Change::Write,
            heard: 0,
            since: Vec::new(),
        }]
    }

    fn actions(&self, state: &FlightsState, actions: &mut Vec<FlightsAction>) {
        for (c, caller) in state.callers.iter().enumerate() {
            match caller {
                Caller::Idle => actions.push(FlightsAction::Call(c)),
                Caller::On(f, _) => {
                    if matches!(
                        state.flights[usize::from(*f)],
                        Flight::Landing(_) | Flight::Landed(_)
                    ) {
                        actions.push(FlightsAction::Answer(c));
                    }
                }
                Caller::Answered(..) => {}
            }
        }
        for (f, flight) in state.flights.iter().enumerate() {
            if !matches!(flight, Flight::Landed(_)) {
                actions.push(FlightsAction::Flight(f as u8));
            }
        }
        if state.change != Change::Returned {
            actions.push(FlightsAction::Change);
        }
    }

    fn next_state(&self, last: &FlightsState, action: FlightsAction) -> Option<FlightsState> {
        let mut state = last.clone();
        match action {
            FlightsAction::Call(c) => {
                let after = state.change == Change::Returned;
                let joinable = |flight: u8| {
                    state.since[usize::from(flight)] == state.heard
                        || self.flaw == Some(FlightsFlaw::HeardNotChecked)
                };
                let flight = match state.map {
                    Some(flight) if joinable(flight) => flight,
                    // None, or one from before a change heard since: detached, replaced.
                    _ => {
                        let flight = state.flights.len() as u8;
                        state.flights.push(Flight::Lookup);
                        state.since.push(state.heard);
                        state.map = Some(flight);
                        flight
                    }
                };
                state.callers[c] = Caller::On(flight, after);
            }
            FlightsAction::Answer(c) => {
                let Caller::On(f, after) = state.callers[c] else {
                    return None;
                };
                let (Flight::Landing(answer) | Flight::Landed(answer)) =
                    state.flights[usize::from(f)]
                else {
                    return None;
                };
                state.callers[c] = Caller::Answered(answer, after);
            }
            FlightsAction::Flight(f) => {
                let i = usize::from(f);
                state.flights[i] = match state.flights[i] {
                    // One lookup: a value is a hit; else the lock, if free; else follow.
                    Flight::Lookup => match (state.value, state.lock) {
                        (Some(version), _) => Flight::Landing(version),
                        (None, None) => {
                            state.lock = Some(f);
                            Flight::Load
                        }
                        (None, Some(_)) => Flight::Lookup,
                    },
                    Flight::Load => Flight::Fill(state.backend),
                    // Fenced: stored only while the lock is ours; answered either way.
                    Flight::Fill(version) => {
                        if state.lock == Some(f) {
                            state.value = Some(version);
                            state.lock = None;
                        }
                        Flight::Landing(version)
                    }
                    // `Landing`: leaves the map only if it is still its entry.
                    Flight::Landing(version) => {
                        if state.map == Some(f) {
                            state.map = None;
                        }
                        Flight::Landed(version)
                    }
                    Flight::Landed(_) => return None,
                };
            }
            FlightsAction::Change => {
                // A change made elsewhere detaches nothing here when it is made.
                let local = !self.elsewhere;
                let detach = |state: &mut FlightsState| {
                    if local {
                        state.map = None;
                    }
                };
                state.change = match state.change {
                    Change::Write => {
                        state.backend = Self::NEW;
                        Change::DetachBefore
                    }
                    Change::DetachBefore => {
                        if self.flaw.is_none() {
                            detach(&mut state);
                        }
                        Change::Invalidate
                    }
                    Change::Invalidate => {
                        state.value = None;
                        state.lock = None;
                        Change::DetachAfter
                    }
                    Change::DetachAfter => {
                        if self.flaw.is_none() {
                            detach(&mut state);
                        }
                        if self.elsewhere {
                            // The notification, sent by the store call, arrives.
                            state.heard += 1;
                        }
                        Change::Returned
                    }
                    Change::Returned => return None,
                };
                if self.flaw == Some(FlightsFlaw::DetachBeforeOnly)
                    && last.change == Change::DetachBefore
                {
                    detach(&mut state);
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a caller after the change never answers an older version",
                |_, s: &FlightsState| {
                    s.callers.iter().all(|caller| match caller {
                        Caller::Answered(version, true) => *version >= Self::NEW,
                        _ => true,
                    })
                },
            ),
            Property::sometimes(
                "a caller after the change answers while a flight from before it runs",
                |_, s: &FlightsState| {
                    s.callers
                        .iter()
                        .any(|caller| matches!(caller, Caller::Answered(_, true)))
                        && s.flights
                            .iter()
                            .any(|flight| matches!(flight, Flight::Load | Flight::Fill(1)))
                },
            ),
            Property::sometimes(
                "a caller before the change answers the old version",
                |_, s: &FlightsState| {
                    s.callers
                        .iter()
                        .any(|caller| matches!(caller, Caller::Answered(1, false)))
                },
            ),
        ]
    }
}
