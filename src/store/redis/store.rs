//! `impl Store for RedisStore`: each call one round trip (a pipeline of plain commands, or a
//! script), and how the replies are read.
//! Lookups have their own file, `lookup.rs`, and so has a namespace's tag state, `tag_state.rs`;
//! the trait's calls go there.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Pipeline, RedisResult, Script};
use tracing::warn;

use super::names::KeyName;
use super::scripts::{
    command, publish_filled, script_call, ANSWER, EXPIRE, EXTEND, FAIL, FILL, INVALIDATE, PUT,
    RELEASE, RENEW, SET,
};
use super::RedisStore;
use crate::store::{
    lapsed_kept_for, load_start, millis, BoxFuture, CallLimit, FillWatch, KeyDigest, LockToken,
    LockWhen, Lookup, Notifier, Renewal, Store, StoreError, StoreKey, Stored, TagClock,
    TagVersions,
};

impl RedisStore {
    /// Runs a script fenced by the lock's token: it answers 1 if the lock held the token (and
    /// the script did its work), 0 if not.
    async fn run_fenced(&self, script: &Script, call: Cmd) -> Result<bool, StoreError> {
        let done: i64 = self.run(script, &call).await?;
        Ok(done == 1)
    }

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

/// A stored value from a `{value, pttl}` reply; `pttl` -2 means absent, -1 no expiry.
pub(super) fn stored(value: Vec<u8>, pttl: i64) -> Option<Stored> {
    (pttl != -2).then(|| Stored {
        bytes: Bytes::from(value),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}

impl Store for RedisStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        self.lookup_key(key, token, lock_ttl, lock_when)
    }

    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        self.lookup_keys(keys, token, lock_ttl, lock_when)
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
        locks: &[(StoreKey, LockToken)],
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        // The lock key lives the lock's TTL, then the time it is kept lapsed.
        let kept = millis(lapsed_kept_for(lock_ttl));
        let lives = millis(lock_ttl).saturating_add(kept);
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

    fn call_limit(&self) -> Option<&CallLimit> {
        Some(&self.call_limit)
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
