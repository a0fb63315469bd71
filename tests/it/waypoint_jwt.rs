//! L7 authorization and RequestAuthentication through a real Envoy 1.40 as waypoint
//! (istio/istio `pilot/pkg/model/policyattachment.go` and `pilot/pkg/security/`, issue 24): a client playing the calling ztunnel sends HTTP
//! requests over HBONE to a Service bound to the waypoint.
//!
//! - A RequestAuthentication with a `jwksUri` served by a key server on loopback (ambientd
//!   fetches it and inlines the keys) and an ALLOW on `requestPrincipals` with a claim
//!   condition: a valid token passes, a claim mismatch gets 403, an expired token, one of
//!   another issuer or one signed by an unknown key 401, and no token 403.
//! - A key set that cannot be fetched fails closed: every token gets 401.
//! - An ALLOW on `GET /public/*`: GET passes, POST gets 403; a DENY on a header wins over the
//!   ALLOW; Envoy's per-rule stats name the policies that decided. Changing a policy changes
//!   the next request's outcome.
//!
//! The mesh is on loopback: the Service's VIP is 127.0.30.21, its pod 127.0.20.21 (a plain
//! backend, not in the mesh).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use crate::support::apps::{HttpApp, HttpResponse, try_http_request};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::HboneConnection;
use crate::support::identity::{WorkloadCert, start_with_ca};
use crate::support::sds::SdsServer;

const WAYPOINT_IP: &str = "127.0.20.1";
const WEB: &str = "127.0.30.21:8080";
const ISSUER: &str = "https://issuer.test";

/// The waypoint (Gateway, its Service and pod) and the Service `web` bound to it, with one
/// plain pod.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 127.0.30.1}, {type: Hostname, value: waypoint.demo.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo}
spec:
  clusterIP: 127.0.30.1
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: status-port, port: 15021, appProtocol: tcp}, {name: mesh, port: 15008, appProtocol: hbone}]
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-7d9c4b-x2x7q
  namespace: demo
  labels: {gateway.networking.k8s.io/gateway-name: waypoint}
spec: {serviceAccountName: waypoint, nodeName: node-a}
status: {phase: Running, podIP: 127.0.20.1, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
  labels: {istio.io/use-waypoint: waypoint}
spec:
  clusterIP: 127.0.30.21
  selector: {app: web}
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: demo, labels: {app: web}}
spec: {serviceAccountName: web, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.21, conditions: [{type: Ready, status: "True"}]}
"#;

/// A signing key and its public JWK (ES256, with a key id).
struct SigningKey {
    encoding: EncodingKey,
    jwk: Jwk,
    kid: String,
}

impl SigningKey {
    fn generate(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate().expect("a P-256 key");
        let encoding = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256).expect("its JWK");
        jwk.common.key_id = Some(kid.into());
        SigningKey {
            encoding,
            jwk,
            kid: kid.into(),
        }
    }

    fn jwks(&self) -> String {
        serde_json::to_string(&JwkSet {
            keys: vec![self.jwk.clone()],
        })
        .expect("JWKS JSON")
    }

    /// A token for `sub` from `iss` in `groups`, expiring `ttl` seconds from now (negative:
    /// already expired).
    fn token(&self, iss: &str, sub: &str, groups: &[&str], ttl: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs() as i64;
        let claims = json!({
            "iss": iss,
            "sub": sub,
            "aud": "web",
            "groups": groups,
            "iat": now - 120,
            "exp": now + ttl,
        });
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.encoding).expect("sign")
    }
}

/// A key server on loopback: `/jwks` serves the current key set, `/encryption-only` a set with
/// no key to verify with, and `/broken` always fails.
struct KeyServer {
    address: SocketAddr,
    keys: Arc<Mutex<String>>,
    _task: tokio::task::JoinHandle<()>,
}

impl KeyServer {
    async fn start(keys: String) -> Self {
        let keys = Arc::new(Mutex::new(keys));
        let app = Router::new()
            .route(
                "/jwks",
                get(|State(keys): State<Arc<Mutex<String>>>| async move {
                    keys.lock().expect("keys").clone()
                }),
            )
            .route(
                "/encryption-only",
                get(|| async {
                    r#"{"keys":[{"kty":"EC","alg":"ECDH-ES","use":"enc","crv":"P-256","x":"VXVkC_DOoEmNESjUIriZ9f_SOSC2vV0HcrpWNry3NZE","y":"ZbaMLwmT3xfYe8ZX1ycNQGgFY7mag-nYdzDizVbSzR0"}]}"#
                }),
            )
            .route(
                "/broken",
                get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "down") }),
            )
            .with_state(keys.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the key server");
        let address = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KeyServer {
            address,
            keys,
            _task: task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

fn request_authentication(jwks_uri: &str) -> String {
    format!(
        r#"
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: demo}}
spec:
  targetRefs: [{{kind: Service, group: "", name: web}}]
  jwtRules: [{{issuer: "{ISSUER}", jwksUri: "{jwks_uri}"}}]
"#
    )
}

