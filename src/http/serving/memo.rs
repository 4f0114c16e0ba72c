//! Field values a hit makes per response (`Age`, our `Cache-Status` member), made once per
//! thread while what they are made of stays the same: the hits of a hot entry within one
//! second share one value, whose clones share its bytes.

use std::cell::RefCell;
use std::thread::LocalKey;

use http::HeaderValue;

/// A field value, and what it was made of, as a thread keeps the last one it made (see
/// [`made_once`]).
pub(crate) type LastMade<K> = LocalKey<RefCell<Option<(K, HeaderValue)>>>;

/// The value `make` makes (with what it made it of), or the one this thread made last if
/// `same` says it was made of the same. Used for `Cache-Status` in `cache_status` and for
/// `Age` in `answer`.
pub(crate) fn made_once<K>(
    last: &'static LastMade<K>,
    same: impl FnOnce(&K) -> bool,
    make: impl FnOnce() -> (K, HeaderValue),
) -> HeaderValue {
    last.with_borrow_mut(|last| match last {
        Some((made_of, value)) if same(made_of) => value.clone(),
        _ => {
            let (made_of, value) = make();
            *last = Some((made_of, value.clone()));
            value
        }
    })
}
