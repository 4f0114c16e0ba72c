//! Soft timeouts: a caller that has a stale value within its stale-if-error window waits that
//! long for its reload, then is answered the stale value while the reload goes on (its fill
//! still lands for everyone: it is the same one load). A leader posts the value as its
//! flight's early answer when the timeout passes; a follower stops waiting and answers it.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::follower::Follower;
use super::leader::Leader;
use super::stale::{unchanged_since, StaleValue};
use crate::cache::carry::Early;
use crate::cache::{Fetched, Outcome};

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

impl Leader<'_> {
    /// The soft timeout this leader keeps to, with a stale value to answer with: `Some`
    /// where `soft_timeout` is set, the flight takes early answers and `posted` none yet, and
    /// the value is within its window. What it posts when the timeout passes is
    /// [`post_soft`](Self::post_soft)'s.
    pub(super) fn soft_timeout(
        &self,
        soft_timeout: Option<Duration>,
        stale: Option<&StaleValue>,
        posted: bool,
    ) -> Option<Duration> {
        if posted || self.flight.is_none() {
            return None;
        }
        stale?.error_window_left(&self.inner.config.lives)?;
        soft_timeout
    }

    /// Posts `stale` as the early answer of its flight (its soft timeout passed), servable
    /// for the rest of its window and while nothing was heard of its key or tags.
    pub(super) fn post_soft(&self, stale: &StaleValue) {
        let (Some(flight), Some(left)) = (
            self.flight,
            stale.error_window_left(&self.inner.config.lives),
        ) else {
            return;
        };
        let until = crate::sync::later(Instant::now(), left);
        let digest = *self.key().digest();
        let notifier = self.inner.l1.notifier();
        let holds = unchanged_since(notifier, digest, self.stamp, &stale.tag_stamps);
        let answer = Fetched::cached(stale.payload.clone(), Outcome::Stale, stale.fresh_until());
        flight.post(Some((Ok(answer), Some(Early { until, holds }))));
    }
}

impl Follower<'_> {
    /// For a follower that has waited `waited` with `stale` at hand: how much longer its soft
    /// timeout lets it wait (zero: answer the stale value now), or `None` where it has none.
    pub(super) fn soft_left(
        &self,
        soft_timeout: Option<Duration>,
        stale: Option<&StaleValue>,
        waited: Duration,
    ) -> Option<Duration> {
        stale?.error_window_left(&self.inner.config.lives)?;
        Some(soft_timeout?.saturating_sub(waited))
    }
}
