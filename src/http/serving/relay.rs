//! The relay: a body too large to store (over
//! [`max_body_bytes`](crate::http::StampedeLayer::max_body_bytes)), read once from the origin
//! for the request that loaded it and for the requests of this process that waited for that
//! load (the engine hands them the relay with the load's pass; other processes get the pass
//! marker, and load once each).
//!
//! A task of its own (the pump) reads the origin's body, at the origin's pace rather than any
//! client's:
//!
//! - while what it read is within
//!   [`max_relay_bytes`](crate::http::StampedeLayer::max_relay_bytes), it keeps every chunk:
//!   the loading request's body streams them as they come, and each waiter gets the whole
//!   body once it is complete, read at its own pace from the same chunks (a slow client holds
//!   up nobody, and its response starts only once the body is whole);
//! - past that bound, or if the body fails or ends with trailers, the waiters go to the origin
//!   themselves, before their response has started (no waiter ever gets part of a body); the
//!   pump then keeps only what the loading request has not read yet, at most [`WINDOW`] bytes
//!   ahead of it;
//! - once nobody can read any more (the loading request's client went away and no waiter is
//!   left), the pump stops and the origin's body is dropped.
//!
//! Memory per relay is thus at most `max_relay_bytes` plus one chunk, whatever the clients do.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

use crate::http::rules::pass::Pass;
use crate::http::stored::key::VariantId;

/// How far the pump reads ahead of the loading request once the waiters are gone.
pub(crate) const WINDOW: usize = 256 * 1024;

/// A body relayed from one load to the requests that waited for it; see the
/// [module docs](self). `E` is the origin body's error, which only the loading request gets.
pub(crate) struct Relay<E> {
    /// The response's head, as the loading request gets it (its tag fields stripped).
    pub(crate) head: http::response::Parts,
    /// When the response was received.
    pub(crate) received_at: SystemTime,
    /// The loading request's variant: only requests of it may have the body.
    pub(crate) sent_with: VariantId,
    /// What the origin said of the body's length.
    hint: SizeHint,
    limit: usize,
    state: Mutex<State<E>>,
    /// Woken when the body is complete, or given up for the waiters.
    settled: Notify,
    /// Woken when the loading request reads, or goes away.
    room: Notify,
}

struct State<E> {
    /// The chunks still held, from chunk number `first` on.
    chunks: VecDeque<Bytes>,
    first: usize,
    /// Bytes in `chunks`.
    held: usize,
    /// Bytes read from the origin in all.
    read: usize,
    /// Whether the waiters may still have the body: within the bound, without an error or
    /// trailers. Chunks are dropped only once this is false.
    for_waiters: bool,
    end: Option<End<E>>,
    /// The loading request's body: the number of the chunk it reads next, and its waker;
    /// `None` once it went away.
    loader: Option<(usize, Option<Waker>)>,
}

/// How the origin's body ended; each taken once by the loading request.
enum End<E> {
    Complete,
    Trailers(Option<HeaderMap>),
    Failed(Option<E>),
}

impl<E: Send + 'static> Relay<E> {
    /// Starts relaying a body of which `read` was read, then `rest`: the pump runs as a task of
    /// its own. Returns the relay (for the waiters) and the loading request's reader of it.
    pub(crate) fn start<B>(
        head: http::response::Parts,
        sent_with: VariantId,
        (read, rest): (Vec<Bytes>, Pin<Box<B>>),
        limit: usize,
    ) -> (Arc<Self>, RelayReader<E>)
    where
        B: Body<Data = Bytes, Error = E> + Send + 'static,
    {
        let bytes: usize = read.iter().map(Bytes::len).sum();
        let mut hint = SizeHint::new();
        let rest_hint = rest.size_hint();
        hint.set_lower((bytes as u64).saturating_add(rest_hint.lower()));
        if let Some(upper) = rest_hint.upper() {
            hint.set_upper((bytes as u64).saturating_add(upper));
        }
        let relay = Arc::new(Relay {
            head,
            received_at: crate::clock::now(),
            sent_with,
            hint,
            limit,
            state: Mutex::new(State {
                chunks: read.into(),
                first: 0,
                held: bytes,
                read: bytes,
                for_waiters: bytes <= limit,
                end: None,
                loader: Some((0, None)),
            }),
            settled: Notify::new(),
            room: Notify::new(),
        });
        tokio::spawn(pump(Arc::clone(&relay), rest));
        let reader = RelayReader {
            relay: Arc::clone(&relay),
        };
        (relay, reader)
    }
}

