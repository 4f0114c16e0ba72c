//! Invalidation by URL: which stored responses a URL names, which URLs a response to an
//! unsafe method invalidates (RFC 9111 §4.4).
//!
//! A URL's stored responses are those under the primary keys of a `GET` of it, with and
//! without credentials, and with and without keyed forwarding headers (each keyed apart).
//! Its `Vary` variants, and its forwarding variants, go with the vary markers of those keys:
//! see [`key`](crate::http::stored::key#invalidating-a-url).

use std::borrow::Cow;
use std::sync::Arc;

use http::header::{CONTENT_LOCATION, HOST, LOCATION};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use tower::util::Oneshot;
use tower::Service;

use crate::cache::Cache;
use crate::http::serving::body::ResponseBody;
use crate::http::serving::cache_status::Served;
use crate::http::serving::config::HttpConfig;
use crate::http::serving::responses::{marked, Answer};
use crate::http::stored::key;

/// Whether a response to an unsafe method invalidates: a non-error status (RFC 9111 §4.4),
/// that is 2xx or 3xx.
pub(crate) fn invalidates(status: StatusCode) -> bool {
    status.is_success() || status.is_redirection()
}

/// The primary keys under which responses for a `GET` of `request`'s URL are stored (with its
/// headers, which a [`MakeKey`](crate::http::MakeKey) may read; with credentials or not, with
/// forwarding headers or not, whatever the request's), added to `keys`; none if the key
/// cannot describe the request.
pub(crate) fn url_keys(config: &HttpConfig, request: &Parts, keys: &mut Vec<String>) {
    let key = if request.method == Method::GET {
        config.make_key.make_key(request)
    } else {
        let mut get = request.clone();
        get.method = Method::GET;
        config.make_key.make_key(&get)
    };
    if let Some(key) = key {
        let forwarding_keyed = !config.reflected.keyed().is_empty();
        for key in key::primaries(&key, forwarding_keyed) {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
}

/// The keys that a non-error response with `response` headers to the unsafe `request`
/// invalidates: its URL's, and those of `Location` and `Content-Location` when they name a
/// URL of the same origin.
pub(crate) fn keys_after_unsafe(
    config: &HttpConfig,
    mut request: Parts,
    response: &HeaderMap,
) -> Vec<String> {
    let mut keys = Vec::new();
    url_keys(config, &request, &mut keys);
    let targets: Vec<Uri> = [LOCATION, CONTENT_LOCATION]
        .iter()
        .filter_map(|name| response.get(name))
        .filter_map(|value| same_origin(&request.uri, &request.headers, value))
        .collect();
    for target in targets {
        if target != request.uri {
            request.uri = target;
            url_keys(config, &request, &mut keys);
        }
    }
    keys
}

/// Sends an unsafe request to the inner service and, if its response is not an error,
/// invalidates what it names (see [`keys_after_unsafe`]) before answering with it, within the
/// URL's bound (see [`bounded`](super::bounded)): the client that changed a resource reads its
/// change next, unless another change of the URL came within the interval, whose
/// invalidation this one then joins. A store that cannot be reached is logged; the response
/// is the inner service's all the same, marked with what became of the URL (`Cache-Status`'s
/// `detail`).
pub(crate) async fn send_unsafe<S, ReqBody, ResBody>(
    inner: S,
    cache: Cache,
    config: Arc<HttpConfig>,
    request: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
{
    let (parts, body) = request.into_parts();
    let sent = parts.clone();
    let response = Oneshot::new(inner, Request::from_parts(parts, body)).await?;
    let invalidated = if invalidates(response.status()) {
        let keys = keys_after_unsafe(&config, sent, response.headers());
        Some(config.invalidations.invalidate(&cache, keys).await)
    } else {
        None
    };
    let (mut head, body) = response.into_parts();
    config.strip_tags(&mut head.headers);
    let response = Response::from_parts(head, ResponseBody::inner(body));
    Ok(marked(
        response,
        Served::Unsafe(invalidated),
        &config.cache_status,
    ))
}

/// The URL that `reference` (a `Location` or `Content-Location` value, maybe relative) names,
/// resolved against the request's `uri` (and `Host`), if it is of the same origin (scheme and
/// authority); in the request's form (absolute, or a path with the request's `Host`).
pub(crate) fn same_origin(uri: &Uri, headers: &HeaderMap, reference: &HeaderValue) -> Option<Uri> {
    let reference = reference.to_str().ok()?.trim();
    let reference = reference.split_once('#').map_or(reference, |(r, _)| r);
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = match uri.authority() {
        Some(authority) => Cow::Borrowed(authority),
        None => Cow::Owned(
            headers
                .get(HOST)?
                .to_str()
                .ok()?
                .parse::<Authority>()
                .ok()?,
        ),
    };
    let base_path = uri.path();
    let path_and_query = if has_scheme(reference) {
        let target: Uri = reference.parse().ok()?;
        let same = target.scheme_str()?.eq_ignore_ascii_case(scheme)
            && same_authority(scheme, target.authority()?, &authority);
        if !same {
            return None;
        }
        target
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned()
    } else if let Some(rest) = reference.strip_prefix("//") {
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (target, path) = rest.split_at(end);
        if !same_authority(scheme, &target.parse().ok()?, &authority) {
            return None;
        }
        match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        }
    } else if reference.is_empty() {
        return None;
    } else if reference.starts_with('/') {
        reference.to_owned()
    } else if reference.starts_with('?') {
        format!("{base_path}{reference}")
    } else {
        let directory = base_path.rfind('/').map_or("/", |i| &base_path[..=i]);
        format!("{directory}{reference}")
    };
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query.as_str(), None),
    };
    let mut resolved = without_dot_segments(path);
    if let Some(query) = query {
        resolved.push('?');
        resolved.push_str(query);
    }
    let path_and_query: PathAndQuery = resolved.parse().ok()?;
    let mut parts = http::uri::Parts::default();
    if uri.authority().is_some() {
        parts.scheme = uri.scheme().cloned();
        parts.authority = uri.authority().cloned();
    }
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).ok()
}

