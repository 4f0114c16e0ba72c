//! Batches: [`Cache::get_many_or_load`], the values of many keys for one call of a loader that
//! loads them together (one `WHERE id IN (…)`).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;

use super::engine::Cache;
use super::error::{BoxError, Error};
use super::protocol::batch::{Accepts, Batch, BatchKey, BatchLoad};

impl Cache {
    /// The values of `keys`, each as [`get_or_load`](Self::get_or_load) would find it, with
    /// one call of `loader` for the keys this call leads, in one store round trip for the
    /// lookup of the whole batch.
    ///
    /// L1 answers first. The keys it misses are looked up together (on Redis, one pipeline;
    /// on a Redis Cluster, one per master), and the reload locks of those stale or absent
    /// are taken in the same trip. `loader` is then called once, with exactly the keys whose
    /// lock this call took (none if every key was found), and answers their values as a map;
    /// each is filled under its own lock, fenced as any leader's fill is. A key that another
    /// caller or process is loading is not loaded again: it is waited for, woken by the
    /// same notifications as any follower (and should its leader fail, `loader` is called
    /// for that key alone). So is a key whose stored bytes this call cannot read (foreign
    /// bytes, another type's): it is loaded on its own, and overwritten.
    ///
    /// Every key gets an answer, the value or an error of its own: a key `loader` leaves out
    /// of its map is an [`ErrorKind::Load`](crate::ErrorKind::Load) error for that key alone
    /// (its lock released at once, so the next caller loads it); a failed load is the error
    /// of each key it was to load (and, as for one key, remembered for
    /// [`failure_ttl`](super::CacheBuilder::failure_ttl)). The load runs in a task of its
    /// own: it fills the cache even if this call is dropped (dropped before its lookup has
    /// answered, it releases the locks the lookup took). Values are stored for the cache's
    /// default [`ttl`](super::CacheBuilder::ttl). Duplicate keys are answered once.
    ///
    /// A key this call leads whose value the store still keeps past its freshness is
    /// answered as [`get_or_load`](Self::get_or_load) answers it: its stale value at once
    /// within the [`stale`](super::CacheBuilder::stale) window (the load runs on and fills
    /// it), and within [`stale_if_error`](super::CacheBuilder::stale_if_error) in place of
    /// a failed load, or once the load has taken the
    /// [`soft_timeout`](super::CacheBuilder::soft_timeout). While the circuit breaker is
    /// open, nothing is sent to the store: `loader` is called once, with every key L1 missed.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// cache.get_or_load("product:2", || async { Ok::<_, std::io::Error>(Bytes::from("two")) }).await.unwrap();
    /// let products = ["product:1", "product:2", "product:3"];
    /// let found = cache
    ///     .get_many_or_load(products, |missing: Vec<&'static str>| async move {
    ///         // Product 2 was cached: one query for the others.
    ///         assert_eq!(missing.len(), 2);
    ///         let rows = missing.into_iter().map(|id| (id, Bytes::from(format!("row of {id}"))));
    ///         Ok::<_, std::io::Error>(rows.collect::<HashMap<_, _>>())
    ///     })
    ///     .await;
    /// assert_eq!(found["product:2"].as_ref().unwrap(), "two");
    /// assert_eq!(found["product:3"].as_ref().unwrap(), "row of product:3");
    /// # }
    /// ```
    pub async fn get_many_or_load<K, F, Fut, E>(
        &self,
        keys: impl IntoIterator<Item = K>,
        loader: F,
    ) -> HashMap<K, Result<Bytes, Error>>
    where
        K: AsRef<[u8]> + Eq + Hash + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<HashMap<K, Bytes>, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let load: BatchLoad<K> = Arc::new(move |keys| {
            let loading = loader(keys);
            Box::pin(async move { loading.await.map_err(Into::into) })
        });
        self.get_many_accepting(keys.into_iter().collect(), load, Arc::new(|_: &Bytes| true))
            .await
    }

    /// [`get_many_or_load`](Self::get_many_or_load) for a caller that can read only the
    /// values `accepts` says yes to (any other is a corrupt entry, reloaded).
    pub(super) async fn get_many_accepting<K: BatchKey>(
        &self,
        keys: Vec<K>,
        load: BatchLoad<K>,
        accepts: Accepts,
    ) -> HashMap<K, Result<Bytes, Error>> {
        let parts = Arc::clone(&self.inner.parts);
        Batch::new(parts, self.clone(), load, accepts)
            .resolve(keys)
            .await
    }
}
