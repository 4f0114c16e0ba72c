//! [`CacheBuilder`]: the engine's settings, set in code.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{key::sanitize_namespace, Store};

use super::build_error::{check, BuildError};
use super::config::{Config, WaitTimeoutPolicy};
use super::engine::Cache;

/// Builds a [`Cache`]; see [`Cache::builder`]. Every setter documents its default.
#[must_use]
#[derive(Debug)]
pub struct CacheBuilder {
    store: Arc<dyn Store>,
    config: Config,
}

impl CacheBuilder {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        CacheBuilder {
            store,
            config: Config::default(),
        }
    }

    /// Prefix of every store key, so several applications can share one Redis.
    /// Default: `"stampede"`. Braces (which would break Redis Cluster hash tags) become `_`.
    pub fn namespace(mut self, namespace: impl AsRef<str>) -> Self {
        self.config.namespace = sanitize_namespace(namespace.as_ref());
        self
    }

    /// How long a loaded value stays fresh when its loader does not say. Default: 60 s.
    ///
    /// The HTTP layer always says (a response's own freshness, or the policy's
    /// [`default_ttl`](crate::http::RfcPolicy::default_ttl)), so this does not apply to it.
    ///
    /// Refused by the build ([`BuildError`]) below 1 ms: a value that is never fresh caches
    /// nothing, and Redis counts lives in milliseconds.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.lives.ttl = ttl;
        self
    }

    /// The most added to each stored value's freshness: a uniform random share of it, drawn
    /// per value, so that keys written together (a warm-up, a bulk import) do not all expire
    /// in the same second and reload together. The value's life in the store and in L1
    /// follow its freshness. A loader may give a value its own
    /// ([`Loaded::ttl_jitter`](crate::Loaded::ttl_jitter)); the HTTP layer gives its
    /// responses none, as their freshness is the origin's (RFC 9111 §4.2.1). Default: 0.
    pub fn ttl_jitter(mut self, max: Duration) -> Self {
        self.config.lives.ttl_jitter = max;
        self
    }

    /// How long the reload lock lives if its leader never releases it (a crash). From the
    /// start of its lead until its fill is done (the tag clock read, the load, the fill), a
    /// leader renews the lock every third of this. Default: 5 s.
    ///
    /// Past it the lock lapses: anyone's to take, while its key is kept ten times this long
    /// more for its holder, whose fill still lands if nobody took the lock meanwhile (a
    /// process stalled past its lock). So a lock key lives eleven times this in the store
    /// at most (see the [`Store`](crate::store::Store) trait's "Locks that lapse").
    ///
    /// Refused by the build ([`BuildError`]) below 1 ms: Redis takes no lock that lives 0 ms.
    pub fn lock_ttl(mut self, lock_ttl: Duration) -> Self {
        self.config.loads.lock_ttl = lock_ttl;
        self
    }

    /// How long past its freshness a value may be served while one leader refreshes it
    /// (serve-while-updating, as HTTP's `stale-while-revalidate`): callers get it at once
    /// instead of waiting. A value lives `ttl + max(stale, stale_if_error)` in the store and
    /// counts as fresh while more than that extra time remains, so freshness comes from the
    /// store's clock, never from the processes' clocks (every process sharing a namespace
    /// must use the same two settings). Default: 0 (callers wait for the refresh).
    pub fn stale(mut self, stale: Duration) -> Self {
        self.config.lives.stale = stale;
        self
    }

    /// The longest past its freshness a value may stand in for a load that failed (loader
    /// error, HTTP 5xx, load timeout, a failure recorded elsewhere) or, with
    /// [`WaitTimeoutPolicy::ServeStale`], for a wait that timed out (as HTTP's
    /// `stale-if-error`): the maximum staleness callers accept when the backend is in trouble.
    /// Default: the [`stale`](Self::stale) window.
    pub fn stale_if_error(mut self, max_staleness: Duration) -> Self {
        self.config.lives.stale_if_error = Some(max_staleness);
        self
    }

    /// How long the store keeps a value past its freshness (at the least: the stale windows
    /// keep it as long as they last), so that its reload can revalidate it instead of loading
    /// it again: a revalidating loader ([`Cache::fetch_revalidating`]) is handed the value
    /// ([`Previous`](crate::Previous)) and may answer
    /// [`Loaded::not_modified`](crate::Loaded::not_modified). Past its stale windows, such a
    /// value is never served as it is. Default: 0.
    pub fn keep_for_revalidation(mut self, keep: Duration) -> Self {
        self.config.lives.keep_for_revalidation = keep;
        self
    }

    /// Probabilistic early refresh (after "XFetch", Vattani et al., VLDB 2015): the first hit
    /// past a value's refresh point refreshes it in the background, before it expires. The
    /// point is drawn once per value and process, when the value is read from the store:
    /// `δ·(1.1 + β·(−ln u))` before its expiry, with `δ` the value's last load time, `u`
    /// uniform in (0, 1] and `β` this setting. So the refresh starts more than one load time
    /// ahead (and ends before the value does, nobody waiting for it), `β` spreads the processes' points
    /// over a further `δ·β` on average, and how often the key is hit does not make it refresh
    /// earlier: about one load per TTL at any request rate. A key not hit past its point is
    /// not refreshed early. The refresh takes the store's lock as any reload does, so it is
    /// still one load across processes. 0 (or a non-number) turns it off. Default: 1.0.
    pub fn early_refresh(mut self, beta: f64) -> Self {
        self.config.loads.early_refresh_beta = if beta.is_finite() { beta.max(0.0) } else { 0.0 };
        self
    }

    /// Whether the leader of a refresh of a stale value answers its own callers with the stale
    /// value at once and refreshes in the background (`true`), or makes them wait for the
    /// refresh (`false`; followers elsewhere still get the stale value at once).
    /// Default: `true`.
    pub fn refresh_in_background(mut self, on: bool) -> Self {
        self.config.loads.refresh_in_background = on;
        self
    }

    /// How long a caller that has a stale value waits for its reload before it is answered
    /// with the stale value (as FusionCache's `FactorySoftTimeout`): the reload goes on, its
    /// fill lands for everyone, and it is still one load. Applies to a leader and to a
    /// follower alike, where the value is within its
    /// [`stale_if_error`](Self::stale_if_error) window (a value within the
    /// [`stale`](Self::stale) window is answered at once anyway, unless
    /// [`refresh_in_background`](Self::refresh_in_background) is off for the leader). The
    /// answer's outcome is [`Outcome::Stale`](crate::Outcome::Stale). Per call:
    /// [`Cache::fetch_with_soft_timeout`]. Default: none (callers wait for the reload).
    ///
    /// Refused by the build ([`BuildError`]) unless shorter than
    /// [`load_timeout`](Self::load_timeout): the load it waits for would be abandoned first.
    pub fn soft_timeout(mut self, soft_timeout: Duration) -> Self {
        self.config.loads.soft_timeout = Some(soft_timeout);
        self
    }

    /// How long a failed load is remembered: until then, every process's callers of the key
    /// fail at once with [`ErrorKind::RecentFailure`](crate::ErrorKind::RecentFailure) (or get
    /// the stale value) instead of calling the failing backend again; one load per window
    /// retries. 0 turns it off (each follower then retries in turn). Default: 1 s. A result
    /// for the waiters ([`Loaded::for_waiters`](crate::Loaded::for_waiters)) is no failure:
    /// it goes to the calls that waited, and nothing is remembered.
    pub fn failure_ttl(mut self, failure_ttl: Duration) -> Self {
        self.config.lives.failure_ttl = failure_ttl;
        self
    }

    /// How long a load may run before it is abandoned and its lock released. Default: 30 s.
    /// Refused by the build ([`BuildError`]) if zero: every load would be abandoned at once.
    pub fn load_timeout(mut self, load_timeout: Duration) -> Self {
        self.config.loads.load_timeout = load_timeout;
        self
    }

    /// How long a follower waits for another leader's fill before it applies the
    /// [`on_wait_timeout`](Self::on_wait_timeout) policy. Default: 30 s, the default load
    /// timeout, so a follower outlasts any load its leader may still finish.
    pub fn wait_timeout(mut self, wait_timeout: Duration) -> Self {
        self.config.waits.wait_timeout = wait_timeout;
        self
    }

    /// What a follower does after [`wait_timeout`](Self::wait_timeout).
    /// Default: [`WaitTimeoutPolicy::LoadUncached`].
    pub fn on_wait_timeout(mut self, policy: WaitTimeoutPolicy) -> Self {
        self.config.waits.on_wait_timeout = policy;
        self
    }

    /// The follower's re-read backoff: the first pause, and the longest one. Each pause is
    /// the previous one times the [multiplier](Self::backoff_multiplier), and is jittered
    /// between half and all of its length so followers spread out.
    /// Default: 5 ms, growing to 200 ms.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.waits.backoff_initial = initial;
        self.config.waits.backoff_max = max.max(initial);
        self
    }

    /// Growth of the follower's backoff per re-read, clamped to 1..=16 (a non-number means the
    /// default). Default: 1.5.
    pub fn backoff_multiplier(mut self, multiplier: f64) -> Self {
        self.config.waits.backoff_multiplier = if multiplier.is_finite() {
            multiplier.clamp(1.0, 16.0)
        } else {
            Config::default().waits.backoff_multiplier
        };
        self
    }

    /// How long a follower waits for the key's "filled" notification before it reads the key
    /// anyway, while notifications are being received (jittered between half and all of
    /// it): the most a lost message costs a follower, and what a leader that died holding
    /// the lock costs on top of [`lock_ttl`](Self::lock_ttl). While they are not received
    /// (the subscription is down or not in place yet), followers poll on their
    /// [backoff](Self::backoff) instead, and a loss wakes a waiting follower at once. So,
    /// across `P` processes, one load costs about `2·P` lookups (the first, and the read
    /// after the fill), however long it takes, plus `P` per second of this setting.
    /// Never shorter than the backoff's longest pause. Default: 1 s.
    pub fn poll_while_notified(mut self, period: Duration) -> Self {
        self.config.waits.poll_while_notified = period;
        self
    }

    /// How long one store call may take; a slower call counts as a store error, and the engine
    /// falls back to protection within this process. Counted against the store, up to ten
    /// times this in all: a timer that fires late (by more than a quarter of this: the process
    /// was starved of CPU, or its runtime's thread blocked, while the store's reply may be
    /// waiting unread) gives the call this long again from when the process runs; so does a
    /// call whose request waited for the connection's task behind this process's own work;
    /// and so does a timer on time while the store works through a queue (it answered a call
    /// of this cache within the last timeout), as when many processes stampede many keys at
    /// once. A store that answers nothing for this long fails the call; one that holds a call
    /// while it answers others (a stalled master of a cluster) fails it at ten times this.
    ///
    /// A healthy Redis answers in a millisecond or two; the default leaves room for a Redis
    /// or a process that shares its cores with busy neighbours, where a call over the
    /// timeout makes its process load alone (on two cores shared by 32 processes and Redis,
    /// 50 ms let a stampede of 100 keys cost 2,900 loads instead of 100, see the crate's
    /// `benches/README.md`), while a Redis that hangs costs each call at most this until the
    /// [circuit breaker](Self::circuit_breaker) opens. Default: 250 ms.
    ///
    /// Refused by the build ([`BuildError`]) if zero: every store call would time out.
    pub fn store_timeout(mut self, store_timeout: Duration) -> Self {
        self.config.breaker.store_timeout = store_timeout;
        self
    }

    /// The circuit breaker in front of the store: after `failures` store calls in a row have
    /// failed or timed out, no store call is made for `open_for` (every flight loads with
    /// in-process protection at once, without paying the store timeout); then one background
    /// probe asks the store, and the breaker closes as soon as the store answers, so
    /// protection across processes resumes by itself. Each change is logged once. `failures`
    /// 0 turns the breaker off. Default: 5 failures, open for 1 s.
    pub fn circuit_breaker(mut self, failures: u32, open_for: Duration) -> Self {
        self.config.breaker.threshold = failures;
        self.config.breaker.open_for = open_for;
        self
    }

    /// How long a "pass" marker (the last load was not cacheable) tells followers to go to the
    /// backend directly instead of waiting. Default: 5 s.
    pub fn pass_ttl(mut self, pass_ttl: Duration) -> Self {
        self.config.lives.pass_ttl = pass_ttl;
        self
    }

    /// The in-process (L1) cache's capacity in bytes of values; 0 turns L1 off.
    /// Default: 64 MiB.
    ///
    /// Besides it, each thread that answers hits keeps its own copy of the 16 entries it read
    /// last (of every cache of the process together), values of up to 64 KiB with what they
    /// decode to: a hit on a hot key then touches nothing another thread touches. That is at
    /// most about 2 MiB per thread, held until other keys take their places, and never
    /// answered once L1 has been written since.
    pub fn l1_capacity(mut self, bytes: u64) -> Self {
        self.config.l1.capacity = bytes;
        self
    }

    /// The longest an entry lives in L1, whatever its freshness in the store: how long another
    /// process's newer fill can go unseen here. Default: 10 s.
    pub fn l1_ttl_cap(mut self, cap: Duration) -> Self {
        self.config.l1.ttl_cap = cap;
        self
    }

    /// Whether followers are woken by the store's "filled" notifications (Redis pub/sub, or
    /// in-process for `MemoryStore`) as well as by their backoff polls. Turning it off leaves
    /// the polls alone, for comparison. Default: on.
    pub fn notifications(mut self, on: bool) -> Self {
        self.config.l1.notifications = on;
        self
    }

    /// Whether a lookup's trace shows its key as text (the key's bytes as UTF-8, escaped, cut
    /// at 256 bytes; for the HTTP layer the method and URL), besides its hash. Off by default:
    /// keys often hold what logs must not (user ids, emails, a token in a query string).
    ///
    /// When on, each lookup that reaches the store is an `INFO` span, `stampede.fetch`, with a
    /// `key_text` field, so a warning logged inside it (a failed store call, a failed load)
    /// names the key under a default `fmt` subscriber; an L1 hit logs nothing and keeps its
    /// `DEBUG` span without the text. Default: off.
    pub fn readable_keys(mut self, on: bool) -> Self {
        self.config.readable_keys = on;
        self
    }

    /// Builds the cache, or says which setting cannot work ([`BuildError`]: a TTL or lock TTL
    /// under 1 ms, a zero load or store timeout, a soft timeout not shorter than the load
    /// timeout; each setter says what it refuses). For settings read from a file or the
    /// environment. With the `metrics` feature, it also describes the engine's metrics to
    /// the installed recorder (`describe_metrics`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// let refused = Cache::builder(MemoryStore::new())
    ///     .load_timeout(Duration::from_secs(2))
    ///     .soft_timeout(Duration::from_secs(5))
    ///     .try_build()
    ///     .unwrap_err();
    /// assert_eq!(refused.setting(), "soft_timeout");
    /// ```
    pub fn try_build(self) -> Result<Cache, BuildError> {
        check(&self.config)?;
        #[cfg(feature = "metrics")]
        super::describe_metrics();
        Ok(Cache::from_parts(self.store, self.config))
    }

    /// Builds the cache, as [`try_build`](Self::try_build) does.
    ///
    /// # Panics
    ///
    /// If a setting cannot work (see [`try_build`](Self::try_build)), with the
    /// [`BuildError`]'s message, which names the setter: settings written in code are
    /// then wrong wherever the code runs, and the first test that builds the cache finds it.
    /// Settings read at run time want `try_build`.
    pub fn build(self) -> Cache {
        match self.try_build() {
            Ok(cache) => cache,
            Err(refused) => panic!("{refused}"),
        }
    }
}

impl Cache {
    /// A builder for a cache over `store`.
    pub fn builder(store: impl Store) -> CacheBuilder {
        CacheBuilder::new(Arc::new(store))
    }

    /// A builder for a cache over a store that is already shared.
    pub fn builder_shared(store: Arc<dyn Store>) -> CacheBuilder {
        CacheBuilder::new(store)
    }
}
