//! The admin listener's endpoints: counters (JSON and Prometheus), the
//! cooperative pool's counters, pushes, purges, `/healthz` and `/readyz`.
//! With an admin token, every request but a `GET` or `HEAD` must bear it
//! ([`refusal`]).
//! The client listener answers every path under [`ADMIN_PATH_PREFIX`] with
//! 404 (see the crate docs for why).

use crate::forward::upstream_uri;
use crate::state::State;
use crate::{metrics, push};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_pushpull::PUSH_PATH_PREFIX;
use tierstack_secret::Secret;
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{text, Body};

/// `GET` on the admin listener: the cooperative pool's counters as JSON
/// (`null` without `--coop`).
pub const COOP_STATS_PATH: &str = "/_tierstack/coop";

/// `DELETE <prefix><authority><target>` on the admin listener drops that
/// object (every variant).
pub const PURGE_PATH_PREFIX: &str = "/_tierstack/purge/";

/// Where every admin endpoint lives; the client listener refuses these paths.
pub(crate) const ADMIN_PATH_PREFIX: &str = "/_tierstack/";

/// The admin listener's requests: the counters, the push endpoint, and
/// `DELETE /_tierstack/purge/<authority><target>` dropping one object.
pub(crate) async fn handle_admin(state: Arc<State>, request: Request<RequestBody>) -> Response<Body> {
    if let Some(refusal) = refusal(state.admin_token.as_ref(), request.method(), request.headers()) {
        return refusal;
    }
    let path = request.uri().path();
    if path == "/_tierstack/stats" {
        let mut response = text(StatusCode::OK, serde_json::to_string(&state.stats()).unwrap_or_default());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    if path == COOP_STATS_PATH {
        let stats = state.coop.get().map(|c| c.stats());
        let mut response = text(StatusCode::OK, serde_json::to_string(&stats).unwrap_or_default());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    if path == "/metrics" {
        let mut response = text(
            StatusCode::OK,
            metrics::render(&state.stats(), &state.counters.check_latency, state.coop.get().map(|c| c.node())),
        );
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(tierstack_stats::exposition::CONTENT_TYPE));
        return response;
    }
    if let Some(name) = path.strip_prefix(PUSH_PATH_PREFIX) {
        let path = format!("/doc/{name}");
        return push::receive(&state, request, path).await;
    }
    if let Some(rest) = request.uri().path_and_query().and_then(|p| p.as_str().strip_prefix(PURGE_PATH_PREFIX)) {
        if request.method() != Method::DELETE {
            return text(StatusCode::METHOD_NOT_ALLOWED, "purges use DELETE\n");
        }
        // <authority>/<target>, e.g. /_tierstack/purge/www.example.com/a?b
        let key = match rest.find('/') {
            Some(at) => format!("{}{}", rest[..at].to_ascii_lowercase(), &rest[at..]),
            None => return text(StatusCode::BAD_REQUEST, "purge /_tierstack/purge/<authority>/<target>\n"),
        };
        return if state.cache_remove(&key) {
            state.counters.purges.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::OK, format!("purged {key}\n"))
        } else {
            text(StatusCode::NOT_FOUND, format!("{key} is not cached\n"))
        };
    }
    if path == tierstack_tier_http::HEALTHZ_PATH {
        return tierstack_tier_http::alive();
    }
    if path == tierstack_tier_http::READYZ_PATH {
        return readiness(&state).await;
    }
    text(StatusCode::NOT_FOUND, format!("no admin endpoint {path}\n"))
}

/// The 401 to answer, before anything is read or changed, unless the
/// request changes nothing (`GET`, `HEAD`) or carries `Authorization:
/// Bearer <token>` with the admin token (compared in constant time).
/// Without a token configured, none (a loopback admin listener only: see
/// `check_admin_exposure`).
fn refusal(token: Option<&Secret>, method: &Method, headers: &HeaderMap) -> Option<Response<Body>> {
    let token = token?;
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    let offered = headers.get(AUTHORIZATION).and_then(|value| bearer_token(value.as_bytes()));
    if offered.is_some_and(|offered| token.ct_eq(offered)) {
        return None;
    }
    let why =
        if offered.is_some() { "wrong admin token\n" } else { "an admin token is required (Authorization: Bearer)\n" };
    let mut response = text(StatusCode::UNAUTHORIZED, why);
    response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"tierstack-admin\""));
    Some(response)
}

