//! The greeter over four tonic servers (four instances, each its own cache, sharing one
//! `redis-server`), called through real gRPC clients: 1,000 identical calls cost one backend
//! call; two different requests never share an answer; a backend status error reaches every
//! call that waited and is not stored; calls with `authorization` pass through untouched.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{wait_until, Counter, RedisServer};
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Status};
use tower::service_fn;
use tower_stampede::Cache;
use tower_stampede_grpc::greeter;
use tower_stampede_grpc::proto::greeter_client::GreeterClient;
use tower_stampede_grpc::proto::{HelloReply, HelloRequest};

/// A name and the `authorization` a backend call was sent.
type Sent = (String, Option<String>);

/// The backend: counts its calls, keeps the names and `authorization` it was sent, and
/// answers once the gate is open; the name "broken" fails with `UNAVAILABLE`.
#[derive(Clone)]
struct Backend {
    /// The calls the servers received.
    arrived: Counter,
    calls: Counter,
    seen: Arc<Mutex<Vec<Sent>>>,
    gate: watch::Sender<bool>,
}

impl Backend {
    fn new() -> Self {
        Backend {
            arrived: Counter::default(),
            calls: Counter::default(),
            seen: Arc::default(),
            gate: watch::Sender::new(false),
        }
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// The status of the backend's `call`th call for "broken".
fn down(call: usize) -> Status {
    Status::unavailable(format!("the database is down ({call})"))
}

/// Four greeters over one `redis-server`, each on a port of its own, and a client of each.
async fn four_instances(server: &RedisServer, backend: &Backend) -> Vec<GreeterClient<Channel>> {
    let mut clients = Vec::new();
    for store in server.stores(4).await {
        let cache = Cache::builder_shared(store)
            .namespace("grpc")
            .store_timeout(support::PATIENT)
            .build();
        let serving = backend.clone();
        let service = service_fn(move |request: Request<HelloRequest>| {
            let backend = serving.clone();
            async move {
                let call = backend.calls.hit();
                let authorization = request
                    .metadata()
                    .get("authorization")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let name = request.into_inner().name;
                backend
                    .seen
                    .lock()
                    .unwrap()
                    .push((name.clone(), authorization));
                let _ = backend.gate.subscribe().wait_for(|open| *open).await;
                match name.as_str() {
                    "broken" => Err(down(call)),
                    name => Ok(HelloReply {
                        message: format!("Hello, {name}!"),
                    }),
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let greeter = greeter(cache, Duration::from_secs(60), service);
        let arrived = backend.arrived.clone();
        let counted = tower::util::MapRequestLayer::new(move |request| {
            arrived.hit();
            request
        });
        tokio::spawn(
            Server::builder()
                .layer(counted)
                .add_service(greeter)
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        clients.push(
            GreeterClient::connect(format!("http://{addr}"))
                .await
                .unwrap(),
        );
    }
    clients
}

/// `calls` calls of `name` spread over `clients`, each in a task of its own, with
/// `authorization` metadata if given.
fn spread(
    clients: &[GreeterClient<Channel>],
    calls: usize,
    name: &str,
    authorization: Option<&str>,
) -> Vec<tokio::task::JoinHandle<Result<String, Status>>> {
    (0..calls)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let mut request = Request::new(HelloRequest { name: name.into() });
            if let Some(token) = authorization {
                request
                    .metadata_mut()
                    .insert("authorization", token.parse().unwrap());
            }
            tokio::spawn(async move {
                let reply = client.say_hello(request).await?;
                Ok(reply.into_inner().message)
            })
        })
        .collect()
}

/// 1,000 identical calls over four instances: one backend call, and everyone's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_over_four_instances_cost_one_backend_call() {
    let server = RedisServer::start();
    let backend = Backend::new();
    let clients = four_instances(&server, &backend).await;
    let calls = spread(&clients, 1000, "Ada", None);
    wait_until("the load started", || backend.calls.get() == 1).await;
    backend.open();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "Hello, Ada!");
    }
    assert_eq!(backend.calls.get(), 1, "backend calls");
}

/// Two different requests, at once on every instance: one backend call each, and each
/// caller gets the answer to its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_requests_never_share_an_answer() {
    let server = RedisServer::start();
    let backend = Backend::new();
    let clients = four_instances(&server, &backend).await;
    let ada = spread(&clients, 100, "Ada", None);
    let grace = spread(&clients, 100, "Grace", None);
    wait_until("both loads started", || backend.calls.get() == 2).await;
    backend.open();
    for call in ada {
        assert_eq!(call.await.unwrap().unwrap(), "Hello, Ada!");
    }
    for call in grace {
        assert_eq!(call.await.unwrap().unwrap(), "Hello, Grace!");
    }
    assert_eq!(backend.calls.get(), 2);
}

/// The backend fails with a status while calls on four instances wait for its load: every
/// call gets a backend status (most of each instance's calls the first load's), and nothing
/// is stored: the next call reaches the backend again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_error_reaches_every_waiter_and_is_not_stored() {
    let server = RedisServer::start();
    let backend = Backend::new();
    let clients = four_instances(&server, &backend).await;
    let calls = spread(&clients, 200, "broken", None);
    // A call that reaches its instance after the load ended loads again: the load is held
    // until every call reached its server.
    wait_until("every call arrived", || {
        backend.calls.get() == 1 && backend.arrived.get() == 200
    })
    .await;
    backend.open();
    let mut first = [0; 4];
    for (i, call) in calls.into_iter().enumerate() {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().starts_with("the database is down"),
            "{status:?}"
        );
        if status.message() == down(1).message() {
            first[i % 4] += 1;
        }
    }
    assert!(
        first.iter().all(|&waited| waited > 10),
        "the calls of each instance that got the first load's status: {first:?}"
    );
    let loads = backend.calls.get();
    let again = spread(&clients[..1], 1, "broken", None)
        .remove(0)
        .await
        .unwrap();
    assert_eq!(
        again.unwrap_err().message(),
        down(loads + 1).message(),
        "not stored"
    );
}

/// Calls with `authorization` have no key: each reaches the backend with its metadata, and
/// nothing is stored for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_with_authorization_pass_through() {
    let server = RedisServer::start();
    let backend = Backend::new();
    let clients = four_instances(&server, &backend).await;
    let calls = spread(&clients, 4, "Ada", Some("Bearer secret"));
    wait_until("every call reached the backend", || {
        backend.calls.get() == 4
    })
    .await;
    backend.open();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "Hello, Ada!");
    }
    let sent = ("Ada".to_owned(), Some("Bearer secret".to_owned()));
    assert_eq!(*backend.seen.lock().unwrap(), vec![sent; 4]);
    // Nothing was stored under the call's key: a call without credentials loads.
    spread(&clients[..1], 1, "Ada", None)
        .remove(0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(backend.calls.get(), 5);
}
