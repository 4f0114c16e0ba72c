//! The liveness of one server's subscriber connection.
//!
//! A connection that goes silent without closing (a half-open TCP connection: a NAT or a
//! firewall that dropped an idle flow) delivers no message, and no error either: the
//! subscriber would wait for messages that never come, L1 would trust entries whose changes it
//! never hears, and followers would sleep through their slow poll after every fill.
//!
//! So a task of the subscriber's own, its watchman, sends it a `PING` every second (on RESP3 a
//! subscribed connection answers it as any other). One unanswered within a second counts
//! notifications as lost: L1 trusts nothing it holds, followers poll on their backoff, and
//! `Cache::health` says so; an answer that comes late after all (a busy server) restores them.
//! A `PING` the connection gives up on (its response timeout) means the connection is silent
//! for good, and redis-rs's `ConnectionManager` reconnects after an error that drops its
//! connection, never after a timeout: so the subscriber's manager is replaced by a new one,
//! which connects anew and subscribes again to every namespace. The old one is dropped; its
//! messages, should any still arrive, are ignored (each manager's carry its [`Generation`]).
//! After each answer, the watchman also subscribes again any namespace whose subscription
//! failed or was dropped, so notifications come back by themselves, with or without traffic.
//!
//! A Redis Cluster's subscriber has no watchman: its subscriptions are spread over connections
//! to several nodes, which a `PING` to the cluster does not reach.
//!
//! A Sentinel service's subscriber (feature `sentinel`) follows its primary: each round, the
//! watchman first looks whether the store has found the primary somewhere else since the
//! subscriber's connection was made (see `sentinel.rs`), and if so replaces the connection
//! by one to the new primary, as for a silent one. Until the primary is first found, there
//! is no connection, and subscriptions fail (and are tried again once there is).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "sentinel")]
use redis::ConnectionInfo;
use redis::RedisResult;
use tracing::{debug, info, warn};

use super::connection::Connection;
use super::dial::PING_EVERY;
use super::link::Link;
#[cfg(feature = "sentinel")]
use super::sentinel::Primary;

/// How long a `PING` may take before notifications count as lost.
const PING_DEADLINE: Duration = Duration::from_secs(1);

/// Which of a subscriber's successive managers a message came from: only the current one's
/// count.
#[derive(Clone)]
pub(super) struct Generation {
    mine: u64,
    current: Arc<AtomicU64>,
}

impl Generation {
    /// Whether the manager of this generation is still the subscriber's.
    pub(super) fn is_current(&self) -> bool {
        self.current.load(Ordering::SeqCst) == self.mine
    }
}

/// Where the pushes of a manager of a generation go: made anew for each manager, so that a
/// replaced one's are told apart.
pub(super) type Pushes = Arc<dyn Fn(Generation) -> Arc<dyn AsyncPushSender> + Send + Sync>;

/// What the watchman tells of the subscriber's connection (see the [module's page](self)).
pub(super) trait Listener: Send + Sync + 'static {
    /// A `PING` went unanswered past its deadline.
    fn silent(&self);
    /// A `PING` was answered.
    fn answered(&self);
    /// The connection was replaced by a new one, with no subscription yet.
    fn replaced(&self);
}

/// One server's subscriber connection, replaced when it goes silent; cheap to clone.
#[derive(Clone)]
pub(super) struct ServerSubscriber(Arc<Slot>);

struct Slot {
    /// The server the managers connect to: where the primary was last found, for a
    /// following subscriber (none until it is found).
    client: Mutex<Option<redis::Client>>,
    /// The primary a subscriber follows, and the count of its moves its client is of.
    #[cfg(feature = "sentinel")]
    primary: Option<(Arc<Primary>, AtomicU64)>,
    /// The managers' settings, but their push sender: each manager gets its own.
    config: ConnectionManagerConfig,
    /// Where the managers' messages go.
    pushes: Pushes,
    generation: Arc<AtomicU64>,
    current: Mutex<Option<ConnectionManager>>,
}

