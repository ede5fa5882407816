//! Client conditionals: 304s answered from a hit (RFC 9110 §13); ranges
//! are in `ranges`.

use super::support::*;
use hyper::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_answers_if_none_match_with_304() {
    let rig = Rig::new().await;
    rig.origin
        .always(Reply::ok(&[("cache-control", "max-age=300"), ("etag", "\"e1\""), ("x-body-field", "1")], "body"));
    rig.get("/c", &[]).await;
    let not_modified = rig.get("/c", &[("if-none-match", "\"zz\", W/\"e1\"")]).await;
    assert_eq!(
        (not_modified.status, not_modified.x_cache(), not_modified.body.as_str()),
        (StatusCode::NOT_MODIFIED, "HIT", "")
    );
    assert_eq!(not_modified.field("etag"), Some("\"e1\""));
    assert_eq!(not_modified.field("cache-control"), Some("max-age=300"));
    let star = rig.get("/c", &[("if-none-match", "*")]).await;
    assert_eq!(star.status, StatusCode::NOT_MODIFIED);
    let other = rig.get("/c", &[("if-none-match", "\"e2\"")]).await;
    assert_eq!((other.status, other.body.as_str()), (StatusCode::OK, "body"));
    assert_eq!(rig.origin.requests(), 1);
    assert_eq!(rig.stats().await.not_modified, 2);
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_answers_if_modified_since_with_304() {
    let rig = Rig::new().await;
    let lm = "Mon, 02 Nov 2026 10:00:00 GMT";
    rig.origin.always(Reply::ok(&[("cache-control", "max-age=300"), ("last-modified", lm)], "body"));
    rig.get("/c", &[]).await;
    assert_eq!(rig.get("/c", &[("if-modified-since", lm)]).await.status, StatusCode::NOT_MODIFIED);
    let later = "Tue, 03 Nov 2026 10:00:00 GMT";
    assert_eq!(rig.get("/c", &[("if-modified-since", later)]).await.status, StatusCode::NOT_MODIFIED);
    let earlier = "Sun, 01 Nov 2026 10:00:00 GMT";
    assert_eq!(rig.get("/c", &[("if-modified-since", earlier)]).await.status, StatusCode::OK);
    // If-None-Match takes precedence (RFC 9110 §13.2.2).
    let both = rig.get("/c", &[("if-none-match", "\"x\""), ("if-modified-since", later)]).await;
    assert_eq!(both.status, StatusCode::OK);
}
