//! RFC 9111 for a shared cache, as pure functions of header fields and
//! times (seconds since the epoch, passed in, so tests move the clock):
//! storability (§3), freshness (§4.2, with RFC 9213's `CDN-Cache-Control`
//! taking the place of `Cache-Control` and `Expires` when present), age
//! (§4.2.3), what a request may be served without revalidation (§4.2.4,
//! §5.2.1), RFC 5861's `stale-while-revalidate` and `stale-if-error`, the
//! header update of a 304 (§3.2, §4.3.4) and the `--set-cookie` policy.
//! `Vary`'s secondary key (§4.1) is in `vary`; `CDN-Cache-Control`, a
//! Structured Field, is parsed in `targeted`.
//!
//! Written by hand rather than with the `http-cache-semantics` crate (3.0,
//! RFC 7234): that crate has no `stale-while-revalidate`, `stale-if-error`
//! or `CDN-Cache-Control`, keeps one variant per policy object, and takes
//! `SystemTime` only through its own request/response traits; what it does
//! have is small enough to write here and test directly.
//!
//! Responses with dependencies (`X-Tierstack-Deps`) use only [`storable`]'s
//! refusals and [`Vary`]: their freshness is a version check, never a time.

use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CACHE_CONTROL, DATE, EXPIRES, LAST_MODIFIED};
use hyper::{Method, StatusCode};

/// `CDN-Cache-Control` (RFC 9213): when valid, this cache obeys it instead
/// of `Cache-Control` and `Expires` (parsed in `targeted`).
pub(crate) use crate::targeted::CDN_CACHE_CONTROL;
/// The secondary key (§4.1), in `vary`.
pub(crate) use crate::vary::Vary;
/// Heuristic freshness (§4.2.2) is a tenth of the time since
/// `Last-Modified`, at most this (an hour).
pub(crate) const HEURISTIC_SECS_MAX: u64 = 3600;
/// Delta-seconds beyond this are taken as this (§1.2.2).
pub(crate) const DELTA_MAX: u64 = 1 << 31;

/// Seconds since the epoch now (the one clock read; everything else here
/// takes the time as an argument).
pub(crate) fn now_secs() -> u64 {
    tierstack_base::time::system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One directive's argument: absent, a valid delta-seconds, or invalid
/// (not a number, or given twice with different values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Delta {
    #[default]
    Absent,
    Secs(u64),
    Invalid,
}

impl Delta {
    /// Takes one occurrence's argument: delta-seconds (§1.2.2), as a token
    /// or a quoted-string (§5.2: recipients accept both). Nothing else is
    /// one: no whitespace around it (`max-age= 60`), no sign, fraction or
    /// suffix (`60.0`, `60a`), no single quotes.
    fn set(&mut self, value: Option<&str>) {
        let parsed = match value.map(|v| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v)) {
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                Delta::Secs(v.parse::<u64>().unwrap_or(DELTA_MAX).min(DELTA_MAX))
            }
            _ => Delta::Invalid,
        };
        self.merge(parsed);
    }

    fn merge(&mut self, parsed: Delta) {
        *self = match (*self, parsed) {
            (Delta::Absent, parsed) => parsed,
            (Delta::Secs(a), Delta::Secs(b)) if a == b => Delta::Secs(a),
            // Repeated with another value: "the response should be
            // considered stale" (§4.2.1).
            _ => Delta::Invalid,
        };
    }

    fn present(self) -> bool {
        self != Delta::Absent
    }
}

/// The directives of one `Cache-Control`-like field (§5.2), all lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Directives {
    pub no_store: bool,
    /// `no-cache`, with or without field names (a field-qualified one is
    /// treated as unqualified: stricter, and allowed).
    pub no_cache: bool,
    /// `private`, with or without field names (never stored, as above).
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub must_understand: bool,
    pub only_if_cached: bool,
    pub max_age: Delta,
    pub s_maxage: Delta,
    pub min_fresh: Delta,
    /// `max-stale` without a value: any staleness.
    pub max_stale_any: bool,
    pub max_stale: Delta,
    pub stale_while_revalidate: Delta,
    pub stale_if_error: Delta,
}

