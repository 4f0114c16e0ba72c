//! `RedisStore`: the shared store on Redis (one server or a Redis Cluster), one round trip per
//! call: pipelined plain commands for lookups and reads, Lua scripts for fenced writes.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, ProtocolVersion,
    PushInfo, PushKind, RedisResult, Script, ServerErrorKind, Value,
};
use tracing::{debug, warn};

use super::{
    millis, BoxFuture, FillWatch, KeyDigest, LockState, LockToken, Lookup, Notifier, Store,
    StoreError, StoreKey, Stored,
};

// The lock key of a value holds one of:
// - nothing: the value is stale or absent, and nobody reloads it: a lookup may take the lock;
// - `fresh`: the value is fresh (the marker expires when its freshness ends), so the lock is not
//   to be taken; this lets a plain `SET lock token NX GET` take the lock only when it should;
// - `<token>:<refresh below, ms>`: a leader's lock. The second part is the remaining life
//   below which a value counts as stale, which the fill uses to set the `fresh` marker;
// - `failed`: the last load failed (followers fail at once instead of each retrying).

/// Get the value; if absent or about to expire, try to take the lock (a `fresh` marker does not
/// stop it: this script also serves the lookups that take the lock before the value is stale).
/// A value of a foreign type (`WRONGTYPE`) counts as absent, so the fill overwrites it, and a
/// lock key of a foreign type counts as free. A lock that already holds `ARGV[1]` is ours: the
/// pipelined lookup took it before a `GET` of a foreign type failed. Reply:
/// `{value, pttl, state}` with `pttl = -2` when absent and state 0 = not requested,
/// 1 = acquired, 2 = held elsewhere, 3 = held by the marker of a failed load.
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
local l = redis.pcall('GET', KEYS[2])
if type(l) ~= 'string' or l == 'fresh' or l == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {v, ttl, 1}
end
if l == 'failed' then return {v, ttl, 3} end
return {v, ttl, 2}
",
    )
});

/// `owns(lock)`: whether the lock (`KEYS[2]` in `FILL`, `RELEASE`; `KEYS[1]` in the others) is
/// held by the token `ARGV[1]`, as `<token>:<refresh below>`, and the lock's value.
/// `settle(lock, l, life)`: replaces the held lock `l` by the `fresh` marker for as long as a
/// value with `life` ms left stays fresh (above the lock's refresh bound), or deletes it.
const OWNS: &str = r"
local function owns(lock)
  local l = redis.call('GET', lock)
  return l and string.sub(l, 1, 33) == ARGV[1] .. ':', l
end
local function settle(lock, l, life)
  local fresh = life - (tonumber(string.sub(l, 34)) or math.huge)
  if fresh >= 1 then
    redis.call('SET', lock, 'fresh', 'PX', fresh)
  else
    redis.call('DEL', lock)
  end
end
";

/// Fenced write: store the value only while the lock holds our token, then replace the lock
/// by the `fresh` marker for as long as the value is fresh, and publish "filled" (`ARGV[4]` is
/// the channel, `ARGV[5]` the key's digest).
static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{OWNS}{}",
        r"
local held, l = owns(KEYS[2])
if not held then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
settle(KEYS[2], l, tonumber(ARGV[3]))
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"
    ))
});

/// Compare-and-release of the lock: the `fresh` marker takes its place if the value is still
/// fresh, else the lock is deleted; then publish "filled" so followers retry at once.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{OWNS}{}",
        r"
local held, l = owns(KEYS[2])
if not held then return 0 end
settle(KEYS[2], l, redis.call('PTTL', KEYS[1]))
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"
    ))
});

/// Compare-and-replace of the lock by the failure marker (`failed`, which no lock equals),
/// then publish so followers fail at once.
static FAIL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{OWNS}{}",
        r"
if not owns(KEYS[1]) then return 0 end
redis.call('SET', KEYS[1], 'failed', 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"
    ))
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
    Script::new(&format!(
        "{OWNS}{}",
        r"
if not owns(KEYS[1]) then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"
    ))
});

