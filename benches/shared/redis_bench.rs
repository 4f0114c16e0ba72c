//! What the L2 benches (`l2_hit`, `l2_turns`) start from, included with `#[path]`: a
//! `redis-server` on a free port, a current-thread runtime, the crate's store over that
//! server, and a plain redis crate connection to it for the `GET` to compare with.

use redis::aio::ConnectionManager;
use tower_stampede::store::RedisStore;

use support::RedisServer;

pub struct Bench {
    /// Kept for its `Drop`, which stops the server.
    pub server: RedisServer,
    pub runtime: tokio::runtime::Runtime,
    pub store: RedisStore,
    pub plain: ConnectionManager,
}

pub fn start() -> Bench {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (store, plain) = runtime.block_on(async {
        let store = RedisStore::connect(server.url())
            .await
            .expect("connect the store");
        let plain = server
            .client()
            .get_connection_manager()
            .await
            .expect("a plain connection");
        (store, plain)
    });
    Bench {
        server,
        runtime,
        store,
        plain,
    }
}
