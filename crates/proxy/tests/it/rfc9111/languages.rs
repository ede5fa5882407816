//! `Vary: Accept-Language` (§4.1) with normalised request values: case,
//! order among equal weights, whitespace and weight spelling do not make a
//! new variant; a response in one language serves requests preferring it
//! most.

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_language_variants_are_selected_by_their_normal_form() {
    let rig = Rig::new().await;
    rig.origin.answer(|seen, n| {
        let asked = seen.headers.get("accept-language").map_or("-", |v| v.to_str().unwrap()).to_string();
        let fields = [("cache-control", "max-age=300"), ("vary", "Accept-Language"), ("content-language", "de")];
        Reply::ok(&fields, &format!("{n} for {asked}"))
    });
    let stored = rig.get("/l", &[("accept-language", "en, de")]).await;
    assert_eq!(stored.body, "0 for en, de");
    for same in ["de, en", "eN, De", " en ,   de", "en;q=1.0, de;q=1", "fr;q=0.5, de;q=1.0"] {
        let got = rig.get("/l", &[("accept-language", same)]).await;
        assert_eq!((got.x_cache(), got.body.as_str()), ("HIT", "0 for en, de"), "{same}");
    }
    for other in ["fr", "en", "en, fr", "de-AT"] {
        let got = rig.get("/l", &[("accept-language", other)]).await;
        assert_eq!(got.x_cache(), "MISS", "{other}");
    }
    assert_eq!(rig.origin.requests(), 5);
}