/// The token of an `Authorization: Bearer <token>` value (scheme
/// case-insensitive, RFC 6750 §2.1).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| rest.trim_ascii()).filter(|token| !token.is_empty())
}

/// How long `/readyz` waits for each upstream's own `/readyz`.
const READYZ_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(1);

/// `/readyz`: ready once at least one upstream answers its own `/readyz`
/// with 200 (an application server is ready while its module answers).
/// The fabric node, needed in poll mode, is attached before the proxy
/// serves at all.
async fn readiness(state: &State) -> Response<Body> {
    let mut failures = Vec::new();
    for (index, upstream) in state.upstreams.iter().enumerate() {
        let Some(uri) = upstream_uri(upstream, tierstack_tier_http::READYZ_PATH) else {
            failures.push(format!("{upstream}: unusable URL"));
            continue;
        };
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = uri;
        match tokio::time::timeout(READYZ_UPSTREAM_TIMEOUT, state.connections.request(index, request)).await {
            Ok(Ok(response)) if response.status() == StatusCode::OK => {
                return tierstack_tier_http::readiness(&[("upstreams", Ok(()))])
            }
            Ok(Ok(response)) => failures.push(format!("{upstream}: status {}", response.status())),
            Ok(Err(e)) => failures.push(format!("{upstream}: {e}")),
            Err(_) => failures.push(format!("{upstream}: no answer within {READYZ_UPSTREAM_TIMEOUT:?}")),
        }
    }
    tierstack_tier_http::readiness(&[("upstreams", Err(format!("none ready ({})", failures.join("; "))))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn state_changing_requests_need_the_token_and_reads_do_not() {
        let token = Secret::new(b"s3cret-token".to_vec());
        let refused = |method: Method, authorization: Option<&str>| {
            refusal(Some(&token), &method, &headers(authorization)).map(|r| r.status())
        };
        for method in [Method::PUT, Method::DELETE, Method::POST, Method::PATCH] {
            assert_eq!(refused(method.clone(), None), Some(StatusCode::UNAUTHORIZED), "{method} without a token");
            assert_eq!(refused(method.clone(), Some("Bearer wrong")), Some(StatusCode::UNAUTHORIZED));
            assert_eq!(refused(method.clone(), Some("Bearer s3cret-toke")), Some(StatusCode::UNAUTHORIZED));
            assert_eq!(refused(method.clone(), Some("Basic s3cret-token")), Some(StatusCode::UNAUTHORIZED));
            assert_eq!(refused(method.clone(), Some("Bearer ")), Some(StatusCode::UNAUTHORIZED));
            assert_eq!(refused(method.clone(), Some("bearer s3cret-token")), None, "{method} with the token");
        }
        assert_eq!(refused(Method::GET, None), None);
        assert_eq!(refused(Method::HEAD, None), None);
        // Without a token configured (a loopback listener), all pass.
        assert!(refusal(None, &Method::PUT, &headers(None)).is_none());
    }

    #[test]
    fn a_refusal_says_how_to_authenticate() {
        let token = Secret::new(b"t".to_vec());
        let response = refusal(Some(&token), &Method::DELETE, &headers(None)).unwrap();
        assert!(response.headers()[WWW_AUTHENTICATE].to_str().unwrap().starts_with("Bearer"));
    }

    #[test]
    fn a_non_loopback_admin_listener_needs_a_token() {
        let lan: std::net::SocketAddr = "192.168.1.10:9080".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:9080".parse().unwrap();
        let loopback: std::net::SocketAddr = "127.0.0.1:9080".parse().unwrap();
        let loopback6: std::net::SocketAddr = "[::1]:9080".parse().unwrap();
        for addr in [lan, any] {
            let refused = crate::check_admin_exposure(Some(addr), false).unwrap_err();
            assert!(refused.to_string().contains("--admin-token-file"), "{refused}");
            assert!(crate::check_admin_exposure(Some(addr), true).is_ok());
        }
        for addr in [loopback, loopback6] {
            assert!(crate::check_admin_exposure(Some(addr), false).is_ok());
        }
        assert!(crate::check_admin_exposure(None, false).is_ok());
    }
}
