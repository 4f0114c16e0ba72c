//! Typed values (feature `serde`): [`Cache::typed`] hands out a [`Typed`] handle whose
//! [`get_or_load`](Typed::get_or_load) stores any serde type, encoded by a [`Codec`]
//! ([`Postcard`] unless told otherwise), with the engine's whole protocol underneath. Its
//! [`fetch`](Typed::fetch) takes the same options as the bytes' [`Cache::fetch`] (a
//! [`Loaded<T>`](super::Loaded): TTL, tags, stale windows, jitter, pass) and tells the
//! [`Outcome`]; [`get`](Typed::get) peeks, [`set`](Typed::set) and
//! [`invalidate`](Typed::invalidate) change a key, as their bytes twins do.
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | [`Typed`]: the handle, its schema tag, and its calls |
//! | `codec.rs` | [`Codec`], [`Postcard`], and a value behind its schema tag |
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use tower_stampede::{store::MemoryStore, Cache};
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct User {
//!     id: u64,
//!     name: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_stampede::Error> {
//! let cache = Cache::builder(MemoryStore::new()).build();
//! // Make the handle once and clone it; bump the version whenever `User` changes shape.
//! let users = cache.typed::<User>().schema_version(2);
//! let user = users
//!     .get_or_load("user:42", || async {
//!         // One call to the database per stampede, cluster-wide.
//!         Ok::<_, std::io::Error>(User { id: 42, name: "Ada".into() })
//!     })
//!     .await?;
//! assert_eq!(user.name, "Ada");
//! // An L1 hit hands out the value decoded the first time: no decode, no allocation of a `User`.
//! let again = users.get_or_load("user:42", || async { Err(std::io::Error::other("not called")) });
//! assert!(std::sync::Arc::ptr_eq(&user, &again.await?));
//! # Ok(())
//! # }
//! ```
//!
//! # What a stored value carries
//!
//! Each value is stored as an 8-byte **schema tag**, then the codec's bytes. The tag is a hash
//! of the codec's [`name`](Codec::name), the schema name (by default
//! [`std::any::type_name`] of `T`) and the [schema version](Typed::schema_version). A stored
//! value whose tag is not this handle's, or whose bytes the codec cannot decode as `T` in full
//! (another deploy's struct, another program's bytes, truncated bytes), is a miss: counted in
//! [`Stats::corrupt_entries`](super::Stats::corrupt_entries) (and the
//! `stampede_corrupt_entries_total` metric), reloaded with this call's loader and
//! overwritten. It is never an error and never a panic. So when two deploys with different
//! `T` share a namespace, each reads only its own values; the other's cost one load and are
//! overwritten, and the last write wins.
//!
//! The limits of the tag: `type_name` is not guaranteed stable across compiler versions (a new
//! compiler may make every value a miss, once), and it does not change when a struct's fields
//! do. A compact format such as postcard stores no field names, so a changed struct may still
//! decode, as the wrong values (a `u32` field that became a `u64` reads the same bytes). Give
//! each type an explicit [`schema_version`](Typed::schema_version), and bump it with every
//! change of its shape; [`schema_name`](Typed::schema_name) replaces `type_name` with a name
//! of your own (then a rename or a compiler upgrade costs nothing).
//!
//! # Decoding
//!
//! A value is decoded when it comes from the store (once to check it, once for the caller) or
//! from a load, and kept with its L1 entry (or, if that entry was not there yet, by the first
//! L1 hit on it): the hits after it hand out the same `Arc<T>` without decoding. It lives and
//! dies with the entry, so it never outlives an invalidation.
//!
//! # One type per key
//!
//! A key holds one type. Within one process, a key read both raw and typed (or as two types)
//! shares one L1 entry and one flight: a typed call that is handed bytes it cannot decode from
//! this process's L1 forgets the L1 entry and reads the store again, with its own loader if
//! it has not run yet; if that fails too, the call fails with [`ErrorKind::Decode`].

mod batch;
mod codec;

pub use codec::{Codec, Postcard};

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use self::codec::{decode, encode, TAG_LEN};
use super::engine::Cache;
use super::error::{BoxError, Error, ErrorKind};
use super::fetch::Ask;
use super::fetched::Fetched;
use super::loaded::Loaded;
use super::outcome::Outcome;
use crate::store::{KeyDigest, StoreKey};

/// A typed view of a [`Cache`], made by [`Cache::typed`]; see the [module docs](self).
///
/// Cheap to clone (it shares the cache); make it once rather than per call, since making it
/// hashes the schema tag.
pub struct Typed<T, C = Postcard> {
    pub(super) cache: Cache,
    pub(super) codec: C,
    schema_name: Option<Arc<str>>,
    schema_version: u32,
    pub(super) tag: [u8; TAG_LEN],
    value: PhantomData<fn() -> T>,
}

impl<T, C: Clone> Clone for Typed<T, C> {
    fn clone(&self) -> Self {
        Typed {
            cache: self.cache.clone(),
            codec: self.codec.clone(),
            schema_name: self.schema_name.clone(),
            schema_version: self.schema_version,
            tag: self.tag,
            value: PhantomData,
        }
    }
}

impl<T, C: Codec> fmt::Debug for Typed<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Typed")
            .field("codec", &self.codec.name())
            .field("schema_name", &self.name())
            .field("schema_version", &self.schema_version)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// A typed handle on this cache, for values of `T` encoded with [`Postcard`]; see the
    /// [`typed`](super::typed) module.
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn typed<T>(&self) -> Typed<T> {
        let mut typed = Typed {
            cache: self.clone(),
            codec: Postcard,
            schema_name: None,
            schema_version: 0,
            tag: [0; TAG_LEN],
            value: PhantomData,
        };
        typed.tag = typed.compute_tag();
        typed
    }
}

