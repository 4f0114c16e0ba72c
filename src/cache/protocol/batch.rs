//! A batch of keys: L1 first; then the lookups of every key L1 missed in one store round trip
//! ([`Store::lookup_many`](crate::store::Store::lookup_many)), which takes the locks of the
//! stale and absent keys in the same trip; one load for the keys this call leads, and a fenced
//! fill for each. A key another caller or process leads (or that holds what only a flight
//! knows how to answer: a failure marker, a pass, a waiters' answer) is fetched as any single
//! key is, so it is waited for through the same notifications, never loaded twice. The keys it
//! leads honour the stale windows (`batch_stale.rs`); without the store, see `batch_outage.rs`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::leader::Leader;
use super::load::tagged;
use super::lock::{spawn_release, LockGuard, PendingLocks};
use super::lookup::LookupFound;
use super::stale::StaleValue;
use crate::cache::config::Life;
use crate::cache::engine::Cache;
use crate::cache::error::{BoxError, Error, ErrorKind};
use crate::cache::fetched::Gives;
use crate::cache::flight::{BoxLoader, Reader};
use crate::cache::l1::L1Hit;
use crate::cache::loaded::{Loaded, Previous};
use crate::cache::parts::Parts;
use crate::store::{BoxFuture, KeyDigest, LockState, LockToken, LockWhen, Lookup, Stamp, StoreKey};

/// A batch's loader, its own type erased: handed the keys to load, it answers their values.
pub(in crate::cache) type BatchLoad<K> =
    Arc<dyn Fn(Vec<K>) -> BoxFuture<'static, Result<HashMap<K, Bytes>, BoxError>> + Send + Sync>;

/// Which stored payloads a batch's caller can read.
pub(in crate::cache) type Accepts = Arc<dyn Fn(&Bytes) -> bool + Send + Sync>;

/// Each key's answer.
pub(in crate::cache) type Answers<K> = HashMap<K, Result<Bytes, Error>>;

/// Some keys' answers, as a task of the batch gives them.
pub(super) type Answered<K> = Vec<(K, Result<Bytes, Error>)>;

/// The bounds of a batch's key.
pub(in crate::cache) trait BatchKey:
    AsRef<[u8]> + Eq + Hash + Clone + Send + Sync + 'static
{
}

impl<K: AsRef<[u8]> + Eq + Hash + Clone + Send + Sync + 'static> BatchKey for K {}

/// A key whose lock the batch's lookup took: this call loads it.
pub(super) struct Led<K> {
    pub(super) key: K,
    pub(super) guard: LockGuard,
    /// What this process had heard of the key before the lookup.
    pub(super) stamp: Option<Stamp>,
    /// The value the lookup found past its freshness, for the stale windows.
    pub(super) stale: Option<StaleValue>,
}

/// One batch call: the parts it drives, the engine its followed keys are fetched from (each
/// joins or starts a flight as one call would), its loader, and what its caller can read.
/// Cheap to clone (for the task that loads the keys it leads).
pub(in crate::cache) struct Batch<K> {
    pub(super) parts: Arc<Parts>,
    cache: Cache,
    pub(super) load: BatchLoad<K>,
    accepts: Accepts,
}

impl<K> Clone for Batch<K> {
    fn clone(&self) -> Self {
        Batch {
            parts: Arc::clone(&self.parts),
            cache: self.cache.clone(),
            load: Arc::clone(&self.load),
            accepts: Arc::clone(&self.accepts),
        }
    }
}

/// What a batch's lookup sorted the keys L1 missed into.
struct Sorted<K> {
    /// Those whose lock it took: this call loads them.
    led: Vec<Led<K>>,
    /// Those another caller or process leads, or that only a flight knows how to answer.
    followed: Vec<(K, KeyDigest)>,
    /// All of them, when the lookup was not sent (the breaker open): loaded here, alone.
    alone: Vec<(K, KeyDigest)>,
}

