//! The tower shell: the layer a user configures, the service it makes, and the future of
//! every response that service returns. What happens to a request in between lives in the
//! sibling folders, below this one: the settings the layer shares and the response body in
//! `serving/`, which every room above `rules/` and `stored/` reads.
//!
//! | file | holds |
//! | --- | --- |
//! | `layer.rs` | [`StampedeLayer`]: the configuration a user writes |
//! | `service.rs` | [`Stampede`]: sorts each request (purge, ignored, unsafe, bypassed, cached) |
//! | `future.rs` | [`ResponseFuture`], the service's named future |

pub(super) mod future;
pub(super) mod layer;
pub(super) mod service;

pub use future::ResponseFuture;
pub use layer::StampedeLayer;
pub use service::Stampede;
