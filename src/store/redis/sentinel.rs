//! Redis Sentinel: where the primary is, asked of the sentinels every time a connection to it
//! is made, and the sentinels' word that it moved.
//!
//! redis-rs's `SentinelClient` finds the primary (it asks the sentinels for the named
//! service, then checks that the node it names says `ROLE` master), but the client it hands
//! back is bound to that one address, and a `ConnectionManager` made of it reconnects only
//! there. A primary that died and came back is an *empty master* for seconds (about 11 s
//! here) before the sentinels make it a replica: a connection that went back to it on its
//! own would lock and fill on a server that no other process uses, and lose all of it. So
//! a [`Primary`] is asked again for every connection: the data link's keeper and the
//! subscriber's watchman dial through it, never straight back.
//!
//! A planned failover (`SENTINEL FAILOVER`) kills no connection: the old primary keeps
//! answering, as a master, until the sentinels demote it (about 11 s here), and what is
//! written to it meanwhile is lost. So the primary also listens to the sentinels'
//! `+switch-master` announcement, and the store moves as soon as one is heard; a `READONLY`
//! reply (a demoted primary) moves it too.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, PushKind, RedisResult, Value};
use tracing::{debug, info, warn};

use super::dial::{Dial, PrimaryAuth, KEEPER_PAUSE, PING_EVERY};
use super::resolver::{reachable, Resolver};
use crate::store::error::{StoreError, StoreErrorKind};

/// The channel on which a sentinel announces a new primary: `<service> <old ip> <old port>
/// <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// A service's primary, as the sentinels name it; shared by a store's data link and its
/// subscriber.
pub(super) struct Primary {
    /// `async_get_client` takes `&mut`: one question to the sentinels at a time.
    sentinels: tokio::sync::Mutex<Lookups>,
    /// Clients of the sentinels, for the announcements: RESP3, and trusting the dial's root
    /// certificates (credentials included: never print them).
    listeners: Vec<redis::Client>,
    service: String,
    /// The sentinels and the service, for the log (without credentials).
    address: String,
    /// How long one question (and one connection to the primary it names) may take.
    wait: Duration,
    config: ConnectionManagerConfig,
    /// Where the primary's address is dialled (see `resolver.rs`).
    resolver: Option<Resolver>,
    /// The primary named last, and how many times a change was heard of.
    current: Mutex<Current>,
    /// The primary a sentinel announced last (`host`, `port`), until the sentinels asked
    /// name it too: the sentinel asked first may not have switched yet, and would name the
    /// old primary, which still answers as a master until it is demoted.
    announced: Mutex<Option<(String, u16)>>,
    /// Dropped with the primary: its listener, which holds no strong reference, hears it at
    /// once, whatever it is waiting for (an announcement, a sentinel, a pause).
    dropped: tokio::sync::watch::Sender<()>,
}

/// The primary named last: as the sentinels name it, and where it is dialled.
#[derive(Default)]
struct Current {
    named: Option<ConnectionAddr>,
    /// Its settings, at the address the resolver gave (the one named, without a resolver).
    reachable: Option<ConnectionInfo>,
    /// How many times a change was heard of.
    moves: u64,
}

/// redis-rs's sentinel clients, one per sentinel, asked in turn. A client of several
/// sentinels asks up to three at once, keeps a connection to each it asked, and takes their
/// answers in its order, so a sentinel that accepts connections and answers nothing (its host
/// cut off, its process stopped) holds up every question of a client that asks it first; and
/// clients in every order to get round that would keep a connection to every sentinel from
/// each. One client per sentinel keeps one connection to each, and a question that fails or
/// times out at one goes on to the next within its wait; the next question starts where the
/// last answer came from.
struct Lookups {
    /// Non-empty: the `i`th asks the `i`th sentinel.
    clients: Vec<SentinelClient>,
    turn: usize,
}

impl Lookups {
    fn new(
        dial: &Dial,
        infos: &[ConnectionInfo],
        service: &str,
        auth: &PrimaryAuth,
    ) -> RedisResult<Self> {
        // The sentinels' settings are checked together (with no URL, the builder says so).
        sentinel_builder(dial, infos, service, auth)?;
        let clients = infos
            .iter()
            .map(|info| sentinel_builder(dial, std::slice::from_ref(info), service, auth)?.build())
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Lookups { clients, turn: 0 })
    }

    /// Asks the sentinels for the primary, one after another from the turn's, within `wait`.
    async fn ask(&mut self, wait: Duration) -> RedisResult<redis::Client> {
        let count = self.clients.len();
        let deadline = tokio::time::Instant::now() + wait;
        let mut failed = super::dial::no_url();
        for _ in 0..count {
            let Some(client) = self.clients.get_mut(self.turn % count) else {
                break;
            };
            match tokio::time::timeout_at(deadline, client.async_get_client()).await {
                Ok(Ok(named)) => return Ok(named),
                Ok(Err(error)) => failed = error,
                Err(_) => {
                    failed = redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no sentinel named the primary in time",
                    ));
                }
            }
            self.turn = self.turn.wrapping_add(1);
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        Err(failed)
    }
}