impl ServerSubscriber {
    /// A subscriber that connects on its first use, and reconnects by itself after its
    /// connection drops (`config` sets how).
    pub(super) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        pushes: Pushes,
    ) -> RedisResult<Self> {
        let generation = Arc::new(AtomicU64::new(0));
        let first = Generation {
            mine: 0,
            current: Arc::clone(&generation),
        };
        let manager = manager(&client, &config, &pushes, first)?;
        Ok(ServerSubscriber(Arc::new(Slot {
            client: Mutex::new(Some(client)),
            #[cfg(feature = "sentinel")]
            primary: None,
            config,
            pushes,
            generation,
            current: Mutex::new(Some(manager)),
        })))
    }

    /// A subscriber that follows a Sentinel service's `primary`: it connects where the store
    /// found it last (`resp3` makes a client of that), and moves when the store finds it
    /// elsewhere.
    #[cfg(feature = "sentinel")]
    pub(super) fn following(
        primary: Arc<Primary>,
        resp3: impl Fn(ConnectionInfo) -> RedisResult<redis::Client>,
        config: ConnectionManagerConfig,
        pushes: Pushes,
    ) -> RedisResult<Self> {
        let subscriber = ServerSubscriber(Arc::new(Slot {
            client: Mutex::new(None),
            primary: Some((primary, AtomicU64::new(0))),
            config,
            pushes,
            generation: Arc::new(AtomicU64::new(0)),
            current: Mutex::new(None),
        }));
        subscriber.follow(resp3)?;
        Ok(subscriber)
    }

    /// Moves a following subscriber to where the store found the primary last, if that is
    /// not where its connection goes: whether it moved.
    #[cfg(feature = "sentinel")]
    pub(super) fn follow(
        &self,
        resp3: impl Fn(ConnectionInfo) -> RedisResult<redis::Client>,
    ) -> RedisResult<bool> {
        let Some((primary, seen)) = &self.0.primary else {
            return Ok(false);
        };
        let (Some(info), moves) = primary.current() else {
            return Ok(false);
        };
        if seen.load(Ordering::SeqCst) == moves && crate::sync::lock(&self.0.current).is_some() {
            return Ok(false);
        }
        *crate::sync::lock(&self.0.client) = Some(resp3(info)?);
        self.replace()?;
        seen.store(moves, Ordering::SeqCst);
        Ok(true)
    }

    /// The current connection, to subscribe on; none while a following subscriber has not
    /// found the primary.
    pub(super) fn connection(&self) -> RedisResult<Connection> {
        let manager = self.manager().ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Io, "the Redis primary is not known yet"))
        })?;
        Ok(Connection::Server(Link::waiting(manager)))
    }

    fn manager(&self) -> Option<ConnectionManager> {
        crate::sync::lock(&self.0.current).clone()
    }

    /// The generation of the current manager.
    #[cfg(test)]
    pub(super) fn generation(&self) -> Generation {
        Generation {
            mine: self.0.generation.load(Ordering::SeqCst),
            current: Arc::clone(&self.0.generation),
        }
    }

    /// Puts a new manager in place of the current one, whose messages are ignored from now on.
    pub(super) fn replace(&self) -> RedisResult<()> {
        let Some(client) = crate::sync::lock(&self.0.client).clone() else {
            return Ok(());
        };
        let mut current = crate::sync::lock(&self.0.current);
        let next = Generation {
            mine: self.0.generation.load(Ordering::SeqCst).wrapping_add(1),
            current: Arc::clone(&self.0.generation),
        };
        let mine = next.mine;
        *current = Some(manager(&client, &self.0.config, &self.0.pushes, next)?);
        self.0.generation.store(mine, Ordering::SeqCst);
        Ok(())
    }

    /// Starts the watchman (see the [module's page](self)), which ends once the subscriber is
    /// dropped and tells what it finds to the [`Listener`] that `listener` makes of the
    /// subscriber each round (it holds the subscriber no longer); `ping_wait` bounds its wait
    /// for one `PING` (a connection attempt and a reply). Without a runtime, there is none.
    pub(super) fn keep_watch<L: Listener>(
        &self,
        listener: impl Fn(ServerSubscriber) -> L + Send + 'static,
        follow: impl Fn(&ServerSubscriber) -> RedisResult<bool> + Send + 'static,
        ping_wait: Duration,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watch = watch(Arc::downgrade(&self.0), listener, follow, ping_wait);
        runtime.spawn(watch);
    }
}

/// A manager whose messages go where `pushes` sends those of `generation`.
fn manager(
    client: &redis::Client,
    config: &ConnectionManagerConfig,
    pushes: &Pushes,
    generation: Generation,
) -> RedisResult<ConnectionManager> {
    let config = config.clone().set_push_sender(pushes(generation));
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

/// The watchman: a `PING` every second, for as long as the subscriber lives.
async fn watch<L: Listener>(
    slot: Weak<Slot>,
    listener: impl Fn(ServerSubscriber) -> L,
    follow: impl Fn(&ServerSubscriber) -> RedisResult<bool>,
    ping_wait: Duration,
) {
    loop {
        tokio::time::sleep(PING_EVERY).await;
        let Some(subscriber) = slot.upgrade().map(ServerSubscriber) else {
            return;
        };
        let listening = listener(subscriber.clone());
        match follow(&subscriber) {
            Ok(false) => ping(&subscriber, &listening, ping_wait).await,
            Ok(true) => {
                info!("the subscriber follows the Redis primary to its new server");
                listening.replaced();
            }
            Err(error) => warn!(%error, "cannot move the subscriber to the Redis primary"),
        }
    }
}

/// One `PING` of the subscriber's connection, and what its answer (or its silence) means.
async fn ping(subscriber: &ServerSubscriber, notifications: &impl Listener, ping_wait: Duration) {
    let (Some(mut manager), command) = (subscriber.manager(), redis::cmd("PING")) else {
        return;
    };
    let ping = command.query_async::<()>(&mut manager);
    tokio::pin!(ping);
    let answer = match tokio::time::timeout(PING_DEADLINE, &mut ping).await {
        Ok(answer) => answer,
        Err(_) => {
            notifications.silent();
            match tokio::time::timeout(ping_wait, ping).await {
                Ok(answer) => answer,
                // Still connecting (the server down): the manager keeps trying.
                Err(_) => return,
            }
        }
    };
    match answer {
        Ok(()) => notifications.answered(),
        Err(error) if error.is_timeout() => {
            warn!(%error, "the subscriber's connection went silent: connecting a new one; followers poll meanwhile");
            match subscriber.replace() {
                Ok(()) => {
                    notifications.replaced();
                    info!("a new subscriber connection is on its way");
                }
                Err(error) => warn!(%error, "cannot replace the subscriber's connection"),
            }
        }
        // A dropped connection: its manager reconnects by itself, and said so.
        Err(error) => debug!(%error, "the subscriber's PING failed"),
    }
}
