//! The request slot: a cacheable request waiting to be sent, shared between its caller and
//! its loaders. A loader takes the request if it runs; otherwise the caller still has it if it
//! must go to the inner service itself.
//!
//! A response with `Vary` makes two steps (see [`key`]): the URL's key, then the
//! variant's. When the caller follows a vary marker to its variant, the request is kept for the
//! variant's loader first; a later run of the URL's loader (an early refresh, or the refresh of
//! a stale marker) waits until the variant is done with the request, then refreshes the marker
//! with it, or, if the variant's loader sent it, stores the marker again for what it had left.

use std::sync::{Arc, Mutex, MutexGuard};

use http::{HeaderMap, HeaderName, Request};
use tokio::sync::watch;

use crate::http::stored::codec::VaryMarker;
use crate::http::stored::key::{self, VariantId};

/// The key a loader loads for.
pub(crate) enum Step {
    /// The URL's key: a response without `Vary`, or a vary marker.
    Primary,
    /// A variant's key, under a marker naming these fields.
    Variant(Vec<HeaderName>),
}

/// The slot of one request; clones share it.
pub(crate) struct Slot<B>(Arc<Mutex<Pending<B>>>);

impl<B> Clone for Slot<B> {
    fn clone(&self) -> Self {
        Slot(Arc::clone(&self.0))
    }
}

struct Pending<B> {
    /// The URL's key the request is fetched under.
    primary: String,
    request: Option<Request<B>>,
    /// The request's headers, left here by the loader that took it (to key a variant).
    sent_headers: Option<HeaderMap>,
    /// Set when the caller follows a vary marker to its variant.
    following: Option<VaryMarker>,
    /// Turns true (or its sender goes away) once the variant's step is done with the request.
    variant_done: Option<watch::Receiver<bool>>,
}

/// What a loader found in the slot.
pub(crate) enum Claim<B> {
    Request(Request<B>),
    /// The caller follows this marker to a variant: store it again instead of loading.
    Restore(VaryMarker),
    Gone,
}

impl<B> Slot<B> {
    /// The slot of `request`, fetched under the URL's key `primary`.
    pub(crate) fn new(request: Request<B>, primary: String) -> Self {
        Slot(Arc::new(Mutex::new(Pending {
            primary,
            request: Some(request),
            sent_headers: None,
            following: None,
            variant_done: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Pending<B>> {
        // Nothing panics while the slot is locked; a poisoned slot is still consistent.
        crate::sync::lock(&self.0)
    }

    /// The caller follows `marker`, found under the URL's key: if the request is still here,
    /// it is kept for the variant's loader from now on. Returns the variant's key and the
    /// sender that tells a waiting loader of the URL when the variant's step is done with the
    /// request (when it turns true or goes away).
    pub(crate) fn follow(&self, marker: &VaryMarker) -> Option<(String, watch::Sender<bool>)> {
        let mut pending = self.lock();
        let request = pending.request.as_ref()?;
        let (generation, names) = (marker.generation, &marker.names);
        let variant = key::variant(&pending.primary, generation, names, request.headers());
        let (done, variant_done) = watch::channel(false);
        pending.following = Some(marker.clone());
        pending.variant_done = Some(variant_done);
        Some((variant, done))
    }

    /// The variant key under the URL's key and `marker` of the request as a loader sent it,
    /// if one did.
    pub(crate) fn sent_variant(&self, marker: &VaryMarker) -> Option<String> {
        let pending = self.lock();
        let sent = pending.sent_headers.as_ref()?;
        let (generation, names) = (marker.generation, &marker.names);
        Some(key::variant(&pending.primary, generation, names, sent))
    }

    /// Whether the request, while it is still here, is of the `variant` another request's
    /// answer was made for (see [`VariantId`]).
    pub(crate) fn is_of(&self, variant: &VariantId) -> bool {
        let pending = self.lock();
        let request = pending.request.as_ref();
        request.is_some_and(|request| variant.matches(&pending.primary, request.headers()))
    }

    /// The request, taken back by its caller to send it itself; `None` if a loader took it.
    pub(crate) fn take_back(&self) -> Option<Request<B>> {
        self.lock().request.take()
    }

    /// The request for a loader of `step`; see the [module docs](self).
    pub(crate) async fn claim(&self, step: &Step) -> Claim<B> {
        let following = {
            let mut pending = self.lock();
            match (step, &pending.following) {
                (Step::Primary, Some(marker)) => (marker.clone(), pending.variant_done.clone()),
                _ => return pending.take().map_or(Claim::Gone, Claim::Request),
            }
        };
        // The caller follows the marker to its variant: once the variant is done with the
        // request (answered from the cache, or loaded), this loader may take it and refresh
        // the marker.
        let (marker, done) = following;
        if let Some(mut done) = done {
            // An error only means the caller is gone, which is done as well.
            let _ = done.wait_for(|done| *done).await;
        }
        self.lock()
            .take()
            .map_or(Claim::Restore(marker), Claim::Request)
    }
}

impl<B> Pending<B> {
    /// The request, for a loader: its headers stay here, to key a variant.
    fn take(&mut self) -> Option<Request<B>> {
        let request = self.request.take()?;
        self.sent_headers = Some(request.headers().clone());
        Some(request)
    }
}
