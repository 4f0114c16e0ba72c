//! In-process flights overtaken by a change, checked exhaustively (see
//! `tower_stampede_model::flights`), and the change without its detaching shown to fail.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};
use tower_stampede_model::flights::{FlightsFlaw, FlightsModel};

const AFTER: &str = "a caller after the change never answers an older version";

/// Three callers of one key and one `invalidate`, in every interleaving: a caller that calls
/// after the change returned never answers the version from before it, while callers from
/// before it may (the load they share started before the change).
#[test]
fn a_caller_after_a_change_never_joins_a_flight_from_before_it() {
    holds(false);
}

/// Checks the model with no flaw, the change made here or `elsewhere`, and prints its size.
fn holds(elsewhere: bool) {
    let started = Instant::now();
    let checker = FlightsModel {
        callers: 3,
        flaw: None,
        elsewhere,
    }
    .checker()
    .spawn_bfs()
    .join();
    println!(
        "flights (change made {}): {} states in {:?}",
        if elsewhere { "elsewhere" } else { "here" },
        checker.unique_state_count(),
        started.elapsed()
    );
    checker.assert_properties();
}

fn counterexample(flaw: FlightsFlaw, elsewhere: bool) {
    let checker = FlightsModel {
        callers: 3,
        flaw: Some(flaw),
        elsewhere,
    }
    .checker()
    .finish_when(HasDiscoveries::AnyOf([AFTER].into()))
    .spawn_bfs()
    .join();
    let actions: Vec<String> = checker
        .assert_any_discovery(AFTER)
        .into_actions()
        .iter()
        .map(|action| format!("{action:?}"))
        .collect();
    println!("{flaw:?} broken: {}", actions.join(", "));
}

/// Defect 1 put back: a change that leaves the map of flights alone.
#[test]
fn a_change_that_detaches_no_flight_lets_a_later_caller_join_an_old_load() {
    counterexample(FlightsFlaw::NoDetach, false);
}

/// Detaching before the store call alone is not enough: a flight started during the call
/// read the old value.
#[test]
fn detaching_before_the_store_call_only_lets_a_later_caller_join_an_old_load() {
    counterexample(FlightsFlaw::DetachBeforeOnly, false);
}

/// The change made by another process and heard here: a caller that calls after this process
/// heard of it never answers the version from before it.
#[test]
fn a_caller_after_a_change_heard_never_joins_a_flight_from_before_it() {
    holds(true);
}

/// Defect 1 from another process put back: a caller joins whatever was heard.
#[test]
fn joining_whatever_was_heard_lets_a_later_caller_join_an_old_load() {
    counterexample(FlightsFlaw::HeardNotChecked, true);
}
