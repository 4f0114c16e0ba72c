//! The price of a hit through `CacheLayer` (the generic layer, `tower_stampede::service`)
//! against the inner service called directly, both as tower services driven the same way
//! (`ready().await`, then `call`). The inner service answers at once with a clone of a
//! 100-byte `String`, as cheap as a service gets, so the ratio is the layer's own work at its
//! most visible. They take turns, block by block (the order alternated), and each block's
//! ratio is kept: the median ratio and its quartiles are printed.
//!
//! ```sh
//! cargo bench --bench service_hit              # 200 blocks of 2000 calls
//! cargo bench --bench service_hit -- 50 10000  # 50 blocks of 10 000
//! ```

use std::time::Duration;

use bytes::Bytes;
use tower::{service_fn, BoxError};
use tower_stampede::service::{CacheLayer, ServiceCodec};
use tower_stampede::store::MemoryStore;
use tower_stampede::Cache;

/// Responses as UTF-8.
#[derive(Clone)]
struct Text;

impl ServiceCodec<String, BoxError> for Text {
    fn encode(&self, response: &String) -> Result<Bytes, BoxError> {
        Ok(Bytes::copy_from_slice(response.as_bytes()))
    }

    fn decode(&self, bytes: &[u8]) -> Result<String, BoxError> {
        Ok(std::str::from_utf8(bytes)?.to_owned())
    }
}

#[path = "shared/service_calls.rs"]
mod service_calls;

use service_calls::{blocks_and_calls, timed_calls};

fn main() {
    let (blocks, calls) = blocks_and_calls((200, 2000));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let page = "x".repeat(100);
    let mut inner = service_fn(move |_: u64| {
        let page = page.clone();
        async move { Ok::<_, BoxError>(page) }
    });
    let cache = Cache::builder(MemoryStore::new())
        .ttl(Duration::from_secs(3600))
        .build();
    let layer = CacheLayer::with_codec(cache, |id: &u64| Some(id.to_be_bytes()), Text);
    let mut layered = tower::Layer::layer(&layer, inner.clone());
    let (mut direct_ns, mut layer_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        // Fills L1, and warms both.
        timed_calls(&mut layered, 7, calls).await;
        timed_calls(&mut inner, 7, calls).await;
        for turn in 0..blocks {
            let (direct, through) = if turn % 2 == 0 {
                let direct = timed_calls(&mut inner, 7, calls).await;
                (direct, timed_calls(&mut layered, 7, calls).await)
            } else {
                let through = timed_calls(&mut layered, 7, calls).await;
                (timed_calls(&mut inner, 7, calls).await, through)
            };
            direct_ns.push(direct.as_nanos() as f64 / f64::from(calls));
            layer_ns.push(through.as_nanos() as f64 / f64::from(calls));
            ratios.push(through.as_secs_f64() / direct.as_secs_f64());
        }
    });
    for list in [&mut direct_ns, &mut layer_ns, &mut ratios] {
        list.sort_by(f64::total_cmp);
    }
    let at = |list: &[f64], q: f64| list[((list.len() - 1) as f64 * q).round() as usize];
    println!("{blocks} blocks of {calls} calls each, in turns; per call, median of the blocks");
    println!("inner service directly: {:8.1} ns", at(&direct_ns, 0.5));
    println!("hit through CacheLayer: {:8.1} ns", at(&layer_ns, 0.5));
    println!(
        "ratio layer / direct:   {:8.2} (quartiles {:.2} .. {:.2})",
        at(&ratios, 0.5),
        at(&ratios, 0.25),
        at(&ratios, 0.75)
    );
}
