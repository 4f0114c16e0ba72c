//! A loopback TCP proxy between one process and its store, on which the test injects the
//! faults of a network path: a delay (fixed plus jitter), a blackhole (a partition: bytes
//! accepted and held, nothing forwarded, the connections left open, no reset), a reset, or
//! replies that stall while requests still go out. Each applies to the store's command
//! connections, its subscriber's, or both.
//!
//! A connection is a subscriber's from the read that carries a `SUBSCRIBE` (or `SSUBSCRIBE`;
//! the crate names no connection, so the first subscription is what tells them apart): before
//! it, the few bytes of `HELLO` a subscriber sends count as a command connection's. A held
//! byte is never lost: when the fault is lifted it flows on, as after a partition heals and
//! TCP retransmits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the bytes of a kind of connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards every byte at once.
    Pass,
    /// Forwards each read after `fixed` plus a random part of `jitter` (in order).
    Delay { fixed: Duration, jitter: Duration },
    /// Holds every byte, both ways, and keeps the connections open: a partition.
    Blackhole,
    /// Resets (TCP RST) every connection, and each new one at once.
    Reset,
    /// Forwards requests; holds the replies (and pub/sub messages).
    StallReplies,
}

/// Which of a store's connections a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The connections that carry commands (every one that has sent no subscription).
    Commands,
    /// The subscriber's connection.
    Subscriber,
    /// Every connection.
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Faults {
    commands: Fault,
    subscriber: Fault,
}

impl Faults {
    fn of(&self, subscriber: bool) -> Fault {
        if subscriber {
            self.subscriber
        } else {
            self.commands
        }
    }
}

