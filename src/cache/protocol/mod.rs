//! The protocol across processes: what one flight does once it misses L1. It drives the
//! engine's components (L1, the breaker's store calls, known tags, refreshes) and holds no
//! state of its own beyond the flight it runs.
//!
//! | file | holds |
//! | --- | --- |
//! | `batch.rs` | a batch of keys: one lookup round trip, one load for the keys it leads |
//! | `batch_stale.rs` | a batch's stale values: at once while reloading, after a soft timeout |
//! | `batch_outage.rs` | a batch without the store: its load alone |
//! | `follower.rs` | one flight's lookups, and the follower's loop until the value is there, the lock is free, or the wait times out |
//! | `lookup.rs` | one lookup, "the value, or the lock", and what it found |
//! | `wait.rs` | how a follower waits between reads: the fills' watch and the backoff poll |
//! | `leader.rs` | the leader's load under the reload lock, and its fenced fill |
//! | `lock.rs` | the reload lock a leader holds: its drop guard, its renewal, its release or failure marker; a batch's pending locks' drop guard |
//! | `without_lock.rs` | loads made without the lock: after a wait timeout, or while the store fails |
//! | `waiters.rs` | how a follower tells its load's answer for waiters from an earlier one |
//! | `revalidate.rs` | a reload handed the stale value, and "not modified" renewing it |
//! | `stale.rs` | a stale value read: its windows, and whether it still stands when it is served |
//! | `soft.rs` | soft timeouts: a stale value answered while a slow reload goes on |
//! | `refresh.rs` | an early refresh in the background, one per key and process |

pub(super) mod batch;
mod batch_outage;
mod batch_stale;
mod follower;
mod leader;
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
