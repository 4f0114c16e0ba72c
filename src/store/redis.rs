//! `RedisStore`: the shared store on Redis, one Lua script per call.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, Script, Value};
use tracing::{debug, warn};

use super::{
    millis, BoxFuture, FillWatch, KeyDigest, LockState, LockToken, Lookup, Notifier, Store,
    StoreError, StoreKey, Stored,
};

/// Get the value; if absent or about to expire, try to take the lock. A value of a foreign type
/// (`WRONGTYPE`) counts as absent, so the fill overwrites it. Reply: `{value, pttl, state}` with
/// `pttl = -2` when absent and state 0 = not requested, 1 = acquired, 2 = held elsewhere,
/// 3 = held by the marker of a failed load.
static LOOKUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then v = false end
local ttl = -2
if v then
  ttl = redis.call('PTTL', KEYS[1])
  if ttl > tonumber(ARGV[3]) then return {v, ttl, 0} end
else
  v = ''
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {v, ttl, 1} end
if redis.call('GET', KEYS[2]) == 'failed' then return {v, ttl, 3} end
return {v, ttl, 2}
",
    )
});

/// Fenced write: store the value only while the lock holds our token, then drop the lock and
/// publish "filled" (`ARGV[4]` is the channel, `ARGV[5]` the key's digest).
static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
",
    )
});

/// Compare-and-delete of the lock, then publish "filled" so followers retry at once.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
",
    )
});

/// Compare-and-replace of the lock by the failure marker (`failed`, which no token equals: tokens
/// are hex), then publish so followers fail at once.
static FAIL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'failed', 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
",
    )
});

/// Unfenced write of the value, then publish "filled".
static PUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
",
    )
});

/// Compare-and-PEXPIRE of the lock.
static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
",
    )
});

/// The value and its remaining life, in one round trip. Reply: `{value, pttl}`.
static GET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return {'', -2} end
return {v, redis.call('PTTL', KEYS[1])}
",
    )
});

/// The shared store on Redis (feature `redis`, on by default).
///
/// Every [`Store`] call is one `EVALSHA` of a Lua script (re-sent as `EVAL` if the server lost
/// its script cache), over a [`ConnectionManager`] that reconnects by itself. The value and
/// lock keys of one logical key share a hash tag, so each script touches one Redis Cluster slot.
///
/// `Debug` shows the server's address without user name or password.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_stampede::store::StoreError> {
/// use tower_stampede::{store::RedisStore, Cache};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let cache = Cache::builder(store).namespace("my-app").build();
/// # let _ = cache; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    address: String,
    notifications: Option<Notifications>,
}

/// The process's one subscriber connection (RESP3, resubscribing by itself after a
/// reconnect) and the followers it wakes.
#[derive(Clone)]
struct Notifications {
    subscriber: ConnectionManager,
    notifier: Notifier,
    /// Namespaces whose channel is subscribed (or being subscribed).
    channels: Arc<Mutex<HashSet<Arc<str>>>>,
}

/// The channel on which fills and releases of a namespace's keys are published.
fn channel(namespace: &str) -> String {
    format!("{namespace}:filled")
}

impl Notifications {
    async fn connect(url: &str, config: ConnectionManagerConfig) -> redis::RedisResult<Self> {
        let info = url.into_connection_info()?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let notifier = Notifier::new();
        let channels: Arc<Mutex<HashSet<Arc<str>>>> = Arc::default();
        let (wake, forget) = (notifier.clone(), Arc::clone(&channels));
        let config = config
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    // The connection resubscribes when it reconnects, but it reconnects only
                    // when it is used: forget the channels, so the next watch subscribes again
                    // (and so reconnects). Meanwhile, followers poll.
                    forget
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clear();
                } else {
                    wake_followers(&wake, push);
                }
                Ok::<(), std::convert::Infallible>(())
            })
            .set_automatic_resubscription();
        // Keep trying to reconnect the subscriber through an outage of any length.
        let config = config.set_number_of_retries(usize::MAX);
        let subscriber = ConnectionManager::new_with_config(client, config).await?;
        Ok(Notifications {
            subscriber,
            notifier,
            channels,
        })
    }

    /// Subscribes to a namespace's channel the first time one of its keys is watched. Until
    /// the subscription is in place, followers of that namespace poll.
    fn ensure_subscribed(&self, namespace: &str) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if channels.contains(namespace) {
            return;
        }
        let namespace: Arc<str> = Arc::from(namespace);
        channels.insert(Arc::clone(&namespace));
        let (mut subscriber, channels) = (self.subscriber.clone(), Arc::clone(&self.channels));
        tokio::spawn(async move {
            if let Err(error) = subscriber.subscribe(channel(&namespace)).await {
                warn!(%error, %namespace, "cannot subscribe to fill notifications; followers poll");
                // Forget it, so the next watch tries again.
                channels
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&namespace);
            }
        });
    }
}