/// The shared store on Redis (feature `redis`, on by default): one server, or a Redis Cluster
/// (feature `cluster`).
///
/// Every [`Store`] call is one round trip, over a connection that reconnects by itself.
/// Lookups and reads are pipelines of plain commands: a lookup sends `SET lock token NX PX …
/// GET`, `GET value` and `PTTL value` together. A filled value leaves a `fresh` marker in its
/// lock key for as long as it is fresh, so the `SET … NX` takes the lock only where the value
/// is stale or absent, and a hit costs the server about what a `GET` costs (a Lua script costs
/// several times more, and copies the value twice). Writes that must check the lock's owner
/// (fill, release, extend, fail) are Lua scripts, `EVALSHA`, re-sent after a `SCRIPT LOAD` if
/// the server lost its script cache; so are the rare lookups that take the lock from the marker
/// (early refresh, an evicted value), and every lookup on a server before Redis 7.0, which
/// lacks `SET … NX GET`. The value and lock keys of one logical key share a hash tag, so each
/// call touches one Redis Cluster slot and, on a cluster, goes to the node that serves it.
///
/// `Debug`, [`address`](Self::address) and error messages show the server's address without
/// user name or password.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_stampede::store::StoreError> {
/// use tower_stampede::{store::RedisStore, Cache};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let cache = Cache::builder(store).namespace("my-app").build();
/// # let _ = cache; Ok(()) }
/// ```
///
/// # Redis Cluster
///
/// With the `cluster` feature, `RedisStore::connect_cluster` (or `RedisStore::cluster_builder`)
/// takes the URLs of some of the cluster's nodes (seeds: one that answers is enough) and
/// discovers the rest. Every [`Store`] method works as on one server. Fill notifications use
/// classic pub/sub, which a cluster broadcasts to all its nodes: the store's subscriber listens
/// on the node that serves the channel's slot (and moves with that slot), and hears the fills of
/// keys on every node.
///
/// ```no_run
/// # #[cfg(feature = "cluster")]
/// # async fn run() -> Result<(), tower_stampede::store::StoreError> {
/// use tower_stampede::{store::RedisStore, Cache};
///
/// let store = RedisStore::connect_cluster([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])
/// .await?;
/// let cache = Cache::builder(store).namespace("my-app").build();
/// # let _ = cache; Ok(()) }
/// ```
///
/// # Secure connections
///
/// A user name and password in the URL (`redis://user:password@host:6379/` for an ACL user,
/// `redis://:password@host:6379/` for `requirepass`) authenticate every connection, the
/// subscriber's included. With the `tls` feature, `rediss://` URLs connect over TLS (rustls),
/// trusting the system's root certificates, or the ones given to
/// `RedisStoreBuilder::tls_root_certificates`.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    address: String,
    notifications: Option<Notifications>,
    /// Whether lookups pipeline plain commands (`SET … NX GET` needs Redis 7.0); cleared for
    /// good, in favour of the lookup script, when the server rejects it.
    pipelined: Arc<AtomicBool>,
}

/// A connection to one server or to a cluster; cheap to clone, never locked.
#[derive(Clone)]
enum Connection {
    /// One server, reconnecting by itself.
    Server(ConnectionManager),
    /// A Redis Cluster: each command goes to the node that serves its first key's slot
    /// (following `MOVED` and `ASK`); the connections to the nodes reconnect by themselves.
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
}

impl Connection {
    /// Runs `call`, an `EVALSHA` of `script`. A `NOSCRIPT` reply loads the script (on a
    /// cluster: on every node, as `SCRIPT LOAD` is routed to all of them) and runs it again.
    async fn invoke<T: FromRedisValue>(&self, script: &Script, call: &Cmd) -> RedisResult<T> {
        match self {
            Connection::Server(connection) => evalsha(script, call, &mut connection.clone()).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => evalsha(script, call, &mut connection.clone()).await,
        }
    }

    /// Runs a pipeline: its commands go out in one write and their replies come back together.
    async fn pipeline<T: FromRedisValue>(&self, pipeline: &Pipeline) -> RedisResult<T> {
        match self {
            Connection::Server(connection) => pipeline.query_async(&mut connection.clone()).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => pipeline.query_async(&mut connection.clone()).await,
        }
    }

