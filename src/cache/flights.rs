//! The flights in progress in this process, by key: a caller that misses L1 joins the
//! key's flight or starts one, a flight leaves the map when it ends (only itself, by its
//! id), and a change detaches the flights it overtakes: a change made in this process at
//! once, a change heard of from another process as the next caller of the key comes.

use std::collections::hash_map;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::carry::FlightPosts;
use crate::store::{KeyDigest, Stamp};

/// The map of flights in progress, and the next flight's id.
#[derive(Default)]
pub(super) struct Flights {
    map: Mutex<HashMap<KeyDigest, FlightHandle>>,
    next: AtomicU64,
}

/// One flight in progress: its id (so only it removes itself), where it posts, and what this
/// process had heard of its key when it started (before it read anything).
struct FlightHandle {
    id: u64,
    posts: Arc<FlightPosts>,
    heard: Stamp,
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
    ///
    /// `heard` is what this process has heard of the key so far. A flight that started before
    /// a notification of the key was heard (a change made in another process) is not joined:
    /// it is detached as a change made here detaches it, and the caller starts a new flight.
    /// Notifications lost meanwhile detach nothing: a missed change is not heard, and losing
    /// them (a subscription on its way, a dropped connection) is no change. A flight whose
    /// value turned out outdated by its tags is not joined either.
    pub(super) fn enter(
        &self,
        digest: KeyDigest,
        heard: Stamp,
        look_again: impl FnOnce() -> bool,
    ) -> Entered {
        let mut flights = self.map();
        // One hash of the key, whether it joins a flight or starts one.
        match flights.entry(digest) {
            hash_map::Entry::Occupied(flight)
                if !heard.heard_since(flight.get().heard) && !flight.get().posts.is_outdated() =>
            {
                let posts = &flight.get().posts;
                posts.join();
                Entered::Joined(Arc::clone(posts))
            }
            hash_map::Entry::Occupied(mut flight) => {
                if look_again() {
                    flight.remove().posts.overtaken();
                    return Entered::LookAgain;
                }
                let (id, posts, handle) = self.handle(heard);
                flight.insert(handle).posts.overtaken();
                Entered::Started(id, posts)
            }
            hash_map::Entry::Vacant(vacant) => {
                if look_again() {
                    return Entered::LookAgain;
                }
                let (id, posts, handle) = self.handle(heard);
                vacant.insert(handle);
                Entered::Started(id, posts)
            }
        }
    }

    /// A new flight's id, posts and entry in the map.
    fn handle(&self, heard: Stamp) -> (u64, Arc<FlightPosts>, FlightHandle) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let posts = Arc::new(FlightPosts::default());
        let handle = FlightHandle {
            id,
            posts: Arc::clone(&posts),
            heard,
        };
        (id, posts, handle)
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

    const HEARD: Stamp = Stamp::UNTRACKED;

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
        let (_, posts) = started(flights.enter(key, HEARD, || false));
        let Entered::Joined(joined) =
            flights.enter(key, HEARD, || unreachable!("a flight is there"))
        else {
            panic!("joined expected");
        };
        assert!(Arc::ptr_eq(&posts, &joined));
        let other = KeyDigest::of(b"other");
        assert!(matches!(
            flights.enter(other, HEARD, || true),
            Entered::LookAgain
        ));
        started(flights.enter(other, HEARD, || false));
    }

    #[test]
    fn only_the_flight_itself_lands_and_a_detached_one_is_overtaken() {
        let flights = Flights::default();
        let key = KeyDigest::of(b"k");
        let (first, first_posts) = started(flights.enter(key, HEARD, || false));
        flights.detach(Overtaken::Keys(&[key]));
        assert!(first_posts.is_overtaken());
        let (second, second_posts) = started(flights.enter(key, HEARD, || false));
        assert_ne!(first, second);
        flights.land(key, first);
        assert!(
            matches!(flights.enter(key, HEARD, || false), Entered::Joined(_)),
            "the old flight's landing left the new one in place"
        );
        flights.land(key, second);
        started(flights.enter(key, HEARD, || false));
        flights.detach(Overtaken::Every);
        assert!(!second_posts.is_overtaken(), "it had landed already");
        started(flights.enter(key, HEARD, || false));
    }

    #[test]
    fn a_flight_from_before_a_change_heard_since_is_detached_not_joined() {
        let (flights, notifier) = (Flights::default(), crate::store::Notifier::new());
        let key = crate::store::StoreKey::new(Arc::from("ns"), KeyDigest::of(b"k"));
        let digest = *key.digest();
        let before = notifier.stamp_anyway(&digest);
        let (first, first_posts) = started(flights.enter(digest, before, || false));
        // Notifications lost and restored: nothing heard of the key, the flight is joined.
        notifier.lost();
        notifier.restored();
        let unchanged = notifier.stamp_anyway(&digest);
        assert!(matches!(
            flights.enter(digest, unchanged, || false),
            Entered::Joined(_)
        ));
        notifier.notify(&key);
        let heard = notifier.stamp_anyway(&digest);
        let (second, second_posts) = started(flights.enter(digest, heard, || false));
        assert_ne!(first, second);
        assert!(first_posts.is_overtaken());
        let Entered::Joined(joined) = flights.enter(digest, heard, || false) else {
            panic!("the new flight is joined");
        };
        assert!(Arc::ptr_eq(&second_posts, &joined));
        notifier.notify(&key);
        let later = notifier.stamp_anyway(&digest);
        assert!(matches!(
            flights.enter(digest, later, || true),
            Entered::LookAgain
        ));
        assert!(second_posts.is_overtaken());
        started(flights.enter(digest, later, || false));
    }
}
