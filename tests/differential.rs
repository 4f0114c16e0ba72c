//! The differential test of the store contract (issue 16): random sequences of store calls
//! (lookup, a batch's lookup, fill, release, extend, fail, put, get, invalidate, set, expire,
//! tag calls, the answer for a load's waiters and its read), time
//! advances, evictions and a full server, run against the embedded `MemoryStore` and a real
//! `redis-server`, with their answers compared call by call. `MemoryStore` claims Redis's
//! semantics; here is where the claim is checked.
//!
//! Time, exactly: `MemoryStore` runs on paused tokio time (a runtime of its own), Redis on
//! real time. Every duration is a whole number of units of 10 s, far longer than a case runs,
//! so nothing expires by itself within a case on either side, and every decision (fresh or
//! stale, live or expired) is the same on both: the drift of Redis's real clock during a case
//! (milliseconds) only ever lowers its remaining lives, never across a unit. A time advance is
//! `tokio::time::advance` for memory and, for Redis, one script that shortens the PTTL of the
//! case's every key by the same amount (deleting what it ends). Remaining lives are compared
//! with the drift allowed: Redis's may be lower than memory's by less than half a unit.
//!
//! Evictions: a value dropped (`MemoryStore::evict`, `DEL` on Redis), and a `fresh` marker
//! dropped on Redis (memory has no marker: nothing to drop there). A full server: `CONFIG SET
//! maxmemory 1` under `noeviction`. `MemoryStore` has no such state (it evicts instead), so
//! while the server is full a call goes to memory only if Redis accepted it, and a call Redis
//! refused must be one that writes (a lookup only where it would take the lock); a refused
//! call must have changed nothing, which the calls after the server has room again check.
//!
//! Left out: a lock or failure marker evicted by itself (the same, for its owner, as its
//! expiry, which the advances cover); values without expiry (foreign writes); sub-unit
//! timing (a lock renewed a millisecond before it expires); notifications (tested elsewhere).
#![cfg(feature = "redis")]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::RedisServer;
use tokio::runtime::Runtime;
use tower_stampede::store::StoreExt;
use tower_stampede::store::{
    KeyDigest, LockToken, LockWhen, MemoryStore, RedisStore, Store, StoreError, StoreKey,
};

/// The unit of every duration.
const UNIT: Duration = Duration::from_secs(10);
const KEYS: usize = 2;
const TOKENS: usize = 3;
const TAGS: usize = 2;

/// An engine entry (header version 2) whose load started `start` ms after 1970.
fn entry(start: u64, payload: &str) -> Bytes {
    let mut bytes = b"TS\x02\x00\x00\x00\x00\x00".to_vec();
    bytes.extend_from_slice(&start.to_be_bytes());
    bytes.extend_from_slice(payload.as_bytes());
    Bytes::from(bytes)
}

/// The values a case writes: entries with three load starts, a version 1 entry (no load
/// start) and foreign bytes.
fn value(index: u8) -> Bytes {
    match index {
        0 => entry(10, "ten"),
        1 => entry(20, "twenty"),
        2 => entry(30, "thirty"),
        3 => Bytes::from_static(b"TS\x01\x00\x00\x00\x00\x00v1"),
        _ => Bytes::from_static(b"foreign"),
    }
}

fn units(n: u8) -> Duration {
    UNIT * u32::from(n)
}

#[derive(Clone, Copy, Debug)]
enum When {
    LifeAtMost(u8),
    Always,
    Early { life: u8, fresh_above: u8 },
}

impl When {
    fn lock_when(self) -> LockWhen {
        match self {
            When::LifeAtMost(n) => LockWhen::LifeAtMost(units(n)),
            When::Always => LockWhen::Always,
            When::Early { life, fresh_above } => LockWhen::Early {
                life: units(life),
                fresh_above: units(fresh_above),
            },
        }
    }