    /// Subscribes to a channel (on a connection that speaks RESP3 and has a push sender).
    async fn subscribe(&self, channel: String) -> RedisResult<()> {
        match self {
            Connection::Server(connection) => connection.clone().subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => connection.clone().subscribe(channel).await,
        }
    }
}

async fn evalsha<T: FromRedisValue>(
    script: &Script,
    call: &Cmd,
    connection: &mut impl ConnectionLike,
) -> RedisResult<T> {
    match call.query_async(connection).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(connection).await?;
            call.query_async(connection).await
        }
        answer => answer,
    }
}

/// An `EVALSHA` of `script` on `keys`; the caller adds the arguments. Keys and arguments are
/// written straight into the command's one buffer.
fn script_call(script: &Script, keys: &[&str]) -> Cmd {
    // Room for the hash, the keys and a few small arguments without regrowing; a value
    // written into the call grows it once.
    let mut call = Cmd::with_capacity(8, 256);
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for key in keys {
        call.arg(*key);
    }
    call
}

/// Where a store connects, as the user gave it (credentials included: never print it).
#[derive(Clone)]
enum Target {
    /// One server's URL.
    Server(String),
    /// URLs of some of a cluster's nodes.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

impl Target {
    fn urls(&self) -> &[String] {
        match self {
            Target::Server(url) => std::slice::from_ref(url),
            #[cfg(feature = "cluster")]
            Target::Cluster(urls) => urls,
        }
    }

    /// The URLs without credentials, comma-separated.
    fn address(&self) -> String {
        let urls: Vec<String> = self.urls().iter().map(|url| redact(url)).collect();
        urls.join(",")
    }
}

/// The process's one subscriber connection (RESP3, resubscribing by itself after a
/// reconnect) and the followers it wakes.
#[derive(Clone)]
struct Notifications {
    subscriber: Connection,
    notifier: Notifier,
    /// Namespaces whose channel is subscribed (or being subscribed).
    channels: Arc<Mutex<HashSet<Arc<str>>>>,
}

/// The channel on which fills and releases of a namespace's keys are published.
fn channel(namespace: &str) -> String {
    format!("{namespace}:filled")
}

impl Notifications {
    async fn connect(builder: &RedisStoreBuilder, infos: &[ConnectionInfo]) -> RedisResult<Self> {
        let notifier = Notifier::new();
        let channels: Arc<Mutex<HashSet<Arc<str>>>> = Arc::default();
        let (wake, forget) = (notifier.clone(), Arc::clone(&channels));
        let on_push = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                // The connection resubscribes when it reconnects, but a single server's
                // reconnects only when it is used, and a cluster's may have to find the
                // channel's slot on another node: forget the channels, so the next watch
                // subscribes again (and so reconnects). Meanwhile, followers poll.
                crate::sync::lock(&forget).clear();
            } else {
                wake_followers(&wake, push);
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let subscriber = match &builder.target {
            Target::Server(_) => {
                let info = resp3(infos.first().cloned().ok_or_else(no_url)?);
                let config = builder
                    .manager_config()
                    .set_push_sender(on_push)
                    .set_automatic_resubscription()
                    // Keep trying to reconnect the subscriber through an outage of any length.
                    .set_number_of_retries(usize::MAX);
                let client = builder.client(info)?;
                // The manager retries without end, its first connection too: try once first,
                // so that a server that refuses RESP3 or these credentials means no
                // notifications (and a warning) instead of a `connect` that never returns.
                let probe = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(builder.connection_timeout))
                    .set_response_timeout(Some(builder.response_timeout));
                drop(
                    client
                        .get_multiplexed_async_connection_with_config(&probe)
                        .await?,
                );
                // Lazy: it connects on the first subscription.
                Connection::Server(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let infos = infos.iter().cloned().map(resp3);
                let client = builder
                    .cluster_client(infos)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(on_push)
                    .build()?;
                Connection::Cluster(client.get_async_connection().await?)
            }
        };
        Ok(Notifications {
            subscriber,
            notifier,
            channels,
        })
    }

