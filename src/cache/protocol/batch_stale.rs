//! A batch's stale values: the keys a batch leads honour the stale windows as a single key's
//! leader does. Within its stale window a key is answered its stale value at once, while the
//! batch's load runs on and fills it; within `stale_if_error` it is answered its stale value
//! once the load has taken the soft timeout (the load still fills), or in place of a failed
//! load (see `Batch::lead`).

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::batch::{Answered, Answers, Batch, BatchKey, Led};
use super::stale::unchanged_since;

/// A test that nothing was heard of a stale value's key or tags since it was read (see
/// [`unchanged_since`]); `None`: no test (notifications off or lost).
type Holds = Option<Box<dyn Fn() -> bool + Send + Sync>>;

/// The keys a batch leads that wait for its load, and those of them that a soft timeout
/// answers with their stale value.
pub(super) struct Waiting<K> {
    keys: usize,
    soft: Vec<(K, Bytes, Holds)>,
}

impl<K: BatchKey> Batch<K> {
    /// Answers in `answers` the keys of `led` whose stale value answers at once (refreshes
    /// in the background, within the stale window), and tells which of the others a soft
    /// timeout answers.
    pub(super) fn answer_stale(&self, led: &[Led<K>], answers: &mut Answers<K>) -> Waiting<K> {
        let mut waiting = Waiting {
            keys: 0,
            soft: Vec::new(),
        };
        for led in led {
            let Some(stale) = &led.stale else {
                waiting.keys += 1;
                continue;
            };
            let lives = &self.parts.lives;
            if self.parts.loads.refresh_in_background && stale.serves_while_updating(lives) {
                answers.insert(led.key.clone(), Ok(stale.payload.clone()));
                continue;
            }
            waiting.keys += 1;
            if self.parts.loads.soft_timeout.is_some() && stale.serves_on_error(lives) {
                let digest = *led.guard.key.digest();
                let notifier = self.parts.l1.notifier();
                let holds = unchanged_since(notifier, digest, led.stamp, &stale.tag_stamps);
                waiting
                    .soft
                    .push((led.key.clone(), stale.payload.clone(), holds));
            }
        }
        waiting
    }

    /// The answers of the batch's load `run`, for the keys not answered yet: none if every
    /// key it leads is answered (the load runs on and fills); else awaited, and where a soft
    /// timeout may answer some keys stale, no longer than it before they are answered (and
    /// then on, for the others).
    pub(super) async fn await_lead(
        &self,
        mut run: JoinHandle<Answered<K>>,
        waiting: Waiting<K>,
        answers: &mut Answers<K>,
    ) {
        if waiting.keys == 0 {
            return;
        }
        let ran = match self.parts.loads.soft_timeout {
            Some(soft_timeout) if !waiting.soft.is_empty() => {
                let ran = tokio::select! {
                    biased;
                    ran = &mut run => Some(ran),
                    () = tokio::time::sleep(soft_timeout) => None,
                };
                match ran {
                    Some(ran) => ran,
                    None => {
                        let mut answered = 0;
                        for (key, payload, holds) in waiting.soft {
                            // An invalidated value is never served, stale or not.
                            if holds.is_none_or(|holds| holds()) {
                                answers.insert(key, Ok(payload));
                                answered += 1;
                            }
                        }
                        if answered == waiting.keys {
                            // Every key it leads has its answer: the load fills for everyone.
                            return;
                        }
                        run.await
                    }
                }
            }
            _ => run.await,
        };
        // A task that panicked answers nothing: its keys are told by the caller.
        if let Ok(ran) = ran {
            for (key, answer) in ran {
                answers.entry(key).or_insert(answer);
            }
        }
    }
}
