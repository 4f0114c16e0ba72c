//! Revalidation: a leader's loader is handed the stale value the store still keeps
//! ([`Previous`]), and a "not modified" answer renews that value in the store (one fenced
//! [`StoreExt::renew`](crate::store::StoreExt::renew), its bytes not sent again) instead of filling
//! a new one.

use std::time::SystemTime;

use super::leader::Leader;
use super::stale::StaleValue;
use crate::cache::config::Life;
use crate::cache::fetched::Fetched;
use crate::cache::loaded::Previous;
use crate::cache::outcome::Outcome;
use crate::store::Renewal;
use crate::store::StoreExt;

impl Leader<'_> {
    /// The value a leader's loader is handed: the stale value, unless a tag of it was
    /// invalidated (the lookup that took the lock did not check its tags, and an outdated
    /// value must not be renewed), or it carries no generation (written by a release before
    /// `clear` existed: renewed, it would outlive a clear for another TTL).
    pub(super) async fn previous(&self, stale: Option<&StaleValue>) -> Option<Previous> {
        let stale = stale?;
        let tagged = stale.tags.as_ref().filter(|t| t.generation.is_some())?;
        let valid = self.parts.tags().tags_valid(tagged).await;
        matches!(valid, Ok(Some(_))).then(|| stale.previous())
    }

    /// The loader, started at `started`, found the stale value unchanged: the store renews
    /// it, fresh for `ttl` (or the default TTL), without its bytes; a store that no longer
    /// holds it (or cannot renew) gets it filled again, as loaded at `started`.
    ///
    /// A renewed value keeps the load start it was stored with: a write after a wait timeout
    /// of a load that started between that and this revalidation may replace it, with what
    /// the revalidation found to be the same value.
    ///
    /// The value's tags are checked again once written: one invalidated during the
    /// revalidation marks the flight the renewal answers outdated, as a loaded value would.
    pub(super) async fn renew(
        &mut self,
        stale: StaleValue,
        life: Life,
        started: SystemTime,
    ) -> Fetched {
        let parts = self.parts;
        let fill = parts.ready_to_store(
            &stale.payload,
            life,
            (started, stale.load_time),
            stale.tags.as_ref(),
            stale.windows,
        );
        let renewal = parts
            .store
            .renew(self.key(), self.guard.token, fill.store_ttl);
        let renewed = parts.breaker.finish(renewal).await;
        let tagged = stale.tags.as_ref();
        match renewed {
            Ok(Renewal::NoValue) => {
                self.fill_value(&fill, tagged).await;
            }
            renewed => {
                let written = renewed.map(|renewed| renewed == Renewal::Renewed);
                self.after_write(written, &fill, tagged).await;
            }
        }
        Fetched::loaded(fill.value, Outcome::Revalidated)
    }
}
