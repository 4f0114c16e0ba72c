//! A leader's lock lives until its fill: renewals timed from when the lock was asked for, a
//! batch's locks renewed in one store call, and the fill of a lock that lapsed while nobody
//! took it.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{timed_test, Counter, Shared};
use tower_stampede::store::StoreExt;
use tower_stampede::store::{LockState, LockToken, LockWhen};
use tower_stampede::{Cache, Outcome};

timed_test!(a_leader_whose_lookup_answered_late_keeps_its_lock);
/// A leader's lookup is answered 2.2 s late, of a 3 s lock (a slow network, a busy process),
/// and its load takes 1.5 s more. Its renewals are timed from when it asked for the lock, so
/// the first goes out as the answer arrives; another process that looks the key up at 3.1 s,
/// after the lock's first TTL, still finds it held and waits for the fill: one load, and the
/// leader's fill is the value stored. (Timed from the answer, the first renewal went out at
/// 3.2 s, after the lock had run out: the other process loaded too.) Seconds rather than
/// milliseconds: on Redis the run takes real time, and the renewal has 0.8 s to land.
async fn a_leader_whose_lookup_answered_late_keeps_its_lock(stores: Vec<Shared>) {
    for shared in stores {
        let late = Observed::new(&shared.store, Duration::from_millis(2_200));
        let leader = Cache::builder_shared(late.clone())
            .namespace("test")
            .store_timeout(Duration::from_secs(5))
            .lock_ttl(Duration::from_secs(3))
            .build();
        let loads = Counter::default();
        let leading = tokio::spawn({
            let load = crate::slow_value(&loads, Duration::from_millis(1_500), "leader's");
            async move { leader.get_or_load("late", load).await }
        });
        tokio::time::sleep(Duration::from_millis(3_100)).await;
        let other = shared.cache().build();
        let load = crate::slow_value(&loads, Duration::ZERO, "other's");
        let fetched = other.fetch("late", || async move {
            load().await.map(tower_stampede::Loaded::value)
        });
        let fetched = fetched.await.unwrap();
        assert_eq!(leading.await.unwrap().unwrap(), "leader's");
        assert_eq!(loads.get(), 1, "loads");
        assert_eq!(fetched.value().unwrap(), "leader's");
        assert_eq!(fetched.outcome(), Outcome::Follower);
        let stored = shared.cache().build().get("late").await.unwrap();
        assert_eq!(stored, Some(Bytes::from_static(b"leader's")));
    }
}

timed_test!(a_lapsed_lock_is_still_its_holders_until_someone_takes_it);
/// A lock that lapsed (its 1 s TTL ran out, half a second ago) while nobody took it is still
/// its holder's: its fill lands, and so do its renewal and release. The fence is against
/// another holder, not against the clock.
async fn a_lapsed_lock_is_still_its_holders_until_someone_takes_it(stores: Vec<Shared>) {
    for shared in stores {
        let store = &shared.store;
        let cache = shared.cache().build();
        let lock_ttl = Duration::from_secs(1);
        for call in ["fill", "extend", "release"] {
            let key = cache.store_key(format!("lapsed-{call}"));
            let token = LockToken::random();
            let taken = store.lookup(&key, token, lock_ttl, LockWhen::Always).await;
            assert_eq!(taken.unwrap().lock, LockState::Acquired);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let done = match call {
                "fill" => store.fill(&key, token, Bytes::from_static(b"v"), TTL).await,
                "extend" => store
                    .extend(&[(key.clone(), token)], lock_ttl)
                    .await
                    .map(|done| done[0]),
                _ => store.release(&key, token).await,
            };
            assert!(done.unwrap(), "{call} of a lapsed lock");
            // Filled, the value is there; renewed, the lock holds again; released, it is
            // free.
            let other = LockToken::random();
            let after = store.lookup(&key, other, lock_ttl, LockWhen::Always).await;
            let after = after.unwrap();
            let expected = match call {
                "extend" => LockState::HeldElsewhere,
                _ => LockState::Acquired,
            };
            assert_eq!(after.lock, expected, "after {call}");
            if call == "fill" {
                let filled = after.value.map(|v| v.bytes);
                assert_eq!(filled, Some(Bytes::from_static(b"v")));
            }
        }
    }
}

