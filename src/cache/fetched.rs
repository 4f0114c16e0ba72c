//! What a call is answered: the value, and how it was served ([`Fetched`], [`Outcome`]); and,
//! for the caller whose loader ran, what that loader gave it alone ([`Own`]).

use super::error::BoxError;
use super::loaded::{Handoff, Loaded};
use super::outcome::Outcome;
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The answer a flight hands to each of its callers.
pub(super) type FlightResult = Result<Fetched, super::Error>;

/// The answer of [`Cache::fetch`](crate::Cache::fetch) (and, its value decoded, of `Typed::fetch`, feature
/// `serde`).
#[derive(Clone, Debug)]
pub struct Fetched<V = Bytes> {
    pub(super) value: Option<V>,
    pub(super) outcome: Outcome,
    /// When the value stops (or stopped) being fresh, for an answer from the cache.
    pub(super) fresh_until: Option<Instant>,
    /// What a load that stored nothing handed to the callers of its flight in this process.
    pub(super) handoff: Option<Handoff>,
}

impl Fetched {
    /// An answer with `value` that a load gave, how the call was answered.
    pub(super) fn loaded(value: Bytes, outcome: Outcome) -> Self {
        Fetched {
            value: Some(value),
            outcome,
            fresh_until: None,
            handoff: None,
        }
    }

    /// An answer with `value` from the cache, fresh until `fresh_until` as far as this
    /// process knows.
    pub(super) fn cached(value: Bytes, outcome: Outcome, fresh_until: Option<Instant>) -> Self {
        Fetched {
            value: Some(value),
            outcome,
            fresh_until,
            handoff: None,
        }
    }

    /// The answer of a load whose result is not cacheable: no value, for the callers that
    /// did not load.
    pub(super) fn pass() -> Self {
        Fetched::pass_with(None)
    }

    /// A pass, with what its load handed to the callers of its flight, if anything.
    pub(super) fn pass_with(handoff: Option<Handoff>) -> Self {
        Fetched {
            value: None,
            outcome: Outcome::Pass,
            fresh_until: None,
            handoff,
        }
    }
}

impl<V> Fetched<V> {
    /// The value; `None` only when the outcome is [`Outcome::Pass`].
    pub fn value(&self) -> Option<&V> {
        self.value.as_ref()
    }

    /// The value, taken out.
    pub fn into_value(self) -> Option<V> {
        self.value
    }

    /// How the call was answered.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// When the value stops being fresh (a hit, from L1 or the store) or stopped being fresh
    /// (a stale value), as far as this process knows; `None` for an answer from a load. For
    /// a remaining freshness to show, as RFC 9211's `ttl` does (negative once stale).
    pub fn fresh_until(&self) -> Option<Instant> {
        self.fresh_until
    }

    /// What the load of a pass handed to the callers of its flight in this process.
    pub(crate) fn handoff(&self) -> Option<&Handoff> {
        self.handoff.as_ref()
    }

    /// The value, or an error of kind [`Pass`](super::ErrorKind::Pass) when there is none.
    pub(super) fn value_or_pass(self) -> Result<V, super::Error> {
        self.value
            .ok_or_else(|| super::Error::new(super::ErrorKind::Pass))
    }
}

/// What a loader gives: what it shares with the flight (or why it failed), and what goes to
/// its own caller alone (see [`Own`]).
pub(crate) type Gives<O> = (Result<Loaded, BoxError>, Option<O>);

/// What a caller's own loader gave that caller alone, beside the [`Loaded`] it shared with
/// the flight (the HTTP layer's response as the origin sent it, the service layer's own
/// response): nothing if the loader did not run (an L1 hit, a joined flight, another
/// process's load) or gave nothing. The loader gives it as it ends, before the flight sees
/// what it shared, so a caller answered by the end of its flight finds it [ready](Self::ready);
/// a caller answered early (a stale value served while the flight refreshes) may wait for it
/// ([`ended`](Self::ended)).
pub(crate) struct Own<O>(Option<oneshot::Receiver<O>>);

impl<O> Own<O> {
    /// No loader of this caller's: nothing to give.
    pub(super) fn none() -> Self {
        Own(None)
    }

    /// The caller's end of what its loader will give through the sender.
    pub(super) fn channel() -> (oneshot::Sender<O>, Self) {
        let (give, own) = oneshot::channel();
        (give, Own(Some(own)))
    }

    /// What the loader gave, if it has ended and gave something.
    pub(crate) fn ready(&mut self) -> Option<O> {
        self.0.as_mut()?.try_recv().ok()
    }

    /// What the loader gives, once it ends; `None` if it did not run or gave nothing.
    pub(crate) async fn ended(self) -> Option<O> {
        self.0?.await.ok()
    }
}