impl Directives {
    /// Parses every line of `field` in `headers`; `None` if there is none.
    pub(crate) fn parse(headers: &HeaderMap, field: &HeaderName) -> Option<Directives> {
        let mut lines = headers.get_all(field).iter().peekable();
        lines.peek()?;
        let mut d = Directives::default();
        for line in lines {
            // A line that is not text: the most restrictive reading.
            let Ok(line) = line.to_str() else {
                d.no_store = true;
                continue;
            };
            for item in split_list(line) {
                // Whitespace around a list's commas is allowed (OWS), none
                // around `=` (RFC 9110 §5.6.1, §5.2): `max-age =60` names no
                // directive this cache knows, `max-age= 60` has no valid
                // argument.
                let item = item.trim_matches([' ', '\t']);
                let (name, value) = match item.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (item, None),
                };
                if !is_token(name) {
                    continue;
                }
                // Lowercased only when it has to be (no allocation per directive).
                let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                    std::borrow::Cow::Owned(name.to_ascii_lowercase())
                } else {
                    std::borrow::Cow::Borrowed(name)
                };
                match name.as_ref() {
                    "no-store" => d.no_store = true,
                    "no-cache" => d.no_cache = true,
                    "private" => d.private = true,
                    "public" => d.public = true,
                    "must-revalidate" => d.must_revalidate = true,
                    "proxy-revalidate" => d.proxy_revalidate = true,
                    "must-understand" => d.must_understand = true,
                    "only-if-cached" => d.only_if_cached = true,
                    "max-age" => d.max_age.set(value),
                    "s-maxage" => d.s_maxage.set(value),
                    "min-fresh" => d.min_fresh.set(value),
                    "max-stale" if value.is_none() => d.max_stale_any = true,
                    "max-stale" => d.max_stale.set(value),
                    "stale-while-revalidate" => d.stale_while_revalidate.set(value),
                    "stale-if-error" => d.stale_if_error.set(value),
                    _ => {}
                }
            }
        }
        Some(d)
    }
}

/// A token (RFC 9110 §5.6.2): one or more tchar.
fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Splits a comma-separated list, not inside a quoted string
/// (`no-cache="a, b"` is one item).
fn split_list(line: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in line.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                items.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&line[start..]);
    items
}

/// An HTTP-date field as seconds since the epoch; `None` if absent, not
/// exactly one line, or not a date.
pub(crate) fn date_field(headers: &HeaderMap, field: HeaderName) -> Option<u64> {
    let mut values = headers.get_all(field).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    http_date_secs(value)
}

/// An HTTP-date in seconds since the epoch. Each thread remembers the last
/// value it parsed: a server's `Date` changes once a second, and parsing
/// one costs more than the rest of storing a response.
fn http_date_secs(value: &HeaderValue) -> Option<u64> {
    const REMEMBERED_MAX: usize = 40;
    type Remembered = ([u8; REMEMBERED_MAX], usize, Option<u64>);
    thread_local! {
        static LAST: std::cell::Cell<Option<Remembered>> = const { std::cell::Cell::new(None) };
    }
    let bytes = value.as_bytes();
    if let Some((seen, len, secs)) = LAST.get() {
        if seen.get(..len) == Some(bytes) {
            return secs;
        }
    }
    let secs = value
        .to_str()
        .ok()
        .and_then(|v| httpdate::parse_http_date(v.trim()).ok())
        .and_then(|date| date.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    if bytes.len() <= REMEMBERED_MAX {
        let mut seen = [0u8; REMEMBERED_MAX];
        seen[..bytes.len()].copy_from_slice(bytes);
        LAST.set(Some((seen, bytes.len(), secs)));
    }
    secs
}

/// The `Age` field (§5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Age {
    Absent,
    Secs(u64),
    /// Not delta-seconds (`abc`, `-1`, `1.5`, `10;a=b`): ignored in the age
    /// arithmetic (§5.1 "SHOULD ignore the field"), and the response is
    /// taken as stale on arrival ([`storable`]): its age is unknown, and
    /// revalidating is never wrong.
    Invalid,
}

/// The `Age` field: a list (`Age: 7200, 0`, or two lines) counts by its
/// first member (§5.1: "SHOULD use the first member of the field value,
/// discarding subsequent ones").
fn age_field(headers: &HeaderMap) -> Age {
    let Some(line) = headers.get(hyper::header::AGE) else { return Age::Absent };
    let first = line.as_bytes().split(|&b| b == b',').next().unwrap_or_default();
    let first = first.trim_ascii();
    if first.is_empty() || !first.iter().all(u8::is_ascii_digit) {
        return Age::Invalid;
    }
    // All digits: only its size can fail to parse (§1.2.2: the greatest).
    let secs = std::str::from_utf8(first).ok().and_then(|a| a.parse::<u64>().ok()).unwrap_or(DELTA_MAX);
    Age::Secs(secs.min(DELTA_MAX))
}

/// Status codes cacheable by default (RFC 9110 §15.1).
pub(crate) fn cacheable_by_default(status: StatusCode) -> bool {
    matches!(status.as_u16(), 200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501)
}

/// Status codes whose caching semantics this cache understands (for
/// `must-understand`, §5.2.2.3): those, plus the redirects it stores.
fn understood(status: StatusCode) -> bool {
    cacheable_by_default(status) || matches!(status.as_u16(), 302 | 303 | 307)
}

