//! Bring your own Redis: stores made from the application's own `redis::Client` (and from its
//! `ConnectionInfo`) keep its settings (an ACL user, a database), serve a stampede across two
//! processes with one load, and each process, however many caches share its store, holds
//! the connections the docs say: two on one server (the data connection and the subscriber).
#![cfg(feature = "redis")]

use std::time::Duration;

use bytes::Bytes;
use support::{client_list, Counter, RedisServer};
use tower_stampede::store::RedisStore;
use tower_stampede::Cache;

/// Two ACL users, one per process, so that `CLIENT LIST` tells their connections apart.
const USERS: [&str; 14] = [
    "--user",
    "process-a",
    "on",
    ">a-secret",
    "~*",
    "&*",
    "+@all",
    "--user",
    "process-b",
    "on",
    ">b-secret",
    "~*",
    "&*",
    "+@all",
];

/// The database both processes use, which the store must keep from the client's settings.
const DB: i64 = 3;

/// The connections of `user` on the server at `port`, once they have settled (a store's
/// first probe of its subscriber closes as it is made): their count.
async fn connections_of(port: u16, user: &str, expected: usize) -> usize {
    let field = format!(" user={user} ");
    let mut count = 0;
    for _ in 0..100 {
        count = client_list(port, &[])
            .await
            .iter()
            .filter(|line| line.contains(&field))
            .count();
        if count == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_from_the_apps_clients_share_one_load_and_two_connections_each() {
    let server = RedisServer::start_with(&USERS);
    let port = server.port();
    // Each process's own client, as its application configured it.
    let client_a =
        redis::Client::open(format!("redis://process-a:a-secret@127.0.0.1:{port}/{DB}")).unwrap();
    let client_b =
        redis::Client::open(format!("redis://process-b:b-secret@127.0.0.1:{port}/{DB}")).unwrap();
    let store_a = RedisStore::client_builder(&client_a)
        .connect()
        .await
        .unwrap();
    let store_b = RedisStore::info_builder(client_b.get_connection_info().clone())
        .connect()
        .await
        .unwrap();
    assert!(!format!("{store_a:?}").contains("a-secret"), "{store_a:?}");
    assert_eq!(store_a.address(), format!("redis://127.0.0.1:{port}/{DB}"));

    // Two caches per process over its one store: the pages and the users.
    let processes = [&store_a, &store_b].map(|store| {
        let pages = Cache::builder(store.clone()).namespace("pages").build();
        let users = Cache::builder(store.clone()).namespace("users").build();
        (pages, users)
    });

    let loads = Counter::default();
    let callers: Vec<_> = (0..100)
        .map(|i| {
            let pages = processes[i % 2].0.clone();
            let loads = loads.clone();
            tokio::spawn(async move {
                pages
                    .get_or_load("/home", move || async move {
                        loads.hit();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, std::io::Error>(Bytes::from_static(b"home"))
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "home");
    }
    assert_eq!(loads.get(), 1, "one load across both processes");
    for (_, users) in &processes {
        let name = users
            .get_or_load("user:42", || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"Ada"))
            })
            .await
            .unwrap();
        assert_eq!(name, "Ada");
    }

    // The client's database: the keys are in it, none in database 0.
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let in_db = |db: i64| {
        redis::pipe()
            .cmd("SELECT")
            .arg(db)
            .ignore()
            .cmd("DBSIZE")
            .clone()
    };
    let (ours,): (u64,) = in_db(DB).query_async(&mut admin).await.unwrap();
    let (default,): (u64,) = in_db(0).query_async(&mut admin).await.unwrap();
    assert!(ours > 0, "keys in database {DB}");
    assert_eq!(default, 0, "nothing in database 0");

    // Per process, whatever the number of caches: the data connection and the subscriber.
    for user in ["process-a", "process-b"] {
        assert_eq!(connections_of(port, user, 2).await, 2, "{user}");
    }
    let subscribers = client_list(port, &[])
        .await
        .into_iter()
        .filter(|line| line.contains(" user=process-a ") && line.ends_with(" resp=3"))
        .collect::<Vec<_>>();
    // One RESP3 connection, subscribed to both namespaces' channels.
    assert_eq!(subscribers.len(), 1, "{subscribers:?}");
    assert!(subscribers[0].contains(" sub=2 "), "{subscribers:?}");
}
