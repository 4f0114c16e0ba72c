//! Flights: concurrent misses of one key in this process share one flight, which resolves the
//! key once (one store round trip, at most one load) and hands every caller the same answer.
//! The caller that starts a flight drives it within its own task ([`Carried`]): no task of its
//! own, no hop through the scheduler between the store's reply and the answer. A flight runs to
//! the end even if every caller goes away (it becomes a task of its own then), and leaves the
//! map of flights however it ends ([`Landing`]).

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::entry::{self, Entry};
use super::l1::L1Hit;
use super::telemetry::{self, WaitEnd};
use super::{BoxError, Error, ErrorKind, Fetched, Inner, Loaded, Outcome, Previous};
use crate::store::{BoxFuture, KeyDigest};

/// The answer a flight hands to each of its callers.
pub(super) type FlightResult = Result<Fetched, Error>;

/// What a flight has posted so far: nothing, its answer, or an early answer (the stale value
/// a leader serves while it refreshes) with the moment it stops being servable, past which
/// callers that join the flight wait for its answer instead.
pub(super) type Posted = Option<(FlightResult, Option<Instant>)>;

/// Whether a caller may take what a flight has posted.
fn servable(posted: &Posted) -> bool {
    match posted {
        None => false,
        Some((_, None)) => true,
        Some((_, Some(until))) => Instant::now() < *until,
    }
}

/// Where a flight posts for the callers that joined it: its early answer, then its answer.
///
/// The caller that carries the flight reads an early answer right after the poll of the
/// flight that posted it (the post is made within that poll), and takes the answer from the
/// flight itself: it waits on nothing here. Only callers that joined wait, so a flight that
/// nobody joined wakes nobody and posts nothing but an early answer.
#[derive(Default)]
pub(super) struct Posts {
    posted: Mutex<Posted>,
    /// Whether anything was ever posted: the carrier's look after each poll reads only this.
    any: AtomicBool,
    /// Set when the flight has ended, with its answer posted or without one.
    ended: AtomicBool,
    /// How many callers joined the flight (counted under the lock of the map of flights).
    joined: AtomicUsize,
    changed: Notify,
}

impl Posts {
    /// Posts `posted` for the callers that joined the flight, and for those that join later.
    pub(super) fn post(&self, posted: Posted) {
        *crate::sync::lock(&self.posted) = posted;
        self.any.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// The flight has ended: callers still waiting take what is posted, or learn that it
    /// ended without an answer.
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// What is posted, if a caller may take it now.
    fn servable(&self) -> Option<FlightResult> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let posted = crate::sync::lock(&self.posted);
        servable(&posted).then(|| posted.as_ref().map(|(answer, _)| answer.clone()))?
    }

    /// The wait of a caller that joined the flight: for a servable post, or for the end.
    async fn wait(&self) -> FlightResult {
        loop {
            // Made before the look: a `notify_waiters` after it (a post or the end, racing the
            // look) completes it even before its first poll.
            let changed = self.changed.notified();
            if let Some(answer) = self.servable() {
                return answer;
            }
            if self.ended.load(Ordering::Acquire) {
                // Ended with nothing to take: it panicked, or its runtime shut down.
                return Err(Error::new(ErrorKind::LoadPanicked));
            }
            changed.await;
        }
    }
}

/// The flight's end, however it ends: dropped with the flight (or with the task that took it
/// over), it tells the callers still waiting.
struct Poster(Arc<Posts>);

impl Drop for Poster {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A flight's loader, and which stored payloads its caller can read: a stored value whose
/// payload it cannot read is treated as a corrupt entry (a miss, counted and overwritten).
/// Built once per flight, never on an L1 hit, in one allocation (none for a loader that
/// captures nothing).
pub(super) struct BoxLoader(Box<dyn Load>);

/// What a [`BoxLoader`] holds: the caller's loader and its test of payloads.
trait Load: Send {
    fn accepts(&self) -> &(dyn Fn(&Bytes) -> bool + Send + Sync);

    fn run(
        self: Box<Self>,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>>;
}

/// A [`Load`] of a caller's test `accepts` and its `loader`.
struct Parts<A, F> {
    accepts: A,
    loader: F,
}

impl<A, F, Fut, E> Load for Parts<A, F>
where
    A: Fn(&Bytes) -> bool + Send + Sync + 'static,
    F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn accepts(&self) -> &(dyn Fn(&Bytes) -> bool + Send + Sync) {
        &self.accepts
    }

