//! The store protocol, checked exhaustively (see `tower_stampede_model::store`), and broken
//! variants of it shown to fail.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};
use tower_stampede_model::store::{Flaw, StoreModel};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Checks every reachable state of `model`, prints the count and the time, and asserts every
/// property (the `sometimes` ones are reached: the scenarios they name happen in the model).
fn check(name: &str, model: StoreModel) {
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .symmetry()
        .spawn_bfs()
        .join();
    println!(
        "store model, {name}: {} states ({} unique up to symmetry), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// Three processes, a follower's wait two polls long, an invalidation, a `SET` and a restart
/// of Redis at any moment.
#[test]
fn the_protocol_holds_for_three_processes() {
    check(
        "3 processes",
        StoreModel {
            early_refresh: false,
            ..StoreModel::new(3)
        },
    );
}

/// The same with early refreshes (a flight may be speculative, and take the lock from a
/// `fresh` marker), a wait one poll long.
#[test]
fn the_protocol_holds_with_early_refreshes() {
    check(
        "3 processes, early refresh",
        StoreModel {
            polls: 1,
            ..StoreModel::new(3)
        },
    );
}

/// Runs the model with `flaw` until the property `name` is broken, and returns the steps.
fn counterexample(flaw: Flaw, name: &'static str) -> Vec<String> {
    let model = StoreModel {
        flaw: Some(flaw),
        ..StoreModel::new(3)
    };
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([name].into()))
        .symmetry()
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(name);
    println!(
        "{flaw}: \"{name}\" broken after {} states, in {:.1?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    let actions: Vec<String> = path
        .into_actions()
        .iter()
        .map(|action| format!("{action:?}"))
        .collect();
    println!("  {}", actions.join(", "));
    actions
}

/// An unfenced fill lands from a leader whose lock expired (a process paused past its TTL),
/// and from a load older than an invalidation.
#[test]
fn an_unfenced_fill_is_caught() {
    let steps = counterexample(
        Flaw::UnfencedFill,
        "a fill lands only under a lock nobody took or voided since",
    );
    assert!(steps.iter().any(|step| step.starts_with("Fill")));
    counterexample(
        Flaw::UnfencedFill,
        "no fill from a load older than a completed invalidation lands",
    );
}

/// A release that ignores the token frees another leader's live lock: a second load starts.
#[test]
fn a_release_that_ignores_the_token_is_caught() {
    counterexample(
        Flaw::ReleaseIgnoresToken,
        "while a lock lives, no second load starts",
    );
}

/// A follower woken only by notifications waits for good once one is lost, or when none is
/// sent (a lock that expires publishes nothing).
#[test]
fn a_wait_without_a_poll_is_caught() {
    let steps = counterexample(Flaw::NoPoll, "every flight answers");
    assert!(steps.iter().any(|step| step.starts_with("Take")));
}

/// An answer for the waiters written in the value's place loses the value kept for
/// revalidation (the next load could not revalidate it).
#[test]
fn an_answer_that_replaces_the_value_is_caught() {
    let steps = counterexample(
        Flaw::AnswerReplacesValue,
        "an answer for the waiters leaves the value it found",
    );
    assert!(steps.iter().any(|step| step.starts_with("Answer")));
}

/// A lapsed lock that an invalidation spares lets a load older than the invalidation fill:
/// the fence of a lapsed lock is the fence of a held one.
#[test]
fn an_invalidation_that_spares_a_lapsed_lock_is_caught() {
    let steps = counterexample(
        Flaw::InvalidateSparesLapsedLock,
        "no fill from a load older than a completed invalidation lands",
    );
    assert!(steps.iter().any(|step| step == "LockExpires"));
    assert!(steps.iter().any(|step| step == "Invalidate"));
}
