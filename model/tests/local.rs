//! In-process coordination, checked exhaustively (see `tower_stampede_model::local`), and
//! broken variants of it shown to fail.

use stateright::{Checker, HasDiscoveries, Model};
use tower_stampede_model::local::{BreakerFlaw, BreakerModel, WatchFlaw, WatchModel};

fn check<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Clone + std::fmt::Debug + PartialEq + Send + Sync,
    M::Action: Clone + std::fmt::Debug + PartialEq,
{
    let checker = model.checker().spawn_bfs().join();
    println!("{name}: {} states", checker.unique_state_count());
    checker.assert_properties();
}

fn counterexample<M>(model: M, name: &'static str) -> Vec<String>
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Clone + std::fmt::Debug + PartialEq + Send + Sync,
    M::Action: Clone + std::fmt::Debug + PartialEq,
{
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([name].into()))
        .spawn_bfs()
        .join();
    let actions: Vec<String> = checker
        .assert_any_discovery(name)
        .into_actions()
        .iter()
        .map(|action| format!("{action:?}"))
        .collect();
    println!("\"{name}\" broken: {}", actions.join(", "));
    actions
}

/// No lost wake-up: two followers of a key, its fill notified, another key of the bucket
/// notified meanwhile; whatever the interleaving, both are woken (without any poll).
#[test]
fn the_notifier_loses_no_wake_up() {
    check("watches", WatchModel { flaw: None });
}

#[test]
fn waking_before_counting_loses_a_wake_up() {
    counterexample(
        WatchModel {
            flaw: Some(WatchFlaw::WakeBeforeCount),
        },
        "every follower is woken and answers",
    );
}

#[test]
fn dropping_a_shared_sender_loses_a_wake_up() {
    counterexample(
        WatchModel {
            flaw: Some(WatchFlaw::DropRemovesShared),
        },
        "every follower is woken and answers",
    );
}

/// Never two probes at once, and the breaker closes once the store answers, whether its
/// trials are callers' calls or the timer's reads, hung or torn down.
#[test]
fn the_breaker_probes_one_at_a_time_and_closes() {
    check(
        "breaker",
        BreakerModel {
            calls: 3,
            flaw: None,
        },
    );
}

#[test]
fn an_unmarked_probe_makes_two_at_once() {
    counterexample(
        BreakerModel {
            calls: 3,
            flaw: Some(BreakerFlaw::ProbeNotMarked),
        },
        "never two probes at once",
    );
}

/// Issue 16's hazard: a trial that never reports would leave the breaker open for good.
#[test]
fn a_silent_dropped_trial_keeps_the_breaker_open() {
    let steps = counterexample(
        BreakerModel {
            calls: 3,
            flaw: Some(BreakerFlaw::DroppedTrialSilent),
        },
        "once the store answers, the breaker closes",
    );
    assert!(steps.iter().any(|step| step.starts_with("Drop")));
}