/// What the cache does with a response that carries `Set-Cookie`
/// (`--set-cookie`). RFC 9111 §7.3: `Set-Cookie` "does not inhibit
/// caching"; but a stored cookie is replayed to every client a hit
/// answers, handing one user's session to the next. So by default the
/// stored copy never keeps one: only `store` replays cookies, and only the
/// operator can choose it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SetCookie {
    /// Stored only when the origin says a shared cache may reuse it
    /// (`public` or `s-maxage`), and stored without its `Set-Cookie`
    /// fields: the client whose request fetched it gets its cookies, hits
    /// get none.
    #[default]
    IfPublic,
    /// Never stored (Varnish's built-in VCL, nginx's default).
    Never,
    /// Stored whenever it otherwise may be, without its `Set-Cookie`
    /// fields (nginx's `proxy_ignore_headers Set-Cookie` with
    /// `proxy_hide_header Set-Cookie` on the stored copy). For origins that
    /// set cookies on pages that are the same for everyone.
    Strip,
    /// Stored whenever it otherwise may be, with its `Set-Cookie`, which
    /// every hit replays to every client (RFC 9111 §7.3 read literally).
    /// Only for cookies that are the same for every client.
    Store,
}

impl SetCookie {
    /// The flag's spelling of this policy.
    pub fn name(self) -> &'static str {
        match self {
            SetCookie::IfPublic => "if-public",
            SetCookie::Never => "never",
            SetCookie::Strip => "strip",
            SetCookie::Store => "store",
        }
    }

    /// Removes the cookies a stored copy may not keep under this policy.
    pub(crate) fn strip(self, stored: &mut HeaderMap) {
        if self != SetCookie::Store {
            stored.remove(hyper::header::SET_COOKIE);
        }
    }
}

/// Why a response is not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotStored {
    Method,
    Status,
    NoStore,
    Private,
    Authorization,
    VaryStar,
    SetCookie,
    /// Nothing would ever make it reusable: no freshness, no validator.
    Useless,
}

/// What the cache keeps about a stored response's freshness, fixed when it
/// was received (or last revalidated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Freshness {
    /// Freshness lifetime (§4.2.1), seconds.
    pub lifetime: u64,
    /// `corrected_initial_age` (§4.2.3).
    pub initial_age: u64,
    /// When the response was received.
    pub response_time: u64,
    /// `no-cache`: validate before every use.
    pub no_cache: bool,
    /// Never served stale: `must-revalidate`, `proxy-revalidate`,
    /// `s-maxage` (§5.2.2.10), or `no-cache`.
    pub no_stale: bool,
    /// RFC 5861 windows past the lifetime, seconds.
    pub stale_while_revalidate: u64,
    pub stale_if_error: u64,
    /// Has `ETag` or `Last-Modified`: can be revalidated.
    pub validators: bool,
}

/// How a stored response can answer a request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Usable {
    /// As it is.
    Fresh,
    /// As it is, while it is revalidated in the background (RFC 5861 §3).
    StaleWhileRevalidate,
    /// Only after revalidation (a conditional request).
    Revalidate,
}

impl Freshness {
    /// Current age (§4.2.3) at `now`.
    pub(crate) fn age(&self, now: u64) -> u64 {
        self.initial_age.saturating_add(now.saturating_sub(self.response_time))
    }

    fn fresh(&self, now: u64) -> bool {
        self.age(now) < self.lifetime
    }

    /// May this stored response answer `request` (its directives) at `now`?
    pub(crate) fn usable(&self, request: &Directives, now: u64) -> Usable {
        let age = self.age(now);
        if self.no_cache || request.no_cache {
            return Usable::Revalidate;
        }
        if let Delta::Secs(max_age) = request.max_age {
            // Ages are whole seconds: `max-age=0` (a reload) always
            // revalidates, even a response received this second.
            if age > max_age || max_age == 0 {
                return Usable::Revalidate;
            }
        } else if request.max_age == Delta::Invalid {
            return Usable::Revalidate;
        }
        let left = self.lifetime.saturating_sub(age);
        if let Delta::Secs(min_fresh) = request.min_fresh {
            if left < min_fresh || !self.fresh(now) {
                return Usable::Revalidate;
            }
        }
        if self.fresh(now) {
            return Usable::Fresh;
        }
        if self.no_stale {
            return Usable::Revalidate;
        }
        let stale_for = age - self.lifetime;
        let client_allows = request.max_stale_any || matches!(request.max_stale, Delta::Secs(s) if stale_for <= s);
        if client_allows {
            return Usable::Fresh;
        }
        if stale_for < self.stale_while_revalidate {
            return Usable::StaleWhileRevalidate;
        }
        Usable::Revalidate
    }

    /// May it answer in place of an error (5xx or no answer) at `now`?
    /// The response's `stale-if-error`, or the request's (RFC 5861 §4).
    pub(crate) fn usable_on_error(&self, request: &Directives, now: u64) -> bool {
        if self.fresh(now) {
            return true;
        }
        if self.no_stale {
            return false;
        }
        let stale_for = self.age(now) - self.lifetime;
        let window = match request.stale_if_error {
            Delta::Secs(s) => s.max(self.stale_if_error),
            _ => self.stale_if_error,
        };
        stale_for < window
    }
}

/// The directives this cache obeys in `headers`: `CDN-Cache-Control` if
/// present and holding at least one directive (then `Expires` is ignored
/// too: the bool), else `Cache-Control`.
pub(crate) fn response_directives(headers: &HeaderMap) -> (Directives, bool) {
    match crate::targeted::directives(headers, &CDN_CACHE_CONTROL) {
        Some(targeted) => (targeted, true),
        None => (Directives::parse(headers, &CACHE_CONTROL).unwrap_or_default(), false),
    }
}

