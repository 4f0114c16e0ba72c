//! The smallest hyper service behind the stampede guard, with no framework.
//!
//! ```sh
//! cargo run --example hyper
//! curl -i http://127.0.0.1:3001/anything       # x-cache: MISS, then HIT
//! ```
//!
//! `LISTEN` sets the address (default `127.0.0.1:3001`).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::{service_fn, ServiceBuilder};
use tower_stampede::http::RfcPolicy;
use tower_stampede::store::MemoryStore;
use tower_stampede::{Cache, StampedeLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::builder(MemoryStore::new()).build();
    // The pages below say nothing about their freshness: keep them for 30 s.
    let policy = RfcPolicy::new().default_ttl(Duration::from_secs(30));
    let service = ServiceBuilder::new()
        .layer(StampedeLayer::new(cache).policy(policy))
        .service(service_fn(
            |request: Request<hyper::body::Incoming>| async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let page = format!("you asked for {}\n", request.uri().path());
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(page))))
            },
        ));

    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3001".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