impl Primary {
    /// The primary of `service`, asked of the sentinels at `infos` (parsed from the store's
    /// URLs); nothing is asked yet.
    pub(super) fn new(
        dial: &Dial,
        infos: &[ConnectionInfo],
        service: &str,
        auth: &PrimaryAuth,
    ) -> Result<Arc<Self>, StoreError> {
        let address = format!("{} (service {service})", dial.target.address());
        let configuration = |error| {
            StoreError::with_source(
                StoreErrorKind::Configuration,
                format_args!("invalid Redis Sentinel settings for {address}"),
                error,
            )
        };
        let lookups = Lookups::new(dial, infos, service, auth).map_err(configuration)?;
        let tls = infos
            .iter()
            .any(|info| matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
        if tls && dial.resolver.is_some() {
            return Err(StoreError::of_kind(
                StoreErrorKind::Configuration,
                format_args!("a dns_resolver over TLS is refused for {address}: the primary would be dialled at an IP address its certificate does not name"),
            ));
        }
        let listeners = infos
            .iter()
            .map(|info| {
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3);
                dial.client(info.clone().set_redis_settings(settings))
            })
            .collect::<RedisResult<_>>()
            .map_err(configuration)?;
        Ok(Arc::new(Primary {
            sentinels: tokio::sync::Mutex::new(lookups),
            listeners,
            service: service.to_owned(),
            address,
            wait: dial.ping_wait(),
            config: dial.manager_config(),
            resolver: dial.resolver.clone(),
            current: Mutex::new(Current::default()),
            announced: Mutex::new(None),
            dropped: tokio::sync::watch::channel(()).0,
        }))
    }

    /// Asks the sentinels where the primary is (within the dial's wait), and remembers it.
    /// Where a sentinel has announced another primary that the sentinels asked do not name
    /// yet, that one, if it says `ROLE` master. The client dials it through the resolver.
    pub(super) async fn find(&self) -> RedisResult<redis::Client> {
        let named = self.sentinels.lock().await.ask(self.wait).await;
        let client = self.announced_or(named).await?;
        let info = client.get_connection_info().clone();
        let reached = reachable(self.resolver.as_ref(), info.clone()).await?;
        let client = match &self.resolver {
            Some(_) => redis::Client::open(reached.clone())?,
            None => client,
        };
        let mut current = crate::sync::lock(&self.current);
        if current.named.as_ref() != Some(info.addr()) {
            info!(sentinels = %self.address, primary = %info.addr(), "the sentinels name the Redis primary");
            current.moves = current.moves.wrapping_add(1);
        }
        current.named = Some(info.addr().clone());
        current.reachable = Some(reached);
        Ok(client)
    }

    /// `named`, the primary the sentinels asked name, or the one announced since if they do
    /// not name it yet and it says `ROLE` master.
    async fn announced_or(&self, named: RedisResult<redis::Client>) -> RedisResult<redis::Client> {
        let Some(announced) = crate::sync::lock(&self.announced).clone() else {
            return named;
        };
        if let Ok(client) = &named {
            if host_port(client.get_connection_info().addr()) == Some(announced.clone()) {
                *crate::sync::lock(&self.announced) = None;
                return named;
            }
        }
        let template = match &named {
            Ok(client) => Some(client.get_connection_info().clone()),
            Err(_) => self.current().0,
        };
        let Some(info) = template.and_then(|info| at(info, announced)) else {
            return named;
        };
        match self.master_at(info).await {
            Some(client) => Ok(client),
            None => named,
        }
    }

