//! The connection of a `RedisStore`: one server or a Redis Cluster, cheap to clone and never
//! locked; how a script runs on it (`EVALSHA`, reloaded on `NOSCRIPT`) and how its errors
//! become store errors.

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisResult, Script, ServerErrorKind};

use super::RedisStore;
use crate::store::StoreError;

/// A connection to one server or to a cluster; cheap to clone, never locked.
#[derive(Clone)]
pub(super) enum Connection {
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
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> RedisResult<T> {
        match self {
            Connection::Server(connection) => evalsha(script, call, &mut connection.clone()).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => evalsha(script, call, &mut connection.clone()).await,
        }
    }

    /// Runs a pipeline: its commands go out in one write and their replies come back together.
    pub(super) async fn pipeline<T: FromRedisValue>(&self, pipeline: &Pipeline) -> RedisResult<T> {
        match self {
            Connection::Server(connection) => pipeline.query_async(&mut connection.clone()).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => pipeline.query_async(&mut connection.clone()).await,
        }
    }

    /// Subscribes to a channel (on a connection that speaks RESP3 and has a push sender).
    pub(super) async fn subscribe(&self, channel: String) -> RedisResult<()> {
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

impl RedisStore {
    /// Runs a script call; a Redis error becomes a store error.
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> Result<T, StoreError> {
        self.connection
            .invoke(script, call)
            .await
            .map_err(|e| self.error(&e))
    }

    /// A Redis error as a store error, with the server's address (never its credentials).
    pub(super) fn error(&self, error: &redis::RedisError) -> StoreError {
        StoreError::new(format_args!("Redis at {}: {error}", self.address))
    }
}
