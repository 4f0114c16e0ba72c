//! What becomes of a loaded response beyond its own request's answer ([`Outlet`]): stored,
//! or handed to the requests that waited for its load ([`route`]); and the layer's limits
//! that decide it (the policy's decision made whole, the header and relay limits, the entry
//! to store).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use tracing::debug;

use super::load_failure::LoadFailure;
use super::slot::Step;
use crate::cache::{Cache, Loaded};
use crate::http::rules::decision::{Decision, Staleness};
use crate::http::rules::parse::{self, Vary};
use crate::http::rules::pass::Pass;
use crate::http::rules::tag_fields;
use crate::http::serving::config::HttpConfig;

/// What becomes of a response the policy lets go beyond its own request.
#[derive(Clone, Copy)]
pub(super) enum Outlet {
    /// Stored, fresh for this long.
    Store(Duration),
    /// Not stored: handed to the requests that waited for its load, here and elsewhere.
    /// `failed`: a server error, for which a stale response may stand in, and which fails its
    /// waiters where it cannot be handed to them.
    Waiters { failed: bool },
}

/// Where a loaded response may go beyond its own request ([`Outlet`]), for how long it
/// stays servable, with the tags it is stored with and the request header fields it is keyed
/// by (those its `Vary` names, and the forwarding ones where the request is keyed by them).
pub(super) struct Route {
    pub(super) outlet: Outlet,
    /// Why it is not stored, where it is not.
    pub(super) why: Pass,
    pub(super) stale: Staleness,
    pub(super) tags: Vec<Vec<u8>>,
    pub(super) names: Vec<HeaderName>,
}

/// A response that goes to its own request alone, and why; with the load's failure where
/// it failed (a stale response may then stand in for it, and its waiters fail).
pub(super) struct Refused {
    pub(super) why: Pass,
    pub(super) failure: Option<LoadFailure>,
}

/// Where the response with head `parts`, loaded for `step` of the request `asked`, may go;
/// `forwarding`, the forwarding header fields the request is keyed by, if it is, and whether
/// its set of their values may be stored (if not, what would be stored is handed to the
/// requests that waited for this load instead, for `too-many-variants`).
pub(super) fn route(
    (cache, config): (&Cache, &HttpConfig),
    asked: &http::request::Parts,
    parts: &http::response::Parts,
    step: &Step,
    tags: Result<Vec<Vec<u8>>, tag_fields::OverLimit>,
    forwarding: Option<(&[HeaderName], bool)>,
) -> Result<Route, Refused> {
    let refused = |why| Refused { why, failure: None };
    let (decision, mut why) = config.decide(cache, asked, parts);
    let stores = forwarding.is_none_or(|(_, stores)| stores);
    let forwarding = forwarding.map(|(names, _)| names);
    let (outlet, stale) = match decision {
        // A set of forwarding values the URL has no place for: coalesced, not stored.
        Decision::StoreWith { .. } if !stores => {
            why = Pass::TooManyVariants;
            (Outlet::Waiters { failed: false }, Staleness::default())
        }
        Decision::StoreWith { fresh_for, stale } => (Outlet::Store(fresh_for), stale),
        // A failed load (a server error without explicit freshness): stored for nobody, but
        // the requests that waited for this load, here and elsewhere, get the origin's own
        // answer too, and a stale response may stand in for it.
        Decision::Share => (Outlet::Waiters { failed: true }, Staleness::default()),
        // A failed load private to its request: a stale response, if there is one, is
        // served in its place to the others.
        Decision::Fail => {
            let failure = Some(LoadFailure::PrivateServerError(parts.status));
            return Err(Refused { why, failure });
        }
        // Not stored, but it may go to the requests that waited for this load.
        Decision::Pass if config.policy.shares_with_waiters(asked, parts) => {
            (Outlet::Waiters { failed: false }, Staleness::default())
        }
        _ => return Err(refused(why)),
    };
    let failed = matches!(outlet, Outlet::Waiters { failed: true });
    if !config.headers_fit(&parts.headers) {
        // As for a body over the limit: not stored, and a server error's answer that cannot
        // be shared fails its waiters.
        debug!("response header fields over the limit; passed");
        let failure = failed.then_some(LoadFailure::HeadersTooLarge);
        return Err(Refused {
            why: Pass::HeadersTooLarge,
            failure,
        });
    }
    // Keyed by its forwarding headers: as if the response varied on them too, so that what was
    // loaded for one set of their values goes to no request with others, stored or handed on.
    let with_forwarded = |mut names: Vec<HeaderName>| {
        for name in forwarding.unwrap_or_default() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    };
    let (tags, names) = match (outlet, tags) {
        // A server error goes to every waiter (the layer's own gateway error is no better),
        // but for its forwarding headers.
        (Outlet::Waiters { failed: true }, _) => (Vec::new(), with_forwarded(Vec::new())),
        (Outlet::Waiters { failed: false }, _) => match parse::vary(&parts.headers) {
            Vary::None => (Vec::new(), with_forwarded(Vec::new())),
            Vary::Names(names) => (Vec::new(), with_forwarded(names)),
            Vary::Unkeyable => return Err(refused(Pass::VaryStar)),
        },
        (Outlet::Store(_), Err(_)) => {
            // A purge of its tags could not reach it.
            debug!("more tags than a stored response may carry; passed");
            return Err(refused(Pass::TooManyTags));
        }
        (Outlet::Store(_), Ok(tags)) => match (parse::vary(&parts.headers), step) {
            // Keyed by its forwarding headers: a variant.
            (Vary::None, Step::Primary) if forwarding.is_some() => {
                (tags, with_forwarded(Vec::new()))
            }
            (Vary::Names(names), Step::Primary) if forwarding.is_some() => {
                (tags, with_forwarded(names))
            }
            (Vary::None, _) => (tags, Vec::new()),
            // A variant may be stored under a key that names more fields than it varies on,
            // never fewer.
            (Vary::Names(names), Step::Variant(keyed))
                if names.iter().all(|n| keyed.contains(n)) =>
            {
                (tags, names)
            }
            (Vary::Names(names), Step::Primary) => (tags, names),
            (Vary::Names(_) | Vary::Unkeyable, _) => return Err(refused(Pass::VaryStar)),
        },
    };
    Ok(Route {
        outlet,
        why,
        stale,
        tags,
        names,
    })
}