    /// A client of `info` if the server there says `ROLE` master (within the dial's wait).
    async fn master_at(&self, info: ConnectionInfo) -> Option<redis::Client> {
        let client = redis::Client::open(info).ok()?;
        let mut config = redis::AsyncConnectionConfig::new();
        if let Some(resolver) = &self.resolver {
            config = config.set_dns_resolver(resolver.clone());
        }
        let role = async {
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut connection).await.ok()?;
            Some(matches!(role.first(), Some(Value::BulkString(role)) if role == b"master"))
        };
        match tokio::time::timeout(self.wait, role).await {
            Ok(Some(true)) => Some(client),
            _ => None,
        }
    }

    /// Remembers the primary a sentinel announced (see [`find`](Self::find)).
    fn announce(&self, primary: (String, u16)) {
        *crate::sync::lock(&self.announced) = Some(primary);
    }

    /// A connection to the primary the sentinels name now (which said `ROLE` master).
    pub(super) async fn dial(&self) -> RedisResult<ConnectionManager> {
        let client = self.find().await?;
        let connect = ConnectionManager::new_with_config(client, self.config.clone());
        tokio::time::timeout(self.wait, connect)
            .await
            .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connecting timed out")))?
    }

    /// The primary named last (where it is dialled), and how many times it changed: a
    /// subscriber on an older one moves.
    pub(super) fn current(&self) -> (Option<ConnectionInfo>, u64) {
        let current = crate::sync::lock(&self.current);
        (current.reachable.clone(), current.moves)
    }

    /// Listens to the sentinels' `+switch-master` for this service, one sentinel at a time
    /// (the next when one fails), for as long as the primary lives: `moved` is called on each
    /// announcement, and when a listen starts and finds the primary elsewhere than it was
    /// (an announcement may have been missed while none was listened to). Without a
    /// runtime, nothing listens.
    pub(super) fn listen(self: &Arc<Self>, moved: impl Fn() + Send + Sync + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let primary = Arc::downgrade(self);
        let mut dropped = self.dropped.subscribe();
        runtime.spawn(async move {
            let listening = async {
                let mut next = 0;
                loop {
                    let Some(sentinel) = sentinel_client(&primary, next) else {
                        return;
                    };
                    next += 1;
                    if let Err(error) = listen_to(&primary, sentinel, &moved).await {
                        debug!(%error, "a sentinel's announcements stopped; asking the next");
                    }
                    tokio::time::sleep(KEEPER_PAUSE).await;
                }
            };
            tokio::select! {
                () = listening => {}
                // Only an error: nothing is ever sent. The connection goes with the future.
                _ = dropped.changed() => {}
            }
        });
    }
}

/// The sentinel to listen to in turn `turn`, while the primary lives.
fn sentinel_client(primary: &Weak<Primary>, turn: usize) -> Option<redis::Client> {
    let primary = primary.upgrade()?;
    let count = primary.listeners.len().max(1);
    primary.listeners.get(turn % count).cloned()
}

/// Listens to one sentinel until its connection fails or the primary is dropped.
async fn listen_to(
    primary: &Weak<Primary>,
    sentinel: redis::Client,
    moved: &impl Fn(),
) -> RedisResult<()> {
    let (wait, service, resolver) = match primary.upgrade() {
        Some(primary) => (
            primary.wait,
            primary.service.clone(),
            primary.resolver.clone(),
        ),
        None => return Ok(()),
    };
    let (sender, mut announcements) = tokio::sync::mpsc::unbounded_channel();
    let mut config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(wait))
        .set_response_timeout(Some(wait))
        .set_push_sender(sender);
    if let Some(resolver) = resolver {
        config = config.set_dns_resolver(resolver);
    }
    let mut connection = sentinel
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    connection.subscribe(SWITCH_MASTER).await?;
    // An announcement may have been missed while none was listened to: the primary is
    // asked for, and the store moves if it is elsewhere. Asked again where a question fails
    // (each starts at the next sentinel: the one listened to before may be the one that went
    // silent), up to once per sentinel.
    if let Some(primary) = primary.upgrade() {
        let before = primary.current().1;
        for _ in 0..primary.listeners.len() {
            if primary.find().await.is_ok() {
                if primary.current().1 != before && before != 0 {
                    moved();
                }
                break;
            }
        }
    }
    // A subscribed connection waits for pushes and asks nothing, so a sentinel that goes
    // silent without closing it (its host cut off) would be listened to for good: a `PING`
    // every second (answered within the response timeout) finds it, and the next is asked.
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let push = tokio::select! {
            push = announcements.recv() => push,
            _ = ping.tick() => {
                redis::cmd("PING").query_async::<()>(&mut connection).await?;
                continue;
            }
        };
        let Some(push) = push else {
            return Ok(());
        };
        if primary.strong_count() == 0 {
            return Ok(());
        }
        match push.kind {
            PushKind::Message if names_service(&push.data, &service) => {
                info!(%service, "the sentinels announce a new Redis primary");
                if let (Some(new), Some(primary)) = (announced(&push.data), primary.upgrade()) {
                    primary.announce(new);
                }
                moved();
            }
            PushKind::Disconnection => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the sentinel's connection dropped",
                )))
            }
            _ => {}
        }
    }
}

