//! The layer: configuration only.

use std::sync::Arc;

use tower::Layer;

use super::{HttpConfig, Stampede};
use crate::cache::Cache;

/// Wraps services in a [`Stampede`] guard over one [`Cache`]; see the [module docs](super).
///
/// Every service the layer makes shares the cache (and so its L1, flights and store).
#[derive(Clone, Debug)]
#[must_use]
pub struct StampedeLayer {
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl StampedeLayer {
    /// A layer that caches through `cache`.
    pub fn new(cache: Cache) -> Self {
        StampedeLayer {
            cache,
            config: Arc::new(HttpConfig::default()),
        }
    }

    /// The largest response body that is stored, in bytes; larger ones stream through to
    /// their caller intact and are not stored. Default: 1 MiB.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body_bytes = limit;
        self
    }
}

impl<S> Layer<S> for StampedeLayer {
    type Service = Stampede<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Stampede::new(inner, self.cache.clone(), Arc::clone(&self.config))
    }
}
