//! The fetcher's pure parts as tables (what is wanted, when to retry, what is sent), and its
//! I/O against a key server on loopback: a JWKS, OpenID discovery, redirects, failures, and
//! the task following snapshots.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus, header};
use axum::routing::get as route;
use tokio::sync::watch;

use super::*;
use crate::discovery::model::JwtRule;

/// A key set Envoy accepts: one P-256 key with key id `kid`.
fn key_set(kid: &str) -> String {
    format!(
        r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"{kid}","x":"VXVkC_DOoEmNESjUIriZ9f_SOSC2vV0HcrpWNry3NZE","y":"ZbaMLwmT3xfYe8ZX1ycNQGgFY7mag-nYdzDizVbSzR0"}}]}}"#
    )
}

fn rule(jwks_uri: &str, timeout_ms: Option<u64>) -> JwtRule {
    JwtRule {
        issuer: "i".into(),
        jwks_uri: jwks_uri.into(),
        timeout_ms,
        ..Default::default()
    }
}

fn authentication(rules: Vec<JwtRule>) -> Arc<RequestAuthentication> {
    Arc::new(RequestAuthentication {
        name: "jwt".into(),
        namespace: "demo".into(),
        jwt_rules: rules,
        ..Default::default()
    })
}

#[test]
fn the_wanted_key_sets_and_their_timeouts() {
    let inline = JwtRule {
        jwks: key_set("inline"),
        ..rule("https://ignored/keys", None)
    };
    let discovery = JwtRule {
        issuer: "https://issuer.example".into(),
        ..Default::default()
    };
    let wanted = wanted(&[
        authentication(vec![rule("https://a/keys", Some(1000)), inline]),
        authentication(vec![rule("https://a/keys", Some(7000)), discovery]),
        authentication(vec![rule("https://b/keys", None)]),
    ]);
    let got: Vec<(String, Duration)> = wanted.into_iter().map(|(s, t)| (s.key(), t)).collect();
    assert_eq!(
        got,
        [
            ("https://a/keys".to_string(), Duration::from_secs(7)),
            ("https://b/keys".to_string(), DEFAULT_TIMEOUT),
            (
                "openid:https://issuer.example/.well-known/openid-configuration".to_string(),
                DEFAULT_TIMEOUT
            ),
        ]
    );
}

#[test]
fn failures_are_retried_quickly_then_slower_and_slower() {
    let secs = |n| retry_delay(n).as_secs();
    let got: Vec<u64> = [1, 7, 8, 9, 10, 13, 14, 50, u32::MAX]
        .into_iter()
        .map(secs)
        .collect();
    assert_eq!(got, [1, 1, 60, 120, 240, 1920, 3600, 3600, 3600]);
}

fn source(uri: &str) -> JwksSource {
    JwksSource::Uri(uri.into())
}

/// A key set is sent when first fetched and when its text changes; failures keep what was
/// sent; one no longer wanted is deleted only if it was sent.
#[test]
fn the_schedule_sends_what_changed_and_deletes_what_went() {
    let refresh = Duration::from_secs(1200);
    let timeout = Duration::from_secs(5);
    let now = Instant::now();
    let mut schedule = Schedule::default();
    let want = |uris: &[&str]| -> BTreeMap<JwksSource, Duration> {
        uris.iter().map(|u| (source(u), timeout)).collect()
    };
    assert!(
        schedule
            .want(want(&["https://a", "https://b"]), now)
            .is_empty()
    );
    assert_eq!(schedule.next_due(), Some(now));
    let due = schedule.due(now);
    assert_eq!(due.len(), 2);
    assert!(schedule.due(now).is_empty(), "in flight");
    assert_eq!(schedule.next_due(), None);

    let sent = schedule.fetched(&source("https://a"), Ok("A1".into()), now, refresh);
    assert_eq!(
        sent,
        Some(Jwks {
            name: "https://a".into(),
            keys: "A1".into()
        })
    );
    assert_eq!(schedule.next_due(), Some(now + refresh));
    // b fails: retried in a second, nothing sent.
    assert_eq!(
        schedule.fetched(&source("https://b"), Err("down".into()), now, refresh),
        None
    );
    assert_eq!(schedule.next_due(), Some(now + Duration::from_secs(1)));

    // A refresh with the same keys sends nothing; new keys are sent.
    let later = now + refresh;
    assert_eq!(schedule.due(later).len(), 2);
    assert_eq!(
        schedule.fetched(&source("https://a"), Ok("A1".into()), later, refresh),
        None
    );
    assert_eq!(
        schedule
            .fetched(&source("https://b"), Ok("B1".into()), later, refresh)
            .map(|j| j.keys),
        Some("B1".to_string())
    );
    // A failed refresh keeps the keys sent: nothing to send or delete.
    let much_later = later + refresh;
    schedule.due(much_later);
    assert_eq!(
        schedule.fetched(
            &source("https://a"),
            Err("down".into()),
            much_later,
            refresh
        ),
        None
    );
    // a goes (it was sent: deleted), c comes and goes before it was fetched (never sent).
    assert_eq!(
        schedule.want(want(&["https://b", "https://c"]), much_later),
        ["https://a"]
    );
    assert!(schedule.want(want(&["https://b"]), much_later).is_empty());
    // A fetch that ends after its source went sends nothing.
    assert_eq!(
        schedule.fetched(&source("https://a"), Ok("A2".into()), much_later, refresh),
        None
    );
}

