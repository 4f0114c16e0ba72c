//! The tower shell: the layer a user configures, the service it makes, and the future and
//! body of every response that service returns. What happens to a request in between lives
//! in the sibling folders.
//!
//! | file | holds |
//! | --- | --- |
//! | `layer.rs` | [`StampedeLayer`]: the configuration a user writes |
//! | `config.rs` | [`HttpConfig`](config::HttpConfig): the settings every service of a layer shares |
//! | `service.rs` | [`Stampede`]: sorts each request (purge, ignored, unsafe, bypassed, cached) |
//! | `future.rs` | [`ResponseFuture`], the service's named future |
//! | `body.rs` | [`ResponseBody`]: a cached body, the inner service's, or one the layer made |
//! | `passes.rs` | the layer's report of its passes: a metric by reason, a rate-limited warning |

pub(super) mod body;
pub(super) mod config;
pub(super) mod future;
pub(super) mod layer;
pub(super) mod passes;
pub(super) mod service;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::StampedeLayer;
pub use service::Stampede;
