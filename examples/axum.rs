//! An axum app behind the stampede guard: a database pool, a TTL per route, a typed hot key
//! and probes that stay ready while the store is down (the recipes of `docs/recipes.md`, together).
//!
//! ```sh
//! cargo run --features serde --example axum                # embedded MemoryStore
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --features serde --example axum
//! curl -i http://127.0.0.1:3000/prices      # x-cache: MISS after 300 ms, then HIT for 5 s
//! curl -i http://127.0.0.1:3000/about       # the same, HIT for an hour
//! curl -i http://127.0.0.1:3000/products/7  # a typed value, cached by the handler
//! curl -i http://127.0.0.1:3000/ready       # 200 while the app serves, Redis up or down
//! curl -i http://127.0.0.1:3000/health/cache  # the store's state, for dashboards
//! ```
//!
//! `LISTEN` sets the address (default `127.0.0.1:3000`). With `REDIS_URL`, the app starts
//! even while Redis is down (`RedisStore::open`): `/ready` stays 200 and every route still
//! answers, each process loading for itself, until Redis is up; `/health/cache` says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::routing::get;
use axum::Router;
use serde::{Deserialize, Serialize};
use tower_stampede::cache::Typed;
use tower_stampede::http::RfcPolicy;
use tower_stampede::store::{MemoryStore, RedisStore};
use tower_stampede::{Cache, StampedeLayer};

/// Stands in for a database pool (`sqlx::PgPool`, `deadpool`, `bb8`): a cheap, cloneable
/// handle over shared state, whose queries take a while.
#[derive(Clone, Default)]
struct Db {
    queries: Arc<AtomicU64>,
}

impl Db {
    async fn query(&self, what: &str) -> Result<String, std::io::Error> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let n = self.queries.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(format!("{what} (database query #{n})"))
    }
}

/// A typed value: stored with postcard, decoded once per process and shared as an `Arc`.
#[derive(Serialize, Deserialize)]
struct Product {
    id: u64,
    name: String,
    price_cents: u64,
}

#[derive(Clone)]
struct AppState {
    cache: Cache,
    db: Db,
    products: Typed<Product>,
}

/// Pages whose responses say nothing of their freshness: the route's layer gives them one.
async fn page(State(state): State<AppState>, what: &'static str) -> Result<String, StatusCode> {
    let text = state.db.query(what).await;
    text.map(|text| text + "\n")
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)
}

/// A hot key cached by the handler: one query per stampede over every process.
async fn product(State(state): State<AppState>, Path(id): Path<u64>) -> Result<String, StatusCode> {
    let db = state.db.clone(); // moved into the loader, which outlives this request
    let product = state
        .products
        .get_or_load(format!("product:{id}"), move || async move {
            let name = db.query("Teapot").await?;
            Ok::<_, std::io::Error>(Product {
                id,
                name,
                price_cents: 2_500,
            })
        })
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok(format!(
        "#{}: {}, {} cents\n",
        product.id, product.name, product.price_cents
    ))
}

/// Probes are of this instance, now: no cache may keep them.
const NO_STORE: [(HeaderName, &str); 1] = [(header::CACHE_CONTROL, "no-store")];

/// Readiness: ready while the app serves. With the store down the cache still answers,
/// protected within this process only; failing readiness then would pull every instance at
/// once and turn a store outage into a full one.
async fn ready() -> ([(HeaderName, &'static str); 1], &'static str) {
    (NO_STORE, "ready\n")
}

/// The store's state (answers, notifications, breaker), for dashboards and alerts, as JSON:
/// `{"healthy":true,"store_answers":true,"last_answer_ago_ms":12,...}`.
async fn cache_health(
    State(state): State<AppState>,
) -> (
    [(HeaderName, &'static str); 1],
    axum::Json<tower_stampede::Health>,
) {
    (NO_STORE, axum::Json(state.cache.health().await))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = match std::env::var("REDIS_URL") {
        Ok(url) => Cache::builder(RedisStore::open(url)?).namespace("axum-example"),
        Err(_) => Cache::builder(MemoryStore::new()),
    }
    .build();
    let state = AppState {
        products: cache.typed::<Product>().schema_version(1),
        cache: cache.clone(),
        db: Db::default(),
    };

    // One layer per route, each with its own policy, over one `Cache` (one L1, one store).
    let cached = |secs| {
        let policy = RfcPolicy::new().default_ttl(Duration::from_secs(secs));
        StampedeLayer::new(cache.clone()).policy(policy)
    };
    let app = Router::new()
        .route(
            "/prices",
            get(|state| page(state, "prices")).layer(cached(5)),
        )
        .route(
            "/about",
            get(|state| page(state, "about us")).layer(cached(3600)),
        )
        .route("/products/{id}", get(product))
        .route("/ready", get(ready))
        .route("/health/cache", get(cache_health))
        .with_state(state);

    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
