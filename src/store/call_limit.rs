//! How many of a store's calls may be out at once: a limit the store owns, so that every
//! [`Cache`](crate::Cache) over it (and over its clones) shares it.

use std::fmt;
use std::sync::Arc;

use tokio::sync::Semaphore;

/// How many calls a store takes at once before it queues them inside its client, where their
/// time would run against the engine's store timeout while they have not even been sent; a
/// store's ([`Store::call_limit`](super::Store::call_limit)) is shared by every cache over the
/// store and its clones, so that together they keep no more out than the client takes.
///
/// Half of it is for lookups, half for the calls of flights past their lookup (the tag clock
/// read before a load, fills, renewals, releases), so that these never wait behind a burst of
/// lookups while their locks run out. A call beyond it waits in the process, its timeout not
/// yet running. Clones share the room.
///
/// ```
/// use tower_stampede::store::CallLimit;
///
/// let limit = CallLimit::new(96);
/// assert_eq!(limit.calls(), 96);
/// assert_eq!(limit.clone().calls(), 96);
/// ```
#[derive(Clone)]
pub struct CallLimit(Arc<Lanes>);

struct Lanes {
    calls: usize,
    lookups: Semaphore,
    finishing: Semaphore,
}

impl CallLimit {
    /// What [`Store::call_limit`](super::Store::call_limit) stands for when a store has none,
    /// in each cache over it: enough to keep a connection's pipeline full (a few hundred
    /// commands take Redis a few milliseconds), few enough that the last of them is answered
    /// well within a timeout.
    pub const DEFAULT_CALLS: usize = 512;

    /// Room for `calls` calls at once: half for lookups, half for the calls of flights past
    /// their lookup; at least one each.
    pub fn new(calls: usize) -> Self {
        let lane = (calls / 2).max(1);
        CallLimit(Arc::new(Lanes {
            calls,
            lookups: Semaphore::new(lane),
            finishing: Semaphore::new(lane),
        }))
    }

    /// How many calls it takes at once, as given to [`new`](Self::new).
    pub fn calls(&self) -> usize {
        self.0.calls
    }

    /// The room for lookups.
    pub(crate) fn lookups(&self) -> &Semaphore {
        &self.0.lookups
    }

    /// The room for the calls of flights past their lookup.
    pub(crate) fn finishing(&self) -> &Semaphore {
        &self.0.finishing
    }
}

impl Default for CallLimit {
    fn default() -> Self {
        CallLimit::new(CallLimit::DEFAULT_CALLS)
    }
}

impl fmt::Debug for CallLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallLimit")
            .field("calls", &self.0.calls)
            .field("lookups_room", &self.0.lookups.available_permits())
            .field("finishing_room", &self.0.finishing.available_permits())
            .finish()
    }
}