/// A pub/sub message `[channel, digest]` wakes the followers of that key in this process.
fn wake_followers(notifier: &Notifier, push: PushInfo) {
    if push.kind != PushKind::Message {
        return;
    }
    let [Value::BulkString(channel), Value::BulkString(digest)] = push.data.as_slice() else {
        return;
    };
    let namespace = std::str::from_utf8(channel)
        .ok()
        .and_then(|c| c.strip_suffix(":filled"));
    let digest = std::str::from_utf8(digest)
        .ok()
        .and_then(KeyDigest::from_hex);
    if let (Some(namespace), Some(digest)) = (namespace, digest) {
        notifier.notify(&StoreKey::new(Arc::from(namespace), digest));
    } else {
        debug!("ignored a foreign message on a fill channel");
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`].
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    connection_timeout: Duration,
    response_timeout: Duration,
    notifications: bool,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &redact(&self.url))
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("notifications", &self.notifications)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// How long one attempt to connect may take. Default: 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the connection waits for one reply before it gives up on it. Default: 1 s.
    ///
    /// This is a backstop: the engine bounds every store call with its own, shorter timeout
    /// ([`CacheBuilder::store_timeout`](crate::CacheBuilder::store_timeout)).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Whether to open the subscriber connection that wakes followers when a key is filled
    /// (one per store, shared by its clones). Without it followers only poll. Default: on.
    pub fn notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// Connects to Redis; fails if the URL is invalid or the server cannot be reached.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let address = redact(&self.url);
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| StoreError::new(format_args!("invalid Redis URL {address}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let connection = ConnectionManager::new_with_config(client, config.clone())
            .await
            .map_err(|e| StoreError::new(format_args!("cannot connect to {address}: {e}")))?;
        let notifications = if self.notifications {
            match Notifications::connect(&self.url, config).await {
                Ok(notifications) => Some(notifications),
                Err(error) => {
                    warn!(%error, %address, "no fill notifications (needs RESP3, Redis 6+); followers poll");
                    None
                }
            }
        } else {
            None
        };
        Ok(RedisStore {
            connection,
            address,
            notifications,
        })
    }
}

impl RedisStore {
    /// A builder for a store at `url` (`redis://[user:password@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            notifications: true,
        }
    }

    /// Connects to the Redis at `url` with default settings.
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// The server's address, without user name, password or query.
    pub fn address(&self) -> &str {
        &self.address
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key.as_str());
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let mut connection = self.connection.clone();
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|e| StoreError::new(format_args!("Redis at {}: {e}", self.address)))
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("address", &self.address)
            .field("notifications", &self.notifications.is_some())
            .finish()
    }
}

