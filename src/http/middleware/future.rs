//! The layer's named response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body::Body;
use pin_project::pin_project;

use crate::http::serving::body::ResponseBody;
use crate::http::serving::cache_status::Served;
use crate::http::serving::config::HttpConfig;
use crate::http::serving::responses::marked;
use crate::store::BoxFuture;

/// The response future of [`Stampede`](crate::http::Stampede).
#[pin_project]
pub struct ResponseFuture<F, B: Body, E> {
    #[pin]
    kind: Kind<F, B, E>,
}

// `Ready` holds a whole response, unboxed: it is the answer of an L1 hit, whose allocation it
// saves; the `Inner` future (a `Oneshot` holding the request) is as large in practice.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = KindProj)]
enum Kind<F, B: Body, E> {
    /// Straight to the inner service; the response is marked as served so if `mark` is set,
    /// and loses its tag header fields unless `config` keeps them.
    Inner {
        #[pin]
        future: F,
        mark: Option<Served>,
        config: Arc<HttpConfig>,
    },
    /// Answered already: a hit in L1, answered as the request was called.
    Ready {
        #[pin]
        future: std::future::Ready<Result<Response<ResponseBody<B>>, E>>,
    },
    /// Through the cache, through an invalidation (an unsafe method), or answered by the
    /// layer (a purge).
    Boxed {
        future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>,
    },
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(future: F, mark: Option<Served>, config: Arc<HttpConfig>) -> Self {
        ResponseFuture {
            kind: Kind::Inner {
                future,
                mark,
                config,
            },
        }
    }

    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                future: std::future::ready(Ok(response)),
            },
        }
    }

    pub(crate) fn boxed(future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
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
            KindProj::Inner {
                future,
                mark,
                config,
            } => {
                let mut response = ready!(future.poll(cx))?.map(ResponseBody::inner);
                config.strip_tags(response.headers_mut());
                Poll::Ready(Ok(match mark.take() {
                    Some(served) => marked(response, served, &config.cache_status),
                    None => response,
                }))
            }
            KindProj::Ready { future } => future.poll(cx),
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B: Body, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Ready { .. } => "Ready",
            Kind::Boxed { .. } => "Boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
