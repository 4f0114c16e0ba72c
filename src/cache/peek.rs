//! Peeks: [`Cache::get`] reads what is cached, from L1 then from the store, and never loads.
//!
//! A peek takes no reload lock and starts no flight, so it never waits for a load and never
//! makes one: a miss is `None`, whatever other callers are doing. What it answers, a lookup
//! would have answered as fresh: a value past its freshness (within a stale window or not), a
//! "pass" marker, a waiters' answer, bytes this engine did not write, and a tagged value one
//! of whose tags was invalidated since its load are all `None`. An invalidated key is gone
//! from the store, and from every L1 as a lookup sees it.

use bytes::Bytes;

use super::engine::Cache;
use super::entry::{self, Entry};
use super::error::Error;
use crate::store::{KeyDigest, StoreError, StoreKey};

impl Cache {
    /// The value of `key`, if a fresh one is cached: from this process's L1, else from the
    /// store (one round trip, and one more for a tagged value whose tags' versions this
    /// process does not know). Never loads, never takes the reload lock, never waits for a
    /// load in progress. A value read from the store enters L1 as a lookup's would: the
    /// first read of a namespace subscribes to its notifications (as a lookup does), so that
    /// what enters L1 is dropped once another process changes it.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// assert_eq!(cache.get("user:42").await?, None);
    /// cache
    ///     .get_or_load("user:42", || async { Ok::<_, std::io::Error>(Bytes::from_static(b"Ada")) })
    ///     .await?;
    /// assert_eq!(cache.get("user:42").await?.as_deref(), Some(&b"Ada"[..]));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) if L1 does not hold the key and the
    /// store could not be reached (or the circuit breaker is open).
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, Error> {
        self.peek(KeyDigest::of(key.as_ref()), |_| true)
            .await
            .map_err(Error::store)
    }

    /// The fresh value of the key hashed to `digest` that `accepts`, from L1 or the store.
    pub(super) async fn peek(
        &self,
        digest: KeyDigest,
        accepts: impl Fn(&Bytes) -> bool,
    ) -> Result<Option<Bytes>, StoreError> {
        let parts = &self.inner.parts;
        if let Some(hit) = parts.l1_get(&digest) {
            let value = hit.value();
            return Ok(accepts(&value).then_some(value));
        }
        let key = StoreKey::new(std::sync::Arc::clone(&parts.namespace), digest);
        // Subscribed to the namespace's notifications first, as a lookup is: a process that
        // only peeks would otherwise keep what it read in L1 without ever hearing of a change
        // made elsewhere.
        drop(parts.lookups().watch_fills_subscribed(&key).await);
        // Taken before the read: a change heard after it keeps the value out of L1.
        let stamp = parts.l1.stamp(&digest);
        let Some(stored) = parts.breaker.call(parts.store.get(&key)).await? else {
            return Ok(None);
        };
        // Fresh while the store keeps it longer than it keeps values past their freshness,
        // as a lookup judges it.
        let keep = parts.lives.keep();
        let Some(fresh_for) = stored
            .ttl
            .and_then(|ttl| ttl.checked_sub(keep))
            .filter(|fresh_for| !fresh_for.is_zero())
        else {
            return Ok(None);
        };
        let Ok(Entry::Value {
            payload,
            load_time,
            tags,
            ..
        }) = entry::decode(stored.bytes)
        else {
            return Ok(None);
        };
        if !accepts(&payload) {
            return Ok(None);
        }
        let tag_stamps = match &tags {
            Some(tagged) => match Box::pin(parts.tags().tags_valid(tagged)).await? {
                Some(stamps) => stamps,
                None => return Ok(None),
            },
            None => Default::default(),
        };
        parts.l1_insert(stamp, tag_stamps, digest, &payload, fresh_for, load_time);
        Ok(Some(payload))
    }
}
