//! The engine's metrics, read back through a debugging recorder and through a Prometheus
//! recorder set up as the `proxy` example sets it up (buckets for the histograms), over both
//! stores.
#![cfg(feature = "metrics")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{store_test, Counter, Shared};
use tokio::runtime::Runtime;
use tower_stampede::cache::{DURATION_BUCKETS, HISTOGRAMS, METRICS_PREFIX};
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

store_test!(
    a_stampede_is_counted_by_outcome_with_its_lock_and_its_wait,
    block_on
);
fn a_stampede_is_counted_by_outcome_with_its_lock_and_its_wait(runtime: &Runtime, shared: Shared) {
    // One thread (`block_on`): every task of the run records into this thread's recorder.
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
    assert_eq!(
        at("stampede_loads_total{cache=metrics}"),
        1.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_load_duration_seconds{cache=metrics}"),
        1.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_lookups_total{cache=metrics,outcome=miss-leader}"),
        1.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_lookups_total{cache=metrics,outcome=follower}"),
        99.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_lookups_total{cache=metrics,outcome=hit-l1}"),
        1.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_lock_total{cache=metrics,event=acquired}"),
        1.0,
        "{name}: {m:?}"
    );
    assert!(
        at("stampede_lock_total{cache=metrics,event=contended}") >= 1.0,
        "{name}: {m:?}"
    );
    // The other instance's flight waited, and the fill's notification ended its wait.
    assert_eq!(
        at("stampede_follower_wait_seconds{cache=metrics,ended=notified}"),
        1.0,
        "{name}: {m:?}"
    );
    // The 49 other callers of each instance joined its flight, and waited for it too.
    assert_eq!(
        at("stampede_follower_wait_seconds{cache=metrics,ended=joined}"),
        98.0,
        "{name}: {m:?}"
    );
    assert!(
        at("stampede_l1_bytes{cache=metrics}") > 0.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_store_errors_total{cache=metrics}"),
        0.0,
        "{name}: {m:?}"
    );
}

/// Every metric the stampede recorded came with its description (Prometheus's `# HELP`).
#[test]
fn every_metric_is_described() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let shared = Shared::memory();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(stampede(Arc::clone(&shared.store), &Counter::default()));
    });
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(snapshot.len() >= 8, "{snapshot:?}");
    for (key, unit, description, _) in snapshot {
        let name = key.key().name().to_owned();
        let description = description.unwrap_or_else(|| panic!("{name} has no description"));
        assert!(!description.is_empty(), "{name}");
        if name.ends_with("_seconds") {
            assert_eq!(unit, Some(metrics::Unit::Seconds), "{name}");
        }
    }
}

store_test!(prometheus_text_has_buckets_and_help_lines, block_on);
/// Through a Prometheus recorder with the engine's buckets (as the `proxy` example installs
/// it): the histograms are histograms with those buckets, never summaries, and every family
/// has a `# HELP` line.
fn prometheus_text_has_buckets_and_help_lines(runtime: &Runtime, shared: Shared) {
    let name = shared.name;
    // The one call the docs give: every histogram of the crate's prefix gets the buckets.
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix(METRICS_PREFIX.into()), &DURATION_BUCKETS)
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(stampede(Arc::clone(&shared.store), &Counter::default()));
    });
    let text = handle.render();
    assert!(!text.contains("summary"), "{name}:\n{text}");
    for family in [
        "stampede_lookups_total",
        "stampede_loads_total",
        "stampede_load_duration_seconds",
        "stampede_lock_total",
        "stampede_follower_wait_seconds",
        "stampede_l1_bytes",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {family} "))),
            "{name}: no HELP for {family}:\n{text}"
        );
    }
    for histogram in HISTOGRAMS {
        let kind = format!("# TYPE {histogram} histogram");
        assert!(text.lines().any(|l| l == kind), "{name}: {kind}:\n{text}");
    }
    let line = |l: &str| assert!(text.lines().any(|t| t == l), "{name}: no {l:?} in:\n{text}");
    // The one load: in every bucket from its own up, so at least in the last two.
    line("stampede_load_duration_seconds_bucket{cache=\"metrics\",le=\"30\"} 1");
    line("stampede_load_duration_seconds_bucket{cache=\"metrics\",le=\"+Inf\"} 1");
    line("stampede_load_duration_seconds_count{cache=\"metrics\"} 1");
    // Each bound is a bucket of both histograms.
    for bound in DURATION_BUCKETS {
        let le = format!("le=\"{bound}\"");
        for prefix in [
            "stampede_load_duration_seconds_bucket{cache=\"metrics\",",
            "stampede_follower_wait_seconds_bucket{cache=\"metrics\",ended=\"joined\",",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{prefix}{le}}}"))),
                "{name}: no {prefix}{le}}} in:\n{text}"
            );
        }
    }
    // 98 callers joined a flight of their instance; none waited 30 s.
    line("stampede_follower_wait_seconds_bucket{cache=\"metrics\",ended=\"joined\",le=\"30\"} 98");
    line("stampede_follower_wait_seconds_count{cache=\"metrics\",ended=\"joined\"} 98");
}