impl<T, C: Codec> Typed<T, C> {
    /// The schema version of `T` (0 by default), part of every value's schema tag: bump it
    /// whenever `T` changes shape, so that the values of the old shape become misses.
    #[must_use]
    pub fn schema_version(mut self, version: u32) -> Self {
        self.schema_version = version;
        self.tag = self.compute_tag();
        self
    }

    /// A name for `T` in the schema tag, in place of [`std::any::type_name`] (which may
    /// change with the compiler, or when the type is renamed or moved).
    #[must_use]
    pub fn schema_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.schema_name = Some(name.into());
        self.tag = self.compute_tag();
        self
    }

    /// The same handle with another codec.
    pub fn codec<D: Codec>(self, codec: D) -> Typed<T, D> {
        let mut typed = Typed {
            cache: self.cache,
            codec,
            schema_name: self.schema_name,
            schema_version: self.schema_version,
            tag: [0; TAG_LEN],
            value: PhantomData,
        };
        typed.tag = typed.compute_tag();
        typed
    }

    fn name(&self) -> &str {
        self.schema_name
            .as_deref()
            .unwrap_or_else(|| std::any::type_name::<T>())
    }

    fn compute_tag(&self) -> [u8; TAG_LEN] {
        let mut hash = Sha256::new();
        for part in ["tower-stampede typed/1", self.codec.name(), self.name()] {
            // Each part's length first, so no two lists of parts hash alike.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        hash.update(self.schema_version.to_be_bytes());
        let digest = hash.finalize();
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&digest[..TAG_LEN]);
        tag
    }
}

