//! `RedisStore`: the shared store on Redis (one server, a Redis Cluster, or the primary of a
//! Sentinel service), one round trip per
//! call: pipelined plain commands for lookups and reads, Lua scripts for fenced writes.
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | `RedisStore`, its constructors and accessors |
//! | `builder.rs` | `RedisStoreBuilder`: the settings a user gives, and connecting or opening the store |
//! | `dial.rs` | how the store reaches its servers: the target, timeouts, TLS, clients, redacted addresses |
//! | `names.rs` | the names of a key's value and lock in Redis, and of the fill channels |
//! | `connection.rs` | the connection to a server or a cluster: which connection a call goes to; errors |
//! | `calls.rs` | a script or a pipeline on one connection, reloaded on `NOSCRIPT`; a lookup pipeline's replies |
//! | `link.rs` | one server's connection, kept up through an outage, failing calls at once while down; a primary's, following it |
//! | `scripts.rs` | the Lua scripts, and how commands and script calls are built |
//! | `notifications.rs` | the channels the subscriber listens on, and how a message wakes followers |
//! | `subscriber.rs` | which connection notifications come on, and how it is dialled |
//! | `liveness.rs` | one server's subscriber watched by a `PING`, replaced when it goes silent or the primary moves |
//! | `store.rs` | `impl Store for RedisStore`: its primitives, each variant of a settlement or a change one script; a namespace's tag state; reading the replies |
//! | `lookup.rs` | `LookupPlan`: a lookup as planned, a key's three commands in one round trip, a batch's in one pipeline, and how their replies are decided |
//! | `cluster.rs` | a Redis Cluster's slot map, for one pipeline per master (feature `cluster`) |
//! | `cluster_link.rs` | a Cluster connection made in the background by `open` (feature `cluster`) |
//! | `resolver.rs` | the application's resolver of the nodes' announced addresses (features `cluster`, `sentinel`) |
//! | `sentinel.rs` | a Sentinel service's primary: asked of the sentinels for every connection, and their announcements that it moved (feature `sentinel`) |
//!
//! The lock key of a value holds one of:
//! - nothing: the value is stale or absent, and nobody reloads it: a lookup may take the lock;
//! - `fresh`: the value is fresh (the marker expires when its freshness ends), so the lock is not
//!   to be taken; this lets a plain `SET lock token NX GET` take the lock only when it should;
//! - `<token>:<refresh below, ms>`: a leader's lock. The second part is the remaining life
//!   below which a value counts as stale, which the fill uses to set the `fresh` marker;
//! - `failed`: the last load failed (followers fail at once instead of each retrying).
//!
//! Beside them, the waiters' key (`…:w`) holds, for a few seconds, the answer of a load for the
//! calls that waited for it only, written by `ANSWER` where the value is kept for the next
//! load to revalidate (see `StoreExt::answer_waiters`).

mod builder;
mod calls;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_link;
mod connection;
mod dial;
mod link;
mod liveness;
mod lookup;
mod names;
mod notifications;
#[cfg(any(feature = "cluster", feature = "sentinel"))]
mod resolver;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod store;
mod subscriber;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::call_limit::CallLimit;
use super::error::StoreError;
pub use builder::RedisStoreBuilder;
use connection::Connection;
use dial::{Nodes, Target};
use notifications::Notifications;

