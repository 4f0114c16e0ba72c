//! The L2 hit against a plain `GET`, in turns: `l2_hit` measures each for seconds on end, so a
//! shared machine whose speed drifts between the two moves their ratio by more than the
//! difference it is after. Here they take turns, one call each by default (the order rotated
//! every block), many times over, and the ratio is taken per block: the median of those
//! ratios is the figure, with its quartiles. Blocks of one call keep the drift between the
//! calls compared smallest; on the development machine their quartiles came out three times
//! tighter than those of blocks of 100.
//!
//! Four contestants, over loopback to a `redis-server` this bench starts, for a 2 KiB and a
//! 64 KiB value: a plain `GET` with the redis crate; the engine's lookup as its three plain
//! commands, pipelined with the redis crate (the protocol's floor); the `RedisStore`'s lookup
//! alone (`Store::lookup`: what the store adds to the floor); and the engine's L2 hit
//! (`Cache::fetch`, L1 off: what the engine adds to the store).
//!
//! ```sh
//! cargo bench --bench l2_turns             # 3000 blocks of 1 call each
//! cargo bench --bench l2_turns -- 60 100   # 60 blocks of 100
//! L2_TURNS_ONLY=3 cargo bench --bench l2_turns  # the L2 hit alone (0 GET, 1 pipeline, 2 lookup), to profile
//! L2_TURNS_ONLY=3 L2_TURNS_SIZE=65536 cargo bench --bench l2_turns  # the same, for 64 KiB (default 2048)
//! ```

#[path = "shared/redis_bench.rs"]
mod redis_bench;

use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use tower_stampede::store::{LockState, LockToken, LockWhen};
use tower_stampede::{Cache, Outcome};

fn main() {
    // `cargo bench` passes `--bench`; numbers are ours.
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let blocks = numbers.first().copied().unwrap_or(3000).max(3);
    let calls = numbers.get(1).copied().unwrap_or(1).max(1);
    let redis_bench::Bench {
        server: _server,
        runtime,
        store,
        plain,
    } = redis_bench::start();
    let cache = Cache::builder(store).l1_capacity(0).build();
    // One contestant alone, for a profiler or `strace -c`: no turns, no ratios.
    if let Some(only) = std::env::var("L2_TURNS_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let size = std::env::var("L2_TURNS_SIZE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(2048);
        let value = Bytes::from(vec![b'v'; size]);
        let contest = runtime.block_on(Contest::set_up(&cache, plain, size, value));
        let started = Instant::now();
        runtime.block_on(contest.run(only % CONTESTANTS, blocks * calls));
        let per = per_call(started.elapsed(), blocks * calls);
        println!(
            "contestant {} alone: {per:.1}µs per call",
            only % CONTESTANTS
        );
        return;
    }
    println!("{blocks} blocks of {calls} calls each, in turns; per call, median of the blocks");
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>20} {:>20} {:>20}",
        "value",
        "GET",
        "pipeline",
        "lookup",
        "L2 hit",
        "pipeline/GET (q1-q3)",
        "lookup/GET (q1-q3)",
        "L2 hit/GET (q1-q3)"
    );
    for (label, size) in [("2 KiB", 2048), ("64 KiB", 64 * 1024)] {
        let value = Bytes::from(vec![b'v'; size]);
        let contest = runtime.block_on(Contest::set_up(&cache, plain.clone(), size, value));
        let mut times: [Vec<f64>; CONTESTANTS] = Default::default();
        for block in 0..blocks {
            for turn in 0..CONTESTANTS {
                let who = (block + turn) % CONTESTANTS;
                let started = Instant::now();
                runtime.block_on(contest.run(who, calls));
                times[who].push(per_call(started.elapsed(), calls));
            }
        }
        let spread = |of: usize| {
            let mut r: Vec<f64> = (0..blocks).map(|b| times[of][b] / times[0][b]).collect();
            r.sort_by(f64::total_cmp);
            format!(
                "{:.3} ({:.3}-{:.3})",
                median(&r),
                r[r.len() / 4],
                r[r.len() * 3 / 4]
            )
        };
        let medians = times.clone().map(|mut t| {
            t.sort_by(f64::total_cmp);
            median(&t)
        });
        println!(
            "{:<8} {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>20} {:>20} {:>20}",
            label,
            medians[0],
            medians[1],
            medians[2],
            medians[3],
            spread(1),
            spread(2),
            spread(3)
        );
    }
}

