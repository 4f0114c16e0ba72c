//! Flights: concurrent misses of one key in this process share one flight, which resolves the
//! key once (one store round trip, at most one load) and hands every caller the same answer.
//! The caller that starts a flight drives it within its own task ([`Carried`]): no task of its
//! own, no hop through the scheduler between the store's reply and the answer. A flight runs to
//! the end even if every caller goes away (it becomes a task of its own then), and leaves the
//! map of flights however it ends ([`Landing`]).

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

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

/// Which stored payloads a flight's caller can read: a stored value whose payload it cannot
/// read is treated as a corrupt entry (a miss, counted and overwritten). Built once per
/// flight, never on an L1 hit.
#[derive(Clone)]
pub(super) struct Reader(Arc<dyn Fn(&Bytes) -> bool + Send + Sync>);

impl Reader {
    /// Decodes a store entry; a value this reader's caller cannot read is corrupt.
    pub(super) fn decode(&self, bytes: &Bytes) -> Result<Entry, entry::Corrupt> {
        match entry::decode(bytes)? {
            Entry::Value { payload, .. } | Entry::ForWaiters { payload } if !(self.0)(&payload) => {
                Err(entry::Corrupt)
            }
            entry => Ok(entry),
        }
    }
}

/// A boxed loader, handed the value it reloads when there is one.
type Run = Box<dyn FnOnce(Option<Previous>) -> BoxFuture<'static, Result<Loaded, BoxError>> + Send>;

/// A flight's loader, and what its caller can read.
pub(super) struct BoxLoader {
    pub(super) run: Run,
    pub(super) reader: Reader,
}

impl BoxLoader {
    fn new<A, F, Fut, E>(accepts: A, loader: F) -> Self
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        BoxLoader {
            run: Box::new(move |previous| {
                Box::pin(async move { loader(previous).await.map_err(Into::into) })
            }),
            reader: Reader(Arc::new(accepts)),
        }
    }
}

/// One flight in progress: its id (so only it removes itself) and where its result appears.
pub(super) struct FlightHandle {
    id: u64,
    result: watch::Receiver<Posted>,
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
        let (mut result, flight) = loop {
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
                break (flight.result.clone(), None);
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
            let (tx, rx) = watch::channel(None);
            flights.insert(
                digest,
                FlightHandle {
                    id,
                    result: rx.clone(),
                },
            );
            let landing = Landing {
                inner: Arc::clone(self),
                digest,
                id,
            };
            let flight: BoxFuture<'static, ()> =
                Box::pin(fly(landing, tx, loader).in_current_span());
            break (rx, Some(flight));
        };
        let created = flight.is_some();
        let mut carried = Carried {
            flight,
            runtime: created.then(Handle::try_current).and_then(Result::ok),
        };
        let joined_at = (!created).then(Instant::now);
        let answer = {
            let mut posted = pin!(result.wait_for(servable));
            poll_fn(|cx| {
                // The flight first: what it posts is then read in the same turn.
                carried.poll_flight(cx);
                posted.as_mut().poll(cx).map(|posted| match posted {
                    Ok(answer) => answer.clone().map_or_else(
                        || Err(Error::new(ErrorKind::LoadPanicked)),
                        |(answer, _)| answer,
                    ),
                    // The flight ended without an answer: it panicked or its runtime shut down.
                    Err(_) => Err(Error::new(ErrorKind::LoadPanicked)),
                })
            })
            .await
        };
        // A flight that posted an early answer (a stale value served while it refreshes) goes
        // on as a task of its own.
        drop(carried);
        if let Some(joined_at) = joined_at {
            telemetry::follower_wait(joined_at.elapsed(), WaitEnd::Joined);
        }
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

/// A flight driven by the caller that started it, polled beside that caller's wait for its
/// answer. Dropped before the flight ends (the caller went away, or took an early answer),
/// it hands the flight to the runtime it started on, as a task of its own; with no runtime to
/// take it, the flight is dropped, and [`Landing`] and the leader's lock guard clean up.
struct Carried {
    flight: Option<BoxFuture<'static, ()>>,
    runtime: Option<Handle>,
}

impl Carried {
    /// Polls the flight, if it has not ended. A panic in it ends it, as it would end a task:
    /// its callers are told the flight ended without an answer.
    fn poll_flight(&mut self, cx: &mut Context<'_>) {
        if let Some(flight) = self.flight.as_mut() {
            match catch_unwind(AssertUnwindSafe(|| flight.as_mut().poll(cx))) {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) | Err(_) => self.flight = None,
            }
        }
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if let (Some(flight), Some(runtime)) = (self.flight.take(), self.runtime.as_ref()) {
            runtime.spawn(flight);
        }
    }
}

/// Removes a flight from the map when its task ends, whichever way it ends (even if the task
/// is dropped before it first runs, as when its runtime shuts down).
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

/// A flight's task: resolve the key, then land (leave the map) and publish the answer.
async fn fly(landing: Landing, result: watch::Sender<Posted>, loader: BoxLoader) {
    let inner = Arc::clone(&landing.inner);
    let answer = inner.resolve(landing.digest, loader, &result).await;
    drop(landing);
    result.send_replace(Some((answer, None)));
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::runtime::Handle;

    use super::Carried;

    #[test]
    fn a_panic_in_a_carried_flight_ends_the_flight_not_its_caller() {
        let mut carried = Carried {
            flight: Some(Box::pin(async { panic!("a flight that panics") })),
            runtime: None,
        };
        let waker = std::task::Waker::noop();
        carried.poll_flight(&mut std::task::Context::from_waker(waker));
        assert!(carried.flight.is_none(), "the panicked flight is dropped");
    }

    #[tokio::test]
    async fn a_carried_flight_dropped_before_its_end_runs_to_the_end_as_a_task() {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ended);
        let mut carried = Carried {
            flight: Some(Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                flag.store(true, Ordering::SeqCst);
            })),
            runtime: Some(Handle::current()),
        };
        // Polled once (the sleep is pending), then its caller goes away.
        poll_fn(|cx| {
            carried.poll_flight(cx);
            std::task::Poll::Ready(())
        })
        .await;
        assert!(carried.flight.is_some());
        drop(carried);
        for _ in 0..200 {
            if ended.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the flight did not run to its end once its caller went away");
    }
}
