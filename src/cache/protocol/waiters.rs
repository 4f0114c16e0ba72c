//! How a follower tells the answer of the load it waited for (see
//! [`Loaded::for_waiters`](crate::Loaded::for_waiters)) from an earlier load's: by what stood
//! when it first waited (an answer that differs was written since), and where nothing tells,
//! by the answer's age on the store's own clock.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::cache::entry::{Corrupt, Entry};

/// The step of the store's clock as the engine reads it (Redis's `PTTL`: milliseconds): a
/// remaining life read from the store errs by up to one step.
const STORE_CLOCK_STEP: Duration = Duration::from_millis(1);

/// A load's answer for its waiters, as a lookup or a read of the waiters' slot found it.
pub(in crate::cache) struct WaitersAnswer {
    pub(in crate::cache) payload: Bytes,
    /// How long its writer had the store keep it, if it says.
    life: Option<Duration>,
    /// When its load started and how long it took (the writer's milliseconds).
    load: (u64, u32),
    /// Its remaining life in the store.
    ttl: Option<Duration>,
}

impl WaitersAnswer {
    /// The answer in a decoded entry with `ttl` left, if the entry is one.
    pub(in crate::cache) fn of(
        entry: &Result<Entry, Corrupt>,
        ttl: Option<Duration>,
    ) -> Option<Self> {
        match entry {
            Ok(Entry::ForWaiters {
                payload,
                life,
                load,
            }) => Some(WaitersAnswer {
                payload: payload.clone(),
                life: *life,
                load: *load,
                ttl,
            }),
            _ => None,
        }
    }
}

/// What stood in a key's answer for waiters when a flight first waited for another leader:
/// an answer that stood then is an earlier load's, not the flight's to take, and one that
/// differs was written since, by the load it waited for.
pub(in crate::cache) enum EarlierAnswer {
    /// Not read (the flight has not waited, or the read failed): the answer's age decides.
    Unknown,
    /// No answer stood.
    Nothing,
    /// This one did: when its load started and how long it took, and its payload.
    Answer((u64, u32), Bytes),
}

impl EarlierAnswer {
    /// What a lookup's entry says stood: the answer in the value's place, or nothing.
    pub(in crate::cache) fn in_place(
        entry: Option<&(Result<Entry, Corrupt>, Option<Duration>)>,
    ) -> Self {
        EarlierAnswer::stood(entry.and_then(|(entry, ttl)| WaitersAnswer::of(entry, *ttl)))
    }

    /// What a read that answered says stood: `answer`, or nothing.
    pub(super) fn stood(answer: Option<WaitersAnswer>) -> Self {
        match answer {
            Some(answer) => EarlierAnswer::Answer(answer.load, answer.payload),
            None => EarlierAnswer::Nothing,
        }
    }

    /// Whether `answer` was written since this was noted: nothing stood, or another answer.
    fn is_new(&self, answer: &WaitersAnswer) -> bool {
        match self {
            EarlierAnswer::Nothing => true,
            EarlierAnswer::Answer(load, payload) => {
                *load != answer.load || *payload != answer.payload
            }
            EarlierAnswer::Unknown => false,
        }
    }
}

impl WaitersAnswer {
    /// Whether this answer, as read by a request sent at `asked`, was written since a flight
    /// that started at `started` first read the key: that flight waited for the load that
    /// wrote it. `waiters_ttl`: the life this cache gives such an answer.
    ///
    /// Its age is the life its writer gave it (or, if it does not say, `waiters_ttl`) less
    /// its remaining life, which the store's own clock tells, read at `asked` or later and in
    /// whole milliseconds (Redis's `PTTL`). So the age must be below the flight's wait up to
    /// `asked` by one step of that clock: then the answer was written after the flight
    /// started, however long the reply took. An answer written before is never taken; a
    /// caller that joined less than a round trip before the load ended loads again instead.
    fn written_since(&self, started: Instant, asked: Instant, waiters_ttl: Duration) -> bool {
        let written_ago = self
            .life
            .unwrap_or(waiters_ttl)
            .saturating_sub(self.ttl.unwrap_or_default());
        written_ago.saturating_add(STORE_CLOCK_STEP) <= asked.saturating_duration_since(started)
    }

