//! A store seen through a wrapper that observes its calls and can slow, fail or stall them.

use std::sync::Arc;
use std::time::Duration;

use tower_stampede::store::{
    BoxFuture, CallLimit, Change, FillWatch, KeyDigest, LockToken, LockWhen, Lookup, Notifier,
    Settle, Settled, Store, StoreError, StoreKey, Stored, TagClock, TagVersions,
};

/// Another store seen through a wrapper that counts its calls, lookups and fills and, if asked,
/// answers lookups late (after they took effect), as a slow network would, fails every fill,
/// or leaves its lookups and reads unanswered for good while it [hangs](Observed::hang) (its
/// reads alone, while [they hang](Observed::hang_reads)), or holds the thread of its first
/// lookup once the lookup is sent, as a process starved of CPU would
/// ([`stalling_first_lookup`](Observed::stalling_first_lookup)).
#[derive(Debug)]
pub struct Observed {
    inner: Arc<dyn Store>,
    lookups: std::sync::atomic::AtomicUsize,
    lookup_delay: Duration,
    /// How long a fill takes to reach the store.
    fill_delay: Duration,
    /// How long a renewal (`Store::extend`) takes to reach the store.
    extend_delay: Duration,
    extends: std::sync::atomic::AtomicUsize,
    fills_fail: bool,
    /// Sends no notifications (as a third-party store without them).
    deaf: bool,
    hanging: std::sync::atomic::AtomicBool,
    reads_hang: std::sync::atomic::AtomicBool,
    fills: std::sync::atomic::AtomicUsize,
    calls: std::sync::atomic::AtomicUsize,
    /// How long the first lookup holds its thread once sent (taken by that lookup).
    stall: std::sync::Mutex<Option<Duration>>,
    /// Lookups asked and not yet answered, and the most there were at once.
    out: std::sync::Mutex<(usize, usize)>,
}

/// Counts a lookup out until it is dropped (answered or abandoned).
struct Out<'a>(&'a std::sync::Mutex<(usize, usize)>);

impl<'a> Out<'a> {
    fn new(out: &'a std::sync::Mutex<(usize, usize)>) -> Self {
        let mut counts = out.lock().unwrap();
        counts.0 += 1;
        counts.1 = counts.1.max(counts.0);
        Out(out)
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap().0 -= 1;
    }
}

impl Observed {
    pub fn new(inner: &Arc<dyn Store>, lookup_delay: Duration) -> Arc<Self> {
        Observed::built(inner, lookup_delay, false)
    }

    /// A store whose first lookup, once asked of `inner`, holds the calling thread for
    /// `stall` (`std::thread::sleep`): on a current-thread runtime nothing of the process
    /// runs meanwhile (its timers, its connection's task), as when a busy machine starves
    /// the process of CPU, while the store answers.
    pub fn stalling_first_lookup(inner: &Arc<dyn Store>, stall: Duration) -> Arc<Self> {
        let observed = Observed::built(inner, Duration::ZERO, false);
        *observed.stall.lock().unwrap() = Some(stall);
        observed
    }

    /// A store that sends no notifications ([`Store::notifier`] and [`Store::subscribe`] are
    /// `None`, as for a third-party store without them), whose lookups answer `lookup_delay`
    /// late.
    pub fn deaf(inner: &Arc<dyn Store>, lookup_delay: Duration) -> Arc<Self> {
        let mut observed = Observed::built(inner, lookup_delay, false);
        Arc::get_mut(&mut observed).expect("not shared yet").deaf = true;
        observed
    }

    /// A store whose fills all fail (and change nothing), its other calls going through.
    pub fn failing_fills(inner: &Arc<dyn Store>) -> Arc<Self> {
        Observed::built(inner, Duration::ZERO, true)
    }

    /// A store whose fills reach it `delay` late (a slow network, a busy process), its other
    /// calls going through at once.
    pub fn slow_fills(inner: &Arc<dyn Store>, delay: Duration) -> Arc<Self> {
        let mut observed = Observed::built(inner, Duration::ZERO, false);
        Arc::get_mut(&mut observed)
            .expect("not shared yet")
            .fill_delay = delay;
        observed
    }

    /// A store whose lock renewals (`Store::extend`) reach it `delay` late, each call (a
    /// slow network, a busy process), its other calls going through at once.
    pub fn slow_renewals(inner: &Arc<dyn Store>, delay: Duration) -> Arc<Self> {
        let mut observed = Observed::built(inner, Duration::ZERO, false);
        Arc::get_mut(&mut observed)
            .expect("not shared yet")
            .extend_delay = delay;
        observed
    }

    fn built(inner: &Arc<dyn Store>, lookup_delay: Duration, fills_fail: bool) -> Arc<Self> {
        Arc::new(Observed {
            inner: Arc::clone(inner),
            lookups: Default::default(),
            lookup_delay,
            fill_delay: Duration::ZERO,
            extend_delay: Duration::ZERO,
            extends: Default::default(),
            fills_fail,
            deaf: false,
            hanging: Default::default(),
            reads_hang: Default::default(),
            fills: Default::default(),
            calls: Default::default(),
            stall: Default::default(),
            out: Default::default(),
        })
    }

