//! `impl Store for RedisStore`: each call one round trip (a pipeline of plain commands, or a
//! script: one per [`Settle`] and [`Change`] variant), and how the replies are read.
//! A lookup's plan and how its replies are decided have their own file, `lookup.rs`; a
//! namespace's tag state is one hash (see `crate::store::tags` for why a lost hash starts a
//! new generation), read and changed by the calls here, each one round trip.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Cmd, Pipeline, RedisResult, Script};
use tracing::warn;

use super::lookup::{stored, LookupPlan};
use super::names::{tag_state_name, KeyName, CLEARED};
use super::scripts::{
    command, publish_filled, script_call, ANSWER, CLEAR, EXPIRE, EXTEND, FAIL, FILL, INVALIDATE,
    INVALIDATE_TAGS, PUT, RELEASE, RENEW, SET, TAG_CLOCK,
};
use super::RedisStore;
use crate::store::call_limit::CallLimit;
use crate::store::error::{StoreError, StoreErrorKind};
use crate::store::key::{KeyDigest, LockToken, StoreKey};
use crate::store::lookup::{LockWhen, Lookup, Stored};
use crate::store::notify::{FillWatch, Notifier};
use crate::store::primitives::{
    load_start, millis, BoxFuture, Change, LockLife, Settle, Settled, Store,
};
use crate::store::tags;
use crate::store::tags::{TagClock, TagVersions, MAX_TAG_VERSIONS};

