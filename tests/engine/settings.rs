//! Settings that cannot work are refused by the build, each with an error that names its
//! setter; and the HTTP layer's header names are typed, so a bad one is refused where it is
//! made.

use std::time::Duration;

use tower_stampede::store::MemoryStore;
use tower_stampede::{BuildError, Cache, CacheBuilder};

/// A refused setting: the setter, how the builder is given it, and the message a user reads.
struct Refused {
    setting: &'static str,
    set: fn(CacheBuilder) -> CacheBuilder,
    message: &'static str,
}

const REFUSED: &[Refused] = &[
    Refused {
        setting: "ttl",
        set: |builder| builder.ttl(Duration::ZERO),
        message: "CacheBuilder::ttl(0ns) cannot work: a value must stay fresh at least 1 ms \
                  (Redis counts its life in milliseconds)",
    },
    Refused {
        setting: "ttl",
        set: |builder| builder.ttl(Duration::from_micros(900)),
        message: "CacheBuilder::ttl(900µs) cannot work: a value must stay fresh at least 1 ms \
                  (Redis counts its life in milliseconds)",
    },
    Refused {
        setting: "lock_ttl",
        set: |builder| builder.lock_ttl(Duration::ZERO),
        message: "CacheBuilder::lock_ttl(0ns) cannot work: a reload lock must live at least \
                  1 ms (Redis counts its life in milliseconds)",
    },
    Refused {
        setting: "load_timeout",
        set: |builder| builder.load_timeout(Duration::ZERO),
        message: "CacheBuilder::load_timeout(0ns) cannot work: every load would be abandoned \
                  as it starts",
    },
    Refused {
        setting: "store_timeout",
        set: |builder| builder.store_timeout(Duration::ZERO),
        message: "CacheBuilder::store_timeout(0ns) cannot work: every store call would time \
                  out as it is made",
    },
    Refused {
        setting: "soft_timeout",
        set: |builder| {
            builder
                .load_timeout(Duration::from_secs(2))
                .soft_timeout(Duration::from_secs(2))
        },
        message: "CacheBuilder::soft_timeout(2s) cannot work: it is not shorter than \
                  load_timeout, so the load it waits for is abandoned first",
    },
];

fn refused(case: &Refused) -> BuildError {
    let builder = (case.set)(Cache::builder(MemoryStore::new()));
    match builder.try_build() {
        Ok(_) => panic!("{}: built", case.setting),
        Err(refused) => refused,
    }
}

#[test]
fn each_setting_that_cannot_work_is_refused_by_name() {
    for case in REFUSED {
        let error = refused(case);
        assert_eq!(error.setting(), case.setting, "{}", case.message);
        assert_eq!(error.to_string(), case.message, "{}", case.setting);
    }
}

#[test]
fn the_edges_of_what_is_refused_build() {
    let builders: [fn(CacheBuilder) -> CacheBuilder; 5] = [
        |builder| builder.ttl(Duration::from_millis(1)),
        |builder| builder.lock_ttl(Duration::from_millis(1)),
        |builder| builder.load_timeout(Duration::from_nanos(1)),
        |builder| builder.store_timeout(Duration::from_nanos(1)),
        |builder| {
            builder
                .load_timeout(Duration::from_secs(2))
                .soft_timeout(Duration::from_millis(1999))
        },
    ];
    for (row, set) in builders.iter().enumerate() {
        let built = set(Cache::builder(MemoryStore::new())).try_build();
        assert!(built.is_ok(), "row {row}: {:?}", built.err());
    }
}

#[test]
#[should_panic(expected = "CacheBuilder::lock_ttl(0ns) cannot work")]
fn build_panics_with_the_refusal() {
    let _ = Cache::builder(MemoryStore::new())
        .lock_ttl(Duration::ZERO)
        .build();
}

#[test]
fn a_header_name_that_is_no_field_name_is_refused_where_it_is_made() {
    // `trust_header` and `pass_header` take a `HeaderName`: text becomes one, or the error.
    let refused = http::HeaderName::try_from("not a field name").unwrap_err();
    assert_eq!(refused.to_string(), "invalid HTTP header name");
    let trusted = http::HeaderName::try_from("X-Forwarded-Proto").unwrap();
    let cache = Cache::builder(MemoryStore::new()).build();
    let _layer = tower_stampede::StampedeLayer::new(cache)
        .trust_header(trusted)
        .pass_header(http::HeaderName::from_static("x-theme"));
}

#[test]
fn a_cache_shows_every_setting_it_was_built_with() {
    // What an operator prints to check a deployment: each slice of the settings, L1's and the
    // breaker's among them, with the values the builder was given.
    let cache = Cache::builder(MemoryStore::new())
        .namespace("shop")
        .l1_capacity(12_345)
        .l1_ttl_cap(Duration::from_secs(7))
        .store_timeout(Duration::from_millis(321))
        .circuit_breaker(9, Duration::from_secs(4))
        .build();
    let shown = format!("{cache:?}");
    for part in [
        "namespace: \"shop\"",
        "capacity: 12345",
        "ttl_cap: 7s",
        "store_timeout: 321ms",
        "threshold: 9",
        "open_for: 4s",
        "lock_ttl: 5s",
        "wait_timeout: 30s",
    ] {
        assert!(shown.contains(part), "{part} missing from {shown}");
    }
}
