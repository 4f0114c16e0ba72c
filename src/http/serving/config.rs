//! The layer's settings, shared by every service it makes: [`HttpConfig`].

use std::any::Any;
use std::sync::Arc;

use http::{request, response, HeaderMap, HeaderName};

use crate::http::invalidation::bounded::Invalidations;
use crate::http::rules::decision::Decision;
use crate::http::rules::pass::Pass;
use crate::http::rules::poisoning::Reflected;
use crate::http::rules::policy::{Policy, RfcPolicy};
use crate::http::rules::tag_fields;
use crate::http::serving::cache_status::CacheStatus;
use crate::http::stored::key::ForwardedVariants;
use crate::http::stored::key::{DefaultKey, MakeKey};

/// A decision on a request's head: whether a `PURGE` may remove anything (see
/// [`StampedeLayer::purge`](crate::http::StampedeLayer::purge)), whether an unsafe request invalidates.
pub(crate) type RequestCheck = Arc<dyn Fn(&request::Parts) -> bool + Send + Sync>;

/// Which unsafe requests invalidate their URL; see [`StampedeLayer::invalidate_on_unsafe`](crate::http::StampedeLayer::invalidate_on_unsafe).
#[derive(Clone)]
pub(crate) enum UnsafeInvalidation {
    Always,
    Never,
    /// Those the predicate picks.
    If(RequestCheck),
}

/// How often a URL may be invalidated by unsafe requests, per process, unless configured.
pub(crate) const DEFAULT_INVALIDATION_INTERVAL: std::time::Duration =
    std::time::Duration::from_secs(1);

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct HttpConfig {
    pub(crate) max_body_bytes: usize,
    /// The most of a body too large to store that is kept for the requests that waited for
    /// its load (see [`relay`](crate::http::serving::relay)).
    pub(crate) max_relay_bytes: usize,
    pub(crate) max_header_bytes: usize,
    /// The request headers that make a `GET` or `HEAD` pass, and the forwarding headers
    /// that are part of its key.
    pub(crate) reflected: Reflected,
    /// The sets of forwarding values each URL is stored for, bounded.
    pub(crate) forwarded_variants: ForwardedVariants,
    pub(crate) make_key: Arc<dyn MakeKey>,
    pub(crate) policy: Arc<dyn Policy>,
    /// The policy, when it is an [`RfcPolicy`]: it says why it passes a response.
    rfc: Option<Arc<RfcPolicy>>,
    pub(crate) honor_client_no_cache: bool,
    pub(crate) tag_headers: Vec<HeaderName>,
    pub(crate) keep_tag_headers: bool,
    pub(crate) max_response_stale: std::time::Duration,
    /// The purge endpoint's authorization; `None` while the endpoint is off.
    pub(crate) purge: Option<RequestCheck>,
    /// How responses are marked (`Cache-Status`, `x-cache`).
    pub(crate) cache_status: CacheStatus,
    pub(crate) unsafe_invalidation: UnsafeInvalidation,
    /// The bound on those invalidations.
    pub(crate) invalidations: Invalidations,
}

impl HttpConfig {
    /// Decides with `policy` from now on.
    pub(crate) fn set_policy<P: Policy>(&mut self, policy: P) {
        match (&policy as &dyn Any).downcast_ref::<RfcPolicy>() {
            Some(rfc) => {
                let rfc = Arc::new(rfc.clone());
                self.policy = rfc.clone();
                self.rfc = Some(rfc);
            }
            None => {
                self.policy = Arc::new(policy);
                self.rfc = None;
            }
        }
    }

    /// What the policy decides for `response` to `request`, and for a response it does not
    /// store, why: an [`RfcPolicy`] names its rule, a policy of the operator's own is
    /// [`Pass::Policy`].
    pub(crate) fn judge(
        &self,
        request: &request::Parts,
        response: &response::Parts,
    ) -> (Decision, Pass) {
        match &self.rfc {
            Some(rfc) => {
                let (decision, why) = rfc.judge(request, response);
                (decision, why.unwrap_or(Pass::Policy))
            }
            None => (self.policy.decide(request, response), Pass::Policy),
        }
    }

    /// Whether a non-error response to the unsafe `request` invalidates what it names.
    pub(crate) fn invalidates_after(&self, request: &request::Parts) -> bool {
        match &self.unsafe_invalidation {
            UnsafeInvalidation::Always => true,
            UnsafeInvalidation::Never => false,
            UnsafeInvalidation::If(invalidates) => invalidates(request),
        }
    }

    /// Removes the tag header fields from a response on its way to a client (or into the
    /// cache), unless they are kept.
    pub(crate) fn strip_tags(&self, headers: &mut HeaderMap) {
        if !self.keep_tag_headers {
            tag_fields::remove(headers, &self.tag_headers);
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        let rfc = Arc::new(RfcPolicy::new());
        HttpConfig {
            max_body_bytes: 1024 * 1024,
            max_relay_bytes: 16 * 1024 * 1024,
            max_header_bytes: 32 * 1024,
            reflected: Reflected::default(),
            forwarded_variants: ForwardedVariants::default(),
            make_key: Arc::new(DefaultKey),
            policy: rfc.clone(),
            rfc: Some(rfc),
            honor_client_no_cache: false,
            tag_headers: tag_fields::default_headers(),
            keep_tag_headers: false,
            max_response_stale: std::time::Duration::from_secs(3600),
            purge: None,
            cache_status: CacheStatus::default(),
            unsafe_invalidation: UnsafeInvalidation::Always,
            invalidations: Invalidations::new(DEFAULT_INVALIDATION_INTERVAL),
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_relay_bytes", &self.max_relay_bytes)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("reflected", &self.reflected)
            .field("honor_client_no_cache", &self.honor_client_no_cache)
            .field("tag_headers", &self.tag_headers)
            .field("keep_tag_headers", &self.keep_tag_headers)
            .field("max_response_stale", &self.max_response_stale)
            .field("purge", &if self.purge.is_some() { "on" } else { "off" })
            .field("cache_status", &self.cache_status)
            .field(
                "invalidate_on_unsafe",
                &match self.unsafe_invalidation {
                    UnsafeInvalidation::Always => "always",
                    UnsafeInvalidation::Never => "never",
                    UnsafeInvalidation::If(_) => "if",
                },
            )
            .finish_non_exhaustive()
    }
}
