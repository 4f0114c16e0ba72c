//! How a follower tells the answer of the load it waited for (see
//! [`Loaded::for_waiters`](crate::Loaded::for_waiters)) from an earlier load's: by what stood
//! when it first waited (an answer that differs was written since), and where nothing tells,
//! by the answer's age on the store's own clock.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::cache::entry::{Corrupt, Entry};
use crate::cache::flight::Reader;
use crate::cache::Inner;
use crate::store::{StoreError, StoreKey};

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
    fn stood(answer: Option<WaitersAnswer>) -> Self {
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

impl Inner {
    /// Whether `answer`, as read by a request sent at `asked`, was written since a flight that
    /// started at `started` first read the key: that flight waited for the load that wrote it.
    ///
    /// Its age is the life its writer gave it (or, if it does not say, this cache's) less its
    /// remaining life, which the store's own clock tells, read at `asked` or later and in
    /// whole milliseconds (Redis's `PTTL`). So the age must be below the flight's wait up to
    /// `asked` by one step of that clock: then the answer was written after the flight
    /// started, however long the reply took. An answer written before is never taken; a
    /// caller that joined less than a round trip before the load ended loads again instead.
    fn answered_since(&self, answer: &WaitersAnswer, started: Instant, asked: Instant) -> bool {
        let written_ago = answer
            .life
            .unwrap_or_else(|| self.config.waiters_ttl())
            .saturating_sub(answer.ttl.unwrap_or_default());
        written_ago.saturating_add(STORE_CLOCK_STEP) <= asked.saturating_duration_since(started)
    }

    /// Whether a flight that started at `started` and first waited when `earlier` stood takes
    /// `answer`, read by a request sent at `asked`. One that differs from what stood then was
    /// written since, by a load the flight waited for: it does, however late the store's
    /// replies. The one that stood then, or any where nothing was read, was written before
    /// the flight waited, and perhaps before it began: its age decides
    /// ([`answered_since`](Self::answered_since)).
    pub(in crate::cache) fn takes_answer(
        &self,
        earlier: &EarlierAnswer,
        answer: &WaitersAnswer,
        started: Instant,
        asked: Instant,
    ) -> bool {
        earlier.is_new(answer) || self.answered_since(answer, started, asked)
    }

    /// What stands in the waiters' slot of `key` (see
    /// [`Store::answer_waiters`](crate::store::Store::answer_waiters)) for `reader`: one store
    /// read, made when a flight first waits for a load of a value kept past its freshness.
    pub(in crate::cache) async fn earlier_answer(
        &self,
        key: &StoreKey,
        reader: Reader<'_>,
    ) -> EarlierAnswer {
        self.read_waiters_answer(key, reader)
            .await
            .map_or(EarlierAnswer::Unknown, EarlierAnswer::stood)
    }

    /// The answer a load left for its waiters beside the value, if the flight that started at
    /// `started` and first waited when `earlier` stood takes it (see
    /// [`takes_answer`](Self::takes_answer)) and its caller can read it. One store read, made
    /// only by a follower that finds the lock free and the value it waited for still stale.
    pub(in crate::cache) async fn waiters_answer(
        &self,
        key: &StoreKey,
        reader: Reader<'_>,
        earlier: &EarlierAnswer,
        started: Instant,
    ) -> Option<Bytes> {
        let asked = Instant::now();
        let answer = self.read_waiters_answer(key, reader).await.ok().flatten()?;
        self.takes_answer(earlier, &answer, started, asked)
            .then_some(answer.payload)
    }

    /// Reads the waiters' slot of `key`: the answer there that `reader`'s caller can read, if
    /// any; the store's error if it did not answer.
    async fn read_waiters_answer(
        &self,
        key: &StoreKey,
        reader: Reader<'_>,
    ) -> Result<Option<WaitersAnswer>, StoreError> {
        let stored = self.breaker.call(self.store.waiters_answer(key)).await?;
        Ok(stored.and_then(|stored| WaitersAnswer::of(&reader.decode(stored.bytes), stored.ttl)))
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
        let cache = crate::Cache::builder(crate::store::MemoryStore::new()).build();
        let inner = &cache.inner;
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
        assert!(!inner.answered_since(&old, started, asked));
        assert!(inner.takes_answer(&EarlierAnswer::Nothing, &old, started, asked));
        let other = EarlierAnswer::Answer((6, 1), payload.clone());
        assert!(inner.takes_answer(&other, &old, started, asked));
        let other_payload = EarlierAnswer::Answer((7, 1), Bytes::from_static(b"502"));
        assert!(inner.takes_answer(&other_payload, &old, started, asked));
        let same = EarlierAnswer::Answer((7, 1), payload.clone());
        assert!(!inner.takes_answer(&same, &old, started, asked));
        assert!(!inner.takes_answer(&EarlierAnswer::Unknown, &old, started, asked));
        // 5 ms old: written since the flight began, its age says, whatever stood.
        let recent = answer(5);
        assert!(inner.takes_answer(&same, &recent, started, asked));
        assert!(inner.takes_answer(&EarlierAnswer::Unknown, &recent, started, asked));
    }
}