    /// Subscribes to a namespace's channel the first time one of its keys is watched. Until
    /// the subscription is in place, followers of that namespace poll.
    fn ensure_subscribed(&self, namespace: &str) {
        let mut channels = crate::sync::lock(&self.channels);
        if channels.contains(namespace) {
            return;
        }
        let namespace: Arc<str> = Arc::from(namespace);
        channels.insert(Arc::clone(&namespace));
        let (subscriber, channels) = (self.subscriber.clone(), Arc::clone(&self.channels));
        tokio::spawn(async move {
            if let Err(error) = subscriber.subscribe(channel(&namespace)).await {
                warn!(%error, %namespace, "cannot subscribe to fill notifications; followers poll");
                // Forget it, so the next watch tries again.
                crate::sync::lock(&channels).remove(&namespace);
            }
        });
    }
}

/// The same connection settings, speaking RESP3 (which carries pub/sub messages as pushes).
fn resp3(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.set_redis_settings(settings)
}

fn no_url() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no URL given"))
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

/// Builds a [`RedisStore`]; see [`RedisStore::builder`] (one server) and
/// `RedisStore::cluster_builder` (a Redis Cluster, feature `cluster`).
#[must_use]
pub struct RedisStoreBuilder {
    target: Target,
    connection_timeout: Duration,
    response_timeout: Duration,
    notifications: bool,
    /// PEM root certificates to trust instead of the system's.
    #[cfg(feature = "tls")]
    root_certificates: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisStoreBuilder");
        match &self.target {
            Target::Server(_) => debug.field("url", &self.target.address()),
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => debug.field("cluster", &self.target.address()),
        };
        debug
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("notifications", &self.notifications);
        #[cfg(feature = "tls")]
        debug.field(
            "tls_root_certificates",
            &if self.root_certificates.is_some() {
                "set"
            } else {
                "not set"
            },
        );
        debug.finish()
    }
}

impl RedisStoreBuilder {
    fn new(target: Target) -> Self {
        RedisStoreBuilder {
            target,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            notifications: true,
            #[cfg(feature = "tls")]
            root_certificates: None,
        }
    }

    /// How long one attempt to connect may take. Default: 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the connection waits for one reply before it gives up on it. Default: 1 s.
    /// On a cluster, this bounds a call with its redirections and retries.
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

