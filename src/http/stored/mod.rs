//! What the layer stores in the cache, and under which keys: the encoding of a response or of
//! a vary marker, and the keys made from a request.
//!
//! | file | holds |
//! | --- | --- |
//! | `codec.rs` | the one encoder of the layer's entries (a response, a vary marker), and its decoder |
//! | `key.rs` | [`MakeKey`] and its implementations; the primary, credentialed and variant keys |

pub(super) mod codec;
pub(super) mod key;

pub use key::{DefaultKey, MakeKey, OriginKey, SiteKey};