/// ALLOW only alice of the test issuer, and only in the admins group.
const REQUIRE_JWT: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: require-jwt, namespace: demo}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: ALLOW
  rules:
  - from: [{source: {requestPrincipals: ["https://issuer.test/alice"]}}]
    when: [{key: "request.auth.claims[groups]", values: [admins]}]
"#;

fn allow_public(methods: &str) -> String {
    format!(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: public, namespace: demo}}
spec:
  targetRefs: [{{kind: Service, group: "", name: web}}]
  action: ALLOW
  rules: [{{to: [{{operation: {{methods: {methods}, paths: ["/public/*"]}}}}]}}]
"#
    )
}

const DENY_HEADER: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-blocked, namespace: demo}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{when: [{key: "request.headers[x-block]", values: ["true"]}]}]
"#;

/// One request through the waypoint to `web`: the response, or why none came.
async fn request(
    client: &WorkloadCert,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    let connection = HboneConnection::open(SocketAddr::new(ip("127.0.0.1"), 15008), client)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut tunnel = connection
        .connect(WEB)
        .await
        .map_err(|e| format!("CONNECT {WEB}: {e:?}"))?;
    tokio::time::timeout(
        Duration::from_secs(5),
        try_http_request(&mut tunnel, method, "web", path, headers),
    )
    .await
    .map_err(|_| "no answer".to_string())?
    .map_err(|e| format!("{method} {path}: {e}"))
}

/// The status of a request (0 when none came).
async fn status(client: &WorkloadCert, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    match request(client, method, path, headers).await {
        Ok(response) => response.status,
        Err(e) => {
            eprintln!("{e}");
            0
        }
    }
}

/// A GET with a bearer token.
async fn with_token(client: &WorkloadCert, path: &str, token: &str) -> u16 {
    let bearer = format!("Bearer {token}");
    status(client, "GET", path, &[("authorization", &bearer)]).await
}