impl<K> Sorted<K> {
    /// Keys the lookup could not sort: `followed`, each its own way (the lookup failed), or
    /// `alone`, loaded here (it was not sent).
    fn apart(followed: Vec<(K, KeyDigest)>, alone: Vec<(K, KeyDigest)>) -> Self {
        Sorted {
            led: Vec::new(),
            followed,
            alone,
        }
    }
}

/// Why a batch's lookup gave no answers.
enum Unanswered {
    /// The breaker is open: nothing was asked.
    NotSent,
    /// The store failed, or answered for too few keys.
    Failed,
}

impl<K: BatchKey> Batch<K> {
    /// A batch over `parts`, its followed keys fetched from `cache`, loading with `load`, its
    /// caller reading what `accepts` says yes to.
    pub(in crate::cache) fn new(
        parts: Arc<Parts>,
        cache: Cache,
        load: BatchLoad<K>,
        accepts: Accepts,
    ) -> Self {
        Batch {
            parts,
            cache,
            load,
            accepts,
        }
    }

    /// Every key's answer; see the [module docs](self).
    pub(in crate::cache) async fn resolve(&self, keys: Vec<K>) -> Answers<K> {
        let mut answers = HashMap::with_capacity(keys.len());
        let mut missed: Vec<(K, KeyDigest)> = Vec::new();
        let mut asked = std::collections::HashSet::with_capacity(keys.len());
        for key in keys {
            if !asked.insert(key.clone()) {
                continue;
            }
            let digest = KeyDigest::of(key.as_ref());
            match self.parts.l1_get(&digest) {
                // A hit due for an early refresh is answered too: a batch refreshes nothing early.
                Some(L1Hit::Fresh(entry, _) | L1Hit::RefreshDue(entry)) => {
                    answers.insert(key, Ok(entry.value.clone()));
                }
                None => missed.push((key, digest)),
            }
        }
        let Some((_, first)) = missed.first() else {
            return answers;
        };
        let namespace = &self.parts.namespace;
        // Subscribed before the reads, so that what they find may enter L1.
        drop(
            self.parts
                .lookups()
                .watch_fills_subscribed(&StoreKey::new(Arc::clone(namespace), *first))
                .await,
        );
        let Sorted {
            led,
            followed,
            alone,
        } = self.look_up(missed, &mut answers).await;
        if !alone.is_empty() {
            answers.extend(self.load_many_alone(alone).await);
        }
        let mut lead = None;
        if !led.is_empty() {
            let waiting = self.answer_stale(&led, &mut answers);
            // A task of its own: it loads and fills to the end even if this call goes away.
            let batch = self.clone();
            let run = tokio::spawn(async move { batch.lead(led).await });
            lead = Some((run, waiting));
        }
        let mut runs: Vec<JoinHandle<Answered<K>>> = Vec::new();
        for (key, digest) in followed {
            let (loader, accepts) = (single(&self.load, key.clone()), Arc::clone(&self.accepts));
            let (cache, soft_timeout) = (self.cache.clone(), self.parts.loads.soft_timeout);
            runs.push(tokio::spawn(async move {
                let accepts = move |bytes: &Bytes| accepts(bytes);
                let (fetched, _) = cache
                    .fetch_digest(digest, soft_timeout, accepts, loader)
                    .await;
                vec![(key, fetched.and_then(|fetched| fetched.value_or_pass()))]
            }));
        }
        if let Some((run, waiting)) = lead {
            self.await_lead(run, waiting, &mut answers).await;
        }
        for run in runs {
            // A task that panicked answers nothing: its keys are told below.
            if let Ok(ran) = run.await {
                answers.extend(ran);
            }
        }
        for key in asked {
            answers
                .entry(key)
                .or_insert_with(|| Err(Error::new(ErrorKind::LoadPanicked)));
        }
        answers
    }

