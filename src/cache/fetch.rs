//! The calls a newcomer needs first ([`Cache::get_or_load`], [`Cache::fetch`]), and the way
//! every call reaches the engine once its public entry point has its key: the L1 hit
//! counted and traced without a task, and the fetch with its span (for a subscriber that wants
//! it, with the key as text where the cache shows readable keys), its outcome counted.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::{debug, debug_span, info_span, Instrument};

use super::engine::{Cache, L1Found};
use super::error::{BoxError, Error};
use super::fetched::{Fetched, Own};
use super::loaded::{Loaded, Previous};
use super::outcome::Outcome;
use crate::store::KeyDigest;

impl Cache {
    /// The value of `key`: from L1, from the store, or from `loader`, run at most once per
    /// stampede across every process that shares the store. The value is stored for the
    /// cache's default [`ttl`](crate::CacheBuilder::ttl).
    ///
    /// `loader` runs in its own task, so it finishes and fills the cache even if this call is
    /// dropped. Callers that shared a failed load share its error.
    pub async fn get_or_load<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Bytes, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let load = move || async move { loader().await.map(Loaded::value) };
        self.get_or_load_with(key, load).await
    }

    /// Like [`get_or_load`](Self::get_or_load), with a loader that chooses each value's TTL or
    /// declares its result not cacheable ([`Loaded::pass`]), and an answer that tells how the
    /// call was served ([`Outcome`]).
    pub async fn fetch<F, Fut, E>(&self, key: impl AsRef<[u8]>, loader: F) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch_shared(Ask::key(key.as_ref()), move |_| loader())
            .await
    }

    /// Like [`get_or_load`](Self::get_or_load), with a loader that says how to keep its value
    /// ([`Loaded`]: its own TTL, tags, stale windows, TTL jitter), answered with the value
    /// itself. A loader that answers [`Loaded::pass`] fails the call with
    /// [`ErrorKind::Pass`](super::ErrorKind::Pass): use [`fetch`](Self::fetch) to tell a pass from a value.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let row = cache
    ///     .get_or_load_with("user:42", || async {
    ///         let row = Bytes::from("Ada");
    ///         Ok::<_, std::io::Error>(Loaded::value_with_ttl(row, Duration::from_secs(300)).tags(["users"]))
    ///     })
    ///     .await?;
    /// assert_eq!(row, "Ada");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Self::get_or_load), and [`ErrorKind::Pass`](super::ErrorKind::Pass) for a pass.
    pub async fn get_or_load_with<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Bytes, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch(key, loader).await?.value_or_pass()
    }

    /// Like [`fetch`](Self::fetch), with a loader that revalidates: when the store still keeps
    /// the value it reloads (past its freshness, within its stale windows or
    /// [`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)), the loader is handed
    /// it as a [`Previous`], and may answer [`Loaded::not_modified`] (a conditional request
    /// that the backend answered "unchanged"): the value is then fresh again for every
    /// process, its bytes not sent to the store again, and the call's outcome is
    /// [`Outcome::Revalidated`]. It is still one load per stampede, across processes: the
    /// loader runs under the reload lock as any load does, and followers get the renewed
    /// value. Without a previous value the loader loads as any other.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// # tokio::time::pause();
    /// let cache = Cache::builder(MemoryStore::new())
    ///     .ttl(Duration::from_secs(60))
    ///     .keep_for_revalidation(Duration::from_secs(3600))
    ///     .build();
    /// // The backend's version of the document, as an `ETag` would say it.
    /// let revalidate = |previous: Option<tower_stampede::Previous>| async move {
    ///     match previous {
    ///         Some(previous) if previous.value().as_ref() == b"v1" => Ok(Loaded::not_modified()),
    ///         _ => Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v1"))),
    ///     }
    /// };
    /// let first = cache.fetch_revalidating("doc", revalidate).await?;
    /// assert_eq!(first.outcome(), Outcome::Leader);
    /// tokio::time::advance(Duration::from_secs(61)).await; // stale now
    /// let again = cache.fetch_revalidating("doc", revalidate).await?;
    /// assert_eq!(again.outcome(), Outcome::Revalidated);
    /// assert_eq!(again.value().map(|v| &v[..]), Some(&b"v1"[..]));
    /// # Ok(()) }
    /// ```
    pub async fn fetch_revalidating<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch_shared(Ask::key(key.as_ref()), loader).await
    }

    /// Like [`fetch`](Self::fetch), with this call's own soft timeout in place of the
    /// cache's ([`CacheBuilder::soft_timeout`](crate::CacheBuilder::soft_timeout)): where a stale value is there to answer
    /// with, this call gets it once its reload has taken `soft_timeout`, and the reload
    /// goes on and fills the cache for everyone. A call that joins a flight of this process
    /// already in progress shares that flight's soft timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// # tokio::time::pause();
    /// let cache = Cache::builder(MemoryStore::new())
    ///     .stale_if_error(Duration::from_secs(3600))
    ///     .build();
    /// let load = |value: &'static [u8]| move || async move {
    ///     tokio::time::sleep(Duration::from_millis(500)).await; // a slow backend
    ///     Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(value)))
    /// };
    /// cache.fetch("report", load(b"v1")).await?;
    /// cache.expire("report").await?; // stale now
    /// let soft = Duration::from_millis(50);
    /// let answer = cache.fetch_with_soft_timeout("report", soft, load(b"v2")).await?;
    /// assert_eq!(answer.outcome(), Outcome::Stale);
    /// assert_eq!(answer.value().map(|v| &v[..]), Some(&b"v1"[..]));
    /// # Ok(()) }
    /// ```
    pub async fn fetch_with_soft_timeout<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        soft_timeout: Duration,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let ask = Ask::key(key.as_ref()).soft_timeout(soft_timeout);
        self.fetch_shared(ask, move |_| loader()).await
    }

    /// The one way into the engine of every call of one key, which the calls above, typed
    /// handles and both layers are thin wrappers around: the fetch `ask` describes, traced
    /// and counted, with a `loader` that gives what it shares with the flight and, beside it,
    /// what goes to this caller alone if its loader runs ([`Own`]). (A batch's keys that it
    /// does not lead go to the flights within the batch's own call.)
    pub(crate) async fn fetch_as<A, F, Fut, E, O>(
        &self,
        ask: Ask<'_, A>,
        loader: F,
    ) -> (Result<Fetched, Error>, Own<O>)
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<Loaded, E>, Option<O>)> + Send + 'static,
        E: Into<BoxError>,
        O: Send + 'static,
    {
        let Ask {
            digest,
            name,
            soft_timeout,
            accepts,
        } = ask;
        let soft_timeout = soft_timeout.or(self.inner.parts.loads.soft_timeout);
        // A span to enter, record and time only for a subscriber that wants it (see
        // `fetch_span`), with the moment the fetch started.
        let name = (self.inner.readable_keys && !name.is_empty()).then_some(name);
        let traced = fetch_span(&digest, name).map(|span| (span, Instant::now()));
        let fetch = self.fetch_digest(digest, soft_timeout, accepts, loader);
        let (answer, own) = match &traced {
            Some((span, _)) => fetch.instrument(span.clone()).await,
            None => fetch.await,
        };
        if let Ok(fetched) = &answer {
            self.inner.parts.counters.answered(fetched.outcome);
            self.inner.parts.meter.outcome(fetched.outcome);
        }
        if let Some((span, started)) = &traced {
            span.record(
                "outcome",
                answer
                    .as_ref()
                    .map_or("error", |fetched| fetched.outcome.label()),
            );
            // An L1 hit waited for nothing.
            if !matches!(&answer, Ok(fetched) if fetched.outcome == Outcome::L1Hit) {
                span.record("wait_ms", started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        if let Err(error) = &answer {
            let span = traced.as_ref().and_then(|(span, _)| span.id());
            debug!(parent: span, error = error as &dyn std::error::Error, "no value");
        }
        (answer, own)
    }

    /// [`fetch_as`](Self::fetch_as) for a loader that gives its caller nothing beyond what it
    /// shares: the answer alone.
    pub(crate) async fn fetch_shared<A, F, Fut, E>(
        &self,
        ask: Ask<'_, A>,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        A: Fn(&Bytes) -> bool + Send + Sync + 'static,
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let loader = move |previous| {
            let load = loader(previous);
            async move { (load.await, None::<()>) }
        };
        self.fetch_as(ask, loader).await.0
    }

    /// What `read` makes of the value of the key hashed to `digest`, if L1 holds the value
    /// with nothing more to do (no early refresh due) and `read` can answer with it (`Some`):
    /// then counted and traced as any L1 hit. `read` runs once per L1 entry: its answer is
    /// kept with the entry and shared by the hits after it. Else `None`, nothing is counted,
    /// and the caller goes on to the fetch with the same digest.
    /// For a caller that has work to do before a fetch that may load (the layer wraps its
    /// request into a loader): a hit skips that work.
    ///
    /// A thread that hits a key keeps the entry in view, with `local`'s copy of the decoded
    /// value, and answers its next hits on it from there, as long as L1 is not written: a
    /// copy whose buffers this thread alone counts references to (the HTTP layer's fields and
    /// body), or `Arc::clone` to share the one value.
    pub(crate) fn l1_hit<T: std::any::Any + Send + Sync>(
        &self,
        digest: &KeyDigest,
        read: impl FnOnce(&Bytes) -> Option<T>,
        local: impl FnOnce(&Arc<T>) -> Arc<T>,
    ) -> Option<L1Found<T>> {
        let (value, fresh_until, read_at) = self.inner.parts.l1_decoded(digest, read, local)?;
        let found = L1Found {
            value,
            fresh_until,
            read_at,
        };
        self.inner.parts.counters.answered(Outcome::L1Hit);
        self.inner.parts.meter.outcome(Outcome::L1Hit);
        if let Some(span) = fetch_span(digest, None) {
            span.record("outcome", Outcome::L1Hit.label());
        }
        Some(found)
    }
}

/// A fetch as an entry point asks for it: the key (hashed, with its text for traces), the
/// call's soft timeout, and which stored values its caller can read.
pub(crate) struct Ask<'a, A> {
    digest: KeyDigest,
    /// The key's text, shown in the fetch's trace where the cache has
    /// [`readable_keys`](crate::CacheBuilder::readable_keys); empty for a caller that has none (the
    /// service layer, which hashed its key).
    name: &'a [u8],
    /// This call's own soft timeout; `None`: the cache's (see [`CacheBuilder::soft_timeout`](crate::CacheBuilder::soft_timeout)).
    soft_timeout: Option<Duration>,
    /// Whether this call's caller can read a stored value: any other is a corrupt entry (a
    /// miss, counted and overwritten by this load).
    accepts: A,
}

/// A caller that reads any value.
pub(crate) type AnyValue = fn(&Bytes) -> bool;

impl<'a> Ask<'a, AnyValue> {
    /// A fetch of `key`, whose value its caller reads whatever it is.
    pub(crate) fn key(key: &'a [u8]) -> Self {
        Ask::digest(KeyDigest::of(key), key)
    }

    /// A fetch of the key hashed to `digest`, whose text is `name`.
    pub(crate) fn digest(digest: KeyDigest, name: &'a [u8]) -> Self {
        Ask {
            digest,
            name,
            soft_timeout: None,
            accepts: |_| true,
        }
    }
}

impl<'a, A> Ask<'a, A> {
    /// The same fetch, by a caller that reads only the values `accepts` says yes to.
    pub(crate) fn accepting<B>(self, accepts: B) -> Ask<'a, B> {
        Ask {
            digest: self.digest,
            name: self.name,
            soft_timeout: self.soft_timeout,
            accepts,
        }
    }

    /// The same fetch, with its own soft timeout.
    pub(crate) fn soft_timeout(self, soft_timeout: Duration) -> Self {
        Ask {
            soft_timeout: Some(soft_timeout),
            ..self
        }
    }
}

