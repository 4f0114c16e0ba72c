//! The protocol across processes: what one flight does once it misses L1, as a type per
//! role, each made by the engine for one flight and owning what that flight needs (its key,
//! lock token and guard, fills' watch, loader, callers' posts): a [`Follower`] (every flight
//! starts as one: its lookups, and its wait for another leader's load), a
//! [`Leader`](leader::Leader) (a flight, or a batch's key, that holds the lock), a
//! [`Batch`](batch::Batch), and an [`EarlyRefresh`]. Each is handed the engine's
//! [`Parts`](super::parts::Parts) (the store behind its breaker, L1, known tags, renewals,
//! refreshes, the meter, and the settings they read), never the engine itself; a batch is
//! handed the [`Cache`](crate::Cache) too, as the way its followed keys join flights. The
//! services every role shares: `Lookups` (a lookup and the fills' watch taken before it, over
//! the components it reads: `lookup.rs`), and the load on `Parts`, run and made ready for the
//! store (`load.rs`).
//! Each role's methods stand in its own file or in a file below it, so that no file imports
//! from one that imports from it.
//!
//! | file | holds |
//! | --- | --- |
//! | `follower.rs` | [`Follower`]: one flight's lookups, the follower's loop until the value is there, the lock is free (it leads), or the wait times out; its reads of the waiters' slot |
//! | `lookup.rs` | `Lookups`: one lookup, "the value, or the lock", and what it found; the watch of the key's fills taken before it |
//! | `wait.rs` | how a follower waits between reads: for the fill's notification, or the backoff poll |
//! | `waiters.rs` | a load's answer for its waiters, and how a follower tells its load's from an earlier one |
//! | `without_lock.rs` | a follower's loads without the lock: after a wait timeout, or while the store fails |
//! | `leader.rs` | `Leader`: the load under the reload lock, its fenced fill, its release or failure marker |
//! | `load.rs` | a load as every role runs it: in its task, bounded and counted; its value made ready for the store and kept in L1 |
//! | `lock.rs` | the reload lock's drop guard; a batch's pending locks' drop guard |
//! | `revalidate.rs` | a leader's reload handed the stale value, and "not modified" renewing it |
//! | `soft.rs` | soft timeouts, a leader's and a follower's: a stale value answered while a slow reload goes on |
//! | `stale.rs` | a stale value read: its windows, and whether it still stands when it is served |
//! | `batch.rs` | `Batch`: a batch of keys, one lookup round trip, one load for the keys it leads |
//! | `batch_stale.rs` | a batch's stale values: at once while reloading, after a soft timeout |
//! | `batch_outage.rs` | a batch without the store: its load alone |
//! | `refresh.rs` | [`EarlyRefresh`]: an early refresh in the background, one per key and process; a fresh value found in the store as an answer, which starts one when due |

pub(super) mod batch;
mod batch_outage;
mod batch_stale;
mod follower;
mod leader;
mod load;
mod lock;
pub(super) mod lookup;
mod refresh;
mod revalidate;
mod soft;
mod stale;
mod wait;
mod waiters;
mod without_lock;

pub(super) use follower::Follower;
pub(super) use refresh::EarlyRefresh;
