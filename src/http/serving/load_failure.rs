//! Why a load ended without a response to store or to hand to the requests that waited for
//! it: the error the engine records for the flight (and logs), so that those requests get a
//! stale response or the layer's own gateway error.

use std::fmt;

use http::StatusCode;

/// Why a load of the layer failed.
#[derive(Debug)]
pub(crate) enum LoadFailure {
    /// The loader found no request in its slot: another load of the URL sent it.
    RequestSent,
    /// A loader that must not load: the request went to its URL's load, which failed.
    RequestWithFailedLoad,
    /// The inner service returned an error.
    InnerService,
    /// The inner service answered with a server error private to this request.
    PrivateServerError(StatusCode),
    /// A server error whose header fields are over the limit, so it cannot be shared.
    HeadersTooLarge,
    /// A server error whose body failed or is over the limit, so it cannot be shared.
    BodyNotShareable,
    /// A server error the codec cannot encode, so it cannot be shared.
    NotEncodable,
    /// A vary marker the codec cannot encode.
    MarkerNotEncodable,
}

impl fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadFailure::RequestSent => f.write_str("the request was already sent"),
            LoadFailure::RequestWithFailedLoad => {
                f.write_str("the request went to the failed load of its URL")
            }
            LoadFailure::InnerService => f.write_str("the inner service failed"),
            LoadFailure::PrivateServerError(status) => {
                write!(f, "the inner service answered {status}")
            }
            LoadFailure::HeadersTooLarge => {
                f.write_str("the response's header fields are too large to share")
            }
            LoadFailure::BodyNotShareable => {
                f.write_str("the response body failed, or is too large to share")
            }
            LoadFailure::NotEncodable => f.write_str("the response cannot be encoded to share"),
            LoadFailure::MarkerNotEncodable => f.write_str("the vary marker cannot be encoded"),
        }
    }
}

impl std::error::Error for LoadFailure {}
