//! The forwarding variants of a URL (see [Forwarding headers](super#forwarding-headers)):
//! `Forwarded` keyed without what names the client, and the bound on how many sets of
//! forwarding values one URL is stored for.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use moka::ops::compute::Op;

/// The most sets of forwarding values that one URL is stored for, per process. A load
/// balancer sets one (a few, with several balancers or schemes); past the bound a new set
/// passes, so that an attacker cannot fill L1 or the store with variants of one page.
pub(crate) const MAX_FORWARDED_VARIANTS: usize = 16;

/// How many URLs the bound is kept for, the least recently used forgotten first.
const URLS: u64 = 10_000;

/// How long a URL's sets are kept without a request carrying forwarding headers for it.
const IDLE: Duration = Duration::from_secs(3600);

/// A `Forwarded` field value (RFC 7239 §4) without its `for=` and `by=` parameters, in any
/// element: they name the client and the proxy that received it, which differ per client,
/// not the page. The other parameters (`host=`, `proto=`, extensions) stay as sent, their
/// names in lowercase (§4: case-insensitive); elements left empty are dropped. A `,` or `;`
/// inside a quoted string separates nothing.
pub(super) fn without_for_and_by(value: &[u8]) -> Cow<'_, [u8]> {
    let mut kept: Vec<u8> = Vec::with_capacity(value.len());
    for element in split_unquoted(value, b',') {
        let mut first_pair = true;
        for pair in split_unquoted(element, b';').map(<[u8]>::trim_ascii) {
            let name = pair
                .split(|&b| b == b'=')
                .next()
                .unwrap_or(pair)
                .trim_ascii();
            if pair.is_empty()
                || name.eq_ignore_ascii_case(b"for")
                || name.eq_ignore_ascii_case(b"by")
            {
                continue;
            }
            match (first_pair, kept.is_empty()) {
                (true, true) => {}
                (true, false) => kept.push(b','),
                (false, _) => kept.push(b';'),
            }
            first_pair = false;
            kept.extend(name.to_ascii_lowercase());
            kept.extend_from_slice(&pair[name.len()..]);
        }
    }
    if kept == value {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(kept)
    }
}

/// The parts of `value` between `separator`s that are not inside a quoted string.
fn split_unquoted(value: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    let (mut quoted, mut escaped) = (false, false);
    value.split(move |&b| {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == separator {
            return true;
        }
        false
    })
}

/// The sets of forwarding values each URL was stored for, in this process: at most
/// [`MAX_FORWARDED_VARIANTS`] per URL, for the [`URLS`] most recently asked for. Cheap to
/// clone (the clones share it). Keys and values are hashed with a key of this process's own,
/// so that no client can make two sets count as one.
#[derive(Clone)]
pub(crate) struct ForwardedVariants {
    seen: moka::sync::Cache<u64, Arc<[u64]>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ForwardedVariants {
    fn default() -> Self {
        ForwardedVariants {
            seen: moka::sync::Cache::builder()
                .max_capacity(URLS)
                .time_to_idle(IDLE)
                .build(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl std::fmt::Debug for ForwardedVariants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedVariants")
            .field("urls", &self.seen.entry_count())
            .finish()
    }
}

impl ForwardedVariants {
    /// Whether a request under the forwarded primary key `primary` may be looked up: its
    /// values of the `keyed` forwarding headers are a set the URL was stored for, or one
    /// more within the bound (then counted). A hit on a known set takes no lock.
    pub(crate) fn admit(&self, primary: &str, keyed: &[HeaderName], headers: &HeaderMap) -> bool {
        let url = self.hasher.hash_one(primary);
        let mut values = String::new();
        super::push_values(&mut values, keyed, headers, true);
        let set = self.hasher.hash_one(&values);
        if self.seen.get(&url).is_some_and(|sets| sets.contains(&set)) {
            return true;
        }
        let mut admitted = false;
        self.seen.entry(url).and_compute_with(|held| match held {
            Some(held) if held.value().contains(&set) => {
                admitted = true;
                Op::Nop
            }
            Some(held) if held.value().len() >= MAX_FORWARDED_VARIANTS => Op::Nop,
            held => {
                admitted = true;
                let mut sets = held.map_or_else(Vec::new, |held| held.value().to_vec());
                sets.push(set);
                Op::Put(sets.into())
            }
        });
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::rules::tag_fields::tests::headers;

    #[test]
    fn forwarded_is_keyed_without_for_and_by_rfc_7239() {
        let cases: [(&str, &str); 7] = [
            ("host=a.example;proto=https", "host=a.example;proto=https"),
            ("for=192.0.2.1;proto=https", "proto=https"),
            ("For=192.0.2.1; Proto=https; by=10.0.0.1", "proto=https"),
            ("for=192.0.2.1", ""),
            (
                "for=192.0.2.1;host=a, for=198.51.100.7;proto=https",
                "host=a,proto=https",
            ),
            (
                "for=\"[2001:db8::1]:4711\";host=\"a;b,c\"",
                "host=\"a;b,c\"",
            ),
            ("for=1, for=2", ""),
        ];
        for (value, keyed) in cases {
            assert_eq!(
                without_for_and_by(value.as_bytes()).as_ref(),
                keyed.as_bytes(),
                "{value}"
            );
        }
        assert!(matches!(
            without_for_and_by(b"host=a;proto=https"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_url_keeps_at_most_16_sets_of_forwarding_values() {
        let variants = ForwardedVariants::default();
        let keyed = [
            HeaderName::from_static("x-forwarded-host"),
            HeaderName::from_static("forwarded"),
        ];
        let with =
            |host: &str| headers(&[("x-forwarded-host", host), ("x-forwarded-for", "192.0.2.1")]);
        for i in 0..MAX_FORWARDED_VARIANTS {
            assert!(
                variants.admit("url", &keyed, &with(&format!("h{i}"))),
                "{i}"
            );
        }
        assert!(!variants.admit("url", &keyed, &with("one-too-many")));
        assert!(variants.admit("url", &keyed, &with("h3")), "a set it keeps");
        assert!(variants.admit("other-url", &keyed, &with("one-too-many")));
        // The client's address and `for=` are no part of a set.
        let clients = (0..100).map(|i| {
            headers(&[
                ("x-forwarded-host", "h0"),
                ("x-forwarded-for", &format!("198.51.100.{i}")),
            ])
        });
        for client in clients {
            assert!(variants.admit("url", &keyed, &client));
        }
        let forwarded = (0..100).map(|i| headers(&[("forwarded", &format!("for=10.0.0.{i}"))]));
        for client in forwarded {
            assert!(variants.admit("third-url", &keyed, &client));
        }
        assert_eq!(
            variants
                .seen
                .get(&variants.hasher.hash_one("third-url"))
                .unwrap()
                .len(),
            1
        );
    }
}
