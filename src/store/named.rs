//! The named operations the engine calls on a store, each one call of a write primitive
//! ([`Store::settle`] or [`Store::change`]): a store implements the primitives once, and every
//! store, and every `dyn Store`, has these ([`StoreExt`] is implemented for all of them).

use std::time::Duration;

use bytes::Bytes;

use super::error::StoreError;
use super::key::{LockToken, StoreKey};
use super::primitives::{BoxFuture, Store};
use super::primitives::{Change, Renewal, Settle, Settled};

/// The named writes over a [`Store`]'s primitives, for every store (the blanket
/// implementation below): a store never implements them, and a wrapper store forwards the
/// primitives alone.
pub trait StoreExt: Store {
    /// [`Settle::Fill`]: fenced write of `value` for `ttl`; returns whether it was written
    /// (`false` where the lock is not `token`'s, or a value whose load started later stays).
    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        settled_done(self.settle(key, token, Settle::Fill { value, ttl }))
    }

    /// [`Settle::Renew`]: fenced renewal of the value for `ttl`, its bytes untouched.
    fn renew(
        &self,
        key: &StoreKey,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        let settled = self.settle(key, token, Settle::Renew { ttl });
        Box::pin(async move {
            Ok(match settled.await? {
                Settled::Done => Renewal::Renewed,
                Settled::NoValue => Renewal::NoValue,
                Settled::LockLost | Settled::KeptNewer => Renewal::LockLost,
            })
        })
    }

    /// [`Settle::AnswerWaiters`]: fenced answer of a load for its waiters only, for `ttl`;
    /// returns whether the lock was `token`'s.
    fn answer_waiters(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        settled_done(self.settle(key, token, Settle::AnswerWaiters { answer, ttl }))
    }

    /// [`Settle::Fail`]: records a failed load, a failure marker for `failure_ttl` in the
    /// lock's place; returns whether the lock was `token`'s.
    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        settled_done(self.settle(key, token, Settle::Fail { failure_ttl }))
    }

    /// [`Settle::Release`]: deletes the lock of `key` if it holds `token`; returns whether it
    /// did.
    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>> {
        settled_done(self.settle(key, token, Settle::Release))
    }

    /// [`Change::Put`]: writes `value` for `ttl` whatever the lock holds; returns whether it
    /// did (`false` where a value whose load started later stays).
    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.change(key, Change::Put { value, ttl })
    }

    /// [`Change::Set`]: writes `value` for `ttl`, fresh for `fresh_for`, and voids the lock
    /// of `key`; then notifies. Nothing changes where the stored value was written later
    /// (the fence of [`Change::Set`]): the newer write stands, and this one succeeds.
    fn set(
        &self,
        key: &StoreKey,
        value: Bytes,
        fresh_for: Duration,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let what = Change::Set {
            value,
            fresh_for,
            ttl,
        };
        changed(self.change(key, what))
    }

    /// [`Change::Expire`]: ends the freshness of the value of `key`, kept `keep` longer at
    /// most, and voids the lock; then notifies.
    fn expire(&self, key: &StoreKey, keep: Duration) -> BoxFuture<'_, Result<(), StoreError>> {
        changed(self.change(key, Change::Expire { keep }))
    }

    /// [`Change::Invalidate`]: removes the value of `key` and voids its lock, then notifies.
    fn invalidate(&self, key: &StoreKey) -> BoxFuture<'_, Result<(), StoreError>> {
        changed(self.change(key, Change::Invalidate))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// Whether a settlement took effect, for the calls that answer a `bool`.
fn settled_done(
    settled: BoxFuture<'_, Result<Settled, StoreError>>,
) -> BoxFuture<'_, Result<bool, StoreError>> {
    Box::pin(async move { Ok(settled.await? == Settled::Done) })
}

/// A change's answer, for the calls that answer nothing.
fn changed(
    changed: BoxFuture<'_, Result<bool, StoreError>>,
) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move { changed.await.map(drop) })
}