/// The shared store on Redis (feature `redis`, on by default): one server, or a Redis Cluster
/// (feature `cluster`).
///
/// Every [`Store`](super::Store) call is one round trip, over a connection that reconnects by
/// itself. Lookups and reads are pipelines of plain commands: a lookup sends `SET lock token NX PX
/// … GET`, `GET value` and `PTTL value` together. A filled value leaves a `fresh` marker in its
/// lock key for as long as it is fresh, so the `SET … NX` takes the lock only where the value is
/// stale or absent, and a hit costs the server about what a `GET` costs (a Lua script costs several
/// times more, and copies the value twice). Writes that must check the lock's owner (fill, release,
/// extend, fail) are Lua scripts, `EVALSHA`, re-sent after a `SCRIPT LOAD` if the server lost its
/// script cache; so are the rare lookups that take the lock from the marker (early refresh, an
/// evicted value), and every lookup on a server before Redis 7.0, which lacks `SET … NX GET`. The
/// value and lock keys of one logical key share a hash tag, so each call touches one Redis Cluster
/// slot and, on a cluster, goes to the node that serves it.
///
/// [`connect`](Self::connect) fails when the server cannot be reached; [`open`](Self::open)
/// returns the store at once and connects in the background, so an application can start
/// during a Redis outage. Either way, once connected, the store reconnects by itself after an
/// outage of any length, and while its connection is down its calls fail at once (no
/// connection attempt each), so the engine loads with in-process protection meanwhile.
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
/// discovers the rest. Every [`Store`](super::Store) method works as on one server. Fill
/// notifications use sharded pub/sub (Redis 7.0 and later): a change is published only within
/// the shard of its key (its master and replicas), on one of 16 shard channels of the
/// namespace, instead of being broadcast to every node; the store's subscriber listens to all
/// 16, each on the node that serves its slot (moving with that slot), and so hears the fills of
/// keys on every node. A server without sharded pub/sub gets classic pub/sub, as one server
/// does (see `RedisStoreBuilder::sharded_notifications`).
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
///
/// # The application's own client
///
/// [`client_builder`](Self::client_builder) takes the app's `redis::Client`, and
/// [`info_builder`](Self::info_builder) anything `IntoConnectionInfo` (a `ConnectionInfo`,
/// a URL, `(host, port)`), with their address, credentials, database, protocol and TLS
/// settings; `cluster_info_builder` and `sentinel_info_builder` do the same for a cluster's
/// nodes and for sentinels (features `cluster` and `sentinel`). The store still makes its own
/// connections from those settings: it needs a subscriber of its own, and redis-rs's cluster
/// and sentinel clients show none of their settings to build one from.
///
/// # Connections
///
/// A store is a handle: clones share its connections and its one subscriber, so every
/// [`Cache`](crate::Cache) of a process (one per namespace) can be built over clones of one
/// store. Per store, so per process that shares one:
///
/// - one server: two connections, the data connection (multiplexed: every call of every
///   cache goes over it) and the subscriber (RESP3; one connection for every namespace's
///   channels). `connect` also opens a third for a moment, to check that the server takes
///   RESP3, and closes it;
/// - a Sentinel service: the same two on the primary, and one to a sentinel at a time for
///   its announcements, besides the short ones that ask where the primary is;
/// - a Redis Cluster: a cluster connection for the data and one for the subscriber, each
///   with a connection to every node it reaches.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_stampede::store::StoreError> {
/// use tower_stampede::{store::RedisStore, Cache};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// // Two caches, two namespaces, one store: two connections in all.
/// let pages = Cache::builder(store.clone()).namespace("pages").build();
/// let users = Cache::builder(store).namespace("users").build();
/// # let _ = (pages, users); Ok(()) }
/// ```
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStore {
    connection: Connection,
    address: String,
    notifications: Option<Notifications>,
    /// Whether lookups pipeline plain commands (`SET … NX GET` needs Redis 7.0); cleared for
    /// good, in favour of the lookup script, when the server rejects it.
    pipelined: Arc<AtomicBool>,
    /// Whether changes are published on the shard channels (a cluster, unless the builder
    /// said otherwise); cleared for good when the subscriber finds no `SSUBSCRIBE` (before
    /// Redis 7.0). Meanwhile the scripts fall back to `PUBLISH` by themselves.
    sharded: Arc<AtomicBool>,
    /// How many calls its connection takes at once, shared by every cache over the store.
    call_limit: CallLimit,
}