/// Proxies each connection made to its port to the server's port, through the faults the test
/// [sets](FaultProxy::set). Dropped, it closes everything.
pub struct FaultProxy {
    port: u16,
    faults: watch::Sender<Faults>,
    open: Arc<[AtomicUsize; 2]>,
    accepting: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to the server on `upstream` (a loopback port), on a free port of its own; its
    /// jitter is drawn from `seed`, so that a run can be repeated.
    pub async fn start(upstream: u16, seed: u64) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        let (faults, _) = watch::channel(Faults {
            commands: Fault::Pass,
            subscriber: Fault::Pass,
        });
        let open: Arc<[AtomicUsize; 2]> = Arc::default();
        let (watched, counted) = (faults.clone(), Arc::clone(&open));
        let random = Arc::new(AtomicU64::new(seed));
        let accepting = tokio::spawn(async move {
            // Aborted with the proxy: the connections' tasks go with it.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                if watched.borrow().commands == Fault::Reset {
                    reset(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let connection = Connection {
                    subscriber: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                    open: Arc::clone(&counted),
                    random: Arc::clone(&random),
                };
                connections.spawn(connection.run(client, server, watched.subscribe()));
            }
        });
        FaultProxy {
            port,
            faults,
            open,
            accepting,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL a store connects to, to reach the server through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Applies `fault` to the connections of `kind` from now on (the others keep theirs).
    pub fn set(&self, kind: Kind, fault: Fault) {
        self.faults.send_modify(|faults| {
            if kind != Kind::Subscriber {
                faults.commands = fault;
            }
            if kind != Kind::Commands {
                faults.subscriber = fault;
            }
        });
    }

    /// Lifts every fault: the bytes held flow on.
    pub fn heal(&self) {
        self.set(Kind::All, Fault::Pass);
    }

    /// The connections of `kind` open through the proxy now.
    pub fn open(&self, kind: Kind) -> usize {
        let [commands, subscriber] = &*self.open;
        let (commands, subscriber) = (
            commands.load(Ordering::SeqCst),
            subscriber.load(Ordering::SeqCst),
        );
        match kind {
            Kind::Commands => commands,
            Kind::Subscriber => subscriber,
            Kind::All => commands + subscriber,
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// One proxied connection: its kind (learnt from the client's bytes), the proxy's counts of
/// open connections, and its source of jitter.
#[derive(Clone)]
struct Connection {
    subscriber: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<[AtomicUsize; 2]>,
    random: Arc<AtomicU64>,
}

impl Connection {
    async fn run(self, client: TcpStream, server: TcpStream, faults: watch::Receiver<Faults>) {
        // A close by the proxy (a reset, or its end) is an RST, never a FIN that a client
        // could read as a clean end.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (from_client, to_client) = client.into_split();
        let (from_server, to_server) = server.into_split();
        self.open[0].fetch_add(1, Ordering::SeqCst);
        let counted = Counted(self.clone());
        let requests = self
            .clone()
            .pump(from_client, to_server, faults.clone(), true);
        let replies = self.clone().pump(from_server, to_client, faults, false);
        // Either direction's end (a close, an error, a reset) ends both: the halves drop.
        tokio::select! {
            () = requests => {}
            () = replies => {}
        }
        drop(counted);
    }

    /// Copies `from` to `to` through the faults; `requests` says the direction (client to
    /// server), in which a `SUBSCRIBE` marks the connection a subscriber's. Returns at the end
    /// of the stream, on an error, or on a reset.
    async fn pump(
        self,
        mut from: OwnedReadHalf,
        mut to: OwnedWriteHalf,
        mut faults: watch::Receiver<Faults>,
        requests: bool,
    ) {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            if !self.wait_passing(&mut faults, requests).await {
                return;
            }
            let read = tokio::select! {
                read = from.read(&mut buffer) => read,
                // A reset ends a connection even while nothing is sent on it.
                () = reset_set(&self, faults.clone()) => return,
            };
            let Ok(read) = read else {
                return;
            };
            let bytes = &buffer[..read];
            if requests && names_subscribe(bytes) && !self.subscriber.swap(true, Ordering::SeqCst) {
                self.open[0].fetch_sub(1, Ordering::SeqCst);
                self.open[1].fetch_add(1, Ordering::SeqCst);
            }
            // Bytes read just before a fault wait for it to be lifted.
            if !self.wait_passing(&mut faults, requests).await {
                return;
            }
            let fault = faults.borrow().of(self.subscriber.load(Ordering::SeqCst));
            if let Fault::Delay { fixed, jitter } = fault {
                tokio::time::sleep(fixed + self.jitter(jitter)).await;
            }
            if read == 0 || to.write_all(bytes).await.is_err() {
                let _ = to.shutdown().await;
                return;
            }
        }
    }

    /// Waits while this direction's bytes are held; false if the connection is to be reset.
    async fn wait_passing(&self, faults: &mut watch::Receiver<Faults>, requests: bool) -> bool {
        loop {
            let fault = faults
                .borrow_and_update()
                .of(self.subscriber.load(Ordering::SeqCst));
            match fault {
                Fault::Reset => return false,
                Fault::Blackhole => {}
                Fault::StallReplies if !requests => {}
                Fault::Pass | Fault::Delay { .. } | Fault::StallReplies => return true,
            }
            if faults.changed().await.is_err() {
                return false;
            }
        }
    }

    /// A random part of `jitter` (splitmix64 over the proxy's seed).
    fn jitter(&self, jitter: Duration) -> Duration {
        if jitter.is_zero() {
            return Duration::ZERO;
        }
        let mut z = self
            .random
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::SeqCst)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(z % nanos)
    }
}

/// Counts a connection open until dropped, as the kind it was last.
struct Counted(Connection);

impl Drop for Counted {
    fn drop(&mut self) {
        let kind = usize::from(self.0.subscriber.load(Ordering::SeqCst));
        self.0.open[kind].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Ends once a reset applies to `connection`'s kind.
async fn reset_set(connection: &Connection, mut faults: watch::Receiver<Faults>) {
    let _ = faults
        .wait_for(|faults| faults.of(connection.subscriber.load(Ordering::SeqCst)) == Fault::Reset)
        .await;
}

/// Closes `stream` with an RST.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Whether a client's bytes carry a (sharded) `SUBSCRIBE`.
fn names_subscribe(bytes: &[u8]) -> bool {
    bytes
        .windows(b"subscribe".len())
        .any(|window| window.eq_ignore_ascii_case(b"subscribe"))
}
