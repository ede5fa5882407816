//! Header fidelity (a property): every end-to-end field of the origin appears
//! identically on the hit.

use super::support::*;
use std::sync::atomic::Ordering;

/// Field names the proxy treats specially on the way back (framing, the
/// cache's own, hop-by-hop) are left out of the random sets.
fn special(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "content-length"
            | "age"
            | "x-cache"
            | "date"
            | "cache-control"
            | "vary"
            | "set-cookie"
            | "cdn-cache-control"
            | "expires"
    ) || name.starts_with("x-tierstack")
}

#[test]
fn every_end_to_end_field_of_the_origin_appears_identically_on_the_hit() {
    use proptest::prelude::*;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let rig = runtime.block_on(Rig::new());
    let field = ("[a-z][a-z0-9-]{0,14}", "[!-~]([ !-~]{0,30}[!-~])?");
    let fields = proptest::collection::vec(field, 0..12);
    let hops = proptest::collection::vec("x-hop-[a-z]{1,6}", 0..3);
    let case = std::sync::atomic::AtomicU32::new(0);
    proptest!(ProptestConfig::with_cases(48), |(fields in fields, hops in hops)| {
        let target = format!("/prop/{}", case.fetch_add(1, Ordering::SeqCst));
        let mut reply: Vec<(String, String)> = fields.into_iter().filter(|(n, _)| !special(n) && !n.starts_with("x-hop-")).collect();
        reply.push(("cache-control".into(), "max-age=300".into()));
        if !hops.is_empty() {
            reply.push(("connection".into(), hops.join(", ")));
            reply.extend(hops.iter().map(|h| (h.clone(), "hop".to_string())));
        }
        let script_reply = Reply { status: 200, fields: reply.clone(), body: "p".into() };
        rig.origin.always(script_reply);
        let (miss, hit) = runtime.block_on(async { (rig.get(&target, &[]).await, rig.get(&target, &[]).await) });
        prop_assert_eq!(miss.x_cache(), "MISS");
        prop_assert_eq!(hit.x_cache(), "HIT");
        // What the origin sent, end to end, in order per field name.
        for (name, _) in &reply {
            let sent: Vec<&str> = reply.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect();
            let got: Vec<&str> = hit.headers.get_all(name.as_str()).iter().map(|v| v.to_str().unwrap()).collect();
            if name == "connection" || hops.contains(name) {
                prop_assert!(got.is_empty(), "hop-by-hop {} on the hit", name);
                prop_assert!(miss.headers.get(name.as_str()).is_none(), "hop-by-hop {} on the miss", name);
            } else {
                prop_assert_eq!(got, sent, "field {}", name);
            }
        }
        prop_assert_eq!(without_cache_fields(&hit.headers), without_cache_fields(&miss.headers));
    });
}
