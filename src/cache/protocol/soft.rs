//! Soft timeouts: a caller that has a stale value within its stale-if-error window waits that
//! long for its reload, then is answered the stale value while the reload goes on (its fill
//! still lands for everyone: it is the same one load). A leader posts the value as its
//! flight's early answer when the timeout passes; a follower stops waiting and answers it.
//! The rules alone are here; the roles apply them.

use std::future::Future;
use std::time::Duration;

use super::stale::StaleValue;
use crate::cache::config::Lives;

/// Runs `load`; if it takes longer than `soft_timeout`, first calls `meanwhile` (within the
/// poll in which the timeout passed, so the flight's carrier sees what it posts at once).
pub(super) async fn within<T>(
    load: impl Future<Output = T>,
    soft_timeout: Option<Duration>,
    meanwhile: impl FnOnce(),
) -> T {
    let Some(soft_timeout) = soft_timeout else {
        return load.await;
    };
    tokio::pin!(load);
    tokio::select! {
        biased;
        done = &mut load => return done,
        () = tokio::time::sleep(soft_timeout) => meanwhile(),
    }
    load.await
}

/// The soft timeout a leader with `stale` at hand keeps to: `Some` where `soft_timeout` is
/// set, its flight takes early answers (`takes_early`) and none was `posted` yet, and the
/// value is within its window.
pub(super) fn for_leader(
    lives: &Lives,
    soft_timeout: Option<Duration>,
    stale: Option<&StaleValue>,
    takes_early: bool,
    posted: bool,
) -> Option<Duration> {
    if posted || !takes_early {
        return None;
    }
    stale?.error_window_left(lives)?;
    soft_timeout
}

/// For a follower that has waited `waited` with `stale` at hand: how much longer its soft
/// timeout lets it wait (zero: answer the stale value now), or `None` where it has none.
pub(super) fn left_for_follower(
    lives: &Lives,
    soft_timeout: Option<Duration>,
    stale: Option<&StaleValue>,
    waited: Duration,
) -> Option<Duration> {
    stale?.error_window_left(lives)?;
    Some(soft_timeout?.saturating_sub(waited))
}
