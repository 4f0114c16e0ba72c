//! The store timeout, measured against the store rather than against this process's own
//! scheduling.
//!
//! A plain timer cannot tell a slow store from a process that did not run: when a busy
//! machine starves the process of CPU (or a blocking call holds its runtime's thread), the
//! store's reply may sit unread in the socket while the call's timer expires, and the call
//! would count as a store error, making its flight load with in-process protection only: a
//! second load of a key whose leader is loading elsewhere. So a timer that fires late (by
//! more than a quarter of the timeout: the process was not running) does not end the call: the
//! call gets the timeout again from the moment the process runs, up to ten timeouts in all,
//! so a process starved for good still fails its calls and its breaker opens. A timer that
//! fires on time ends the call: the process was running, and the store did not answer.
//!
//! Nor can it tell a slow store from a process that asks too much at once: a burst of calls
//! (a cold start over thousands of keys) queues in the process's own connection, and the last
//! ones would time out behind the first. So at most [`IN_FLIGHT`] calls of a cache are out at
//! once; the others wait in the process, and their timeout counts from when they are sent.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How many store calls of one cache may be out at once: enough to keep a connection's
/// pipeline full (a few hundred commands take Redis a few milliseconds), few enough that the
/// last of them is answered well within a timeout.
pub(super) const IN_FLIGHT: usize = 256;

/// The store calls of a cache that are out, at most [`IN_FLIGHT`].
pub(super) struct InFlight(Semaphore);

impl Default for InFlight {
    fn default() -> Self {
        InFlight(Semaphore::new(IN_FLIGHT))
    }
}

impl InFlight {
    /// Waits for room to send a call whose caller read the clock at `now`: the permit to hold
    /// while the call is out, and when its timeout starts (`now`, or when it got room).
    pub(super) async fn send(&self, now: Instant) -> (Option<SemaphorePermit<'_>>, Instant) {
        if let Ok(permit) = self.0.try_acquire() {
            return (Some(permit), now);
        }
        // The semaphore is never closed; were it, the call would go out unbounded.
        let permit = self.0.acquire().await.ok();
        (permit, Instant::now().max(now))
    }
}

/// The most a call may take, in timeouts, however late its timers fire.
const MOST: u32 = 10;

/// `call`, if it answers within `limit` of the process's running time from `start` (see the
/// module's page); `None` if it does not.
pub(super) async fn within<F: Future>(
    start: Instant,
    limit: Duration,
    call: F,
) -> Option<F::Output> {
    let latest = crate::sync::later(start, limit.saturating_mul(MOST));
    let mut deadline = crate::sync::later(start, limit);
    tokio::pin!(call);
    loop {
        if let Ok(output) = tokio::time::timeout_at(deadline, call.as_mut()).await {
            return Some(output);
        }
        let fired = Instant::now();
        // A reply read in the same turn as the timer reaches the call through the connection's
        // own task: let it run, then look once more (a timeout past its deadline polls the
        // call once before it ends).
        tokio::task::yield_now().await;
        if let Ok(output) = tokio::time::timeout_at(fired, call.as_mut()).await {
            return Some(output);
        }
        let late = fired.saturating_duration_since(deadline);
        if late <= limit / 4 || fired >= latest {
            return None;
        }
        deadline = crate::sync::later(fired, limit).min(latest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that never answers ends at its deadline when the timer fires on time (paused
    /// time fires it exactly then), and one that answers in time is answered.
    #[tokio::test(start_paused = true)]
    async fn a_timer_on_time_ends_the_call() {
        let start = Instant::now();
        let limit = Duration::from_millis(50);
        let never = within(start, limit, std::future::pending::<()>()).await;
        assert_eq!(never, None);
        assert_eq!(start.elapsed(), limit);
        let answered = within(Instant::now(), limit, async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            7
        })
        .await;
        assert_eq!(answered, Some(7));
    }

    /// A thread held past the deadline (as a starved process is) does not end a call that
    /// answers once the process runs again; one that never answers still ends, within ten
    /// timeouts.
    #[tokio::test]
    async fn a_late_timer_gives_the_call_the_timeout_again() {
        let limit = Duration::from_millis(20);
        let start = Instant::now();
        let (send, receive) = tokio::sync::oneshot::channel();
        let answered = within(start, limit, async move {
            // The reply comes 1 ms after the process runs again.
            std::thread::sleep(Duration::from_millis(100));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _ = send.send(7);
            });
            receive.await.ok()
        })
        .await;
        assert_eq!(answered, Some(Some(7)));
        let start = Instant::now();
        let never = within(start, limit, async {
            std::thread::sleep(Duration::from_millis(100));
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(never, None);
        assert!(start.elapsed() <= limit * MOST + Duration::from_millis(100));
    }
}
