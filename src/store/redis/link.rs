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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, RedisResult};
use tracing::{debug, info, warn};

/// How long the keeper waits between two `PING`s that found no server.
pub(super) const KEEPER_PAUSE: Duration = Duration::from_millis(250);

/// One server's connection; cheap to clone, never locked.
#[derive(Clone)]
pub(super) struct Link {
    manager: ConnectionManager,
    /// Whether the link watches its connection and fails calls while it is down: the store's
    /// connection does; the subscriber's waits for its connection instead (a subscription
    /// made during an outage completes when the server is back).
    watch: Option<Arc<Watch>>,
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
            manager,
            watch: None,
        }
    }

    /// A watched link over a manager that answered; see the [module docs](self).
    pub(super) fn watched(
        manager: ConnectionManager,
        address: String,
        ping_wait: Duration,
    ) -> Self {
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
        let link = Link::watched(manager, address, ping_wait);
        if let Some(watch) = &link.watch {
            watch.down.store(true, Ordering::SeqCst);
            keep(&link.manager, watch);
        }
        link
    }

    /// The manager to make a call on, or an error at once while the link is down.
    pub(super) fn manager(&self) -> RedisResult<ConnectionManager> {
        match &self.watch {
            Some(watch) if watch.down.load(Ordering::Relaxed) => Err(RedisError::from((
                ErrorKind::Io,
                "not connected",
                "reconnecting in the background".to_owned(),
            ))),
            _ => Ok(self.manager.clone()),
        }
    }

    /// Looks at the outcome of a call: a lost connection takes the link down, and starts its
    /// keeper.
    pub(super) fn saw<T>(&self, result: &RedisResult<T>) {
        let (Some(watch), Err(error)) = (&self.watch, result) else {
            return;
        };
        if error.is_unrecoverable_error() && !watch.down.swap(true, Ordering::SeqCst) {
            warn!(address = %watch.address, %error, "Redis connection lost: calls fail at once until it is back");
            keep(&self.manager, watch);
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
    pub(super) fn manager_anyway(&self) -> ConnectionManager {
        self.manager.clone()
    }
}

/// Starts the keeper of a link that went down: it `PING`s the server until it answers (each
/// `PING` that meets a lost connection or a stored failure makes the manager try again), then
/// brings the link up. It ends when the store is dropped. Without a runtime, the link comes
/// back up at once, and calls reach the manager as they would without a link.
fn keep(manager: &ConnectionManager, watch: &Arc<Watch>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        watch.down.store(false, Ordering::SeqCst);
        return;
    };
    let (manager, watch): (ConnectionManager, Weak<Watch>) =
        (manager.clone(), Arc::downgrade(watch));
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