#[test]
fn link_local_and_cloud_metadata_addresses_are_refused() {
    let cases = [
        ("169.254.169.254", Some("link-local")),
        ("169.254.0.1", Some("link-local")),
        ("224.0.0.251", Some("link-local")),
        ("100.100.100.200", Some("cloud metadata")),
        ("fe80::1", Some("link-local")),
        ("ff02::1", Some("link-local")),
        ("fd00:ec2::254", Some("cloud metadata")),
        ("::ffff:169.254.169.254", Some("link-local")),
        ("127.0.0.1", None),
        ("10.0.0.1", None),
        ("100.100.100.201", None),
        ("2001:db8::1", None),
        ("fd00::1", None),
    ];
    for (ip, want) in cases {
        assert_eq!(blocked(ip.parse().unwrap()), want, "{ip}");
    }
}

/// A key server on loopback: `/jwks` (its current keys), OpenID discovery pointing there,
/// a redirect, a failure and a body that is not a key set.
struct KeyServer {
    address: SocketAddr,
    state: Arc<ServerState>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ServerState {
    keys: Mutex<String>,
    fail: std::sync::atomic::AtomicBool,
    requests: AtomicUsize,
    address: OnceLock<SocketAddr>,
}

impl KeyServer {
    async fn start(keys: &str) -> Self {
        let state = Arc::new(ServerState {
            keys: Mutex::new(keys.into()),
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        state.address.set(address).unwrap();
        let app = Router::new()
            .route("/jwks", route(jwks_handler))
            .route(
                "/.well-known/openid-configuration",
                route(|State(s): State<Arc<ServerState>>| async move {
                    let address = s.address.get().unwrap();
                    format!(r#"{{"issuer":"x","jwks_uri":"http://{address}/jwks"}}"#)
                }),
            )
            .route(
                "/moved",
                route(|| async {
                    let mut headers = HeaderMap::new();
                    headers.insert(header::LOCATION, "/jwks".parse().unwrap());
                    (AxumStatus::FOUND, headers)
                }),
            )
            .route(
                "/broken",
                route(|| async { (AxumStatus::INTERNAL_SERVER_ERROR, "down for maintenance") }),
            )
            .route("/html", route(|| async { "<html>not keys</html>" }))
            .route(
                "/encryption-only",
                route(|| async {
                    r#"{"keys":[{"kty":"EC","alg":"ECDH-ES","use":"enc","crv":"P-256","x":"VXVkC_DOoEmNESjUIriZ9f_SOSC2vV0HcrpWNry3NZE","y":"ZbaMLwmT3xfYe8ZX1ycNQGgFY7mag-nYdzDizVbSzR0"}]}"#
                }),
            )
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KeyServer {
            address,
            state,
            _task: task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn set_keys(&self, keys: &str) {
        *self.state.keys.lock().unwrap() = keys.into();
    }
}

async fn jwks_handler(State(s): State<Arc<ServerState>>) -> (AxumStatus, String) {
    s.requests.fetch_add(1, Ordering::SeqCst);
    if s.fail.load(Ordering::SeqCst) {
        return (AxumStatus::SERVICE_UNAVAILABLE, "unavailable".into());
    }
    (AxumStatus::OK, s.keys.lock().unwrap().clone())
}

#[tokio::test]
async fn fetching_over_http() {
    let server = KeyServer::start(&key_set("1")).await;
    let keys = fetch(&source(&server.url("/jwks"))).await.unwrap();
    assert_eq!(keys, key_set("1"));
    // OpenID discovery names the key set.
    let discovered = fetch(&JwksSource::Discovery(
        server.url("/.well-known/openid-configuration"),
    ))
    .await
    .unwrap();
    assert_eq!(discovered, keys);
    // A redirect is followed.
    assert_eq!(fetch(&source(&server.url("/moved"))).await.unwrap(), keys);
    // Failures say why.
    let broken = fetch(&source(&server.url("/broken"))).await.unwrap_err();
    assert!(
        matches!(&broken, FetchError::Status { status, body } if status.as_u16() == 500 && body.contains("maintenance")),
        "{broken}"
    );
    let html = fetch(&source(&server.url("/html"))).await.unwrap_err();
    assert!(matches!(html, FetchError::NotJwks(_)), "{html}");
    // A key set Envoy would refuse: no key it can verify with.
    let unusable = fetch(&source(&server.url("/encryption-only")))
        .await
        .unwrap_err();
    assert!(unusable.to_string().contains("no usable key"), "{unusable}");
    let no_discovery = fetch(&JwksSource::Discovery(server.url("/jwks")))
        .await
        .unwrap_err();
    assert!(
        matches!(no_discovery, FetchError::Discovery(_)),
        "{no_discovery}"
    );
    let ftp = fetch(&source("ftp://127.0.0.1/keys")).await.unwrap_err();
    assert!(matches!(ftp, FetchError::Uri(_)), "{ftp}");
    // Refused before any traffic: the address is link-local.
    let metadata = fetch(&source("http://169.254.169.254/latest/meta-data"))
        .await
        .unwrap_err();
    assert!(
        metadata
            .to_string()
            .contains("refused to connect to 169.254.169.254 (link-local)"),
        "{metadata}"
    );
    // Nothing listens: a connection error.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let refused = fetch(&source(&format!("http://{closed}/jwks")))
        .await
        .unwrap_err();
    assert!(matches!(refused, FetchError::Connect { .. }), "{refused}");
}

/// Receives the next event, failing loudly after a while.
async fn next_event(events: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("an event in time")
        .expect("the channel open")
}

fn snapshot_with(authentications: Vec<Arc<RequestAuthentication>>) -> Option<Arc<Snapshot>> {
    Some(Arc::new(Snapshot {
        waypoint_authentications: authentications.into(),
        ..Default::default()
    }))
}

/// The task: a new key set is fetched at once and sent; refreshed keys that changed are sent
/// again; a failed refresh sends nothing and is counted; a key set no longer wanted is deleted.
#[tokio::test]
async fn the_fetcher_follows_snapshots() {
    let server = KeyServer::start(&key_set("v1")).await;
    let uri = server.url("/jwks");
    let (publish, snapshots) = watch::channel(None);
    let (tx, mut events) = mpsc::channel(16);
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let config = JwksConfig {
        refresh: Duration::from_millis(200),
    };
    let task = tokio::spawn(follow(snapshots, tx, config, metrics.clone(), stop.clone()));

    publish.send_replace(snapshot_with(vec![authentication(vec![rule(&uri, None)])]));
    let Event::Apply(Object::Jwks(first)) = next_event(&mut events).await else {
        panic!("a key set")
    };
    assert_eq!(first.name, uri);
    assert_eq!(first.keys, key_set("v1"));

    // Rotated keys arrive with a refresh.
    server.set_keys(&key_set("v2"));
    let Event::Apply(Object::Jwks(rotated)) = next_event(&mut events).await else {
        panic!("a key set")
    };
    assert_eq!(rotated.keys, key_set("v2"));
    let fetched = server.state.requests.load(Ordering::SeqCst);
    assert!(fetched >= 2, "{fetched}");

    // The server fails: refreshes go on, counted, and nothing is sent.
    server.state.fail.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.jwks_fetch_fail.get() == 0 {
        assert!(Instant::now() < deadline, "no failed fetch counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(events.try_recv().is_err(), "nothing sent for a failure");
    assert!(metrics.jwks_fetch_success.get() >= 2);

    // No longer wanted: deleted from the index.
    publish.send_replace(snapshot_with(Vec::new()));
    match next_event(&mut events).await {
        Event::Delete(reference) => {
            assert_eq!(reference, ObjectRef::new(Kind::Jwks, "", uri.as_str()));
        }
        other => panic!("a delete: {other:?}"),
    }
    stop.cancel();
    task.await.unwrap();
}
