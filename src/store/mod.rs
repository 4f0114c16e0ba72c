//! Shared stores: where values and reload locks live across processes.
//!
//! A [`Store`] keeps two things per key: the cached value (with a TTL) and a short reload lock
//! (with a TTL and a random owner token). Every call is ONE round trip on Redis. A store
//! implements the calls marked *primitive*; the named writes are [`StoreExt`]'s, on top of
//! [`settle`](Store::settle) and [`change`](Store::change) for every store, and the rest are
//! defaults a store may override:
//!
//! | call | kind | what it does |
//! | --- | --- | --- |
//! | [`Store::lookup`] | primitive | value and its remaining life if present; if absent or about to expire (see [`LockWhen`]), try `SET lock NX PX` |
//! | [`Store::lookup_many`] | default: a lookup each | the lookups of a batch of keys, in one round trip |
//! | [`Store::get`] | primitive | a plain read of the value and its remaining life |
//! | [`Store::extend`] | primitive | compare-and-`PEXPIRE` of many locks at once, for the renewals of long loads |
//! | [`Store::settle`] | primitive | the end of a lock, fenced by its token: one of [`Settle`]'s |
//! | [`StoreExt::fill`] | [`Settle::Fill`] | fenced write: store the value only while the lock still holds our token, then drop the lock |
//! | [`StoreExt::renew`] | [`Settle::Renew`] | fenced renewal: the value is fresh again for a new TTL, its bytes untouched, then drop the lock |
//! | [`StoreExt::answer_waiters`] | [`Settle::AnswerWaiters`] | fenced write of a load's answer for its waiters only, beside the value (which stays, for the next load to revalidate), then drop the lock |
//! | [`StoreExt::fail`] | [`Settle::Fail`] | compare-and-replace the lock by a short failure marker: followers fail at once |
//! | [`StoreExt::release`] | [`Settle::Release`] | compare-and-delete: never removes someone else's lock |
//! | [`Store::waiters_answer`] | default: none | a plain read of the waiters' answer and its remaining life |
//! | [`Store::change`] | primitive | a change outside a load, whatever the lock holds: one of [`Change`]'s |
//! | [`StoreExt::put`] | [`Change::Put`] | write of the value (and a notification), the lock untouched; refused where the stored value's load started later ([`load_start`]) |
//! | [`StoreExt::set`] | [`Change::Set`] | write of the value, its lock voided, then notify |
//! | [`StoreExt::expire`] | [`Change::Expire`] | end of the value's freshness, its lock voided, then notify |
//! | [`StoreExt::invalidate`] | [`Change::Invalidate`] | remove the value and void its lock, whoever holds it, then notify |
//! | [`Store::invalidate_many`] | default: an invalidation each | the invalidations of several keys, in one round trip |
//! | [`Store::tag_clock`], [`Store::tag_versions`], [`Store::invalidate_tags`] | primitive | a namespace's tag state (see [`TagClock`]) |
//! | [`Store::clear`] | default: refuses | a new tag generation: every value of the namespace outdated |
//! | [`Store::subscribe`], [`Store::notifier`] | default: none | not round trips: a watch woken when the key is filled or released, and the notifier L1 entries are stamped with |
//! | [`Store::call_limit`] | default: none | not a round trip: how many calls the store takes at once |
//!
//! Two implementations ship with the crate: [`MemoryStore`], the embedded default (one process,
//! no server), and `RedisStore` (feature `redis`, on by default), shared by every process that
//! points at the same Redis or Redis Cluster (feature `cluster`).
//!
//! Stores hold opaque bytes; the [`cache`](crate::cache) engine decides what they mean, so a
//! store never needs to parse a value.
//!
//! A failed call is a [`StoreError`]: its [`kind`](StoreError::kind) says what went wrong, its
//! `source()` the client's own error. The engine answers every kind the same way, by falling
//! back to protection within this process.
//!
//! # What is for whom
//!
//! **For applications**: [`MemoryStore`], `RedisStore` and `RedisStoreBuilder` (feature
//! `redis`), and [`StoreError`] with its [`StoreErrorKind`]. Everything else here is needed
//! only to write a store of your own; applications never call it (the engine does).
//!
//! **For `Store` implementors**, the one extension point:
//!
//! - the trait, [`Store`], with what its calls take and return: [`StoreKey`] (a namespace and
//!   a [`KeyDigest`], the SHA-256 of the logical key), [`LockToken`], [`Stored`],
//!   [`Lookup`], [`LockState`], [`LockWhen`], [`Settle`], [`Settled`], [`Change`],
//!   [`Renewal`], [`BoxFuture`], and [`load_start`];
//! - the notifications a store feeds, if it has any: [`Notifier`] (the store calls
//!   [`notify`](Notifier::notify) for each change, [`lost`](Notifier::lost) and
//!   [`restored`](Notifier::restored) as its subscription drops and comes back,
//!   [`subscription_failed`](Notifier::subscription_failed)); the engine takes
//!   [`Stamp`]s and [`FillWatch`]es from it;
//! - tag invalidation: [`TagClock`], [`TagVersions`] and [`MAX_TAG_VERSIONS`];
//! - how many calls it takes at once: [`CallLimit`], shared by every cache over the store.
//!
//! A store's health is read through the cache, not the store: [`Cache::health`]
//! (`notifications_live`, `store_answers`, `breaker_closed`).
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | this map, and the names the crate shows |
//! | `named.rs` | [`StoreExt`]: the named writes, each one call of a primitive |
//! | `lookup.rs` | what a lookup asks and answers: [`LockWhen`], [`Lookup`], [`LockState`], [`Stored`] |
//! | `primitives.rs` | the [`Store`] trait: its primitives, what the write primitives take and answer ([`Settle`], [`Settled`], [`Change`]; [`Renewal`]), [`load_start`], how durations become milliseconds |
//! | `key.rs` | [`StoreKey`], [`KeyDigest`], [`LockToken`] |
//! | `notify.rs` | the [`Notifier`] and its watches |
//! | `tags.rs` | a namespace's tag state: [`TagClock`], [`TagVersions`] |
//! | `call_limit.rs` | [`CallLimit`] |
//! | `error.rs` | [`StoreError`] |
//! | `memory/` | [`MemoryStore`] |
//! | `redis/` | `RedisStore` (feature `redis`) |
//!
//! [`Cache::health`]: crate::Cache::health

mod call_limit;
mod error;
pub(crate) mod key;
mod lookup;
mod memory;
mod named;
mod notify;
mod primitives;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod tags;

pub use call_limit::CallLimit;
pub use error::{StoreError, StoreErrorKind};
pub use key::{KeyDigest, LockToken, StoreKey};
pub use lookup::{LockState, LockWhen, Lookup, Stored};
pub use memory::MemoryStore;
pub use named::StoreExt;
pub use notify::{FillWatch, Notifier, Stamp};
pub use primitives::load_start;
pub use primitives::{BoxFuture, Change, Renewal, Settle, Settled, Store};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisStoreBuilder};
pub use tags::{TagClock, TagVersions, MAX_TAG_VERSIONS};
