//! Test support: real `redis-server` processes on free loopback ports (one server, with ACL
//! users or TLS if asked, or a three-master Redis Cluster), and a counting backend.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use tower_stampede::store::{MemoryStore, RedisStore, Store};
use tower_stampede::Cache;

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
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.server_cert)
                .arg("--tls-key-file")
                .arg(&tls.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca_cert)
                .args(["--tls-auth-clients", "no"]),
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
        panic!("redis-server did not start on any of 20 ports");
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
            self.child = self.options.spawn(self.port);
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

fn spawn(command: &mut Command) -> Child {
    command.spawn().unwrap_or_else(|e| {
        panic!("cannot start redis-server ({e}); install it, e.g. with ./scripts/test.sh")
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

/// A throwaway certificate authority and a server certificate it signed for `127.0.0.1` and
/// `localhost`, written by the `openssl` command (`./scripts/test.sh` installs it).
#[derive(Clone)]
pub struct TlsFiles {
    dir: Arc<TempDir>,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> Self {
        let dir = TempDir::new("tls");
        let path = |name: &str| dir.path().join(name);
        let openssl = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run openssl ({e}); install it, e.g. with ./scripts/test.sh")
                });
            assert!(
                output.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-new",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=tower-stampede test CA",
                ][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-new", "-subj", "/CN=127.0.0.1"][..],
                &ec,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        std::fs::write(
            path("server.ext"),
            "basicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write server.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        TlsFiles {
            ca_cert: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            dir: Arc::new(dir),
        }
    }
}

/// A Redis Cluster of three masters (no replicas) on free loopback ports, each node in a
/// temporary directory of its own; every node is killed, and its directory removed, on drop.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    /// How the nodes are started, besides their ports and cluster settings.
    options: ServerOptions,
    /// `redis-cli` arguments that reach a node (TLS, credentials).
    cli: Vec<String>,
    /// What precedes `host:port` in a node's URL: scheme and credentials.
    url_prefix: String,
}

struct ClusterNode {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisCluster {
    /// Starts three `redis-server --cluster-enabled yes`, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with(ServerOptions::default(), Vec::new(), "redis://".to_owned())
    }

    /// Like [`start`](Self::start), but every node speaks TLS only (the cluster bus too), with
    /// the certificate of `tls`, and knows only the ACL user `user` (`default` is off).
    pub fn start_secure(tls: &TlsFiles, user: &str, password: &str) -> Self {
        let acl = ["--user", "default", "off", "--user", user, "on"];
        let mut extra: Vec<String> = acl.iter().map(|s| (*s).to_owned()).collect();
        extra.extend([
            format!(">{password}"),
            "~*".into(),
            "&*".into(),
            "+@all".into(),
        ]);
        extra.extend(["--tls-cluster".into(), "yes".into()]);
        let cli = vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            tls.ca_cert.display().to_string(),
            "--user".to_owned(),
            user.to_owned(),
            "--pass".to_owned(),
            password.to_owned(),
            "--no-auth-warning".to_owned(),
        ];
        let options = ServerOptions {
            extra,
            tls: Some(tls.clone()),
        };
        Self::start_with(options, cli, format!("rediss://{user}:{password}@"))
    }

    fn start_with(options: ServerOptions, cli: Vec<String>, url_prefix: String) -> Self {
        let nodes = (0..3).map(|_| ClusterNode::start(&options)).collect();
        let cluster = RedisCluster {
            nodes,
            options,
            cli,
            url_prefix,
        };
        let addresses = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port));
        let output = cluster.redis_cli(
            &["--cluster", "create"]
                .into_iter()
                .map(str::to_owned)
                .chain(addresses)
                .chain(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned))
                .collect::<Vec<_>>(),
        );
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Runs `redis-cli` with the arguments that reach the nodes, then `args`.
    fn redis_cli(&self, args: &[String]) -> std::process::Output {
        Command::new("redis-cli")
            .args(&self.cli)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-cli ({e}); install redis-tools, e.g. with ./scripts/test.sh"
                )
            })
    }

    fn wait_ok(&self, limit: Duration) {
        let started = Instant::now();
        for node in &self.nodes {
            let args = [
                "-p".to_owned(),
                node.port.to_string(),
                "CLUSTER".into(),
                "INFO".into(),
            ];
            loop {
                let info = String::from_utf8_lossy(&self.redis_cli(&args).stdout).into_owned();
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                assert!(
                    started.elapsed() < limit,
                    "the cluster is not ok after {limit:?}: node {} says {info:?}",
                    node.port
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The URLs of the three nodes (seeds for a cluster client), with the credentials of a
    /// secure cluster.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .into_iter()
            .map(|port| format!("{}127.0.0.1:{port}/", self.url_prefix))
            .collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The port of the master that serves `key`'s slot (plain clusters only).
    pub fn node_of(&self, key: &str) -> u16 {
        let slot: i64 = self
            .query(
                &self.nodes[0],
                redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
            )
            .expect("CLUSTER KEYSLOT");
        let slots: redis::Value = self
            .query(&self.nodes[0], redis::cmd("CLUSTER").arg("SLOTS"))
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = slots else {
            panic!("unexpected CLUSTER SLOTS reply {slots:?}");
        };
        for range in ranges {
            let redis::Value::Array(range) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(first)),
                Some(redis::Value::Int(last)),
                Some(redis::Value::Array(master)),
            ) = (range.first(), range.get(1), range.get(2))
            else {
                continue;
            };
            if (*first..=*last).contains(&slot) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return u16::try_from(*port).expect("a port");
                }
            }
        }
        panic!("no node serves slot {slot} of {key:?}");
    }

    /// Empties every node's script cache, as a restart or a failover to a fresh node would
    /// (plain clusters only).
    pub fn flush_scripts(&self) {
        for node in &self.nodes {
            self.query::<()>(node, redis::cmd("SCRIPT").arg("FLUSH"))
                .expect("SCRIPT FLUSH");
        }
    }

    /// How many keys each node holds, in the order of [`ports`](Self::ports) (plain clusters
    /// only).
    pub fn keys_per_node(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|node| self.query(node, &redis::cmd("DBSIZE")).expect("DBSIZE"))
            .collect()
    }

    fn query<T: redis::FromRedisValue>(
        &self,
        node: &ClusterNode,
        command: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        assert!(
            self.options.tls.is_none(),
            "direct queries are for plain clusters"
        );
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", node.port))?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
        command.query(&mut connection)
    }
}