/// A request's own directives (`Pragma: no-cache` counts as `no-cache`
/// when there is no `Cache-Control`, §5.4).
pub(crate) fn request_directives(headers: &HeaderMap) -> Directives {
    match Directives::parse(headers, &CACHE_CONTROL) {
        Some(d) => d,
        None => {
            let pragma_no_cache = headers.get_all(hyper::header::PRAGMA).iter().any(|v| {
                v.to_str().is_ok_and(|v| split_list(v).iter().any(|d| d.trim().eq_ignore_ascii_case("no-cache")))
            });
            Directives { no_cache: pragma_no_cache, ..Directives::default() }
        }
    }
}

/// The refusals that apply to every response, with or without
/// dependencies: method, `no-store`, `private`, `Authorization` (§3.5),
/// `Vary: *`, `Set-Cookie` (by `set_cookie`).
pub(crate) fn refusal(
    method: &Method,
    request: &HeaderMap,
    request_cc: &Directives,
    status: StatusCode,
    response: &HeaderMap,
    cc: &Directives,
    set_cookie: SetCookie,
) -> Option<NotStored> {
    if *method != Method::GET {
        return Some(NotStored::Method);
    }
    // 206 and 304 are not complete responses; 1xx never reach here.
    if status == StatusCode::PARTIAL_CONTENT || status == StatusCode::NOT_MODIFIED || status.is_informational() {
        return Some(NotStored::Status);
    }
    if cc.must_understand {
        if !understood(status) {
            return Some(NotStored::Status);
        }
    } else if cc.no_store {
        return Some(NotStored::NoStore);
    }
    if request_cc.no_store {
        return Some(NotStored::NoStore);
    }
    if cc.private {
        return Some(NotStored::Private);
    }
    if request.contains_key(AUTHORIZATION) && !(cc.public || cc.s_maxage.present() || cc.must_revalidate) {
        return Some(NotStored::Authorization);
    }
    if Vary::of(response).is_none() {
        return Some(NotStored::VaryStar);
    }
    // (Not RFC 2965's `Set-Cookie2`: RFC 6265 obsoleted it, and no client
    // acts on one, so replaying it hands nobody a session.)
    if response.contains_key(hyper::header::SET_COOKIE) {
        let allowed = match set_cookie {
            SetCookie::IfPublic => cc.public || cc.s_maxage.present(),
            SetCookie::Never => false,
            SetCookie::Strip | SetCookie::Store => true,
        };
        if !allowed {
            return Some(NotStored::SetCookie);
        }
    }
    None
}

/// §3: may a shared cache store this response to `method` with the
/// request's `request` fields, and how fresh is it? Times: when the request
/// was sent upstream and when its response arrived.
///
/// Beyond the RFC's MUSTs, a response with `Set-Cookie` is stored only as
/// `set_cookie` allows, and a response that could never be reused (no
/// freshness, no validator, no `stale-if-error`) is not stored.
pub(crate) fn storable(
    method: &Method,
    request: &HeaderMap,
    status: StatusCode,
    response: &HeaderMap,
    (request_time, response_time): (u64, u64),
    set_cookie: SetCookie,
) -> Result<Freshness, NotStored> {
    let (cc, targeted) = response_directives(response);
    let request_cc = request_directives(request);
    if let Some(why) = refusal(method, request, &request_cc, status, response, &cc, set_cookie) {
        return Err(why);
    }
    let date = date_field(response, DATE);
    let expires = if targeted { None } else { response.get(EXPIRES).map(|_| date_field(response, EXPIRES)) };
    // Explicit freshness (§4.2.1): s-maxage, max-age, Expires − Date.
    let explicit = match (cc.s_maxage, cc.max_age, expires) {
        (Delta::Secs(s), _, _) => Some(s),
        (Delta::Invalid, _, _) => Some(0),
        (_, Delta::Secs(s), _) => Some(s),
        (_, Delta::Invalid, _) => Some(0),
        // An invalid Expires ("0", a bad date): already expired.
        (_, _, Some(expires)) => Some(expires.unwrap_or(0).saturating_sub(date.unwrap_or(response_time))),
        _ => None,
    };
    let last_modified = date_field(response, LAST_MODIFIED);
    let lifetime = match explicit {
        Some(lifetime) => lifetime,
        None if cacheable_by_default(status) || cc.public => match last_modified {
            Some(lm) => (date.unwrap_or(response_time).saturating_sub(lm) / 10).min(HEURISTIC_SECS_MAX),
            None => 0,
        },
        None => return Err(NotStored::Status),
    };
    // An invalid `Age`: stale on arrival (see [`Age::Invalid`]).
    let lifetime = if age_field(response) == Age::Invalid { 0 } else { lifetime };
    let validators = response.contains_key(hyper::header::ETAG) || last_modified.is_some();
    let secs = |d: Delta| if let Delta::Secs(s) = d { s } else { 0 };
    let freshness = Freshness {
        lifetime,
        initial_age: corrected_initial_age(response, date, request_time, response_time),
        response_time,
        no_cache: cc.no_cache,
        no_stale: cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.present() || cc.no_cache,
        stale_while_revalidate: secs(cc.stale_while_revalidate),
        stale_if_error: secs(cc.stale_if_error),
        validators,
    };
    if lifetime == 0 && !validators && freshness.stale_if_error == 0 && freshness.stale_while_revalidate == 0 {
        return Err(NotStored::Useless);
    }
    Ok(freshness)
}