    /// One round trip for the keys L1 missed: answers those the store has fresh, and sorts the
    /// others into those whose lock this call took (it leads them) and those it follows, or
    /// all of them to be loaded alone if the breaker kept the lookup from being sent.
    async fn look_up(&self, missed: Vec<(K, KeyDigest)>, answers: &mut Answers<K>) -> Sorted<K> {
        let namespace = &self.parts.namespace;
        let store_keys: Vec<StoreKey> = missed
            .iter()
            .map(|(_, digest)| StoreKey::new(Arc::clone(namespace), *digest))
            .collect();
        // Taken before the read, so that a change heard after it keeps the value out of L1.
        let stamps: Vec<Option<Stamp>> =
            missed.iter().map(|(_, d)| self.parts.l1.stamp(d)).collect();
        let (token, read_at) = (LockToken::random(), Instant::now());
        // Until each key is handed on: a caller that goes away meanwhile (or a lookup that
        // failed, which may still have taken them) releases the locks.
        let mut pending = PendingLocks::new(&self.parts.store, store_keys.clone(), token);
        let lookups = match self.lookup_many(&store_keys, token, read_at).await {
            Ok(lookups) => lookups,
            Err(Unanswered::NotSent) => {
                pending.never_sent();
                return Sorted::apart(Vec::new(), missed);
            }
            Err(Unanswered::Failed) => return Sorted::apart(missed, Vec::new()),
        };
        let reader = Reader::of(&*self.accepts);
        let (mut led, mut followed) = (Vec::new(), Vec::new());
        let keep = self.parts.lives.keep();
        let found = missed.into_iter().zip(lookups.into_iter().zip(stamps));
        for (index, ((key, digest), (lookup, stamp))) in found.enumerate() {
            let lock = lookup.lock;
            let mut found = self.parts.lookups().found(lookup, reader).await;
            let Some(store_key) = pending.take(index) else {
                continue;
            };
            if let Some(fresh) = found.as_mut().ok().and_then(LookupFound::take_fresh) {
                let loader = single_boxed(&self.load, &self.accepts, key.clone());
                let fetched = fresh.answer(&self.parts, digest, stamp, read_at, loader, false);
                answers.insert(key, fetched.value_or_pass());
                continue;
            }
            match (found, lock) {
                (Ok(found), LockState::Acquired) => led.push(Led {
                    key,
                    guard: LockGuard::new(&self.parts.store, store_key, token, read_at),
                    stamp,
                    stale: StaleValue::of(&found, keep),
                }),
                (_, lock) => {
                    if lock == LockState::Acquired {
                        // The tags could not be checked: the key goes its own way.
                        spawn_release(&self.parts.store, &store_key, token);
                    }
                    followed.push((key, digest));
                }
            }
        }
        let alone = Vec::new();
        Sorted {
            led,
            followed,
            alone,
        }
    }

