//! The connection of a `RedisStore`: one server (a [`Link`]) or a Redis Cluster, cheap to
//! clone and never locked; which of its connections a script runs on (how, on one of them, is
//! `calls.rs`) and how its errors become store errors.

#[cfg(feature = "cluster")]
use super::cluster::Cluster;
use std::fmt;

use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisResult, Script, ServerErrorKind,
    Value,
};

use super::calls::{each_pipelined, evalsha, lookup_replies, pipelined};
use super::link::Link;
use super::lookup::LookupReplies;
use super::RedisStore;
use crate::store::error::{StoreError, StoreErrorKind};
use crate::store::key::StoreKey;

/// A connection to one server or to a cluster; cheap to clone, never locked.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server, reconnecting by itself, through an outage of any length.
    Server(Link),
    /// A Redis Cluster: each command goes to the node that serves its first key's slot
    /// (following `MOVED` and `ASK`); the connections to the nodes reconnect by themselves.
    #[cfg(feature = "cluster")]
    Cluster(Cluster),
}

impl Connection {
    /// Shows the link an error that a call met inside its replies (see [`Link::saw_error`]).
    fn saw_error(&self, error: &RedisError) {
        match self {
            Connection::Server(link) => link.saw_error(error),
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => {}
        }
    }

    /// The Sentinel service's primary that the store's connection follows.
    #[cfg(feature = "sentinel")]
    pub(super) fn primary(&self) -> Option<&std::sync::Arc<super::sentinel::Primary>> {
        match self {
            Connection::Server(link) => link.primary(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => None,
        }
    }

    /// Runs `call`, an `EVALSHA` of `script`. A `NOSCRIPT` reply loads the script (on a
    /// cluster: on every node, as `SCRIPT LOAD` is routed to all of them) and runs it again.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> RedisResult<T> {
        match self {
            Connection::Server(link) => {
                let answer = evalsha(script, call, &mut link.manager()?).await;
                link.saw(&answer);
                answer
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => evalsha(script, call, &mut cluster.connection()?).await,
        }
    }

    /// Runs a pipeline: its commands go out in one write and their replies come back together.
    pub(super) async fn pipeline<T: FromRedisValue>(&self, pipeline: &Pipeline) -> RedisResult<T> {
        match self {
            Connection::Server(link) => {
                let answer = pipeline.query_async(&mut link.manager()?).await;
                link.saw(&answer);
                answer
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => pipeline.query_async(&mut cluster.connection()?).await,
        }
    }

    /// The replies to the lookups of `keys`, each three commands that `add` puts in a
    /// pipeline (see [`LookupReplies`]): one round trip on one server; on a cluster, one
    /// pipeline per master, all at once (see [`Cluster`]).
    pub(super) async fn lookups(
        &self,
        keys: &[StoreKey],
        add: impl Fn(&mut Pipeline, &StoreKey),
    ) -> RedisResult<Vec<LookupReplies>> {
        match self {
            Connection::Server(link) => {
                let mut pipeline = Pipeline::with_capacity(3 * keys.len());
                for key in keys {
                    add(&mut pipeline, key);
                }
                pipeline.ignore_errors();
                let answer = pipeline.query_async(&mut link.manager()?).await;
                link.saw(&answer);
                lookup_replies(answer?, keys.len())
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => cluster.lookups(keys, add).await,
        }
    }

    /// Runs `calls`, each an `EVALSHA` of `script` whose keys share one slot, pipelined: one
    /// round trip on one server; on a cluster, one pipeline per master, all at once (see
    /// [`Cluster`]). A `NOSCRIPT` reply loads the script and runs the
    /// pipeline again, so its calls must be safe to repeat. The first error, if any.
    pub(super) async fn invoke_pipelined(
        &self,
        script: &Script,
        calls: Vec<Cmd>,
    ) -> RedisResult<()> {
        match self {
            Connection::Server(link) => {
                let answer = pipelined(script, &calls, &mut link.manager()?).await;
                link.saw(&answer);
                answer
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => cluster.invoke_pipelined(script, calls).await,
        }
    }

    /// Runs `calls`, each an `EVALSHA` of `script` whose keys share one slot, pipelined as
    /// [`invoke_pipelined`](Self::invoke_pipelined) runs them: each call's reply, in order.
    pub(super) async fn invoke_each(
        &self,
        script: &Script,
        calls: Vec<Cmd>,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        match self {
            Connection::Server(link) => {
                let answer = each_pipelined(script, &calls, &mut link.manager()?).await;
                link.saw(&answer);
                answer
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => cluster.invoke_each(script, calls).await,
        }
    }

    /// Runs one plain command.
    pub(super) async fn query<T: FromRedisValue>(&self, command: &Cmd) -> RedisResult<T> {
        match self {
            Connection::Server(link) => {
                let answer = command.query_async(&mut link.manager()?).await;
                link.saw(&answer);
                answer
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => command.query_async(&mut cluster.connection()?).await,
        }
    }

    /// Checks the connection in the background, when it may have been lost (see
    /// [`Link::check`]); a cluster's connections look after themselves.
    pub(super) fn check(&self) {
        match self {
            Connection::Server(link) => link.check(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => {}
        }
    }

    /// Subscribes to a channel (on a connection that speaks RESP3 and has a push sender).
    pub(super) async fn subscribe(&self, channel: String) -> RedisResult<()> {
        match self {
            Connection::Server(link) => link.manager_anyway()?.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => {
                cluster.connection_made().await?.subscribe(channel).await
            }
        }
    }

    /// Subscribes to a shard channel (`SSUBSCRIBE`, Redis 7.0 and later), on the node that
    /// serves its slot; the cluster client moves the subscription when the slot moves. One
    /// server has no use for them (see `RedisStoreBuilder::sharded_notifications`).
    #[cfg(feature = "cluster")]
    pub(super) async fn ssubscribe(&self, channel: String) -> RedisResult<()> {
        match self {
            Connection::Server(_) => Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "sharded pub/sub is for a cluster",
            ))),
            Connection::Cluster(cluster) => {
                cluster.connection_made().await?.ssubscribe(channel).await
            }
        }
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
            .map_err(|error| self.error(error))
    }

    /// A Redis error as a store error, with the server's address (never its credentials).
    pub(super) fn error(&self, error: RedisError) -> StoreError {
        // A pipeline's replies carry their own errors, which the link did not see.
        self.connection.saw_error(&error);
        store_error(format_args!("Redis at {}", self.address), error)
    }
}

/// A Redis error as the source of a store error, with `message` saying what failed.
pub(super) fn store_error(message: impl fmt::Display, error: RedisError) -> StoreError {
    StoreError::with_source(kind_of(&error), message, error)
}

/// What a Redis error means for a store call.
fn kind_of(error: &RedisError) -> StoreErrorKind {
    if error.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if error.is_io_error() || error.is_connection_dropped() {
        return StoreErrorKind::Connection;
    }
    match error.kind() {
        ErrorKind::InvalidClientConfig => StoreErrorKind::Configuration,
        ErrorKind::AuthenticationFailed
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::RESP3NotSupported
        | ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::BusyLoading,
        ) => StoreErrorKind::Connection,
        // Refused credentials, as a reply to the handshake or to a command.
        _ if matches!(error.code(), Some("NOAUTH" | "WRONGPASS")) => StoreErrorKind::Connection,
        _ => StoreErrorKind::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_error(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).and_then(redis::Value::extract_error) {
            Err(error) => error,
            Ok(value) => panic!("not an error reply: {value:?}"),
        }
    }

    #[test]
    fn redis_errors_have_the_kind_of_what_went_wrong() {
        let io = |kind| RedisError::from(std::io::Error::from(kind));
        let cases = [
            (io(std::io::ErrorKind::TimedOut), StoreErrorKind::Timeout),
            (
                io(std::io::ErrorKind::ConnectionRefused),
                StoreErrorKind::Connection,
            ),
            (
                RedisError::from((ErrorKind::InvalidClientConfig, "bad URL")),
                StoreErrorKind::Configuration,
            ),
            (
                reply_error(b"-NOAUTH Authentication required.\r\n"),
                StoreErrorKind::Connection,
            ),
            (
                reply_error(b"-CLUSTERDOWN The cluster is down\r\n"),
                StoreErrorKind::Connection,
            ),
            (
                reply_error(b"-READONLY You can't write against a read only replica.\r\n"),
                StoreErrorKind::Connection,
            ),
            (
                reply_error(b"-ERR syntax error\r\n"),
                StoreErrorKind::Protocol,
            ),
            (
                reply_error(b"-WRONGTYPE Operation against a key\r\n"),
                StoreErrorKind::Protocol,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(kind_of(&error), kind, "{error}");
        }
    }

    #[test]
    fn the_redis_error_is_the_source() {
        let error = store_error("Redis at redis://h:1/", reply_error(b"-ERR boom\r\n"));
        assert_eq!(error.kind(), StoreErrorKind::Protocol);
        assert_eq!(error.to_string(), "Redis at redis://h:1/");
        let source = std::error::Error::source(&error).map(ToString::to_string);
        assert!(source.is_some_and(|source| source.contains("boom")));
    }
}
