//! Purging stored responses: [`Purger`], the handle application code purges with, and the
//! `PURGE` endpoint the layer answers when [`StampedeLayer::purge`](crate::http::StampedeLayer::purge)
//! turns it on.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use http::uri::{Authority, Scheme};
use http::{request, HeaderValue, Request, Response, StatusCode, Uri};
use http_body::Body;
use tracing::warn;

use super::by_url::url_keys;
use super::remove::invalidate_keys;
use crate::cache::Cache;
use crate::http::rules::tag_fields;
use crate::http::serving::body::ResponseBody;
use crate::http::serving::config::HttpConfig;
use crate::{Error, ErrorKind};

/// Purges stored responses by URL or by tag, in every process that shares the store; from
/// [`StampedeLayer::purger`](crate::http::StampedeLayer::purger).
///
/// Cheap to clone. A purge returns once the store has removed the responses and this
/// process's memory (L1) has forgotten them; other processes forget them as the store's
/// notification reaches them (within milliseconds, and in no case later than the cache's
/// [`l1_ttl_cap`](crate::CacheBuilder::l1_ttl_cap)). A load of a purged URL in progress
/// anywhere cannot store its response afterwards.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response, Uri};
/// use http_body_util::{BodyExt, Full};
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
/// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let layer = StampedeLayer::new(Cache::builder(MemoryStore::new()).build());
/// let purger = layer.purger();
/// let version = Arc::new(AtomicUsize::new(1));
/// let mut service = ServiceBuilder::new().layer(layer).service(service_fn({
///     let version = Arc::clone(&version);
///     move |_req: Request<()>| {
///         let body = format!("version {}", version.load(Ordering::SeqCst));
///         async move {
///             Response::builder()
///                 .header("cache-control", "max-age=3600")
///                 .body(Full::new(Bytes::from(body)))
///         }
///     }
/// }));
/// let mut get = async || -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>> {
///     let request = Request::get("http://example.com/article/7").body(())?;
///     let response = service.ready().await?.call(request).await?;
///     Ok(response.into_body().collect().await?.to_bytes())
/// };
///
/// assert_eq!(get().await?, "version 1");
/// // The article changes: the cached page would be served for an hour.
/// version.store(2, Ordering::SeqCst);
/// assert_eq!(get().await?, "version 1");
/// purger.purge_url(&Uri::from_static("http://example.com/article/7")).await?;
/// assert_eq!(get().await?, "version 2");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Purger {
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl Purger {
    pub(crate) fn new(cache: Cache, config: Arc<HttpConfig>) -> Self {
        Purger { cache, config }
    }

    /// Removes the stored responses for a `GET` of `uri`: every `Vary` variant, for requests
    /// with and without credentials, under both the `http` and the `https` form of the URL.
    /// Both, because the layer keys a request as it sees it: behind a load balancer that
    /// ends TLS, `https://shop.example/p/5` reaches it as `GET /p/5` with
    /// `Host: shop.example`, keyed as `http://shop.example/p/5` by the
    /// [`DefaultKey`](crate::http::DefaultKey). The host's case does not matter, and a URL without
    /// a port (or with 80 or 443) names the page requested with either default port. The authority is the `Host` of requests in
    /// origin-form (or the authority of absolute ones); a [`MakeKey`](crate::http::MakeKey) that
    /// maps it ([`SiteKey`](crate::http::SiteKey)) maps it here too.
    /// For a [`MakeKey`](crate::http::MakeKey) that reads other request headers (a tenant), use
    /// [`purge_request`](Self::purge_request).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Url`] for a URL without an authority (`/p/5`)
    /// or of another scheme than `http` and `https`: no page was stored under it, and nothing
    /// is removed.
    ///
    /// [`ErrorKind::Store`] if the store could not be reached: this
    /// process's memory has forgotten the responses, but the store and other processes may
    /// still hold them.
    pub async fn purge_url(&self, uri: &Uri) -> Result<(), Error> {
        let known = uri
            .scheme()
            .is_some_and(|scheme| *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS);
        let Some(authority) = uri.authority().filter(|_| known) else {
            return Err(Error::new(ErrorKind::Url));
        };
        // A URL without a port, or with a default one, may have been requested with either
        // default port (keys leave out only the scheme's own; behind a load balancer that
        // ends TLS, `Host: shop.example:443` arrives keyed as `http`).
        let authorities: Vec<Authority> = match authority.port_u16() {
            None | Some(80 | 443) => ["", ":80", ":443"]
                .iter()
                .filter_map(|port| format!("{}{port}", authority.host()).parse().ok())
                .collect(),
            Some(_) => vec![authority.clone()],
        };
        let mut keys = Vec::new();
        for scheme in [Scheme::HTTP, Scheme::HTTPS] {
            for authority in &authorities {
                let mut parts = uri.clone().into_parts();
                parts.scheme = Some(scheme.clone());
                parts.authority = Some(authority.clone());
                let Ok(uri) = Uri::from_parts(parts) else {
                    return Err(Error::new(ErrorKind::Url));
                };
                let mut request = Request::new(());
                *request.uri_mut() = uri;
                if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                    request.headers_mut().insert(HOST, host);
                }
                url_keys(&self.config, &request.into_parts().0, &mut keys);
            }
        }
        invalidate_keys(&self.cache, keys).await
    }

    /// Removes the stored responses for a `GET` of the URL of `request`, keyed with its
    /// headers, as a `GET` with those headers would be (whatever its method); see
    /// [`purge_url`](Self::purge_url).
    ///
    /// # Errors
    ///
    /// As for [`purge_url`](Self::purge_url).
    pub async fn purge_request(&self, request: &request::Parts) -> Result<(), Error> {
        let mut keys = Vec::new();
        url_keys(&self.config, request, &mut keys);
        invalidate_keys(&self.cache, keys).await
    }
}