/// Whether a URI reference starts with a scheme (`ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`
/// then `:`), so is absolute.
fn has_scheme(reference: &str) -> bool {
    let Some((scheme, _)) = reference.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Whether two authorities name one server for `scheme`: hosts equal but for case, ports
/// equal once the scheme's default port is filled in.
fn same_authority(scheme: &str, a: &Authority, b: &Authority) -> bool {
    let default = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    a.host().eq_ignore_ascii_case(b.host())
        && a.port_u16().unwrap_or(default) == b.port_u16().unwrap_or(default)
}

/// An absolute path with its `.` and `..` segments resolved (RFC 3986 §5.2.4).
fn without_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in path.split('/').skip(1) {
        trailing_slash = matches!(segment, "." | "..");
        match segment {
            "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, headers: &[(&'static str, &'static str)]) -> Parts {
        let mut request = Request::builder().method(method).uri(uri).body(()).unwrap();
        for (name, value) in headers {
            request
                .headers_mut()
                .append(*name, HeaderValue::from_static(value));
        }
        request.into_parts().0
    }

    fn resolve(base: &str, host: Option<&'static str>, reference: &'static str) -> Option<String> {
        let headers: Vec<_> = host.map(|h| ("host", h)).into_iter().collect();
        let request = parts("POST", base, &headers);
        same_origin(
            &request.uri,
            &request.headers,
            &HeaderValue::from_static(reference),
        )
        .map(|uri| uri.to_string())
    }

    #[test]
    fn non_error_statuses_invalidate() {
        for status in [200, 201, 204, 301, 303, 399] {
            assert!(
                invalidates(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [100, 400, 404, 409, 500, 503] {
            assert!(
                !invalidates(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }

    #[test]
    fn references_resolve_against_the_request() {
        let base = "http://a.example/x/y?q=1";
        let cases = [
            ("/z", Some("http://a.example/z")),
            ("/z?w=2#frag", Some("http://a.example/z?w=2")),
            ("z", Some("http://a.example/x/z")),
            ("../z", Some("http://a.example/z")),
            ("./z/../w/.", Some("http://a.example/x/w/")),
            ("../../../z", Some("http://a.example/z")),
            ("?w=2", Some("http://a.example/x/y?w=2")),
            ("http://A.EXAMPLE:80/z", Some("http://a.example/z")),
            ("HTTP://a.example/z", Some("http://a.example/z")),
            ("//a.example/z", Some("http://a.example/z")),
            ("//a.example", Some("http://a.example/")),
            ("//b.example/z", None),
            ("https://a.example/z", None),
            ("http://a.example:8080/z", None),
            ("http://b.example/z", None),
            ("mailto:someone@a.example", None),
            ("", None),
            ("#frag", None),
        ];
        for (reference, want) in cases {
            assert_eq!(
                resolve(base, None, reference).as_deref(),
                want,
                "{reference:?}"
            );
        }
    }

    #[test]
    fn origin_form_requests_take_their_host() {
        let host = Some("a.example:8080");
        assert_eq!(resolve("/x/y", host, "z").as_deref(), Some("/x/z"));
        assert_eq!(
            resolve("/x/y", host, "http://a.example:8080/z").as_deref(),
            Some("/z")
        );
        assert_eq!(resolve("/x/y", host, "http://a.example/z"), None);
        assert_eq!(resolve("/x/y", None, "/z"), None, "no origin to compare");
    }

    #[test]
    fn a_url_names_its_keys_with_and_without_credentials_and_forwarding_headers() {
        let config = HttpConfig::default();
        let mut keys = Vec::new();
        url_keys(
            &config,
            &parts("POST", "http://a.example/x", &[]),
            &mut keys,
        );
        let url = config
            .make_key
            .make_key(&parts("GET", "http://a.example/x", &[]))
            .unwrap();
        assert_eq!(keys.len(), 4);
        for (credentialed, forwarded) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let get = key::primary(url.clone(), credentialed, forwarded);
            assert!(keys.contains(&get), "{credentialed} {forwarded}");
        }

        let mut response = HeaderMap::new();
        response.insert(LOCATION, HeaderValue::from_static("/created/7"));
        response.insert(CONTENT_LOCATION, HeaderValue::from_static("/x"));
        let keys = keys_after_unsafe(&config, parts("POST", "http://a.example/x", &[]), &response);
        assert_eq!(
            keys.len(),
            8,
            "the URL and Location; Content-Location is the URL"
        );
    }
}