/// `corrected_initial_age` (§4.2.3) of a response received at
/// `response_time` to a request sent at `request_time`.
pub(crate) fn initial_age(response: &HeaderMap, request_time: u64, response_time: u64) -> u64 {
    corrected_initial_age(response, date_field(response, DATE), request_time, response_time)
}

fn corrected_initial_age(response: &HeaderMap, date: Option<u64>, request_time: u64, response_time: u64) -> u64 {
    let apparent_age = response_time.saturating_sub(date.unwrap_or(response_time));
    let response_delay = response_time.saturating_sub(request_time);
    let age = match age_field(response) {
        Age::Secs(age) => age,
        Age::Absent | Age::Invalid => 0,
    };
    apparent_age.max(age.saturating_add(response_delay))
}

/// Fields a 304 never changes in the stored response (§3.2): `Content-
/// Length` (a MUST), and the fields "the cache's stored response depends
/// upon": the stored body's coding and range (`Content-Encoding`,
/// `Content-Range`, also "automatically processed"), its framing, and the
/// checksums of its bytes (`Content-MD5`, `Content-Digest`), which a 304,
/// having no content, cannot describe.
fn kept_on_update(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length"
            | "content-encoding"
            | "content-range"
            | "transfer-encoding"
            | "content-md5"
            | "content-digest"
    )
}

/// The stored header fields after a 304 (§4.3.4, §3.2): every field of the
/// 304 replaces all lines of that field, except the kept ones. The stored
/// `Age` goes: it described the message that carried it, and the 304's
/// own `Age` (if any) now says how old the response is.
pub(crate) fn updated_headers(stored: &HeaderMap, not_modified: &HeaderMap) -> HeaderMap {
    let mut headers = stored.clone();
    headers.remove(hyper::header::AGE);
    let mut replaced: Vec<&HeaderName> = Vec::new();
    for (name, value) in not_modified {
        if kept_on_update(name) {
            continue;
        }
        if !replaced.contains(&name) {
            headers.remove(name);
            replaced.push(name);
        }
        headers.append(name.clone(), value.clone());
    }
    headers
}

/// Should a 304 update `stored` (§4.3.4)? A strong `ETag` in the 304 must
/// equal the stored one (strong comparison); a weak one must match it
/// weakly (the 304 "contains no strong validators but does contain one or
/// more weak validators"); without an `ETag`, `Last-Modified` must agree,
/// or the 304 names no validator at all.
pub(crate) fn not_modified_selects(stored: &HeaderMap, not_modified: &HeaderMap) -> bool {
    let etag = |h: &HeaderMap| h.get(hyper::header::ETAG).cloned();
    let opaque = |tag: &HeaderValue| -> Vec<u8> {
        let tag = tag.as_bytes();
        tag.strip_prefix(b"W/").unwrap_or(tag).to_vec()
    };
    match etag(not_modified) {
        Some(new) if new.as_bytes().starts_with(b"W/") => etag(stored).is_some_and(|old| opaque(&old) == opaque(&new)),
        Some(new) => etag(stored).is_some_and(|old| old == new),
        None => match not_modified.get(LAST_MODIFIED) {
            Some(lm) => stored.get(LAST_MODIFIED) == Some(lm),
            None => true,
        },
    }
}

