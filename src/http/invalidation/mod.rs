//! Removing stored responses: those of a URL that an unsafe method changed (RFC 9111 §4.4),
//! and those purged by URL or by tag, from application code or the `PURGE` endpoint.
//!
//! | file | holds |
//! | --- | --- |
//! | `by_url.rs` | the keys a URL names; the URLs a response to an unsafe method invalidates |
//! | `bounded.rs` | [`Invalidations`](bounded::Invalidations): at most one invalidation per URL per interval |
//! | `purge.rs` | [`Purger`], and the `PURGE` endpoint |
//! | `remove.rs` | the engine call that removes keys, in a task of its own |

pub(crate) mod bounded;
pub(super) mod by_url;
pub(super) mod purge;
mod remove;

pub use purge::Purger;
