//! Typed values take the options bytes take (`Typed::fetch` with a `Loaded<T>`: its own TTL,
//! tags, stale windows, pass), tell the `Outcome`, peek (`Typed::get`) and invalidate, over
//! both stores.
#![cfg(feature = "serde")]

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::{store_test, Counter, Shared};
use tower_stampede::{Loaded, Outcome};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct User {
    id: u64,
    name: String,
}

fn user(name: &str) -> User {
    User {
        id: 42,
        name: name.into(),
    }
}

/// A loader that counts its call and answers `loaded`.
fn counted(
    loads: &Counter,
    loaded: Loaded<User>,
) -> impl FnOnce() -> std::future::Ready<Result<Loaded<User>, std::io::Error>> + Send + 'static {
    let loads = loads.clone();
    move || {
        loads.hit();
        std::future::ready(Ok(loaded))
    }
}

store_test!(a_typed_fetch_tells_the_outcome_and_keeps_the_loaders_ttl);
/// The outcomes and the value's own TTL: a leader, then an L1 hit with the decoded value,
/// then another instance's L2 hit; the store keeps the value for the loader's TTL.
async fn a_typed_fetch_tells_the_outcome_and_keeps_the_loaders_ttl(shared: Shared) {
    let name = shared.name;
    let cache = shared.cache().build();
    let users = cache.typed::<User>();
    let loads = Counter::default();
    let ttl = Duration::from_secs(5);
    let loaded = Loaded::value_with_ttl(user("Ada"), ttl);
    let first = users.fetch("u", counted(&loads, loaded)).await.unwrap();
    assert_eq!(first.outcome(), Outcome::Leader, "{name}");
    assert_eq!(**first.value().unwrap(), user("Ada"), "{name}");
    let stored = cache.store().get(&cache.store_key("u")).await.unwrap();
    let left = stored.unwrap().ttl.unwrap();
    assert!(
        left <= ttl && left > Duration::from_secs(1),
        "{name}: {left:?}"
    );

    let hit = users
        .fetch("u", counted(&loads, Loaded::pass()))
        .await
        .unwrap();
    assert_eq!(hit.outcome(), Outcome::L1Hit, "{name}");
    assert!(
        Arc::ptr_eq(first.value().unwrap(), hit.value().unwrap()),
        "{name}"
    );
    assert!(hit.fresh_until().is_some(), "{name}");
    let other = shared.cache().build().typed::<User>();
    let l2 = other
        .fetch("u", counted(&loads, Loaded::pass()))
        .await
        .unwrap();
    assert_eq!(l2.outcome(), Outcome::L2Hit, "{name}");
    assert_eq!(**l2.value().unwrap(), user("Ada"), "{name}");
    assert_eq!(loads.get(), 1, "{name}");
}

store_test!(a_typed_value_is_invalidated_by_its_tag_and_by_its_key);
/// Tags: invalidating a tag the typed value carries makes it a miss in every instance; and
/// `Typed::invalidate` removes a key as `Cache::invalidate` does.
async fn a_typed_value_is_invalidated_by_its_tag_and_by_its_key(shared: Shared) {
    let name = shared.name;
    let (a, b) = (shared.cache().build(), shared.cache().build());
    let loads = Counter::default();
    let tagged = || Loaded::value(user("Ada")).tags(["users"]);
    let typed = a.typed::<User>();
    typed.fetch("u", counted(&loads, tagged())).await.unwrap();
    assert_eq!(
        *b.typed::<User>().get("u").await.unwrap().unwrap(),
        user("Ada")
    );
    a.invalidate_tag("users").await.unwrap();
    let fresh = shared.cache().build().typed::<User>();
    assert_eq!(fresh.get("u").await.unwrap(), None, "{name}");
    let again = fresh.fetch("u", counted(&loads, tagged())).await.unwrap();
    assert_eq!(again.outcome(), Outcome::Leader, "{name}");
    assert_eq!(loads.get(), 2, "{name}");

    typed.invalidate("u").await.unwrap();
    assert_eq!(typed.get("u").await.unwrap(), None, "{name}");
    let reloaded = fresh.fetch("u", counted(&loads, tagged())).await.unwrap();
    assert_eq!(reloaded.outcome(), Outcome::Leader, "{name}");
    assert_eq!(loads.get(), 3, "{name}");
}

store_test!(a_typed_value_has_its_own_stale_window_and_a_load_may_pass);
/// A value's own stale window: once expired, the next fetch answers the old value stale at
/// once while one reload runs; a typed pass stores nothing and answers no value.
async fn a_typed_value_has_its_own_stale_window_and_a_load_may_pass(shared: Shared) {
    let name = shared.name;
    // The cache keeps values a minute past their freshness; the value's window says 30 s.
    let cache = shared
        .cache()
        .keep_for_revalidation(Duration::from_secs(60))
        .build();
    let users = cache.typed::<User>();
    let loads = Counter::default();
    let with_window = Loaded::value(user("Ada")).stale_while_revalidate(Duration::from_secs(30));
    users
        .fetch("u", counted(&loads, with_window))
        .await
        .unwrap();
    cache.expire("u").await.unwrap();
    // The refresh never ends here: the caller is answered without waiting for it.
    let stale = users
        .fetch("u", || {
            std::future::pending::<Result<Loaded<User>, std::io::Error>>()
        })
        .await
        .unwrap();
    assert_eq!(stale.outcome(), Outcome::Stale, "{name}");
    assert_eq!(**stale.value().unwrap(), user("Ada"), "{name}");

    let passed = users
        .fetch("p", counted(&loads, Loaded::pass()))
        .await
        .unwrap();
    assert_eq!(passed.outcome(), Outcome::Pass, "{name}");
    assert!(passed.value().is_none(), "{name}");
    assert_eq!(users.get("p").await.unwrap(), None, "{name}");
    let next = users
        .get_or_load("p", || async { Ok::<_, std::io::Error>(user("x")) })
        .await;
    // A fresh pass marker sends the next caller to its own loader, whose value answers.
    assert_eq!(*next.unwrap(), user("x"), "{name}");
}

store_test!(a_typed_peek_decodes_what_is_cached_and_ignores_another_schema);
/// A typed peek: nothing cached is `None`, a value is decoded (and kept decoded in L1), and a
/// value of another schema is `None`, not an error.
async fn a_typed_peek_decodes_what_is_cached_and_ignores_another_schema(shared: Shared) {
    let name = shared.name;
    let cache = shared.cache().build();
    let users = cache.typed::<User>();
    assert_eq!(users.get("u").await.unwrap(), None, "{name}");
    users
        .set("u", &user("Ada"), Duration::from_secs(60))
        .await
        .unwrap();
    let peeked = users.get("u").await.unwrap().unwrap();
    assert_eq!(*peeked, user("Ada"), "{name}");
    let again = users.get("u").await.unwrap().unwrap();
    assert!(Arc::ptr_eq(&peeked, &again), "{name}: kept decoded in L1");
    let other_schema = shared.cache().build().typed::<User>().schema_version(9);
    assert_eq!(other_schema.get("u").await.unwrap(), None, "{name}");
}
