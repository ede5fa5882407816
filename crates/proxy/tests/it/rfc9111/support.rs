//! What every section's tests share: the scripted [`Origin`], the [`Rig`]
//! (a poll-mode proxy on its own shm fabric in front of it, with a version
//! table), and small helpers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_coherent::version_table::VersionTable;
use tierstack_coherent::{Incarnation, DEPS_HEADER};
use tierstack_fabric::{Fabric, NodeId};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_proxy::{CacheMode, Proxy, ProxyConfig, ProxyOptions, ProxyStats};
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{serve, Body, Stop};
use tokio::sync::Notify;

/// One request as the origin received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: Method,
    pub(crate) target: String,
    pub(crate) headers: HeaderMap,
}

/// The origin's answer: status, fields in order, body.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn ok(fields: &[(&str, &str)], body: &str) -> Reply {
        Reply::with(200, fields, body)
    }

    pub(crate) fn with(status: u16, fields: &[(&str, &str)], body: &str) -> Reply {
        Reply {
            status,
            fields: fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: body.to_string(),
        }
    }
}

pub(crate) type Script = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

/// The origin: answers by the current script (given the request and how
/// many came before it), records every request; while `hold` is set,
/// answers wait for `release`.
pub(crate) struct Origin {
    pub(crate) addr: SocketAddr,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    pub(crate) script: Arc<Mutex<Script>>,
    pub(crate) hold: Arc<AtomicBool>,
    pub(crate) release: Arc<Notify>,
}

impl Origin {
    pub(crate) async fn start() -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Arc::new(|_: &Seen, _| Reply::ok(&[], "unset"))));
        let (hold, release) = (Arc::new(AtomicBool::new(false)), Arc::new(Notify::new()));
        let (s, sc, h, r) = (seen.clone(), script.clone(), hold.clone(), release.clone());
        let handler = Arc::new(move |request: Request<RequestBody>| {
            let request_seen = Seen {
                method: request.method().clone(),
                target: request.uri().path_and_query().map_or("/".into(), |p| p.to_string()),
                headers: request.headers().clone(),
            };
            let script = sc.lock().unwrap().clone();
            let reply = {
                let mut seen = s.lock().unwrap();
                let reply = script(&request_seen, seen.len());
                seen.push(request_seen);
                reply
            };
            let (hold, release) = (h.clone(), r.clone());
            async move {
                if hold.load(Ordering::SeqCst) {
                    release.notified().await;
                }
                let mut response: Response<Body> = Response::new(Full::new(Bytes::from(reply.body)));
                *response.status_mut() = StatusCode::from_u16(reply.status).unwrap();
                for (name, value) in reply.fields {
                    response.headers_mut().append(
                        HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        HeaderValue::from_str(&value).unwrap(),
                    );
                }
                response
            }
        });
        tokio::spawn(serve(listener, handler, Stop::new()));
        Origin { addr, seen, script, hold, release }
    }

    pub(crate) fn answer(&self, script: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }

    /// Always the same reply.
    pub(crate) fn always(&self, reply: Reply) {
        self.answer(move |_, _| reply.clone());
    }

    pub(crate) fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub(crate) fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }

    pub(crate) fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.release.notify_waiters();
    }
}

/// A TCP relay in front of the origin that can be cut: while cut, every
/// connection through it (open or new) is closed before a byte of an
/// answer, as by an origin that crashed or a network that failed.
pub(crate) struct Relay {
    pub(crate) addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    /// Connections being relayed now; a cut waits until it is 0, so no
    /// request sent after the cut can still slip through an open one.
    open: tokio::sync::watch::Sender<usize>,
}

impl Relay {
    pub(crate) async fn start(to: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, watch) = tokio::sync::watch::channel(false);
        let (open, _) = tokio::sync::watch::channel(0usize);
        let counter = open.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut watch = watch.clone();
                if *watch.borrow() {
                    continue;
                }
                counter.send_modify(|n| *n += 1);
                let counter = counter.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        // The cut first: a connection accepted just as the cut came
                        // relays nothing.
                        tokio::select! {
                            biased;
                            _ = watch.wait_for(|cut| *cut) => {}
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        }
                    }
                    // Both streams are closed before the count drops.
                    drop(inbound);
                    counter.send_modify(|n| *n -= 1);
                });
            }
        });
        Relay { addr, cut, open }
    }

    /// Cuts (or restores) the way to the origin; a cut returns once every
    /// connection open through the relay is closed.
    pub(crate) async fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
        if cut {
            self.open.subscribe().wait_for(|n| *n == 0).await.unwrap();
        }
    }
}

/// A proxy (poll mode, its own shm fabric) in front of an [`Origin`], and
/// a version table for responses with dependencies.
pub(crate) struct Rig {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) origin: Origin,
    /// Between the proxy and the origin, if the rig was built with one.
    pub(crate) relay: Option<Relay>,
    pub(crate) proxy: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) table: Arc<VersionTable>,
    pub(crate) _module: Arc<ShmFabric>,
    pub(crate) client: Client<HttpConnector, Full<Bytes>>,
}

