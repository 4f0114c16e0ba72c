//! The engine's metrics, read back through a debugging recorder, over both stores.
#![cfg(feature = "metrics")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{Counter, Shared};
use tower_stampede::store::Store;
use tower_stampede::Cache;

/// A metric's value by name and labels (`name{k=v,...}`), as a number: a counter's count, a
/// gauge's value, or a histogram's number of samples.
fn read(snapshotter: &Snapshotter) -> Vec<(String, f64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (name, value)
        })
        .collect()
}

fn value(metrics: &[(String, f64)], name: &str) -> f64 {
    metrics
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0.0, |(_, v)| *v)
}

/// Two instances, 50 callers each, on one cold key with a 100 ms load; then one more call.
async fn stampede(store: Arc<dyn Store>, loads: &Counter) {
    let instances: Vec<Cache> = (0..2)
        .map(|_| {
            Cache::builder_shared(Arc::clone(&store))
                .namespace("metrics")
                .build()
        })
        .collect();
    let callers: Vec<_> = (0..100)
        .map(|i| {
            let (cache, loads) = (instances[i % 2].clone(), loads.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load("hot", move || async move {
                        loads.hit();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "v");
    }
    let again = instances[0]
        .get_or_load("hot", || async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"never"))
        })
        .await
        .unwrap();
    assert_eq!(again, "v");
}

#[test]
fn a_stampede_is_counted_by_outcome_with_its_lock_and_its_wait() {
    // One thread: every task of the run records into this thread's recorder.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for shared in runtime.block_on(Shared::both()) {
        let name = shared.name;
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let loads = Counter::default();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(stampede(Arc::clone(&shared.store), &loads));
        });
        assert_eq!(loads.get(), 1, "{name}");
        let m = read(&snapshotter);
        let at = |metric: &str| value(&m, metric);
        assert_eq!(at("stampede_loads_total{}"), 1.0, "{name}: {m:?}");
        assert_eq!(at("stampede_load_duration_seconds{}"), 1.0, "{name}: {m:?}");
        assert_eq!(
            at("stampede_lookups_total{outcome=miss-leader}"),
            1.0,
            "{name}: {m:?}"
        );
        assert_eq!(
            at("stampede_lookups_total{outcome=follower}"),
            99.0,
            "{name}: {m:?}"
        );
        assert_eq!(
            at("stampede_lookups_total{outcome=hit-l1}"),
            1.0,
            "{name}: {m:?}"
        );
        assert_eq!(
            at("stampede_lock_total{event=acquired}"),
            1.0,
            "{name}: {m:?}"
        );
        assert!(
            at("stampede_lock_total{event=contended}") >= 1.0,
            "{name}: {m:?}"
        );
        // The other instance's flight waited, and the fill's notification ended its wait.
        assert_eq!(
            at("stampede_follower_wait_seconds{ended=notified}"),
            1.0,
            "{name}: {m:?}"
        );
        assert!(at("stampede_l1_bytes{}") > 0.0, "{name}: {m:?}");
        assert_eq!(at("stampede_store_errors_total{}"), 0.0, "{name}: {m:?}");
    }
}