/// How many contestants there are: the plain `GET`, the pipeline, the store's lookup, the L2
/// hit.
const CONTESTANTS: usize = 4;

/// The contestants for one value size.
struct Contest<'a> {
    cache: &'a Cache,
    plain: ConnectionManager,
    key: String,
    plain_key: String,
    lock_key: String,
}

impl<'a> Contest<'a> {
    async fn set_up(
        cache: &'a Cache,
        mut plain: ConnectionManager,
        size: usize,
        value: Bytes,
    ) -> Self {
        let contest = Contest {
            cache,
            key: format!("turns-page-{size}"),
            plain_key: format!("turns-plain-page-{size}"),
            lock_key: format!("turns-plain-lock-{size}"),
            plain: plain.clone(),
        };
        let loaded = value.clone();
        cache
            .get_or_load(&contest.key, move || async move {
                Ok::<_, std::io::Error>(loaded)
            })
            .await
            .expect("the first load");
        let fetched = cache
            .fetch(&contest.key, not_called)
            .await
            .expect("an L2 hit");
        assert_eq!(fetched.outcome(), Outcome::L2Hit);
        assert_eq!(fetched.value(), Some(&value));
        let _: () = plain
            .set(&contest.plain_key, value.as_ref())
            .await
            .expect("SET the plain value");
        // A `fresh` marker refuses the `SET … NX GET`, as a fresh value's marker does.
        let _: () = plain
            .pset_ex(&contest.lock_key, "fresh", 3_600_000)
            .await
            .expect("SET the plain marker");
        contest
    }

    /// `calls` calls of contestant `who`: 0 the plain `GET`, 1 the pipeline, 2 the store's
    /// lookup (`Store::lookup`, without the engine), 3 the L2 hit.
    async fn run(&self, who: usize, calls: usize) {
        for _ in 0..calls {
            let length = match who {
                0 => {
                    let bytes: Vec<u8> =
                        self.plain.clone().get(&self.plain_key).await.expect("GET");
                    bytes.len()
                }
                1 => {
                    type Reply = (Option<Vec<u8>>, Option<Vec<u8>>, i64);
                    let (held, bytes, _pttl): Reply = redis::pipe()
                        .cmd("SET")
                        .arg(&self.lock_key)
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(5000)
                        .arg("GET")
                        .cmd("GET")
                        .arg(&self.plain_key)
                        .cmd("PTTL")
                        .arg(&self.plain_key)
                        .query_async(&mut self.plain.clone())
                        .await
                        .expect("the pipeline");
                    assert!(held.is_some(), "the marker refuses the lock");
                    bytes.map_or(0, |b| b.len())
                }
                2 => {
                    let key = self.cache.store_key(&self.key);
                    let found = self
                        .cache
                        .store()
                        .lookup(
                            &key,
                            LockToken::random(),
                            Duration::from_secs(5),
                            LockWhen::LifeAtMost(Duration::ZERO),
                        )
                        .await
                        .expect("the store's lookup");
                    assert_eq!(found.lock, LockState::NotRequested);
                    found.value.map_or(0, |v| v.bytes.len())
                }
                _ => {
                    let fetched = self
                        .cache
                        .fetch(&self.key, not_called)
                        .await
                        .expect("an L2 hit");
                    assert_eq!(fetched.outcome(), Outcome::L2Hit);
                    fetched.value().map_or(0, Bytes::len)
                }
            };
            std::hint::black_box(length);
        }
    }
}

fn per_call(elapsed: Duration, calls: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / calls as f64
}

/// The median of sorted numbers.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

async fn not_called() -> Result<tower_stampede::Loaded, std::io::Error> {
    Err(std::io::Error::other("not called"))
}
