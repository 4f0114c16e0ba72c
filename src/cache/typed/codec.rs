//! How typed values become bytes and back: the [`Codec`] trait, the default [`Postcard`], and
//! the schema tag in front of every value.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cache::error::BoxError;

/// Length of the schema tag in front of every typed value.
pub(super) const TAG_LEN: usize = 8;

/// How typed values become bytes and back: a serde data format.
///
/// Implement it to store values in another format (JSON for values other programs read,
/// MessagePack, bincode, ...). Decoding must fail, never panic, on bytes it did not write.
pub trait Codec: Clone + Send + Sync + 'static {
    /// The format's name and major version, part of every value's schema tag: change it
    /// whenever the format's bytes change, so values of the old format become misses.
    fn name(&self) -> &str;

    /// Appends `value`'s encoding to `out`.
    ///
    /// # Errors
    ///
    /// The format cannot encode the value (the load then fails with [`ErrorKind::Load`](crate::ErrorKind::Load)).
    fn encode<T: Serialize + ?Sized>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), BoxError>;

    /// Decodes a whole `T` from `bytes`.
    ///
    /// # Errors
    ///
    /// `bytes` are not one well-formed `T` (trailing bytes included).
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// The default [`Codec`]: [postcard](https://docs.rs/postcard) 1, a compact binary format
/// with a stable, documented wire format (varint integers, no field names).
///
/// Chosen over bincode 2, MessagePack (rmp-serde) and bitcode for size and decoding speed on
/// typical rows (see `benches/README.md`, "Typed values: the encoding"). Bytes left over after
/// a value are an error, so a struct that lost fields does not decode.
#[derive(Clone, Copy, Debug, Default)]
pub struct Postcard;

impl Codec for Postcard {
    fn name(&self) -> &str {
        "postcard/1"
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), BoxError> {
        postcard::to_io(value, out)?;
        Ok(())
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        let (value, rest) = postcard::take_from_bytes(bytes)?;
        if rest.is_empty() {
            Ok(value)
        } else {
            Err(format!("{} bytes left over after the value", rest.len()).into())
        }
    }
}

/// `value` encoded behind its schema tag.
pub(super) fn encode<T: Serialize, C: Codec>(
    codec: &C,
    tag: [u8; TAG_LEN],
    value: &T,
) -> Result<Bytes, BoxError> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&tag);
    codec.encode(value, &mut out)?;
    Ok(Bytes::from(out))
}

/// The `T` behind `tag` in `bytes`, if that is what they hold.
pub(super) fn decode<T: DeserializeOwned, C: Codec>(
    codec: &C,
    tag: [u8; TAG_LEN],
    bytes: &[u8],
) -> Option<T> {
    let body = bytes.strip_prefix(&tag[..])?;
    codec.decode(body).ok()
}
