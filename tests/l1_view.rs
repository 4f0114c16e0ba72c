//! Each thread's view of the L1 entries it read last (`src/cache/l1/front.rs`) must only ever
//! answer what L1 itself would: these tests hold it to that through the public API, on the
//! embedded store and paused time, and those of the service layer on Redis too.

use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::Router;
use bytes::Bytes;
use support::http::{get, split_ttl};
use support::{store_test, Counter, Shared};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_stampede::service::{CacheLayer, Freshness, ServiceCodec};
use tower_stampede::store::MemoryStore;
use tower_stampede::{Cache, Loaded, StampedeLayer};

/// A service's own wire bytes as its responses, and its errors (text) stored too.
#[derive(Clone)]
struct Wire;

impl ServiceCodec<Bytes, String> for Wire {
    fn encode(&self, response: &Bytes) -> Result<Bytes, BoxError> {
        Ok(response.clone())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Bytes, BoxError> {
        Ok(Bytes::copy_from_slice(bytes))
    }

    fn encode_error(&self, error: &String) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(error.as_bytes()))
    }

    fn decode_error(&self, bytes: &[u8]) -> Option<String> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

store_test!(a_stored_error_is_never_answered_as_a_response);
/// A stored error of a service whose responses are `Bytes` stays an error on every call. The
/// second call misses L1's decoder (an error is no response), so its fetch reads L1 as bytes
/// and keeps the stored bytes (`E` then the error) in the thread's view; the third call's L1
/// hit takes those bytes, a `Bytes` as its response type is, for a response.
async fn a_stored_error_is_never_answered_as_a_response(shared: Shared) {
    let calls = Counter::default();
    let backend = {
        let calls = calls.clone();
        service_fn(move |_: u32| {
            calls.hit();
            async { Err::<Bytes, _>(String::from("gone")) }
        })
    };
    let cache = shared.cache().build();
    let layer = CacheLayer::with_codec(cache, |id: &u32| Some(id.to_be_bytes()), Wire)
        .cache_errors(|_: &String| Some(Freshness::ttl(Duration::from_secs(60))))
        .map_error(|error: tower_stampede::Error| error.to_string());
    let service = ServiceBuilder::new().layer(layer).service(backend);
    for call in 1..=4 {
        let answer = service.clone().oneshot(7).await;
        assert_eq!(answer, Err(String::from("gone")), "call {call}");
    }
    assert_eq!(calls.get(), 1, "the error was stored");
}

store_test!(a_call_that_finds_l1_filled_late_leaves_no_raw_bytes_for_the_next);
/// The same without errors, as in any stampede: a call that missed L1 reads it again when its
/// future first runs, after another call's load filled it, and keeps the stored bytes (`R`
/// then the response) in view; the next call's hit answers them as the response.
async fn a_call_that_finds_l1_filled_late_leaves_no_raw_bytes_for_the_next(shared: Shared) {
    let backend = service_fn(|_: u32| async { Ok::<_, String>(Bytes::from_static(b"value")) });
    let cache = shared.cache().build();
    let layer = CacheLayer::with_codec(cache, |id: &u32| Some(id.to_be_bytes()), Wire)
        .map_error(|error: tower_stampede::Error| error.to_string());
    let service = ServiceBuilder::new().layer(layer).service(backend);
    // Called (L1 missed) but not yet run.
    let late = tower::Service::call(&mut service.clone(), 7);
    assert_eq!(
        service.clone().oneshot(7).await.as_deref(),
        Ok(&b"value"[..])
    );
    assert_eq!(late.await.as_deref(), Ok(&b"value"[..]), "the late call");
    assert_eq!(
        service.clone().oneshot(7).await.as_deref(),
        Ok(&b"value"[..])
    );
}

