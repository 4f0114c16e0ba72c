//! The origin the soak's instances load from: every key has a version that the writer moves,
//! each value is stamped `key|version`, and the origin counts its loads and can be told to
//! fail or hang, or hold the next load of one instance until that instance is killed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// How the origin answers loads, as the fault injector sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal = 0,
    Failing = 1,
    Hanging = 2,
}

type Held = tokio::sync::oneshot::Sender<(usize, Instant)>;

pub struct Origin {
    /// The current version of each key.
    versions: Vec<AtomicU64>,
    /// Each key's acknowledged changes: the version a change made and when its call returned.
    acked: Vec<Mutex<Vec<(u64, Instant)>>>,
    /// The start of each load, per key, and the instance that made it.
    loads: Vec<Mutex<Vec<(Instant, usize)>>>,
    mode: AtomicU8,
    /// An instance whose next load is to hang, and where to tell which key and when.
    hold: Mutex<Option<(usize, Held)>>,
    pub failed_loads: AtomicUsize,
    pub hang: Duration,
}

impl Origin {
    pub fn new(keys: usize, hang: Duration) -> Self {
        Origin {
            versions: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            acked: (0..keys).map(|_| Mutex::new(Vec::new())).collect(),
            loads: (0..keys).map(|_| Mutex::new(Vec::new())).collect(),
            mode: AtomicU8::new(Mode::Normal as u8),
            hold: Mutex::default(),
            failed_loads: AtomicUsize::new(0),
            hang,
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            1 => Mode::Failing,
            2 => Mode::Hanging,
            _ => Mode::Normal,
        }
    }

    /// Makes the next load by `instance` hang for good (until the instance is killed), and
    /// says which key it loads and when it started.
    pub fn hold_next(&self, instance: usize) -> tokio::sync::oneshot::Receiver<(usize, Instant)> {
        let (tell, told) = tokio::sync::oneshot::channel();
        *self.hold.lock().unwrap() = Some((instance, tell));
        told
    }

    /// Forgets a hold no load took.
    pub fn cancel_hold(&self) {
        self.hold.lock().unwrap().take();
    }

    /// One load of `key` by `instance`: its stamped value at the version read when the load
    /// starts.
    pub async fn load(
        &self,
        key: usize,
        delay: Duration,
        instance: usize,
    ) -> Result<Bytes, std::io::Error> {
        let started = Instant::now();
        self.loads[key].lock().unwrap().push((started, instance));
        let version = self.versions[key].load(Ordering::SeqCst);
        let held = {
            let mut hold = self.hold.lock().unwrap();
            match &*hold {
                Some((i, _)) if *i == instance => hold.take(),
                _ => None,
            }
        };
        if let Some((_, tell)) = held {
            let _ = tell.send((key, started));
            std::future::pending::<()>().await;
        }
        match self.mode() {
            Mode::Failing => {
                self.failed_loads.fetch_add(1, Ordering::Relaxed);
                return Err(std::io::Error::other("origin failing"));
            }
            Mode::Hanging => tokio::time::sleep(self.hang).await,
            Mode::Normal => tokio::time::sleep(delay).await,
        }
        Ok(Bytes::from(stamp(key, version)))
    }

    /// Moves `key` to a new version, before the change that tells the cache; returns it.
    pub fn bump(&self, key: usize) -> u64 {
        self.versions[key].fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records that the change that made `version` of `key` was acknowledged now.
    pub fn ack(&self, key: usize, version: u64) {
        self.acked[key]
            .lock()
            .unwrap()
            .push((version, Instant::now()));
    }

    /// The newest version of `key` acknowledged before `before`.
    pub fn acked_before(&self, key: usize, before: Instant) -> u64 {
        self.acked[key]
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| *at <= before)
            .map(|(version, _)| *version)
            .max()
            .unwrap_or(0)
    }

    pub fn loads(&self) -> HashMap<usize, Vec<Instant>> {
        self.loads
            .iter()
            .enumerate()
            .map(|(key, loads)| (key, loads.lock().unwrap().iter().map(|l| l.0).collect()))
            .collect()
    }

    /// The loads of `key`: when each started, and by which instance.
    pub fn loads_of(&self, key: usize) -> Vec<(Instant, usize)> {
        self.loads[key].lock().unwrap().clone()
    }

    /// The instants of the acknowledged changes of `key`.
    pub fn changes(&self, key: usize) -> Vec<Instant> {
        self.acked[key]
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .collect()
    }
}

pub fn key_name(key: usize) -> String {
    format!("k{key}")
}

pub fn stamp(key: usize, version: u64) -> String {
    format!("{}|{version}", key_name(key))
}

/// The key and version an answer was stamped with, if it is a stamp at all.
pub fn read_stamp(bytes: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (key, version) = text.split_once('|')?;
    Some((key.to_owned(), version.parse().ok()?))
}
