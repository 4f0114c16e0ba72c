//! The connection to one server, kept up through an outage of any length.
//!
//! redis-rs's `ConnectionManager` reconnects by itself, but only when a call asks for it: a
//! call that finds the connection dropped starts one reconnect attempt (a few retries), and if
//! that attempt fails while the server is down, the manager keeps the failure and hands it to
//! the next call, however much later, which only then starts another attempt. So a blip left
//! each process with a broken connection until its next call failed: the first stampede after
//! the server returned cost one load per process.
//!
//! A [`Link`] stands in front of the manager: once a call finds the connection lost, the link
//! is *down*, and calls fail at once, without touching the manager (a dead server costs no
//! request a connection attempt, nor a timeout), while one task of its own, the keeper, asks
//! the server for a `PING` until it answers, each attempt making the manager reconnect. Only
//! then is the link up again, on a connection that answered, so no call is ever handed a
//! stored connect error. A store can also start down, and be brought up by its keeper: the
//! store built while the server is unreachable.
//!
//! A link to a Sentinel service's primary (feature `sentinel`) *follows* it: its keeper asks
//! the sentinels where the primary is and connects there (a new connection each time: see
//! `sentinel.rs` for why never the old one), and a `READONLY` reply (a demoted primary) or
//! the sentinels' announcement takes it down as a lost connection does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, RedisResult};
use tracing::{debug, info, warn};

use super::dial::KEEPER_PAUSE;
#[cfg(feature = "sentinel")]
use super::sentinel::Primary;

/// One server's connection; cheap to clone, never locked (but a following link's swap).
#[derive(Clone)]
pub(super) struct Link {
    manager: Managed,
    /// Whether the link watches its connection and fails calls while it is down: the store's
    /// connection does; the subscriber's waits for its connection instead (a subscription
    /// made during an outage completes when the server is back).
    watch: Option<Arc<Watch>>,
}

/// The connection of a link: one server's for good, or the primary's, which moves.
#[derive(Clone)]
enum Managed {
    Fixed(ConnectionManager),
    #[cfg(feature = "sentinel")]
    Following(Arc<Following>),
}

/// A link's connection to a Sentinel service's primary, swapped by the keeper when it moves.
#[cfg(feature = "sentinel")]
struct Following {
    primary: Arc<Primary>,
    /// The connection the keeper made last; none until it has made one.
    current: std::sync::Mutex<Option<ConnectionManager>>,
}

/// The state of a watched link, shared with its keeper.
struct Watch {
    down: AtomicBool,
    /// The server, for the log (without credentials).
    address: String,
    /// How long the keeper waits for one `PING` (a connection attempt and a reply).
    ping_wait: Duration,
}

impl Link {
    /// A link that waits for its connection, however long the manager takes to reconnect.
    pub(super) fn waiting(manager: ConnectionManager) -> Self {
        Link {
            manager: Managed::Fixed(manager),
            watch: None,
        }
    }

    /// A watched link over a manager that answered; see the [module docs](self).
    pub(super) fn watched(
        manager: ConnectionManager,
        address: String,
        ping_wait: Duration,
    ) -> Self {
        Link::watching(Managed::Fixed(manager), address, ping_wait)
    }

    fn watching(manager: Managed, address: String, ping_wait: Duration) -> Self {
        Link {
            manager,
            watch: Some(Arc::new(Watch {
                down: AtomicBool::new(false),
                address,
                ping_wait,
            })),
        }
    }

    /// A watched link that starts down, over a manager that has not connected yet: its keeper
    /// connects it in the background. Needs a tokio runtime.
    pub(super) fn starting_down(
        manager: ConnectionManager,
        address: String,
        ping_wait: Duration,
    ) -> Self {
        Link::watched(manager, address, ping_wait).down()
    }