/// After any change of a key (this cache's own, or another process's heard over the store's
/// notifications), its next read never answers the value a thread had in view: each change
/// is made once the key's value is in view (its third read), over a store that notifies and
/// a cache that hears no notifications (whose new values carry the old stamp).
#[tokio::test(start_paused = true)]
async fn no_change_leaves_a_value_in_view() {
    const CHANGES: [&str; 7] = [
        "invalidate",
        "set",
        "expire",
        "clear",
        "tag",
        "heard",
        "heard set",
    ];
    for (change, hears) in CHANGES.into_iter().flat_map(|c| [(c, true), (c, false)]) {
        if change.starts_with("heard") && !hears {
            continue;
        }
        let store = MemoryStore::new();
        let cache = Cache::builder(store.clone()).notifications(hears).build();
        // Another process over the same store.
        let other = Cache::builder(store).build();
        let loads = Counter::default();
        let load = || {
            let loads = loads.clone();
            move || async move {
                let value = Bytes::from(format!("v{}", loads.hit()));
                Ok::<_, std::io::Error>(Loaded::value(value).tags(["t"]))
            }
        };
        for _ in 0..3 {
            let fetched = cache.fetch("k", load()).await.unwrap();
            assert_eq!(fetched.value().unwrap(), "v1", "{change} {hears}");
        }
        let minute = Duration::from_secs(60);
        match change {
            "invalidate" => cache.invalidate("k").await.unwrap(),
            "set" => cache.set("k", "new", minute).await.unwrap(),
            "expire" => cache.expire("k").await.unwrap(),
            "clear" => cache.clear().await.unwrap(),
            "tag" => cache.invalidate_tag("t").await.unwrap(),
            "heard" => other.invalidate("k").await.unwrap(),
            _ => other.set("k", "new", minute).await.unwrap(),
        }
        let after = cache.fetch("k", load()).await.unwrap();
        let want = if change.ends_with("set") { "new" } else { "v2" };
        assert_eq!(after.value().unwrap(), want, "{change} {hears}");
    }
}

/// A cache made after another is dropped, in the same thread, never answers from what the
/// thread kept in view of the first (L1s are told apart by an id never given twice).
#[tokio::test(start_paused = true)]
async fn a_new_cache_never_reads_a_dropped_caches_view() {
    for value in ["first", "second"] {
        let cache = Cache::builder(MemoryStore::new()).build();
        let load = move || async move { Ok::<_, std::io::Error>(Bytes::from(value)) };
        for _ in 0..3 {
            assert_eq!(cache.get_or_load("k", load).await.unwrap(), value);
        }
    }
}

/// A hit answered from the view says the `Age` and `Cache-Status` ttl of the moment it is
/// answered, not of when the entry was read or decoded (or the thread's memo of the last
/// values made), as paused time moves on.
#[tokio::test(start_paused = true)]
async fn age_and_ttl_of_hits_from_the_view_follow_the_clock() {
    let page = || async { ([(header::CACHE_CONTROL, "max-age=60")], "page") };
    let app = Router::new()
        .route("/", axum::routing::get(page))
        .layer(StampedeLayer::new(
            Cache::builder(MemoryStore::new()).build(),
        ));
    assert_eq!(get(&app, "/").await.x_cache(), "MISS");
    let mut clock = Duration::ZERO;
    // The first hit reads moka (the entry is decoded and kept in view); the others, the view.
    for step in [0, 0, 7_000, 0, 1_500, 400] {
        tokio::time::advance(Duration::from_millis(step)).await;
        clock += Duration::from_millis(step);
        let hit = get(&app, "/").await;
        assert_eq!((hit.status, hit.x_cache()), (StatusCode::OK, "HIT"));
        assert_eq!(hit.age(), Some(clock.as_secs()), "at {clock:?}");
        let (_, ttl) = split_ttl(hit.headers["cache-status"].to_str().unwrap());
        let left = Duration::from_secs(60) - clock;
        assert_eq!(ttl, Some(left.as_secs() as i64), "at {clock:?}");
    }
}