    fn run(
        self: Box<Self>,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>> {
        let loader = self.loader;
        Box::pin(async move { loader(previous).await.map_err(Into::into) })
    }
}

/// Which stored payloads a flight's caller can read (borrowed from its [`BoxLoader`]).
#[derive(Clone, Copy)]
pub(super) struct Reader<'a>(&'a (dyn Fn(&Bytes) -> bool + Send + Sync));

impl Reader<'_> {
    /// Decodes a store entry; a value this reader's caller cannot read is corrupt.
    pub(super) fn decode(self, bytes: &Bytes) -> Result<Entry, entry::Corrupt> {
        match entry::decode(bytes)? {
            Entry::Value { payload, .. } | Entry::ForWaiters { payload } if !(self.0)(&payload) => {
                Err(entry::Corrupt)
            }
            entry => Ok(entry),
        }
    }
}

impl BoxLoader {
    fn new<A, F, Fut, E>(accepts: A, loader: F) -> Self
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        BoxLoader(Box::new(Parts { accepts, loader }))
    }

    /// What its caller can read.
    pub(super) fn reader(&self) -> Reader<'_> {
        Reader(self.0.accepts())
    }

    /// Starts the load, handed the value it reloads when there is one.
    pub(super) fn run(
        self,
        previous: Option<Previous>,
    ) -> BoxFuture<'static, Result<Loaded, BoxError>> {
        self.0.run(previous)
    }
}

/// One flight in progress: its id (so only it removes itself) and where it posts.
pub(super) struct FlightHandle {
    id: u64,
    posts: Arc<Posts>,
}

impl Inner {
    /// Answers from L1, or joins this process's flight for the key, or starts one.
    pub(super) async fn fetch_digest<A, F, Fut, E>(
        self: &Arc<Self>,
        digest: KeyDigest,
        accepts: A,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let mut l1_checked_twice = false;
        let flight = loop {
            if let Some(hit) = self.l1_get(&digest) {
                let entry = match hit {
                    L1Hit::Fresh(entry, _) => entry,
                    L1Hit::RefreshDue(entry) => {
                        let loader = BoxLoader::new(accepts, loader);
                        self.refresh_early(digest, loader, entry.fresh_until);
                        entry
                    }
                };
                return Ok(Fetched {
                    value: Some(entry.value.clone()),
                    outcome: Outcome::L1Hit,
                    fresh_until: Some(entry.fresh_until),
                });
            }
            let mut flights = self.flights();
            if let Some(flight) = flights.get(&digest) {
                flight.posts.joined.fetch_add(1, Ordering::Relaxed);
                break Err(Arc::clone(&flight.posts));
            }
            // A flight may have filled L1 and landed since the look above: look once more
            // rather than pay a store round trip.
            let in_l1 = self.l1.as_ref().is_some_and(|l1| l1.contains_key(&digest));
            if in_l1 && !l1_checked_twice {
                l1_checked_twice = true;
                continue;
            }
            let loader = BoxLoader::new(accepts, loader);
            let id = self.next_flight.fetch_add(1, Ordering::Relaxed);
            let posts = Arc::new(Posts::default());
            flights.insert(
                digest,
                FlightHandle {
                    id,
                    posts: Arc::clone(&posts),
                },
            );
            let landing = Landing {
                inner: Arc::clone(self),
                digest,
                id,
            };
            let flight: BoxFuture<'static, FlightResult> =
                Box::pin(fly(landing, Arc::clone(&posts), loader));
            break Ok(Carried {
                flight: Some(flight),
                poster: Some(Poster(posts)),
                runtime: Handle::try_current().ok(),
            });
        };
        let created = flight.is_ok();
        let answer = match flight {
            Ok(mut carried) => {
                let answer = poll_fn(|cx| carried.poll(cx)).await;
                // A flight that posted an early answer (a stale value served while it
                // refreshes) goes on as a task of its own.
                drop(carried);
                answer
            }
            Err(posts) => {
                let joined_at = Instant::now();
                let answer = posts.wait().await;
                telemetry::follower_wait(joined_at.elapsed(), WaitEnd::Joined);
                answer
            }
        };
        answer.map(|mut fetched| {
            // Only the caller that started the flight gave it its loader.
            if !created
                && matches!(
                    fetched.outcome,
                    Outcome::Leader | Outcome::Uncached | Outcome::Degraded | Outcome::Revalidated
                )
            {
                fetched.outcome = Outcome::Follower;
            }
            fetched
        })
    }

    /// The map of flights in progress, by key.
    pub(super) fn flights(&self) -> MutexGuard<'_, HashMap<KeyDigest, FlightHandle>> {
        // Nothing panics while the map is locked; a poisoned map is still consistent.
        crate::sync::lock(&self.flights)
    }
}

