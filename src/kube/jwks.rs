//! The JWKS fetcher: the key sets of RequestAuthentications with a `jwksUri` (or, with neither
//! `jwks` nor `jwksUri`, the issuer's OpenID discovery document), fetched by ambientd and fed
//! to the index as [`Jwks`] objects, so that the pure waypoint builder inlines them into
//! `jwt_authn` as istiod does by default (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`,
//! `pilot/pkg/model/jwks_resolver.go`).
//!
//! It is a source like the manifests directory, but it follows the published snapshots: each
//! snapshot's waypoint RequestAuthentications say which key sets are wanted. A new one is
//! fetched at once; a fetched one again every `--jwks-refresh-interval` (istiod's
//! `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL`, 20 minutes). A failed fetch is retried after a
//! second, seven times, then after a minute, doubling up to an hour, as istiod's refresher
//! does. A key set is sent to the index only when its text changed; one no longer wanted is
//! deleted from it.
//!
//! Failing closed: until a fetch succeeds there is no [`Jwks`] object, and the waypoint
//! builder inlines a key nobody can sign for (`waypoint::jwt::PUBLIC_ONLY_JWKS`), so a
//! request with a token gets 401, as with istiod. A failed refresh keeps the last good keys.
//! A response must be a key set Envoy accepts (`waypoint::check_key_set`: a `keys` array with
//! at least one usable key), which is stricter than istiod's `validateJWKSFormat`: an
//! arbitrary fetched body never reaches a proxy's config, and neither does a set Envoy would
//! refuse, which would fail the waypoint's whole listener.
//!
//! Only `http` and `https` are fetched (with the system's roots), one request per
//! connection, following up to five redirects, with the rule's `timeout` (5 s by default)
//! over the whole fetch and a 1 MiB cap on a response. As istiod does, addresses that have no
//! use as a key server are refused after name resolution, on every hop: link-local ranges
//! (cloud metadata at 169.254.169.254) and the Alibaba and AWS metadata addresses outside them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::Snapshot;
use crate::discovery::model::{
    Event, Jwks, JwksSource, Kind, Object, ObjectRef, RequestAuthentication,
};
use crate::metrics::Metrics;
use crate::push::Snapshots;
use crate::waypoint::check_key_set;

/// istiod's `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` default.
pub const REFRESH: Duration = Duration::from_secs(20 * 60);
/// istiod's default `timeout` of a JWT rule's fetch.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Quick retries after a failure, a second apart (istiod's refresh flow retries seven times).
const QUICK_RETRIES: u32 = 7;
const QUICK_RETRY: Duration = Duration::from_secs(1);
/// Then a minute, doubling up to an hour (istiod's `JwtPubKeyRefreshIntervalOnFailure` and
/// its reset threshold).
const SLOW_RETRY: Duration = Duration::from_secs(60);
const MAX_RETRY: Duration = Duration::from_secs(60 * 60);
const MAX_REDIRECTS: usize = 5;
const MAX_BODY: usize = 1 << 20;

/// How the fetcher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JwksConfig {
    /// How often a fetched key set is fetched again.
    pub refresh: Duration,
}

impl Default for JwksConfig {
    fn default() -> Self {
        JwksConfig { refresh: REFRESH }
    }
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}: not an http or https URI")]
    Uri(String),
    #[error("{host}: {reason}")]
    Connect { host: String, reason: String },
    #[error("{0}")]
    Http(String),
    #[error("status {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("not a JWKS: {0}")]
    NotJwks(String),
    #[error("OpenID discovery: {0}")]
    Discovery(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// The key sets wanted by a snapshot's waypoint RequestAuthentications, each with the longest
/// `timeout` of the rules that use it.
pub(crate) fn wanted(
    authentications: &[Arc<RequestAuthentication>],
) -> BTreeMap<JwksSource, Duration> {
    let mut wanted = BTreeMap::new();
    for rule in authentications.iter().flat_map(|ra| &ra.jwt_rules) {
        let Some(source) = rule.jwks_source() else {
            continue;
        };
        let timeout = rule
            .timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let slot = wanted.entry(source).or_insert(timeout);
        *slot = (*slot).max(timeout);
    }
    wanted
}

/// How long to wait after the `failures`-th failure in a row.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    if failures <= QUICK_RETRIES {
        return QUICK_RETRY;
    }
    let doublings = (failures - QUICK_RETRIES - 1).min(16);
    SLOW_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// One wanted key set's schedule.
#[derive(Debug)]
struct Entry {
    timeout: Duration,
    next: Instant,
    failures: u32,
    in_flight: bool,
    /// The keys last sent to the index.
    sent: Option<String>,
}

/// What to fetch when, and what the index holds: pure, driven by [`follow`] with the time
/// passed in.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    entries: BTreeMap<JwksSource, Entry>,
}

