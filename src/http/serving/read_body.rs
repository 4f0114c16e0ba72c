//! Reading a response's body for the cache: all of it within the size limit, or, when it
//! cannot be stored, what was read and the rest, so the response still goes through intact.

use std::pin::Pin;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use http_body_util::BodyExt;

/// How reading a body for the cache ended.
pub(crate) enum Read<B: Body> {
    /// All of it, within the limit, with no trailers.
    Complete(Vec<Bytes>),
    /// Not storable: over the limit, with trailers, or failed. Holds what was read, then what
    /// stopped the read, then the unread rest.
    Stopped {
        read: Vec<Bytes>,
        trailers: Option<HeaderMap>,
        error: Option<B::Error>,
        rest: Option<Pin<Box<B>>>,
    },
}

/// Reads `body` for the cache, up to `limit` bytes.
pub(crate) async fn read_body<B>(mut body: Pin<Box<B>>, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes>,
{
    let mut read = Vec::new();
    if body.size_hint().lower() > limit as u64 {
        return Read::Stopped {
            read,
            trailers: None,
            error: None,
            rest: Some(body),
        };
    }
    let mut len = 0usize;
    loop {
        match body.frame().await {
            None => return Read::Complete(read),
            Some(Err(error)) => {
                return Read::Stopped {
                    read,
                    trailers: None,
                    error: Some(error),
                    rest: None,
                }
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    len = len.saturating_add(chunk.len());
                    read.push(chunk);
                    if len > limit {
                        return Read::Stopped {
                            read,
                            trailers: None,
                            error: None,
                            rest: Some(body),
                        };
                    }
                }
                Err(frame) => {
                    return Read::Stopped {
                        read,
                        trailers: frame.into_trailers().ok(),
                        error: None,
                        rest: Some(body),
                    }
                }
            },
        }
    }
}
