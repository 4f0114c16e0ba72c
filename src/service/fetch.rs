//! The path of a call whose key L1 did not answer: one fetch of the engine, whose leader
//! runs [`load`]; the request waits in a slot for whichever of its loader or its own
//! fallback (after a pass) sends it. The loader gives the inner service's answer, as it came,
//! to its own caller beside what it shares (the engine's [`Own`]).

use std::error::Error as StdError;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tower::util::Oneshot;
use tower::Service;
use tracing::debug;

use super::codec::{self, Answer, ServiceCodec};
use super::error::MapError;
use super::freshness::FreshnessFor;
use super::settings::Settings;
#[cfg(doc)]
use crate::cache::Own;
use crate::cache::{Ask, BoxError, Cache, Error, ErrorKind, Loaded};
use crate::store::KeyDigest;

/// The inner service and the request, until one of them is sent.
type Slot<S, Req> = Arc<Mutex<Option<(S, Req)>>>;

/// What the load gives its own caller: the inner service's answer, as it came.
type Answered<S, Req> = Result<<S as Service<Req>>::Response, <S as Service<Req>>::Error>;

/// The answer of a call under the key hashed to `digest`, which L1 did not answer: from the
/// store, from another call's load (its response, or its error), from this call's own load,
/// or (after a pass) from the inner service directly.
pub(super) async fn fetch<S, Req, K, C, F, M>(
    inner: S,
    cache: Cache,
    settings: Arc<Settings<K, C, F, M>>,
    digest: KeyDigest,
    request: Req,
) -> Answered<S, Req>
where
    S: Service<Req> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Clone + Send + Sync + 'static,
    S::Error: Send + 'static,
    Req: Send + 'static,
    K: Send + Sync + 'static,
    C: ServiceCodec<S::Response, S::Error>,
    F: FreshnessFor<S::Response, S::Error>,
    M: MapError<S::Error>,
{
    let slot: Slot<S, Req> = Arc::new(Mutex::new(Some((inner, request))));
    let loader = {
        let (slot, settings) = (Arc::clone(&slot), Arc::clone(&settings));
        move |_previous| load(slot, settings)
    };
    let accepts = {
        let settings = Arc::clone(&settings);
        move |bytes: &Bytes| codec::decode(&settings.codec, bytes).is_some()
    };
    let ask = Ask::digest(digest, &[]).accepting(accepts);
    let (fetched, mut own) = cache.fetch_as(ask, loader).await;
    let own = own.ready();
    let cached = match &fetched {
        Ok(fetched) => fetched
            .value()
            .and_then(|bytes| codec::decode(&settings.codec, bytes)),
        Err(_) => None,
    };
    match (own, cached, fetched) {
        (Some(Ok(response)), _, _) => Ok(response),
        // A stale response stands in for this call's own failed load (stale-if-error).
        (Some(Err(_)), Some(Answer::Response(response)), _) => Ok(response),
        // The inner service's error, as it came.
        (Some(Err(error)), _, _) => Err(error),
        (None, Some(Answer::Response(response)), _) => Ok(response),
        (None, Some(Answer::Error(error)), _) => Err(error),
        (None, None, Err(error)) => Err(settings.map_error.map_error(error)),
        // A pass: the load's response was not stored, so this call asks for its own.
        (None, None, Ok(_)) => {
            let unsent = crate::sync::lock(&slot).take();
            match unsent {
                Some((inner, request)) => Oneshot::new(inner, request).await,
                None => Err(settings.map_error.map_error(Error::new(ErrorKind::Pass))),
            }
        }
    }
}

/// The load of the call in `slot`: the inner service's response, stored as the freshness
/// says, or its error, shared with the calls that waited (and stored only if the freshness
/// says so). A response goes to this call's own caller as it came; so does an error the codec
/// shares as bytes (the others are handed to the engine whole, see [`MapError::share`]).
async fn load<S, Req, K, C, F, M>(
    slot: Slot<S, Req>,
    settings: Arc<Settings<K, C, F, M>>,
) -> (Result<Loaded, BoxError>, Option<Answered<S, Req>>)
where
    S: Service<Req>,
    C: ServiceCodec<S::Response, S::Error>,
    F: FreshnessFor<S::Response, S::Error>,
    M: MapError<S::Error>,
{
    let Some((inner, request)) = crate::sync::lock(&slot).take() else {
        return (
            Err("the request went to the inner service already".into()),
            None,
        );
    };
    match Oneshot::new(inner, request).await {
        Ok(response) => {
            let freshness = settings.freshness.freshness(&response);
            let loaded = match codec::encode_response(&settings.codec, &response) {
                Ok(bytes) => freshness.loaded(bytes),
                Err(error) => {
                    debug!(
                        error = &*error as &dyn StdError,
                        "response not encodable; passed"
                    );
                    Loaded::pass()
                }
            };
            (Ok(loaded), Some(Ok(response)))
        }
        Err(error) => {
            let Some(bytes) = codec::encode_error(&settings.codec, &error) else {
                // For the calls that waited in this process, through the engine's error.
                return (Err(settings.map_error.share(error)), None);
            };
            let loaded = match settings.freshness.error_freshness(&error) {
                Some(freshness) => freshness.loaded(bytes),
                // For every call that waited, in any process; nothing is remembered.
                None => Loaded::for_waiters(bytes),
            };
            (Ok(loaded), Some(Err(error)))
        }
    }
}
