//! The renewals of the locks this cache's leaders hold: one task renews every lock that is
//! due, all of them in one store call, from when a leader takes its lock until it is done.
//!
//! A lock is renewed a third of the way into its life, its life counted from when it was
//! asked for, not from when the answer came: the store took the lock no earlier than the
//! request was sent, and an answer that came late (a slow network, a busy process, a lookup
//! queued behind others) has used up part of its TTL. Timed from the answer, a lookup answered
//! 220 ms late of a 300 ms lock was first renewed 320 ms after the lock was taken, after it
//! had run out.
//!
//! One call for all of them, because each leader renewing its own lock cost a store call per
//! leader and per third of a lock's life: a burst over 2,000 cold keys asked 3,400 renewals
//! of its own process, which held up the fills they were renewing for; and a batch of 300 keys
//! renewed one key at a time, 2 ms each, lost its locks before the round was over (151 to 227
//! keys loaded again by another process). A round renews, with the locks that are due, those
//! due within half a period, so that the leaders of a burst share their rounds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;

use super::breaker::Breaker;
use super::telemetry::{LockEvent, Meter};
use crate::store::{LockToken, Store, StoreKey};

/// The locks of a cache's leaders, and the task that renews them while there are any.
pub(super) struct Renewals(Arc<Shared>);

/// What the renewing task shares with the leaders.
struct Shared {
    state: Mutex<State>,
    /// Woken when a lock is added that may be due before the task's next round.
    added: Notify,
    store: Arc<dyn Store>,
    breaker: Arc<Breaker>,
    meter: Meter,
    lock_ttl: Duration,
}

#[derive(Default)]
struct State {
    held: HashMap<u64, Held>,
    next_id: u64,
    /// The renewing task, while it runs: it ends once no lock is held, and the next lock
    /// starts another.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A lock a leader holds, and when it is next renewed.
struct Held {
    key: StoreKey,
    token: LockToken,
    due: Instant,
}

/// A leader's locks, renewed until it is dropped.
pub(in crate::cache) struct Watchdog {
    renewals: Option<Arc<Shared>>,
    ids: Vec<u64>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(shared) = &self.renewals {
            let mut state = shared.state();
            for id in &self.ids {
                state.held.remove(id);
            }
        }
    }
}

impl Renewals {
    pub(super) fn new(
        store: Arc<dyn Store>,
        breaker: Arc<Breaker>,
        meter: Meter,
        lock_ttl: Duration,
    ) -> Self {
        Renewals(Arc::new(Shared {
            state: Mutex::default(),
            added: Notify::new(),
            store,
            breaker,
            meter,
            lock_ttl,
        }))
    }

    /// Renews the locks of `keys` held under `token`, asked for at `asked_at`, until the
    /// returned watchdog is dropped. Without a runtime, nothing renews them: they live their
    /// TTL.
    pub(super) fn watch(
        &self,
        keys: Vec<StoreKey>,
        token: LockToken,
        asked_at: Instant,
    ) -> Watchdog {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Watchdog {
                renewals: None,
                ids: Vec::new(),
            };
        };
        let due = crate::sync::later(asked_at, period(self.0.lock_ttl));
        let mut state = self.0.state();
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            let id = state.next_id;
            state.next_id += 1;
            state.held.insert(id, Held { key, token, due });
            ids.push(id);
        }
        if state.task.as_ref().is_none_or(|task| task.is_finished()) {
            let shared = Arc::clone(&self.0);
            state.task = Some(runtime.spawn(async move { shared.renew_while_held().await }));
        }
        drop(state);
        self.0.added.notify_one();
        Watchdog {
            renewals: Some(Arc::clone(&self.0)),
            ids,
        }
    }
}

/// How often a lock is renewed: every third of its life.
fn period(lock_ttl: Duration) -> Duration {
    (lock_ttl / 3).max(Duration::from_millis(1))
}

