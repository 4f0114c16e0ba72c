//! The connection to a Redis Cluster, made at once or in the background.
//!
//! redis-rs's cluster client connects eagerly (it reads the slot layout from a seed, then
//! connects to every node), and fails if no seed answers; once made, its connection follows
//! the cluster through failovers and reconnects by itself. So a store opened while the cluster
//! is down holds no connection yet: one task of its own, the keeper, tries to make it until
//! the cluster answers. Meanwhile the store's calls fail at once (the engine loads with
//! in-process protection), and the subscriber waits for it, as a single server's
//! [`Link`](super::link::Link) does.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::watch;
use tracing::{debug, info};

use super::dial::KEEPER_PAUSE;

/// A cluster connection, or the promise of one; cheap to clone, never locked across a call.
#[derive(Clone)]
pub(super) struct ClusterLink {
    /// The connection once made; the keeper sends it.
    made: Arc<watch::Sender<Option<ClusterConnection>>>,
}

impl ClusterLink {
    /// A link over a connection that is made.
    pub(super) fn connected(connection: ClusterConnection) -> Self {
        ClusterLink {
            made: Arc::new(watch::Sender::new(Some(connection))),
        }
    }

    /// A link whose keeper connects `client` in the background, trying again every
    /// [`KEEPER_PAUSE`] (each attempt bounded by `attempt_wait`) until the cluster answers. It
    /// ends when the link is dropped. Needs a tokio runtime.
    pub(super) fn opening(client: ClusterClient, address: String, attempt_wait: Duration) -> Self {
        let link = ClusterLink {
            made: Arc::new(watch::Sender::new(None)),
        };
        let made: Weak<_> = Arc::downgrade(&link.made);
        tokio::spawn(async move {
            loop {
                let attempt =
                    tokio::time::timeout(attempt_wait, client.get_async_connection()).await;
                let Some(made) = made.upgrade() else {
                    return;
                };
                match attempt {
                    Ok(Ok(connection)) => {
                        made.send_replace(Some(connection));
                        info!(%address, "the Redis Cluster answers: connected");
                        return;
                    }
                    Ok(Err(error)) => debug!(%address, %error, "Redis Cluster still unreachable"),
                    Err(_) => debug!(%address, "Redis Cluster still unreachable (no answer)"),
                }
                drop(made);
                tokio::time::sleep(KEEPER_PAUSE).await;
            }
        });
        link
    }

    /// The connection to make a call on, or an error at once while it is being made.
    pub(super) fn connection(&self) -> RedisResult<ClusterConnection> {
        self.made.borrow().clone().ok_or_else(|| {
            RedisError::from((
                ErrorKind::Io,
                "not connected",
                "connecting to the cluster in the background".to_owned(),
            ))
        })
    }

    /// The connection, once made, however long that takes (for subscriptions).
    pub(super) async fn connection_made(&self) -> RedisResult<ClusterConnection> {
        let mut made = self.made.subscribe();
        let connection = made
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|made| made.clone());
        // The link holds the sender, so the wait ends only with a connection.
        connection.ok_or_else(|| RedisError::from((ErrorKind::Io, "the cluster link is gone")))
    }
}