/// The conditional fields that revalidate a stored response (§4.3.1).
pub(crate) fn validators(stored: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut fields = Vec::new();
    if let Some(etag) = stored.get(hyper::header::ETAG) {
        fields.push((hyper::header::IF_NONE_MATCH, etag.clone()));
    }
    if let Some(lm) = stored.get(LAST_MODIFIED) {
        fields.push((hyper::header::IF_MODIFIED_SINCE, lm.clone()));
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testkit::headers;

    const T: u64 = 1_700_000_000;

    fn fresh_for(response: &[(&str, &str)]) -> Result<u64, NotStored> {
        storable(&Method::GET, &HeaderMap::new(), StatusCode::OK, &headers(response), (T, T), SetCookie::IfPublic)
            .map(|f| f.lifetime)
    }

    /// Each thread remembers the last date it parsed: dates that alternate,
    /// repeat, or follow an unparsable one are each read as themselves.
    #[test]
    fn remembered_dates_are_never_mistaken_for_others() {
        let at = |s: u64| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let (a, b) = (at(T), at(T + 1));
        let date = |value: &str| date_field(&headers(&[("date", value)]), DATE);
        for _ in 0..3 {
            assert_eq!(date(&a), Some(T));
            assert_eq!(date(&a), Some(T));
            assert_eq!(date(&b), Some(T + 1));
            assert_eq!(date("not a date"), None);
            assert_eq!(date("not a date"), None);
            // A prefix of a remembered date is another value.
            assert_eq!(date(&a[..a.len() - 4]), None);
        }
        let long = format!("{a}{}", " ".repeat(60));
        assert_eq!(date(&long), Some(T), "too long to remember, still parsed");
        assert_eq!(date(&b), Some(T + 1));
    }

    #[test]
    fn s_maxage_over_max_age_over_expires() {
        let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(T));
        let expires = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(T + 500));
        let both = [("cache-control", "max-age=100, s-maxage=200"), ("date", &date), ("expires", &expires)];
        assert_eq!(fresh_for(&both), Ok(200));
        assert_eq!(fresh_for(&[("cache-control", "max-age=100"), ("date", &date), ("expires", &expires)]), Ok(100));
        assert_eq!(fresh_for(&[("date", &date), ("expires", &expires), ("etag", "\"x\"")]), Ok(500));
        assert_eq!(fresh_for(&[("expires", "0"), ("etag", "\"x\"")]), Ok(0), "an invalid Expires is expired");
        assert_eq!(fresh_for(&[("cache-control", "max-age=\"60\"")]), Ok(60), "quoted accepted");
        assert_eq!(fresh_for(&[("cache-control", "max-age=99999999999")]), Ok(DELTA_MAX));
        assert_eq!(fresh_for(&[("cache-control", "max-age=60, max-age=60")]), Ok(60));
    }

    #[test]
    fn invalid_or_conflicting_freshness_is_stale() {
        for cc in ["max-age=abc", "max-age=-1", "max-age=60, max-age=120", "max-age="] {
            let f = storable(
                &Method::GET,
                &HeaderMap::new(),
                StatusCode::OK,
                &headers(&[("cache-control", cc), ("etag", "\"e\"")]),
                (T, T),
                SetCookie::IfPublic,
            );
            assert_eq!(f.map(|f| f.lifetime), Ok(0), "{cc}");
        }
    }

    #[test]
    fn heuristic_freshness_is_a_tenth_of_the_age_of_last_modified_bounded() {
        let at = |s: u64| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let date = at(T);
        assert_eq!(fresh_for(&[("date", &date), ("last-modified", &at(T - 1000))]), Ok(100));
        assert_eq!(fresh_for(&[("date", &date), ("last-modified", &at(T - 10_000_000))]), Ok(HEURISTIC_SECS_MAX));
        let not_by_default = storable(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::CREATED,
            &headers(&[("last-modified", &at(T - 1000))]),
            (T, T),
            SetCookie::IfPublic,
        );
        assert_eq!(not_by_default, Err(NotStored::Status));
    }

    #[test]
    fn shared_cache_refusals() {
        let get = |req: &[(&str, &str)], status: u16, res: &[(&str, &str)]| {
            storable(
                &Method::GET,
                &headers(req),
                StatusCode::from_u16(status).unwrap(),
                &headers(res),
                (T, T),
                SetCookie::IfPublic,
            )
            .err()
        };
        let fresh = [("cache-control", "max-age=60")];
        assert_eq!(get(&[], 200, &fresh), None);
        assert_eq!(get(&[], 200, &[("cache-control", "max-age=60, no-store")]), Some(NotStored::NoStore));
        assert_eq!(get(&[], 200, &[("cache-control", "max-age=60, private")]), Some(NotStored::Private));
        assert_eq!(get(&[], 200, &[("cache-control", "private=\"x-a\", max-age=60")]), Some(NotStored::Private));
        assert_eq!(get(&[("cache-control", "no-store")], 200, &fresh), Some(NotStored::NoStore));
        let auth = [("authorization", "Basic eDp5")];
        assert_eq!(get(&auth, 200, &fresh), Some(NotStored::Authorization));
        for allows in ["public, max-age=60", "s-maxage=60", "must-revalidate, max-age=60"] {
            assert_eq!(get(&auth, 200, &[("cache-control", allows)]), None, "{allows}");
        }
        assert_eq!(get(&[], 200, &[("cache-control", "max-age=60"), ("vary", "Accept, *")]), Some(NotStored::VaryStar));
        assert_eq!(get(&[], 206, &fresh), Some(NotStored::Status));
        assert_eq!(get(&[], 200, &[]), Some(NotStored::Useless));
        assert_eq!(get(&[], 200, &[("etag", "\"x\"")]), None, "stored to be revalidated");
        assert_eq!(
            get(&[], 200, &[("cache-control", "max-age=60"), ("set-cookie", "a=b")]),
            Some(NotStored::SetCookie)
        );
        assert_eq!(get(&[], 200, &[("cache-control", "public, max-age=60"), ("set-cookie", "a=b")]), None);
        assert_eq!(get(&[], 200, &[("cache-control", "no-store, must-understand, max-age=60")]), None);
        assert_eq!(get(&[], 201, &[("cache-control", "must-understand, max-age=60")]), Some(NotStored::Status));
        let head =
            storable(&Method::HEAD, &HeaderMap::new(), StatusCode::OK, &headers(&fresh), (T, T), SetCookie::IfPublic);
        assert_eq!(head.err(), Some(NotStored::Method));
    }

    #[test]
    fn cdn_cache_control_replaces_cache_control_and_expires() {
        let f = |res: &[(&str, &str)]| fresh_for(res);
        assert_eq!(f(&[("cache-control", "no-store"), ("cdn-cache-control", "max-age=30")]), Ok(30));
        assert_eq!(f(&[("cache-control", "max-age=600"), ("cdn-cache-control", "no-store")]), Err(NotStored::NoStore));
        assert_eq!(f(&[("cache-control", "max-age=600"), ("cdn-cache-control", "")]), Ok(600), "empty: ignored");
        assert_eq!(f(&[("expires", "Thu, 01 Jan 2099 00:00:00 GMT"), ("cdn-cache-control", "max-age=5")]), Ok(5));
    }

    #[test]
    fn age_and_the_request_directives_move_with_the_clock() {
        let res = headers(&[("cache-control", "max-age=100"), ("age", "10")]);
        let f =
            storable(&Method::GET, &HeaderMap::new(), StatusCode::OK, &res, (T - 2, T), SetCookie::IfPublic).unwrap();
        assert_eq!(f.age(T), 12, "Age + response delay");
        assert_eq!(f.age(T + 50), 62);
        let none = Directives::default();
        assert_eq!(f.usable(&none, T + 87), Usable::Fresh);
        assert_eq!(f.usable(&none, T + 88), Usable::Revalidate, "age 100 = lifetime: stale");
        let req = |cc: &str| request_directives(&headers(&[("cache-control", cc)]));
        assert_eq!(f.usable(&req("max-age=20"), T + 10), Usable::Revalidate);
        assert_eq!(f.usable(&req("max-age=30"), T + 10), Usable::Fresh);
        assert_eq!(f.usable(&req("min-fresh=80"), T + 10), Usable::Revalidate);
        assert_eq!(f.usable(&req("no-cache"), T), Usable::Revalidate);
        assert_eq!(f.usable(&request_directives(&headers(&[("pragma", "no-cache")])), T), Usable::Revalidate);
        assert_eq!(f.usable(&req("max-stale=10"), T + 95), Usable::Fresh);
        assert_eq!(f.usable(&req("max-stale"), T + 5000), Usable::Fresh);
        assert_eq!(f.usable(&req("max-stale=10"), T + 100), Usable::Revalidate);
    }

    #[test]
    fn stale_while_revalidate_and_stale_if_error_windows() {
        let res = headers(&[("cache-control", "max-age=10, stale-while-revalidate=20, stale-if-error=60")]);
        let f = storable(&Method::GET, &HeaderMap::new(), StatusCode::OK, &res, (T, T), SetCookie::IfPublic).unwrap();
        let none = Directives::default();
        assert_eq!(f.usable(&none, T + 5), Usable::Fresh);
        assert_eq!(f.usable(&none, T + 15), Usable::StaleWhileRevalidate);
        assert_eq!(f.usable(&none, T + 30), Usable::Revalidate);
        assert!(f.usable_on_error(&none, T + 69));
        assert!(!f.usable_on_error(&none, T + 70));
        let strict =
            headers(&[("cache-control", "max-age=10, must-revalidate, stale-while-revalidate=20, stale-if-error=60")]);
        let f =
            storable(&Method::GET, &HeaderMap::new(), StatusCode::OK, &strict, (T, T), SetCookie::IfPublic).unwrap();
        assert_eq!(f.usable(&none, T + 15), Usable::Revalidate, "must-revalidate forbids stale");
        assert!(!f.usable_on_error(&none, T + 15));
    }

    #[test]
    fn a_304_updates_stored_fields_but_not_the_framing() {
        let stored =
            headers(&[("etag", "\"a\""), ("content-length", "5"), ("x-old", "1"), ("cache-control", "max-age=1")]);
        let nm =
            headers(&[("etag", "\"a\""), ("content-length", "0"), ("cache-control", "max-age=60"), ("x-new", "2")]);
        assert!(not_modified_selects(&stored, &nm));
        let updated = updated_headers(&stored, &nm);
        assert_eq!(updated.get("content-length").unwrap(), "5");
        assert_eq!(updated.get("cache-control").unwrap(), "max-age=60");
        assert_eq!(updated.get("x-new").unwrap(), "2");
        assert_eq!(updated.get("x-old").unwrap(), "1");
        assert!(!not_modified_selects(&stored, &headers(&[("etag", "\"b\"")])));
        // §4.3.4: a weak validator in the 304 selects by weak comparison; a
        // strong one only an equal strong one.
        assert!(not_modified_selects(&headers(&[("etag", "W/\"a\"")]), &headers(&[("etag", "W/\"a\"")])));
        assert!(not_modified_selects(&stored, &headers(&[("etag", "W/\"a\"")])));
        assert!(!not_modified_selects(&headers(&[("etag", "W/\"a\"")]), &headers(&[("etag", "\"a\"")])));
        assert!(!not_modified_selects(&stored, &headers(&[("etag", "W/\"b\"")])));
    }

    #[test]
    fn a_304_keeps_what_the_stored_body_depends_on_and_drops_the_stored_age() {
        let stored = headers(&[
            ("content-md5", "old"),
            ("content-digest", "sha-256=:old:"),
            ("content-encoding", "gzip"),
            ("content-range", "bytes 0-1/2"),
            ("age", "7200"),
            ("x-a", "1"),
        ]);
        let nm = headers(&[
            ("content-md5", "new"),
            ("content-digest", "sha-256=:new:"),
            ("content-encoding", "br"),
            ("content-range", "bytes 0-0/1"),
            ("x-a", "2"),
        ]);
        let updated = updated_headers(&stored, &nm);
        for (name, kept) in
            [("content-md5", "old"), ("content-digest", "sha-256=:old:"), ("content-encoding", "gzip"), ("x-a", "2")]
        {
            assert_eq!(updated.get(name).unwrap(), kept, "{name}");
        }
        assert_eq!(updated.get("content-range").unwrap(), "bytes 0-1/2");
        assert!(updated.get("age").is_none(), "the stored Age described the old message");
        let with_age = updated_headers(&stored, &headers(&[("age", "5")]));
        assert_eq!(with_age.get_all("age").iter().collect::<Vec<_>>(), ["5"]);
    }

    /// Cache-Control arguments are delta-seconds, token or quoted, and
    /// nothing else (§1.2.2, §5.2); anything else is invalid, so stale
    /// (§4.2.1), or no directive at all when the name is no token.
    #[test]
    fn cache_control_arguments_are_parsed_strictly() {
        let lifetime = |cc: &str| fresh_for(&[("cache-control", cc), ("etag", "\"e\"")]);
        for (cc, expected) in [
            ("max-age=3600", 3600),
            ("max-age=003600", 3600),
            ("max-age=\"3600\"", 3600),
            ("  max-age=3600 ,public", 3600),
            ("Max-Age=3600", 3600),
            ("extension=\"max-age=3600\", max-age=1", 1),
            ("max-age=1, extension=\"max-age=3600\"", 1),
            ("max-age= 3600", 0),
            ("max-age=3600a", 0),
            ("max-age=a3600", 0),
            ("max-age=3600.0", 0),
            ("max-age='3600'", 0),
            ("max-age=\"3600", 0),
            ("max-age=\"\"", 0),
            ("max-age=-1", 0),
            ("max-age =3600", 0),
        ] {
            assert_eq!(lifetime(cc), Ok(expected), "{cc}");
        }
        // `max-age =3600` names no directive: heuristic freshness applies.
        let d =
            Directives::parse(&headers(&[("cache-control", "max-age =3600, no-store ,x")]), &CACHE_CONTROL).unwrap();
        assert_eq!((d.max_age, d.no_store), (Delta::Absent, true));
    }

    /// `Age` (§5.1): a list counts by its first member; a first member that
    /// is not delta-seconds leaves the response stale on arrival.
    #[test]
    fn age_uses_the_first_member_and_an_invalid_one_is_stale() {
        let arrive = |ages: &[&str]| {
            let mut fields = vec![("cache-control", "max-age=3600"), ("etag", "\"e\"")];
            fields.extend(ages.iter().map(|a| ("age", *a)));
            storable(&Method::GET, &HeaderMap::new(), StatusCode::OK, &headers(&fields), (T, T), SetCookie::IfPublic)
                .map(|f| (f.lifetime, f.age(T)))
                .unwrap()
        };
        assert_eq!(arrive(&[]), (3600, 0));
        assert_eq!(arrive(&["60"]), (3600, 60));
        assert_eq!(arrive(&["7200, 0"]), (3600, 7200));
        assert_eq!(arrive(&["7200,0"]), (3600, 7200));
        assert_eq!(arrive(&["0,7200"]), (3600, 0));
        assert_eq!(arrive(&["7200", "0"]), (3600, 7200), "two lines are one list");
        assert_eq!(arrive(&["0", "7200"]), (3600, 0));
        assert_eq!(arrive(&[" 10 "]), (3600, 10));
        assert_eq!(arrive(&["99999999999"]), (3600, DELTA_MAX));
        for invalid in ["abc", "-7200", "7200.0", "7200;foo=bar", "7200;foo=111", "", "1 2", "+5"] {
            assert_eq!(arrive(&[invalid]), (0, 0), "{invalid:?}: stale, its value ignored");
        }
        let f = storable(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &headers(&[("cache-control", "max-age=60"), ("age", "x")]),
            (T, T),
            SetCookie::IfPublic,
        );
        assert_eq!(f, Err(NotStored::Useless), "stale on arrival with no validator: not worth storing");
    }
}
