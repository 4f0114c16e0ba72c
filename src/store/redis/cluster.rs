//! A Redis Cluster connection that knows which master serves which slot, so that a batch of
//! single-slot script calls goes out as one pipeline per master, not one per slot.
//!
//! redis-rs routes a pipeline by its first command's slot and refuses pipelines that cross
//! slots, but it can send a pipeline to the node that serves a given slot
//! (`route_pipeline`). So the connection keeps the layout it last read (`CLUSTER SLOTS`),
//! groups the calls by the master that layout names, and sends each group to that master. A
//! layout gone stale (a resharding, a failover) costs no call: a node that no longer serves a
//! command's slot answers that command `MOVED` (or `ASK`), the connection forgets its layout,
//! and sends each such call again on its own, which the client follows to the slot's node.

use std::sync::{Arc, Mutex, PoisonError};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Script, ServerErrorKind, ToRedisArgs,
    Value,
};
use tokio::task::JoinSet;

use super::calls::{evalsha, lookup_replies};
use super::cluster_link::ClusterLink;
use super::lookup::LookupReplies;
use super::names::{key_slot, KeyName};
use crate::store::key::StoreKey;

/// A cluster connection and the slot layout it last read; cheap to clone, never locked
/// across a call.
#[derive(Clone)]
pub(super) struct Cluster {
    link: ClusterLink,
    layout: Arc<Mutex<Option<Arc<Layout>>>>,
}

/// Which master served which slots, as a node said: `(first, last, master)` ranges.
struct Layout(Vec<(u16, u16, String)>);

impl Layout {
    /// The master of `slot`, if the layout names one.
    fn master_of(&self, slot: u16) -> Option<&str> {
        self.0
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, master)| master.as_str())
    }

    /// A layout from a `CLUSTER SLOTS` reply: ranges, each `[first, last, [host, port, …], …]`.
    fn read(reply: &Value) -> Option<Layout> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut layout = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(range) = range else {
                return None;
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (range.first(), range.get(1), range.get(2))
            else {
                return None;
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            let (first, last) = (u16::try_from(*first).ok()?, u16::try_from(*last).ok()?);
            layout.push((first, last, format!("{host}:{port}")));
        }
        Some(Layout(layout))
    }
}

impl Cluster {
    pub(super) fn new(link: ClusterLink) -> Self {
        Cluster {
            link,
            layout: Arc::default(),
        }
    }

    /// The connection, for calls that go to one slot's node; an error at once while it is
    /// being made.
    pub(super) fn connection(&self) -> RedisResult<ClusterConnection> {
        self.link.connection()
    }

    /// The connection, once made (for subscriptions, which wait for it).
    pub(super) async fn connection_made(&self) -> RedisResult<ClusterConnection> {
        self.link.connection_made().await
    }

    /// Runs `calls`, `EVALSHA`s of `script` each within one slot, as one pipeline per master,
    /// all at once; see the [module docs](self). The first error, if any.
    pub(super) async fn invoke_pipelined(
        &self,
        script: &Script,
        calls: Vec<Cmd>,
    ) -> RedisResult<()> {
        let mut result = Ok(());
        for reply in self.invoke_each(script, calls).await? {
            keep_first(&mut result, reply.map(drop));
        }
        result
    }

