//! tower-stampede in front of a tonic gRPC service: each unary method's handler is a tower
//! service, guarded by a [`CacheLayer`], so a hot request is answered by one backend call
//! across every process that shares the store.
//!
//! - The key of a call is the method's path and the encoded request message
//!   ([`unary_key`]); a call that carries `authorization` or `cookie` metadata (or other
//!   names you give) has no key and goes to the backend untouched.
//! - Replies are stored as protobuf ([`Prost`]); a [`Status`] error of the backend goes to
//!   every call that waited for the failed load, in every process (its code and message),
//!   and is not stored.
//! - Errors of the cache itself (a wait that timed out, say) become a status
//!   ([`status_of`]).
//!
//! Run it with `cargo run -p tower-stampede-grpc` (`REDIS_URL` to share a Redis).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tonic::{Code, Request, Response, Status};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_stampede::service::{CacheLayer, ServiceCodec};
use tower_stampede::{Cache, ErrorKind};

/// The code `build.rs` generates from `proto/greeter.proto`.
pub mod proto {
    #![allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
    tonic::include_proto!("greeter");
}

use proto::greeter_server::{Greeter, GreeterServer};
use proto::{HelloReply, HelloRequest};

/// The path of `Greeter.SayHello`, as gRPC names it on the wire.
pub const SAY_HELLO: &str = "/greeter.Greeter/SayHello";

/// Metadata that makes a call private by default: a call that carries any of it bypasses
/// the cache.
pub const PRIVATE_METADATA: &[&str] = &["authorization", "cookie"];

/// The key of a unary call to `path`: the path, a zero byte, and the request message as
/// protobuf. `None` (the call goes to the backend untouched) when the call carries any
/// metadata named in `private`.
///
/// Two requests with the same fields encode alike, so they share a key; a message with a
/// `map` field encodes its entries in the map's order, so generate maps as `BTreeMap`s
/// (`btree_map` in the build) for one key per request.
pub fn unary_key<M: Message>(
    path: &'static str,
    private: &'static [&'static str],
) -> impl Fn(&Request<M>) -> Option<Vec<u8>> + Clone + Send + Sync + 'static {
    move |request| {
        let metadata = request.metadata();
        if private.iter().any(|name| metadata.contains_key(*name)) {
            return None;
        }
        let message = request.get_ref();
        let mut key = Vec::with_capacity(path.len() + 1 + message.encoded_len());
        key.extend_from_slice(path.as_bytes());
        key.push(0);
        // A `Vec` grows as needed: encoding into it cannot fail.
        message.encode(&mut key).ok()?;
        Some(key)
    }
}

/// Replies stored as protobuf, and [`Status`] errors shared as their code and message
/// (their details and metadata stay with the call that loaded).
#[derive(Clone, Copy, Debug, Default)]
pub struct Prost;

impl<M> ServiceCodec<M, Status> for Prost
where
    M: Message + Default + Send + Sync + 'static,
{
    fn encode(&self, reply: &M) -> Result<Bytes, BoxError> {
        Ok(reply.encode_to_vec().into())
    }

    fn decode(&self, bytes: &[u8]) -> Result<M, BoxError> {
        Ok(M::decode(bytes)?)
    }

    fn encode_error(&self, status: &Status) -> Option<Bytes> {
        let message = status.message().as_bytes();
        let mut out = BytesMut::with_capacity(4 + message.len());
        out.put_i32(status.code().into());
        out.put_slice(message);
        Some(out.freeze())
    }

    fn decode_error(&self, mut bytes: &[u8]) -> Option<Status> {
        if bytes.len() < 4 {
            return None;
        }
        let code = Code::from_i32(bytes.get_i32());
        let message = std::str::from_utf8(bytes).ok()?;
        Some(Status::new(code, message))
    }
}

/// An error of the cache as a status: a wait or a load that timed out is
/// `DEADLINE_EXCEEDED`, the rest `UNAVAILABLE` (the client may retry).
pub fn status_of(error: tower_stampede::Error) -> Status {
    match error.kind() {
        ErrorKind::WaitTimeout | ErrorKind::LoadTimeout => {
            Status::deadline_exceeded(error.to_string())
        }
        _ => Status::unavailable(error.to_string()),
    }
}

/// A unary method's handler: a tower service from the request to the reply message.
pub type Unary<Req, Reply> = BoxCloneSyncService<Request<Req>, Reply, Status>;

/// The greeter: each method a [`Unary`] service, which the server calls.
#[derive(Clone)]
pub struct GuardedGreeter {
    say_hello: Unary<HelloRequest, HelloReply>,
}

#[tonic::async_trait]
impl Greeter for GuardedGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let reply = self.say_hello.clone().oneshot(request).await?;
        Ok(Response::new(reply))
    }
}

/// The greeter's gRPC service, each method guarded by `cache` (replies fresh for `ttl`) in
/// front of `backend`.
pub fn greeter<S>(cache: Cache, ttl: Duration, backend: S) -> GreeterServer<GuardedGreeter>
where
    S: Service<Request<HelloRequest>, Response = HelloReply, Error = Status>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let layer = CacheLayer::with_codec(cache, unary_key(SAY_HELLO, PRIVATE_METADATA), Prost)
        .ttl(ttl)
        .map_error(status_of);
    let say_hello = ServiceBuilder::new().layer(layer).service(backend);
    GreeterServer::new(GuardedGreeter {
        say_hello: BoxCloneSyncService::new(say_hello),
    })
}