impl<E> Relay<E> {
    fn lock(&self) -> MutexGuard<'_, State<E>> {
        crate::sync::lock(&self.state)
    }

    /// The whole body, for a request that waited for the load, once it is complete; or why
    /// the waiters cannot have it (over the bound, with trailers, failed): that request goes
    /// to the origin itself, and says so.
    pub(crate) async fn body(&self) -> Result<Vec<Bytes>, Pass> {
        loop {
            // Made before the look, so a settling between the two still wakes it.
            let settled = self.settled.notified();
            {
                let state = self.lock();
                if !state.for_waiters {
                    return Err(match state.end {
                        _ if state.read > self.limit => Pass::RelayFull,
                        Some(End::Trailers(_)) => Pass::Trailers,
                        _ => Pass::BodyError,
                    });
                }
                if matches!(state.end, Some(End::Complete)) {
                    return Ok(state.chunks.iter().cloned().collect());
                }
            }
            settled.await;
        }
    }
}

impl<E> State<E> {
    /// Drops the chunks the loading request has read (all of them once it is gone), once the
    /// waiters cannot have them.
    fn drop_read(&mut self) {
        if self.for_waiters {
            return;
        }
        let upto = self.loader.as_ref().map_or(usize::MAX, |(next, _)| *next);
        while self.first < upto {
            let Some(chunk) = self.chunks.pop_front() else {
                break;
            };
            self.held -= chunk.len();
            self.first += 1;
        }
    }

    /// The waiters cannot have the body: drop what only they needed.
    fn give_up_for_waiters(&mut self) {
        self.for_waiters = false;
        self.drop_read();
    }

    fn wake_loader(&mut self) {
        if let Some(waker) = self.loader.as_mut().and_then(|(_, waker)| waker.take()) {
            waker.wake();
        }
    }
}

/// The pump: reads the origin's body into the relay; see the [module docs](self).
async fn pump<B>(relay: Arc<Relay<B::Error>>, mut body: Pin<Box<B>>)
where
    B: Body<Data = Bytes>,
{
    use http_body_util::BodyExt;
    loop {
        // Hold off while the loading request alone reads and is a window behind; stop once
        // nobody can read.
        loop {
            let room = relay.room.notified();
            {
                let state = relay.lock();
                let nobody_else = Arc::strong_count(&relay) == 1;
                if state.loader.is_none() && (!state.for_waiters || nobody_else) {
                    drop(state);
                    relay.settle_without_body();
                    return;
                }
                if state.for_waiters || state.held < WINDOW {
                    break;
                }
            }
            room.await;
        }
        let frame = body.frame().await;
        let mut state = relay.lock();
        match frame {
            None => state.end = Some(End::Complete),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    state.read = state.read.saturating_add(chunk.len());
                    state.held += chunk.len();
                    state.chunks.push_back(chunk);
                    if state.for_waiters && state.read > relay.limit {
                        state.give_up_for_waiters();
                        relay.settled.notify_waiters();
                    }
                    state.wake_loader();
                    continue;
                }
                Err(frame) => {
                    state.end = Some(End::Trailers(frame.into_trailers().ok()));
                    state.give_up_for_waiters();
                }
            },
            Some(Err(error)) => {
                state.end = Some(End::Failed(Some(error)));
                state.give_up_for_waiters();
            }
        }
        state.wake_loader();
        drop(state);
        relay.settled.notify_waiters();
        return;
    }
}

impl<E> Relay<E> {
    /// Nobody reads any more: the waiters that come now go to the origin.
    fn settle_without_body(&self) {
        let mut state = self.lock();
        if state.end.is_none() {
            state.end = Some(End::Failed(None));
        }
        state.give_up_for_waiters();
        drop(state);
        self.settled.notify_waiters();
    }
}

/// The loading request's body, read from the relay as the pump fills it; dropped, it tells the
/// pump it is gone.
pub(crate) struct RelayReader<E> {
    relay: Arc<Relay<E>>,
}

impl<E> RelayReader<E> {
    /// The next frame of the body.
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        let mut state = self.relay.lock();
        let state = &mut *state;
        let Some((next, waker)) = state.loader.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(chunk) = state.chunks.get(*next - state.first).cloned() {
            *next += 1;
            state.drop_read();
            self.relay.room.notify_one();
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match state.end.as_mut() {
            Some(End::Complete) => Poll::Ready(None),
            Some(End::Trailers(trailers)) => {
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Some(End::Failed(error)) => Poll::Ready(error.take().map(Err)),
            None => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// What the origin said of the body's length.
    pub(crate) fn size_hint(&self) -> SizeHint {
        self.relay.hint
    }
}

impl<E> Drop for RelayReader<E> {
    fn drop(&mut self) {
        let mut state = self.relay.lock();
        state.loader = None;
        state.drop_read();
        drop(state);
        self.relay.room.notify_one();
    }
}
