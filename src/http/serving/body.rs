//! The body of every response the layer returns.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

use crate::http::serving::relay::RelayReader;

/// The body of a response from [`Stampede`](crate::http::Stampede): a cached body, the inner
/// service's body untouched, the inner body replayed after the part the cache had read
/// before it gave up on storing it, or such a body read through the relay that also hands it
/// to the requests that waited for its load.
#[pin_project]
pub struct ResponseBody<B: Body> {
    #[pin]
    kind: Kind<B>,
}

#[pin_project(project = KindProj)]
enum Kind<B: Body> {
    Cached {
        data: Option<Bytes>,
    },
    Inner {
        #[pin]
        body: B,
    },
    Replay {
        read: VecDeque<Bytes>,
        trailers: Option<HeaderMap>,
        error: Option<B::Error>,
        rest: Option<Pin<Box<B>>>,
    },
    Relayed {
        reader: RelayReader<B::Error>,
    },
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn cached(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Cached {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn empty() -> Self {
        Self::cached(Bytes::new())
    }

    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// The body of the request that loaded a relayed response.
    pub(crate) fn relayed(reader: RelayReader<B::Error>) -> Self {
        ResponseBody {
            kind: Kind::Relayed { reader },
        }
    }

    /// The chunks already read, then what stopped the read (trailers, an error, or nothing),
    /// then the rest of `rest`, if any.
    pub(crate) fn replay(
        read: Vec<Bytes>,
        trailers: Option<HeaderMap>,
        error: Option<B::Error>,
        rest: Option<Pin<Box<B>>>,
    ) -> Self {
        ResponseBody {
            kind: Kind::Replay {
                read: read.into(),
                trailers,
                error,
                rest,
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Cached { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Replay {
                read,
                trailers,
                error,
                rest,
            } => {
                if let Some(chunk) = read.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                if let Some(error) = error.take() {
                    return Poll::Ready(Some(Err(error)));
                }
                match rest {
                    Some(body) => body.as_mut().poll_frame(cx),
                    None => Poll::Ready(None),
                }
            }
            KindProj::Relayed { reader } => reader.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Cached { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Replay {
                read,
                trailers,
                error,
                rest,
            } => {
                read.is_empty()
                    && trailers.is_none()
                    && error.is_none()
                    && rest.as_ref().is_none_or(|b| b.is_end_stream())
            }
            Kind::Relayed { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Cached { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Replay { read, rest, .. } => {
                let read: u64 = read.iter().map(|c| c.len() as u64).sum();
                let rest = rest.as_ref().map(|b| b.size_hint()).unwrap_or_default();
                let mut hint = SizeHint::new();
                hint.set_lower(read.saturating_add(rest.lower()));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(read.saturating_add(upper));
                }
                hint
            }
            Kind::Relayed { reader } => reader.size_hint(),
        }
    }
}

impl<B: Body> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Cached { .. } => "Cached",
            Kind::Inner { .. } => "Inner",
            Kind::Replay { .. } => "Replay",
            Kind::Relayed { .. } => "Relayed",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