impl ClusterNode {
    fn start(options: &ServerOptions) -> Self {
        for _ in 0..20 {
            let (port, bus_port) = (free_port(), free_port());
            if port == bus_port {
                continue;
            }
            let dir = TempDir::new("cluster");
            let child = spawn(
                options
                    .command(port)
                    .args(["--cluster-enabled", "yes"])
                    .args(["--cluster-port", &bus_port.to_string()])
                    .arg("--cluster-config-file")
                    .arg(dir.path().join(format!("nodes-{port}.conf")))
                    .arg("--dir")
                    .arg(dir.path()),
            );
            let mut node = ClusterNode { child, port, dir };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = node.child.try_wait() {
                    break;
                }
                if options.is_up(port) {
                    return node;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // Lost a port to another test: try others (the drop kills this one).
        }
        panic!("a cluster node did not start on any of 20 port pairs");
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

/// A store shared by the apps of one test, and its Redis server if there is one.
pub struct Shared {
    pub name: &'static str,
    pub store: Arc<dyn Store>,
    _redis: Option<RedisServer>,
}

/// The embedded store, and a store on a fresh `redis-server`: every HTTP rule is tested on both.
pub async fn both() -> [Shared; 2] {
    let server = RedisServer::start();
    let redis = RedisStore::connect(server.url()).await.unwrap();
    [
        Shared {
            name: "memory",
            store: Arc::new(MemoryStore::new()),
            _redis: None,
        },
        Shared {
            name: "redis",
            store: Arc::new(redis),
            _redis: Some(server),
        },
    ]
}

impl Shared {
    /// A cache of its own (so its own L1) over the shared store.
    pub fn cache(&self) -> Cache {
        Cache::builder_shared(Arc::clone(&self.store))
            .namespace("http-test")
            .build()
    }
}

/// Starts a leader whose load takes 300 ms; returns once the load has begun.
pub async fn start_leader(
    cache: &Cache,
    key: &str,
    loads: &Counter,
    value: &'static str,
) -> tokio::task::JoinHandle<Result<Bytes, tower_stampede::Error>> {
    let started = Arc::new(Notify::new());
    let leader = tokio::spawn({
        let (cache, key, loads, started) = (
            cache.clone(),
            key.to_owned(),
            loads.clone(),
            started.clone(),
        );
        async move {
            cache
                .get_or_load(key, move || async move {
                    loads.hit();
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(value.as_bytes()))
                })
                .await
        }
    });
    started.notified().await;
    leader
}
