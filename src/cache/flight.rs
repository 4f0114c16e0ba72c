//! Flights: concurrent misses of one key in this process share one flight, which resolves the
//! key once (one store round trip, at most one load) and hands every caller the same answer.
//! The caller that starts a flight carries it, and the callers that join it wait on what it
//! posts (see [`carry`](super::carry)). A flight runs to the end even if every caller goes
//! away, and leaves the map of flights however it ends ([`ListedFlight`]).

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::carry::{CarriedFlight, FlightPosts};
use super::engine::Cache;
use super::engine::Inner;
use super::entry::{self, Entry};
use super::error::{BoxError, Error};
use super::fetched::Fetched;
use super::fetched::{FlightResult, Own};
use super::flights::Entered;
use super::l1::L1Hit;
use super::loaded::{Loaded, Previous};
use super::outcome::Outcome;
use super::protocol::{EarlyRefresh, Follower};
use super::telemetry::WaitEnd;
use crate::store::{BoxFuture, KeyDigest};

/// A flight's loader, and which stored payloads its caller can read: a stored value whose
/// payload it cannot read is treated as a corrupt entry (a miss, counted and overwritten).
/// Built once per flight, never on an L1 hit, in one allocation (none for a loader that
/// captures nothing).
pub(super) struct BoxLoader {
    load: Box<dyn Load>,
    /// The caller's soft timeout (see [`CacheBuilder::soft_timeout`](super::CacheBuilder::soft_timeout)).
    soft_timeout: Option<Duration>,
}

/// What a [`BoxLoader`] holds: the caller's loader and its test of payloads.
trait Load: Send {
    fn accepts(&self) -> &(dyn Fn(&Bytes) -> bool + Send + Sync);

    fn run(
        self: Box<Self>,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>>;
}

/// A [`Load`] of a caller's test `accepts` and its `loader`, and where what the loader gives
/// its own caller goes (see [`Own`]).
struct CallerLoad<A, F, O> {
    accepts: A,
    loader: F,
    give: Option<oneshot::Sender<O>>,
}

impl<A, F, Fut, E, O> Load for CallerLoad<A, F, O>
where
    A: Fn(&Bytes) -> bool + Send + Sync + 'static,
    F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
    Fut: Future<Output = (Result<Loaded, E>, Option<O>)> + Send + 'static,
    E: Into<BoxError>,
    O: Send + 'static,
{
    fn accepts(&self) -> &(dyn Fn(&Bytes) -> bool + Send + Sync) {
        &self.accepts
    }

    fn run(
        self: Box<Self>,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>> {
        let CallerLoad { loader, give, .. } = *self;
        Box::pin(async move {
            let (shared, own) = loader(previous).await;
            // Given before the flight sees what was shared (see `Own`).
            if let (Some(give), Some(own)) = (give, own) {
                let _ = give.send(own);
            }
            shared.map_err(Into::into)
        })
    }
}

/// Which stored payloads a flight's caller can read (borrowed from its [`BoxLoader`]).
#[derive(Clone, Copy)]
pub(super) struct Reader<'a>(&'a (dyn Fn(&Bytes) -> bool + Send + Sync));

impl<'a> Reader<'a> {
    /// A reader of the payloads `accepts` says yes to.
    pub(super) fn of(accepts: &'a (dyn Fn(&Bytes) -> bool + Send + Sync)) -> Self {
        Reader(accepts)
    }

    /// Decodes a store entry; a value this reader's caller cannot read is corrupt.
    pub(super) fn decode(self, bytes: Bytes) -> Result<Entry, entry::Corrupt> {
        match entry::decode(bytes)? {
            Entry::Value { payload, .. } | Entry::ForWaiters { payload, .. }
                if !(self.0)(&payload) =>
            {
                Err(entry::Corrupt)
            }
            entry => Ok(entry),
        }
    }
}

impl BoxLoader {
    /// The loader of a caller with its `soft_timeout`; what `loader` gives its own caller
    /// goes to `give`, if that caller waits for it.
    pub(super) fn new<A, F, Fut, E, O>(
        accepts: A,
        loader: F,
        soft_timeout: Option<Duration>,
        give: Option<oneshot::Sender<O>>,
    ) -> Self
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<Loaded, E>, Option<O>)> + Send + 'static,
        E: Into<BoxError>,
        O: Send + 'static,
    {
        BoxLoader {
            load: Box::new(CallerLoad {
                accepts,
                loader,
                give,
            }),
            soft_timeout,
        }
    }

