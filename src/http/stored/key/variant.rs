//! A request's variant: the one spelling of a variant key ([`variant`]), hashed as it is
//! spelled for a hit ([`variant_digest`]) and for what an answer handed to waiters carries
//! ([`VariantId`]); see [the keys](super#keys-in-two-steps-when-a-response-has-vary).

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

use super::forwarded_field::without_for_and_by;
use super::{is_forwarded, needs_no_escape};
use crate::store::key::KeyHasher;
use crate::store::KeyDigest;

/// The variant key of a request under a primary key whose vary marker has `generation` and
/// names `names`. Under a forwarded primary key, `Forwarded` is keyed without its `for=`
/// and `by=` (see [Forwarding headers](super#forwarding-headers)).
pub(crate) fn variant(
    primary: &str,
    generation: u64,
    names: &[HeaderName],
    request: &HeaderMap,
) -> String {
    let mut key = String::with_capacity(64 + primary.len() + 32 * names.len());
    put_variant(&mut key, primary, generation, names, request);
    key
}

/// The digest of [`variant`]'s key, made without building it: what a hit looks up.
pub(crate) fn variant_digest(
    primary: &str,
    generation: u64,
    names: &[HeaderName],
    request: &HeaderMap,
) -> KeyDigest {
    let mut hasher = KeyHasher::new();
    put_variant(&mut hasher, primary, generation, names, request);
    hasher.finish()
}

/// Where the parts of a key go: the key itself, or straight into a hash of it. Every part
/// is UTF-8, so a key built of them is a `String`.
pub(super) trait KeySink {
    fn put(&mut self, part: &str);

    /// A name the request holds no value of: in a key, the name alone.
    fn absent(&mut self, name: &str) {
        self.put("\0");
        self.put(name);
    }
}

impl KeySink for String {
    fn put(&mut self, part: &str) {
        self.push_str(part);
    }
}

impl KeySink for KeyHasher {
    #[inline]
    fn put(&mut self, part: &str) {
        self.update(part.as_bytes());
    }
}

/// The one spelling of a variant key, for [`variant`] and [`variant_digest`] alike.
fn put_variant(
    key: &mut impl KeySink,
    primary: &str,
    generation: u64,
    names: &[HeaderName],
    request: &HeaderMap,
) {
    key.put("vary\0");
    put_number(key, primary.len() as u64, 10, 1);
    key.put("\0");
    key.put(primary);
    key.put("\0");
    put_number(key, generation, 16, 16);
    push_values(key, names, request, is_forwarded(primary));
}

/// `n` in lowercase digits of `radix` (at most 16), at least `width` (at most 20) of them.
pub(super) fn put_number(key: &mut impl KeySink, mut n: u64, radix: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while n > 0 || digits.len() - start < width {
        start -= 1;
        digits[start] = b"0123456789abcdef"[(n % radix) as usize];
        n /= radix;
    }
    key.put(std::str::from_utf8(&digits[start..]).unwrap_or_default());
}

/// Each of `names` with the request's values of it, appended to `key`; `Forwarded` without
/// its `for=` and `by=` if `forwarded`.
pub(super) fn push_values(
    key: &mut impl KeySink,
    names: &[HeaderName],
    request: &HeaderMap,
    forwarded: bool,
) {
    let present = Present::of(names, request);
    for (i, name) in names.iter().enumerate() {
        let mut values = present
            .may_hold(i)
            .then(|| request.get_all(name).iter())
            .into_iter()
            .flatten()
            .peekable();
        if values.peek().is_none() {
            // Absent: the name alone. Present, even empty: `name=values`. Names never hold
            // `=` nor NUL, and escaped values never hold NUL, so the key is unambiguous.
            key.absent(name.as_str());
            continue;
        }
        key.put("\0");
        key.put(name.as_str());
        key.put("=");
        for (i, value) in values.enumerate() {
            if i > 0 {
                key.put(",");
            }
            let value = value.as_bytes().trim_ascii();
            let value = if forwarded && *name == FORWARDED {
                without_for_and_by(value)
            } else {
                Cow::Borrowed(value)
            };
            // Most values have nothing to escape: copied whole.
            match std::str::from_utf8(&value) {
                Ok(plain) if value.iter().all(|&b| needs_no_escape(b)) => key.put(plain),
                _ => key.put(&value.escape_ascii().to_string()),
            }
        }
    }
}

/// Which of a list of names a request may hold, found the cheaper way: where the request has
/// fewer fields than the list (a request behind a balancer, against its ten keyed forwarding
/// headers), one walk over its fields marks the names it holds, and only those are looked up
/// (each lookup hashes the name); else every name may be held.
pub(super) struct Present(u64);

impl Present {
    pub(super) fn of(names: &[HeaderName], request: &HeaderMap) -> Self {
        if names.len() > 64 || request.keys_len() >= names.len() {
            return Present(u64::MAX);
        }
        let marks = request.keys().fold(0, |marks, held| {
            let named = names.iter().enumerate().filter(|(_, name)| *name == held);
            named.fold(marks, |marks, (i, _)| marks | 1 << i)
        });
        Present(marks)
    }

    pub(super) fn may_hold(&self, i: usize) -> bool {
        i >= 64 || self.0 & 1 << i != 0
    }
}

/// `Forwarded` (RFC 7239).
static FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// What makes a request's variant, as one value: the names of the fields it is keyed by
/// (those its response's `Vary` names and, under a forwarded primary key, every keyed
/// forwarding header: [`Route`](crate::http::serving)'s names) and the digest of the
/// request's values of them, read as the variant key reads them ([`variant`]: `Forwarded`
/// without its `for=` and `by=` under a forwarded key). A response handed to the requests
/// that waited for its load, not stored, and a relayed one carry their loading request's,
/// and go only to the requests whose own is the same (RFC 9111 §4.1), as a stored one goes
/// only to the requests of its variant key. Hashed, so no request value leaves the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VariantId {
    names: Vec<HeaderName>,
    digest: KeyDigest,
}

impl VariantId {
    /// The variant of a request with `request` header fields under the primary key `primary`,
    /// keyed by `names`.
    pub(crate) fn of(primary: &str, names: Vec<HeaderName>, request: &HeaderMap) -> Self {
        let digest = Self::digest_of(primary, &names, request);
        VariantId { names, digest }
    }

    /// A variant as an entry holds it: its names and digest.
    pub(crate) fn from_parts(names: Vec<HeaderName>, digest: KeyDigest) -> Self {
        VariantId { names, digest }
    }

    /// The fields the variant is keyed by.
    pub(crate) fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// The digest of the loading request's values of them.
    pub(crate) fn digest(&self) -> &KeyDigest {
        &self.digest
    }

    /// Whether a request with `request` header fields under `primary` is of this variant:
    /// its values of the same fields are the same.
    pub(crate) fn matches(&self, primary: &str, request: &HeaderMap) -> bool {
        Self::digest_of(primary, &self.names, request) == self.digest
    }

    fn digest_of(primary: &str, names: &[HeaderName], request: &HeaderMap) -> KeyDigest {
        variant_digest(primary, 0, names, request)
    }
}