    /// Trusts these root certificates (PEM, one or more) for `rediss://` connections, instead
    /// of the system's: for a server whose certificate a private CA signed. Feature `tls`.
    ///
    /// The server's certificate must name the host of the URL (a DNS name or an IP address).
    /// Connecting fails if a URL is not `rediss://`, or if the PEM holds no certificate.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(pem.into());
        self
    }

    /// Connects to Redis; fails if a URL is invalid or no server can be reached.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let address = self.target.address();
        let infos = self.connection_infos()?;
        let connection = match &self.target {
            Target::Server(_) => {
                let info = infos.first().cloned().ok_or_else(no_url);
                let client = info.and_then(|info| self.client(info)).map_err(|e| {
                    StoreError::new(format_args!("invalid Redis settings for {address}: {e}"))
                })?;
                let connection = ConnectionManager::new_with_config(client, self.manager_config())
                    .await
                    .map_err(|e| {
                        StoreError::new(format_args!("cannot connect to {address}: {e}"))
                    })?;
                Connection::Server(connection)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(_) => {
                let client = self
                    .cluster_client(infos.iter().cloned())
                    .build()
                    .map_err(|e| {
                        StoreError::new(format_args!(
                            "invalid Redis Cluster settings for {address}: {e}"
                        ))
                    })?;
                let connection = client.get_async_connection().await.map_err(|e| {
                    StoreError::new(format_args!(
                        "cannot connect to the Redis Cluster at {address}: {e}"
                    ))
                })?;
                Connection::Cluster(connection)
            }
        };
        let notifications = if self.notifications {
            match Notifications::connect(&self, &infos).await {
                Ok(notifications) => Some(notifications),
                Err(error) => {
                    warn!(%error, %address, "no fill notifications (the subscriber needs RESP3: Redis 6+); followers poll");
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
            pipelined: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Parses the URLs, and checks that TLS is available where they ask for it.
    fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, StoreError> {
        let mut infos = Vec::with_capacity(self.target.urls().len());
        for url in self.target.urls() {
            let address = redact(url);
            let info = url.as_str().into_connection_info().map_err(|e| {
                if cfg!(not(feature = "tls")) && address.starts_with("rediss://") {
                    StoreError::new(format_args!(
                        "invalid Redis URL {address}: rediss:// (TLS) needs the `tls` feature of tower-stampede"
                    ))
                } else {
                    StoreError::new(format_args!("invalid Redis URL {address}: {e}"))
                }
            })?;
            #[cfg(feature = "tls")]
            self.prepare_tls(&info, &address)?;
            infos.push(info);
        }
        if infos.is_empty() {
            return Err(StoreError::new("no Redis URL given"));
        }
        Ok(infos)
    }

    /// Readies rustls for a `rediss://` URL; refuses a plain one when root certificates are
    /// set (they would be silently unused).
    #[cfg(feature = "tls")]
    fn prepare_tls(&self, info: &ConnectionInfo, address: &str) -> Result<(), StoreError> {
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            install_crypto_provider();
        } else if self.root_certificates.is_some() {
            return Err(StoreError::new(format_args!(
                "invalid Redis URL {address}: TLS root certificates are set, so it must be rediss://"
            )));
        }
        if let Some(pem) = &self.root_certificates {
            use rustls::pki_types::{pem::PemObject, CertificateDer};
            if !CertificateDer::pem_slice_iter(pem).any(|cert| cert.is_ok()) {
                return Err(StoreError::new(
                    "the TLS root certificates hold no PEM certificate",
                ));
            }
        }
        Ok(())
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1))
    }

    /// A client for one server, trusting the configured root certificates.
    fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(root_cert) = &self.root_certificates {
            return redis::Client::build_with_tls(info, self.certificates(root_cert));
        }
        redis::Client::open(info)
    }

    #[cfg(feature = "tls")]
    fn certificates(&self, root_cert: &[u8]) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert.to_vec()),
        }
    }

    /// A cluster client builder for these nodes, with this builder's settings.
    #[cfg(feature = "cluster")]
    fn cluster_client(
        &self,
        infos: impl IntoIterator<Item = ConnectionInfo>,
    ) -> ClusterClientBuilder {
        let builder = ClusterClientBuilder::new(infos)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout);
        #[cfg(feature = "tls")]
        if let Some(root_cert) = &self.root_certificates {
            return builder.certs(self.certificates(root_cert));
        }
        builder
    }
}

