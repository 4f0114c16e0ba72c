//! Bare hyper: the yardstick of the `proxy` example's cache hits. It answers every request
//! with one static page (1 KiB unless `--body-bytes` says otherwise), looking nothing up, with
//! the fields a hit from the proxy carries when a `bare --origin` is its origin:
//! `Content-Type`, `Cache-Control`, `Content-Length`, `Date` (hyper's), `Age`, `x-cache: HIT`
//! and `Cache-Status: tower-stampede; hit; ttl=3599` (as long as the proxy's, whose `ttl`
//! counts down from 3600). With `--origin` it leaves out the last two, which the proxy adds
//! (an origin sending them would make the proxy's answers longer). It serves
//! through the same server loop as the proxy (`shared/serve.rs`: hyper-util's `auto` server,
//! the same runtime), so the difference between the two is the cache's work alone.
//!
//! ```sh
//! cargo run --release --example bare -- --listen 127.0.0.1:8080
//! cargo run --release --example bare -- --listen 127.0.0.1:8079 --origin
//! cargo run --release --example proxy -- --listen 127.0.0.1:8081 --origin http://127.0.0.1:8079
//! wrk -t2 -c64 -d10s --latency http://127.0.0.1:8080/page   # bare
//! wrk -t2 -c64 -d10s --latency http://127.0.0.1:8081/page   # the proxy's L1 hits
//! ```
//!
//! `scripts/bench-hits.sh` runs exactly that, in turns. As an origin, `bare` makes the page
//! fresh for an hour, so every request after the first is a hit; under a path that starts
//! with `/vary` it answers `Vary: Accept-Encoding` too, as any site that compresses does
//! (`scripts/bench-hits.sh --variants`). After binding it prints
//! `listening on ADDR`; Ctrl-C stops it.

#[path = "shared/serve.rs"]
mod serve;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use http::header::{AGE, CACHE_CONTROL, CONTENT_TYPE, VARY};
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tower::service_fn;

/// Serves one static page, as fast as hyper can (the yardstick of the proxy's hits).
#[derive(Debug, Parser)]
#[command(name = "bare", max_term_width = 100)]
struct Args {
    /// Address to listen on (port 0: any free port)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Size of the page
    #[arg(long, value_name = "N", default_value = "1024")]
    body_bytes: usize,

    /// Serve as the proxy's origin: without `x-cache` and `Cache-Status`, which the proxy adds
    #[arg(long)]
    origin: bool,
}

static X_CACHE: HeaderName = HeaderName::from_static("x-cache");
static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// The page, with the fields of a hit from the proxy (hyper adds `Content-Length` and `Date`),
/// or those of its origin.
fn page(body: &Bytes, origin: bool) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.clone()));
    let headers = response.headers_mut();
    headers.reserve(7);
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    headers.insert(AGE, HeaderValue::from_static("0"));
    if origin {
        return response;
    }
    headers.insert(X_CACHE.clone(), HeaderValue::from_static("HIT"));
    headers.insert(
        CACHE_STATUS.clone(),
        HeaderValue::from_static("tower-stampede; hit; ttl=3599"),
    );
    response
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bare: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let body = Bytes::from(
        b"<p>tower-stampede</p>\n"
            .iter()
            .copied()
            .cycle()
            .take(args.body_bytes)
            .collect::<Vec<u8>>(),
    );
    let origin = args.origin;
    let service = service_fn(move |request: Request<Incoming>| {
        let mut page = page(&body, origin);
        if origin && request.uri().path().starts_with("/vary") {
            page.headers_mut()
                .insert(VARY, HeaderValue::from_static("accept-encoding"));
        }
        std::future::ready(Ok::<_, Infallible>(page))
    });
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    serve::announce(&listener)?;
    serve::serve("bare", listener, service).await
}
