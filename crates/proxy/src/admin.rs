//! The admin listener's endpoints: counters (JSON and Prometheus), the
//! cooperative pool's counters, pushes, purges, `/healthz` and `/readyz`.
//! The client listener answers every path under [`ADMIN_PATH_PREFIX`] with
//! 404 (see the crate docs for why).

use crate::forward::upstream_uri;
use crate::state::State;
use crate::{metrics, push};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_pushpull::PUSH_PATH_PREFIX;
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
pub(crate) async fn handle_admin(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
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
        let mut response = text(StatusCode::OK, metrics::render(&state.stats(), &state.counters.check_latency));
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
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
