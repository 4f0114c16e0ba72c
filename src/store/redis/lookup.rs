//! Lookups on Redis: a key's three commands (`SET … NX GET` of its lock, `GET` and `PTTL` of its
//! value) pipelined in one round trip, a batch's in one pipeline (one per master on a
//! Cluster), and the lookup script for the rare cases the replies cannot decide.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Pipeline, RedisResult};
use tracing::{debug, warn};

use super::names::KeyName;
use super::scripts::{
    command, is_lock, lock_value, may_lapse, script_call, LockValue, LOOKUP, REPAIR,
};
use super::RedisStore;
use crate::store::error::{StoreError, StoreErrorKind};
use crate::store::key::{LockToken, StoreKey};
use crate::store::lookup::{LockState, LockWhen, Lookup, Stored};
use crate::store::primitives::{millis, BoxFuture, LockLife};

impl RedisStore {
    /// A lookup by the lookup script: for lookups that may take the lock from a `fresh`
    /// marker, and for servers before Redis 7.0.
    pub(super) async fn lookup_by_script(&self, call: Cmd) -> Result<Lookup, StoreError> {
        self.scripted(self.run(&LOOKUP, &call).await?)
    }

    /// What the lookup script's reply `{value, pttl, state}` says.
    fn scripted(&self, (value, pttl, state): (Vec<u8>, i64, i64)) -> Result<Lookup, StoreError> {
        let lock = match state {
            0 => LockState::NotRequested,
            1 => LockState::Acquired,
            2 => LockState::HeldElsewhere,
            3 => LockState::Failed,
            other => {
                return Err(StoreError::of_kind(
                    StoreErrorKind::Protocol,
                    format_args!(
                        "unexpected lock state {other} from Redis at {}",
                        self.address
                    ),
                ))
            }
        };
        Ok(Lookup {
            value: stored(value, pttl),
            lock,
        })
    }
}

/// Whether a value read with its remaining life is fresh: more than `below` ms left.
fn is_fresh(value: Option<&Stored>, below: u64) -> bool {
    value
        .and_then(|value| value.ttl)
        .is_some_and(|ttl| ttl > Duration::from_millis(below))
}

/// The replies to a lookup's three commands: the lock's old holder (`SET … NX GET`), the
/// value, and its remaining life.
pub(super) type LookupReplies = (
    RedisResult<Option<Vec<u8>>>,
    RedisResult<Option<Vec<u8>>>,
    RedisResult<i64>,
);

/// What a lookup asks, the same for every key of a batch.
pub(super) struct LookupPlan {
    /// Below this remaining life (ms) a value is stale, and the lock is taken.
    below: u64,
    /// The lock value: the token, and what the fill measures the `fresh` marker from.
    lock: LockValue,
    /// How long the lock key lives: the lock's TTL, and the time it is kept lapsed after.
    lock_ms: u64,
    /// Whether the lookup goes to the script whatever the server (`LockWhen::Always`).
    by_script: bool,
}