store_test!(
    two_caches_of_one_process_are_told_apart_by_their_cache_label,
    block_on
);
/// Two caches of one process (say the HTTP layer's and a hot key's) record under their own
/// `cache` label: a load, a hit and the L1 size of one are not counted for the other.
fn two_caches_of_one_process_are_told_apart_by_their_cache_label(
    runtime: &Runtime,
    shared: Shared,
) {
    let name = shared.name;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let pages = shared.cache().namespace("pages").build();
            let hot = shared.cache().namespace("hot").build();
            for (cache, calls) in [(&pages, 3), (&hot, 1)] {
                for _ in 0..calls {
                    let value = cache
                        .get_or_load("k", || async {
                            Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                        })
                        .await
                        .unwrap();
                    assert_eq!(value, "v");
                }
            }
        });
    });
    let m = read(&snapshotter);
    let at = |metric: &str| value(&m, metric);
    for namespace in ["pages", "hot"] {
        assert_eq!(
            at(&format!("stampede_loads_total{{cache={namespace}}}")),
            1.0,
            "{name}: {m:?}"
        );
        assert!(
            at(&format!("stampede_l1_bytes{{cache={namespace}}}")) > 0.0,
            "{name}: {m:?}"
        );
    }
    assert_eq!(
        at("stampede_lookups_total{cache=pages,outcome=hit-l1}"),
        2.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_lookups_total{cache=hot,outcome=hit-l1}"),
        0.0,
        "{name}: {m:?}"
    );
    assert!(
        m.iter().all(|(metric, _)| metric.contains("cache=")),
        "{name}: a metric without its cache label: {m:?}"
    );
}

store_test!(passes_are_counted_by_reason, block_on);
/// Issue 40: passes are counted by the rule that made them
/// (`stampede_http_passes_total{reason}`): a request with a session cookie whose response
/// does not say it may be shared, and one with a method override.
fn passes_are_counted_by_reason(runtime: &Runtime, shared: Shared) {
    use axum::http::HeaderValue;
    use axum::response::IntoResponse;
    use support::http::send;
    use tower_stampede::StampedeLayer;

    let name = shared.name;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let cache = shared.cache().namespace("pages").build();
            let app = axum::Router::new()
                .fallback(|| async {
                    let mut response = "page".into_response();
                    response
                        .headers_mut()
                        .insert("cache-control", HeaderValue::from_static("max-age=60"));
                    response
                })
                .layer(StampedeLayer::new(cache));
            let uri = "http://app.test/p";
            for _ in 0..2 {
                send(&app, "GET", uri, &[("cookie", "session=alice")]).await;
            }
            send(&app, "GET", uri, &[("x-http-method-override", "GET")]).await;
            send(&app, "GET", uri, &[("cookie", "_ga=GA1.2.3")]).await;
        });
    });
    let m = read(&snapshotter);
    let at = |metric: &str| value(&m, metric);
    assert_eq!(
        at("stampede_http_passes_total{cache=pages,reason=credentials}"),
        2.0,
        "{name}: {m:?}"
    );
    assert_eq!(
        at("stampede_http_passes_total{cache=pages,reason=method-override}"),
        1.0,
        "{name}: {m:?}"
    );
    let passes: f64 = m
        .iter()
        .filter(|(metric, _)| metric.starts_with("stampede_http_passes_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(passes, 3.0, "{name}: an analytics cookie is no pass: {m:?}");
}

/// Labels that a Prometheus scrape sets on every target (the job, the instance, Kubernetes
/// discovery's `namespace` and `pod`): one of ours of the same name would be renamed
/// `exported_<name>`, and the crate's own queries would stop matching.
const TARGET_LABELS: [&str; 4] = ["namespace", "job", "instance", "pod"];

store_test!(no_metric_has_a_label_a_scrape_sets, block_on);
fn no_metric_has_a_label_a_scrape_sets(runtime: &Runtime, shared: Shared) {
    use support::http::send;
    use tower_stampede::StampedeLayer;

    let name = shared.name;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let loads = Counter::default();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            stampede(Arc::clone(&shared.store), &loads).await;
            let app = axum::Router::new()
                .fallback(|| async { "page" })
                .layer(StampedeLayer::new(
                    shared.cache().namespace("pages").build(),
                ));
            send(&app, "GET", "http://app.test/p", &[("cookie", "session=a")]).await;
        });
    });
    let mut names = std::collections::BTreeSet::new();
    for (key, _, _, _) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        names.insert(key.name().to_owned());
        let labels: Vec<&str> = key.labels().map(|label| label.key()).collect();
        assert!(
            labels.contains(&"cache"),
            "{name}: {} {labels:?}",
            key.name()
        );
        for label in labels {
            assert!(
                !TARGET_LABELS.contains(&label),
                "{name}: {} has a label {label}",
                key.name()
            );
        }
    }
    // Every kind of metric was seen: lookups, loads, their duration, locks, waits, L1, passes.
    assert!(names.len() >= 7, "{name}: {names:?}");
}