/// The locks of one round, and their ids.
type Round = (Vec<u64>, Vec<(StoreKey, LockToken)>);

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the state is locked; a poisoned lock still guards valid state.
        crate::sync::lock(&self.state)
    }

    /// The task: a round whenever a lock is due, until none is held.
    async fn renew_while_held(self: Arc<Self>) {
        let period = period(self.lock_ttl);
        loop {
            let added = self.added.notified();
            let next = {
                let mut state = self.state();
                let Some(earliest) = state.held.values().map(|held| held.due).min() else {
                    // Under the lock: a leader that adds a lock after this sees the task gone.
                    state.task = None;
                    return;
                };
                let now = Instant::now();
                if earliest > now {
                    Err(earliest)
                } else {
                    // The locks due, and those due within half a period: renewed early, they
                    // spare a round of their own.
                    let early = crate::sync::later(now, period / 2);
                    let mut round: Round = (Vec::new(), Vec::new());
                    for (id, held) in &mut state.held {
                        if held.due <= early {
                            held.due = crate::sync::later(now, period);
                            round.0.push(*id);
                            round.1.push((held.key.clone(), held.token));
                        }
                    }
                    Ok(round)
                }
            };
            match next {
                Err(earliest) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(earliest) => {}
                        () = added => {}
                    }
                }
                Ok((ids, locks)) => self.renew(&ids, &locks).await,
            }
        }
    }

    /// One round: the locks renewed in one store call. A lock the store no longer holds for
    /// its token is renewed no more (its fill tells whether it was lost); one whose renewal
    /// failed is tried again next round.
    async fn renew(&self, ids: &[u64], locks: &[(StoreKey, LockToken)]) {
        let renewed = self
            .breaker
            .finish(self.store.extend(locks, self.lock_ttl))
            .await;
        match renewed {
            Ok(renewed) => {
                let mut state = self.state();
                for ((id, (key, _)), renewed) in ids.iter().zip(locks).zip(renewed) {
                    if renewed {
                        self.meter.lock(LockEvent::Extended);
                    } else {
                        // Lost, or gone with the fill that raced this renewal.
                        debug!(?key, "lock no longer held; not renewed");
                        state.held.remove(id);
                    }
                }
            }
            Err(error) => debug!(
                locks = locks.len(),
                error = &error as &dyn std::error::Error,
                "lock renewal failed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{KeyDigest, LockState, LockWhen, MemoryStore};

    const LOCK_TTL: Duration = Duration::from_millis(300);

    /// Ten leaders, whose locks were asked for a few milliseconds apart, hold them for a
    /// second, three times their TTL: every lock holds throughout; once the leaders are done,
    /// their locks are renewed no more (they lapse, and another token takes them).
    #[tokio::test(start_paused = true)]
    async fn a_leader_s_locks_hold_until_it_is_done() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let config = crate::cache::config::Config::default();
        let breaker = Breaker::new(&config.breaker, &config.namespace, Arc::clone(&store));
        let breaker = Arc::new(breaker);
        let renewals = Renewals::new(
            Arc::clone(&store),
            breaker,
            Meter::new(&Arc::from("t")),
            LOCK_TTL,
        );
        let mut watchdogs = Vec::new();
        let keys: Vec<StoreKey> = (0..10u8)
            .map(|leader| StoreKey::new(Arc::from("t"), KeyDigest::of(&[leader])))
            .collect();
        for key in &keys {
            let token = LockToken::random();
            let asked_at = Instant::now();
            let taken = store.lookup(key, token, LOCK_TTL, LockWhen::Always).await;
            assert_eq!(taken.unwrap().lock, LockState::Acquired);
            watchdogs.push(renewals.watch(vec![key.clone()], token, asked_at));
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let others = |store: &Arc<dyn Store>| {
            let store = Arc::clone(store);
            let keys = keys.clone();
            async move {
                let mut states = Vec::new();
                for key in &keys {
                    let other = store.lookup(key, LockToken::random(), LOCK_TTL, LockWhen::Always);
                    states.push(other.await.unwrap().lock);
                }
                states
            }
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(others(&store).await, [LockState::HeldElsewhere; 10]);
        drop(watchdogs);
        tokio::time::sleep(LOCK_TTL).await;
        assert_eq!(others(&store).await, [LockState::Acquired; 10]);
    }
}