impl LookupPlan {
    /// `store`'s lookup of `key` as planned ([`Store::lookup`](crate::store::Store::lookup)):
    /// the three commands in one pipeline, or the script where the lock may be taken from a
    /// `fresh` marker or the server is older.
    pub(super) fn look_up<'a>(
        self,
        store: &'a RedisStore,
        key: &StoreKey,
    ) -> BoxFuture<'a, Result<Lookup, StoreError>> {
        let plan = self;
        if plan.by_script || !store.pipelined.load(Ordering::Relaxed) {
            return Box::pin(store.lookup_by_script(plan.script(key)));
        }
        let mut pipeline = Pipeline::with_capacity(3);
        plan.add_commands(&mut pipeline, key);
        pipeline.ignore_errors();
        let key = key.clone();
        Box::pin(async move {
            let replies: LookupReplies = store
                .connection
                .pipeline(&pipeline)
                .await
                .map_err(|error| store.error(error))?;
            store.lookup_answer(&plan, &key, replies).await
        })
    }

    /// `store`'s lookups of `keys` as planned
    /// ([`Store::lookup_many`](crate::store::Store::lookup_many)): every key's three commands
    /// in one round trip (one per master on a Cluster), or the script key by key.
    pub(super) fn look_up_many<'a>(
        self,
        store: &'a RedisStore,
        keys: &[StoreKey],
    ) -> BoxFuture<'a, Result<Vec<Lookup>, StoreError>> {
        let plan = self;
        let keys = keys.to_vec();
        if plan.by_script || !store.pipelined.load(Ordering::Relaxed) {
            return Box::pin(async move {
                let mut found = Vec::with_capacity(keys.len());
                for key in &keys {
                    found.push(store.lookup_by_script(plan.script(key)).await?);
                }
                Ok(found)
            });
        }
        Box::pin(async move {
            // Every key's three commands, in one round trip (on a cluster, one per master).
            let replies = store
                .connection
                .lookups(&keys, |pipeline, key| plan.add_commands(pipeline, key))
                .await
                .map_err(|error| store.error(error))?;
            let mut found = Vec::with_capacity(keys.len());
            let (mut scripted, mut repairs) = (Vec::new(), Vec::new());
            for (index, (key, replies)) in keys.iter().zip(replies).enumerate() {
                found.push(match store.decide(&plan, key, replies)? {
                    Decided::Found(lookup) => Some(lookup),
                    Decided::Repair(lookup) => {
                        repairs.push(plan.repair(key));
                        Some(lookup)
                    }
                    Decided::ByScript => {
                        scripted.push(index);
                        None
                    }
                });
            }
            if !repairs.is_empty() {
                // As a single lookup's repair: one that fails costs the marker alone.
                if let Err(error) = store.connection.invoke_pipelined(&REPAIR, repairs).await {
                    debug!(%error, "could not put the fresh markers back; answering the hits");
                }
            }
            if !scripted.is_empty() {
                // The keys the replies could not decide, by the script: one more round trip
                // for all of them.
                let calls = scripted.iter().map(|index| plan.script(&keys[*index]));
                let replies = store
                    .connection
                    .invoke_each(&LOOKUP, calls.collect())
                    .await
                    .map_err(|error| store.error(error))?;
                for (index, reply) in scripted.into_iter().zip(replies) {
                    let reply = reply.and_then(|reply| Ok(redis::from_redis_value(reply)?));
                    found[index] = Some(store.scripted(reply.map_err(|e| store.error(e))?)?);
                }
            }
            found
                .into_iter()
                .map(|lookup| lookup.ok_or_else(|| StoreError::new("a batch lookup lost a key")))
                .collect()
        })
    }

    pub(super) fn new(token: LockToken, lock_ttl: Duration, lock_when: LockWhen) -> Self {
        // `Always` goes to the script, which takes the lock from a `fresh` marker, with a bound
        // no remaining life exceeds (a fill under that lock then leaves no marker: the next
        // lookup takes the lock of a fresh value and puts the marker back).
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        // `below` decides whether to take the lock; `fresh_above`, which the lock value
        // carries, is what the fill measures the `fresh` marker from.
        let (below, fresh_above, by_script) = match lock_when {
            LockWhen::LifeAtMost(life) => (ms(life), ms(life), false),
            LockWhen::Early { life, fresh_above } => (ms(life), ms(fresh_above), false),
            LockWhen::Always => (u64::MAX, u64::MAX, true),
        };
        let life = LockLife::of(lock_ttl);
        LookupPlan {
            below,
            lock: lock_value(token, fresh_above, millis(life.lapsed)),
            lock_ms: millis(life.whole()),
            by_script,
        }
    }

    /// The lookup script's call for `key`.
    fn script(&self, key: &StoreKey) -> Cmd {
        let mut call = script_call(&LOOKUP, &KeyName::value_and_lock(key));
        call.arg(&self.lock[..]).arg(self.lock_ms).arg(self.below);
        call
    }

    /// The `REPAIR` call that puts the `fresh` marker back in place of the lock this lookup
    /// took of a fresh value of `key`.
    fn repair(&self, key: &StoreKey) -> Cmd {
        let mut repair = script_call(&REPAIR, &KeyName::value_and_lock(key));
        repair.arg(&self.lock[..32]);
        repair
    }

    /// The three plain commands of a lookup of `key`: the lock is taken only where no
    /// `fresh` marker stands, which is where the value is stale or absent.
    fn add_commands(&self, pipeline: &mut Pipeline, key: &StoreKey) {
        let mut take = command(7, "SET", KeyName::lock(key));
        take.arg(&self.lock[..])
            .arg("NX")
            .arg("PX")
            .arg(self.lock_ms)
            .arg("GET");
        pipeline
            .add_command(take)
            .add_command(command(2, "GET", KeyName::value(key)))
            .add_command(command(2, "PTTL", KeyName::value(key)));
    }
}