impl<T, C> Typed<T, C>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
    C: Codec,
{
    /// The value of `key`, as [`Cache::get_or_load`] finds it (L1, a flight, the store, or
    /// `loader`, run at most once per stampede across every process), decoded as `T`. The
    /// value is stored for the cache's default [`ttl`](super::CacheBuilder::ttl).
    ///
    /// A stored value that is not a `T` of this schema is a miss, reloaded and overwritten.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load`]; [`ErrorKind::Load`] also when the codec cannot encode the
    /// loaded value, and [`ErrorKind::Decode`] when this process holds the key as another type
    /// (see [One type per key](self#one-type-per-key)).
    pub async fn get_or_load<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Arc<T>, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let load = move || async move { loader().await.map(Loaded::value) };
        self.get_or_load_with(key, load).await
    }

    /// Like [`get_or_load`](Self::get_or_load), with a loader that says how to keep its value
    /// ([`Loaded`]: its own TTL, tags, stale windows, TTL jitter), answered with the value
    /// itself, as [`Cache::get_or_load_with`] is. A loader that answers [`Loaded::pass`] fails
    /// the call with [`ErrorKind::Pass`]: use [`fetch`](Self::fetch) to tell a pass from a value.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let names = cache.typed::<String>();
    /// let name = names
    ///     .get_or_load_with("user:42:name", || async {
    ///         let name = String::from("Ada");
    ///         Ok::<_, std::io::Error>(Loaded::value_with_ttl(name, Duration::from_secs(300)).tags(["users"]))
    ///     })
    ///     .await?;
    /// assert_eq!(*name, "Ada");
    /// cache.invalidate_tag("users").await?;
    /// assert_eq!(names.get("user:42:name").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load), and [`ErrorKind::Pass`] for a pass.
    pub async fn get_or_load_with<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Arc<T>, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded<T>, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch(key, loader).await?.value_or_pass()
    }

    /// Like [`get_or_load`](Self::get_or_load), with a loader that says how to keep its value,
    /// as [`Cache::fetch`]'s does: its own TTL ([`Loaded::value_with_ttl`]), tags, stale
    /// windows, TTL jitter, or not at all ([`Loaded::pass`]); and an answer that tells how the
    /// call was served ([`Outcome`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let names = cache.typed::<String>();
    /// let load = || async {
    ///     let name = String::from("Ada");
    ///     Ok::<_, std::io::Error>(
    ///         Loaded::value_with_ttl(name, Duration::from_secs(300))
    ///             .tags(["users"])
    ///             .stale_while_revalidate(Duration::from_secs(30)),
    ///     )
    /// };
    /// let fetched = names.fetch("user:42:name", load).await?;
    /// assert_eq!(fetched.outcome(), Outcome::Leader);
    /// assert_eq!(fetched.value().map(|name| name.as_str()), Some("Ada"));
    /// cache.invalidate_tag("users").await?;
    /// assert_eq!(names.get("user:42:name").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load); a pass is an answer without a value, not an
    /// error.
    pub async fn fetch<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Fetched<Arc<T>>, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded<T>, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let digest = KeyDigest::of(key.as_ref());
        let read = |bytes: &Bytes| decode::<T, C>(&self.codec, self.tag, bytes);
        if let Some(found) = self.cache.l1_hit(&digest, read, Arc::clone) {
            return Ok(Fetched {
                value: Some(found.value),
                outcome: Outcome::L1Hit,
                fresh_until: Some(found.fresh_until),
                handoff: None,
            });
        }
        // The loader is taken by whichever attempt loads; a second attempt is rare.
        let loader = Arc::new(Mutex::new(Some(loader)));
        for attempt in 0..2 {
            let (codec, tag, loader) = (self.codec.clone(), self.tag, Arc::clone(&loader));
            let load = move |_| async move {
                let loader = crate::sync::lock(&loader)
                    .take()
                    .ok_or("the loader already ran in a first attempt")?;
                let loaded = loader().await.map_err(Into::into)?;
                loaded.try_map(|value| encode(&codec, tag, &value))
            };
            let ask = Ask::digest(digest, key.as_ref()).accepting(self.accepts());
            let fetched = self.cache.fetch_shared(ask, load).await?;
            let decoded = |value| Fetched {
                value,
                outcome: fetched.outcome,
                fresh_until: fetched.fresh_until,
                handoff: None,
            };
            let Some(bytes) = &fetched.value else {
                return Ok(decoded(None));
            };
            if let Some(value) = read(bytes).map(Arc::new) {
                self.cache
                    .inner
                    .parts
                    .l1
                    .keep_decoded(&digest, bytes, &value);
                return Ok(decoded(Some(value)));
            }
            if attempt == 0 {
                // Another reader's bytes, from this process's L1 or flight.
                self.cache.inner.parts.corrupt_entry(&digest);
                let key = StoreKey::new(Arc::clone(&self.cache.inner.parts.namespace), digest);
                self.cache.inner.parts.l1.forget_changed(&key);
            }
        }
        Err(Error::new(ErrorKind::Decode))
    }

    /// The value of `key` as `T`, if a fresh one is cached, as [`Cache::get`] finds it: from
    /// L1 (decoded once, as for [`get_or_load`](Self::get_or_load)), else from the store;
    /// never loaded, never locked. A value that is not a `T` of this schema is `None`.
    ///
    /// # Errors
    ///
    /// As [`Cache::get`].
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Arc<T>>, Error> {
        let digest = KeyDigest::of(key.as_ref());
        let read = |bytes: &Bytes| decode::<T, C>(&self.codec, self.tag, bytes);
        if let Some(found) = self.cache.l1_hit(&digest, read, Arc::clone) {
            return Ok(Some(found.value));
        }
        let peeked = self.cache.peek(digest, self.accepts()).await;
        let Some(bytes) = peeked.map_err(Error::store)? else {
            return Ok(None);
        };
        let value = read(&bytes).map(Arc::new);
        if let Some(value) = &value {
            self.cache
                .inner
                .parts
                .l1
                .keep_decoded(&digest, &bytes, value);
        }
        Ok(value)
    }

    /// Writes `value` for `key`, fresh for `ttl`, as [`Cache::set`] does.
    ///
    /// # Errors
    ///
    /// As [`Cache::set`]; [`ErrorKind::Load`] when the codec cannot encode `value`.
    pub async fn set(&self, key: impl AsRef<[u8]>, value: &T, ttl: Duration) -> Result<(), Error> {
        let bytes = encode(&self.codec, self.tag, value).map_err(Error::load)?;
        self.cache.set(key, bytes, ttl).await
    }

    /// Removes the value of `key` everywhere, as [`Cache::invalidate`] does.
    ///
    /// # Errors
    ///
    /// As [`Cache::invalidate`].
    pub async fn invalidate(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        self.cache.invalidate(key).await
    }

    /// Which stored values this handle reads: its schema tag, then a whole `T`.
    pub(super) fn accepts(&self) -> impl Fn(&Bytes) -> bool + Send + Sync + 'static {
        let (codec, tag) = (self.codec.clone(), self.tag);
        move |bytes: &Bytes| decode::<T, C>(&codec, tag, bytes).is_some()
    }
}

impl<T, C> Typed<T, C>
where
    T: Serialize + DeserializeOwned,
    C: Codec,
{
    /// The cache this handle reads and fills.
    pub(crate) fn cache(&self) -> &Cache {
        &self.cache
    }

    /// `value` as this handle stores it: its schema tag, then the codec's bytes.
    pub(crate) fn encode_value(&self, value: &T) -> Result<Bytes, BoxError> {
        encode(&self.codec, self.tag, value)
    }

    /// The `T` in `bytes`, if they hold a value of this handle's schema.
    pub(crate) fn decode_value(&self, bytes: &[u8]) -> Option<T> {
        decode(&self.codec, self.tag, bytes)
    }
}