/// What the client got.
#[derive(Debug)]
pub(crate) struct Got {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Got {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub(crate) fn x_cache(&self) -> &str {
        self.field("x-cache").unwrap_or("")
    }
}

impl Rig {
    pub(crate) async fn new() -> Rig {
        Rig::with_mode(CacheMode::Poll).await
    }

    pub(crate) async fn with_mode(mode: CacheMode) -> Rig {
        Rig::build(mode, ProxyOptions::default(), false).await
    }

    pub(crate) async fn with_options(mode: CacheMode, options: ProxyOptions) -> Rig {
        Rig::build(mode, options, false).await
    }

    /// With `options`, and a [`Relay`] between the proxy and the origin if
    /// `relay`.
    pub(crate) async fn build(mode: CacheMode, options: ProxyOptions, relay: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let module = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(0))).unwrap();
        let table = Arc::new(VersionTable::create(module.as_ref(), 16, Incarnation(3)).unwrap());
        let proxy_fabric: Arc<dyn Fabric> = ShmFabric::open(ShmConfig::new(dir.path(), NodeId(1))).unwrap();
        let origin = Origin::start().await;
        let relay = if relay { Some(Relay::start(origin.addr).await) } else { None };
        let upstream = relay.as_ref().map_or(origin.addr, |relay| relay.addr);
        let proxy = Proxy::bind_with(
            ProxyConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                upstreams: vec![format!("http://{upstream}")],
                mode,
                cache_bytes: 64 << 20,
                upstream_timeout: Duration::from_secs(20),
                fabric: Some(proxy_fabric),
                admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            },
            options,
        )
        .await
        .unwrap();
        let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
        tokio::spawn(proxy.run(Stop::new()));
        Rig {
            _dir: dir,
            origin,
            relay,
            proxy: addr,
            admin,
            table,
            _module: module,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub(crate) async fn send(&self, method: Method, target: &str, fields: &[(&str, &str)]) -> Got {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = format!("http://{}{target}", self.proxy).parse().unwrap();
        for (name, value) in fields {
            request
                .headers_mut()
                .append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        let response = self.client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    pub(crate) async fn get(&self, target: &str, fields: &[(&str, &str)]) -> Got {
        self.send(Method::GET, target, fields).await
    }

    pub(crate) async fn stats(&self) -> ProxyStats {
        let uri = format!("http://{}/_tierstack/stats", self.admin).parse().unwrap();
        let body = self.client.get(uri).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    /// The current dependency header of `key`.
    pub(crate) fn deps(&self, key: &str) -> String {
        let slot = self.table.slot_of(key).unwrap();
        self.table.header(&[(key.to_string(), slot)]).unwrap().to_string()
    }

    pub(crate) fn bump(&self, key: &str) {
        self.table.bump(self.table.slot_of(key).unwrap()).unwrap();
    }
}

/// Waits (bounded) until `condition` holds.
pub(crate) async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what}: never happened");
}

pub(crate) fn http_date(offset_secs: i64) -> String {
    let now = tierstack_base::time::system_now();
    let at = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs((-offset_secs) as u64)
    };
    httpdate::fmt_http_date(at)
}

/// The fields a cache adds or may set on a hit.
pub(crate) fn without_cache_fields(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(n, _)| !matches!(n.as_str(), "age" | "x-cache" | "x-cache-coalesced"))
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect()
}

/// Two GETs of a fresh response with `fields`; how many reached the origin.
pub(crate) async fn origin_requests_for_two_gets(fields: &[(&str, &str)], request: &[(&str, &str)]) -> usize {
    let rig = Rig::new().await;
    rig.origin.always(Reply::ok(fields, "x"));
    rig.get("/r", request).await;
    rig.get("/r", request).await;
    let stats = rig.stats().await;
    assert_eq!(stats.accounting_error(), None, "{stats:?}");
    rig.origin.requests()
}

/// An origin answering every GET with the current dependency header of
/// `doc/a` and `fields`.
pub(crate) fn deps_origin(rig: &Rig, fields: &'static [(&'static str, &'static str)]) {
    let table = rig.table.clone();
    rig.origin.answer(move |seen, _| {
        let slot = table.slot_of("doc/a").unwrap();
        let deps = table.header(&[("doc/a".to_string(), slot)]).unwrap().to_string();
        let who = seen
            .headers
            .get("authorization")
            .or(seen.headers.get("cookie"))
            .map_or("-".into(), |v| v.to_str().unwrap().to_string());
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push((DEPS_HEADER, &deps));
        Reply::ok(&all, &format!("{deps} {who}"))
    });
}