    /// Runs `calls`, `EVALSHA`s of `script` each within one slot, as one pipeline per master,
    /// all at once (see the [module docs](self)): each call's reply, in order.
    pub(super) async fn invoke_each(
        &self,
        script: &Script,
        calls: Vec<Cmd>,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let connection = self.connection()?;
        let mut replies: Vec<Option<RedisResult<Value>>> = calls.iter().map(|_| None).collect();
        let Some(layout) = self.layout(&connection).await else {
            // No layout to group by: each call on its own, routed by the client.
            let indexed = calls.into_iter().enumerate().collect();
            self.each_alone(script, indexed, &mut replies).await;
            return Ok(replies
                .into_iter()
                .map(|reply| reply.unwrap_or_else(|| Err(cancelled())))
                .collect());
        };
        // Each master, a slot of it to route by, and its calls with their indexes.
        let mut masters: Vec<(&str, u16, Indexed)> = Vec::new();
        let mut again = Vec::new();
        for (index, call) in calls.into_iter().enumerate() {
            let slot = slot_of(&call);
            match layout.master_of(slot) {
                Some(master) => match masters.iter_mut().find(|(m, _, _)| *m == master) {
                    Some((_, _, group)) => group.push((index, call)),
                    None => masters.push((master, slot, vec![(index, call)])),
                },
                None => again.push((index, call)),
            }
        }
        let mut runs = JoinSet::new();
        for (_, slot, group) in masters {
            let mut connection = connection.clone();
            runs.spawn(async move {
                let mut pipeline = Pipeline::with_capacity(group.len());
                for (_, call) in &group {
                    pipeline.add_command(call.clone());
                }
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let ran = connection
                    .route_pipeline(pipeline, 0, group.len(), route)
                    .await;
                (group, ran)
            });
        }
        while let Some(ran) = runs.join_next().await {
            let Ok((group, ran)) = ran else {
                // The group's calls keep no reply: cancelled.
                continue;
            };
            match ran {
                // A node that no longer serves some of the slots (redis-rs followed its
                // `MOVED` with the whole pipeline, to a node that refused the others), or
                // one that failed: each call again on its own, where its slot now is.
                Err(error) if moved_or_lost(&error) => {
                    self.forget_layout();
                    again.extend(group);
                }
                Err(error) => {
                    for (index, _) in group {
                        replies[index] = Some(Err(error.clone()));
                    }
                }
                Ok(ran) => {
                    for ((index, call), reply) in group.into_iter().zip(ran) {
                        match reply {
                            Value::ServerError(error) => match error.kind() {
                                Some(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                                    self.forget_layout();
                                    again.push((index, call));
                                }
                                Some(ServerErrorKind::NoScript) => again.push((index, call)),
                                _ => replies[index] = Some(Err(error.into())),
                            },
                            reply => replies[index] = Some(Ok(reply)),
                        }
                    }
                }
            }
        }
        if !again.is_empty() {
            self.each_alone(script, again, &mut replies).await;
        }
        Ok(replies
            .into_iter()
            .map(|reply| reply.unwrap_or_else(|| Err(cancelled())))
            .collect())
    }