timed_test!(a_lapsed_lock_is_anyones_to_take);
/// A lock that lapsed holds no more: the next lookup takes it (a leader that died is taken
/// over after the lock's TTL, as before), and then the lapsed holder's fill is refused.
async fn a_lapsed_lock_is_anyones_to_take(stores: Vec<Shared>) {
    for shared in stores {
        let store = &shared.store;
        let key = shared.cache().build().store_key("taken");
        let (late, next) = (LockToken::random(), LockToken::random());
        let lock_ttl = Duration::from_secs(1);
        let when = LockWhen::LifeAtMost(Duration::ZERO);
        let taken = store.lookup(&key, late, lock_ttl, when).await.unwrap();
        assert_eq!(taken.lock, LockState::Acquired);
        let held = store.lookup(&key, next, lock_ttl, when).await.unwrap();
        assert_eq!(held.lock, LockState::HeldElsewhere, "holds");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let taken = store.lookup(&key, next, lock_ttl, when).await.unwrap();
        assert_eq!(taken.lock, LockState::Acquired, "lapsed");
        let refused = store
            .fill(&key, late, Bytes::from_static(b"late"), TTL)
            .await;
        assert!(!refused.unwrap(), "taken since");
        assert!(
            !store
                .extend(&[(key.clone(), late)], lock_ttl)
                .await
                .unwrap()[0]
        );
        assert!(store
            .fill(&key, next, Bytes::from_static(b"next"), TTL)
            .await
            .unwrap());
        let stored = store.get(&key).await.unwrap().map(|v| v.bytes);
        assert_eq!(stored, Some(Bytes::from_static(b"next")));
    }
}

timed_test!(a_change_voids_a_lapsed_lock);
/// Whatever voids a held lock voids a lapsed one: after an invalidation, a `set` or an
/// expiry of its key, the fill of a lock that lapsed is refused, and the change stands.
async fn a_change_voids_a_lapsed_lock(stores: Vec<Shared>) {
    for shared in stores {
        let store = &shared.store;
        let cache = shared.cache().build();
        let lock_ttl = Duration::from_secs(1);
        for change in ["invalidate", "set", "expire"] {
            let key = cache.store_key(format!("voided-{change}"));
            let token = LockToken::random();
            let taken = store.lookup(&key, token, lock_ttl, LockWhen::Always).await;
            assert_eq!(taken.unwrap().lock, LockState::Acquired);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            match change {
                "invalidate" => store.invalidate(&key).await.unwrap(),
                "set" => store
                    .set(&key, Bytes::from_static(b"set"), TTL, TTL)
                    .await
                    .unwrap(),
                _ => store.expire(&key, Duration::ZERO).await.unwrap(),
            }
            let refused = store
                .fill(&key, token, Bytes::from_static(b"old"), TTL)
                .await;
            assert!(!refused.unwrap(), "fill after {change}");
            let stored = store.get(&key).await.unwrap().map(|v| v.bytes);
            let expected = (change == "set").then(|| Bytes::from_static(b"set"));
            assert_eq!(stored, expected, "after {change}");
        }
    }
}

