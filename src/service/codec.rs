//! How a service's answers become bytes in the cache and back: [`ServiceCodec`], its serde
//! implementation on [`Typed`](crate::cache::Typed) handles (feature `serde`), and the
//! envelope that tells a stored response from a stored (or shared) error.

use bytes::{BufMut, Bytes, BytesMut};

use crate::cache::BoxError;

/// How the responses (and, optionally, the errors) of a service become bytes and back.
///
/// With feature `serde`, a `Typed` handle (`Cache::typed`) is one: responses of any serde
/// type, stored behind their schema tag.
/// Implement it for other formats (protobuf messages, a service's own wire bytes).
///
/// Decoding must fail, never panic, on bytes it did not write.
pub trait ServiceCodec<R, E>: Send + Sync + 'static {
    /// `response` as bytes to store.
    ///
    /// # Errors
    ///
    /// The response cannot be encoded: it goes to its own caller, and is not stored (the
    /// calls that waited for it call the inner service themselves).
    fn encode(&self, response: &R) -> Result<Bytes, BoxError>;

    /// The response in `bytes`.
    ///
    /// # Errors
    ///
    /// `bytes` are not a whole response of this codec: a miss, reloaded and overwritten.
    fn decode(&self, bytes: &[u8]) -> Result<R, BoxError>;

    /// `error` as bytes, so that the calls waiting for the failed load in other processes
    /// get it too (and, if [`cache_errors`](super::CacheLayer::cache_errors) says so, so
    /// that it is stored). `None` (the default): the error goes to the calls waiting in this
    /// process, and the others fail with [`ErrorKind::RecentFailure`](crate::ErrorKind).
    fn encode_error(&self, error: &E) -> Option<Bytes> {
        let _ = error;
        None
    }

    /// The error in `bytes`, written by [`encode_error`](Self::encode_error).
    fn decode_error(&self, bytes: &[u8]) -> Option<E> {
        let _ = bytes;
        None
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<R, E, C> ServiceCodec<R, E> for crate::cache::Typed<R, C>
where
    R: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    C: crate::cache::Codec,
{
    fn encode(&self, response: &R) -> Result<Bytes, BoxError> {
        self.encode_value(response)
    }

    fn decode(&self, bytes: &[u8]) -> Result<R, BoxError> {
        self.decode_value(bytes)
            .ok_or_else(|| "not a value of this schema".into())
    }
}

/// What the layer stores: one byte for the kind, then the codec's bytes.
const RESPONSE: u8 = b'R';
const ERROR: u8 = b'E';

/// A stored (or shared) answer of the inner service, as the layer reads it.
pub(super) enum Answer<R, E> {
    Response(R),
    Error(E),
}

/// `payload` behind the byte of its kind.
fn wrap(kind: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + 1);
    out.put_u8(kind);
    out.put_slice(payload);
    out.freeze()
}

/// A response's bytes in the cache.
pub(super) fn encode_response<R, E>(
    codec: &impl ServiceCodec<R, E>,
    response: &R,
) -> Result<Bytes, BoxError> {
    Ok(wrap(RESPONSE, &codec.encode(response)?))
}

/// An error's bytes in the cache, if the codec encodes errors.
pub(super) fn encode_error<R, E>(codec: &impl ServiceCodec<R, E>, error: &E) -> Option<Bytes> {
    Some(wrap(ERROR, &codec.encode_error(error)?))
}

/// The response in `bytes` only (for L1 hits, which answer with responses only).
pub(super) fn decode_response<R, E>(codec: &impl ServiceCodec<R, E>, bytes: &[u8]) -> Option<R> {
    match bytes.split_first() {
        Some((&RESPONSE, payload)) => codec.decode(payload).ok(),
        _ => None,
    }
}

/// The answer in `bytes`, if they hold one this codec reads.
pub(super) fn decode<R, E>(codec: &impl ServiceCodec<R, E>, bytes: &[u8]) -> Option<Answer<R, E>> {
    match bytes.split_first() {
        Some((&RESPONSE, payload)) => codec.decode(payload).ok().map(Answer::Response),
        Some((&ERROR, payload)) => codec.decode_error(payload).map(Answer::Error),
        _ => None,
    }
}
