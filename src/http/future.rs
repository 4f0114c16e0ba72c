//! The layer's named response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderValue, Response};
use http_body::Body;
use pin_project::pin_project;

use super::answer::marked;
use super::body::ResponseBody;
use crate::store::BoxFuture;

/// The response future of [`Stampede`](super::Stampede).
#[pin_project]
pub struct ResponseFuture<F, B: Body, E> {
    #[pin]
    kind: Kind<F, B, E>,
}

#[pin_project(project = KindProj)]
enum Kind<F, B: Body, E> {
    /// Straight to the inner service; the response is marked with `x-cache` if `mark` is set.
    Inner {
        #[pin]
        future: F,
        mark: Option<HeaderValue>,
    },
    /// Through the cache.
    Cached {
        future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>,
    },
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(future: F, mark: Option<HeaderValue>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, mark },
        }
    }

    pub(crate) fn cached(future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Cached { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, mark } => {
                let response = ready!(future.poll(cx))?.map(ResponseBody::inner);
                Poll::Ready(Ok(match mark.take() {
                    Some(mark) => marked(response, mark),
                    None => response,
                }))
            }
            KindProj::Cached { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B: Body, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Cached { .. } => "Cached",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