impl RedisStore {
    /// A builder for a store on one server at `url`
    /// (`redis[s]://[[user]:password@]host[:port][/db]`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Server(Nodes::Urls(vec![url.into()])))
    }

    /// A builder for a store on the server of the application's own `client`, with its
    /// settings: address, credentials, database, protocol and TLS (a client made with
    /// `redis::Client::build_with_tls` keeps its certificates). The store opens its own two
    /// connections from them (see [Connections](Self#connections)); the builder's timeouts
    /// and notifications apply as to a URL's store.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_stampede::{store::RedisStore, Cache};
    ///
    /// let client = redis::Client::open("redis://app:secret@10.0.0.1:6379/2")?;
    /// let store = RedisStore::client_builder(&client).connect().await?;
    /// let cache = Cache::builder(store).namespace("my-app").build();
    /// # let _ = cache; Ok(()) }
    /// ```
    pub fn client_builder(client: &redis::Client) -> RedisStoreBuilder {
        RedisStore::info_builder(client.get_connection_info().clone())
    }

    /// A builder for a store on one server given as anything redis-rs reads connection
    /// settings from ([`IntoConnectionInfo`](redis::IntoConnectionInfo): a
    /// `redis::ConnectionInfo`, a URL, `(host, port)`); settings it cannot read fail the
    /// store's `connect` or `open` with a configuration error.
    pub fn info_builder(info: impl redis::IntoConnectionInfo) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Server(Nodes::infos([info])))
    }

    /// Connects to the Redis at `url` with default settings; fails if it cannot be reached.
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// The store of the Redis at `url`, with default settings, at once: it connects in the
    /// background, so an application can start while Redis is down (see
    /// [`RedisStoreBuilder::open`]). Fails only on an invalid URL (or without a tokio
    /// runtime).
    pub fn open(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).open()
    }

    fn new(
        connection: Connection,
        address: String,
        notifications: Option<Notifications>,
        sharded: Arc<AtomicBool>,
    ) -> Self {
        // On a cluster, the client queues every call in one queue of 100 before it routes
        // them to the masters: past it, calls waited there behind a burst (32 processes on two
        // cores over three masters: 14,000 to 28,000 loads for 10,000 keys, where 96 at once
        // gave 10,000). A server's connection takes calls as fast as its task runs.
        let call_limit = match connection {
            Connection::Server(_) => CallLimit::default(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => CallLimit::new(96),
        };
        RedisStore {
            connection,
            address,
            notifications,
            pipelined: Arc::new(AtomicBool::new(true)),
            sharded,
            call_limit,
        }
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
        let urls = urls.into_iter().map(Into::into).collect();
        RedisStoreBuilder::new(Target::Cluster(Nodes::Urls(urls)))
    }

    /// A builder for a store on a Redis Cluster, given the connection settings of some of its
    /// nodes as the application made them (anything
    /// [`IntoConnectionInfo`](redis::IntoConnectionInfo): a `redis::ConnectionInfo`, as a
    /// `redis::Client`'s `get_connection_info` gives it), credentials, protocol and TLS
    /// included. A `redis::cluster::ClusterClient` cannot be taken as it is: redis-rs shows
    /// none of its settings, and the store's subscriber needs a client of its own (RESP3,
    /// its pushes sent to the store); give the nodes' settings instead. Feature `cluster`.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_info_builder<I>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        RedisStoreBuilder::new(Target::Cluster(Nodes::infos(nodes)))
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

    /// A builder for a store on the primary of a Redis Sentinel service: `sentinels` are
    /// the URLs of some of its sentinels (`redis[s]://[[user]:password@]host[:port]`, each
    /// with the same credentials and scheme, and no database: a sentinel has none;
    /// `rediss://` means TLS to the data nodes too), `service` the name they monitor it by.
    /// The data nodes' credentials and database are
    /// [`primary_credentials`](RedisStoreBuilder::primary_credentials) and
    /// [`primary_db`](RedisStoreBuilder::primary_db). Feature `sentinel`.
    ///
    /// The store asks the sentinels where the primary is each time it connects, and connects
    /// again when the primary fails (its connection drops), is demoted (`READONLY`), or the
    /// sentinels announce another (`+switch-master`, heard from one sentinel at a time, the
    /// next when it goes silent): meanwhile its calls fail at once, as for a server that is
    /// down, and the engine loads with in-process protection.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder<I>(sentinels: I, service: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStoreBuilder::new(Target::Sentinel {
            sentinels: Nodes::Urls(sentinels.into_iter().map(Into::into).collect()),
            service: service.into(),
        })
    }

    /// A builder for a store on the primary of a Redis Sentinel service, given the
    /// connection settings of some of its sentinels as the application made them (anything
    /// [`IntoConnectionInfo`](redis::IntoConnectionInfo)); otherwise as
    /// [`sentinel_builder`](Self::sentinel_builder). redis-rs's own `SentinelClient` cannot
    /// be taken as it is: it shows none of its settings, and the store asks the sentinels
    /// itself (for every connection, and for their announcements). Feature `sentinel`.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_info_builder<I>(sentinels: I, service: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        RedisStoreBuilder::new(Target::Sentinel {
            sentinels: Nodes::infos(sentinels),
            service: service.into(),
        })
    }

    /// Connects to the primary of the Redis Sentinel service `service`, asking the sentinels
    /// at `sentinels`, with default settings; see [`sentinel_builder`](Self::sentinel_builder).
    /// Feature `sentinel`.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn connect_sentinel<I>(
        sentinels: I,
        service: impl Into<String>,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStore::sentinel_builder(sentinels, service)
            .connect()
            .await
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