    /// The remaining life above which a lookup asks for no lock.
    fn bound(self) -> Option<Duration> {
        match self {
            When::LifeAtMost(n) | When::Early { life: n, .. } => Some(units(n)),
            When::Always => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Lookup {
        key: usize,
        token: usize,
        when: When,
        lock_ttl: u8,
    },
    /// A lookup of every key of the case at once (`Store::lookup_many`), in order or the
    /// other way round.
    LookupMany {
        reversed: bool,
        token: usize,
        when: When,
        lock_ttl: u8,
    },
    Fill {
        key: usize,
        token: usize,
        value: u8,
        ttl: u8,
    },
    Release {
        key: usize,
        token: usize,
    },
    Extend {
        key: usize,
        token: usize,
        lock_ttl: u8,
    },
    Fail {
        key: usize,
        token: usize,
        ttl: u8,
    },
    Put {
        key: usize,
        value: u8,
        ttl: u8,
    },
    Get {
        key: usize,
    },
    AnswerWaiters {
        key: usize,
        token: usize,
        value: u8,
        ttl: u8,
    },
    WaitersAnswer {
        key: usize,
    },
    Invalidate {
        key: usize,
    },
    Set {
        key: usize,
        value: u8,
        fresh_for: u8,
        ttl: u8,
    },
    Expire {
        key: usize,
        keep: u8,
    },
    TagClock,
    TagVersions,
    InvalidateTag {
        tag: usize,
    },
    /// Time passes, for every key.
    Advance {
        by: u8,
    },
    /// The value is evicted, its lock (or marker) stays.
    EvictValue {
        key: usize,
    },
    /// Redis loses the `fresh` marker of the key, if it holds one (memory has none).
    DropMarker {
        key: usize,
    },
    /// The server is full (`maxmemory 1`, `noeviction`), or has room again.
    Full(bool),
}

impl Op {
    /// Whether the call may be refused by a full server: it writes, or may.
    fn may_write(self) -> bool {
        !matches!(
            self,
            Op::Get { .. } | Op::WaitersAnswer { .. } | Op::TagClock | Op::TagVersions
        )
    }
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let token = 0..TOKENS;
    let when = prop_oneof![
        (0..6u8).prop_map(When::LifeAtMost),
        Just(When::Always),
        (0..6u8, 0..6u8).prop_map(|(a, b)| When::Early {
            life: a.max(b),
            fresh_above: a.min(b),
        }),
    ];
    prop_oneof![
        6 => (key.clone(), token.clone(), when.clone(), 1..4u8)
            .prop_map(|(key, token, when, lock_ttl)| Op::Lookup { key, token, when, lock_ttl }),
        4 => (key.clone(), token.clone(), 0..5u8, 1..7u8)
            .prop_map(|(key, token, value, ttl)| Op::Fill { key, token, value, ttl }),
        2 => (any::<bool>(), token.clone(), when, 1..4u8).prop_map(|(reversed, token, when, lock_ttl)| {
            Op::LookupMany { reversed, token, when, lock_ttl }
        }),
        2 => (key.clone(), token.clone()).prop_map(|(key, token)| Op::Release { key, token }),
        1 => (key.clone(), token.clone(), 1..4u8)
            .prop_map(|(key, token, lock_ttl)| Op::Extend { key, token, lock_ttl }),
        1 => (key.clone(), token.clone(), 1..3u8)
            .prop_map(|(key, token, ttl)| Op::Fail { key, token, ttl }),
        2 => (key.clone(), 0..5u8, 1..7u8).prop_map(|(key, value, ttl)| Op::Put { key, value, ttl }),
        2 => key.clone().prop_map(|key| Op::Get { key }),
        2 => (key.clone(), token.clone(), 0..5u8, 1..7u8)
            .prop_map(|(key, token, value, ttl)| Op::AnswerWaiters { key, token, value, ttl }),
        1 => key.clone().prop_map(|key| Op::WaitersAnswer { key }),
        1 => key.clone().prop_map(|key| Op::Invalidate { key }),
        1 => (key.clone(), 0..5u8, 0..7u8, 1..7u8).prop_map(|(key, value, fresh_for, ttl)| {
            Op::Set { key, value, fresh_for, ttl }
        }),
        1 => (key.clone(), 0..3u8).prop_map(|(key, keep)| Op::Expire { key, keep }),
        1 => Just(Op::TagClock),
        1 => Just(Op::TagVersions),
        1 => (0..TAGS).prop_map(|tag| Op::InvalidateTag { tag }),
        3 => (1..4u8).prop_map(|by| Op::Advance { by }),
        1 => key.clone().prop_map(|key| Op::EvictValue { key }),
        1 => key.clone().prop_map(|key| Op::DropMarker { key }),
        1 => any::<bool>().prop_map(Op::Full),
    ]
}

/// An answer of either store, to compare.
#[derive(Debug)]
enum Answer {
    Lookup(tower_stampede::store::Lookup),
    Lookups(Vec<tower_stampede::store::Lookup>),
    Done(bool),
    Value(Option<tower_stampede::store::Stored>),
    Unit,
    Clock(u64),
    Versions(Option<Vec<u64>>),
}

/// Shortens the PTTL of each key in `KEYS` by `ARGV[1]` ms, deleting the keys it ends.
const ADVANCE: &str = r"
for _, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left > 0 then
    if left <= tonumber(ARGV[1]) then
      redis.call('DEL', key)
    else
      redis.call('PEXPIRE', key, left - tonumber(ARGV[1]))
    end
  end
end
return 1
";

/// The two stores of the test and the runtimes they run on.
struct Stores {
    /// Real time, for Redis.
    redis_rt: Runtime,
    /// Paused time, for memory.
    memory_rt: Runtime,
    server: RedisServer,
    redis: RedisStore,
    connection: redis::aio::MultiplexedConnection,
    cases: AtomicUsize,
}

/// One case's keys and tokens, in a namespace of its own.
struct Case {
    namespace: String,
    keys: Vec<StoreKey>,
    tokens: Vec<LockToken>,
    tags: Vec<KeyDigest>,
    memory: MemoryStore,
    full: bool,
}

impl Stores {
    fn new() -> Self {
        let redis_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let memory_rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let server = RedisServer::start();
        let (redis, connection) = redis_rt.block_on(async {
            // No store timeout here: the engine's bound is not under test.
            let store = RedisStore::builder(server.url())
                .notifications(false)
                .connect()
                .await
                .unwrap();
            let connection = server
                .client()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            (store, connection)
        });
        Stores {
            redis_rt,
            memory_rt,
            server,
            redis,
            connection,
            cases: AtomicUsize::new(0),
        }
    }

    fn case(&self) -> Case {
        let n = self.cases.fetch_add(1, Ordering::Relaxed);
        let namespace = format!("diff{n}");
        let ns: Arc<str> = Arc::from(namespace.as_str());
        Case {
            keys: (0..KEYS)
                .map(|i| StoreKey::new(Arc::clone(&ns), KeyDigest::of(format!("k{i}").as_bytes())))
                .collect(),
            tokens: (0..TOKENS).map(|_| LockToken::random()).collect(),
            tags: (0..TAGS)
                .map(|i| KeyDigest::of(format!("t{i}").as_bytes()))
                .collect(),
            namespace,
            memory: MemoryStore::new(),
            full: false,
        }
    }

    fn redis_command(&self, command: redis::Cmd) -> redis::RedisResult<redis::Value> {
        let mut connection = self.connection.clone();
        self.redis_rt
            .block_on(async move { command.query_async(&mut connection).await })
    }

    fn set_full(&self, full: bool) {
        let mut command = redis::cmd("CONFIG");
        command
            .arg("SET")
            .arg("maxmemory")
            .arg(if full { "1" } else { "0" });
        self.redis_command(command).unwrap();
    }

    /// Runs `op` on one store; `None` for the ops that are not store calls.
    async fn call(store: &dyn Store, case: &Case, op: Op) -> Option<Result<Answer, StoreError>> {
        let key = |i: usize| &case.keys[i];
        let token = |i: usize| case.tokens[i];
        Some(match op {
            Op::Lookup {
                key: k,
                token: t,
                when,
                lock_ttl,
            } => store
                .lookup(key(k), token(t), units(lock_ttl), when.lock_when())
                .await
                .map(Answer::Lookup),
            Op::LookupMany {
                reversed,
                token: t,
                when,
                lock_ttl,
            } => {
                let mut keys = case.keys.clone();
                if reversed {
                    keys.reverse();
                }
                store
                    .lookup_many(&keys, token(t), units(lock_ttl), when.lock_when())
                    .await
                    .map(Answer::Lookups)
            }
            Op::Fill {
                key: k,
                token: t,
                value: v,
                ttl,
            } => store
                .fill(key(k), token(t), value(v), units(ttl))
                .await
                .map(Answer::Done),
            Op::Release { key: k, token: t } => {
                store.release(key(k), token(t)).await.map(Answer::Done)
            }
            Op::Extend {
                key: k,
                token: t,
                lock_ttl,
            } => store
                .extend(&[(key(k).clone(), token(t))], units(lock_ttl))
                .await
                .map(|renewed| Answer::Done(renewed == [true])),
            Op::Fail {
                key: k,
                token: t,
                ttl,
            } => store
                .fail(key(k), token(t), units(ttl))
                .await
                .map(Answer::Done),
            Op::Put {
                key: k,
                value: v,
                ttl,
            } => store
                .put(key(k), value(v), units(ttl))
                .await
                .map(Answer::Done),
            Op::Get { key: k } => store.get(key(k)).await.map(Answer::Value),
            Op::AnswerWaiters {
                key: k,
                token: t,
                value: v,
                ttl,
            } => store
                .answer_waiters(key(k), token(t), value(v), units(ttl))
                .await
                .map(Answer::Done),
            Op::WaitersAnswer { key: k } => store.waiters_answer(key(k)).await.map(Answer::Value),
            Op::Invalidate { key: k } => store.invalidate(key(k)).await.map(|()| Answer::Unit),
            Op::Set {
                key: k,
                value: v,
                fresh_for,
                ttl,
            } => store
                .set(key(k), value(v), units(fresh_for), units(ttl))
                .await
                .map(|()| Answer::Unit),
            Op::Expire { key: k, keep } => store
                .expire(key(k), units(keep))
                .await
                .map(|()| Answer::Unit),
            // Generations are random: each store's own, compared by what they make of values.
            Op::TagClock => store
                .tag_clock(&case.namespace)
                .await
                .map(|clock| Answer::Clock(clock.clock)),
            Op::TagVersions => store
                .tag_versions(&case.namespace, &case.tags)
                .await
                .map(|versions| Answer::Versions(versions.map(|v| v.versions))),
            Op::InvalidateTag { tag } => store
                .invalidate_tags(&case.namespace, &case.tags[tag..=tag])
                .await
                .map(|()| Answer::Unit),
            Op::Advance { .. } | Op::EvictValue { .. } | Op::DropMarker { .. } | Op::Full(_) => {
                return None
            }
        })
    }

    /// The ops that are no store call: on both sides, each its own way.
    fn act(&self, case: &mut Case, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Advance { by } => {
                let by = units(by);
                self.memory_rt.block_on(tokio::time::advance(by));
                let mut script = redis::cmd("EVAL");
                script.arg(ADVANCE).arg(3 * KEYS);
                for key in &case.keys {
                    script
                        .arg(RedisStore::value_name(key))
                        .arg(RedisStore::lock_name(key))
                        .arg(RedisStore::waiters_name(key));
                }
                script.arg(by.as_millis() as u64);
                self.redis_command(script).unwrap();
            }
            Op::EvictValue { key } => {
                let key = &case.keys[key];
                let mut del = redis::cmd("DEL");
                del.arg(RedisStore::value_name(key));
                let deleted = self.redis_command(del).unwrap();
                let evicted = self.memory_rt.block_on(async { case.memory.evict(key) });
                prop_assert_eq!(deleted == redis::Value::Int(1), evicted, "evicted a value");
            }
            Op::DropMarker { key } => {
                let lock = RedisStore::lock_name(&case.keys[key]);
                let script = "if redis.call('GET', KEYS[1]) == 'fresh' then redis.call('DEL', KEYS[1]) end return 1";
                let mut eval = redis::cmd("EVAL");
                eval.arg(script).arg(1).arg(lock);
                self.redis_command(eval).unwrap();
            }
            Op::Full(full) => {
                self.set_full(full);
                case.full = full;
            }
            _ => unreachable!("a store call"),
        }
        Ok(())
    }

    /// A read of memory, on its paused clock: `MemoryStore` reads the clock when called, so
    /// it must be called within the runtime.
    fn memory_get(
        &self,
        case: &Case,
        key: usize,
    ) -> Result<Option<tower_stampede::store::Stored>, StoreError> {
        self.memory_rt
            .block_on(async { case.memory.get(&case.keys[key]).await })
    }

    fn run(&self, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut case = self.case();
        let result = self.run_case(&mut case, ops);
        if case.full {
            self.set_full(false);
        }
        result
    }

    fn run_case(&self, case: &mut Case, ops: &[Op]) -> Result<(), TestCaseError> {
        for (step, &op) in ops.iter().enumerate() {
            let Some(redis) = self.redis_rt.block_on(Self::call(&self.redis, case, op)) else {
                self.act(case, op)?;
                continue;
            };
            let at = Step { step, op, ops };
            let redis = match redis {
                Ok(answer) => answer,
                Err(error) if case.full && op.may_write() => {
                    // Refused by the full server: it must be a call that would write, and
                    // it must have changed nothing (memory does not make it).
                    if let Op::Lookup { key, when, .. } = op {
                        let memory = self.memory_get(case, key);
                        let fresh = memory.unwrap().and_then(|v| v.ttl).zip(when.bound());
                        prop_assert!(
                            fresh.is_none_or(|(ttl, bound)| ttl <= bound),
                            "{at}: a fresh hit refused by a full server: {error}"
                        );
                    }
                    continue;
                }
                Err(error) => return Err(TestCaseError::fail(format!("{at}: redis: {error}"))),
            };
            let memory = self
                .memory_rt
                .block_on(Self::call(&case.memory, case, op))
                .expect("a store call")
                .map_err(|error| TestCaseError::fail(format!("{at}: memory: {error}")))?;
            compare(&at, &memory, &redis)?;
        }
        // Whatever the case did, both end with the same values.
        for key in 0..KEYS {
            let at = Step {
                step: ops.len(),
                op: Op::Get { key },
                ops,
            };
            let redis = self.redis_rt.block_on(self.redis.get(&case.keys[key]));
            let memory = self.memory_get(case, key);
            let (Ok(redis), Ok(memory)) = (redis, memory) else {
                return Err(TestCaseError::fail(format!("{at}: a final read failed")));
            };
            compare(&at, &Answer::Value(memory), &Answer::Value(redis))?;
            let redis = self
                .redis_rt
                .block_on(self.redis.waiters_answer(&case.keys[key]));
            let memory = self
                .memory_rt
                .block_on(async { case.memory.waiters_answer(&case.keys[key]).await });
            let (Ok(redis), Ok(memory)) = (redis, memory) else {
                return Err(TestCaseError::fail(format!("{at}: a final read failed")));
            };
            compare(&at, &Answer::Value(memory), &Answer::Value(redis))?;
        }
        Ok(())
    }
}

/// Where a case is, for messages.
struct Step<'a> {
    step: usize,
    op: Op,
    ops: &'a [Op],
}

