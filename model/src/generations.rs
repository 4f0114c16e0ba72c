//! Generations and batches' locks: P processes share a namespace of two keys; each may run
//! batches over both keys (`src/cache/protocol/batch.rs`), write a key (`Cache::set`,
//! `src/cache/changes.rs`) and clear the namespace (`Cache::clear`, the `CLEAR` script).
//!
//! A clear starts a new generation in the store (atomic, as the script is) and is heard by
//! every other process later (its pub/sub message, or a loss of notifications, which counts
//! the same: the process forgets the generation it kept). Every value the engine writes
//! carries the generation it read before the write (a set) or before the load (a batch's
//! fills): the one its process keeps (`KnownTags::first_clock`), read from the store only
//! where it keeps none. A read checks a value against the generation its process keeps, or
//! the store's where it keeps none (`Inner::check_tags`): a value of another generation is a
//! miss. A value without a generation (written by a release before `clear`) is read as valid:
//! it lives out its TTL.
//!
//! A batch's lookup takes the lock of each key it finds missing in one step (the pipeline's
//! `SET … NX`s; the model takes them at once, which only narrows the interleavings between
//! keys) and answers later: a caller that goes away in between leaves its locks to the drop
//! guard of the lookup (`PendingLocks`), whose release runs in a task of its own. The batch
//! then reads the clock, loads and fills each key it leads, fenced by its lock. Locks expire
//! at any moment; a `SET` voids a key's lock. What the model leaves out: the freshness of
//! values (a value is fresh until something removes it), followers (a key held elsewhere ends
//! the batch's part in it; `store.rs` models them), L1 (`local.rs`), tags.

use stateright::{Model, Property};

/// How many keys the namespace has.
pub const KEYS: usize = 2;

/// A deliberately broken engine, to show that the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationsFlaw {
    /// `Cache::set` writes its value without the generation (as before issue 41).
    SetWithoutGeneration,
    /// A batch's lookup has no drop guard: a caller that goes away before its answer leaves
    /// the locks it took (as before issue 41).
    NoDropGuard,
    /// A batch's fill writes without checking that the lock holds its token.
    UnfencedFill,
}

/// The model's bounds.
#[derive(Clone, Debug)]
pub struct GenerationsModel {
    /// How many processes share the namespace (at most 8).
    pub processes: usize,
    /// How many batches each process runs, one after the other (at most 8).
    pub batches: u8,
    /// How many `set`s may happen in all.
    pub sets: u8,
    /// How many clears may happen in all.
    pub clears: u8,
    /// A broken engine, or none.
    pub flaw: Option<GenerationsFlaw>,
}

/// A lock token: one per batch, `process * 8 + batch`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Token(u8);

impl Token {
    fn bit(self) -> u64 {
        1 << self.0
    }

    fn process(self) -> usize {
        usize::from(self.0 / 8)
    }
}

/// A stored value: the generation it carries (`None`: none), and, as a ghost, how many
/// clears had completed when what it holds was read from the backend (its load or its set
/// began).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Value {
    /// The generation it carries.
    pub generation: Option<u8>,
    /// Ghost: the clears completed when its content was read.
    pub born: u8,
}

/// Where a process is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pc {
    /// Between calls.
    Idle,
    /// A batch's lookup has run in the store (`took`: the keys whose lock it took); its
    /// answer is on its way back.
    Sent {
        /// The keys whose lock the lookup took.
        took: [bool; KEYS],
    },
    /// The batch's caller went away before the answer: the drop guard's release of `took`
    /// is on its way.
    Releasing {
        /// The keys whose lock the lookup took.
        took: [bool; KEYS],
    },
    /// The batch leads `led` and reads the clock for its load.
    Clock {
        /// The keys it leads.
        led: [bool; KEYS],
    },
    /// The batch's load has run; it fills the keys of `led` left.
    Filling {
        /// The keys it leads and has not filled yet.
        led: [bool; KEYS],
        /// The generation its values carry.
        generation: u8,
        /// Ghost: the clears completed when its load began.
        born: u8,
    },
    /// A `set` of a key, about to write (the generation read).
    Setting {
        /// The key.
        key: u8,
        /// The generation its value carries.
        generation: u8,
        /// Ghost: the clears completed when the set began.
        born: u8,
    },
}

/// One process.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Proc {
    /// Where it is.
    pub pc: Pc,
    /// Batches started so far.
    pub batches: u8,
    /// The generation it keeps for checking values (`None`: it reads the store's).
    pub known: Option<u8>,
    /// The generation of the tag clock it keeps for writing values (`None`: it reads the
    /// store's). Apart from `known`: a clock read before a load never vouches for what is
    /// read after it (`66f2e07`).
    pub clock: Option<u8>,
    /// Ghost: the clears it has heard of (its own at once).
    pub heard: u8,
    /// Clears made elsewhere whose message has not reached it yet.
    pub unheard: u8,
}

