//! The forwarding variants of a URL (see [Forwarding headers](super#forwarding-headers)): the
//! bound on how many sets of forwarding values one URL is stored for.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use moka::ops::compute::Op;

use crate::store::KeyDigest;

/// The most sets of forwarding values that one URL is stored for, per process. A load
/// balancer sets one (a few, with several balancers or schemes); past the bound a set is
/// stored only in place of one that fewer requests carry, so that an attacker can neither
/// fill L1 or the store with variants of one page nor push the balancer's set out.
pub(crate) const MAX_FORWARDED_VARIANTS: usize = 16;

/// How many URLs the bound is kept for, the least recently used forgotten first.
const URLS: u64 = 10_000;

/// One hit in this many is counted, as this many uses (see [`ForwardedVariants::used`]).
const HIT_SAMPLE: u32 = 8;

/// How long a URL's sets are kept without a load of a request carrying forwarding headers
/// for it.
const IDLE: Duration = Duration::from_secs(3600);

/// The sets of forwarding values each URL is stored for, in this process: at most
/// [`MAX_FORWARDED_VARIANTS`] per URL, for the [`URLS`] most recently loaded, chosen by use
/// rather than by arrival. Every request with forwarding headers counts a use of its set
/// (in [`Uses`]; a hit, one in [`HIT_SAMPLE`] as that many); a set the URL is not stored for yet takes the place of the held set that
/// fewer requests carried, and only if its own requests were more (TinyLFU's admission: a
/// newcomer must beat its victim). So the set most requests carry keeps its place whatever
/// arrived before it, and an attacker's values, each sent a few times, take no place from
/// it; a set turned away is looked up and coalesced as any other, just not stored.
///
/// Cheap to clone (the clones share it). Values are hashed with a key of this process's own,
/// so that no client can make two sets count as one.
#[derive(Clone)]
pub(crate) struct ForwardedVariants {
    held: moka::sync::Cache<u64, Arc<[u64]>>,
    uses: Arc<Uses>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ForwardedVariants {
    fn default() -> Self {
        ForwardedVariants {
            held: moka::sync::Cache::builder()
                .max_capacity(URLS)
                .time_to_idle(IDLE)
                .build(),
            uses: Arc::default(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl std::fmt::Debug for ForwardedVariants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedVariants")
            .field("urls", &self.held.entry_count())
            .finish()
    }
}

impl ForwardedVariants {
    /// Counts a use of a request's set under the forwarded primary key whose digest is `url`:
    /// its values of the `keyed` forwarding headers. A request answered from L1 is counted
    /// only; one that loads asks [`admit`](Self::admit).
    pub(crate) fn used(&self, url: &KeyDigest, keyed: &[HeaderName], headers: &HeaderMap) {
        // Hits are counted one in HIT_SAMPLE per thread, each as that many uses: a lossy count
        // (as Caffeine's and moka's read buffers are), so that the hottest path hashes no set
        // and touches no shared counter on most requests, while a set's estimate still grows
        // with its hits. Loads, what an attacker's fresh values make, are all counted.
        thread_local! {
            static HITS: Cell<u32> = const { Cell::new(0) };
        }
        let tick = HITS.with(|hits| {
            let tick = hits.get().wrapping_add(1);
            hits.set(tick);
            tick
        });
        if tick.is_multiple_of(HIT_SAMPLE) {
            self.count(url, keyed, headers, HIT_SAMPLE);
        }
    }

    /// Counts a use of a request's set (as [`used`](Self::used)) and tells whether the response
    /// to it may be stored: the set is one the URL is stored for, or one that takes a place
    /// (see [above](Self)). A request whose set is turned away is still looked up and
    /// coalesced; only its load stores nothing. Asked by loads alone, so a URL's sets are
    /// forgotten after an hour without a load for it, and made again by the next: the
    /// counts, kept apart, still rank them.
    pub(crate) fn admit(&self, url: &KeyDigest, keyed: &[HeaderName], headers: &HeaderMap) -> bool {
        let (url, set, uses) = self.count(url, keyed, headers, 1);
        if self.held.get(&url).is_some_and(|sets| sets.contains(&set)) {
            return true;
        }
        let mut admitted = false;
        self.held.entry(url).and_compute_with(|held| {
            let mut sets = held.map_or_else(Vec::new, |held| held.value().to_vec());
            if sets.contains(&set) {
                admitted = true;
                return Op::Nop;
            }
            if sets.len() < MAX_FORWARDED_VARIANTS {
                sets.push(set);
            } else {
                let used = |held: u64| self.uses.estimate(url ^ held.rotate_left(32));
                let Some(fewest) = (0..sets.len()).min_by_key(|&i| used(sets[i])) else {
                    return Op::Nop;
                };
                if uses <= used(sets[fewest]) {
                    return Op::Nop;
                }
                sets[fewest] = set;
            }
            admitted = true;
            Op::Put(sets.into())
        });
        admitted
    }

    /// The URL and set of a request, as held, and its uses with these `uses` more.
    fn count(
        &self,
        url: &KeyDigest,
        keyed: &[HeaderName],
        headers: &HeaderMap,
        uses: u32,
    ) -> (u64, u64, u32) {
        let url = Self::url_of(url);
        let mut set = Hashing(self.hasher.build_hasher());
        super::variant::push_values(&mut set, keyed, headers, true);
        let set = set.0.finish();
        (url, set, self.uses.count(url ^ set.rotate_left(32), uses))
    }

    /// A URL as the sets are held under it: by its key's digest, which no client can make
    /// collide with another URL's.
    fn url_of(digest: &KeyDigest) -> u64 {
        let [a, b, c, d, e, f, g, h, ..] = *digest.as_bytes();
        u64::from_le_bytes([a, b, c, d, e, f, g, h])
    }
}

/// A hash of a set of forwarding values, made as the variant key spells the fields a request
/// holds, without those it does not: every name that is spelled has a value after it, so
/// two sets hash alike only if the same fields hold the same values, and a request with few
/// forwarding fields hashes few bytes.
struct Hashing<H>(H);

impl<H: Hasher> super::variant::KeySink for Hashing<H> {
    fn put(&mut self, part: &str) {
        self.0.write(part.as_bytes());
    }

    fn absent(&mut self, _name: &str) {}
}

/// How often each pair of a URL and a set of forwarding values was used, approximately: a
/// count-min sketch (four rows of counters; an estimate is the least of its four, and a use
/// raises only those at the least, so that noise grows as slowly as it can) whose counts are
/// halved every [`Uses::AGE_AFTER`] uses, so that what was used long ago weighs less than
/// what is used now, and no count ties at a ceiling. Fixed in size ([`Uses::WIDTH`] × 4
/// counters, 128 KiB) whatever the clients send; an attacker's values only add noise, which
/// weighs on a newcomer's count and on its victim's alike (a newcomer whose four counters
/// all collide with others' may take a place it did not earn: with 1,000 sets in the
/// sketch, about one in 4,500).
pub(super) struct Uses {
    counters: Vec<AtomicU32>,
    counted: AtomicU32,
}

impl Default for Uses {
    fn default() -> Self {
        Uses {
            counters: (0..4 * Self::WIDTH).map(|_| AtomicU32::new(0)).collect(),
            counted: AtomicU32::new(0),
        }
    }
}

impl Uses {
    /// Counters per row.
    const WIDTH: usize = 8192;
    /// Uses counted between two halvings.
    const AGE_AFTER: u32 = 10 * Self::WIDTH as u32;

    /// The counter of `item` in each row: 13 bits of its (mixed) hash per row.
    fn slots(item: u64) -> [usize; 4] {
        let mixed = item.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        std::array::from_fn(|row| {
            row * Self::WIDTH + ((mixed >> (16 * row + 3)) as usize & (Self::WIDTH - 1))
        })
    }

    /// The estimate of how often `item` was used.
    pub(super) fn estimate(&self, item: u64) -> u32 {
        self.least(Self::slots(item))
    }

    fn least(&self, slots: [usize; 4]) -> u32 {
        slots
            .iter()
            .map(|&slot| self.counters[slot].load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Counts `uses` uses of `item` and returns its estimate.
    pub(super) fn count(&self, item: u64, uses: u32) -> u32 {
        let slots = Self::slots(item);
        let least = self.least(slots);
        let raised = least.saturating_add(uses);
        for slot in slots {
            // A counter another use raised meanwhile is left as it is: counts are estimates.
            let _ = self.counters[slot].compare_exchange(
                least,
                raised,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let before = self.counted.fetch_add(uses, Ordering::Relaxed);
        if (before..before.saturating_add(uses)).contains(&Self::AGE_AFTER) {
            // One caller sees the count pass the mark, and ages the sketch.
            self.counted.store(0, Ordering::Relaxed);
            for counter in &self.counters {
                let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c / 2));
            }
        }
        raised
    }
}

#[cfg(test)]
mod tests;
