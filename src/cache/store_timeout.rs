//! The store timeout, measured against the store rather than against this process's own
//! scheduling or its own queue.
//!
//! A plain timer cannot tell a slow store from a process that did not run: when a busy
//! machine starves the process of CPU (or a blocking call holds its runtime's thread), the
//! store's reply may sit unread in the socket while the call's timer expires, and the call
//! would count as a store error, making its flight load with in-process protection only: a
//! second load of a key whose leader is loading elsewhere. So a timer that fires late (by
//! more than a quarter of the timeout: the process was not running) does not end the call: the
//! call gets the timeout again from the moment the process runs, up to ten timeouts in all,
//! so a process starved for good still fails its calls and its breaker opens.
//!
//! Nor can a plain timer tell a store that stopped answering from one working through a
//! queue: when many processes stampede many keys at once, a store that answers every call it
//! is given may take longer than the timeout to reach the last of them, and each call that
//! timed out would be a second load, sent to the origin just when it is busiest. So a timer
//! that fires on time ends the call only if the store is not answering: if it answered a call
//! of this cache within the last timeout, the call is queued behind others and gets the
//! timeout again, up to the same ten in all. A store that stops answering is found out within
//! one timeout, as before; one that answers slowly, within ten. So is a call the store holds
//! while it answers others (on a cluster, a call to a master that stalls while the others
//! answer): telling it from a queued one would take the order the calls left in, which a
//! store's own awaits (a script loaded again, a connection made) can change.
//!
//! Nor can it tell a slow store from a request that has not left the process: on a
//! current-thread runtime, the connection's task that writes a call's request waits its turn
//! behind every task queued before it, and a burst of thousands of callers held the first
//! requests of a process back for 250 to 300 ms. So where a runtime has many tasks, a marker
//! task is queued with the request, and the call is timed from when it runs: when the
//! connection's task could first write the request.
//!
//! Nor can it tell a slow store from a process that asks too much at once: a burst of calls
//! (a cold start over thousands of keys) queues in the process's own connection, and the last
//! ones would time out behind the first. So at most the store's [`CallLimit`](crate::store::CallLimit) of calls are out
//! at once, across every cache over the store; the others wait in the process, and their
//! timeout counts from when they are [sent](send).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// Waits for room in `lane` (one of a [`CallLimit`](crate::store::CallLimit)'s) to send a call whose caller read the
/// clock at `now`: the permit to hold while the call is out, and when its timeout starts
/// (`now`, or when it got room).
pub(super) async fn send(lane: &Semaphore, now: Instant) -> (Option<SemaphorePermit<'_>>, Instant) {
    if let Ok(permit) = lane.try_acquire() {
        return (Some(permit), now);
    }
    // The semaphore is never closed; were it, the call would go out unbounded.
    let permit = lane.acquire().await.ok();
    (permit, Instant::now().max(now))
}

/// The most a call may take, in timeouts, however late its timers fire.
const MOST: u32 = 10;