    /// The batch's one store lookup of `keys` (taking their locks where a load is due), asked
    /// only once the breaker lets it through; an answer for each key, or why there is none.
    async fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        read_at: Instant,
    ) -> Result<Vec<Lookup>, Unanswered> {
        let (lock_ttl, lock_when) = (
            self.parts.loads.lock_ttl,
            LockWhen::LifeAtMost(self.parts.lives.keep()),
        );
        let store = &self.parts.store;
        let lookup = async { store.lookup_many(keys, token, lock_ttl, lock_when).await };
        let count = keys.len();
        match self.parts.breaker.call_from(read_at, lookup).await {
            Ok(lookups) if lookups.len() == count => Ok(lookups),
            Err(error) if error.skipped() => {
                debug!(
                    keys = count,
                    "circuit open; the batch loads with in-process protection only"
                );
                Err(Unanswered::NotSent)
            }
            Err(error) => {
                let error = &error as &dyn std::error::Error;
                warn!(
                    error,
                    keys = count,
                    "batch lookup failed; each key goes its own way"
                );
                Err(Unanswered::Failed)
            }
            Ok(_) => {
                warn!("a store answered a batch lookup with too few answers; each key goes its own way");
                Err(Unanswered::Failed)
            }
        }
    }

    /// Loads the keys this call leads, in one call of the loader (under their locks, renewed
    /// until every fill is done), and fills each (fenced by its lock, as any leader's fill). A key the
    /// loader leaves out is an error for that key alone, and its lock is released; a failed
    /// load fails every key, and tells their followers as a single leader's failure does.
    async fn lead(self, led: Vec<Led<K>>) -> Answered<K> {
        let load = &self.load;
        let keys: Vec<StoreKey> = led.iter().map(|led| led.guard.key.clone()).collect();
        let renewals = &self.parts.renewals;
        let _watchdog = led
            .first()
            .map(|first| renewals.watch(keys, first.guard.token, first.guard.asked_at));
        let wanted = led.iter().map(|led| led.key.clone()).collect();
        // Read before the load, for the values' generation: a clear after it outdates them.
        let clock = self.parts.tags().clock_for_load(false).await;
        let (started, started_at) = (Instant::now(), crate::clock::now());
        let loaded = self.parts.load_watched(load(wanted)).await;
        let load_time = started.elapsed();
        let mut values = match loaded {
            Ok(values) => values,
            Err(error) => {
                let mut answers = Vec::with_capacity(led.len());
                for led in led {
                    let mut leader = Leader::holding(&self.parts, led.guard, led.stamp, None);
                    leader.tell_failure(false).await;
                    // Stale-if-error, as a single key's leader: a stale value that still
                    // stands answers in place of the error.
                    let answer = match led.stale {
                        Some(stale)
                            if stale.serves_on_error(&self.parts.lives)
                                && stale
                                    .still_stands(&self.parts.lookups(), leader.key(), false)
                                    .await =>
                        {
                            Ok(stale.payload)
                        }
                        _ => Err(error.clone()),
                    };
                    answers.push((led.key, answer));
                }
                return answers;
            }
        };
        let mut answers = Vec::with_capacity(led.len());
        let mut fills = Vec::with_capacity(led.len());
        let tagged = tagged(Vec::new(), clock);
        if tagged.is_err() {
            warn!(keys = led.len(), "a batch's values without the namespace's generation (the tag clock) are not stored");
        }
        for led in led {
            let mut leader = Leader::holding(&self.parts, led.guard, led.stamp, None);
            let Some(bytes) = values.remove(&led.key) else {
                leader.release_lock().await;
                answers.push((led.key, Err(Error::load(NOT_RETURNED.into()))));
                continue;
            };
            let Ok(tagged) = tagged.clone() else {
                leader.release_lock().await;
                answers.push((led.key, Ok(bytes)));
                continue;
            };
            let (guard, stamp) = (leader.guard, leader.stamp);
            let parts = Arc::clone(&self.parts);
            fills.push(tokio::spawn(async move {
                let load = (started_at, load_time);
                // A batch's values take the cache's TTL and jitter.
                let tagged = Some(&tagged);
                let ready = parts.ready_to_store(&bytes, Life::default(), load, tagged, None);
                let mut leader = Leader::holding(&parts, guard, stamp, None);
                leader.fill_value(&ready, tagged).await;
                (led.key, Ok(ready.value))
            }));
        }
        for fill in fills {
            if let Ok(filled) = fill.await {
                answers.push(filled);
            }
        }
        answers
    }
}

/// Why a key the loader left out of its answer has no value.
pub(super) const NOT_RETURNED: &str = "the batch loader did not return this key";

/// The loader of one key of a batch: the batch's loader, handed that key alone.
fn single<K: BatchKey>(
    load: &BatchLoad<K>,
    key: K,
) -> impl FnOnce(Option<Previous>) -> BoxFuture<'static, Gives<()>> + Send + 'static {
    let load = Arc::clone(load);
    move |_| {
        Box::pin(async move {
            let loaded = async {
                let mut values = load(vec![key.clone()]).await?;
                let value = values.remove(&key).ok_or(NOT_RETURNED)?;
                Ok(Loaded::value(value))
            };
            (loaded.await, None)
        })
    }
}

/// [`single`] as a flight's loader, reading what `accepts` says yes to.
fn single_boxed<K: BatchKey>(load: &BatchLoad<K>, accepts: &Accepts, key: K) -> BoxLoader {
    let accepts = Arc::clone(accepts);
    BoxLoader::new(
        move |bytes: &Bytes| accepts(bytes),
        single(load, key),
        None,
        None,
    )
}