/// A stored value from a `{value, pttl}` reply; `pttl` -2 means absent, -1 no expiry.
fn stored(value: Vec<u8>, pttl: i64) -> Option<Stored> {
    (pttl != -2).then(|| Stored {
        bytes: Bytes::from(value),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}

impl Store for RedisStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        refresh_below: Duration,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        let keys = [key.value_name(), key.lock_name()];
        let token = token.to_hex();
        let lock_ttl = millis(lock_ttl).to_string();
        let refresh_below = u64::try_from(refresh_below.as_millis())
            .unwrap_or(u64::MAX)
            .to_string();
        Box::pin(async move {
            let (value, pttl, state): (Vec<u8>, i64, i64) = self
                .run(
                    &LOOKUP,
                    &keys,
                    &[
                        token.as_bytes(),
                        lock_ttl.as_bytes(),
                        refresh_below.as_bytes(),
                    ],
                )
                .await?;
            let lock = match state {
                0 => LockState::NotRequested,
                1 => LockState::Acquired,
                2 => LockState::HeldElsewhere,
                3 => LockState::Failed,
                other => {
                    return Err(StoreError::new(format_args!(
                        "unexpected lock state {other} from Redis at {}",
                        self.address
                    )))
                }
            };
            Ok(Lookup {
                value: stored(value, pttl),
                lock,
            })
        })
    }

    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let keys = [key.value_name(), key.lock_name()];
        let token = token.to_hex();
        let ttl = millis(ttl).to_string();
        let (channel, digest) = (channel(key.namespace()), key.digest().to_hex());
        Box::pin(async move {
            let args: [&[u8]; 5] = [
                token.as_bytes(),
                &value,
                ttl.as_bytes(),
                channel.as_bytes(),
                digest.as_bytes(),
            ];
            let filled: i64 = self.run(&FILL, &keys, &args).await?;
            Ok(filled == 1)
        })
    }

    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>> {
        let keys = [key.lock_name()];
        let token = token.to_hex();
        let (channel, digest) = (channel(key.namespace()), key.digest().to_hex());
        Box::pin(async move {
            let args: [&[u8]; 3] = [token.as_bytes(), channel.as_bytes(), digest.as_bytes()];
            let released: i64 = self.run(&RELEASE, &keys, &args).await?;
            Ok(released == 1)
        })
    }

    fn extend(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let keys = [key.lock_name()];
        let token = token.to_hex();
        let lock_ttl = millis(lock_ttl).to_string();
        Box::pin(async move {
            let extended: i64 = self
                .run(&EXTEND, &keys, &[token.as_bytes(), lock_ttl.as_bytes()])
                .await?;
            Ok(extended == 1)
        })
    }

    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let keys = [key.value_name()];
        let ttl = millis(ttl).to_string();
        let (channel, digest) = (channel(key.namespace()), key.digest().to_hex());
        Box::pin(async move {
            let args: [&[u8]; 4] = [
                &value,
                ttl.as_bytes(),
                channel.as_bytes(),
                digest.as_bytes(),
            ];
            let _: i64 = self.run(&PUT, &keys, &args).await?;
            Ok(())
        })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let keys = [key.value_name()];
        Box::pin(async move {
            let (value, pttl): (Vec<u8>, i64) = self.run(&GET, &keys, &[]).await?;
            Ok(stored(value, pttl))
        })
    }

    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let keys = [key.lock_name()];
        let token = token.to_hex();
        let failure_ttl = millis(failure_ttl).to_string();
        let (channel, digest) = (channel(key.namespace()), key.digest().to_hex());
        Box::pin(async move {
            let args: [&[u8]; 4] = [
                token.as_bytes(),
                failure_ttl.as_bytes(),
                channel.as_bytes(),
                digest.as_bytes(),
            ];
            let failed: i64 = self.run(&FAIL, &keys, &args).await?;
            Ok(failed == 1)
        })
    }

    fn subscribe(&self, key: &StoreKey) -> Option<FillWatch> {
        let notifications = self.notifications.as_ref()?;
        notifications.ensure_subscribed(key.namespace());
        Some(notifications.notifier.watch(key))
    }
}

/// The URL without user name or password, for `Debug` and error messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsable URL>".to_owned();
    };
    // User info first: a password may hold `/`, `?` or `#` unescaped, and the host, port and
    // database never hold an `@`, so the last `@` ends it. Then the query, which may carry
    // credentials too.
    let (hidden, host) = match rest.rsplit_once('@') {
        Some((_, host)) => ("***@", host),
        None => ("", rest),
    };
    let host = host.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{hidden}{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(
            redact("redis://user:s3cret@host:6379/2"),
            "redis://***@host:6379/2"
        );
        assert_eq!(redact("redis://:pw@host"), "redis://***@host");
        assert_eq!(redact("redis://host:1/"), "redis://host:1/");
        assert_eq!(redact("garbage"), "<unparsable URL>");
        assert_eq!(redact("redis://u:pa/ss@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1/0?password=x"), "redis://h:1/0");
        assert_eq!(redact("redis://user:pa?ss@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://user:pa#ss@h:1"), "redis://***@h:1");
        let builder = RedisStore::builder("rediss://u:hunter2@h:1");
        assert!(!format!("{builder:?}").contains("hunter2"));
    }

    #[test]
    fn absent_and_unexpiring_values() {
        assert_eq!(stored(Vec::new(), -2), None);
        assert_eq!(stored(b"x".to_vec(), -1).and_then(|s| s.ttl), None);
        assert_eq!(
            stored(b"x".to_vec(), 1500).and_then(|s| s.ttl),
            Some(Duration::from_millis(1500))
        );
    }
}
