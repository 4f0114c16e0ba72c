//! Serving a cacheable request: its path through the cache, the load that calls the inner
//! service and stores what it may, and the response each request is answered with, marked
//! with how it was served.
//!
//! | file | holds |
//! | --- | --- |
//! | `flow.rs` | one request's path: the URL's key, then its variant's; answers without an entry |
//! | `load.rs` | the loader: asks the origin, reads and encodes the response for where `outlet.rs` routes it, and gives its own request its answer |
//! | `outlet.rs` | what becomes of a loaded response (`route`): stored, handed to the requests that waited for it, or to its own request alone; the policy's decision and the limits that decide it |
//! | `load_failure.rs` | why a load ended without a response to store or share |
//! | `relay.rs` | a body too large to store, read once and handed to the requests that waited for its load |
//! | `read_body.rs` | a response's body read up to the size limit, or handed on intact |
//! | `slot.rs` | the request waiting to be sent, shared by its caller and its loaders; the [`Step`](slot::Step) a loader loads for |
//! | `validation.rs` | a reload made conditional, and a `304` merged into the stored response |
//! | `responses.rs` | the responses the layer returns: from an entry, passed through, or its own |
//! | `cache_status.rs` | `Cache-Status` (RFC 9211) and `x-cache` (its tests in `cache_status/`) |
//! | `memo.rs` | field values made once per thread while their inputs stay the same |
//! | `config.rs` | [`HttpConfig`](config::HttpConfig): the settings every service of a layer shares |
//! | `body.rs` | [`ResponseBody`](crate::http::ResponseBody): a cached body, the inner service's, or one the layer made |
//! | `passes.rs` | the layer's report of its passes: a metric by reason, a rate-limited warning |

pub(super) mod body;
pub(super) mod cache_status;
pub(super) mod config;
pub(super) mod flow;
pub(super) mod load;
pub(super) mod load_failure;
pub(super) mod memo;
pub(super) mod outlet;
pub(super) mod passes;
pub(super) mod read_body;
pub(super) mod relay;
pub(super) mod responses;
pub(super) mod slot;
pub(super) mod validation;