impl RedisStore {
    /// The value from the replies to a pipelined `GET` and `PTTL` of it; a value of a foreign
    /// type (`WRONGTYPE` to the `GET`) counts as absent.
    pub(super) fn read(
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
    pub(super) fn pipeline_refused(&self, error: &redis::RedisError) -> bool {
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

impl RedisStore {
    /// Adds the arguments with which `call`'s script publishes "filled" for `key`.
    fn publishing(&self, mut call: Cmd, key: &StoreKey) -> Cmd {
        publish_filled(
            &mut call,
            key,
            self.fill_channel(key.namespace()),
            self.origin(),
        );
        call
    }

    /// The `INVALIDATE` script's call for `key`.
    fn invalidate_call(&self, key: &StoreKey) -> Cmd {
        self.publishing(script_call(&INVALIDATE, &KeyName::value_and_lock(key)), key)
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

    /// The script of a settlement and its call, and what the script's answer 2 means (only
    /// `FILL` and `RENEW` answer it).
    fn settle_call(
        &self,
        key: &StoreKey,
        token: LockToken,
        how: Settle,
    ) -> (&'static Script, Cmd, Settled) {
        let token = token.hex_bytes();
        let (script, mut call, two): (&'static Script, _, _) = match how {
            Settle::Fill { value, ttl } => {
                let mut call = script_call(&FILL, &KeyName::value_and_lock(key));
                call.arg(&token[..]).arg(value.as_ref()).arg(millis(ttl));
                (&FILL, call, Settled::KeptNewer)
            }
            Settle::Renew { ttl } => {
                let mut call = script_call(&RENEW, &KeyName::value_and_lock(key));
                call.arg(&token[..]).arg(millis(ttl));
                (&RENEW, call, Settled::NoValue)
            }
            Settle::AnswerWaiters { answer, ttl } => {
                let names = [
                    KeyName::value(key),
                    KeyName::lock(key),
                    KeyName::waiters(key),
                ];
                let mut call = script_call(&ANSWER, &names);
                call.arg(&token[..]).arg(answer.as_ref()).arg(millis(ttl));
                (&ANSWER, call, Settled::LockLost)
            }
            Settle::Fail { failure_ttl } => {
                let mut call = script_call(&FAIL, &[KeyName::lock(key)]);
                call.arg(&token[..]).arg(millis(failure_ttl));
                (&FAIL, call, Settled::LockLost)
            }
            Settle::Release => {
                let mut call = script_call(&RELEASE, &KeyName::value_and_lock(key));
                call.arg(&token[..]);
                (&RELEASE, call, Settled::LockLost)
            }
        };
        call = self.publishing(call, key);
        (script, call, two)
    }

    /// The script of a change and its call.
    fn change_call(&self, key: &StoreKey, what: Change) -> (&'static Script, Cmd) {
        match what {
            Change::Put { value, ttl } => {
                let mut call = script_call(&PUT, &[KeyName::value(key)]);
                call.arg(value.as_ref()).arg(millis(ttl));
                let mut call = self.publishing(call, key);
                call.arg(load_start_arg(&value));
                (&PUT, call)
            }
            Change::Set {
                value,
                fresh_for,
                ttl,
            } => {
                let mut call = script_call(&SET, &KeyName::value_and_lock(key));
                // A freshness under 1 ms leaves no marker (0), as `millis` would round it up.
                let fresh = if fresh_for.is_zero() {
                    0
                } else {
                    millis(fresh_for.min(ttl))
                };
                call.arg(value.as_ref()).arg(millis(ttl)).arg(fresh);
                let mut call = self.publishing(call, key);
                call.arg(load_start_arg(&value));
                (&SET, call)
            }
            Change::Expire { keep } => {
                let mut call = script_call(&EXPIRE, &KeyName::value_and_lock(key));
                call.arg(if keep.is_zero() { 0 } else { millis(keep) });
                (&EXPIRE, self.publishing(call, key))
            }
            Change::Invalidate => (&INVALIDATE, self.invalidate_call(key)),
        }
    }
}

impl Store for RedisStore {
    /// As planned by `LookupPlan` (`lookup.rs`), which owns the pipeline and its decision.
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        LookupPlan::new(token, lock_ttl, lock_when).look_up(self, key)
    }

    /// As planned by `LookupPlan` (`lookup.rs`): one round trip for the whole batch.
    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        LookupPlan::new(token, lock_ttl, lock_when).look_up_many(self, keys)
    }

    /// One script per settlement, each fenced by the lock: it answers 1 where the lock held
    /// the token and the script did its work, 0 where it did not hold it, 2 for the answers
    /// of `settle_call`.
    fn settle(
        &self,
        key: &StoreKey,
        token: LockToken,
        how: Settle,
    ) -> BoxFuture<'_, Result<Settled, StoreError>> {
        let (script, call, two) = self.settle_call(key, token, how);
        let key = key.clone();
        Box::pin(async move {
            let settled = match self.run::<i64>(script, &call).await? {
                1 => Settled::Done,
                2 => two,
                _ => Settled::LockLost,
            };
            // A fill that kept a newer value freed the lock all the same: a change, which
            // this process hears of here (its own "filled" message is skipped).
            if matches!(settled, Settled::Done | Settled::KeptNewer) {
                self.changed_here(&key);
            }
            Ok(settled)
        })
    }

    /// One script per change. `PUT` answers 0 where a newer value stays (nothing changed);
    /// the others change the key whatever they answer.
    fn change(&self, key: &StoreKey, what: Change) -> BoxFuture<'_, Result<bool, StoreError>> {
        let fenced = matches!(what, Change::Put { .. });
        let (script, call) = self.change_call(key, what);
        let key = key.clone();
        Box::pin(async move {
            let ran: Result<i64, StoreError> = self.run(script, &call).await;
            let changed = ran.as_ref().map_or(!fenced, |done| !fenced || *done == 1);
            // Whatever the answer, but a refused put: the change may have been made.
            if changed {
                self.changed_here(&key);
            }
            ran.map(|_| changed)
        })
    }