/// Repeats `attempt` until it gives `want`; fails loudly on timeout with the last result.
async fn until<F, Fut>(what: &str, want: u16, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = attempt().await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: wanted {want}, last {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The counters of Envoy's stats whose names contain every one of `parts`.
async fn counters(envoy: &Envoy, parts: &[&str]) -> Vec<(String, u64)> {
    envoy
        .stats()
        .await
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            if !parts.iter().all(|p| name.contains(p)) {
                return None;
            }
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

async fn no_rejects(envoy: &Envoy) {
    assert_eq!(
        envoy.stat("listener_manager.lds.update_rejected").await,
        Some(0),
        "{}",
        envoy.log_tail(40)
    );
}

#[tokio::test]
async fn jwt_and_l7_policies_through_a_real_envoy() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let key = SigningKey::generate("key-a");
    // Another key under the same key id: its tokens look right and do not verify.
    let stranger = SigningKey::generate("key-a");
    let keys = KeyServer::start(key.jwks()).await;

    let manifests = Manifests::new(&[("mesh.yaml", MESH)]);
    let mesh = start_with_ca(manifests.root()).await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let sds = SdsServer::start(&waypoint).await;
    let _web = HttpApp::start(SocketAddr::new(ip("127.0.20.21"), 8080), "web-1").await;

    let mut node = WaypointNode::new("demo", "waypoint");
    node.ip = WAYPOINT_IP.into();
    let params = EnvoyParams::new(mesh.running.xds_address, sds.address, node);
    let envoy = Envoy::start(&binary, &params).await;
    envoy.wait_live().await;
    envoy
        .wait_until("the web chain", |dump| {
            envoy::active_clusters(dump)
                .iter()
                .any(|c| c == "inbound-vip|8080|http|web.demo.svc.cluster.local")
        })
        .await;
    until("the web Service", 200, || status(&client, "GET", "/", &[])).await;

    // --- RequestAuthentication with a fetched key set, and an ALLOW on the request principal
    // and a claim.
    // The policy first (then nothing passes), so that every outcome below is its.
    manifests.write("require-jwt.yaml", REQUIRE_JWT);
    until(
        "the policy to refuse a request without a token",
        403,
        || status(&client, "GET", "/a", &[]),
    )
    .await;
    manifests.write("jwt.yaml", &request_authentication(&keys.url("/jwks")));
    let alice = key.token(ISSUER, "alice", &["admins"], 600);
    until("a valid token to pass", 200, || {
        with_token(&client, "/a", &alice)
    })
    .await;
    let response = request(
        &client,
        "GET",
        "/a",
        &[("authorization", &format!("Bearer {alice}"))],
    )
    .await
    .unwrap();
    assert_eq!(response.body, "backend web-1 path /a");
    // The claim condition: alice outside admins.
    let user = key.token(ISSUER, "alice", &["users"], 600);
    assert_eq!(with_token(&client, "/a", &user).await, 403);
    // Another principal of the issuer.
    let bob = key.token(ISSUER, "bob", &["admins"], 600);
    assert_eq!(with_token(&client, "/a", &bob).await, 403);
    // Invalid tokens are refused by jwt_authn before RBAC: expired, another issuer, an unknown
    // key, garbage.
    let expired = key.token(ISSUER, "alice", &["admins"], -600);
    assert_eq!(with_token(&client, "/a", &expired).await, 401);
    let other_issuer = key.token("https://other.test", "alice", &["admins"], 600);
    assert_eq!(with_token(&client, "/a", &other_issuer).await, 401);
    let forged = stranger.token(ISSUER, "alice", &["admins"], 600);
    assert_eq!(with_token(&client, "/a", &forged).await, 401);
    assert_eq!(with_token(&client, "/a", "not.a.token").await, 401);
    // No token: jwt_authn lets it through, and RBAC, which needs a request principal, refuses.
    assert_eq!(status(&client, "GET", "/a", &[]).await, 403);
    let jwt_denied = "http.inbound_0.0.0.0_8080;.jwt_authn.denied";
    assert!(envoy.stat(jwt_denied).await.is_some_and(|n| n >= 4));
    let require_jwt =
        "http.inbound_0.0.0.0_8080;.rbac.policy.ns[demo]-policy[require-jwt]-rule[0].allowed";
    assert!(envoy.stat(require_jwt).await.is_some_and(|n| n >= 1));
    no_rejects(&envoy).await;

    // --- A key set that cannot be fetched fails closed: every token is refused; a request
    // without one still reaches RBAC.
    manifests.remove("require-jwt.yaml");
    manifests.write("jwt.yaml", &request_authentication(&keys.url("/broken")));
    until("the unfetchable keys to refuse a valid token", 401, || {
        with_token(&client, "/b", &alice)
    })
    .await;
    assert_eq!(status(&client, "GET", "/b", &[]).await, 200);
    // The keys come back (a new URI is fetched at once) and so does the token.
    *keys.keys.lock().unwrap() = key.jwks();
    manifests.write(
        "jwt.yaml",
        &request_authentication(&keys.url("/jwks?again")),
    );
    until("the fetched keys again", 200, || {
        with_token(&client, "/b", &alice)
    })
    .await;
    // A fetched key set with no key Envoy can verify with (an encryption key): refused by the
    // fetcher, so tokens fail closed and the listener is never refused.
    manifests.write(
        "jwt.yaml",
        &request_authentication(&keys.url("/encryption-only")),
    );
    until("an unusable key set to refuse a token", 401, || {
        with_token(&client, "/c", &alice)
    })
    .await;
    no_rejects(&envoy).await;
    // An inline key set Envoy cannot read: the RequestAuthentication is refused when read (as
    // Istio's validation refuses it), so nothing checks tokens any more.
    manifests.write(
        "jwt.yaml",
        &request_authentication("unused")
            .replace(r#"jwksUri: "unused""#, r#"jwks: "not a key set""#),
    );
    until("the refused RequestAuthentication gone", 200, || {
        with_token(&client, "/c", "not.a.token")
    })
    .await;
    no_rejects(&envoy).await;
    manifests.remove("jwt.yaml");

    // --- L7 policies: GET /public/* only, and a DENY on a header before it.
    manifests.write("public.yaml", &allow_public("[GET]"));
    until("POST refused by the ALLOW", 403, || {
        status(&client, "POST", "/public/x", &[])
    })
    .await;
    assert_eq!(status(&client, "GET", "/public/x", &[]).await, 200);
    assert_eq!(status(&client, "GET", "/private", &[]).await, 403);
    manifests.write("deny.yaml", DENY_HEADER);
    until("the DENY on a header", 403, || {
        status(&client, "GET", "/public/x", &[("x-block", "true")])
    })
    .await;
    assert_eq!(
        status(&client, "GET", "/public/x", &[("x-block", "false")]).await,
        200
    );
    // Envoy's stats name the rules that decided (per-rule counters of the RBAC filters).
    let rule = |policy: &str, outcome: &str| {
        format!(
            "http.inbound_0.0.0.0_8080;.rbac.policy.ns[demo]-policy[{policy}]-rule[0].{outcome}"
        )
    };
    let allowed = envoy.stat(&rule("public", "allowed")).await.unwrap_or(0);
    let denied = envoy
        .stat(&rule("deny-blocked", "denied"))
        .await
        .unwrap_or(0);
    assert!(
        allowed >= 2 && denied >= 1,
        "{:?}",
        counters(&envoy, &["rbac"]).await
    );
    // A request no ALLOW rule matched is counted by the filter alone.
    assert!(
        envoy
            .stat("http.inbound_0.0.0.0_8080;.rbac.denied")
            .await
            .is_some_and(|n| n >= 3)
    );

    // Changing a policy changes the next request's outcome.
    manifests.write("public.yaml", &allow_public("[GET, POST]"));
    until("POST allowed", 200, || {
        status(&client, "POST", "/public/x", &[])
    })
    .await;
    manifests.remove("deny.yaml");
    until("the DENY gone", 200, || {
        status(&client, "GET", "/public/x", &[("x-block", "true")])
    })
    .await;
    no_rejects(&envoy).await;
    let metrics = crate::support::common::http_get(mesh.running.debug_address, "/metrics")
        .await
        .1;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("pilot_total_xds_rejects") && !l.ends_with(" 0")),
        "{metrics}"
    );
    assert!(metrics.contains("pilot_jwks_resolver_network_fetch_success_total"));
}
