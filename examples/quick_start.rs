//! The README's quick start, as a production app writes it: the layer on the routes to
//! protect, probes outside it, a canonical authority, and a store that starts while Redis is
//! down. The README shows this file; `tests/quick_start.rs` runs its `app` on two instances
//! over one Redis, with the traffic a load balancer sends.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example quick_start
//! curl -i http://127.0.0.1:3000/slow    # x-cache: MISS, then HIT for 30 s
//! curl -i http://127.0.0.1:3000/ready   # 200 while the app serves, Redis up or down
//! ```

// quick start: begin
use std::time::Duration;

use axum::http::{header, uri::Authority, HeaderName};
use axum::{routing::get, Router};
use tower_stampede::http::{DefaultKey, RfcPolicy};
use tower_stampede::{store::RedisStore, Cache, StampedeLayer};

/// Probes and metrics are of this instance, now: no cache may keep them.
const NO_STORE: [(HeaderName, &str); 1] = [(header::CACHE_CONTROL, "no-store")];

/// The app: `pages` (your routes) behind the layer; probes and metrics outside it.
pub fn app(cache: Cache, pages: Router) -> Router {
    // Every instance keys pages under the site's own name, whatever `Host` reached it.
    let key = DefaultKey.authority(Authority::from_static("www.example.com"));
    // Pages that say nothing of their freshness (no max-age, no Expires) are kept 30 s.
    let policy = RfcPolicy::new().default_ttl(Duration::from_secs(30));
    let pages = pages.layer(
        StampedeLayer::new(cache.clone())
            .make_key(key)
            .policy(policy),
    );

    Router::new()
        // Ready while the app serves: with Redis down the cache degrades, it does not fail.
        .route("/ready", get(|| async { (NO_STORE, "ready\n") }))
        // The store's state, for dashboards and alerts, not for the load balancer.
        .route(
            "/health/cache",
            get(move || async move { (NO_STORE, format!("{}\n", cache.health().await)) }),
        )
        .merge(pages)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    // `open` starts even while Redis is down, and connects in the background.
    let store = RedisStore::open(url)?;
    let cache = Cache::builder(store).namespace("my-app").build();
    let pages = Router::new().route(
        "/slow",
        get(|| async { "rendered once, served to everyone" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app(cache, pages)).await?;
    Ok(())
}
// quick start: end