    /// From now on, lookups and reads never answer (`true`), or answer again (`false`).
    pub fn hang(&self, hanging: bool) {
        self.hanging
            .store(hanging, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, reads (`Store::get`) never answer (`true`), or answer again (`false`);
    /// lookups go on.
    pub fn hang_reads(&self, hanging: bool) {
        self.reads_hang
            .store(hanging, std::sync::atomic::Ordering::SeqCst);
    }

    fn hanging(&self) -> bool {
        self.hanging.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most lookups that were out (asked and not yet answered) at once, a batch's counted
    /// as one.
    pub fn most_lookups_out(&self) -> usize {
        self.out.lock().unwrap().1
    }

    pub fn lookups(&self) -> usize {
        self.lookups.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The lookups out now (asked and not yet answered), a batch's counted as one.
    pub fn lookups_out(&self) -> usize {
        self.out.lock().unwrap().0
    }

    /// The calls asked of it so far, of every kind (each one round trip on Redis, but on a
    /// cluster), watches and the notifier aside.
    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The lock renewal calls (`Store::extend`, however many locks each) asked of it so far.
    pub fn extends(&self) -> usize {
        self.extends.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The fills asked of it so far (failed ones included).
    pub fn fills(&self) -> usize {
        self.fills.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Store for Observed {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        self.count();
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.hanging() {
            return Box::pin(std::future::pending());
        }
        let key = key.clone();
        let stall = self.stall.lock().unwrap().take();
        Box::pin(async move {
            let _out = Out::new(&self.out);
            let lookup = self.inner.lookup(&key, token, lock_ttl, lock_when);
            tokio::pin!(lookup);
            if let Some(stall) = stall {
                // Asked (polled once), then the thread is held.
                tokio::select! {
                    biased;
                    answer = &mut lookup => return answer,
                    () = std::future::ready(()) => std::thread::sleep(stall),
                }
            }
            let answer = lookup.await;
            tokio::time::sleep(self.lookup_delay).await;
            answer
        })
    }

    /// One call, counted as one lookup (one round trip).
    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        self.count();
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.hanging() {
            return Box::pin(std::future::pending());
        }
        let keys = keys.to_vec();
        Box::pin(async move {
            let _out = Out::new(&self.out);
            let answer = self
                .inner
                .lookup_many(&keys, token, lock_ttl, lock_when)
                .await;
            tokio::time::sleep(self.lookup_delay).await;
            answer
        })
    }

    /// A fill is counted, failed or slowed as asked; every other settlement goes through as
    /// it is, so the wrapper keeps the inner store's renewals, waiters' slot and failure
    /// markers.
    fn settle(
        &self,
        key: &StoreKey,
        token: LockToken,
        how: Settle,
    ) -> BoxFuture<'_, Result<Settled, StoreError>> {
        self.count();
        if !matches!(how, Settle::Fill { .. }) {
            return self.inner.settle(key, token, how);
        }
        self.fills.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fills_fail {
            return Box::pin(async { Err(StoreError::new("fills fail")) });
        }
        let key = key.clone();
        Box::pin(async move {
            tokio::time::sleep(self.fill_delay).await;
            self.inner.settle(&key, token, how).await
        })
    }

    fn change(&self, key: &StoreKey, what: Change) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.count();
        self.inner.change(key, what)
    }

    // The calls with a default go through too: without them, the wrapper would lose the
    // inner store's waiters' slot, batches, notifications and limit.
    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.count();
        self.inner.waiters_answer(key)
    }

    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        if self.deaf {
            return None;
        }
        self.inner.subscribe(key)
    }

    fn notifier(&self) -> Option<&Notifier> {
        if self.deaf {
            return None;
        }
        self.inner.notifier()
    }

    fn call_limit(&self) -> Option<&CallLimit> {
        self.inner.call_limit()
    }

    /// One call, however many locks (one round trip on Redis), `extend_delay` late.
    fn extend(
        &self,
        locks: &[(StoreKey, LockToken)],
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        self.count();
        self.extends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let locks = locks.to_vec();
        Box::pin(async move {
            tokio::time::sleep(self.extend_delay).await;
            self.inner.extend(&locks, lock_ttl).await
        })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        self.count();
        if self.hanging() || self.reads_hang.load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        self.inner.get(key)
    }

    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        self.count();
        self.inner.invalidate_many(keys)
    }

    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        self.count();
        self.inner.tag_clock(namespace)
    }

    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        self.count();
        self.inner.tag_versions(namespace, tags)
    }

    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.count();
        self.inner.invalidate_tags(namespace, tags)
    }

    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        self.count();
        self.inner.clear(namespace)
    }
}