    fn extend(
        &self,
        locks: &[(StoreKey, LockToken)],
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        let life = LockLife::of(lock_ttl);
        let (kept, lives) = (millis(life.lapsed), millis(life.whole()));
        let calls = locks
            .iter()
            .map(|(key, token)| {
                let mut call = script_call(&EXTEND, &[KeyName::lock(key)]);
                call.arg(&token.hex_bytes()[..]).arg(lives).arg(kept);
                call
            })
            .collect();
        Box::pin(async move {
            // One pipeline (on a cluster, one per master): one round trip for every lock.
            let replies = self
                .connection
                .invoke_each(&EXTEND, calls)
                .await
                .map_err(|error| self.error(error))?;
            replies
                .into_iter()
                .map(|reply| {
                    let done: i64 = redis::from_redis_value(reply.map_err(|e| self.error(e))?)
                        .map_err(|e| self.error(e.into()))?;
                    Ok(done == 1)
                })
                .collect()
        })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.read_key(KeyName::value(key))
    }

    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.read_key(KeyName::waiters(key))
    }

    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        let notifications = self.notifications.as_ref()?;
        notifications.ensure_subscribed(key.namespace());
        Some(notifications.notifier.watch(key))
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

    fn notifier(&self) -> Option<&Notifier> {
        self.notifications.as_ref().map(|n| &n.notifier)
    }

    fn call_limit(&self) -> Option<&CallLimit> {
        Some(&self.call_limit)
    }

    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        let mut call = script_call(&TAG_CLOCK, &[tag_state_name(namespace)]);
        call.arg(tags::generation_text(tags::new_generation()))
            .arg(tag_state_fields());
        Box::pin(async move {
            let (generation, clock): (Vec<u8>, Vec<u8>) = self.run(&TAG_CLOCK, &call).await?;
            match (tags::parse_generation(&generation), counter(&clock)) {
                (Some(generation), Some(clock)) => Ok(TagClock { generation, clock }),
                _ => Err(StoreError::of_kind(
                    StoreErrorKind::Protocol,
                    "a tag state that is not this crate's",
                )),
            }
        })
    }

    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        let state = tag_state_name(namespace);
        let mut call = command(3 + tags.len(), "HMGET", state.as_str());
        call.arg("g");
        for tag in tags {
            call.arg(&tag.hex_bytes()[..]);
        }
        Box::pin(async move {
            let mut fields: Vec<Option<Vec<u8>>> = self
                .connection
                .query(&call)
                .await
                .map_err(|error| self.error(error))?;
            // No generation (or one this crate did not write): no tag state, every tagged
            // value is outdated.
            let generation = match fields.first_mut().and_then(Option::take) {
                Some(generation) => tags::parse_generation(&generation),
                None => None,
            };
            // A version that is not a number was not written by this crate: the values of its
            // tag count as invalidated (a miss, then reloaded), never as valid.
            Ok(generation.map(|generation| TagVersions {
                generation,
                versions: fields
                    .into_iter()
                    .skip(1)
                    .map(|version| version.map_or(0, |bytes| counter(&bytes).unwrap_or(u64::MAX)))
                    .collect(),
            }))
        })
    }

    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&INVALIDATE_TAGS, &[tag_state_name(namespace)]);
        call.arg(self.fill_channel(namespace))
            .arg(self.origin())
            .arg(tags::generation_text(tags::new_generation()))
            .arg(tag_state_fields());
        for tag in tags {
            call.arg(&tag.hex_bytes()[..]);
        }
        let keys: Vec<StoreKey> = tags
            .iter()
            .map(|tag| StoreKey::new(std::sync::Arc::from(namespace), *tag))
            .collect();
        Box::pin(async move {
            let ran: Result<i64, StoreError> = self.run(&INVALIDATE_TAGS, &call).await;
            // Whatever the answer: the change may have been made.
            for key in &keys {
                self.changed_here(key);
            }
            ran.map(drop)
        })
    }

    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&CLEAR, &[tag_state_name(namespace)]);
        call.arg(self.fill_channel(namespace))
            .arg(self.origin())
            .arg(tags::generation_text(tags::new_generation()))
            .arg(CLEARED);
        Box::pin(async move {
            let ran: Result<i64, StoreError> = self.run(&CLEAR, &call).await;
            // Whatever the answer: the change may have been made.
            self.cleared_here();
            ran.map(drop)
        })
    }
}

/// The most fields a namespace's tag state keeps: its tags' versions, its generation and
/// its clock.
fn tag_state_fields() -> usize {
    MAX_TAG_VERSIONS + 2
}

/// A counter as Redis writes it (decimal digits).
fn counter(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// The load start of a value the engine wrote, as the fenced scripts take it (`""` for other
/// bytes, which they let any write replace).
fn load_start_arg(value: &[u8]) -> String {
    load_start(value).map_or_else(String::new, |started| started.to_string())
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
