//! The guides of `docs/`, as they read in the repository: the one home of what they say, with
//! their examples compiled as doctests.

#[doc = include_str!("../docs/http.md")]
pub mod http {}
