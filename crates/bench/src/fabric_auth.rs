//! What the cluster key and TLS cost on the `tcp` backend, measured beside
//! the plain path in one run: the same operations on three owners started
//! side by side, one keyed (mutual handshake, every frame sealed with a
//! 16-byte HMAC-SHA-256 tag), one keyed inside TLS 1.3 (frames encrypted by
//! TLS, not sealed again) and one without a key, alternated over several
//! rounds so that a noisy moment hits all three. The handshake happens once per
//! connection, before the first operation, so what is measured is the
//! per-frame price: a tag computed and one verified on each side of every
//! round trip.

use crate::fabric::{measure, message_round_trip, start_session_secured, FabricBenchConfig, Security, Session};
use crate::report::{us, Axes, BarGroup, Plot, Table};
use crate::stats::Summary;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;
use tierstack_cluster::Backend;

/// Alternating rounds per operation and variant; the median round is kept.
const ROUNDS: usize = 3;

/// One operation, without the key, with it, and with it inside TLS.
#[derive(Serialize)]
pub struct AuthPoint {
    pub operation: String,
    pub plain: Summary,
    pub keyed: Summary,
    pub tls: Summary,
    /// keyed p50 / plain p50 (medians over the rounds).
    pub p50_ratio: f64,
    /// keyed ops/s / plain ops/s.
    pub rate_ratio: f64,
    /// TLS p50 / plain p50.
    pub tls_p50_ratio: f64,
    /// TLS ops/s / plain ops/s.
    pub tls_rate_ratio: f64,
}

type Operation = (&'static str, usize, fn(&Session, &mut Vec<u8>) -> Result<()>);

/// The operations, each with the bytes it moves (for its buffer).
fn operations() -> Vec<Operation> {
    vec![
        ("read 8 B", 8, |s, buf| Ok(s.region.read(64, buf)?)),
        ("write 8 B", 8, |s, buf| Ok(s.region.write(64, buf)?)),
        ("fetch_add", 0, |s, _| s.region.fetch_add(0, 1).map(|_| ()).map_err(Into::into)),
        ("read 4 KiB", 4096, |s, buf| Ok(s.region.read(4096, buf)?)),
        ("write 64 KiB", 64 << 10, |s, buf| Ok(s.region.write(65536, buf)?)),
        ("read 1 MiB", 1 << 20, |s, buf| Ok(s.region.read(0, buf)?)),
        ("message round trip", 0, |s, _| message_round_trip(s.fabric.as_ref(), 8)),
    ]
}

/// Measures every operation on a keyed and a plain tcp pair.
pub(crate) fn measure_auth_cost(config: &FabricBenchConfig, dir: &Path) -> Result<Vec<AuthPoint>> {
    eprintln!("bench fabric: tcp without the cluster key, with it, and inside TLS");
    let plain = start_session_secured(config, dir, Backend::Tcp, 0, None, Security::Plain)?;
    let keyed = start_session_secured(config, dir, Backend::Tcp, 0, None, Security::Keyed)?;
    let tls = start_session_secured(config, dir, Backend::Tcp, 0, None, Security::Tls)?;
    let budget = config.budget / 2;
    let mut points = Vec::new();
    for (name, bytes, op) in operations() {
        let mut buf = vec![5u8; bytes];
        let (mut plain_rounds, mut keyed_rounds, mut tls_rounds) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            plain_rounds.push(measure(budget, || op(&plain, &mut buf))?);
            keyed_rounds.push(measure(budget, || op(&keyed, &mut buf))?);
            tls_rounds.push(measure(budget, || op(&tls, &mut buf))?);
        }
        let (plain, keyed, tls) = (median_round(plain_rounds), median_round(keyed_rounds), median_round(tls_rounds));
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        points.push(AuthPoint {
            operation: name.to_string(),
            p50_ratio: ratio(keyed.p50_ns as f64, plain.p50_ns as f64),
            rate_ratio: ratio(keyed.ops_per_sec, plain.ops_per_sec),
            tls_p50_ratio: ratio(tls.p50_ns as f64, plain.p50_ns as f64),
            tls_rate_ratio: ratio(tls.ops_per_sec, plain.ops_per_sec),
            plain,
            keyed,
            tls,
        });
    }
    Ok(points)
}

/// The round with the median p50.
fn median_round(mut rounds: Vec<Summary>) -> Summary {
    rounds.sort_by_key(|s| s.p50_ns);
    rounds.swap_remove(rounds.len() / 2)
}

pub(crate) fn auth_table(points: &[AuthPoint]) -> Table {
    let mut table = Table::new(
        "tcp: the cluster key's and TLS's cost (p50 µs; ratios to plain, one run)",
        &[
            "operation",
            "plain p50",
            "keyed p50",
            "keyed p50 ratio",
            "keyed rate ratio",
            "tls p50",
            "tls p50 ratio",
            "tls rate ratio",
        ],
    );
    for p in points {
        table.row(vec![
            p.operation.clone(),
            us(p.plain.p50_ns),
            us(p.keyed.p50_ns),
            format!("{:.3}", p.p50_ratio),
            format!("{:.3}", p.rate_ratio),
            us(p.tls.p50_ns),
            format!("{:.3}", p.tls_p50_ratio),
            format!("{:.3}", p.tls_rate_ratio),
        ]);
    }
    table
}

pub(crate) fn auth_plot(points: &[AuthPoint]) -> Plot {
    let categories = points.iter().map(|p| p.operation.clone()).collect();
    let groups = vec![
        BarGroup { label: "plain".into(), values: points.iter().map(|p| p.plain.p50_ns as f64 / 1000.0).collect() },
        BarGroup { label: "keyed".into(), values: points.iter().map(|p| p.keyed.p50_ns as f64 / 1000.0).collect() },
        BarGroup { label: "keyed, TLS".into(), values: points.iter().map(|p| p.tls.p50_ns as f64 / 1000.0).collect() },
    ];
    Plot::bars(
        "fabric-auth.svg",
        "tcp p50 latency without the key, with it, and inside TLS",
        Axes { x_label: "operation", y_label: "latency p50 (µs)", log_x: false, log_y: false },
        (categories, groups),
    )
}