/// rustls needs a process-wide crypto provider; install ring's unless the application has
/// installed one (or another crate did). Either will do, so losing a race is fine.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl RedisStore {
    /// A builder for a store on one server at `url`
    /// (`redis[s]://[[user]:password@]host[:port][/db]`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Server(url.into()))
    }

    /// Connects to the Redis at `url` with default settings.
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// A builder for a store on a Redis Cluster, given the URLs of some of its nodes (seeds,
    /// `redis[s]://[[user]:password@]host[:port]`; one that answers is enough, the others are
    /// discovered). Every seed must carry the same credentials and scheme. Feature `cluster`.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder<I>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStoreBuilder::new(Target::Cluster(urls.into_iter().map(Into::into).collect()))
    }

    /// Connects to the Redis Cluster whose seed nodes are at `urls`, with default settings;
    /// see [`cluster_builder`](Self::cluster_builder). Feature `cluster`.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn connect_cluster<I>(urls: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStore::cluster_builder(urls).connect().await
    }

    /// The server's address (a cluster's: its seeds' addresses, comma-separated), without user
    /// name, password or query.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether the store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        match self.connection {
            Connection::Server(_) => false,
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => true,
        }
    }

    async fn run<T: FromRedisValue>(&self, script: &Script, call: &Cmd) -> Result<T, StoreError> {
        self.connection
            .invoke(script, call)
            .await
            .map_err(|e| self.error(&e))
    }

    fn error(&self, error: &redis::RedisError) -> StoreError {
        StoreError::new(format_args!("Redis at {}: {error}", self.address))
    }

    /// A lookup by the lookup script: for lookups that may take the lock from a `fresh`
    /// marker, and for servers before Redis 7.0.
    async fn lookup_by_script(&self, call: Cmd) -> Result<Lookup, StoreError> {
        let (value, pttl, state): (Vec<u8>, i64, i64) = self.run(&LOOKUP, &call).await?;
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
    }

    /// The value from the replies to a pipelined `GET` and `PTTL` of it; a value of a foreign
    /// type (`WRONGTYPE` to the `GET`) counts as absent.
    fn read(
        &self,
        value: RedisResult<Option<Vec<u8>>>,
        pttl: RedisResult<i64>,
    ) -> Result<Option<Stored>, StoreError> {
        let pttl = pttl.map_err(|error| self.error(&error))?;
        Ok(value.ok().flatten().and_then(|value| stored(value, pttl)))
    }

    /// Whether a pipelined command's error sends the call to its script: a server that does not
    /// know `SET … NX GET` (before Redis 7.0) gets the script from now on, and a key of a
    /// foreign type gets it for this call.
    fn pipeline_refused(&self, error: &redis::RedisError) -> bool {
        match error.code() {
            Some("WRONGTYPE") => true,
            Some("ERR") if error.to_string().contains("syntax error") => {
                if self.pipelined.swap(false, Ordering::Relaxed) {
                    warn!(address = %self.address, "the server does not take SET NX GET (Redis before 7.0); lookups use a script");
                }
                true
            }
            _ => false,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("address", &self.address)
            .field("cluster", &self.is_cluster())
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

/// A command on a key with room for `args` arguments (name and key included) without regrowing.
fn command(args: usize, name: &str, key: &str) -> Cmd {
    let mut command = Cmd::with_capacity(args, 96 + key.len());
    command.arg(name).arg(key);
    command
}

/// A leader's lock value: its token, then the remaining life (ms) below which the value it
/// loads counts as stale, so the fill knows how long the value stays fresh.
fn lock_value(token: LockToken, refresh_below: u64) -> Vec<u8> {
    let mut lock = Vec::with_capacity(54);
    lock.extend_from_slice(&token.hex_bytes());
    lock.push(b':');
    lock.extend_from_slice(itoa::Buffer::new().format(refresh_below).as_bytes());
    lock
}

fn release_call(key: &StoreKey, token: LockToken) -> Cmd {
    let mut call = script_call(&RELEASE, &[&key.value_name(), &key.lock_name()]);
    call.arg(&token.hex_bytes()[..])
        .arg(channel(key.namespace()))
        .arg(&key.digest().hex_bytes()[..]);
    call
}

impl Store for RedisStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        refresh_below: Duration,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        let (value_name, lock_name) = (key.value_name(), key.lock_name());
        let below = u64::try_from(refresh_below.as_millis()).unwrap_or(u64::MAX);
        let lock = lock_value(token, below);
        let lock_ms = millis(lock_ttl);
        let script = move |value_name: &str, lock_name: &str, lock: &[u8]| {
            let mut call = script_call(&LOOKUP, &[value_name, lock_name]);
            call.arg(lock).arg(lock_ms).arg(below);
            call
        };
        if refresh_below == Duration::MAX || !self.pipelined.load(Ordering::Relaxed) {
            return Box::pin(self.lookup_by_script(script(&value_name, &lock_name, &lock)));
        }
        // One round trip of three plain commands: the lock is taken only where no `fresh`
        // marker stands, which is where the value is stale or absent.
        let mut pipeline = Pipeline::with_capacity(3);
        let mut take = command(7, "SET", &lock_name);
        take.arg(&lock[..])
            .arg("NX")
            .arg("PX")
            .arg(lock_ms)
            .arg("GET");
        pipeline
            .add_command(take)
            .add_command(command(2, "GET", &value_name))
            .add_command(command(2, "PTTL", &value_name))
            .ignore_errors();
        let key = key.clone();
        Box::pin(async move {
            type Reply = (
                RedisResult<Option<Vec<u8>>>,
                RedisResult<Option<Vec<u8>>>,
                RedisResult<i64>,
            );
            let (held, value, pttl): Reply = self
                .connection
                .pipeline(&pipeline)
                .await
                .map_err(|error| self.error(&error))?;
            let held = match held {
                Ok(held) => held,
                Err(error) if self.pipeline_refused(&error) => {
                    // A server before Redis 7.0, or a lock key of a foreign type: the script
                    // decides (and counts a foreign lock key as free).
                    let script = script(&value_name, &lock_name, &lock);
                    return self.lookup_by_script(script).await;
                }
                Err(error) => return Err(self.error(&error)),
            };
            // A value of a foreign type counts as absent: the fill overwrites it.
            let value = self.read(value, pttl)?;
            let fresh = value
                .as_ref()
                .and_then(|value| value.ttl)
                .is_some_and(|ttl| ttl > Duration::from_millis(below));
            let lock = match held.as_deref() {
                _ if fresh && held.is_none() => {
                    // We took the lock of a fresh value whose marker is gone (a failure marker
                    // expired, or the value was written by a put): put the marker back before
                    // answering, so that this flight's next lookup finds no lock of its own.
                    let _: i64 = self.run(&RELEASE, &release_call(&key, token)).await?;
                    LockState::NotRequested
                }
                _ if fresh => LockState::NotRequested,
                None => LockState::Acquired,
                Some(b"fresh") => {
                    // The value is gone or stale but its marker still stands (the value was
                    // evicted, or this lookup wants to refresh early): the script decides.
                    let script = script(&value_name, &lock_name, &lock);
                    return self.lookup_by_script(script).await;
                }
                Some(b"failed") => LockState::Failed,
                Some(_) => LockState::HeldElsewhere,
            };
            Ok(Lookup { value, lock })
        })
    }

    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&FILL, &[&key.value_name(), &key.lock_name()]);
        call.arg(&token.hex_bytes()[..])
            .arg(value.as_ref())
            .arg(millis(ttl))
            .arg(channel(key.namespace()))
            .arg(&key.digest().hex_bytes()[..]);
        Box::pin(async move {
            let filled: i64 = self.run(&FILL, &call).await?;
            Ok(filled == 1)
        })
    }

    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>> {
        let call = release_call(key, token);
        Box::pin(async move {
            let released: i64 = self.run(&RELEASE, &call).await?;
            Ok(released == 1)
        })
    }

    fn extend(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&EXTEND, &[&key.lock_name()]);
        call.arg(&token.hex_bytes()[..]).arg(millis(lock_ttl));
        Box::pin(async move {
            let extended: i64 = self.run(&EXTEND, &call).await?;
            Ok(extended == 1)
        })
    }

    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&PUT, &[&key.value_name()]);
        call.arg(value.as_ref())
            .arg(millis(ttl))
            .arg(channel(key.namespace()))
            .arg(&key.digest().hex_bytes()[..]);
        Box::pin(async move {
            let _: i64 = self.run(&PUT, &call).await?;
            Ok(())
        })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let value_name = key.value_name();
        let mut pipeline = Pipeline::with_capacity(2);
        pipeline
            .add_command(command(2, "GET", &value_name))
            .add_command(command(2, "PTTL", &value_name))
            .ignore_errors();
        Box::pin(async move {
            type Reply = (RedisResult<Option<Vec<u8>>>, RedisResult<i64>);
            let (value, pttl): Reply = self
                .connection
                .pipeline(&pipeline)
                .await
                .map_err(|error| self.error(&error))?;
            self.read(value, pttl)
        })
    }

    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut call = script_call(&FAIL, &[&key.lock_name()]);
        call.arg(&token.hex_bytes()[..])
            .arg(millis(failure_ttl))
            .arg(channel(key.namespace()))
            .arg(&key.digest().hex_bytes()[..]);
        Box::pin(async move {
            let failed: i64 = self.run(&FAIL, &call).await?;
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
