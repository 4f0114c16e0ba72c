//! The flights in progress in this process, by key: a caller that misses L1 joins the
//! key's flight or starts one, a flight leaves the map when it ends (only itself, by its
//! id), and a change detaches the flights it overtakes.

use std::collections::hash_map;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::carry::FlightPosts;
use crate::store::KeyDigest;

/// The map of flights in progress, and the next flight's id.
#[derive(Default)]
pub(super) struct Flights {
    map: Mutex<HashMap<KeyDigest, FlightHandle>>,
    next: AtomicU64,
}

/// One flight in progress: its id (so only it removes itself) and where it posts.
struct FlightHandle {
    id: u64,
    posts: Arc<FlightPosts>,
}

/// What [`Flights::enter`] found.
pub(super) enum Entered {
    /// The key's flight in progress, joined: where it posts.
    Joined(Arc<FlightPosts>),
    /// No flight, and the caller looks at L1 again rather than start one.
    LookAgain,
    /// A flight started by the caller: its id and where it posts.
    Started(u64, Arc<FlightPosts>),
}

/// The flights of this process that a change overtakes.
#[derive(Clone, Copy)]
pub(super) enum Overtaken<'a> {
    /// The flights of these keys (an invalidation, a write, an expiry).
    Keys(&'a [KeyDigest]),
    /// Every flight: a tag invalidation, as a flight learns its value's tags only once it has
    /// read or loaded it.
    Every,
}

impl Flights {
    fn map(&self) -> MutexGuard<'_, HashMap<KeyDigest, FlightHandle>> {
        // Nothing panics while the map is locked; a poisoned map is still consistent.
        crate::sync::lock(&self.map)
    }

    /// Joins the flight of `digest`, or starts one unless `look_again` (asked, under the
    /// lock, only where no flight is in progress) says L1 is to be read once more first.
    pub(super) fn enter(&self, digest: KeyDigest, look_again: impl FnOnce() -> bool) -> Entered {
        let mut flights = self.map();
        // One hash of the key, whether it joins a flight or starts one.
        let vacant = match flights.entry(digest) {
            hash_map::Entry::Occupied(flight) => {
                let posts = &flight.get().posts;
                posts.join();
                return Entered::Joined(Arc::clone(posts));
            }
            hash_map::Entry::Vacant(vacant) => vacant,
        };
        if look_again() {
            return Entered::LookAgain;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let posts = Arc::new(FlightPosts::default());
        vacant.insert(FlightHandle {
            id,
            posts: Arc::clone(&posts),
        });
        Entered::Started(id, posts)
    }

    /// Removes the flight `id` of `digest`, if it is still the key's flight.
    pub(super) fn land(&self, digest: KeyDigest, id: u64) {
        let mut flights = self.map();
        // One hash of the key: found and removed through its entry.
        if let hash_map::Entry::Occupied(flight) = flights.entry(digest) {
            if flight.get().id == id {
                flight.remove();
            }
        }
    }

    /// Detaches the flights a change overtakes: they run on for the callers they have (whose
    /// calls began before the change), but a caller that comes after starts or follows a new
    /// flight, and they withdraw their early answer. A flight that read the key before the
    /// change would otherwise answer the old value to a caller that read after it.
    pub(super) fn detach(&self, overtaken: Overtaken<'_>) {
        let mut flights = self.map();
        match overtaken {
            Overtaken::Keys(keys) => {
                for key in keys {
                    if let Some(flight) = flights.remove(key) {
                        flight.posts.overtaken();
                    }
                }
            }
            Overtaken::Every => {
                for (_, flight) in flights.drain() {
                    flight.posts.overtaken();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(entered: Entered) -> (u64, Arc<FlightPosts>) {
        match entered {
            Entered::Started(id, posts) => (id, posts),
            _ => panic!("a flight was expected to start"),
        }
    }

    #[test]
    fn a_second_caller_joins_the_flight_the_first_started() {
        let flights = Flights::default();
        let key = KeyDigest::of(b"k");
        let (_, posts) = started(flights.enter(key, || false));
        let Entered::Joined(joined) = flights.enter(key, || unreachable!("a flight is there"))
        else {
            panic!("joined expected");
        };
        assert!(Arc::ptr_eq(&posts, &joined));
        let other = KeyDigest::of(b"other");
        assert!(matches!(flights.enter(other, || true), Entered::LookAgain));
        started(flights.enter(other, || false));
    }

    #[test]
    fn only_the_flight_itself_lands_and_a_detached_one_is_overtaken() {
        let flights = Flights::default();
        let key = KeyDigest::of(b"k");
        let (first, first_posts) = started(flights.enter(key, || false));
        flights.detach(Overtaken::Keys(&[key]));
        assert!(first_posts.is_overtaken());
        let (second, second_posts) = started(flights.enter(key, || false));
        assert_ne!(first, second);
        flights.land(key, first);
        assert!(
            matches!(flights.enter(key, || false), Entered::Joined(_)),
            "the old flight's landing left the new one in place"
        );
        flights.land(key, second);
        started(flights.enter(key, || false));
        flights.detach(Overtaken::Every);
        assert!(!second_posts.is_overtaken(), "it had landed already");
        started(flights.enter(key, || false));
    }
}
