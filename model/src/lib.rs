//! Exhaustive models of tower-stampede's protocols, checked with [stateright]: the store
//! protocol across processes ([`store`]), the in-process coordination ([`local`]), and the
//! in-process flights a change overtakes ([`flights`]), and namespaces' generations with
//! batches' locks ([`generations`]).
//!
//! The models mirror the code (each action names the script or function it stands for); the
//! tests in `tests/` run the checker over every reachable state, and show that deliberately
//! broken variants fail.

#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]

pub mod flights;
pub mod generations;
pub mod local;
pub mod store;