/// The whole system, with ghost variables that record what the properties judge.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The namespace's generation in the store (counted from 0: each clear starts the next).
    pub generation: u8,
    /// The value of each key.
    pub values: [Option<Value>; KEYS],
    /// The lock of each key.
    pub locks: [Option<Token>; KEYS],
    /// The processes.
    pub procs: Vec<Proc>,
    /// `set`s left.
    pub sets: u8,
    /// Clears left.
    pub clears: u8,
    /// Ghost: for each key, the tokens whose lock of it expired or was voided, as bits.
    pub dead: [u64; KEYS],
    /// Ghost: a fill landed from a dead token.
    pub dead_fill: bool,
    /// Ghost: a read served a value whose content is older than a clear its process heard.
    pub served_old: bool,
    /// Ghost: a value whose content was read after a clear was served.
    pub served_new: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A process's batch sends its lookup: each key found valid is served, each found
    /// missing (or outdated) has its lock taken where it is free.
    Lookup(usize),
    /// The lookup's answer arrives: the batch leads the keys whose lock it took.
    Answer(usize),
    /// The batch's caller goes away before the answer.
    Drop(usize),
    /// The drop guard's release (token-checked) of the locks the lookup took.
    Release(usize),
    /// The batch reads the clock (its generation) and loads.
    Load(usize),
    /// The batch fills one key (`FILL`, fenced by the lock; it frees the lock).
    Fill(usize, u8),
    /// A `set` of a key reads the generation.
    Set(usize, u8),
    /// The `set` writes (`SET`: the value, the key's lock voided).
    Write(usize),
    /// A clear (`CLEAR`): a new generation; its process forgets the one it kept.
    Clear(usize),
    /// A process hears a clear made elsewhere.
    Hear(usize),
    /// A key's lock expires.
    LockExpires(u8),
}

impl GenerationsModel {
    /// The engine as the code has it, with `processes` processes.
    pub fn new(processes: usize) -> Self {
        GenerationsModel {
            processes,
            batches: 1,
            sets: 1,
            clears: 1,
            flaw: None,
        }
    }

    fn flawed(&self, flaw: GenerationsFlaw) -> bool {
        self.flaw == Some(flaw)
    }

    /// The token of process `p`'s current batch.
    fn own(state: &State, p: usize) -> Token {
        // `processes` and `batches` are at most 8: tokens fit a u64 of bits.
        Token((p as u8) * 8 + state.procs[p].batches.saturating_sub(1))
    }

    /// The generation process `p` stamps a value with (`clock_for_write`, `first_tag_clock`):
    /// the one it keeps, else the store's (which it keeps from then on).
    fn clock(state: &mut State, p: usize) -> u8 {
        let generation = state.generation;
        *state.procs[p].clock.get_or_insert(generation)
    }

    /// Whether process `p` reads `value` as valid (`check_tags`): against the generation it
    /// keeps, else the store's (which it keeps from then on); a value without one is valid.
    fn valid(state: &mut State, p: usize, value: Value) -> bool {
        let current = state.generation;
        match value.generation {
            None => true,
            Some(generation) => generation == *state.procs[p].known.get_or_insert(current),
        }
    }

    /// The lock of `key` goes other than by its owner's own script: its token is dead.
    fn void_lock(state: &mut State, key: usize) {
        if let Some(token) = state.locks[key].take() {
            state.dead[key] |= token.bit();
        }
    }
}

