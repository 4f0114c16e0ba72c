//! A greeter on 127.0.0.1:50051 whose backend takes 200 ms per call, guarded by
//! tower-stampede: over the embedded store, or over Redis when `REDIS_URL` is set (run
//! several, each with its own `ADDR`, to see one backend call per hot request across them).

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Status};
use tower::service_fn;
use tower_stampede::store::{MemoryStore, RedisStore, Store};
use tower_stampede::Cache;
use tower_stampede_grpc::greeter;
use tower_stampede_grpc::proto::{HelloReply, HelloRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store: Arc<dyn Store> = match std::env::var("REDIS_URL") {
        Ok(url) => Arc::new(RedisStore::connect(url).await?),
        Err(_) => Arc::new(MemoryStore::new()),
    };
    let cache = Cache::builder_shared(store).namespace("greeter").build();
    let backend = service_fn(|request: Request<HelloRequest>| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let name = &request.get_ref().name;
        println!("backend call for {name:?}");
        Ok::<_, Status>(HelloReply {
            message: format!("Hello, {name}!"),
        })
    });
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    println!("listening on {addr}");
    tonic::transport::Server::builder()
        .add_service(greeter(cache, Duration::from_secs(30), backend))
        .serve(addr.parse()?)
        .await?;
    Ok(())
}