/// When the store last answered a call of a cache: what tells a call queued behind others
/// from one the store does not answer (see the module's page).
pub(super) struct Answers {
    /// When, in nanoseconds from `epoch`.
    last: AtomicU64,
    epoch: Instant,
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            last: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Answers {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn answered(&self) {
        self.last
            .fetch_max(self.nanos(Instant::now()), Ordering::Relaxed);
    }

    /// Whether the store answered a call within `limit` before `now`: a call unanswered at
    /// `now` waits in a queue the store works through.
    fn answering(&self, now: Instant, limit: Duration) -> bool {
        let since = now.checked_sub(limit).unwrap_or(self.epoch);
        self.last.load(Ordering::Relaxed) > self.nanos(since)
    }
}

/// `call`, if it answers within `limit` of the process's running time from `start`, or while
/// the store works through a queue it waits in (see the module's page), up to ten timeouts in
/// all; `None` if it does not. Its answer, if a success, counts in `answers`.
pub(super) async fn within<T, E, F>(
    answers: &Answers,
    start: Instant,
    limit: Duration,
    call: F,
) -> Option<Result<T, E>>
where
    F: Future<Output = Result<T, E>>,
{
    let answer = waited(answers, start, limit, call).await;
    if let Some(Ok(_)) = answer {
        answers.answered();
    }
    answer
}

async fn waited<F: Future>(
    answers: &Answers,
    start: Instant,
    limit: Duration,
    call: F,
) -> Option<F::Output> {
    let latest = crate::sync::later(start, limit.saturating_mul(MOST));
    let mut deadline = crate::sync::later(start, limit);
    tokio::pin!(call);
    // The call's first poll hands its request to the connection's task.
    let mut sent = None;
    loop {
        let waited = tokio::time::timeout_at(deadline, async {
            let output = std::future::poll_fn(|context| {
                let polled = call.as_mut().poll(context);
                if polled.is_pending() && sent.is_none() {
                    sent = Some(Written::queued());
                }
                polled
            });
            output.await
        });
        if let Ok(output) = waited.await {
            return Some(output);
        }
        let fired = Instant::now();
        // When the connection's task could first run after the request was handed to it: a
        // process busy with its own work (a burst of callers queued on its thread) may not
        // have written the request yet. The call may answer meanwhile.
        let ran = match sent.as_mut() {
            Some(written) => tokio::select! {
                biased;
                output = call.as_mut() => return Some(output),
                ran = written.at() => ran,
            },
            None => start,
        };
        let late = fired.saturating_duration_since(deadline);
        let against_store = crate::sync::later(ran.max(start), limit);
        let extended = if late > limit / 4 || answers.answering(fired, limit) {
            crate::sync::later(Instant::now(), limit)
        } else {
            against_store
        };
        if fired >= latest || extended <= fired {
            return None;
        }
        deadline = extended.min(latest);
    }
}

/// When the connection's task could first run after a call handed it its request.
enum Written {
    /// A task queued with the request, which reads the clock when it runs: on a current-thread
    /// runtime, after every task queued before it, the connection's own among them.
    Queued(tokio::task::JoinHandle<Instant>),
    At(Instant),
}

/// Below this many live tasks, a runtime's queue is short (a task's turn comes within a few
/// milliseconds): no marker is queued, which would cost each store call a task.
const FEW_TASKS: usize = 256;

impl Written {
    /// Now, where the wait for a turn is short: on a runtime with few tasks, on a multi-thread
    /// runtime (where an idle worker takes queued tasks, and a task spawned here would push
    /// the connection's task out of the next-to-run slot), and outside a runtime.
    fn queued() -> Self {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == RuntimeFlavor::CurrentThread
                    && runtime.metrics().num_alive_tasks() > FEW_TASKS =>
            {
                Written::Queued(runtime.spawn(async { Instant::now() }))
            }
            _ => Written::At(Instant::now()),
        }
    }

