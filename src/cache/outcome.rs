//! How a call was answered ([`Outcome`]): what the counters, the metrics and the HTTP
//! layer's headers each tell of it.

/// How a [`Cache::fetch`](crate::Cache::fetch) was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// From this process's L1.
    L1Hit,
    /// From the shared store, fresh.
    L2Hit,
    /// This call's own loader ran and its value was filled.
    Leader,
    /// Another call's load (in this process or another) answered this one.
    Follower,
    /// The key is marked "pass": nothing is cached, go to the backend. If this call's own
    /// loader ran, the load was not cacheable.
    Pass,
    /// This call's own loader ran without the lock, and its value was not stored: after the
    /// wait timed out, or for a key whose last load stored nothing but may be shared within
    /// each process (the HTTP layer's body too large to store).
    Uncached,
    /// A stale value (past its freshness, within the stale window), served while a leader
    /// refreshes it, or because the refresh failed.
    Stale,
    /// The store failed, so this call's own loader ran with in-process protection only.
    Degraded,
    /// This call's own loader confirmed the stored value ([`Loaded::not_modified`](crate::Loaded::not_modified)): it is
    /// fresh again, for every process.
    Revalidated,
}

impl Outcome {
    /// A short name for logs and metrics: `hit-l1`, `hit-l2`, `miss-leader`, `follower`,
    /// `pass`, `uncached`, `stale`, `degraded`, `revalidated`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::L1Hit => "hit-l1",
            Outcome::L2Hit => "hit-l2",
            Outcome::Leader => "miss-leader",
            Outcome::Follower => "follower",
            Outcome::Pass => "pass",
            Outcome::Uncached => "uncached",
            Outcome::Stale => "stale",
            Outcome::Degraded => "degraded",
            Outcome::Revalidated => "revalidated",
        }
    }
}
