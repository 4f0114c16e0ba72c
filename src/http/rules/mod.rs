//! The rules of RFC 9111 and its companions that decide what the layer may store and answer:
//! what to do with a request, the replaceable response [`Policy`] and its default
//! [`RfcPolicy`], and the header fields these rules read.
//!
//! | file | holds |
//! | --- | --- |
//! | `request.rs` | what the layer does with a request: look it up, ignore, invalidate, bypass |
//! | `methods.rs` | safe methods, and those whose response invalidates their URL |
//! | `policy.rs` | [`Policy`] and [`RfcPolicy`]: whether a response is stored, and for how long (its tests and its property test in `policy/`) |
//! | `unstored.rs` | which responses [`RfcPolicy`] does not store still go to the requests that waited for their load |
//! | `decision.rs` | [`Decision`], what a policy decides, and [`Staleness`] |
//! | `stored_fields.rs` | which header fields of a response are stored; `x-cache`, which never is |
//! | `parse.rs` | parsers of `Cache-Control`, `Vary`, `Age`, HTTP dates and entity tags |
//! | `targeted.rs` | targeted fields (`CDN-Cache-Control`, RFC 9213) |
//! | `conditional.rs` | `If-None-Match` / `If-Modified-Since` answered with `304` |
//! | `credentials.rs` | which credentials a request carries, and the cookies that do not count |
//! | `poisoning.rs` | the request headers a page may reflect: those that pass, and the forwarding headers that are keyed |
//! | `field_name.rs` | header field names given to setters as text |
//! | `tag_fields.rs` | tags read from header fields (`Surrogate-Key`, `Cache-Tag`) |
//! | `pass.rs` | [`Pass`](pass::Pass): why a request or a response passed, one name per rule |

pub(super) mod conditional;
pub(super) mod credentials;
pub(super) mod decision;
pub(super) mod field_name;
pub(super) mod methods;
pub(super) mod parse;
pub(super) mod pass;
pub(super) mod poisoning;
pub(super) mod policy;
pub(super) mod request;
pub(super) mod stored_fields;
pub(super) mod tag_fields;
pub(super) mod targeted;
pub(super) mod unstored;

pub use decision::{Decision, Staleness};
pub use policy::{Policy, RfcPolicy};
