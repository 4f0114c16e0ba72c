//! The engine instances of the soak: each a `Cache` over a `RedisStore` of its own, as an app
//! process would have, on a tokio runtime of its own with its callers. An instance can be
//! restarted (a new `Cache`; calls in progress finish on the old one) or killed (its runtime
//! shut down: its callers, its loads, its lock watchdogs and its connections' tasks stop where
//! they are, as when a process dies) and started anew.

use std::sync::{Mutex, RwLock};
use std::time::Duration;

use support::path_proxies::PathProxies;
use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;
use tower_stampede::store::RedisStore;
use tower_stampede::Cache;

use crate::backend::Topology;

/// How the instances' caches are set up; the checks' bounds follow from it.
pub const LOCK_TTL: Duration = Duration::from_secs(1);
pub const LOAD_TIMEOUT: Duration = Duration::from_millis(1500);
const STORE_TIMEOUT: Duration = Duration::from_millis(200);

pub struct Instances {
    /// The URLs each instance connects to (its own ACL user's, or the sentinels').
    urls: Vec<Vec<String>>,
    /// Each instance's paths to the nodes, where the soak draws faults on them (read by the
    /// stores of a Cluster or Sentinel; one server's URLs name its proxy already).
    #[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
    paths: Vec<PathProxies>,
    topology: Topology,
    /// The name the sentinels know the primary by, in Sentinel mode.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    service: Option<String>,
    ttl: Duration,
    l1_ttl_cap: Duration,
    slots: Vec<RwLock<Instance>>,
}

struct Instance {
    cache: Cache,
    /// Taken when the instance is killed or dropped (a runtime is not dropped in async code).
    runtime: Option<Runtime>,
    callers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Instances {
    pub fn start(
        urls: Vec<Vec<String>>,
        paths: Vec<PathProxies>,
        (topology, service): (Topology, Option<String>),
        ttl: Duration,
        l1_ttl_cap: Duration,
    ) -> Self {
        let mut instances = Instances {
            urls,
            paths,
            topology,
            service,
            ttl,
            l1_ttl_cap,
            slots: Vec::new(),
        };
        for i in 0..instances.urls.len() {
            let instance = instances.build(i);
            instances.slots.push(RwLock::new(instance));
        }
        instances
    }

    /// A new instance on a runtime of its own; `open` rather than `connect`, so that it starts
    /// while Redis is down.
    fn build(&self, i: usize) -> Instance {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("soak-instance-{i}"))
            .enable_all()
            .build()
            .expect("a runtime");
        let cache = {
            let _entered = runtime.enter();
            self.cache(i)
        };
        Instance {
            cache,
            runtime: Some(runtime),
            callers: Mutex::default(),
        }
    }

    fn cache(&self, i: usize) -> Cache {
        let urls = self.urls[i].clone();
        let store = match self.topology {
            Topology::Server => RedisStore::open(urls[0].clone()),
            #[cfg(feature = "cluster")]
            Topology::Cluster => {
                let builder = RedisStore::cluster_builder(urls);
                // This instance's path to every node: its proxies, when path faults are on.
                match self.paths.get(i).cloned() {
                    Some(path) => builder.dns_resolver(path),
                    None => builder,
                }
                .open()
            }
            // The sentinels' URLs carry no user: the data nodes' is given apart.
            #[cfg(feature = "sentinel")]
            Topology::Sentinel => {
                let service = self.service.clone().expect("a Sentinel service");
                let builder = RedisStore::sentinel_builder(urls, service)
                    .primary_credentials(Some(&crate::backend::user(i)), "x");
                // This instance's path to every node: its proxies, when path faults are on.
                match self.paths.get(i).cloned() {
                    Some(path) => builder.dns_resolver(path),
                    None => builder,
                }
                .open()
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("this mode needs its feature"),
        };
        Cache::builder(store.expect("valid Redis URLs"))
            .ttl(self.ttl)
            .lock_ttl(LOCK_TTL)
            .store_timeout(STORE_TIMEOUT)
            .load_timeout(LOAD_TIMEOUT)
            .l1_ttl_cap(self.l1_ttl_cap)
            .build()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Instance `i` as it is now.
    pub fn get(&self, i: usize) -> Cache {
        self.slots[i].read().unwrap().cache.clone()
    }

    /// The runtime of instance `i`, for its callers and its task count.
    pub fn handle(&self, i: usize) -> Handle {
        let slot = self.slots[i].read().unwrap();
        slot.runtime
            .as_ref()
            .expect("a live instance")
            .handle()
            .clone()
    }

    /// Keeps the handles of callers spawned on instance `i`'s runtime, to await at the end.
    pub fn add_callers(&self, i: usize, callers: Vec<JoinHandle<()>>) {
        let slot = self.slots[i].read().unwrap();
        slot.callers.lock().unwrap().extend(callers);
    }

    /// The callers of instance `i` as it is now.
    pub fn take_callers(&self, i: usize) -> Vec<JoinHandle<()>> {
        let slot = self.slots[i].read().unwrap();
        let callers = std::mem::take(&mut *slot.callers.lock().unwrap());
        callers
    }

    /// Replaces instance `i`'s cache by a new one, with an empty L1 and new connections; calls
    /// in progress on the old one finish on it.
    pub fn restart(&self, i: usize) {
        let cache = {
            let slot = self.slots[i].read().unwrap();
            let _entered = slot.runtime.as_ref().expect("a live instance").enter();
            self.cache(i)
        };
        self.slots[i].write().unwrap().cache = cache;
    }

    /// Kills instance `i` (its runtime and everything on it) and starts a new one in its
    /// place, without callers (the caller spawns them).
    pub fn kill(&self, i: usize) {
        let new = self.build(i);
        let old = std::mem::replace(&mut *self.slots[i].write().unwrap(), new);
        drop(old);
    }
}