    /// A watched link that follows a Sentinel service's `primary`, over `first`, a connection
    /// to it that answered; without one, it starts down, and its keeper connects it.
    #[cfg(feature = "sentinel")]
    pub(super) fn following(
        primary: Arc<Primary>,
        first: Option<ConnectionManager>,
        address: String,
        ping_wait: Duration,
    ) -> Self {
        let up = first.is_some();
        let following = Following {
            primary,
            current: std::sync::Mutex::new(first),
        };
        let link = Link::watching(Managed::Following(Arc::new(following)), address, ping_wait);
        if up {
            link
        } else {
            link.down()
        }
    }

    /// The link taken down, its keeper started.
    fn down(self) -> Self {
        if let Some(watch) = &self.watch {
            watch.down.store(true, Ordering::SeqCst);
            keep(&self.manager, watch);
        }
        self
    }

    /// Takes a following link down (its keeper asks the sentinels again) unless it already
    /// is: the primary moved.
    #[cfg(feature = "sentinel")]
    pub(super) fn moved(&self) {
        if let Some(watch) = &self.watch {
            if !watch.down.swap(true, Ordering::SeqCst) {
                warn!(address = %watch.address, "the Redis primary moved: calls fail at once until the new one answers");
                keep(&self.manager, watch);
            }
        }
    }

    /// What takes this following link down when the sentinels announce a new primary; it
    /// holds the link no longer (a store dropped stops listening).
    #[cfg(feature = "sentinel")]
    pub(super) fn mover(&self) -> impl Fn() + Send + Sync + 'static {
        let watch = self.watch.as_ref().map(Arc::downgrade);
        let following = match &self.manager {
            Managed::Following(following) => Some(Arc::downgrade(following)),
            Managed::Fixed(_) => None,
        };
        move || {
            let watch = watch.as_ref().and_then(Weak::upgrade);
            let following = following.as_ref().and_then(Weak::upgrade);
            if let (Some(watch), Some(following)) = (watch, following) {
                let link = Link {
                    manager: Managed::Following(following),
                    watch: Some(watch),
                };
                link.moved();
            }
        }
    }

    /// The primary a following link follows.
    #[cfg(feature = "sentinel")]
    pub(super) fn primary(&self) -> Option<&Arc<Primary>> {
        match &self.manager {
            Managed::Fixed(_) => None,
            Managed::Following(following) => Some(&following.primary),
        }
    }

    /// The manager to make a call on, or an error at once while the link is down.
    pub(super) fn manager(&self) -> RedisResult<ConnectionManager> {
        let not_connected = || {
            RedisError::from((
                ErrorKind::Io,
                "not connected",
                "reconnecting in the background".to_owned(),
            ))
        };
        match &self.watch {
            Some(watch) if watch.down.load(Ordering::Relaxed) => Err(not_connected()),
            _ => self.manager.current().ok_or_else(not_connected),
        }
    }

    /// Looks at the outcome of a call: a lost connection takes the link down, and starts its
    /// keeper.
    pub(super) fn saw<T>(&self, result: &RedisResult<T>) {
        let (Some(watch), Err(error)) = (&self.watch, result) else {
            return;
        };
        if (error.is_unrecoverable_error() || self.demoted(error))
            && !watch.down.swap(true, Ordering::SeqCst)
        {
            warn!(address = %watch.address, %error, "Redis connection lost: calls fail at once until it is back");
            keep(&self.manager, watch);
        }
    }

    /// Whether `error` says that a following link's server is no longer the primary (a fixed
    /// link's server is what the user named: it stays, whatever it answers).
    fn demoted(&self, error: &RedisError) -> bool {
        #[cfg(feature = "sentinel")]
        if let Managed::Following(_) = &self.manager {
            return super::sentinel::demoted(error);
        }
        let _ = error;
        false
    }

    /// Looks at an error a call met inside its replies (a pipeline's): a following link's
    /// demoted primary takes it down, as [`saw`](Self::saw) does.
    pub(super) fn saw_error(&self, error: &RedisError) {
        if self.demoted(error) {
            self.saw::<()>(&Err(error.clone()));
        }
    }

    /// Whether the link is down (its keeper reconnecting).
    pub(super) fn is_down(&self) -> bool {
        self.watch
            .as_ref()
            .is_some_and(|watch| watch.down.load(Ordering::Relaxed))
    }

    /// Checks the connection in the background (a `PING`), when there is reason to think it
    /// was lost (the subscriber's connection dropped): a connection that the server closed
    /// while nobody used it is found out now, not by the next call.
    pub(super) fn check(&self) {
        if self.watch.is_none() || self.is_down() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let link = self.clone();
        runtime.spawn(async move {
            let Ok(mut manager) = link.manager() else {
                return;
            };
            let pinged = redis::cmd("PING").query_async::<()>(&mut manager).await;
            link.saw(&pinged);
        });
    }

    /// The manager itself, for subscriptions (which only a waiting link makes).
    pub(super) fn manager_anyway(&self) -> RedisResult<ConnectionManager> {
        match &self.manager {
            Managed::Fixed(manager) => Ok(manager.clone()),
            #[cfg(feature = "sentinel")]
            Managed::Following(_) => self.manager(),
        }
    }
}