    /// What its caller can read.
    pub(super) fn reader(&self) -> Reader<'_> {
        Reader(self.load.accepts())
    }

    /// Starts the load, handed the value it reloads when there is one.
    pub(super) fn run(
        self,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>> {
        self.load.run(previous)
    }

    /// How long its caller waits for a reload before it takes a stale value, if it does.
    pub(super) fn soft_timeout(&self) -> Option<Duration> {
        self.soft_timeout
    }
}

impl Cache {
    /// Answers from L1, or joins this process's flight for the key, or starts one; with what
    /// the caller's own loader gave it, if it ran (see [`Own`]).
    pub(super) async fn fetch_digest<A, F, Fut, E, O>(
        &self,
        digest: KeyDigest,
        soft_timeout: Option<Duration>,
        accepts: A,
        loader: F,
    ) -> (Result<Fetched, Error>, Own<O>)
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<Loaded, E>, Option<O>)> + Send + 'static,
        E: Into<BoxError>,
        O: Send + 'static,
    {
        // The hot path: a fresh value this thread answered before, or one moka holds.
        let recoveries = || self.inner.parts.breaker.recoveries();
        if let Some((value, fresh_until, _)) = self.inner.parts.l1.get_value(&digest, recoveries) {
            let value = Bytes::clone(&value.0);
            let fetched = Fetched::cached(value, Outcome::L1Hit, Some(fresh_until));
            return (Ok(fetched), Own::none());
        }
        let mut l1_checked_twice = false;
        let (own, answer) = loop {
            if let Some(hit) = self.inner.parts.l1_get(&digest) {
                let (entry, own) = match hit {
                    L1Hit::RefreshDue(entry) => {
                        // What the refresh gives this caller still reaches it: the HTTP layer's
                        // refresh of a vary marker may send this very request.
                        let (give, own) = Own::channel();
                        let loader = BoxLoader::new(accepts, loader, soft_timeout, Some(give));
                        EarlyRefresh::start(&self.inner.parts, digest, loader, entry.fresh_until);
                        (entry, own)
                    }
                    L1Hit::Fresh(entry, _) => (entry, Own::none()),
                };
                let value = entry.value.clone();
                let fetched = Fetched::cached(value, Outcome::L1Hit, Some(entry.fresh_until));
                return (Ok(fetched), own);
            }
            let look_again = !l1_checked_twice;
            // A flight may have filled L1 and landed since the look above: look once more
            // rather than pay a store round trip.
            // What this process has heard of the key: a flight from before a change heard
            // since is not joined.
            let heard = self.inner.parts.l1.stamp_anyway(&digest);
            let (id, posts) = match self.inner.flights.enter(digest, heard, || {
                look_again && self.inner.parts.l1.contains(&digest)
            }) {
                Entered::Joined(posts) => {
                    let joined_at = Instant::now();
                    let answer = posts.wait().await;
                    self.inner
                        .parts
                        .meter
                        .follower_wait(joined_at.elapsed(), WaitEnd::Joined);
                    if posts.is_outdated() {
                        // Its value is outdated by a tag invalidated during its load, perhaps
                        // before this caller came: fetch again.
                        l1_checked_twice = false;
                        continue;
                    }
                    break (None, answer);
                }
                Entered::LookAgain => {
                    l1_checked_twice = true;
                    continue;
                }
                Entered::Started(id, posts) => (id, posts),
            };
            let (give, own) = Own::channel();
            let loader = BoxLoader::new(accepts, loader, soft_timeout, Some(give));
            let landing = ListedFlight {
                inner: Arc::clone(&self.inner),
                digest,
                id,
            };
            let flight: BoxFuture<'static, FlightResult> =
                Box::pin(fly(landing, Arc::clone(&posts), loader));
            let mut carried = CarriedFlight::new(flight, posts);
            let answer = poll_fn(|cx| carried.poll(cx)).await;
            // A flight that posted an early answer (a stale value served while it refreshes)
            // goes on as a task of its own.
            drop(carried);
            break (Some(own), answer);
        };
        let answer = answer.map(|mut fetched| {
            // Only the caller that started the flight gave it its loader.
            if own.is_none()
                && matches!(
                    fetched.outcome,
                    Outcome::Leader | Outcome::Uncached | Outcome::Degraded | Outcome::Revalidated
                )
            {
                fetched.outcome = Outcome::Follower;
            }
            fetched
        });
        (answer, own.unwrap_or_else(Own::none))
    }
}

