//! The engine end to end, over both stores: the embedded `MemoryStore` and (feature `redis`) a
//! real `redis-server`. Tests that depend on timing run over `MemoryStore` on paused tokio
//! time (`timed_test!`); Redis keeps its own clock, so its runs take real time.
//!
//! One binary, a module per behaviour:
//!
//! | file | holds |
//! | --- | --- |
//! | `fleet.rs` | cost as the fleet grows: store calls per process and stampede, busy processes |
//! | `batch.rs` | batches: one lookup round trip, one load of the keys a call leads, fences |
//! | `batch_stale.rs` | a batch's stale values: while reloading, on errors, after a soft timeout |
//! | `batch_outage.rs` | a batch when the store does not answer: a dropped lookup, an open breaker |
//! | `followers.rs` | the leader and its followers: one load per stampede, takeovers, wait timeouts |
//! | `for_waiters.rs` | results for the waiting calls only (`Loaded::for_waiters`) |
//! | `failures.rs` | failed, panicking and timed-out loads, and the shared failure marker |
//! | `stale.rs` | stale values while refreshing, on errors and after a wait timeout |
//! | `early_refresh.rs` | early refresh (XFetch) of hot keys |
//! | `breaker.rs` | the store failing: degraded service, the circuit breaker, reconnection |
//! | `wire.rs` | what the store holds: foreign bytes, the `fresh` marker, round trips |
//! | `fences.rs` | lock ownership and fenced writes: no older value over a newer one |
//! | `renewals.rs` | a leader's lock lives until its fill: renewals, a batch's in one call, lapsed locks |
//! | `settings.rs` | settings that cannot work, refused by the build by name; typed header names; a cache shows its settings |
//! | `soft_timeout.rs` | a stale value answered after a soft timeout while the reload goes on |
//! | `hits.rs` | L1 and L2 hits, lifetimes, hostile durations, the fetch span |
//! | `stats.rs` | `Cache::stats`'s answer counts, and `Health` by name (`Display`, `Serialize`) |
//! | `jitter.rs` | TTL jitter: keys written together expire over a spread |
//! | `peek.rs` | `Cache::get`: what is cached, never loaded, never locked |
//!
//! This file holds the loaders and store helpers the modules share.

mod batch;
mod batch_outage;
mod batch_stale;
mod breaker;
mod early_refresh;
mod failures;
mod fences;
mod fleet;
mod followers;
mod for_waiters;
mod hits;
mod jitter;
mod peek;
mod renewals;
mod settings;
mod soft_timeout;
mod stale;
mod stats;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{Counter, Shared};
use tower_stampede::store::{LockState, LockToken, LockWhen, Store};
use tower_stampede::{Cache, Loaded};

/// A loader that counts its call on `counter`, takes `delay` and answers `value`.
fn slow_value(
    counter: &Counter,
    delay: Duration,
    value: &'static str,
) -> impl FnOnce() -> futures_ready::Load + Send + 'static {
    let counter = counter.clone();
    move || {
        Box::pin(async move {
            counter.hit();
            tokio::time::sleep(delay).await;
            Ok(Bytes::from_static(value.as_bytes()))
        })
    }
}

/// The boxed future of [`slow_value`] and [`early_refresh`]'s loaders.
mod futures_ready {
    use std::future::Future;
    use std::pin::Pin;

    pub type Load = Pin<Box<dyn Future<Output = Result<bytes::Bytes, std::io::Error>> + Send>>;
}

/// A loader for calls that must be answered without loading.
async fn never_called() -> Result<Loaded, std::io::Error> {
    panic!("this loader must not run")
}

/// Holds the lock of `key` for a long time, as a live leader elsewhere would.
async fn hold_lock(shared: &Shared, cache: &Cache, key: &str) -> LockToken {
    let token = LockToken::random();
    let lookup = shared
        .store
        .lookup(
            &cache.store_key(key),
            token,
            Duration::from_secs(60),
            LockWhen::Always,
        )
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    token
}

/// Followers whose polls would take a minute: only a notification can wake them in time.
fn deaf_to_polls(store: Arc<dyn Store>) -> tower_stampede::CacheBuilder {
    Cache::builder_shared(store)
        .namespace("test")
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
}

/// A loader that counts its call on `loads` and answers at once: `Ok` a value, `Err` a
/// failure with that message.
fn loader(
    loads: &Counter,
    answer: Result<&'static str, &'static str>,
) -> impl FnOnce() -> std::future::Ready<Result<Loaded, std::io::Error>> + Send + 'static {
    let loads = loads.clone();
    move || {
        loads.hit();
        std::future::ready(
            answer
                .map(|v| Loaded::value(Bytes::from_static(v.as_bytes())))
                .map_err(std::io::Error::other),
        )
    }
}