    /// The replies to the lookups of `keys` (three commands each, put in a pipeline by
    /// `add`), in order: one pipeline per master, all at once, as
    /// [`invoke_pipelined`](Self::invoke_pipelined) sends its calls. A group that a node
    /// refused for a slot's move (or lost) goes again key by key, where the client routes it.
    pub(super) async fn lookups(
        &self,
        keys: &[StoreKey],
        add: impl Fn(&mut Pipeline, &StoreKey),
    ) -> RedisResult<Vec<LookupReplies>> {
        let connection = self.connection()?;
        let layout = self.layout(&connection).await;
        // Each group: its master (none: a key the layout does not place, alone), a slot of
        // it to route by, and the indexes of its keys.
        let mut groups: Vec<(Option<&str>, u16, Vec<usize>)> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let slot = key_slot(&KeyName::lock(key).to_redis_args().concat());
            let master = layout.as_deref().and_then(|layout| layout.master_of(slot));
            let group = master.and_then(|master| groups.iter_mut().find(|g| g.0 == Some(master)));
            match group {
                Some((_, _, members)) => members.push(index),
                None => groups.push((master, slot, vec![index])),
            }
        }
        let mut runs = JoinSet::new();
        for (master, slot, members) in groups {
            let mut pipeline = Pipeline::with_capacity(3 * members.len());
            for &index in &members {
                add(&mut pipeline, &keys[index]);
            }
            pipeline.ignore_errors();
            let mut connection = connection.clone();
            let placed = master.is_some();
            runs.spawn(async move {
                let count = 3 * members.len();
                let replies = if placed {
                    let route =
                        SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                    connection.route_pipeline(pipeline, 0, count, route).await
                } else {
                    pipeline.query_async(&mut connection).await
                };
                (members, pipeline_or_moved(replies))
            });
        }
        let mut found: Vec<Option<LookupReplies>> = keys.iter().map(|_| None).collect();
        let mut again = Vec::new();
        while let Some(ran) = runs.join_next().await {
            let (members, replies) = ran.map_err(|_| cancelled())?;
            match replies {
                Ok(replies) => {
                    let replies = lookup_replies(replies?, members.len())?;
                    for (index, replies) in members.into_iter().zip(replies) {
                        found[index] = Some(replies);
                    }
                }
                Err(Moved) => {
                    self.forget_layout();
                    again.extend(members);
                }
            }
        }
        for index in again {
            let mut pipeline = Pipeline::with_capacity(3);
            add(&mut pipeline, &keys[index]);
            pipeline.ignore_errors();
            let replies = pipeline.query_async(&mut connection.clone()).await?;
            found[index] = lookup_replies(replies, 1)?.pop();
        }
        found
            .into_iter()
            .map(|replies| replies.ok_or_else(cancelled))
            .collect()
    }

    /// Runs each call on its own, all at once, following `MOVED` and `ASK` and loading the
    /// script on `NOSCRIPT`: each reply in `replies`, at the call's index.
    async fn each_alone(
        &self,
        script: &Script,
        calls: Indexed,
        replies: &mut [Option<RedisResult<Value>>],
    ) {
        let connection = match self.connection() {
            Ok(connection) => connection,
            Err(error) => {
                for (index, _) in calls {
                    replies[index] = Some(Err(error.clone()));
                }
                return;
            }
        };
        let mut runs = JoinSet::new();
        for (index, call) in calls {
            let (script, mut connection) = (script.clone(), connection.clone());
            runs.spawn(async move {
                (
                    index,
                    evalsha::<Value>(&script, &call, &mut connection).await,
                )
            });
        }
        while let Some(ran) = runs.join_next().await {
            if let Ok((index, reply)) = ran {
                replies[index] = Some(reply);
            }
        }
    }

    /// The layout last read, or a new one read from a master; none if it cannot be read.
    async fn layout(&self, connection: &ClusterConnection) -> Option<Arc<Layout>> {
        let known = self
            .layout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(layout) = known {
            return Some(layout);
        }
        let reply = connection
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await
            .ok()?;
        let layout = Arc::new(Layout::read(&reply)?);
        *self.layout.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&layout));
        Some(layout)
    }

    fn forget_layout(&self) {
        *self.layout.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Calls, each with its index among the calls of one `invoke_each`.
type Indexed = Vec<(usize, Cmd)>;

/// The slot of an `EVALSHA` call: its first key's (the fourth argument).
fn slot_of(call: &Cmd) -> u16 {
    match call.args_iter().nth(3) {
        Some(Arg::Simple(key)) => key_slot(key),
        _ => key_slot(b""),
    }
}

/// A group of lookups that a node refused for a slot's move or lost: sent again key by key.
struct Moved;

/// The replies of a group of lookups, or [`Moved`] where the pipeline failed for a slot's
/// move or a node's loss, or any of its replies is a `MOVED` or `ASK`.
fn pipeline_or_moved(replies: RedisResult<Vec<Value>>) -> Result<RedisResult<Vec<Value>>, Moved> {
    match replies {
        Err(error) if moved_or_lost(&error) => Err(Moved),
        Ok(replies)
            if replies.iter().any(|reply| {
                matches!(reply, Value::ServerError(error)
                    if matches!(error.kind(), Some(ServerErrorKind::Moved | ServerErrorKind::Ask)))
            }) =>
        {
            Err(Moved)
        }
        replies => Ok(replies),
    }
}

/// Whether a pipeline failed for a slot's move or a node's loss, not for its commands.
fn moved_or_lost(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
        ) | ErrorKind::ClusterConnectionNotFound
    ) || error.is_io_error()
        || error.is_connection_dropped()
}

fn keep_first(result: &mut RedisResult<()>, ran: RedisResult<()>) {
    if result.is_ok() {
        *result = ran;
    }
}

fn cancelled() -> RedisError {
    RedisError::from((ErrorKind::Io, "a pipeline of the cluster was cancelled"))
}