impl Model for GenerationsModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Proc {
            pc: Pc::Idle,
            batches: 0,
            known: None,
            clock: None,
            heard: 0,
            unheard: 0,
        };
        // Cold, or each key holding a value of the first generation.
        let warm = Some(Value {
            generation: Some(0),
            born: 0,
        });
        [[None; KEYS], [warm; KEYS]]
            .into_iter()
            .map(|values| State {
                generation: 0,
                values,
                locks: [None; KEYS],
                procs: vec![idle; self.processes],
                sets: self.sets,
                clears: self.clears,
                dead: [0; KEYS],
                dead_fill: false,
                served_old: false,
                served_new: false,
            })
            .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (p, proc) in state.procs.iter().enumerate() {
            match proc.pc {
                Pc::Idle => {
                    if proc.batches < self.batches {
                        actions.push(Action::Lookup(p));
                    }
                    if state.sets > 0 {
                        actions.extend((0..KEYS as u8).map(|key| Action::Set(p, key)));
                    }
                    if state.clears > 0 {
                        actions.push(Action::Clear(p));
                    }
                }
                Pc::Sent { .. } => {
                    actions.push(Action::Answer(p));
                    actions.push(Action::Drop(p));
                }
                Pc::Releasing { .. } => actions.push(Action::Release(p)),
                Pc::Clock { .. } => actions.push(Action::Load(p)),
                Pc::Filling { led, .. } => {
                    let left = (0..KEYS).filter(|key| led[*key]);
                    actions.extend(left.map(|key| Action::Fill(p, key as u8)));
                }
                Pc::Setting { .. } => actions.push(Action::Write(p)),
            }
            if proc.unheard > 0 {
                actions.push(Action::Hear(p));
            }
        }
        for key in 0..KEYS {
            if state.locks[key].is_some() {
                actions.push(Action::LockExpires(key as u8));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Lookup(p) => {
                state.procs[p].batches += 1;
                let me = Self::own(&state, p);
                let mut took = [false; KEYS];
                for (key, took) in took.iter_mut().enumerate() {
                    let found = state.values[key];
                    match found {
                        Some(value) if Self::valid(&mut state, p, value) => {
                            // A hit: served.
                            state.served_old |= value.born < state.procs[p].heard;
                            state.served_new |= value.born > 0;
                        }
                        // Missing (or outdated: then the key goes its own way, as a single
                        // key's flight, which `store.rs` models).
                        Some(_) => {}
                        None if state.locks[key].is_none() => {
                            state.locks[key] = Some(me);
                            *took = true;
                        }
                        None => {}
                    }
                }
                state.procs[p].pc = Pc::Sent { took };
            }
            Action::Answer(p) => {
                let Pc::Sent { took } = state.procs[p].pc else {
                    return None;
                };
                state.procs[p].pc = if took.iter().any(|t| *t) {
                    Pc::Clock { led: took }
                } else {
                    Pc::Idle
                };
            }
            Action::Drop(p) => {
                let Pc::Sent { took } = state.procs[p].pc else {
                    return None;
                };
                state.procs[p].pc = if self.flawed(GenerationsFlaw::NoDropGuard) {
                    Pc::Idle
                } else {
                    Pc::Releasing { took }
                };
            }
            Action::Release(p) => {
                let Pc::Releasing { took } = state.procs[p].pc else {
                    return None;
                };
                let me = Self::own(&state, p);
                for (lock, took) in state.locks.iter_mut().zip(took) {
                    if took && *lock == Some(me) {
                        *lock = None;
                    }
                }
                state.procs[p].pc = Pc::Idle;
            }
            Action::Load(p) => {
                let Pc::Clock { led } = state.procs[p].pc else {
                    return None;
                };
                let generation = Self::clock(&mut state, p);
                let born = state.generation;
                state.procs[p].pc = Pc::Filling {
                    led,
                    generation,
                    born,
                };
            }
            Action::Fill(p, key) => {
                let Pc::Filling {
                    mut led,
                    generation,
                    born,
                } = state.procs[p].pc
                else {
                    return None;
                };
                let key = usize::from(key);
                let me = Self::own(&state, p);
                if state.locks[key] == Some(me) || self.flawed(GenerationsFlaw::UnfencedFill) {
                    state.values[key] = Some(Value {
                        generation: Some(generation),
                        born,
                    });
                    state.dead_fill |= state.dead[key] & me.bit() != 0;
                    if state.locks[key] == Some(me) {
                        state.locks[key] = None;
                    }
                }
                led[key] = false;
                state.procs[p].pc = if led.iter().any(|l| *l) {
                    Pc::Filling {
                        led,
                        generation,
                        born,
                    }
                } else {
                    Pc::Idle
                };
            }
            Action::Set(p, key) => {
                state.sets -= 1;
                let generation = Self::clock(&mut state, p);
                let born = state.generation;
                state.procs[p].pc = Pc::Setting {
                    key,
                    generation,
                    born,
                };
            }
            Action::Write(p) => {
                let Pc::Setting {
                    key,
                    generation,
                    born,
                } = state.procs[p].pc
                else {
                    return None;
                };
                let key = usize::from(key);
                let generation =
                    (!self.flawed(GenerationsFlaw::SetWithoutGeneration)).then_some(generation);
                state.values[key] = Some(Value { generation, born });
                Self::void_lock(&mut state, key);
                state.procs[p].pc = Pc::Idle;
            }
            Action::Clear(p) => {
                state.clears -= 1;
                state.generation += 1;
                for (q, proc) in state.procs.iter_mut().enumerate() {
                    if q == p {
                        proc.known = None;
                        proc.clock = None;
                        proc.heard += 1;
                    } else {
                        proc.unheard += 1;
                    }
                }
            }
            Action::Hear(p) => {
                let proc = &mut state.procs[p];
                proc.unheard -= 1;
                proc.heard += 1;
                proc.known = None;
                proc.clock = None;
            }
            Action::LockExpires(key) => Self::void_lock(&mut state, usize::from(key)),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no value from before a clear its process heard is served",
                |_, s: &State| !s.served_old,
            ),
            Property::always("a fill lands only under a live lock", |_, s: &State| {
                !s.dead_fill
            }),
            Property::always(
                "no batch that went away leaves a lock behind",
                |_, s: &State| {
                    s.locks.iter().flatten().all(|token| {
                        let p = token.process();
                        let owner = &s.procs[p];
                        let current = GenerationsModel::own(s, p) == *token;
                        current && owner.pc != Pc::Idle
                    })
                },
            ),
            Property::sometimes("a clear overtakes a batch's load", |_, s: &State| {
                s.procs
                    .iter()
                    .any(|proc| matches!(proc.pc, Pc::Filling { born, .. } if born < s.generation))
            }),
            Property::sometimes(
                "a value loaded or set after a clear is served",
                |_, s: &State| s.served_new,
            ),
        ]
    }
}
