//! Exhaustive models of tower-stampede's protocols, checked with [stateright]: the store
//! protocol across processes ([`store`]), and the in-process coordination ([`local`]).
//!
//! The models mirror the code (each action names the script or function it stands for); the
//! tests in `tests/` run the checker over every reachable state, and show that deliberately
//! broken variants fail.

#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]

pub mod local;
pub mod store;