/// The span of one fetch of `digest` (its outcome, and how long a caller that did not hit L1
/// waited), if a subscriber wants it. A disabled span is not kept: with `tracing`'s `log`
/// feature (which `axum` turns on), even a disabled span asks the logger at each poll and
/// record. Nor is a span built where no subscriber takes `DEBUG` (one atomic load): the macro
/// would still format its fields for `log` (a bare "stampede.fetch" line, without its
/// outcome), on every L1 hit too.
///
/// With the key's text (`name`, given only where the cache shows readable keys), the span is
/// at `INFO`, so the warnings logged inside it carry the key under a default subscriber.
fn fetch_span(digest: &KeyDigest, name: Option<&[u8]>) -> Option<tracing::Span> {
    let level = if name.is_some() {
        tracing::Level::INFO
    } else {
        tracing::Level::DEBUG
    };
    if level > tracing::level_filters::LevelFilter::current() {
        return None;
    }
    let span = match name {
        Some(name) => info_span!(
            "stampede.fetch",
            key = %digest,
            key_text = ?KeyText(name),
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        ),
        None => debug_span!(
            "stampede.fetch",
            key = %digest,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        ),
    };
    (!span.is_disabled()).then_some(span)
}

/// A key's bytes for a log line: UTF-8 (invalid bytes replaced), cut at 256 bytes, and
/// quoted with control characters escaped, so a hostile key cannot forge log lines.
struct KeyText<'a>(&'a [u8]);

impl std::fmt::Debug for KeyText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 256;
        let shown = &self.0[..self.0.len().min(SHOWN)];
        write!(f, "{:?}", String::from_utf8_lossy(shown))?;
        if self.0.len() > SHOWN {
            write!(f, "...({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}