    /// Whether a flight that started at `started` and first waited when `earlier` stood takes
    /// this answer, read by a request sent at `asked`. One that differs from what stood then
    /// was written since, by a load the flight waited for: it does, however late the store's
    /// replies. The one that stood then, or any where nothing was read, was written before
    /// the flight waited, and perhaps before it began: its age decides
    /// ([`written_since`](Self::written_since)).
    pub(in crate::cache) fn taken_by(
        &self,
        earlier: &EarlierAnswer,
        started: Instant,
        asked: Instant,
        waiters_ttl: Duration,
    ) -> bool {
        earlier.is_new(self) || self.written_since(started, asked, waiters_ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter takes an answer that differs from the one that stood when it first waited,
    /// however old the store says it is (the read went out late, as on a busy machine); the
    /// one that stood then, or any where nothing was read, only if its age says it was
    /// written since the flight began.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_tells_its_load_s_answer_from_an_earlier_one() {
        let ttl = crate::cache::config::Config::default().waiters_ttl();
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        let asked = Instant::now();
        let payload = Bytes::from_static(b"503");
        let answer = |ago: u64| WaitersAnswer {
            payload: payload.clone(),
            life: Some(Duration::from_secs(2)),
            load: (7, 1),
            ttl: Some(Duration::from_millis(2_000 - ago)),
        };
        // 30 ms old by the store's clock when read, 10 ms into the flight.
        let old = answer(30);
        assert!(!old.written_since(started, asked, ttl));
        assert!(old.taken_by(&EarlierAnswer::Nothing, started, asked, ttl));
        let other = EarlierAnswer::Answer((6, 1), payload.clone());
        assert!(old.taken_by(&other, started, asked, ttl));
        let other_payload = EarlierAnswer::Answer((7, 1), Bytes::from_static(b"502"));
        assert!(old.taken_by(&other_payload, started, asked, ttl));
        let same = EarlierAnswer::Answer((7, 1), payload.clone());
        assert!(!old.taken_by(&same, started, asked, ttl));
        assert!(!old.taken_by(&EarlierAnswer::Unknown, started, asked, ttl));
        // 5 ms old: written since the flight began, its age says, whatever stood.
        let recent = answer(5);
        assert!(recent.taken_by(&same, started, asked, ttl));
        assert!(recent.taken_by(&EarlierAnswer::Unknown, started, asked, ttl));
    }

    /// Runs a held load of `key` through `cache`, with `joiners` calls joining its flight
    /// once it has started: the value each call got (the joiners' loaders must not run).
    async fn flight_with_joiners(
        cache: &crate::Cache,
        key: &'static str,
        loaded: crate::Loaded,
        joiners: usize,
    ) -> Vec<crate::Fetched> {
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let started = std::sync::Arc::new(tokio::sync::Notify::new());
        let leader = tokio::spawn({
            let (cache, started) = (cache.clone(), std::sync::Arc::clone(&started));
            async move {
                cache
                    .fetch(key, move || async move {
                        started.notify_one();
                        let _ = held.await;
                        Ok::<_, std::convert::Infallible>(loaded)
                    })
                    .await
            }
        });
        started.notified().await;
        let calls: Vec<_> = (0..joiners)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    cache
                        .fetch(key, || async {
                            Err::<crate::Loaded, _>(std::io::Error::other("a joiner loaded"))
                        })
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        release.send(()).unwrap();
        let mut answers = vec![leader.await.unwrap().unwrap()];
        for call in calls {
            answers.push(call.await.unwrap().unwrap());
        }
        answers
    }

    /// A constructor of a loader's result from its bytes.
    type LoadedOf = fn(Bytes) -> crate::Loaded;

    /// A result for the waiters that is no failure (`Loaded::shared_with_waiters`, the HTTP
    /// layer's response without freshness) reaches them even where a stale value could stand in
    /// for a failed load; a failure's (`Loaded::for_waiters`) does not.
    #[tokio::test(start_paused = true)]
    async fn a_stale_value_stands_in_for_a_failure_for_waiters_not_for_a_success() {
        let cases: [(LoadedOf, &str); 2] = [
            (crate::Loaded::shared_with_waiters, "new"),
            (crate::Loaded::for_waiters, "old"),
        ];
        for (loaded, waiters_get) in cases {
            let cache = crate::Cache::builder(crate::store::MemoryStore::new())
                .ttl(Duration::from_secs(1))
                .stale(Duration::ZERO)
                .stale_if_error(Duration::from_secs(60))
                .build();
            let old = cache
                .fetch("k", || async {
                    Ok::<_, std::convert::Infallible>(crate::Loaded::value(Bytes::from_static(
                        b"old",
                    )))
                })
                .await
                .unwrap();
            assert_eq!(old.value().unwrap(), "old");
            tokio::time::advance(Duration::from_secs(2)).await;
            let answers =
                flight_with_joiners(&cache, "k", loaded(Bytes::from_static(b"new")), 3).await;
            for answer in &answers[1..] {
                assert_eq!(
                    answer.value().unwrap(),
                    waiters_get,
                    "{:?}",
                    answer.outcome()
                );
            }
        }
    }

    /// A pass that hands something to its flight (`Loaded::pass_handing`, the HTTP layer's
    /// relay): the calls that joined the flight get it; in another process, the flight that
    /// finds the pass marker loads once (its first caller's loader), and its joiners get what
    /// that load handed them.
    #[tokio::test(start_paused = true)]
    async fn a_pass_handing_something_is_loaded_once_per_flight_in_each_process() {
        use std::sync::Arc;

        use crate::cache::loaded::Handoff;
        let store = crate::store::MemoryStore::new();
        let handed = |fetched: &crate::Fetched| {
            let handoff = fetched.handoff().expect("a handoff");
            *Arc::clone(&handoff.0).downcast::<u32>().unwrap()
        };
        for (process, n) in [(1, 1u32), (2, 2)] {
            let cache = crate::Cache::builder(store.clone()).build();
            let loaded = crate::Loaded::pass_handing(Handoff(Arc::new(n)));
            let answers = flight_with_joiners(&cache, "big", loaded, 4).await;
            for answer in &answers {
                assert_eq!(answer.outcome(), crate::Outcome::Pass, "process {process}");
                assert_eq!(handed(answer), n, "process {process}");
            }
        }
    }
}
