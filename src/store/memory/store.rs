//! `impl Store for MemoryStore`: each call one step on the state under its lock, as each Redis
//! script is one step on the server.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::{
    BoxFuture, Change, FillWatch, KeyDigest, LockToken, LockWhen, Lookup, Notifier, Settle,
    Settled, Store, StoreError, StoreKey, Stored, TagClock, TagVersions, MAX_TAG_VERSIONS,
};
use super::state::TagState;
use super::{expiry, MemoryStore};

impl Store for MemoryStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        let result = self.lookup_now(key, token, lock_ttl, lock_when);
        Box::pin(async move { Ok(result) })
    }

    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        let found = keys
            .iter()
            .map(|key| self.lookup_now(key, token, lock_ttl, lock_when))
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn settle(
        &self,
        key: &StoreKey,
        token: LockToken,
        how: Settle,
    ) -> BoxFuture<'_, Result<Settled, StoreError>> {
        let settled = match how {
            Settle::Fill { value, ttl } => self.fill_now(key, token, value, ttl),
            Settle::Renew { ttl } => self.renew_now(key, token, ttl),
            Settle::AnswerWaiters { answer, ttl } => {
                self.answer_waiters_now(key, token, answer, ttl)
            }
            Settle::Fail { failure_ttl } => self.fail_now(key, token, failure_ttl),
            Settle::Release => self.release_now(key, token),
        };
        Box::pin(async move { Ok(settled) })
    }

    fn change(&self, key: &StoreKey, what: Change) -> BoxFuture<'_, Result<bool, StoreError>> {
        let changed = match what {
            Change::Put { value, ttl } => self.write_fenced(key, value, ttl, false),
            Change::Set { value, ttl, .. } => self.write_fenced(key, value, ttl, true),
            Change::Expire { keep } => {
                self.change_now(key, |old, now| {
                    let (bytes, expires) = old?;
                    let kept = (!keep.is_zero()).then(|| expiry(now, keep))?;
                    Some((bytes, expires.min(kept)))
                });
                true
            }
            Change::Invalidate => {
                self.change_now(key, |_, _| None);
                true
            }
        };
        Box::pin(async move { Ok(changed) })
    }

    fn extend(
        &self,
        locks: &[(StoreKey, LockToken)],
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        let result = self.extend_now(locks, lock_ttl);
        Box::pin(async move { Ok(result) })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let result = self.state().live_value(key, Instant::now());
        Box::pin(async move { Ok(result) })
    }

    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let result = self.waiters_answer_now(key);
        Box::pin(async move { Ok(result) })
    }

    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        Some(self.notifier.watch(key))
    }

    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        for key in keys {
            self.change_now(key, |_, _| None);
        }
        Box::pin(async { Ok(()) })
    }

    fn notifier(&self) -> Option<&Notifier> {
        Some(&self.notifier)
    }

    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        self.state()
            .tags
            .insert(namespace.to_owned(), TagState::new());
        self.notifier.cleared();
        Box::pin(async { Ok(()) })
    }

    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        let mut state = self.state();
        let tags = state
            .tags
            .entry(namespace.to_owned())
            .or_insert_with(TagState::new);
        let clock = TagClock {
            generation: tags.generation,
            clock: tags.clock,
        };
        Box::pin(async move { Ok(clock) })
    }

    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        let state = self.state();
        let versions = state.tags.get(namespace).map(|state| TagVersions {
            generation: state.generation,
            versions: tags
                .iter()
                .map(|tag| state.versions.get(tag).copied().unwrap_or(0))
                .collect(),
        });
        Box::pin(async move { Ok(versions) })
    }

    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        {
            let mut state = self.state();
            let state = state
                .tags
                .entry(namespace.to_owned())
                .or_insert_with(TagState::new);
            if state.versions.len() + tags.len() > MAX_TAG_VERSIONS {
                *state = TagState::new();
            }
            state.clock += 1;
            for tag in tags {
                state.versions.insert(*tag, state.clock);
            }
        }
        let namespace: Arc<str> = Arc::from(namespace);
        for tag in tags {
            self.notifier
                .notify(&StoreKey::new(Arc::clone(&namespace), *tag));
        }
        Box::pin(async { Ok(()) })
    }
}