impl fmt::Display for Step<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} ({:?}) of {:?}", self.step, self.op, self.ops)
    }
}

/// Remaining lives agree if Redis's is lower than memory's by less than half a unit (the
/// drift of its real clock during the case).
fn same_life(memory: Option<Duration>, redis: Option<Duration>) -> bool {
    match (memory, redis) {
        (Some(memory), Some(redis)) => redis <= memory && memory - redis < UNIT / 2,
        (memory, redis) => memory == redis,
    }
}

fn same_value(
    memory: &Option<tower_stampede::store::Stored>,
    redis: &Option<tower_stampede::store::Stored>,
) -> bool {
    match (memory, redis) {
        (Some(memory), Some(redis)) => {
            memory.bytes == redis.bytes && same_life(memory.ttl, redis.ttl)
        }
        (None, None) => true,
        _ => false,
    }
}

fn compare(at: &Step<'_>, memory: &Answer, redis: &Answer) -> Result<(), TestCaseError> {
    let same = match (memory, redis) {
        (Answer::Lookup(memory), Answer::Lookup(redis)) => {
            memory.lock == redis.lock && same_value(&memory.value, &redis.value)
        }
        (Answer::Lookups(memory), Answer::Lookups(redis)) => {
            memory.len() == redis.len()
                && memory.iter().zip(redis).all(|(memory, redis)| {
                    memory.lock == redis.lock && same_value(&memory.value, &redis.value)
                })
        }
        (Answer::Value(memory), Answer::Value(redis)) => same_value(memory, redis),
        (Answer::Done(memory), Answer::Done(redis)) => memory == redis,
        (Answer::Unit, Answer::Unit) => true,
        (Answer::Clock(memory), Answer::Clock(redis)) => memory == redis,
        (Answer::Versions(memory), Answer::Versions(redis)) => memory == redis,
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!(
            "{at}:\n  memory answered {memory:?}\n  redis answered  {redis:?}"
        )))
    }
}

