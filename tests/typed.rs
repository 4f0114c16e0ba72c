//! Typed values (`Cache::typed`, feature `serde`) over both stores: a value round-trips, an
//! L1 hit hands out the decoded value again, and a stored value that is not a `T` of the
//! handle's schema (another deploy's struct, another program's bytes, truncated bytes) is a
//! counted miss, reloaded and overwritten, never an error.
#![cfg(feature = "serde")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use support::{store_test, Counter, Shared};
use tower_stampede::cache::{Codec, Postcard};
use tower_stampede::{BoxError, Cache, Outcome};

/// A row as the first deploy knows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct UserV1 {
    id: u64,
    name: String,
}

/// The same row after a deploy that added a field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct UserV2 {
    id: u64,
    name: String,
    email: String,
}

fn ada() -> UserV1 {
    UserV1 {
        id: 42,
        name: "Ada".into(),
    }
}

fn ada_v2() -> UserV2 {
    UserV2 {
        id: 42,
        name: "Ada".into(),
        email: "ada@example.org".into(),
    }
}

/// A loader that counts its calls and returns `value`.
fn counted<T: Send + 'static>(
    loads: &Counter,
    value: T,
) -> impl FnOnce() -> std::future::Ready<Result<T, std::io::Error>> + Send + 'static {
    let loads = loads.clone();
    move || {
        loads.hit();
        std::future::ready(Ok(value))
    }
}

/// A loader that must not run.
fn never<T>() -> std::future::Ready<Result<T, std::io::Error>> {
    panic!("the loader was called")
}

/// The bytes stored under `key`, as a raw reader sees them (the typed value's own bytes).
async fn raw_bytes(cache: &Cache, key: &str) -> Bytes {
    cache
        .fetch(key, || async {
            Err::<tower_stampede::Loaded, _>(std::io::Error::other("nothing stored"))
        })
        .await
        .unwrap()
        .into_value()
        .unwrap()
}

store_test!(a_typed_value_round_trips_and_an_l1_hit_hands_out_the_decoded_value);
async fn a_typed_value_round_trips_and_an_l1_hit_hands_out_the_decoded_value(shared: Shared) {
    let name = shared.name;
    let cache = shared.cache().build();
    let users = cache.typed::<UserV1>().schema_version(1);
    let loads = Counter::default();
    let first = users
        .get_or_load("user:42", counted(&loads, ada()))
        .await
        .unwrap();
    assert_eq!(*first, ada(), "{name}");
    // An L1 hit: the same decoded value, not a copy.
    let hit = users.get_or_load("user:42", never).await.unwrap();
    assert!(Arc::ptr_eq(&first, &hit), "{name}");
    // Another instance decodes it from the store.
    let other = shared.cache().build();
    let read = other
        .typed::<UserV1>()
        .schema_version(1)
        .get_or_load("user:42", never)
        .await
        .unwrap();
    assert_eq!(*read, ada(), "{name}");
    assert_eq!(loads.get(), 1, "{name}");
    assert_eq!(cache.stats().corrupt_entries, 0, "{name}");
    assert_eq!(other.stats().corrupt_entries, 0, "{name}");
}

store_test!(without_l1_every_call_decodes_from_the_store);
/// Without L1 nothing is kept decoded: every call decodes what the store holds.
async fn without_l1_every_call_decodes_from_the_store(shared: Shared) {
    let name = shared.name;
    let cache = shared.cache().l1_capacity(0).build();
    let users = cache.typed::<UserV1>();
    let loads = Counter::default();
    let first = users
        .get_or_load("k", counted(&loads, ada()))
        .await
        .unwrap();
    let again = users.get_or_load("k", never).await.unwrap();
    assert_eq!(*again, ada(), "{name}");
    assert!(!Arc::ptr_eq(&first, &again), "{name}");
    assert_eq!(loads.get(), 1, "{name}");
    assert_eq!(cache.stats().corrupt_entries, 0, "{name}");
}

