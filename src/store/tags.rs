//! What a store keeps for tags, per namespace: a **generation**, a **tag clock** and the clock
//! at which each tag was last invalidated (its version), kept together so that they are lost
//! together (Redis keeps them in one hash).
//!
//! A tagged value carries the generation and the clock read before its load, and is valid
//! while the store is in that generation and none of its tags has a later version. The
//! generation is why losing this state never brings an invalidated value back: the state has
//! no expiry, but under Redis's `allkeys-*` eviction policies (or a `FLUSH` of its key alone)
//! it may go. Read as zero, a lost version would make every invalidated value valid again, and
//! a clock started again at 1 would record later invalidations below stored values' clocks.
//! Instead, state that is gone is started again in a **new, random generation**, and a value
//! of any other generation is outdated: a loss costs one reload of each tagged value (each
//! one load per stampede, as any miss), never a wrong value, and later invalidations count in
//! the new generation. A random 64-bit generation (rather than one counted on) needs nothing
//! to survive the loss; two generations coincide with odds of 2⁻⁶⁴.
//!
//! The same restart bounds the state (see [`MAX_TAG_VERSIONS`]): versions are kept for every
//! tag ever invalidated, so past that many an invalidation starts a new generation instead of
//! growing the state for good.

/// How many tags' versions a namespace keeps: an invalidation that would keep more starts a
/// new generation (every tagged value reloads once). About 8 MB in Redis.
pub const MAX_TAG_VERSIONS: usize = 100_000;

/// A namespace's tag generation and clock, as a leader reads them before its load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagClock {
    /// The namespace's tag generation: random, new whenever its tag state starts again.
    pub generation: u64,
    /// How many tag invalidations the generation has counted.
    pub clock: u64,
}

/// The versions of some tags, in the namespace's current generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagVersions {
    /// The namespace's current tag generation.
    pub generation: u64,
    /// The clock at which each tag asked for was last invalidated in this generation, in the
    /// order asked; 0 for a tag not invalidated in it.
    pub versions: Vec<u64>,
}

/// A new generation: random, so that it needs nothing of the state it replaces.
pub(crate) fn new_generation() -> u64 {
    rand::random()
}

/// A generation as the Redis store writes it: 16 hex digits (Lua numbers are doubles, so the
/// scripts keep it as a string).
#[cfg(feature = "redis")]
pub(crate) fn generation_text(generation: u64) -> String {
    format!("{generation:016x}")
}

/// A generation the Redis store wrote; `None` for anything else.
#[cfg(feature = "redis")]
pub(crate) fn parse_generation(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn generations_round_trip_as_text() {
        for generation in [0, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
            let text = generation_text(generation);
            assert_eq!(parse_generation(text.as_bytes()), Some(generation));
        }
        for bad in [&b""[..], b"12", b"not a generation", b"0123456789abcdeg"] {
            assert_eq!(parse_generation(bad), None);
        }
    }
}