/// Random call sequences, the same answers from `MemoryStore` and a real `redis-server`.
/// `PROPTEST_CASES` changes the number of cases (default 256, a few seconds; 3000 ran clean
/// in a minute).
#[test]
fn memory_store_and_redis_answer_alike() {
    let stores = Stores::new();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| stores.run(&ops));
    drop(stores.server);
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// The divergences the random sequences found, each kept as a case of its own.
#[test]
fn found_divergences_stay_fixed() {
    use Op::Lookup;
    let stores = Stores::new();
    let again = |when| {
        let lookup = Lookup {
            key: 0,
            token: 0,
            when,
            lock_ttl: 1,
        };
        vec![lookup, lookup]
    };
    let cases: Vec<(&str, Vec<Op>)> = vec![
        // A lock under the caller's own token: `MemoryStore` answered `HeldElsewhere` where
        // the Redis script answered `Acquired` (and Redis's pipelined lookup `HeldElsewhere`).
        // It is the caller's: `Acquired`, its TTL renewed, on every path.
        ("own lock, by the script", again(When::Always)),
        ("own lock, pipelined", again(When::LifeAtMost(0))),
        (
            "own lock, another bound",
            vec![
                Lookup {
                    key: 0,
                    token: 0,
                    when: When::LifeAtMost(1),
                    lock_ttl: 1,
                },
                Lookup {
                    key: 0,
                    token: 0,
                    when: When::Early {
                        life: 2,
                        fresh_above: 0,
                    },
                    lock_ttl: 3,
                },
                // The lock's TTL was renewed: 2 units later it still stands.
                Op::Advance { by: 2 },
                Lookup {
                    key: 0,
                    token: 1,
                    when: When::LifeAtMost(0),
                    lock_ttl: 1,
                },
                Op::Fill {
                    key: 0,
                    token: 0,
                    value: 0,
                    ttl: 2,
                },
            ],
        ),
    ];
    for (name, ops) in cases {
        if let Err(error) = stores.run(&ops) {
            panic!("{name}: {error}");
        }
    }
}