timed_test!(a_leader_whose_renewals_do_not_land_still_fills_where_nobody_took_its_lock);
/// A leader's renewals do not reach the store (each would take a minute), and its load takes
/// 1.5 s of a 1 s lock: the lock lapses, but nobody takes it, so the fill lands, and another
/// process that looks the key up afterwards finds the value: one load. (While the fence was
/// against the clock, the fill was refused and the other process loaded again.)
async fn a_leader_whose_renewals_do_not_land_still_fills_where_nobody_took_its_lock(
    stores: Vec<Shared>,
) {
    for shared in stores {
        let stuck = Observed::slow_renewals(&shared.store, Duration::from_secs(60));
        let leader = Cache::builder_shared(stuck.clone())
            .namespace("test")
            .store_timeout(support::PATIENT)
            .lock_ttl(Duration::from_secs(1))
            .build();
        let loads = Counter::default();
        let load = crate::slow_value(&loads, Duration::from_millis(1_500), "v");
        assert_eq!(leader.get_or_load("lapsing", load).await.unwrap(), "v");
        assert!(stuck.extends() >= 1, "renewals asked");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let other = shared.cache().build();
        let fetched = other.fetch("lapsing", crate::never_called).await.unwrap();
        assert_eq!(fetched.value().unwrap(), "v");
        assert_eq!(fetched.outcome(), Outcome::L2Hit);
        assert_eq!(loads.get(), 1);
    }
}

/// The TTL of the values these tests write.
const TTL: Duration = Duration::from_secs(60);

timed_test!(a_batch_renews_all_its_locks_in_one_call);
/// A batch of 300 keys whose load takes 4 s, with 3 s locks, over a store that takes 20 ms for
/// each renewal call: the batch renews its 300 locks in one call each round (every second),
/// not one call per key, so no lock lapses; another process that asks for every key 3.5 s in
/// (when an unrenewed lock would have lapsed) waits for the batch's fills and loads none. (One
/// key at a time, a round took 6 s, and the other process loaded the keys whose locks had
/// lapsed.) Real time on Redis (4 s): a lock lapses only if its renewals stall for 2 s. With
/// the 300 ms locks it had before, renewed every 100 ms, a stall of 200 ms on a busy machine
/// was enough.
async fn a_batch_renews_all_its_locks_in_one_call(stores: Vec<Shared>) {
    for shared in stores {
        let slow = Observed::slow_renewals(&shared.store, Duration::from_millis(20));
        let batch = Cache::builder_shared(slow.clone())
            .namespace("test")
            .store_timeout(support::PATIENT)
            .lock_ttl(Duration::from_secs(3))
            .build();
        let keys: Vec<String> = (0..300).map(|key| format!("batch-{key}")).collect();
        let batch_loads = Counter::default();
        let loading = tokio::spawn({
            let (keys, loads) = (keys.clone(), batch_loads.clone());
            async move {
                batch
                    .get_many_or_load(keys, move |keys: Vec<String>| {
                        let loads = loads.clone();
                        async move {
                            loads.hit();
                            tokio::time::sleep(Duration::from_secs(4)).await;
                            let values = keys.into_iter().map(|key| (key, Bytes::from("v")));
                            Ok::<_, std::io::Error>(values.collect::<HashMap<_, _>>())
                        }
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let other = shared.cache().build();
        let other_loads = Counter::default();
        let mut others = tokio::task::JoinSet::new();
        for key in keys.clone() {
            let (other, load) = (
                other.clone(),
                crate::slow_value(&other_loads, Duration::ZERO, "other's"),
            );
            others.spawn(async move { other.get_or_load(key, load).await });
        }
        let answers = loading.await.unwrap();
        assert_eq!(answers.len(), 300);
        assert!(answers
            .values()
            .all(|answer| answer.as_ref().is_ok_and(|v| v == "v")));
        while let Some(answer) = others.join_next().await {
            assert_eq!(answer.unwrap().unwrap(), "v");
        }
        assert_eq!(
            (batch_loads.get(), other_loads.get()),
            (1, 0),
            "the batch's loads, the other process's"
        );
        // About four rounds in 4 s, each one call, however many keys.
        let calls = slow.extends();
        assert!((1..=15).contains(&calls), "{calls} renewal calls");
    }
}
