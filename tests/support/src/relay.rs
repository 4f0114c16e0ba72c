//! A loopback TCP relay between a client and a server, that can fall silent without closing
//! anything: a half-open connection, as a NAT or a firewall that dropped an idle flow leaves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Relays each connection made to its port to the server's port. While
/// [muted](Relay::mute_subscribers), the connections that sent a `SUBSCRIBE` (or `SSUBSCRIBE`)
/// forward no byte either way, and stay open; the bytes wait in the sockets, and flow again
/// when the relay is unmuted. Other connections (a store's data connection) flow throughout.
///
/// A connection counts as a subscriber from the read that carries the command's name, which
/// is a few bytes that loopback delivers in one read. Dropped, the relay closes everything.
pub struct Relay {
    port: u16,
    muted: watch::Sender<bool>,
    accepting: JoinHandle<()>,
}

impl Relay {
    /// A relay to the server on `upstream` (a loopback port), on a free port of its own.
    pub async fn start(upstream: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        let (muted, _) = watch::channel(false);
        let unmuted = muted.clone();
        let accepting = tokio::spawn(async move {
            // Dropped (aborted) with the relay: the connections' tasks go with it.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let subscriber = Arc::new(AtomicBool::new(false));
                let (from_client, to_client) = client.into_split();
                let (from_server, to_server) = server.into_split();
                connections.spawn(pump(
                    from_client,
                    to_server,
                    Arc::clone(&subscriber),
                    unmuted.subscribe(),
                    true,
                ));
                connections.spawn(pump(
                    from_server,
                    to_client,
                    subscriber,
                    unmuted.subscribe(),
                    false,
                ));
            }
        });
        Relay {
            port,
            muted,
            accepting,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL a store connects to, to reach the server through the relay.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops (`true`) or resumes (`false`) the subscribers' bytes, both ways.
    pub fn mute_subscribers(&self, muted: bool) {
        self.muted.send_replace(muted);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to`; for a subscriber's connection, nothing while muted. `from_client`
/// says the direction in which a `SUBSCRIBE` marks the connection a subscriber's.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    subscriber: Arc<AtomicBool>,
    mut muted: watch::Receiver<bool>,
    from_client: bool,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        hold_while_muted(&subscriber, &mut muted).await;
        let Ok(read) = from.read(&mut buffer).await else {
            return;
        };
        let bytes = &buffer[..read];
        if from_client && names_subscribe(bytes) {
            subscriber.store(true, Ordering::SeqCst);
        }
        // A read that began before the mute delivers nothing until it ends, the end of the
        // stream included.
        hold_while_muted(&subscriber, &mut muted).await;
        if read == 0 || to.write_all(bytes).await.is_err() {
            let _ = to.shutdown().await;
            return;
        }
    }
}

async fn hold_while_muted(subscriber: &AtomicBool, muted: &mut watch::Receiver<bool>) {
    if subscriber.load(Ordering::SeqCst) {
        let _ = muted.wait_for(|muted| !muted).await;
    }
}

/// Whether a client's bytes carry a (sharded) `SUBSCRIBE`.
fn names_subscribe(bytes: &[u8]) -> bool {
    bytes
        .windows(b"subscribe".len())
        .any(|window| window.eq_ignore_ascii_case(b"subscribe"))
}
