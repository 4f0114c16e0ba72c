//! What the benches of blocks in turns share (`service_hit`, `engine_hit`, which include this
//! file with `#[path]`): their command line, and a tower service called again and again the
//! way a caller drives it (`ready().await`, then `call`), timed.

use std::time::{Duration, Instant};

use tower::{Service, ServiceExt};

/// `calls` calls of `service` with `request`, one after the other; how long they took.
pub async fn timed_calls<S, Req>(service: &mut S, request: Req, calls: u32) -> Duration
where
    S: Service<Req>,
    S::Error: std::fmt::Debug,
    Req: Clone,
{
    let started = Instant::now();
    for _ in 0..calls {
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request.clone())
            .await
            .expect("answered");
        std::hint::black_box(response);
    }
    started.elapsed()
}

/// The blocks and calls per block the command line asks for (`-- BLOCKS CALLS`), else
/// `default`.
pub fn blocks_and_calls(default: (u32, u32)) -> (u32, u32) {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    match args[..] {
        [blocks, calls, ..] => (blocks, calls),
        _ => default,
    }
}
