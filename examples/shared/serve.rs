//! The one HTTP server loop of the `proxy` and `bare` examples: hyper-util's `auto` server
//! (HTTP/1.1 and HTTP/2), `TCP_NODELAY` on every connection, graceful shutdown on Ctrl-C.
//! Both examples serve through it, so `scripts/bench-hits.sh` compares the proxy's answers
//! with bare hyper's, not two server configurations.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::Service;

/// How long in-flight requests may run on after Ctrl-C.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Prints `listening on ADDR` (the bound address) on stdout, for whoever started us.
pub(crate) fn announce(listener: &TcpListener) -> Result<(), String> {
    use std::io::Write;
    let local_addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let mut stdout = std::io::stdout().lock();
    // Whoever started us may wait for this line; if it is gone, keep serving regardless.
    let _ = writeln!(stdout, "listening on {local_addr}");
    let _ = stdout.flush();
    Ok(())
}

/// Serves `service` on every connection `listener` accepts until Ctrl-C, then lets requests
/// in flight finish (for up to 5 s). `name` prefixes what is printed on stderr.
pub(crate) async fn serve<S, B>(name: &str, listener: TcpListener, service: S) -> Result<(), String>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let server = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(error) => {
                        // Out of file descriptors and the like: pause rather than spin.
                        eprintln!("{name}: accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let connection = server
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service.clone()))
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    // A client that goes away mid-request is nothing to report.
                    let _ = connection.await;
                });
            }
            signal = &mut ctrl_c => {
                if let Err(error) = signal {
                    return Err(format!("cannot listen for Ctrl-C: {error}"));
                }
                break;
            }
        }
    }

    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "{name}: requests still in flight after {} s; exiting anyway",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    Ok(())
}