store_test!(a_typed_stampede_is_one_load);
async fn a_typed_stampede_is_one_load(shared: Shared) {
    let instances: Vec<_> = (0..2)
        .map(|_| shared.cache().build().typed::<UserV1>())
        .collect();
    let loads = Counter::default();
    let callers: Vec<_> = (0..100)
        .map(|i| {
            let (users, loads) = (instances[i % 2].clone(), loads.clone());
            tokio::spawn(async move {
                users
                    .get_or_load("hot", move || async move {
                        loads.hit();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>(ada())
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(*caller.await.unwrap().unwrap(), ada());
    }
    assert_eq!(loads.get(), 1);
}

store_test!(a_struct_changed_between_two_instances_reloads_and_the_newer_write_wins);
/// Two deploys over one store and one namespace: the first stores `UserV1` (schema version
/// 1), the second reads the key as `UserV2` (version 2). Each reloads the other's value as a
/// counted miss and overwrites it; neither fails, and the newer write is what the store keeps.
async fn a_struct_changed_between_two_instances_reloads_and_the_newer_write_wins(shared: Shared) {
    let name = shared.name;
    let old_deploy = shared.cache().build();
    let new_deploy = shared.cache().build();
    let (old_loads, new_loads) = (Counter::default(), Counter::default());
    let old = old_deploy.typed::<UserV1>().schema_version(1);
    let new = new_deploy.typed::<UserV2>().schema_version(2);

    let v1 = old
        .get_or_load("user:42", counted(&old_loads, ada()))
        .await
        .unwrap();
    assert_eq!(*v1, ada(), "{name}");
    let v2 = new
        .get_or_load("user:42", counted(&new_loads, ada_v2()))
        .await
        .unwrap();
    assert_eq!(*v2, ada_v2(), "{name}");
    assert_eq!(new_loads.get(), 1, "{name}: the old value was reloaded");
    assert_eq!(new_deploy.stats().corrupt_entries, 1, "{name}");

    // The newer write is in the store: a third instance of the new deploy reads it.
    let third = shared.cache().build();
    let read = third
        .typed::<UserV2>()
        .schema_version(2)
        .get_or_load("user:42", never)
        .await
        .unwrap();
    assert_eq!(*read, ada_v2(), "{name}");
    assert_eq!(third.stats().corrupt_entries, 0, "{name}");

    // An old instance that comes later (its own L1) reloads too, instead of failing.
    let late_old = shared.cache().build();
    let again = late_old
        .typed::<UserV1>()
        .schema_version(1)
        .get_or_load("user:42", counted(&old_loads, ada()))
        .await
        .unwrap();
    assert_eq!(*again, ada(), "{name}");
    assert_eq!(old_loads.get(), 2, "{name}");
    assert_eq!(late_old.stats().corrupt_entries, 1, "{name}");
}

store_test!(a_changed_struct_under_an_unchanged_schema_is_a_miss_when_it_does_not_decode);
/// The same two structs under one schema name and version (a deploy that forgot to bump it):
/// the tags match, so the codec's decode is what tells them apart. A `UserV1` lacks the
/// field `UserV2` needs, and a `UserV2` leaves bytes over for `UserV1`: both are misses.
async fn a_changed_struct_under_an_unchanged_schema_is_a_miss_when_it_does_not_decode(
    shared: Shared,
) {
    let name = shared.name;
    let first = shared.cache().build();
    let second = shared.cache().build();
    let loads = Counter::default();
    let v1 = first.typed::<UserV1>().schema_name("User");
    let v2 = second.typed::<UserV2>().schema_name("User");
    v1.get_or_load("k", counted(&loads, ada())).await.unwrap();
    let read = v2
        .get_or_load("k", counted(&loads, ada_v2()))
        .await
        .unwrap();
    assert_eq!(*read, ada_v2(), "{name}");
    assert_eq!(second.stats().corrupt_entries, 1, "{name}");

    let third = shared.cache().build();
    let read = third
        .typed::<UserV1>()
        .schema_name("User")
        .get_or_load("k", counted(&loads, ada()))
        .await
        .unwrap();
    assert_eq!(*read, ada(), "{name}");
    assert_eq!(third.stats().corrupt_entries, 1, "{name}");
    assert_eq!(loads.get(), 3, "{name}");
}

store_test!(foreign_and_truncated_bytes_are_a_counted_miss_and_overwritten);
async fn foreign_and_truncated_bytes_are_a_counted_miss_and_overwritten(shared: Shared) {
    let name = shared.name;
    let writer = shared.cache().build();
    let users = writer.typed::<UserV1>();
    users
        .set("truncated", &ada(), Duration::from_secs(60))
        .await
        .unwrap();
    let whole = raw_bytes(&writer, "truncated").await;
    let cut = whole.slice(..whole.len() - 1);
    writer
        .set("truncated", cut, Duration::from_secs(60))
        .await
        .unwrap();
    writer
        .set(
            "foreign",
            "another program's bytes",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    writer
        .set("empty", "", Duration::from_secs(60))
        .await
        .unwrap();

    let reader = shared.cache().build();
    let typed = reader.typed::<UserV1>();
    let loads = Counter::default();
    for key in ["truncated", "foreign", "empty"] {
        let value = typed
            .get_or_load(key, counted(&loads, ada()))
            .await
            .unwrap();
        assert_eq!(*value, ada(), "{name}: {key}");
        // Overwritten: another instance reads the value without loading.
        let other = shared.cache().build();
        let read = other
            .typed::<UserV1>()
            .get_or_load(key, never)
            .await
            .unwrap();
        assert_eq!(*read, ada(), "{name}: {key}");
    }
    assert_eq!(loads.get(), 3, "{name}");
    assert_eq!(reader.stats().corrupt_entries, 3, "{name}");
}

store_test!(a_key_held_raw_in_this_process_is_reloaded_as_the_type);
/// A key this process reads raw first, then typed: the raw bytes in L1 are not a `T`, so the
/// typed call forgets them and reads the store, where they are a miss too: one typed load.
async fn a_key_held_raw_in_this_process_is_reloaded_as_the_type(shared: Shared) {
    let name = shared.name;
    let cache = shared.cache().build();
    let raw = cache
        .fetch("mixed", || async {
            Ok::<_, std::io::Error>(tower_stampede::Loaded::value(Bytes::from("raw")))
        })
        .await
        .unwrap();
    assert_eq!(raw.outcome(), Outcome::Leader, "{name}");
    let loads = Counter::default();
    let typed = cache
        .typed::<UserV1>()
        .get_or_load("mixed", counted(&loads, ada()))
        .await
        .unwrap();
    assert_eq!(*typed, ada(), "{name}");
    assert_eq!(loads.get(), 1, "{name}");
    assert_eq!(
        cache.stats().corrupt_entries,
        2,
        "{name}: L1's, then the store's"
    );
}

/// Postcard under another name: a codec of its own, so its values carry another tag.
#[derive(Clone)]
struct Renamed;

impl Codec for Renamed {
    fn name(&self) -> &str {
        "renamed-postcard"
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), BoxError> {
        Postcard.encode(value, out)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Postcard.decode(bytes)
    }
}

store_test!(another_codec_is_chosen_and_its_values_are_apart_from_the_default_ones);
async fn another_codec_is_chosen_and_its_values_are_apart_from_the_default_ones(shared: Shared) {
    let name = shared.name;
    let loads = Counter::default();
    let a = shared.cache().build();
    a.typed::<UserV1>()
        .get_or_load("codec", counted(&loads, ada()))
        .await
        .unwrap();
    let b = shared.cache().build();
    let renamed = b.typed::<UserV1>().codec(Renamed);
    let read = renamed
        .get_or_load("codec", counted(&loads, ada()))
        .await
        .unwrap();
    assert_eq!(*read, ada(), "{name}");
    assert_eq!(
        loads.get(),
        2,
        "{name}: the default codec's value was a miss"
    );
    assert_eq!(b.stats().corrupt_entries, 1, "{name}");
}
