//! The breaker's own tests: its states, and what a call counts.

use super::*;
use crate::cache::config::Config;
use crate::store::MemoryStore;

fn breaker(threshold: u32) -> Breaker {
    let settings = BreakerSettings {
        threshold,
        open_for: Duration::from_secs(1),
        ..Config::default().breaker
    };
    Breaker::new(&settings, &Arc::from("t"), Arc::new(MemoryStore::new()))
}

#[tokio::test(start_paused = true)]
async fn opens_after_the_threshold_probes_once_and_closes() {
    let breaker = breaker(3);
    let now = Instant::now();
    let first = breaker.record(false, now);
    assert!(!first.opened && first.start_check);
    assert!(!breaker.record(true, now).opened);
    assert_eq!(breaker.recoveries(), 1, "answered again after a failure");
    // Failures must be consecutive.
    assert!(!breaker.record(false, now).opened);
    assert!(
        !breaker.record(false, now).start_check,
        "one check at a time"
    );
    assert!(
        breaker.record(false, now).opened,
        "the third failure in a row opens it"
    );
    assert!(!breaker.is_closed());
    assert_eq!(breaker.admit(), Admit::Skip);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.admit(), Admit::Probe);
    assert_eq!(breaker.admit(), Admit::Skip, "one probe at a time");
    breaker.probed(false);
    assert_eq!(breaker.admit(), Admit::Skip, "open for another second");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.admit(), Admit::Probe);
    breaker.probed(true);
    assert!(breaker.is_closed());
    assert_eq!(breaker.admit(), Admit::Call);
    assert_eq!(breaker.recoveries(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_call_past_the_timeout_fails_and_counts_and_an_open_breaker_skips_calls() {
    let breaker = Arc::new(breaker(1));
    let slow = std::future::pending::<Result<(), StoreError>>();
    assert!(breaker.call(slow).await.is_err(), "timed out");
    let counts = breaker.counts();
    assert_eq!((counts.errors, counts.opened, counts.skipped), (1, 1, 0));
    let answered = breaker.call(async { Ok::<_, StoreError>(()) }).await;
    assert!(answered.is_err(), "not made while open");
    assert_eq!(breaker.counts().skipped, 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    let trial = breaker.call(async { Ok::<_, StoreError>(()) }).await;
    assert!(trial.is_ok(), "the trial is made for real");
    assert!(breaker.is_closed());
}

#[test]
fn a_zero_threshold_never_opens() {
    let breaker = breaker(0);
    for _ in 0..100 {
        assert!(!breaker.record(false, Instant::now()).opened);
    }
    assert_eq!(breaker.admit(), Admit::Call);
}