/// The new primary a `+switch-master` message (`[channel, payload]`) names: the payload is
/// `<service> <old ip> <old port> <new ip> <new port>`.
fn announced(data: &[Value]) -> Option<(String, u16)> {
    let Some(Value::BulkString(payload)) = data.get(1) else {
        return None;
    };
    let payload = std::str::from_utf8(payload).ok()?;
    let mut fields = payload.split(' ').skip(3);
    let host = fields.next()?.to_owned();
    let port = fields.next()?.parse().ok()?;
    Some((host, port))
}

/// The host and port of a TCP address.
fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// `info` at another host and port, with its settings and TLS parameters.
fn at(info: ConnectionInfo, (host, port): (String, u16)) -> Option<ConnectionInfo> {
    let addr = match info.addr().clone() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        },
        _ => return None,
    };
    Some(info.set_addr(addr))
}

/// Whether a `+switch-master` message (`[channel, payload]`) is about `service`.
fn names_service(data: &[Value], service: &str) -> bool {
    let Some(Value::BulkString(payload)) = data.get(1) else {
        return false;
    };
    payload.split(|byte| *byte == b' ').next() == Some(service.as_bytes())
}

/// The redis-rs sentinel client's builder: the sentinels' addresses and credentials from
/// their URLs (its builder takes addresses only, and would drop them), the data nodes' from
/// `auth`, TLS to both where the sentinels' URLs are `rediss://`.
fn sentinel_builder(
    dial: &Dial,
    infos: &[ConnectionInfo],
    service: &str,
    auth: &PrimaryAuth,
) -> RedisResult<SentinelClientBuilder> {
    let first = infos.first().ok_or_else(super::dial::no_url)?;
    let settings = first.redis_settings();
    if infos.iter().any(|info| {
        let other = info.redis_settings();
        other.username() != settings.username() || other.password() != settings.password()
    }) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "every sentinel URL must carry the same credentials",
        )));
    }
    let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if infos.iter().any(|info| tls(info) != tls(first)) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "every sentinel URL must have the same scheme (redis:// or rediss://)",
        )));
    }
    // A sentinel has no databases (it refuses `SELECT`): a database in its URL would leave
    // the `+switch-master` listeners unable to connect.
    if infos.iter().any(|info| info.redis_settings().db() != 0) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a sentinel URL names no database; the data nodes' is set with primary_db",
        )));
    }
    let addresses = infos.iter().map(|info| info.addr().clone());
    let mut builder = SentinelClientBuilder::new(addresses, service, SentinelServerType::Master)?
        .set_client_to_redis_db(auth.db);
    if let Some(username) = settings.username() {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(username) = &auth.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &auth.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if tls(first) {
        builder = with_tls(builder, dial);
    }
    Ok(builder)
}

/// TLS to the sentinels and to the data nodes, trusting the dial's root certificates.
fn with_tls(builder: SentinelClientBuilder, dial: &Dial) -> SentinelClientBuilder {
    let builder = builder
        .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    #[cfg(feature = "tls")]
    if let Some(root_cert) = &dial.root_certificates {
        return builder
            .set_client_to_sentinel_certificates(dial.certificates(root_cert))
            .set_client_to_redis_certificates(dial.certificates(root_cert));
    }
    let _ = dial;
    builder
}

/// Whether a reply says the server is no longer the primary: a demoted primary answers
/// writes with `READONLY`.
pub(super) fn demoted(error: &redis::RedisError) -> bool {
    let demoted = error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
    if demoted {
        warn!(%error, "the Redis primary was demoted: asking the sentinels again");
    }
    demoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_is_for_its_service_alone() {
        let message = |payload: &str| {
            vec![
                Value::BulkString(SWITCH_MASTER.into()),
                Value::BulkString(payload.into()),
            ]
        };
        let switch = message("mymaster 127.0.0.1 6379 127.0.0.1 6380");
        assert!(names_service(&switch, "mymaster"));
        assert!(!names_service(&switch, "my"), "a prefix of the name");
        assert!(!names_service(
            &message("other 127.0.0.1 1 127.0.0.1 2"),
            "mymaster"
        ));
        assert!(!names_service(&[], "mymaster"), "no payload");
        assert_eq!(announced(&switch), Some(("127.0.0.1".to_owned(), 6380)));
        assert_eq!(announced(&message("mymaster 127.0.0.1 6379")), None);
        assert_eq!(announced(&message("mymaster a 1 b port")), None);
    }
}
