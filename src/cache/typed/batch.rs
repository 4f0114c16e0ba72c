//! Typed batches: [`Typed::get_many_or_load`], the batch of [`Cache::get_many_or_load`](crate::Cache::get_many_or_load) for
//! values of `T`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::{decode, encode};
use super::{Codec, Typed};
use crate::cache::error::{BoxError, Error, ErrorKind};
use crate::cache::protocol::batch::BatchLoad;

impl<T, C> Typed<T, C>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    C: Codec,
{
    /// The values of `keys`, as [`Cache::get_many_or_load`](crate::Cache::get_many_or_load) finds them (L1 first, one store
    /// round trip for the lookup of the whole batch, one call of `loader` with exactly the
    /// keys this call leads), decoded as `T`.
    ///
    /// A stored value that is not a `T` of this schema is a miss, reloaded and overwritten.
    ///
    /// # Errors
    ///
    /// Each key's own, as [`Cache::get_many_or_load`](crate::Cache::get_many_or_load)'s; a value the codec cannot encode
    /// fails the load ([`ErrorKind::Load`] for each key it was to load), and a key this
    /// process holds as another type is an [`ErrorKind::Decode`] error (see
    /// [One type per key](crate::cache::typed#one-type-per-key)).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let prices = Cache::builder(MemoryStore::new()).build().typed::<u64>();
    /// let found = prices
    ///     .get_many_or_load(["apple", "pear"], |missing: Vec<&'static str>| async move {
    ///         let rows = missing.into_iter().map(|fruit| (fruit, fruit.len() as u64 * 100));
    ///         Ok::<_, std::io::Error>(rows.collect::<HashMap<_, _>>())
    ///     })
    ///     .await;
    /// assert_eq!(*found["pear"].as_ref().unwrap().as_ref(), 400);
    /// # }
    /// ```
    pub async fn get_many_or_load<K, F, Fut, E>(
        &self,
        keys: impl IntoIterator<Item = K>,
        loader: F,
    ) -> HashMap<K, Result<Arc<T>, Error>>
    where
        K: AsRef<[u8]> + Eq + Hash + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<HashMap<K, T>, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let (codec, tag) = (self.codec.clone(), self.tag);
        let load: BatchLoad<K> = Arc::new(move |keys| {
            let (loading, codec) = (loader(keys), codec.clone());
            Box::pin(async move {
                let values = loading.await.map_err(Into::into)?;
                values
                    .into_iter()
                    .map(|(key, value)| Ok((key, encode(&codec, tag, &value)?)))
                    .collect()
            })
        });
        let found = self
            .cache
            .get_many_accepting(keys.into_iter().collect(), load, Arc::new(self.accepts()))
            .await;
        found
            .into_iter()
            .map(|(key, bytes)| {
                let value = bytes.and_then(|bytes| {
                    decode::<T, C>(&self.codec, self.tag, &bytes)
                        .map(Arc::new)
                        .ok_or_else(|| Error::new(ErrorKind::Decode))
                });
                (key, value)
            })
            .collect()
    }
}
