//! Table 1 end to end: the module, an application server whose documents
//! live in a store (`--documents-in-store`: an update rewrites the body in
//! two halves with a pause between UPDATE_PROCEED and UPDATE_DONE), and a
//! poll-mode proxy, as processes, on both fabric backends. One hot document
//! is updated back to back while readers GET it through the proxy and check
//! every body (self-checking bodies: name, version and FNV-1a hash in the
//! first line). With the real module nothing is mixed nor stale; with the
//! module's test-only switch that admits reads during updates, the same run
//! must be caught.
//!
//! Two checkers read the same run: loadgen's (its own requests, with
//! `check_bodies`: `errors.body_mismatch`, and its staleness checker) and this
//! file's readers with their own, independent body check. Each must find
//! nothing with the real module; loadgen's must catch the broken one.

use crate::{exe, start_deployment};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_coherent::DepsHeader;
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_loadgen::{run_with, LiveStats, LoadConfig, LoadReport};
use tierstack_testkit::http;
use tierstack_workload::Trace;

/// The hot document: `tierstack app-server --documents single` serves it.
const DOC: &str = "single";
/// Pause between an update's two halves: most of each update's time, so
/// with updates back to back a read admitted during one lands in a pause.
const UPDATE_WRITE_PAUSE_MS: u64 = 20;
/// GETs each checking reader makes at least ...
const READS_PER_READER: usize = 60;
/// ... and it keeps reading until this many updates are done.
const UPDATES_MIN: u64 = 5;
const READERS: usize = 3;
/// Bounds a run whose readers or updater hang.
const RUN_BOUND: Duration = Duration::from_secs(20);

fn deploy(backend: Backend, broken_module: bool) -> Deployment {
    let config = DeploymentConfig {
        exe: exe(),
        backend,
        mode: "poll".into(),
        proxies: 1,
        compute_threads: 0,
        documents: "single".into(),
        docs: 1,
        seed: 1,
        pin: false,
    };
    let mut extra = ExtraArgs {
        app_module: Vec::new(),
        app_server: vec![
            "--documents-in-store".into(),
            "--update-write-pause-ms".into(),
            UPDATE_WRITE_PAUSE_MS.to_string(),
        ],
        ..ExtraArgs::default()
    };
    if broken_module {
        extra.app_module.push("--test-only-admit-reads-during-updates".into());
    }
    start_deployment(&config, &DeploymentOptions::default(), &extra)
}

/// FNV-1a, 64 bits (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The self-checking body contract: `doc=<name> version=<v> fnv1a64=<hex>\n<content>`,
/// `<name>` the requested document, `<v>` the header's version of `doc/<name>`,
/// the hash that of `<content>`.
fn check_body(name: &str, deps: Option<&str>, body: &[u8]) -> Result<(), String> {
    let newline = body.iter().position(|&b| b == b'\n').ok_or("no first line")?;
    let line = std::str::from_utf8(&body[..newline]).map_err(|_| "first line is not UTF-8")?;
    let content = &body[newline + 1..];
    let fields: Vec<&str> = line.split(' ').collect();
    let [doc, version, hash] = fields[..] else { return Err(format!("first line {line:?}: three fields expected")) };
    let body_name = doc.strip_prefix("doc=").ok_or_else(|| format!("first line {line:?}: no doc="))?;
    let body_version: u64 = version
        .strip_prefix("version=")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("first line {line:?}: bad version="))?;
    let hash = hash
        .strip_prefix("fnv1a64=")
        .filter(|h| h.len() == 16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| format!("first line {line:?}: bad fnv1a64="))?;
    if body_name != name {
        return Err(format!("body names {body_name:?}, requested {name:?}"));
    }
    let deps = DepsHeader::parse(deps.ok_or("no X-Tierstack-Deps header")?).map_err(|e| e.to_string())?;
    let key = format!("doc/{name}");
    let header_version =
        deps.deps.iter().find(|d| d.key == key).map(|d| d.version).ok_or_else(|| format!("header lacks {key}"))?;
    if body_version != header_version {
        return Err(format!("body at version {body_version}, header says {header_version}"));
    }
    if fnv1a64(content) != hash {
        return Err(format!("content hash {:016x} != {hash:016x} of the first line {line:?}", fnv1a64(content)));
    }
    Ok(())
}

/// One GET over its own connection: status, the deps header, the body
/// (content-length or chunked).
fn get(addr: SocketAddr, path: &str) -> Result<(u16, Option<String>, Vec<u8>), String> {
    let response = http::get(addr, path).map_err(|e| format!("GET {path}: {e}"))?;
    Ok((response.status, response.header("x-tierstack-deps").map(str::to_string), response.body))
}

/// What the checking readers saw.
#[derive(Debug, Default)]
struct Checked {
    reads: usize,
    mixed: usize,
    examples: Vec<String>,
}