/// Removes a flight from the map when it ends, whichever way it ends (even if it is dropped
/// before it first runs, as when its runtime shuts down).
struct ListedFlight {
    inner: Arc<Inner>,
    digest: KeyDigest,
    id: u64,
}

impl Drop for ListedFlight {
    fn drop(&mut self) {
        self.inner.flights.land(self.digest, self.id);
    }
}

/// A flight: resolve the key (posting an early answer through `early` where there is one),
/// then land (leave the map) and answer.
async fn fly(landing: ListedFlight, early: Arc<FlightPosts>, loader: BoxLoader) -> FlightResult {
    let answer = Follower::resolve(&landing.inner.parts, landing.digest, loader, &early).await;
    drop(landing);
    answer
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::sync::oneshot;

    use crate::store::MemoryStore;
    use crate::{Cache, Loaded, Outcome};

    /// Counts the wakes of the task it is the waker of.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_caller_carrying_a_flight_is_woken_by_the_flight_alone() {
        // Nothing else may wake it (such as a wait for an early answer, or the end of the
        // flight's watch): each such wake would cost every L2 hit a spurious poll and a
        // scheduler turn.
        let cache = Cache::builder(MemoryStore::new()).l1_capacity(0).build();
        let (loaded, load) = oneshot::channel::<()>();
        let mut fetch = pin!(cache.fetch("carried", move || async move {
            let _ = load.await;
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
        }));
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let woken = || wakes.0.load(Ordering::Relaxed);
        assert!(fetch.as_mut().poll(&mut cx).is_pending(), "the load waits");
        loaded.send(()).expect("the load is waiting");
        // Polled each time it is woken, as a task is, until it answers.
        let (fetched, woken_at_last_poll) = loop {
            let before = woken();
            tokio::time::timeout(Duration::from_secs(5), async {
                while woken() == before {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the flight wakes its carrier");
            let at_poll = woken();
            if let Poll::Ready(fetched) = fetch.as_mut().poll(&mut cx) {
                break (fetched, at_poll);
            }
        };
        assert_eq!(fetched.expect("loaded").outcome(), Outcome::Leader);
        assert_eq!(
            woken(),
            woken_at_last_poll,
            "the end of the flight woke its own carrier"
        );
    }

    /// A hit in L1 that starts an early refresh with its caller's loader: what that loader
    /// gives its own caller still reaches the caller (the HTTP layer's refresh of a vary
    /// marker may send the very request the caller waits to have answered).
    #[tokio::test(start_paused = true)]
    async fn what_an_early_refresh_gives_reaches_the_caller_of_the_hit_that_started_it() {
        let cache = Cache::builder(MemoryStore::new())
            .ttl(Duration::from_secs(1))
            .early_refresh(1e9)
            .build();
        let load = |value: &'static [u8]| {
            move |_| async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let loaded = Loaded::value(Bytes::from_static(value));
                (Ok::<_, std::io::Error>(loaded), Some(value))
            }
        };
        let (first, _) = cache
            .fetch_as(crate::cache::Ask::key(b"k"), load(b"v1"))
            .await;
        assert_eq!(first.expect("loaded").outcome(), Outcome::Leader);
        tokio::time::advance(Duration::from_millis(500)).await;
        let (hit, own) = cache
            .fetch_as(crate::cache::Ask::key(b"k"), load(b"v2"))
            .await;
        assert_eq!(hit.expect("a hit").outcome(), Outcome::L1Hit);
        assert_eq!(
            own.ended().await,
            Some(&b"v2"[..]),
            "the refresh's own answer"
        );
    }
}
