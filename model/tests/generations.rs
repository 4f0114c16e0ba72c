//! Generations (`clear`) and batches' locks, checked exhaustively (see
//! `tower_stampede_model::generations`), and broken variants shown to fail: a `set` without
//! the generation, a batch's lookup without its drop guard, an unfenced fill.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};
use tower_stampede_model::generations::{GenerationsFlaw, GenerationsModel};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Two processes, each two batches over two keys one after the other; a `set` and a clear at
/// any moment.
#[test]
fn generations_and_batches_hold_for_two_processes() {
    let started = Instant::now();
    let model = GenerationsModel {
        batches: 2,
        ..GenerationsModel::new(2)
    };
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    println!(
        "generations model, 2 processes: {} states, depth {}, in {:.1?}",
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// Runs the model with `flaw` until the property `name` is broken, and returns the steps.
fn counterexample(flaw: GenerationsFlaw, name: &'static str) -> Vec<String> {
    let model = GenerationsModel {
        flaw: Some(flaw),
        ..GenerationsModel::new(2)
    };
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([name].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(name);
    let actions: Vec<String> = path
        .into_actions()
        .iter()
        .map(|action| format!("{action:?}"))
        .collect();
    println!(
        "{flaw:?}: \"{name}\" broken after {} states, in {:.1?}\n  {}",
        checker.unique_state_count(),
        started.elapsed(),
        actions.join(", ")
    );
    actions
}

/// A `set` whose value carries no generation outlives a clear: a process serves it after it
/// heard the clear (issue 41, 1).
#[test]
fn a_set_without_the_generation_is_caught() {
    let steps = counterexample(
        GenerationsFlaw::SetWithoutGeneration,
        "no value from before a clear its process heard is served",
    );
    assert!(steps.iter().any(|step| step.starts_with("Write")));
    assert!(steps.iter().any(|step| step.starts_with("Clear")));
}

/// A batch whose caller goes away before its lookup answers, without the drop guard, leaves
/// the locks it took (issue 41, 4).
#[test]
fn a_batch_lookup_without_its_drop_guard_is_caught() {
    let steps = counterexample(
        GenerationsFlaw::NoDropGuard,
        "no batch that went away leaves a lock behind",
    );
    assert!(steps.iter().any(|step| step.starts_with("Drop")));
}

/// A batch's fill that ignores its lock lands after the lock expired.
#[test]
fn an_unfenced_batch_fill_is_caught() {
    let steps = counterexample(
        GenerationsFlaw::UnfencedFill,
        "a fill lands only under a live lock",
    );
    assert!(steps.iter().any(|step| step.starts_with("Fill")));
}
