//! `impl Store for RedisStore`: each call one round trip (a pipeline of plain commands, or a
//! script), and how the replies are read.
//! A namespace's tag state has its own file, `tag_state.rs`; the trait's tag calls go there.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Pipeline, RedisResult, Script};
use tracing::{debug, warn};

use super::names::KeyName;
use super::scripts::{
    command, is_lock, lock_value, publish_filled, script_call, LockValue, ANSWER, EXPIRE, EXTEND,
    FAIL, FILL, INVALIDATE, LOOKUP, PUT, RELEASE, RENEW, REPAIR, SET,
};
use super::RedisStore;
use crate::store::{
    load_start, millis, BoxFuture, FillWatch, KeyDigest, LockState, LockToken, LockWhen, Lookup,
    Notifier, Renewal, Store, StoreError, StoreErrorKind, StoreKey, Stored, TagClock, TagVersions,
};

impl RedisStore {
    /// A lookup by the lookup script: for lookups that may take the lock from a `fresh`
    /// marker, and for servers before Redis 7.0.
    pub(super) async fn lookup_by_script(&self, call: Cmd) -> Result<Lookup, StoreError> {
        let (value, pttl, state): (Vec<u8>, i64, i64) = self.run(&LOOKUP, &call).await?;
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

    /// Runs a script fenced by the lock's token: it answers 1 if the lock held the token (and
    /// the script did its work), 0 if not.
    async fn run_fenced(&self, script: &Script, call: Cmd) -> Result<bool, StoreError> {
        let done: i64 = self.run(script, &call).await?;
        Ok(done == 1)
    }

    /// The value from the replies to a pipelined `GET` and `PTTL` of it; a value of a foreign
    /// type (`WRONGTYPE` to the `GET`) counts as absent.
    fn read(
        &self,
        value: RedisResult<Option<Vec<u8>>>,
        pttl: RedisResult<i64>,
    ) -> Result<Option<Stored>, StoreError> {
        let pttl = pttl.map_err(|error| self.error(error))?;
        let value = match value {
            Ok(value) => value,
            // A key of a foreign type: absent, and overwritten by the next fill.
            Err(error) if error.code() == Some("WRONGTYPE") => None,
            Err(error) => return Err(self.error(error)),
        };
        Ok(value.and_then(|value| stored(value, pttl)))
    }

    /// A plain read of the Redis key `name` and its remaining life: one pipelined `GET` and
    /// `PTTL`.
    fn read_key(&self, name: KeyName<'_>) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let mut pipeline = Pipeline::with_capacity(2);
        pipeline
            .add_command(command(2, "GET", name))
            .add_command(command(2, "PTTL", name))
            .ignore_errors();
        Box::pin(async move {
            type Reply = (RedisResult<Option<Vec<u8>>>, RedisResult<i64>);
            let (value, pttl): Reply = self
                .connection
                .pipeline(&pipeline)
                .await
                .map_err(|error| self.error(error))?;
            self.read(value, pttl)
        })
    }

    /// Whether a pipelined command's error sends the call to its script: a server that does not
    /// know `SET … NX GET` (before Redis 7.0) gets the script from now on, and a key of a
    /// foreign type gets it for this call.
    fn pipeline_refused(&self, error: &redis::RedisError) -> bool {
        match error.code() {
            Some("WRONGTYPE") => true,
            Some("ERR") if error.to_string().contains("syntax error") => {
                if self.pipelined.swap(false, Ordering::Relaxed) {
                    warn!(address = %self.address, "the server does not take SET NX GET (Redis before 7.0); lookups use a script");
                }
                true
            }
            _ => false,
        }
    }
}

/// Whether a value read with its remaining life is fresh: more than `below` ms left.
fn is_fresh(value: Option<&Stored>, below: u64) -> bool {
    value
        .and_then(|value| value.ttl)
        .is_some_and(|ttl| ttl > Duration::from_millis(below))
}

/// A stored value from a `{value, pttl}` reply; `pttl` -2 means absent, -1 no expiry.
fn stored(value: Vec<u8>, pttl: i64) -> Option<Stored> {
    (pttl != -2).then(|| Stored {
        bytes: Bytes::from(value),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}

/// The replies to a lookup's three commands: the lock's old holder (`SET … NX GET`), the
/// value, and its remaining life.
pub(super) type LookupReplies = (
    RedisResult<Option<Vec<u8>>>,
    RedisResult<Option<Vec<u8>>>,
    RedisResult<i64>,
);

/// What a lookup asks, the same for every key of a batch.
struct LookupPlan {
    /// Below this remaining life (ms) a value is stale, and the lock is taken.
    below: u64,
    /// The lock value: the token, and what the fill measures the `fresh` marker from.
    lock: LockValue,
    lock_ms: u64,
    /// Whether the lookup goes to the script whatever the server (`LockWhen::Always`).
    by_script: bool,
}

impl LookupPlan {
    fn new(token: LockToken, lock_ttl: Duration, lock_when: LockWhen) -> Self {
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
        LookupPlan {
            below,
            lock: lock_value(token, fresh_above),
            lock_ms: millis(lock_ttl),
            by_script,
        }
    }

    /// The lookup script's call for `key`.
    fn script(&self, key: &StoreKey) -> Cmd {
        let mut call = script_call(&LOOKUP, &KeyName::value_and_lock(key));
        call.arg(&self.lock[..]).arg(self.lock_ms).arg(self.below);
        call
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

impl RedisStore {
    /// What a lookup of `key` found, from the replies to its three commands; the rare cases
    /// go to the script (one more round trip).
    async fn lookup_answer(
        &self,
        plan: &LookupPlan,
        key: &StoreKey,
        (held, value, pttl): LookupReplies,
    ) -> Result<Lookup, StoreError> {
        let below = plan.below;
        let held = match held {
            Ok(held) => held,
            Err(error) if self.pipeline_refused(&error) => {
                // A server before Redis 7.0, or a lock key of a foreign type: the script
                // decides (and counts a foreign lock key as free).
                return self.lookup_by_script(plan.script(key)).await;
            }
            Err(error) if error.code() == Some("OOM") => {
                // A full server under `noeviction` refuses the `SET` even where it would
                // write nothing, but the `GET` and `PTTL` did answer: a fresh value is a
                // hit; only a miss needs the lock, and that is a store error.
                let value = self.read(value, pttl)?;
                if is_fresh(value.as_ref(), below) {
                    return Ok(Lookup {
                        value,
                        lock: LockState::NotRequested,
                    });
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
                // A repair that fails costs nothing but the marker (the lock of a fresh
                // value turns nobody away): the value in hand is still the answer.
                // No notification: the value did not change, and every process's L1
                // may keep it (issue 16 #5: under `volatile-ttl` markers go first).
                let mut repair = script_call(&REPAIR, &KeyName::value_and_lock(key));
                repair.arg(&plan.lock[..32]);
                let repaired: Result<i64, StoreError> = self.run(&REPAIR, &repair).await;
                if let Err(error) = repaired {
                    debug!(%error, "could not put the fresh marker back; answering the hit");
                }
                LockState::NotRequested
            }
            _ if fresh => LockState::NotRequested,
            None => LockState::Acquired,
            Some(b"fresh") => {
                // The value is gone or stale but its marker still stands (the value was
                // evicted, or this lookup wants to refresh early): the script decides.
                return self.lookup_by_script(plan.script(key)).await;
            }
            Some(b"failed") => LockState::Failed,
            Some(held) if held.starts_with(&plan.lock[..33]) => {
                // Our own lock (this caller asks again): the script takes it again,
                // renewing its TTL, as `MemoryStore` does.
                return self.lookup_by_script(plan.script(key)).await;
            }
            Some(held) if is_lock(held) => LockState::HeldElsewhere,
            Some(_) => {
                // Bytes this crate never wrote: no lock to wait for. The script takes the
                // lock in their place (one more round trip).
                warn!(key = ?key, "a lock key holds bytes that are no lock; replacing them");
                return self.lookup_by_script(plan.script(key)).await;
            }
        };
        Ok(Lookup { value, lock })
    }
}

impl RedisStore {
    /// The `INVALIDATE` script's call for `key`.
    fn invalidate_call(&self, key: &StoreKey) -> Cmd {
        let mut call = script_call(&INVALIDATE, &KeyName::value_and_lock(key));
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        call
    }

    fn release_call(&self, key: &StoreKey, token: LockToken) -> Cmd {
        let mut call = script_call(&RELEASE, &KeyName::value_and_lock(key));
        call.arg(&token.hex_bytes()[..]);
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        call
    }

    /// A fenced write of `bytes` for `ttl` (`FILL`, `ANSWER`): `script` on the Redis keys
    /// `names` (the value's, the lock's, then any other), with the lock's `token`, publishing
    /// `key`'s change.
    fn fenced_write(
        &self,
        script: &'static Script,
        names: &[KeyName<'_>],
        key: &StoreKey,
        token: LockToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(script, names);
        call.arg(&token.hex_bytes()[..]).arg(bytes).arg(millis(ttl));
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        Box::pin(self.run_fenced_change(script, call, key.clone()))
    }

    /// The tag this store's messages carry (none without notifications).
    pub(super) fn origin(&self) -> &[u8] {
        self.notifications.as_ref().map_or(&[], |n| &n.origin[..])
    }

    /// Tells this process's notifier of a change this store made (its own message will be
    /// skipped when it comes back).
    pub(super) fn changed_here(&self, key: &StoreKey) {
        if let Some(notifications) = &self.notifications {
            notifications.notifier.notify(key);
        }
    }

    /// Tells this process's notifier that a namespace was cleared here (see
    /// [`Notifier::cleared`]).
    pub(super) fn cleared_here(&self) {
        if let Some(notifications) = &self.notifications {
            notifications.notifier.cleared();
        }
    }

    /// A fenced script that changes `key` when it answers 1.
    async fn run_fenced_change(
        &self,
        script: &Script,
        call: Cmd,
        key: StoreKey,
    ) -> Result<bool, StoreError> {
        let done = self.run_fenced(script, call).await?;
        if done {
            self.changed_here(&key);
        }
        Ok(done)
    }
}

impl Store for RedisStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        let plan = LookupPlan::new(token, lock_ttl, lock_when);
        if plan.by_script || !self.pipelined.load(Ordering::Relaxed) {
            return Box::pin(self.lookup_by_script(plan.script(key)));
        }
        let mut pipeline = Pipeline::with_capacity(3);
        plan.add_commands(&mut pipeline, key);
        pipeline.ignore_errors();
        let key = key.clone();
        Box::pin(async move {
            let replies: LookupReplies = self
                .connection
                .pipeline(&pipeline)
                .await
                .map_err(|error| self.error(error))?;
            self.lookup_answer(&plan, &key, replies).await
        })
    }

    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        let plan = LookupPlan::new(token, lock_ttl, lock_when);
        let keys = keys.to_vec();
        if plan.by_script || !self.pipelined.load(Ordering::Relaxed) {
            return Box::pin(async move {
                let mut found = Vec::with_capacity(keys.len());
                for key in &keys {
                    found.push(self.lookup_by_script(plan.script(key)).await?);
                }
                Ok(found)
            });
        }
        Box::pin(async move {
            // Every key's three commands, in one round trip (on a cluster, one per master).
            let replies = self
                .connection
                .lookups(&keys, |pipeline, key| plan.add_commands(pipeline, key))
                .await
                .map_err(|error| self.error(error))?;
            let mut found = Vec::with_capacity(keys.len());
            for (key, replies) in keys.iter().zip(replies) {
                found.push(self.lookup_answer(&plan, key, replies).await?);
            }
            Ok(found)
        })
    }

    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.fenced_write(
            &FILL,
            &KeyName::value_and_lock(key),
            key,
            token,
            &value,
            ttl,
        )
    }

    fn renew(
        &self,
        key: &StoreKey,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        let mut call = script_call(&RENEW, &KeyName::value_and_lock(key));
        call.arg(&token.hex_bytes()[..]).arg(millis(ttl));
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        let key = key.clone();
        Box::pin(async move {
            let done: i64 = self.run(&RENEW, &call).await?;
            Ok(match done {
                1 => {
                    self.changed_here(&key);
                    Renewal::Renewed
                }
                2 => Renewal::NoValue,
                _ => Renewal::LockLost,
            })
        })
    }

    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>> {
        let call = self.release_call(key, token);
        Box::pin(self.run_fenced_change(&RELEASE, call, key.clone()))
    }

    fn extend(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&EXTEND, &[KeyName::lock(key)]);
        call.arg(&token.hex_bytes()[..]).arg(millis(lock_ttl));
        Box::pin(self.run_fenced(&EXTEND, call))
    }

    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&PUT, &[KeyName::value(key)]);
        call.arg(value.as_ref()).arg(millis(ttl));
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        match load_start(&value) {
            Some(started) => call.arg(itoa::Buffer::new().format(started)),
            None => call.arg(""),
        };
        Box::pin(self.run_fenced_change(&PUT, call, key.clone()))
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.read_key(KeyName::value(key))
    }

    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&FAIL, &[KeyName::lock(key)]);
        call.arg(&token.hex_bytes()[..]).arg(millis(failure_ttl));
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        Box::pin(self.run_fenced_change(&FAIL, call, key.clone()))
    }

    fn answer_waiters(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let names = [
            KeyName::value(key),
            KeyName::lock(key),
            KeyName::waiters(key),
        ];
        self.fenced_write(&ANSWER, &names, key, token, &answer, ttl)
    }

    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.read_key(KeyName::waiters(key))
    }

    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        let notifications = self.notifications.as_ref()?;
        notifications.ensure_subscribed(key.namespace());
        Some(notifications.notifier.watch(key))
    }

    fn invalidate(&self, key: &StoreKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let call = self.invalidate_call(key);
        Box::pin(self.run_change(&INVALIDATE, call, key.clone()))
    }

    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        let calls = keys.iter().map(|key| self.invalidate_call(key)).collect();
        let keys = keys.to_vec();
        Box::pin(async move {
            let ran = self.connection.invoke_pipelined(&INVALIDATE, calls).await;
            // Whatever the answer: the changes may have been made.
            for key in &keys {
                self.changed_here(key);
            }
            ran.map_err(|error| self.error(error))
        })
    }

    fn set(
        &self,
        key: &StoreKey,
        value: Bytes,
        fresh_for: Duration,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&SET, &KeyName::value_and_lock(key));
        // A freshness under 1 ms leaves no marker (0), as `millis` would round it up.
        let fresh = if fresh_for.is_zero() {
            0
        } else {
            millis(fresh_for.min(ttl))
        };
        call.arg(value.as_ref()).arg(millis(ttl)).arg(fresh);
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        Box::pin(self.run_change(&SET, call, key.clone()))
    }

    fn expire(&self, key: &StoreKey, keep: Duration) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&EXPIRE, &KeyName::value_and_lock(key));
        call.arg(if keep.is_zero() { 0 } else { millis(keep) });
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        Box::pin(self.run_change(&EXPIRE, call, key.clone()))
    }

    fn notifier(&self) -> Option<&Notifier> {
        self.notifications.as_ref().map(|n| &n.notifier)
    }

    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        self.read_tag_clock(namespace)
    }

    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        self.read_tag_versions(namespace, tags)
    }

    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.invalidate_tags_now(namespace, tags)
    }

    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        self.clear_now(namespace)
    }
}

impl RedisStore {
    /// Runs a script that changes `key` for every process, then tells this process's own
    /// notifier at once (its pub/sub message may come later), whatever the answer.
    async fn run_change(
        &self,
        script: &Script,
        call: Cmd,
        key: StoreKey,
    ) -> Result<(), StoreError> {
        let ran: Result<i64, StoreError> = self.run(script, &call).await;
        // Whatever the answer: the change may have been made.
        self.changed_here(&key);
        ran.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_and_unexpiring_values() {
        assert_eq!(stored(Vec::new(), -2), None);
        assert_eq!(stored(b"x".to_vec(), -1).and_then(|s| s.ttl), None);
        assert_eq!(
            stored(b"x".to_vec(), 1500).and_then(|s| s.ttl),
            Some(Duration::from_millis(1500))
        );
    }
}
