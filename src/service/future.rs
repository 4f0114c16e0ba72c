//! The service's named response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project::pin_project;

use crate::store::BoxFuture;

/// The response future of [`CacheService`](super::CacheService).
#[pin_project]
pub struct ResponseFuture<F, R, E> {
    #[pin]
    kind: Kind<F, R, E>,
}

#[pin_project(project = KindProj)]
enum Kind<F, R, E> {
    /// Answered already, by L1.
    Ready { answer: Option<Result<R, E>> },
    /// Straight to the inner service: the request has no key.
    Inner {
        #[pin]
        future: F,
    },
    /// Through the cache.
    Boxed {
        future: BoxFuture<'static, Result<R, E>>,
    },
}

impl<F, R, E> ResponseFuture<F, R, E> {
    pub(super) fn ready(response: R) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                answer: Some(Ok(response)),
            },
        }
    }

    pub(super) fn inner(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future },
        }
    }

    pub(super) fn boxed(future: BoxFuture<'static, Result<R, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            // Polled again after it answered: the future contract leaves that unspecified;
            // pending forever is the answer that cannot hand out a second response.
            KindProj::Ready { answer } => answer.take().map_or(Poll::Pending, Poll::Ready),
            KindProj::Inner { future } => future.poll(cx),
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, R, E> std::fmt::Debug for ResponseFuture<F, R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Ready { .. } => "Ready",
            Kind::Inner { .. } => "Inner",
            Kind::Boxed { .. } => "Boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
