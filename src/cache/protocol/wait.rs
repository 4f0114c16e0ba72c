//! How a follower waits between its reads: a watch of the key's fills (the store's
//! notifications), and a poll as the fallback: a jittered exponential backoff while
//! notifications are not being received, and one slow poll while they are (for a message lost
//! all the same, or a leader that died holding the lock), so that a follower's reads do not
//! grow with the length of the load it waits for.

use std::time::Duration;

use crate::cache::config::Waits;
use crate::cache::telemetry::WaitEnd;
use crate::store::{FillWatch, Notifier};

/// A follower's pause: `pause` long, or until the key's fill (or release) is notified, or,
/// with `live` (the notifier of a pause taken while notifications are received), until they
/// are lost: the follower then reads at once and polls on its backoff.
async fn wait_for_fill(
    filled: &mut Option<FillWatch<'_>>,
    live: Option<&Notifier>,
    pause: Duration,
) -> WaitEnd {
    let pause = tokio::time::sleep(pause);
    let lost = async {
        match live {
            Some(notifier) => notifier.until_lost().await,
            None => std::future::pending().await,
        }
    };
    match filled {
        Some(filled) => {
            tokio::select! {
                () = pause => WaitEnd::Polled,
                () = lost => WaitEnd::Polled,
                () = filled.changed() => WaitEnd::Notified,
            }
        }
        None => {
            pause.await;
            WaitEnd::Polled
        }
    }
}

/// The shortest step between a follower's re-reads, whatever the settings.
const MIN_PAUSE: Duration = Duration::from_millis(1);

/// Pauses between a follower's re-reads: exponential, capped, jittered; or, while
/// notifications are received, the slow poll, jittered.
pub(in crate::cache) struct Backoff {
    next: Duration,
    multiplier: f64,
    max: Duration,
    notified: Duration,
}

impl Backoff {
    /// A follower's wait between two reads, of at most `limit`: until the key's fill is
    /// notified, or the poll. While notifications are received (`notifier`, and `filled`
    /// watches the key), the poll is the slow one, and a loss of notifications ends the wait;
    /// otherwise it is the backoff's next pause.
    pub(in crate::cache) async fn wait_between_reads(
        &mut self,
        filled: &mut Option<FillWatch<'_>>,
        notifier: Option<&Notifier>,
        limit: Duration,
    ) -> WaitEnd {
        let live = notifier.filter(|notifier| filled.is_some() && notifier.receiving());
        let pause = match live {
            Some(_) => self.pause_while_notified(),
            None => self.pause(),
        };
        wait_for_fill(filled, live, pause.min(limit)).await
    }

    pub(in crate::cache) fn new(waits: &Waits) -> Self {
        // A zero step would make followers spin on the store: at least a millisecond.
        let initial = waits.backoff_initial.max(MIN_PAUSE);
        Backoff {
            next: initial,
            multiplier: waits.backoff_multiplier,
            max: waits.backoff_max.max(initial),
            notified: waits.longest_pause(),
        }
    }

    /// The next pause: between half and all of the current step, then the step grows.
    pub(in crate::cache) fn pause(&mut self) -> Duration {
        self.pause_with(rand::random::<f64>())
    }

    /// The pause while notifications are received: between half and all of
    /// [`poll_while_notified`](crate::CacheBuilder::poll_while_notified), so that the
    /// followers of one stampede do not poll together. The backoff's step does not grow.
    pub(in crate::cache) fn pause_while_notified(&self) -> Duration {
        jittered(self.notified, rand::random::<f64>())
    }

    /// The next pause for a draw `jitter` in [0, 1).
    fn pause_with(&mut self, jitter: f64) -> Duration {
        let step = self.next;
        self.next = Duration::try_from_secs_f64(step.as_secs_f64() * self.multiplier)
            .unwrap_or(self.max)
            .min(self.max);
        jittered(step, jitter)
    }
}

/// Between half and all of `step`, for a draw `jitter` in [0, 1).
fn jittered(step: Duration, jitter: f64) -> Duration {
    let half = step / 2;
    half + half.mul_f64(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::config::Config;

    fn backoff(initial_ms: u64, multiplier: f64, max_ms: u64) -> Backoff {
        Backoff {
            next: Duration::from_millis(initial_ms),
            multiplier,
            max: Duration::from_millis(max_ms),
            notified: Duration::from_secs(1),
        }
    }

    #[test]
    fn backoff_pauses_between_half_and_all_of_a_growing_capped_step() {
        let mut low = backoff(10, 2.0, 50);
        let lows: Vec<_> = (0..5).map(|_| low.pause_with(0.0)).collect();
        let ms = Duration::from_millis;
        assert_eq!(lows, [ms(5), ms(10), ms(20), ms(25), ms(25)]);
        let mut high = backoff(10, 2.0, 50);
        let highs: Vec<_> = (0..5).map(|_| high.pause_with(0.999_999)).collect();
        for (pause, step) in highs.iter().zip([10, 20, 40, 50, 50]) {
            assert!(
                *pause <= ms(step) && *pause > ms(step) * 99 / 100,
                "{pause:?}"
            );
        }
    }

    #[test]
    fn backoff_survives_hostile_settings() {
        // A multiplier that overflows a Duration stops at the cap; a zero step stays zero.
        let mut huge = backoff(1000, f64::MAX, 2000);
        huge.pause_with(0.5);
        assert_eq!(huge.next, Duration::from_millis(2000));
        let mut nan = backoff(1000, f64::NAN, 2000);
        nan.pause_with(0.5);
        assert_eq!(nan.next, Duration::from_millis(2000));
        // `backoff(0, 0)`: steps of at least a millisecond, never a spin on the store.
        let waits = Waits {
            backoff_initial: Duration::ZERO,
            backoff_max: Duration::ZERO,
            ..Config::default().waits
        };
        let mut zero = Backoff::new(&waits);
        for _ in 0..5 {
            assert!(zero.pause_with(1.0) >= Duration::from_micros(999));
        }
    }
}