impl Managed {
    /// The connection to make a call on; none while a following link has not connected.
    fn current(&self) -> Option<ConnectionManager> {
        match self {
            Managed::Fixed(manager) => Some(manager.clone()),
            #[cfg(feature = "sentinel")]
            Managed::Following(following) => crate::sync::lock(&following.current).clone(),
        }
    }
}

/// Starts the keeper of a link that went down: it `PING`s the server until it answers (each
/// `PING` that meets a lost connection or a stored failure makes the manager try again), then
/// brings the link up. It ends when the store is dropped. Without a runtime, the link comes
/// back up at once, and calls reach the manager as they would without a link.
fn keep(managed: &Managed, watch: &Arc<Watch>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        watch.down.store(false, Ordering::SeqCst);
        return;
    };
    let manager = match managed {
        Managed::Fixed(manager) => manager.clone(),
        #[cfg(feature = "sentinel")]
        Managed::Following(following) => {
            runtime.spawn(follow(Arc::clone(following), Arc::downgrade(watch)));
            return;
        }
    };
    let watch: Weak<Watch> = Arc::downgrade(watch);
    runtime.spawn(async move {
        loop {
            let Some(wait) = watch.upgrade().map(|watch| watch.ping_wait) else {
                return;
            };
            let pinged = tokio::time::timeout(
                wait,
                redis::cmd("PING").query_async::<()>(&mut manager.clone()),
            )
            .await;
            let Some(watch) = watch.upgrade() else {
                return;
            };
            match pinged {
                Ok(Ok(())) => {
                    watch.down.store(false, Ordering::SeqCst);
                    info!(address = %watch.address, "Redis answers again: the connection is back");
                    return;
                }
                Ok(Err(error)) => {
                    debug!(address = %watch.address, %error, "Redis still unreachable")
                }
                Err(_) => debug!(address = %watch.address, "Redis still unreachable (no answer)"),
            }
            drop(watch);
            tokio::time::sleep(KEEPER_PAUSE).await;
        }
    });
}

/// The keeper of a following link: asks the sentinels where the primary is and connects
/// there, until a connection answers; then the link is up again, on it.
#[cfg(feature = "sentinel")]
async fn follow(following: Arc<Following>, watch: Weak<Watch>) {
    loop {
        let dialed = following.primary.dial().await;
        let Some(watch) = watch.upgrade() else {
            return;
        };
        match dialed {
            Ok(manager) => {
                *crate::sync::lock(&following.current) = Some(manager);
                watch.down.store(false, Ordering::SeqCst);
                info!(address = %watch.address, "the Redis primary answers: the connection is back");
                return;
            }
            Err(error) => debug!(address = %watch.address, %error, "no Redis primary answers yet"),
        }
        drop(watch);
        tokio::time::sleep(KEEPER_PAUSE).await;
    }
}
