//! How a flight is carried and how it posts: the caller that starts a flight drives it
//! within its own task ([`CarriedFlight`]), with no task of its own and no hop through the
//! scheduler between the store's reply and the answer; the callers that join it wait on what
//! it posts ([`FlightPosts`]). A flight whose carrier goes away runs on to its end as a task
//! of its own.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::error::{Error, ErrorKind};
use super::fetched::FlightResult;
use crate::store::BoxFuture;

/// What a flight has posted so far: nothing, its answer, or an early answer (the stale value
/// a leader serves while it refreshes) with the bounds of its being servable ([`Early`]),
/// past which callers that join the flight wait for its answer instead.
type Posted = Option<(FlightResult, Option<Early>)>;

/// How long an early answer is servable: until `until` (the end of its stale window), and
/// while `holds` says that nothing was heard of its key or its tags since the value was read
/// (a change made in another process: the value may be invalidated).
pub(super) struct Early {
    pub(super) until: Instant,
    pub(super) holds: Option<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl Early {
    fn servable(&self) -> bool {
        Instant::now() < self.until && self.holds.as_ref().is_none_or(|holds| holds())
    }
}

/// Where a flight posts for the callers that joined it: its early answer, then its answer.
///
/// The caller that carries the flight reads an early answer right after the poll of the
/// flight that posted it (the post is made within that poll), and takes the answer from the
/// flight itself: it waits on nothing here. Only callers that joined wait, so a flight that
/// nobody joined wakes nobody and posts nothing but an early answer.
#[derive(Default)]
pub(super) struct FlightPosts {
    posted: Mutex<Posted>,
    /// Whether anything was ever posted: the carrier's look after each poll reads only this.
    any: AtomicBool,
    /// Set when the flight has ended, with its answer posted or without one.
    ended: AtomicBool,
    /// How many callers joined the flight (counted under the lock of the map of flights).
    joined: AtomicUsize,
    /// Set when a change in this process overtook the flight (see
    /// [`Flights::detach`](super::flights::Flights::detach)): what it read may be outdated.
    overtaken: AtomicBool,
    /// Set when the flight's loaded value turned out outdated by a tag invalidated during its
    /// load (see [`outdated`](Self::outdated)).
    outdated: AtomicBool,
    changed: Notify,
}

impl FlightPosts {
    /// Counts a caller that joins the flight. Called under the lock of the map of flights,
    /// while the flight is in it.
    pub(super) fn join(&self) {
        self.joined.fetch_add(1, Ordering::Relaxed);
    }

    /// FlightPosts `posted` for the callers that joined the flight, and for those that join later.
    pub(super) fn post(&self, posted: Posted) {
        let mut slot = crate::sync::lock(&self.posted);
        // Checked under the lock, as `overtaken` withdraws under it: an early answer read
        // before a change is never posted after it.
        if matches!(&posted, Some((_, Some(_)))) && self.is_overtaken() {
            return;
        }
        *slot = posted;
        drop(slot);
        self.any.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// A change in this process overtook the flight: its early answer (a stale value it read
    /// before the change) is withdrawn, and it must not stand in for a failed load.
    pub(super) fn overtaken(&self) {
        self.overtaken.store(true, Ordering::Release);
        let mut posted = crate::sync::lock(&self.posted);
        if matches!(&*posted, Some((_, Some(_)))) {
            *posted = None;
        }
    }

    /// Whether a change in this process overtook the flight.
    pub(super) fn is_overtaken(&self) -> bool {
        self.overtaken.load(Ordering::Acquire)
    }

    /// The value the flight loaded is outdated by a tag invalidated during its load, here or
    /// in another process: it answers the caller that carries the flight, but a caller that
    /// joined it cannot tell whether it joined before this process heard of the invalidation,
    /// so it does not take the answer and fetches again; and nobody joins the flight any more.
    /// Set before the answer is posted.
    pub(super) fn outdated(&self) {
        self.outdated.store(true, Ordering::Release);
    }

    /// Whether the flight's loaded value is [outdated](Self::outdated).
    pub(super) fn is_outdated(&self) -> bool {
        self.outdated.load(Ordering::Acquire)
    }

    /// The flight has ended: callers still waiting take what is posted, or learn that it
    /// ended without an answer.
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// What is posted, if a caller may take it now: an answer, or an early answer still
    /// within its deadline.
    fn servable(&self) -> Option<FlightResult> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        match &*crate::sync::lock(&self.posted) {
            Some((answer, early)) if early.as_ref().is_none_or(Early::servable) => {
                Some(answer.clone())
            }
            _ => None,
        }
    }