impl Purger {
    /// Removes every stored response that carries one of `tags` (from its
    /// [tag header fields](crate::http::StampedeLayer::tag_headers)), in one store call however many
    /// there are.
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use http::{Request, Response};
    /// # use http_body_util::Full;
    /// # use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
    /// # use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let layer = StampedeLayer::new(Cache::builder(MemoryStore::new()).build());
    /// let purger = layer.purger();
    /// let mut service = ServiceBuilder::new().layer(layer).service(service_fn(|_req: Request<()>| async {
    ///     Response::builder()
    ///         .header("cache-control", "max-age=3600")
    ///         .header("surrogate-key", "user:42 users")
    ///         .body(Full::new(Bytes::from("<li>Ada</li>")))
    /// }));
    /// let get = || Request::get("http://example.com/users/42").body(());
    /// let first = service.ready().await?.call(get()?).await?;
    /// assert_eq!(first.headers()["x-cache"], "MISS");
    /// assert!(!first.headers().contains_key("surrogate-key"), "kept from clients");
    /// assert_eq!(service.ready().await?.call(get()?).await?.headers()["x-cache"], "HIT");
    ///
    /// // User 42 changes: every page tagged with them is loaded again.
    /// purger.purge_tags(["user:42"]).await?;
    /// assert_eq!(service.ready().await?.call(get()?).await?.headers()["x-cache"], "MISS");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`purge_url`](Self::purge_url).
    pub async fn purge_tags<I, T>(&self, tags: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        self.cache.invalidate_tags(tags).await
    }
}

impl std::fmt::Debug for Purger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purger")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

/// The layer's answer to a `PURGE` while the endpoint is on; see
/// [`StampedeLayer::purge`](crate::http::StampedeLayer::purge).
pub(crate) async fn endpoint<B: Body, E>(
    purger: Purger,
    request: request::Parts,
) -> Result<Response<ResponseBody<B>>, E> {
    let config = &purger.config;
    let authorized = config.purge.as_ref().is_some_and(|allow| allow(&request));
    if !authorized {
        return Ok(made(StatusCode::FORBIDDEN, "purge not allowed\n"));
    }
    let purged = if tag_fields::present(&request.headers, &config.tag_headers) {
        match tag_fields::read(&request.headers, &config.tag_headers) {
            Ok(tags) if !tags.is_empty() => purger.purge_tags(tags).await,
            Ok(_) => {
                return Ok(made(
                    StatusCode::BAD_REQUEST,
                    "purge refused: the tag field names no tag\n",
                ))
            }
            Err(tag_fields::OverLimit) => {
                return Ok(made(
                    StatusCode::BAD_REQUEST,
                    "purge refused: more than 128 tags, or a tag over 256 bytes\n",
                ))
            }
        }
    } else {
        purger.purge_request(&request).await
    };
    Ok(match purged {
        Ok(()) => made(StatusCode::OK, "purged\n"),
        Err(error) => {
            warn!(
                error = &error as &dyn std::error::Error,
                "purge did not reach the store"
            );
            made(
                StatusCode::SERVICE_UNAVAILABLE,
                "purge failed: the cache's shared store could not be reached; other processes \
                 may still serve what was to be purged (answered by the cache layer, not the \
                 origin)\n",
            )
        }
    })
}

/// A short plain-text answer made by the layer, never stored by a cache downstream.
fn made<B: Body>(status: StatusCode, text: &'static str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::cached(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
