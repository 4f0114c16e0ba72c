//! The one clock the crate reads wall-clock time from (stored-at times, `Date`, `Age`,
//! `Expires`): the system's, moved on by tokio's clock. Everything timed by an interval reads
//! `tokio::time::Instant` already; this puts the wall clock behind the same seam, so that a
//! test on paused tokio time (`tokio::time::pause`, `advance`) moves both together.
//!
//! Outside paused time tokio's clock is the system's monotonic one, so the reading is the
//! system's wall clock (less the nanoseconds between the three readings). While tokio's time
//! is paused, it is the wall clock at the pause plus what the test advanced.

use std::time::SystemTime;

/// The wall clock, as tokio's time moves it.
pub(crate) fn now() -> SystemTime {
    let (tokio, system, wall) = (
        tokio::time::Instant::now().into_std(),
        std::time::Instant::now(),
        SystemTime::now(),
    );
    match tokio.checked_duration_since(system) {
        Some(ahead) => wall.checked_add(ahead).unwrap_or(wall),
        None => wall
            .checked_sub(system.duration_since(tokio))
            .unwrap_or(wall),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// On real time: what it tests is the clock's reading on real time.
    #[tokio::test]
    async fn it_is_the_system_clock_on_real_time() {
        let (before, read, after) = (SystemTime::now(), now(), SystemTime::now());
        assert!(before <= read + Duration::from_millis(1) && read <= after);
    }

    #[tokio::test(start_paused = true)]
    async fn paused_time_moves_it() {
        let start = now();
        tokio::time::advance(Duration::from_secs(3600)).await;
        let moved = now().duration_since(start).unwrap();
        // An hour, give or take the real time the test took to run.
        assert!(
            moved >= Duration::from_secs(3599) && moved <= Duration::from_secs(3601),
            "{moved:?}"
        );
        // And it stays put while paused time stands still, whatever real time passes.
        let held = now();
        std::thread::sleep(Duration::from_millis(20));
        let drift = now().duration_since(held).unwrap_or_default();
        assert!(drift < Duration::from_millis(20), "{drift:?}");
    }
}