    /// The wait of a caller that joined the flight: for a servable post, or for the end.
    pub(super) async fn wait(&self) -> FlightResult {
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
struct FlightEnd(Arc<FlightPosts>);

impl Drop for FlightEnd {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A flight driven by the caller that started it. Its answer goes to that caller, and is
/// posted for the callers that joined it, if any did; an early answer it posts is taken by
/// that caller too. Dropped before the flight ends (the caller went away, or took an early
/// answer), it hands the flight to the runtime it started on, as a task of its own that posts
/// the answer; with no runtime to take it, the flight is dropped, its joiners are told it
/// ended without an answer, and the flight's `ListedFlight` and the leader's lock guard clean
/// up.
pub(super) struct CarriedFlight {
    flight: Option<BoxFuture<'static, FlightResult>>,
    poster: Option<FlightEnd>,
    runtime: Option<Handle>,
}

impl CarriedFlight {
    /// The flight `flight`, posting through `posts`, carried by the caller that starts it.
    pub(super) fn new(flight: BoxFuture<'static, FlightResult>, posts: Arc<FlightPosts>) -> Self {
        CarriedFlight {
            flight: Some(flight),
            poster: Some(FlightEnd(posts)),
            runtime: Handle::try_current().ok(),
        }
    }

    /// The flight's answer once it ends, or an early answer it has posted.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<FlightResult> {
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
            Err(payload) => Err(Error::panicked(&*payload)),
        };
        self.flight = None;
        if let Some(FlightEnd(posts)) = &self.poster {
            // The flight has landed, so no caller joins it any more. Alone, its carrier posts
            // nothing (and wakes nobody).
            if posts.joined.load(Ordering::Relaxed) > 0 {
                posts.post(Some((answer.clone(), None)));
            }
        }
        Some(answer)
    }
}

impl Drop for CarriedFlight {
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

#[cfg(test)]
mod tests {
    use std::future::{poll_fn, Future};
    use std::pin::pin;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::runtime::Handle;
    use tokio::sync::oneshot;

    use super::{CarriedFlight, FlightEnd, FlightPosts, FlightResult};
    use crate::{ErrorKind, Fetched, Outcome};

    fn answer(value: &'static str) -> FlightResult {
        Ok(Fetched::loaded(
            Bytes::from_static(value.as_bytes()),
            Outcome::L2Hit,
        ))
    }

    fn value(answer: &FlightResult) -> Option<Bytes> {
        answer
            .as_ref()
            .ok()
            .and_then(|fetched| fetched.value.clone())
    }

    /// A carried flight, and where it posts, with `joined` callers counted as joined.
    fn carry(
        flight: crate::store::BoxFuture<'static, FlightResult>,
        joined: usize,
    ) -> (CarriedFlight, Arc<FlightPosts>) {
        let posts = Arc::new(FlightPosts::default());
        posts.joined.store(joined, Ordering::Relaxed);
        let carried = CarriedFlight {
            flight: Some(flight),
            poster: Some(FlightEnd(Arc::clone(&posts))),
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

    #[tokio::test(start_paused = true)]
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

    #[tokio::test(start_paused = true)]
    async fn the_carrier_takes_an_early_answer_and_the_flight_goes_on() {
        let posts = Arc::new(FlightPosts::default());
        posts.joined.store(1, Ordering::Relaxed);
        let (go, went) = oneshot::channel::<()>();
        let early = Arc::clone(&posts);
        let mut carried = CarriedFlight {
            flight: Some(Box::pin(async move {
                // Posted within the poll, as a leader posts the stale value it refreshes.
                early.post(Some((answer("stale"), None)));
                let _ = went.await;
                answer("fresh")
            })),
            poster: Some(FlightEnd(Arc::clone(&posts))),
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

    /// On real time, on two worker threads: the race it guards is between threads, and paused
    /// time needs one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joiners_on_other_threads_never_miss_the_post() {
        // A joiner makes its wait before it looks, so a post racing its look still wakes it
        // (made after the look, the wait missed such posts within a few rounds).
        for round in 0..200 {
            let posts = Arc::new(FlightPosts::default());
            let mut joiners = tokio::task::JoinSet::new();
            for _ in 0..8 {
                posts.joined.fetch_add(1, Ordering::Relaxed);
                let posts = Arc::clone(&posts);
                joiners.spawn(async move { posts.wait().await });
            }
            if round % 2 == 0 {
                tokio::task::yield_now().await;
            }
            let poster = FlightEnd(Arc::clone(&posts));
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
}