/// A flight driven by the caller that started it. Its answer goes to that caller, and is
/// posted for the callers that joined it, if any did; an early answer it posts is taken by
/// that caller too. Dropped before the flight ends (the caller went away, or took an early
/// answer), it hands the flight to the runtime it started on, as a task of its own that posts
/// the answer; with no runtime to take it, the flight is dropped, its joiners are told it
/// ended without an answer, and [`Landing`] and the leader's lock guard clean up.
struct Carried {
    flight: Option<BoxFuture<'static, FlightResult>>,
    poster: Option<Poster>,
    runtime: Option<Handle>,
}

impl Carried {
    /// The flight's answer once it ends, or an early answer it has posted.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<FlightResult> {
        if let Some(answer) = self.poll_flight(cx) {
            return Poll::Ready(answer);
        }
        match self.poster.as_ref().and_then(|poster| poster.0.servable()) {
            Some(early) => Poll::Ready(early),
            None => Poll::Pending,
        }
    }

    /// Polls the flight, if it has not ended: its answer once it ends. A panic in it ends it,
    /// as it would end a task: it answers that it ended without an answer.
    fn poll_flight(&mut self, cx: &mut Context<'_>) -> Option<FlightResult> {
        let flight = self.flight.as_mut()?;
        let answer = match catch_unwind(AssertUnwindSafe(|| flight.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return None,
            Ok(Poll::Ready(answer)) => answer,
            Err(_) => Err(Error::new(ErrorKind::LoadPanicked)),
        };
        self.flight = None;
        if let Some(Poster(posts)) = &self.poster {
            // The flight has landed, so no caller joins it any more. Alone, its carrier posts
            // nothing (and wakes nobody).
            if posts.joined.load(Ordering::Relaxed) > 0 {
                posts.post(Some((answer.clone(), None)));
            }
        }
        Some(answer)
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if let (Some(flight), Some(poster), Some(runtime)) = (
            self.flight.take(),
            self.poster.take(),
            self.runtime.as_ref(),
        ) {
            runtime.spawn(async move {
                let answer = flight.await;
                poster.0.post(Some((answer, None)));
            });
        }
    }
}

/// Removes a flight from the map when it ends, whichever way it ends (even if it is dropped
/// before it first runs, as when its runtime shuts down).
struct Landing {
    inner: Arc<Inner>,
    digest: KeyDigest,
    id: u64,
}

impl Drop for Landing {
    fn drop(&mut self) {
        let mut flights = self.inner.flights();
        if flights.get(&self.digest).is_some_and(|f| f.id == self.id) {
            flights.remove(&self.digest);
        }
    }
}

/// A flight: resolve the key (posting an early answer through `early` where there is one),
/// then land (leave the map) and answer.
async fn fly(landing: Landing, early: Arc<Posts>, loader: BoxLoader) -> FlightResult {
    let inner = Arc::clone(&landing.inner);
    let answer = inner.resolve(landing.digest, loader, &early).await;
    drop(landing);
    answer
}

#[cfg(test)]
mod tests {
    use std::future::{poll_fn, Future};
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::runtime::Handle;
    use tokio::sync::oneshot;

    use super::{Carried, FlightResult, Poster, Posts};
    use crate::store::MemoryStore;
    use crate::{Cache, ErrorKind, Fetched, Loaded, Outcome};

    fn answer(value: &'static str) -> FlightResult {
        Ok(Fetched {
            value: Some(Bytes::from_static(value.as_bytes())),
            outcome: Outcome::L2Hit,
            fresh_until: None,
        })
    }

    fn value(answer: &FlightResult) -> Option<Bytes> {
        answer
            .as_ref()
            .ok()
            .and_then(|fetched| fetched.value.clone())
    }

    /// A carried flight, and where it posts, with `joined` callers counted as joined.
    fn carry(
        flight: super::BoxFuture<'static, FlightResult>,
        joined: usize,
    ) -> (Carried, Arc<Posts>) {
        let posts = Arc::new(Posts::default());
        posts.joined.store(joined, Ordering::Relaxed);
        let carried = Carried {
            flight: Some(flight),
            poster: Some(Poster(Arc::clone(&posts))),
            runtime: Handle::try_current().ok(),
        };
        (carried, posts)
    }

    #[test]
    fn a_carried_flight_answers_its_carrier_and_posts_for_a_caller_that_joined() {
        let mut cx = Context::from_waker(Waker::noop());
        let (mut carried, posts) = carry(Box::pin(async { answer("v") }), 1);
        let got = carried.poll_flight(&mut cx).expect("the flight ended");
        assert_eq!(value(&got).as_deref(), Some(&b"v"[..]));
        let posted = posts.servable().expect("posted for the caller that joined");
        assert_eq!(value(&posted).as_deref(), Some(&b"v"[..]));
        // Alone, the carrier takes the answer and nothing is posted.
        let (mut carried, posts) = carry(Box::pin(async { answer("w") }), 0);
        assert!(carried.poll_flight(&mut cx).is_some());
        assert!(posts.servable().is_none(), "nobody joined: nothing to post");
    }