/// `READERS` threads each GET the hot document through the proxy
/// `READS_PER_READER` times, and on until `UPDATES_MIN` updates are done,
/// checking each body; the load (and its updater) runs until they are done.
fn run_checked(deployment: &Deployment) -> (Checked, LoadReport) {
    let proxy: SocketAddr = deployment.proxy_urls[0].trim_start_matches("http://").parse().unwrap();
    let mut config = LoadConfig::new(deployment.proxy_urls[0].clone(), Trace::single());
    config.update_target = Some(deployment.app_url.clone());
    config.connections = 2;
    // Bounds the run should the readers hang; they normally stop it.
    config.duration_ms = Some(RUN_BOUND.as_millis() as u64 + 5_000);
    config.requests_max = None;
    // Back to back: the next update starts as soon as the last one is done.
    config.update_interval_ms = 1;
    config.check_bodies = true;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let checked = Arc::new(std::sync::Mutex::new(Checked::default()));
    let live = Arc::new(LiveStats::default());
    let deadline = tierstack_base::time::instant_now() + RUN_BOUND;
    let readers = {
        let checked = checked.clone();
        let live = live.clone();
        std::thread::spawn(move || {
            let threads: Vec<_> = (0..READERS)
                .map(|_| {
                    let checked = checked.clone();
                    let live = live.clone();
                    std::thread::spawn(move || {
                        let mut reads = 0;
                        while reads < READS_PER_READER
                            || (live.updates.load(Ordering::Relaxed) < UPDATES_MIN
                                && tierstack_base::time::instant_now() < deadline)
                        {
                            reads += 1;
                            let (status, deps, body) = get(proxy, &format!("/doc/{DOC}")).unwrap();
                            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                            let verdict = check_body(DOC, deps.as_deref(), &body);
                            let mut c = checked.lock().unwrap();
                            c.reads += 1;
                            if let Err(e) = verdict {
                                c.mixed += 1;
                                if c.examples.len() < 5 {
                                    c.examples.push(e);
                                }
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            let _ = done_tx.send(());
        })
    };
    let report = runtime
        .block_on(run_with(config, live, async {
            let _ = done_rx.await;
        }))
        .unwrap();
    readers.join().unwrap();
    let checked = std::mem::take(&mut *checked.lock().unwrap());
    (checked, report)
}

fn assert_coherent(backend: Backend) {
    let deployment = deploy(backend, false);
    let (checked, report) = run_checked(&deployment);
    let name = backend.name();
    assert!(checked.reads >= READERS * READS_PER_READER);
    assert_eq!(checked.mixed, 0, "{name}: mixed bodies with the real module: {:?}", checked.examples);
    assert_eq!(report.stale_responses, 0, "{name}: stale: {:?}", report.stale_examples);
    assert_eq!(report.ok, report.requests, "{name}: errors {:?}", report.errors);
    assert!(report.accounted(), "{name}: every request accounted for");
    assert_eq!(report.errors.body_mismatch, 0, "{name}: {:?}", report.check_error_examples);
    assert_eq!(report.bodies_checked, report.checked_ok, "{name}: every loadgen body was checked");
    assert!(report.bodies_checked > 0, "{name}: loadgen checked bodies");
    assert!(report.updates.done >= UPDATES_MIN, "{name}: the updater ran ({} updates)", report.updates.done);
    deployment.stop().unwrap();
}

fn assert_caught(backend: Backend) {
    let deployment = deploy(backend, true);
    let (checked, report) = run_checked(&deployment);
    let name = backend.name();
    assert!(checked.reads >= READERS * READS_PER_READER);
    assert!(report.updates.done >= UPDATES_MIN, "{name}: the updater ran ({} updates)", report.updates.done);
    assert!(report.accounted(), "{name}: every request accounted for");
    // loadgen's checker is the one under test: it must see the violation.
    assert!(
        report.errors.body_mismatch + report.stale_responses > 0,
        "{name}: loadgen's checker missed a module admitting reads during updates ({} checked, {} updates)",
        report.checked_ok,
        report.updates.done
    );
    assert!(
        checked.mixed > 0,
        "{name}: the independent readers saw no mixed body in {} reads during {} updates",
        checked.reads,
        report.updates.done
    );
    eprintln!(
        "{name}: loadgen caught {} mixed and {} stale of {} requests; readers {} mixed of {}; e.g. {:?}",
        report.errors.body_mismatch,
        report.stale_responses,
        report.requests,
        checked.mixed,
        checked.reads,
        report.check_error_examples.first()
    );
    deployment.stop().unwrap();
}

#[test]
fn the_body_check_accepts_real_bodies_and_rejects_mixed_ones() {
    let header = |v: u64| format!("n=0;i=00000000000000aa;doc/{DOC}={v}@0");
    let (old, new) =
        (tierstack_appserver::generate_body(DOC, 4, 8192), tierstack_appserver::generate_body(DOC, 5, 8192));
    check_body(DOC, Some(&header(5)), &new).unwrap();
    let mut mixed = new[..4096].to_vec();
    mixed.extend_from_slice(&old[4096..]);
    assert!(check_body(DOC, Some(&header(5)), &mixed).is_err(), "half new, half old");
    assert!(check_body(DOC, Some(&header(5)), &old).is_err(), "old body under the new version");
    assert!(check_body("other", Some(&header(5)), &new).is_err(), "another document");
    assert!(check_body(DOC, None, &new).is_err(), "no header");
}

#[test]
fn real_module_serves_no_mixed_or_stale_body_on_shm() {
    assert_coherent(Backend::Shm);
}

#[test]
fn real_module_serves_no_mixed_or_stale_body_on_tcp() {
    assert_coherent(Backend::Tcp);
}

#[test]
fn reads_admitted_during_updates_are_caught_on_shm() {
    assert_caught(Backend::Shm);
}

#[test]
fn reads_admitted_during_updates_are_caught_on_tcp() {
    assert_caught(Backend::Tcp);
}
