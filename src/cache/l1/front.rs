//! Each thread's view of the L1 entries it answered last: a hit on a hot key skips moka's read
//! (its hashing, its epoch pin and its read log) and, for a value decoded once, shares no
//! reference count with hits on other threads.
//!
//! A view is only ever a shortcut to what moka holds: an entry is used only while the L1 it
//! came from has not been written since it was read there ([`L1`](super::L1)'s count of
//! writes: every insert, removal, clear and eviction moves it), so it is the entry moka would
//! give; and every hit checks it as a hit through moka is checked (its stamps, its end in L1,
//! its refresh point). What the view keeps is bounded: [`SLOTS`] entries per thread, of values
//! up to [`LOCAL_MAX`] bytes.

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

use super::L1Entry;
use crate::store::KeyDigest;

/// How many entries a thread keeps in view, for every cache of the process together: a key
/// read through moka takes the place of the one kept longest.
const SLOTS: usize = 16;

/// One hit in this many on a key in view is also read through moka, whose admission and
/// eviction go by how often an entry is read: a key answered from the view stays hot there.
pub(super) const SAMPLE: u32 = 16;

/// The largest value kept in view: copying a value per thread pays for itself on small hot
/// values; a large one is dominated by its bytes, and would be held once per thread.
pub(super) const LOCAL_MAX: usize = 64 * 1024;

/// A value as a reader decoded it, in this thread's own copy.
pub(super) type Local = Arc<dyn Any + Send + Sync>;

struct Slot {
    /// Which L1 ([`L1::id`](super::L1)) the entry is in.
    l1: u64,
    digest: KeyDigest,
    /// That L1's count of writes before the entry was read from it.
    writes: u64,
    entry: Arc<L1Entry>,
    local: Local,
    hits: u32,
}

thread_local! {
    static VIEW: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// What the view holds of a key of the L1 `l1`, while `writes` is still that L1's count of
/// writes: `found` is given the entry, this thread's copy of its value, and whether this hit
/// is one to read through moka too, and says what the caller gets. `None` where the key is not
/// in view (or the L1 was written since: its slot is emptied).
pub(super) fn find<R>(
    l1: u64,
    writes: u64,
    digest: &KeyDigest,
    found: impl FnOnce(&L1Entry, &Local, bool) -> Option<R>,
) -> Option<R> {
    VIEW.with(|view| {
        let mut view = view.try_borrow_mut().ok()?;
        let at = view
            .iter()
            .position(|slot| slot.l1 == l1 && slot.digest == *digest)?;
        if view[at].writes != writes {
            view.swap_remove(at);
            return None;
        }
        let slot = &mut view[at];
        slot.hits = slot.hits.wrapping_add(1);
        found(&slot.entry, &slot.local, slot.hits % SAMPLE == 0)
    })
}

/// Puts an entry of the L1 `l1` in view, read from it when its count of writes was `writes`,
/// with this thread's copy of its value; in place of the key's slot, or of a slot of that L1
/// that is out of date, or of the oldest.
pub(super) fn keep(l1: u64, writes: u64, digest: KeyDigest, entry: Arc<L1Entry>, local: Local) {
    let slot = Slot {
        l1,
        digest,
        writes,
        entry,
        local,
        hits: 0,
    };
    VIEW.with(|view| {
        let Ok(mut view) = view.try_borrow_mut() else {
            return;
        };
        view.retain(|kept| kept.l1 != l1 || (kept.writes == writes && kept.digest != digest));
        if view.len() >= SLOTS {
            view.remove(0);
        }
        view.push(slot);
    });
}

/// Empties this thread's view.
#[cfg(test)]
pub(super) fn empty() {
    VIEW.with(|view| view.borrow_mut().clear());
}

/// Whether this thread's view holds an entry of the key, of any cache.
#[cfg(test)]
pub(super) fn viewed(digest: &KeyDigest) -> bool {
    VIEW.with(|view| view.borrow().iter().any(|slot| slot.digest == *digest))
}