/// What the replies to a lookup's three commands decide.
enum Decided {
    /// The lookup's answer.
    Found(Lookup),
    /// The answer, once the `fresh` marker is put back ([`LookupPlan::repair`]): the lookup
    /// took the lock of a fresh value whose marker was gone.
    Repair(Lookup),
    /// The replies cannot decide: the lookup script does (one more round trip).
    ByScript,
}

impl RedisStore {
    /// What a lookup of `key` found, from the replies to its three commands; the rare cases
    /// go to the script (one more round trip).
    async fn lookup_answer(
        &self,
        plan: &LookupPlan,
        key: &StoreKey,
        replies: LookupReplies,
    ) -> Result<Lookup, StoreError> {
        match self.decide(plan, key, replies)? {
            Decided::Found(lookup) => Ok(lookup),
            Decided::Repair(lookup) => {
                // A repair that fails costs nothing but the marker (the lock of a fresh
                // value turns nobody away): the value in hand is still the answer.
                let repaired: Result<i64, StoreError> = self.run(&REPAIR, &plan.repair(key)).await;
                if let Err(error) = repaired {
                    debug!(
                        error = &error as &dyn std::error::Error,
                        "could not put the fresh marker back; answering the hit"
                    );
                }
                Ok(lookup)
            }
            Decided::ByScript => self.lookup_by_script(plan.script(key)).await,
        }
    }

    /// What the replies to a lookup's three commands decide.
    fn decide(
        &self,
        plan: &LookupPlan,
        key: &StoreKey,
        (held, value, pttl): LookupReplies,
    ) -> Result<Decided, StoreError> {
        let below = plan.below;
        let held = match held {
            Ok(held) => held,
            Err(error) if self.pipeline_refused(&error) => {
                // A server before Redis 7.0, or a lock key of a foreign type: the script
                // decides (and counts a foreign lock key as free).
                return Ok(Decided::ByScript);
            }
            Err(error) if error.code() == Some("OOM") => {
                // A full server under `noeviction` refuses the `SET` even where it would
                // write nothing, but the `GET` and `PTTL` did answer: a fresh value is a
                // hit; only a miss needs the lock, and that is a store error.
                let value = self.read(value, pttl)?;
                if is_fresh(value.as_ref(), below) {
                    return Ok(Decided::Found(Lookup {
                        value,
                        lock: LockState::NotRequested,
                    }));
                }
                return Err(self.error(error));
            }
            Err(error) => return Err(self.error(error)),
        };
        // A value of a foreign type counts as absent: the fill overwrites it.
        let value = self.read(value, pttl)?;
        let fresh = is_fresh(value.as_ref(), below);
        let lock = match held.as_deref() {
            _ if fresh && held.is_none() => {
                // We took the lock of a fresh value whose marker is gone (a failure marker
                // expired, or the value was written by a put): put the marker back before
                // answering, so that this flight's next lookup finds no lock of its own.
                // No notification: the value did not change, and every process's L1
                // may keep it (issue 16 #5: under `volatile-ttl` markers go first).
                return Ok(Decided::Repair(Lookup {
                    value,
                    lock: LockState::NotRequested,
                }));
            }
            _ if fresh => LockState::NotRequested,
            None => LockState::Acquired,
            Some(b"fresh") => {
                // The value is gone or stale but its marker still stands (the value was
                // evicted, or this lookup wants to refresh early): the script decides.
                return Ok(Decided::ByScript);
            }
            Some(b"failed") => LockState::Failed,
            Some(held) if held.starts_with(&plan.lock[..33]) => {
                // Our own lock (this caller asks again): the script takes it again,
                // renewing its TTL, as `MemoryStore` does.
                return Ok(Decided::ByScript);
            }
            Some(held) if is_lock(held) && may_lapse(held) => {
                // Another leader's lock, which may have lapsed: the script weighs its
                // remaining life, and takes it if it did.
                return Ok(Decided::ByScript);
            }
            Some(held) if is_lock(held) => LockState::HeldElsewhere,
            Some(_) => {
                // Bytes this crate never wrote: no lock to wait for. The script takes the
                // lock in their place (one more round trip).
                warn!(key = ?key, "a lock key holds bytes that are no lock; replacing them");
                return Ok(Decided::ByScript);
            }
        };
        Ok(Decided::Found(Lookup { value, lock }))
    }
}

/// A stored value from a `{value, pttl}` reply; `pttl` -2 means absent, -1 no expiry.
pub(super) fn stored(value: Vec<u8>, pttl: i64) -> Option<Stored> {
    (pttl != -2).then(|| Stored {
        bytes: Bytes::from(value),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}