impl HttpConfig {
    /// What the policy decides for `response`, [in full](Decision::in_full), and why if it
    /// is not stored: a freshness of 0 is stored only with stale rules of its own, and only
    /// where `cache` keeps values to revalidate them.
    pub(super) fn decide(
        &self,
        cache: &Cache,
        asked: &http::request::Parts,
        response: &http::response::Parts,
    ) -> (Decision, Pass) {
        let (decision, why) = self.judge(asked, response);
        match decision.in_full() {
            Decision::StoreWith { fresh_for, .. }
                if fresh_for.is_zero() && cache.keep().is_zero() =>
            {
                (Decision::Pass, why)
            }
            decision => (decision, why),
        }
    }

    /// Whether a body over the size limit, of which the origin says `hint`, is relayed to the
    /// requests that waited for its load (see [`relay`](super::relay)).
    pub(super) fn relays(&self, hint: http_body::SizeHint) -> bool {
        self.max_relay_bytes > 0 && hint.lower() <= self.max_relay_bytes as u64
    }

    /// Why another request's load of a URL kept nothing, as far as a request of another
    /// process sent to the origin by its pass marker can tell from its own response (whose
    /// policy would store it), of whose body the origin says `hint`: a body over the size
    /// limit (`too-large`), else `uncacheable`.
    pub(super) fn unkept(&self, hint: http_body::SizeHint) -> Pass {
        if hint.lower() > self.max_body_bytes as u64 {
            Pass::TooLarge
        } else {
            Pass::Uncacheable
        }
    }

    /// Whether a response's header fields are within
    /// [`max_header_bytes`](crate::http::StampedeLayer::max_header_bytes).
    pub(super) fn headers_fit(&self, headers: &HeaderMap) -> bool {
        let mut bytes = 0usize;
        headers.iter().all(|(name, value)| {
            bytes = bytes.saturating_add(name.as_str().len() + value.len() + 4);
            bytes <= self.max_header_bytes
        })
    }

    /// A response's entry to store for `ttl`, with its stale windows (within the layer's
    /// maximum) and tags.
    pub(super) fn to_store(
        &self,
        entry: Bytes,
        ttl: Duration,
        stale: Staleness,
        tags: &[Vec<u8>],
    ) -> Loaded {
        let max = self.max_response_stale;
        let mut loaded = exactly(entry, ttl).tags(tags);
        if let Some(window) = stale.while_revalidating {
            loaded = loaded.stale_while_revalidate(window.min(max));
        }
        if let Some(window) = stale.if_error {
            loaded = loaded.stale_if_error(window.min(max));
        }
        loaded
    }
}

/// An entry to store fresh for `ttl` exactly: a response's freshness is the origin's (RFC 9111
/// §4.2.1), which the cache's TTL jitter must not lengthen.
pub(super) fn exactly(entry: Bytes, ttl: Duration) -> Loaded {
    Loaded::value_with_ttl(entry, ttl).ttl_jitter(Duration::ZERO)
}