impl Schedule {
    /// Follows a new set of wanted key sets: new ones are due now; the names of those no
    /// longer wanted that the index holds are returned, to be deleted.
    pub(crate) fn want(
        &mut self,
        wanted: BTreeMap<JwksSource, Duration>,
        now: Instant,
    ) -> Vec<String> {
        let gone: Vec<JwksSource> = self
            .entries
            .keys()
            .filter(|s| !wanted.contains_key(*s))
            .cloned()
            .collect();
        let mut deleted = Vec::new();
        for source in gone {
            if let Some(entry) = self.entries.remove(&source)
                && entry.sent.is_some()
            {
                deleted.push(source.key());
            }
        }
        for (source, timeout) in wanted {
            self.entries
                .entry(source)
                .and_modify(|e| e.timeout = timeout)
                .or_insert(Entry {
                    timeout,
                    next: now,
                    failures: 0,
                    in_flight: false,
                    sent: None,
                });
        }
        deleted
    }

    /// The fetches due at `now`, marked in flight.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(JwksSource, Duration)> {
        self.entries
            .iter_mut()
            .filter(|(_, e)| !e.in_flight && e.next <= now)
            .map(|(source, e)| {
                e.in_flight = true;
                (source.clone(), e.timeout)
            })
            .collect()
    }

    /// When the next fetch is due, if any is waiting.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| !e.in_flight)
            .map(|e| e.next)
            .min()
    }

    /// Records a fetch's outcome: the key set to send to the index when it is new or changed.
    pub(crate) fn fetched(
        &mut self,
        source: &JwksSource,
        result: Result<String, String>,
        now: Instant,
        refresh: Duration,
    ) -> Option<Jwks> {
        // Not wanted any more (it went while the fetch ran): nothing to send.
        let entry = self.entries.get_mut(source)?;
        entry.in_flight = false;
        match result {
            Ok(keys) => {
                entry.failures = 0;
                entry.next = now + refresh;
                if entry.sent.as_ref() == Some(&keys) {
                    return None;
                }
                entry.sent = Some(keys.clone());
                Some(Jwks {
                    name: source.key(),
                    keys,
                })
            }
            Err(_) => {
                entry.failures += 1;
                entry.next = now + retry_delay(entry.failures);
                None
            }
        }
    }
}

/// Follows the snapshots until `shutdown`, fetching what they want and sending the key sets
/// to the index as `Apply`/`Delete` events of [`Kind::Jwks`].
pub async fn follow(
    mut snapshots: Snapshots,
    events: mpsc::Sender<Event>,
    config: JwksConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut schedule = Schedule::default();
    let mut fetches: JoinSet<(JwksSource, Result<String, FetchError>)> = JoinSet::new();
    // The slice last seen: a snapshot that shares it wants the same.
    let mut seen: Option<Arc<[Arc<RequestAuthentication>]>> = None;
    let mut fresh = true;
    loop {
        if fresh {
            fresh = false;
            let snapshot: Option<Arc<Snapshot>> = snapshots.borrow_and_update().clone();
            if let Some(snapshot) = snapshot
                && !seen
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, &snapshot.waypoint_authentications))
            {
                let authentications = snapshot.waypoint_authentications.clone();
                for name in schedule.want(wanted(&authentications), Instant::now()) {
                    debug!(jwks = %name, "key set no longer wanted");
                    let reference = ObjectRef::new(Kind::Jwks, "", name);
                    if events.send(Event::Delete(reference)).await.is_err() {
                        return;
                    }
                }
                seen = Some(authentications);
            }
        }
        for (source, timeout) in schedule.due(Instant::now()) {
            fetches.spawn(async move {
                let result = match tokio::time::timeout(timeout, fetch(&source)).await {
                    Ok(result) => result,
                    Err(_) => Err(FetchError::Timeout(timeout)),
                };
                (source, result)
            });
        }
        let wake = schedule.next_due();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                fresh = true;
            }
            Some(done) = fetches.join_next(), if !fetches.is_empty() => {
                let Ok((source, result)) = done else { continue };
                let result = match result {
                    Ok(keys) => {
                        metrics.jwks_fetch_success.inc();
                        Ok(keys)
                    }
                    Err(error) => {
                        metrics.jwks_fetch_fail.inc();
                        warn!(jwks = %source.uri(), %error, "fetching a JWKS failed; the last good keys stay, else tokens are refused");
                        Err(error.to_string())
                    }
                };
                let now = Instant::now();
                if let Some(jwks) = schedule.fetched(&source, result, now, config.refresh) {
                    info!(jwks = %jwks.name, "JWKS fetched and changed");
                    if events.send(Event::Apply(Object::Jwks(jwks))).await.is_err() {
                        return;
                    }
                }
            }
            _ = sleep_until(wake) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One key set: the JWKS document's text.