    /// When it ran, once it has (at once after the first time).
    async fn at(&mut self) -> Instant {
        if let Written::Queued(marker) = self {
            // A runtime shutting down cancels the marker: the process runs no more anyway.
            let at = marker.await.unwrap_or_else(|_| Instant::now());
            *self = Written::At(at);
        }
        match self {
            Written::At(at) => *at,
            Written::Queued(_) => Instant::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::sync::Arc;

    use super::*;

    type Answer = Result<u32, ()>;

    /// A call that never answers ends at its deadline when the timer fires on time (paused
    /// time fires it exactly then), and one that answers in time is answered.
    #[tokio::test(start_paused = true)]
    async fn a_timer_on_time_ends_the_call() {
        let answers = Answers::default();
        let start = Instant::now();
        let limit = Duration::from_millis(50);
        let never = within(&answers, start, limit, pending::<Answer>()).await;
        assert_eq!(never, None);
        assert_eq!(start.elapsed(), limit);
        let answered = within(&answers, Instant::now(), limit, async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            Answer::Ok(7)
        })
        .await;
        assert_eq!(answered, Some(Ok(7)));
    }

    /// A process that does not run past the deadline (a starved one, or a thread held: here
    /// a task moves paused time 100 ms at once, after the request went out) does not end a
    /// call that answers once the process runs again; one that never answers still ends,
    /// one timeout after the process ran again.
    #[tokio::test(start_paused = true)]
    async fn a_late_timer_gives_the_call_the_timeout_again() {
        let stall = || tokio::spawn(tokio::time::advance(Duration::from_millis(100)));
        let answers = Answers::default();
        let limit = Duration::from_millis(20);
        let start = Instant::now();
        let (send, receive) = tokio::sync::oneshot::channel();
        // The reply comes 1 ms after the process runs again.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(101)).await;
            let _ = send.send(7);
        });
        stall();
        let answered = within(&answers, start, limit, async move {
            receive.await.map_err(|_| ())
        })
        .await;
        assert_eq!(answered, Some(Ok(7)));
        let start = Instant::now();
        stall();
        let never = within(&answers, start, limit, pending::<Answer>()).await;
        assert_eq!(never, None);
        // Late at 100 ms, the timeout again from then, on time at 120 ms: the store is silent.
        assert_eq!(start.elapsed(), Duration::from_millis(100) + limit);
    }

    /// A store working through a queue: six calls sent at once, answered one every 100 ms
    /// (as one connection's replies come, in order), with a 250 ms timeout. Each call that
    /// waits past its timeout while the store answers the calls ahead of it gets the timeout
    /// again: all six are answered, the last after 600 ms. (Timed out, the last three would
    /// each have made its flight load alone.)
    #[tokio::test(start_paused = true)]
    async fn a_call_queued_behind_answered_calls_waits_for_its_turn() {
        let answers = Arc::new(Answers::default());
        let limit = Duration::from_millis(250);
        let start = Instant::now();
        let calls: Vec<_> = (1..=6u32)
            .map(|place| {
                let answers = Arc::clone(&answers);
                tokio::spawn(async move {
                    within(&answers, start, limit, async move {
                        tokio::time::sleep(Duration::from_millis(100) * place).await;
                        Answer::Ok(place)
                    })
                    .await
                })
            })
            .collect();
        for (place, call) in (1..=6).zip(calls) {
            assert_eq!(call.await.unwrap(), Some(Ok(place)));
        }
        assert_eq!(start.elapsed(), Duration::from_millis(600));
    }

    /// A store that answers nothing fails its calls on time, however many are out. A call the
    /// store holds while it answers others (as a stalled master of a cluster would) ends at
    /// ten timeouts; and one the store falls silent on ends a timeout after its last answer.
    #[tokio::test(start_paused = true)]
    async fn a_call_the_store_does_not_answer_fails_on_time() {
        let answers = Answers::default();
        let limit = Duration::from_millis(250);
        let start = Instant::now();
        let ended = tokio::join!(
            within(&answers, start, limit, pending::<Answer>()),
            within(&answers, start, limit, pending::<Answer>()),
        );
        assert_eq!(ended, (None, None));
        assert_eq!(start.elapsed(), limit);

        // Others answered every 50 ms: for 3 s, then for 400 ms only.
        for (answered_for, ends_at) in [(3_000, limit * MOST), (400, limit * 3)] {
            let start = Instant::now();
            let held = async {
                let held = within(&answers, start, limit, pending::<Answer>()).await;
                (held, start.elapsed())
            };
            let others = async {
                for _ in 0..answered_for / 50 {
                    let answered = within(&answers, Instant::now(), limit, async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Answer::Ok(2)
                    });
                    assert_eq!(answered.await, Some(Ok(2)));
                }
            };
            let ((held, after), ()) = tokio::join!(held, others);
            assert_eq!(
                (held, after),
                (None, ends_at),
                "answered for {answered_for} ms"
            );
        }
    }

    /// On a current-thread runtime, a call whose request sits with the connection's task,
    /// itself queued behind 77 ms of this process's own work (a burst of callers), is timed
    /// from when that task runs: the store answers 50 ms after it, 127 ms after the call was
    /// made, and the 100 ms timeout, on time, does not end the call. (Timed from the call,
    /// it ended at 100 ms with the store's answer on its way.) On real time: the burst holds
    /// the thread with `std::thread::sleep`, which paused time would not see, so the rule would
    /// hold trivially.
    #[tokio::test]
    async fn a_request_not_yet_written_is_not_timed() {
        let answers = Answers::default();
        // 77 ms of work, in more tasks than a runtime with a short queue has.
        for _ in 0..FEW_TASKS + 1 {
            tokio::spawn(async { std::thread::sleep(Duration::from_micros(300)) });
        }
        let (send, receive) = tokio::sync::oneshot::channel();
        let mut send = Some(send);
        let call = std::future::poll_fn(move |_| {
            // The first poll hands the request to the connection's task, which writes it when
            // it runs; the store answers 50 ms later.
            if let Some(send) = send.take() {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = send.send(7);
                });
            }
            std::task::Poll::Pending
        });
        let answered = within(
            &answers,
            Instant::now(),
            Duration::from_millis(100),
            async {
                tokio::select! {
                    () = call => unreachable!("the request never ends by itself"),
                    answer = receive => answer.map_err(|_| ()),
                }
            },
        )
        .await;
        assert_eq!(answered, Some(Ok(7)));
    }
}
