//! The smallest axum service behind the stampede guard.
//!
//! ```sh
//! cargo run --example axum                     # embedded MemoryStore
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example axum
//! curl -i http://127.0.0.1:3000/slow           # x-cache: MISS after 500 ms, then HIT at once
//! ```
//!
//! `LISTEN` sets the address (default `127.0.0.1:3000`).
//!
//! The route's `Cache-Control` decides how long its page is shared (the layer gives every
//! stored response the freshness its policy finds, so the cache's own `ttl` does not apply
//! here). A request with a cookie or `Authorization` gets its own page: `max-age` lets
//! browsers keep it, not a shared cache (`public` would).

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tower_stampede::store::MemoryStore;
use tower_stampede::{Cache, StampedeLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = match std::env::var("REDIS_URL") {
        Ok(url) => Cache::builder(tower_stampede::store::RedisStore::connect(url).await?)
            .namespace("axum-example"),
        Err(_) => Cache::builder(MemoryStore::new()),
    }
    .build();

    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                // A slow page: a database query, a render.
                tokio::time::sleep(Duration::from_millis(500)).await;
                (
                    [("cache-control", "max-age=10")],
                    "rendered once, served to everyone\n",
                )
            }),
        )
        .layer(StampedeLayer::new(cache));

    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
