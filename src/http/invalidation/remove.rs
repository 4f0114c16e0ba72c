//! The one engine call that removes stored responses, for every kind of invalidation: made
//! so that it lands whatever becomes of the request that asked for it.

use crate::cache::Cache;
use crate::store::StoreError;
use crate::Error;

/// Invalidates every key, in one store call. The call runs in a task of its own, so it
/// finishes even if the caller goes away.
pub(crate) async fn invalidate_keys(cache: &Cache, keys: Vec<String>) -> Result<(), Error> {
    let cache = cache.clone();
    match tokio::spawn(async move { cache.invalidate_many(keys).await }).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Error::store(StoreError::new(
            "the invalidation was cancelled before it reached the store",
        ))),
    }
}