    #[test]
    fn a_panic_in_a_carried_flight_ends_the_flight_not_its_caller() {
        let mut cx = Context::from_waker(Waker::noop());
        let (mut carried, posts) = carry(Box::pin(async { panic!("a flight that panics") }), 1);
        let got = carried
            .poll_flight(&mut cx)
            .expect("the panic ended the flight");
        assert_eq!(got.map(|_| ()).unwrap_err().kind(), ErrorKind::LoadPanicked);
        assert!(carried.flight.is_none(), "the panicked flight is dropped");
        let posted = posts.servable().expect("the caller that joined is told");
        assert_eq!(
            posted.map(|_| ()).unwrap_err().kind(),
            ErrorKind::LoadPanicked
        );
    }

    #[tokio::test]
    async fn a_carried_flight_dropped_before_its_end_runs_to_the_end_as_a_task() {
        let (mut carried, posts) = carry(
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                answer("late")
            }),
            1,
        );
        // Polled once (the sleep is pending), then its carrier goes away.
        poll_fn(|cx| Poll::Ready(carried.poll_flight(cx))).await;
        assert!(carried.flight.is_some());
        drop(carried);
        let posted = tokio::time::timeout(Duration::from_secs(5), posts.wait())
            .await
            .expect("the flight ran to its end once its carrier went away");
        assert_eq!(value(&posted).as_deref(), Some(&b"late"[..]));
    }

    #[tokio::test]
    async fn the_carrier_takes_an_early_answer_and_the_flight_goes_on() {
        let posts = Arc::new(Posts::default());
        posts.joined.store(1, Ordering::Relaxed);
        let (go, went) = oneshot::channel::<()>();
        let early = Arc::clone(&posts);
        let mut carried = Carried {
            flight: Some(Box::pin(async move {
                // Posted within the poll, as a leader posts the stale value it refreshes.
                early.post(Some((answer("stale"), None)));
                let _ = went.await;
                answer("fresh")
            })),
            poster: Some(Poster(Arc::clone(&posts))),
            runtime: Handle::try_current().ok(),
        };
        let got = poll_fn(|cx| carried.poll(cx)).await;
        assert_eq!(value(&got).as_deref(), Some(&b"stale"[..]));
        drop(carried);
        go.send(()).expect("the flight goes on as a task");
        let fresh = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match posts.servable() {
                    Some(answer) if value(&answer).as_deref() == Some(&b"fresh"[..]) => break,
                    _ => tokio::task::yield_now().await,
                }
            }
        })
        .await;
        assert!(fresh.is_ok(), "the flight posted its answer as a task");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joiners_on_other_threads_never_miss_the_post() {
        // A joiner makes its wait before it looks, so a post racing its look still wakes it
        // (made after the look, the wait missed such posts within a few rounds).
        for round in 0..200 {
            let posts = Arc::new(Posts::default());
            let mut joiners = tokio::task::JoinSet::new();
            for _ in 0..8 {
                posts.joined.fetch_add(1, Ordering::Relaxed);
                let posts = Arc::clone(&posts);
                joiners.spawn(async move { posts.wait().await });
            }
            if round % 2 == 0 {
                tokio::task::yield_now().await;
            }
            let poster = Poster(Arc::clone(&posts));
            poster.0.post(Some((answer("v"), None)));
            drop(poster);
            let answers = tokio::time::timeout(Duration::from_secs(10), joiners.join_all())
                .await
                .expect("every joiner was woken");
            for got in answers {
                assert_eq!(value(&got).as_deref(), Some(&b"v"[..]));
            }
        }
    }

    #[test]
    fn a_caller_that_joined_a_flight_dropped_without_a_runtime_is_told_at_once() {
        let (mut carried, posts) = carry(Box::pin(std::future::pending()), 1);
        carried.runtime = None;
        assert!(carried
            .poll_flight(&mut Context::from_waker(Waker::noop()))
            .is_none());
        drop(carried);
        let mut wait = pin!(posts.wait());
        let Poll::Ready(told) = wait.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("the caller that joined still waits for a flight that is gone");
        };
        assert_eq!(
            told.map(|_| ()).unwrap_err().kind(),
            ErrorKind::LoadPanicked
        );
    }

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

    #[tokio::test]
    async fn the_caller_carrying_a_flight_is_woken_by_the_flight_alone() {
        // Nothing else may wake it (its own wait for an early answer, as the flight's watch
        // once did when the flight ended): each such wake cost every L2 hit a spurious poll
        // and a scheduler turn.
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
}
