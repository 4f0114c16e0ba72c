//! The processes of a Sentinel topology: a data node or a sentinel on free loopback ports,
//! started until one answers, and killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::super::{free_port, reply_to_ping, spawn, ServerOptions, TempDir, TlsFiles};
use super::ask::poll;
use super::SERVICE;

/// A process on `port` with its files in `dir`.
pub(super) struct Node {
    pub(super) child: Child,
    /// The plain port, on which this starter asks it.
    pub(super) port: u16,
    /// The port replicas, sentinels and clients know it by: its TLS port with TLS (replication
    /// and the sentinels' links are then TLS too), or else `port`.
    pub(super) announced: u16,
    pub(super) dir: TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `redis-server` command of a data node on `port` (and on a TLS port, with `tls`) with its
/// files in `dir`, the replica of the node announced on `replica_of` if given.
pub(super) fn data_command(
    options: &ServerOptions,
    port: u16,
    tls: Option<(&TlsFiles, u16)>,
    dir: &TempDir,
    replica_of: Option<u16>,
) -> Command {
    let mut command = options.command(port);
    // A replica writes the snapshot it syncs from to its directory.
    command.arg("--dir").arg(dir.path());
    if let Some((files, tls_port)) = tls {
        command.args(tls_args(files, tls_port));
    }
    if let Some(primary) = replica_of {
        command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
    }
    command
}

/// The arguments that open a TLS port on a data node or sentinel, and make its replication
/// and its links to the nodes and other sentinels TLS: a node is then known by that port (in
/// its primary's `INFO`, to the sentinels, in their announcements).
pub(super) fn tls_args(files: &TlsFiles, port: u16) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = ["--tls-port", &port.to_string()]
        .into_iter()
        .map(Into::into)
        .collect();
    args.extend(["--tls-replication".into(), "yes".into()]);
    args.extend(files.server_args());
    args
}

/// The TLS port for a node on the plain `port`: another free one with `tls`, or `port`.
pub(super) fn announced_port(port: u16, tls: Option<&TlsFiles>) -> u16 {
    if tls.is_some() {
        free_port()
    } else {
        port
    }
}

/// A data node on a free port (two with `tls`), trying others if a port was lost to another
/// test.
pub(super) fn start_data_node(
    options: &ServerOptions,
    tls: Option<&TlsFiles>,
    replica_of: Option<u16>,
) -> Node {
    for _ in 0..20 {
        let (port, dir) = (free_port(), TempDir::new("sentinel-data"));
        let announced = announced_port(port, tls);
        let tls_port = tls.map(|t| (t, announced));
        let child = spawn(&mut data_command(options, port, tls_port, &dir, replica_of));
        let mut node = Node {
            child,
            port,
            announced,
            dir,
        };
        if wait_up(&mut node.child, port, |port| options.is_up(port)) {
            return node;
        }
        // Dropped: killed, and its directory removed.
    }
    panic!("a data node did not start on any of 20 ports");
}

/// A sentinel on a free port (two with `tls`) monitoring the primary announced on `primary`,
/// with a configuration file of its own (a sentinel needs one it can write: it records what it
/// learns there), trying other ports if a port was lost to another test.
pub(super) fn start_sentinel(primary: u16, more: &str, tls: Option<&TlsFiles>) -> Node {
    for _ in 0..20 {
        let (port, dir) = (free_port(), TempDir::new("sentinel"));
        let announced = announced_port(port, tls);
        let conf = dir.path().join("sentinel.conf");
        // `down-after-milliseconds` and `failover-timeout` name the master: after `monitor`.
        let text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 3000\n{more}\n",
            dir = dir.path().display()
        );
        std::fs::write(&conf, text).expect("write sentinel.conf");
        let mut command = Command::new(super::super::server_binary());
        command.arg(&conf).arg("--sentinel");
        if let Some(files) = tls {
            command.args(tls_args(files, announced));
        }
        let child = spawn(command.stdout(Stdio::null()).stderr(Stdio::null()));
        let mut node = Node {
            child,
            port,
            announced,
            dir,
        };
        let answers = |port| reply_to_ping(port).is_some_and(|reply| reply.starts_with(b"+PONG"));
        if wait_up(&mut node.child, port, answers) {
            return node;
        }
    }
    panic!("a sentinel did not start on any of 20 ports");
}

/// Waits up to 10 s until the process `child` on `port` is up; false if it exited first (a port
/// taken) or never came up.
pub(super) fn wait_up(child: &mut Child, port: u16, is_up: impl Fn(u16) -> bool) -> bool {
    let mut exited = false;
    let up = poll(Duration::from_secs(10), || {
        exited = matches!(child.try_wait(), Ok(Some(_)));
        exited || is_up(port)
    });
    up && !exited
}
