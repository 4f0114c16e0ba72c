//! How calls run on one connection (a server's, or one node's of a cluster): an `EVALSHA`
//! or a pipeline of them, the script loaded and the call sent again on `NOSCRIPT`; and the
//! replies of a pipeline of lookups. Below the store's connection and the cluster's, which
//! both send through these.

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisResult, Script, ServerErrorKind,
    Value,
};

use super::lookup::LookupReplies;

/// Runs `call`, an `EVALSHA` of `script`, on `connection`: on `NOSCRIPT`, loads the script
/// and runs it again.
pub(super) async fn evalsha<T: FromRedisValue>(
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

/// The replies of `keys` lookups, three each, in order.
pub(super) fn lookup_replies(replies: Vec<Value>, keys: usize) -> RedisResult<Vec<LookupReplies>> {
    if replies.len() != 3 * keys {
        return Err(RedisError::from((
            ErrorKind::Parse,
            "a pipeline of lookups answered the wrong number of replies",
        )));
    }
    let mut replies = replies.into_iter();
    let mut found = Vec::with_capacity(keys);
    while let (Some(held), Some(value), Some(pttl)) =
        (replies.next(), replies.next(), replies.next())
    {
        found.push((
            redis::from_redis_value(held)?,
            redis::from_redis_value(value)?,
            redis::from_redis_value(pttl)?,
        ));
    }
    Ok(found)
}

/// `calls` (`EVALSHA`s of `script`) in one pipeline, loading the script on `NOSCRIPT`.
pub(super) async fn pipelined(
    script: &Script,
    calls: &[Cmd],
    connection: &mut impl ConnectionLike,
) -> RedisResult<()> {
    let mut pipeline = Pipeline::with_capacity(calls.len());
    for call in calls {
        pipeline.add_command(call.clone()).ignore();
    }
    match pipeline.query_async(connection).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(connection).await?;
            pipeline.query_async(connection).await
        }
        answer => answer,
    }
}

/// `calls` (`EVALSHA`s of `script`) in one pipeline, loading the script on `NOSCRIPT`: each
/// call's reply (a server's error reply is that call's error).
pub(super) async fn each_pipelined(
    script: &Script,
    calls: &[Cmd],
    connection: &mut impl ConnectionLike,
) -> RedisResult<Vec<RedisResult<Value>>> {
    let mut pipeline = Pipeline::with_capacity(calls.len());
    for call in calls {
        pipeline.add_command(call.clone());
    }
    pipeline.ignore_errors();
    let mut replies: Vec<Value> = pipeline.query_async(connection).await?;
    let no_script = |reply: &Value| matches!(reply, Value::ServerError(error) if error.kind() == Some(ServerErrorKind::NoScript));
    if replies.iter().any(no_script) {
        script.load_async(connection).await?;
        replies = pipeline.query_async(connection).await?;
    }
    Ok(replies
        .into_iter()
        .map(|reply| match reply {
            Value::ServerError(error) => Err(error.into()),
            reply => Ok(reply),
        })
        .collect())
}
