//! Test support: real `redis-server` processes on free loopback ports, and a counting backend.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_stampede::store::{RedisStore, Store};

/// A `redis-server` on a free loopback port, killed when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts a server with persistence off; panics with a clear message if `redis-server` is
    /// missing (`./scripts/test.sh` installs it).
    pub fn start() -> Self {
        for _ in 0..20 {
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start redis-server ({e}); install it, e.g. with ./scripts/test.sh"
                    )
                });
            let mut server = RedisServer { child, port };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            // Lost the port to another test: try another one.
        }
        panic!("redis-server did not start on any of 20 ports");
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Whether the server answers `PING`.
    pub fn ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain redis-rs client, for reading and writing keys behind the store's back.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    /// `n` stores over this server, each a `RedisStore` of its own (its own connections and
    /// pub/sub subscriber), as `n` app instances would have.
    pub async fn stores(&self, n: usize) -> Vec<Arc<dyn Store>> {
        let mut stores: Vec<Arc<dyn Store>> = Vec::with_capacity(n);
        for _ in 0..n {
            let store = RedisStore::connect(self.url()).await.unwrap_or_else(|e| {
                panic!(
                    "cannot connect to the redis-server on port {}: {e}",
                    self.port
                )
            });
            stores.push(Arc::new(store));
        }
        stores
    }

    /// Kills the server and starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..100 {
            self.child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts again");
            if self.wait_ready(Duration::from_secs(10)) {
                return;
            }
            // The port may not be free again yet.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Freezes the server (SIGSTOP): it keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Counts calls to a backend.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}