pub async fn fetch(source: &JwksSource) -> Result<String, FetchError> {
    let jwks_uri = match source {
        JwksSource::Uri(uri) => uri.clone(),
        JwksSource::Discovery(uri) => {
            let body = get(uri).await?;
            let document: Value = serde_json::from_slice(&body)
                .map_err(|e| FetchError::Discovery(format!("{uri}: {e}")))?;
            match document.get("jwks_uri").and_then(Value::as_str) {
                Some(jwks_uri) => jwks_uri.to_string(),
                None => {
                    return Err(FetchError::Discovery(format!("{uri}: no jwks_uri")));
                }
            }
        }
    };
    let body = get(&jwks_uri).await?;
    let text =
        String::from_utf8(body.to_vec()).map_err(|_| FetchError::NotJwks("not UTF-8".into()))?;
    check_key_set(&text).map_err(FetchError::NotJwks)?;
    Ok(text)
}

/// GET `uri`, following redirects, and the body of its 2xx answer.
async fn get(uri: &str) -> Result<Bytes, FetchError> {
    let mut uri: Uri = uri.parse().map_err(|_| FetchError::Uri(uri.to_string()))?;
    for _ in 0..=MAX_REDIRECTS {
        let (status, location, body) = get_once(&uri).await?;
        if status.is_redirection()
            && let Some(location) = location
        {
            uri = redirect(&uri, &location)?;
            continue;
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let body: String = text.chars().take(100).collect();
            return Err(FetchError::Status { status, body });
        }
        return Ok(body);
    }
    Err(FetchError::Http(format!(
        "more than {MAX_REDIRECTS} redirects"
    )))
}

/// A redirect's target, relative to the URI that answered it.
fn redirect(from: &Uri, location: &str) -> Result<Uri, FetchError> {
    let bad = || FetchError::Uri(location.to_string());
    let target: Uri = location.parse().map_err(|_| bad())?;
    if target.scheme().is_some() {
        return Ok(target);
    }
    let mut parts = from.clone().into_parts();
    parts.path_and_query = target.path_and_query().cloned();
    Uri::from_parts(parts).map_err(|_| bad())
}

/// One request on a fresh connection: the status, the `Location` header and the body.
async fn get_once(uri: &Uri) -> Result<(StatusCode, Option<String>, Bytes), FetchError> {
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(FetchError::Uri(uri.to_string())),
    };
    let host = uri
        .host()
        .ok_or_else(|| FetchError::Uri(uri.to_string()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let connect_error = |reason: String| FetchError::Connect {
        host: host.clone(),
        reason,
    };
    let tcp = connect(&host, port).await.map_err(connect_error)?;
    let request = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, authority(uri))
        .header(hyper::header::USER_AGENT, "ambientd")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Http(e.to_string()))?;
    if tls {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| connect_error(e.to_string()))?;
        let config = tls_config().map_err(connect_error)?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| connect_error(format!("TLS: {e}")))?;
        exchange(stream, request).await
    } else {
        exchange(tcp, request).await
    }
}

fn authority(uri: &Uri) -> String {
    uri.authority().map_or_else(String::new, |a| a.to_string())
}

async fn exchange<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
) -> Result<(StatusCode, Option<String>, Bytes), FetchError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| FetchError::Http(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let driver = tokio::spawn(connection);
    let response = sender.send_request(request).await.map_err(http);
    let result = match response {
        Ok(response) => {
            let status = response.status();
            let location = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| FetchError::Http(format!("reading the body: {e}")))?
                .to_bytes();
            Ok((status, location, body))
        }
        Err(e) => Err(e),
    };
    driver.abort();
    result
}

/// A TCP connection to the first address of `host` that is not refused ([`blocked`]).
async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("resolving: {e}"))?
            .collect(),
    };
    let mut last = String::from("no address");
    let mut refused = BTreeSet::new();
    for address in addresses {
        if let Some(why) = blocked(address.ip()) {
            refused.insert(format!("{} ({why})", address.ip()));
            continue;
        }
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("{address}: {e}"),
        }
    }
    if !refused.is_empty() {
        let list: Vec<String> = refused.into_iter().collect();
        return Err(format!("refused to connect to {}", list.join(", ")));
    }
    Err(last)
}

/// Why an address is never fetched from: link-local (cloud metadata services live there),
/// or a cloud metadata address outside that range (istiod's `jwksBlockedIP`).
pub(crate) fn blocked(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            if (a, b) == (169, 254) || (a, b, c) == (224, 0, 0) {
                Some("link-local")
            } else if (a, b, c, d) == (100, 100, 100, 200) {
                Some("cloud metadata")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xff0f == 0xff02 {
                Some("link-local")
            } else if s[0] == 0xfd00 && s[1] == 0x0ec2 {
                Some("cloud metadata")
            } else {
                None
            }
        }
    }
}

/// TLS with the system's roots (built once).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let loaded = rustls_native_certs::load_native_certs();
            for error in &loaded.errors {
                warn!(%error, "loading the system's root certificates");
            }
            let (added, _) = roots.add_parsable_certificates(loaded.certs);
            debug!(roots = added, "system root certificates for JWKS fetches");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
                .map_err(|e| format!("TLS: {e}"))
        })
        .clone()
}

#[cfg(test)]
mod tests;
