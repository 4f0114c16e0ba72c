//! The errors of a guarded service: its inner service's own, shared with the calls that
//! waited for the same load, and the cache's, turned into the inner service's error type
//! ([`MapError`]).

use std::error::Error as StdError;
use std::fmt;

use crate::cache::{BoxError, Error, ErrorKind};

/// How the calls that waited for a failed load get its error, and how an error of the cache
/// (a wait that timed out, a load that panicked or timed out, another process's failed
/// load) becomes the inner service's error type.
///
/// - [`IntoError`] (the default), for an error type that is `From<tower_stampede::Error>`
///   and `Into<BoxError>`, as `BoxError` is: every call of a failed load gets
///   `E::from(error)`, an [`Error`] of kind [`Load`](ErrorKind::Load) whose
///   [`get_ref`](Error::get_ref) (its cause) is the inner service's error.
/// - Any `Fn(tower_stampede::Error) -> E` where `E: Clone` (a `tonic::Status`, an enum of
///   your own): every call of a failed load gets a clone of the inner service's error, and
///   the function makes an `E` of the cache's own errors.
pub trait MapError<E>: Send + Sync + 'static {
    /// The inner service's error of a failed load, as the engine shares it with the calls
    /// that waited (each of them gets [`map_error`](Self::map_error) of it).
    fn share(&self, error: E) -> BoxError;

    /// The error of a call that got no answer, as the inner service's error type.
    fn map_error(&self, error: Error) -> E;
}

/// The default [`MapError`]: `E::from(error)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntoError;

impl<E> MapError<E> for IntoError
where
    E: From<Error> + Into<BoxError>,
{
    fn share(&self, error: E) -> BoxError {
        error.into()
    }

    fn map_error(&self, error: Error) -> E {
        E::from(error)
    }
}

impl<E, F> MapError<E> for F
where
    E: Clone + Send + Sync + 'static,
    F: Fn(Error) -> E + Send + Sync + 'static,
{
    fn share(&self, error: E) -> BoxError {
        Box::new(Shared(error))
    }

    fn map_error(&self, error: Error) -> E {
        let shared = (error.kind() == ErrorKind::Load)
            .then(|| error.get_ref())
            .flatten()
            .and_then(|cause| cause.downcast_ref::<Shared<E>>());
        match shared {
            Some(Shared(inner)) => inner.clone(),
            None => self(error),
        }
    }
}

/// An error of the inner service, as a failed load hands it to the engine: the calls that
/// shared the load (in this process) find it as their [`Error`]'s cause ([`Error::get_ref`]) and clone it.
struct Shared<E>(E);

impl<E> fmt::Debug for Shared<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The error may carry what a caller sent; it is the caller's to print.
        f.write_str("Shared(..)")
    }
}

impl<E> fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the inner service failed")
    }
}

impl<E> StdError for Shared<E> {}
