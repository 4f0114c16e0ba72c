//! The engine instances of the soak: each a `Cache` over a `RedisStore` of its own, as an app
//! process would have, and replaceable by a new one (an instance restarted).

use std::sync::RwLock;
use std::time::Duration;

use tower_stampede::store::RedisStore;
use tower_stampede::Cache;

pub struct Instances {
    url: String,
    ttl: Duration,
    l1_ttl_cap: Duration,
    slots: Vec<RwLock<Cache>>,
}

impl Instances {
    pub fn start(url: String, n: usize, ttl: Duration, l1_ttl_cap: Duration) -> Self {
        let mut instances = Instances {
            url,
            ttl,
            l1_ttl_cap,
            slots: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let cache = instances.build();
            instances.slots.push(RwLock::new(cache));
        }
        instances
    }

    /// A new instance: `open` rather than `connect`, so that it starts while Redis is down.
    fn build(&self) -> Cache {
        let store = RedisStore::open(self.url.clone()).expect("a valid Redis URL");
        Cache::builder(store)
            .ttl(self.ttl)
            .lock_ttl(Duration::from_secs(1))
            .store_timeout(Duration::from_millis(200))
            .load_timeout(Duration::from_millis(1500))
            .l1_ttl_cap(self.l1_ttl_cap)
            .build()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Instance `i` as it is now.
    pub fn get(&self, i: usize) -> Cache {
        self.slots[i].read().unwrap().clone()
    }

    /// Replaces instance `i` by a new one, with an empty L1 and new connections; calls in
    /// progress on the old one finish on it.
    pub fn restart(&self, i: usize) {
        let cache = self.build();
        *self.slots[i].write().unwrap() = cache;
    }
}
