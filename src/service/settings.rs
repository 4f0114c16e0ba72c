//! What every service of a layer shares: below the layer that writes it and the services and
//! fetches that read it.

/// What every service of a layer shares, behind one `Arc`.
#[derive(Clone)]
pub(super) struct Settings<K, C, F, M> {
    pub(super) key: K,
    pub(super) codec: C,
    pub(super) freshness: F,
    pub(super) map_error: M,
}
