//! Writes the seed corpus (`fuzz/corpus/<target>/`) and, where missing, the test material in
//! `fuzz/fixtures/` that the targets run against (docs/fuzzing.md). Run by `tools/fuzz --seeds`;
//! its output is committed, so fuzzing a fresh clone starts from the same seeds.
//!
//! Seeds are small, valid inputs of each decoder, so the fuzzer starts deep: ztunnel's and a
//! waypoint's delta requests (initial, ACK, NACK, on-demand, a reconnect with known versions),
//! istiod's debug requests, CSRs of each key type, tokens of each issuer, certificate chains
//! under the test root, and every object of examples/ and tests/fixtures/, one per file.

// Built with the targets (and their coverage flags), so linked with libFuzzer for the coverage
// callbacks; libFuzzer's `main` is not linked, as this binary has its own.
extern crate libfuzzer_sys;

/// What libfuzzer-sys's `LLVMFuzzerTestOneInput` calls, defined by `fuzz_target!` in a target;
/// this binary is none, and is never called with an input.
#[allow(improper_ctypes_definitions)]
#[unsafe(no_mangle)]
pub extern "C" fn rust_fuzzer_test_input(_input: &[u8]) -> i32 {
    0
}

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambientd::ca::token::{Claims, KubernetesClaim, LocalKey, Ref, Subject, local_claims};
use ambientd::pb::google::protobuf::{Struct, Value as PbValue, value::Kind as PbKind};
use ambientd::pb::xds::{DeltaDiscoveryRequest, DiscoveryRequest, Node, Status};
use ambientd_fuzz::ca::{JWKS_ISSUER, NODE, POD, TRUST_DOMAIN, ZTUNNEL};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use prost::Message;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde_json::{Value, json};

const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Documents larger than this are left out: libFuzzer's default `-max_len` follows the
/// largest seed, and every input's cost grows with it.
const MAX_SEED: usize = 6 * 1024;

fn main() {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let repo = fuzz.join("..");
    let fixtures = ambientd_fuzz::fixtures();
    make_fixtures(&fixtures);
    let corpus = fuzz.join("corpus");
    let mut seeds = Seeds::default();
    delta_requests(&mut seeds);
    sotw_requests(&mut seeds);
    csrs(&mut seeds);
    tokens(&mut seeds, &fixtures);
    chains(&mut seeds, &fixtures);
    objects(&mut seeds, &repo);
    seeds.write(&corpus);
}

#[derive(Default)]
struct Seeds(Vec<(&'static str, String, Vec<u8>)>);

impl Seeds {
    fn add(&mut self, target: &'static str, name: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.0.push((target, name.into(), bytes.into()));
    }

    /// Replaces each target's directory with its seeds (`seed-<name>`; other files, such as
    /// regression inputs named `crash-*`, stay).
    fn write(&self, corpus: &Path) {
        let targets: BTreeSet<&str> = self.0.iter().map(|(t, _, _)| *t).collect();
        for target in &targets {
            let dir = corpus.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                if entry.file_name().to_string_lossy().starts_with("seed-") {
                    std::fs::remove_file(entry.path()).unwrap();
                }
            }
        }
        for (target, name, bytes) in &self.0 {
            std::fs::write(corpus.join(target).join(format!("seed-{name}")), bytes).unwrap();
        }
        for target in targets {
            let n = self.0.iter().filter(|(t, _, _)| *t == target).count();
            println!("{target}: {n} seeds");
        }
    }
}

/// The CA root, the local token key and a JWKS issuer's key: generated once, then committed.
fn make_fixtures(dir: &Path) {
    let now = time::OffsetDateTime::now_utc();
    ambientd::ca::roots::load_or_create_self_signed(&dir.join("ca"), TRUST_DOMAIN, now).unwrap();
    LocalKey::load_or_create(dir).unwrap();
    let key_path = dir.join("jwks-key.pem");
    if !key_path.exists() {
        let key = KeyPair::generate().unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        // An uncompressed P-256 point: 0x04, x, y.
        let point = key.public_key_raw();
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "kid": "fuzz-jwks-1",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }]});
        std::fs::write(
            dir.join("jwks.json"),
            serde_json::to_string_pretty(&jwks).unwrap(),
        )
        .unwrap();
    }
}

fn text(s: &str) -> PbValue {
    PbValue {
        kind: Some(PbKind::StringValue(s.to_string())),
    }
}

fn ztunnel_node() -> Node {
    Node {
        id: "ztunnel~10.244.1.2~ztunnel-x7k2p.istio-system~istio-system.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: [
                ("NAME", "ztunnel-x7k2p"),
                ("NAMESPACE", ZTUNNEL.0),
                ("SERVICE_ACCOUNT", ZTUNNEL.1),
                ("NODE_NAME", NODE),
                ("CLUSTER_ID", "Kubernetes"),
                ("ISTIO_VERSION", "1.28.0"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), text(v)))
            .collect(),
        }),
        ..Default::default()
    }
}

fn waypoint_node() -> Node {
    let labels = Struct {
        fields: [(
            "gateway.networking.k8s.io/gateway-name".to_string(),
            text("waypoint"),
        )]
        .into(),
    };
    Node {
        id: "waypoint~10.244.1.9~waypoint-6f7d8c9b5c-q2w3e.bookinfo~bookinfo.svc.cluster.local"
            .into(),
        metadata: Some(Struct {
            fields: [
                ("NAME".to_string(), text("waypoint-6f7d8c9b5c-q2w3e")),
                ("NAMESPACE".to_string(), text("bookinfo")),
                ("INSTANCE_IPS".to_string(), text("10.244.1.9")),
                (
                    "LABELS".to_string(),
                    PbValue {
                        kind: Some(PbKind::StructValue(labels)),
                    },
                ),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

fn grpc(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        out.push(0);
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
    }
    out
}

fn delta(
    node: Option<Node>,
    type_url: &str,
    f: impl FnOnce(&mut DeltaDiscoveryRequest),
) -> Vec<u8> {
    let mut request = DeltaDiscoveryRequest {
        node,
        type_url: type_url.to_string(),
        ..Default::default()
    };
    f(&mut request);
    request.encode_to_vec()
}

fn delta_requests(seeds: &mut Seeds) {
    let t = "xds_delta_request";
    let z = || Some(ztunnel_node());
    // ztunnel: wildcard Address and Authorization, then their ACKs.
    seeds.add(
        t,
        "ztunnel-wildcard",
        grpc(&[
            delta(z(), ADDRESS, |_| {}),
            delta(None, AUTHORIZATION, |_| {}),
            delta(None, ADDRESS, |r| r.response_nonce = "1".into()),
            delta(None, AUTHORIZATION, |r| r.response_nonce = "2".into()),
        ]),
    );
    // On demand (XDS_ON_DEMAND): no wildcard, then names subscribed and unsubscribed.
    seeds.add(
        t,
        "ztunnel-on-demand",
        grpc(&[
            delta(z(), ADDRESS, |r| {
                r.resource_names_subscribe = vec!["*".into()]
            }),
            delta(None, ADDRESS, |r| {
                r.response_nonce = "1".into();
                r.resource_names_subscribe = vec![
                    "bookinfo/productpage.bookinfo.svc.cluster.local".into(),
                    "/10.96.0.20".into(),
                    "Kubernetes//Pod/bookinfo/productpage-v1-6b746f74dc-9stvs".into(),
                ];
            }),
            delta(None, ADDRESS, |r| {
                r.resource_names_unsubscribe = vec!["/10.96.0.20".into()];
            }),
        ]),
    );
    seeds.add(
        t,
        "ztunnel-explicit-names",
        grpc(&[delta(z(), ADDRESS, |r| {
            r.resource_names_subscribe = vec!["bookinfo/reviews.bookinfo.svc.cluster.local".into()];
        })]),
    );
    // A reconnect: what the proxy holds, some current, some stale, one unknown.
    seeds.add(
        t,
        "ztunnel-reconnect",
        grpc(&[delta(z(), ADDRESS, |r| {
            r.initial_resource_versions = [
                (
                    "bookinfo/productpage.bookinfo.svc.cluster.local",
                    "0123456789abcdef",
                ),
                (
                    "Kubernetes//Pod/bookinfo/productpage-v1-6b746f74dc-9stvs",
                    "fedcba9876543210",
                ),
                ("bookinfo/gone.bookinfo.svc.cluster.local", "1"),
                ("", ""),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        })]),
    );
    seeds.add(
        t,
        "ztunnel-nack",
        grpc(&[
            delta(z(), AUTHORIZATION, |_| {}),
            delta(None, AUTHORIZATION, |r| {
                r.response_nonce = "1".into();
                r.error_detail = Some(Status {
                    code: 3,
                    message: "rejected: unknown field".into(),
                    details: vec![],
                });
            }),
            delta(None, AUTHORIZATION, |r| r.response_nonce = "7".into()),
        ]),
    );
    seeds.add(
        t,
        "unknown-type",
        grpc(&[delta(z(), "type.googleapis.com/x.Unknown", |_| {})]),
    );
    seeds.add(t, "no-node", grpc(&[delta(None, ADDRESS, |_| {})]));
    // A waypoint's Envoy: listeners and clusters, then the assignments its clusters name.
    let w = || Some(waypoint_node());
    seeds.add(
        t,
        "waypoint",
        grpc(&[
            delta(w(), CLUSTER, |_| {}),
            delta(None, LISTENER, |_| {}),
            delta(None, CLUSTER, |r| r.response_nonce = "1".into()),
            delta(None, ENDPOINT, |r| {
                r.resource_names_subscribe =
                    vec!["outbound|9080||productpage.bookinfo.svc.cluster.local".into()];
            }),
            delta(None, LISTENER, |r| r.response_nonce = "2".into()),
        ]),
    );
    seeds.add(
        t,
        "waypoint-reconnect",
        grpc(&[delta(w(), LISTENER, |r| {
            r.initial_resource_versions = [("main_internal".to_string(), "1".to_string())].into();
        })]),
    );
    // Framing: a compressed message, a length past the limit, a truncated message.
    seeds.add(t, "compressed", vec![1, 0, 0, 0, 2, 0x12, 0]);
    seeds.add(t, "too-long", vec![0, 0xff, 0xff, 0xff, 0xff]);
    let mut cut = grpc(&[delta(z(), ADDRESS, |_| {})]);
    cut.truncate(cut.len() - 3);
    seeds.add(t, "truncated", cut);
}

fn sotw(type_url: &str, names: &[&str], nonce: &str) -> Vec<u8> {
    DiscoveryRequest {
        node: Some(Node {
            id: "istioctl".into(),
            ..Default::default()
        }),
        type_url: type_url.to_string(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn sotw_requests(seeds: &mut Seeds) {
    let t = "xds_sotw_request";
    let proxy = "ztunnel-x7k2p.istio-system";
    seeds.add(
        t,
        "syncz",
        grpc(&[
            sotw("istio.io/debug/syncz", &[], ""),
            sotw("istio.io/debug/syncz", &[], "1"),
        ]),
    );
    seeds.add(
        t,
        "config-dump",
        grpc(&[sotw("istio.io/debug/config_dump", &[proxy], "")]),
    );
    seeds.add(
        t,
        "debug-endpoints",
        grpc(&[sotw(
            "istio.io/debug",
            &[
                "syncz",
                "adsz",
                "connections",
                &format!("config_dump?proxyID={proxy}"),
            ],
            "",
        )]),
    );
    seeds.add(
        t,
        "debug-not-found",
        grpc(&[sotw("istio.io/debug", &["nothing"], "")]),
    );
    seeds.add(t, "not-debug", grpc(&[sotw(ADDRESS, &[], "")]));
}

/// A CSR as ztunnel sends it (an empty subject, one URI SAN), or with a common name.
fn csr(key: &KeyPair, cn: Option<&str>, uri: Option<&str>) -> (String, Vec<u8>) {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if let Some(cn) = cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    if let Some(uri) = uri {
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
    }
    let request = params.serialize_request(key).unwrap();
    (request.pem().unwrap(), request.der().to_vec())
}

fn csrs(seeds: &mut Seeds) {
    let id = format!("spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}", POD.0, POD.2);
    let cases = [
        (
            "p256-ztunnel",
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            None,
            Some(id.as_str()),
        ),
        (
            "p384-cn",
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            Some("productpage"),
            None,
        ),
        (
            "ed25519",
            KeyPair::generate_for(&rcgen::PKCS_ED25519),
            None,
            Some("spiffe://other.domain/ns/x/sa/y"),
        ),
    ];
    for (name, key, cn, uri) in cases {
        let (pem, der) = csr(&key.unwrap(), cn, uri);
        seeds.add("csr_pem", name, pem.clone());
        seeds.add("csr_der", name, der.clone());
        if name == "p256-ztunnel" {
            seeds.add(
                "csr_pem",
                "new-certificate-request",
                pem.replace("CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST"),
            );
            seeds.add("csr_pem", "leading-space", format!("\n  {pem}"));
            seeds.add(
                "csr_pem",
                "wrong-tag",
                pem.replace("CERTIFICATE REQUEST", "CERTIFICATE"),
            );
            // A flipped byte in the signature: parses, does not verify.
            let mut bad = der.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            seeds.add("csr_der", "bad-signature", bad);
        }
    }
}

fn tokens(seeds: &mut Seeds, fixtures: &Path) {
    let t = "jwt";
    let local = LocalKey::load_or_create(fixtures).unwrap();
    // Valid until 2100, so that the seeds stay valid tokens.
    let now = 1_780_000_000;
    let ttl = Duration::from_secs(4_102_444_800 - now);
    let aud = ["istio-ca".to_string()];
    let ztunnel = Subject {
        namespace: ZTUNNEL.0.into(),
        service_account: ZTUNNEL.1.into(),
        pod: None,
        node: Some(NODE.into()),
    };
    let pod = Subject {
        namespace: POD.0.into(),
        service_account: POD.2.into(),
        pod: Some(Ref {
            name: POD.1.into(),
            uid: String::new(),
        }),
        node: None,
    };
    let mint = |claims: &Claims| format!("Bearer {}", local.mint(claims).unwrap());
    seeds.add(
        t,
        "local-ztunnel",
        mint(&local_claims(&ztunnel, &aud, now, ttl)),
    );
    seeds.add(t, "local-pod", mint(&local_claims(&pod, &aud, now, ttl)));
    seeds.add(
        t,
        "expired",
        mint(&local_claims(
            &ztunnel,
            &aud,
            1_600_000_000,
            Duration::from_secs(3600),
        )),
    );
    seeds.add(
        t,
        "other-audience",
        mint(&local_claims(&ztunnel, &["x".into()], now, ttl)),
    );
    seeds.add(
        t,
        "lowercase-bearer",
        mint(&local_claims(&ztunnel, &aud, now, ttl)).replacen("Bearer", "bearer", 1),
    );
    // A cluster's projected token, from the JWKS issuer.
    let key = std::fs::read_to_string(fixtures.join("jwks-key.pem")).unwrap();
    let key = KeyPair::from_pem(&key).unwrap();
    let encoding = jsonwebtoken::EncodingKey::from_ec_der(&key.serialize_der());
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("fuzz-jwks-1".into());
    let claims = Claims {
        iss: JWKS_ISSUER.into(),
        sub: format!("system:serviceaccount:{}:{}", POD.0, POD.2),
        aud: aud.to_vec(),
        exp: now + ttl.as_secs(),
        iat: now,
        nbf: now,
        kubernetes: KubernetesClaim {
            namespace: POD.0.into(),
            serviceaccount: Ref {
                name: POD.2.into(),
                uid: "6b1a".into(),
            },
            pod: Some(Ref {
                name: POD.1.into(),
                uid: "9f3c".into(),
            }),
            node: Some(Ref {
                name: NODE.into(),
                uid: String::new(),
            }),
        },
    };
    let token = jsonwebtoken::encode(&header, &claims, &encoding).unwrap();
    seeds.add(t, "jwks-pod", format!("Bearer {token}"));
    // HS256 with the issuer's public key as the secret: refused (no such key).
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"secret").unwrap(),
    )
    .unwrap();
    seeds.add(t, "hs256", format!("Bearer {hs}"));
    seeds.add(t, "not-bearer", "Basic dXNlcjpwYXNz");
}

/// A chain as the handshake carries it: each certificate after a 3-byte length.
fn framed(certs: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for cert in certs {
        out.extend_from_slice(&(cert.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(cert);
    }
    out
}

fn chains(seeds: &mut Seeds, fixtures: &Path) {
    let t = "peer_certificate";
    let now = time::OffsetDateTime::now_utc();
    let loaded =
        ambientd::ca::roots::load_or_create_self_signed(&fixtures.join("ca"), TRUST_DOMAIN, now)
            .unwrap();
    let root = loaded.signer.roots()[0].to_vec();
    // Valid for as long as the test root.
    let ttl = Duration::from_secs(20 * 365 * 24 * 3600);
    let sign = |sans: Vec<SanType>| {
        let key = KeyPair::generate().unwrap();
        loaded.signer.sign_server(&key, sans, ttl, now).unwrap()[0].to_vec()
    };
    let uri = |s: &str| SanType::URI(s.try_into().unwrap());
    let ztunnel = sign(vec![uri(&format!(
        "spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}",
        ZTUNNEL.0, ZTUNNEL.1
    ))]);
    seeds.add(t, "ztunnel-with-root", framed(&[&ztunnel, &root]));
    seeds.add(t, "ztunnel-alone", framed(&[&ztunnel]));
    seeds.add(t, "ztunnel-raw-der", ztunnel.clone());
    let dns = sign(vec![SanType::DnsName(
        "istiod.istio-system.svc".try_into().unwrap(),
    )]);
    seeds.add(t, "no-spiffe-san", framed(&[&dns, &root]));
    let two = sign(vec![
        uri("https://example.com/x"),
        uri(&format!(
            "spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}",
            POD.0, POD.2
        )),
    ]);
    seeds.add(t, "second-uri-is-spiffe", framed(&[&two]));
    // A self-signed certificate: not under the roots.
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![uri("spiffe://cluster.local/ns/istio-system/sa/ztunnel")];
    let stranger = params.self_signed(&key).unwrap().der().to_vec();
    seeds.add(t, "self-signed", framed(&[&stranger]));
    seeds.add(t, "root-as-leaf", framed(&[&root]));
}

/// Every object of the examples and the conformance fixtures, one per seed: YAML as written,
/// JSON, and the watcher's form (the kind's index, then the JSON).
fn objects(seeds: &mut Seeds, repo: &Path) {
    let mut documents: Vec<(String, Value)> = Vec::new();
    for dir in ["examples/bookinfo", "tests/fixtures/waypoint"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo.join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let stem = file.file_stem().unwrap().to_string_lossy().to_string();
            for (i, doc) in ambientd::kube::objects::parse_yaml(&text)
                .unwrap()
                .into_iter()
                .enumerate()
            {
                documents.push((format!("{stem}-{i}"), doc));
            }
            // The file as it is, several documents in one.
            if text.len() <= MAX_SEED {
                seeds.add("manifest_yaml", format!("file-{stem}"), text);
            }
        }
    }
    for fixture in ["conformance.yaml", "derived.yaml"] {
        let text = std::fs::read_to_string(repo.join("tests/fixtures").join(fixture)).unwrap();
        let cases = ambientd::kube::objects::parse_yaml(&text).unwrap();
        for case in cases
            .iter()
            .flat_map(|c| c.as_array().cloned().unwrap_or_default())
        {
            let name = case["name"].as_str().unwrap_or("case").to_string();
            let steps = case["steps"].as_array().cloned().unwrap_or_default();
            let applied = steps
                .iter()
                .flat_map(|s| s["apply"].as_array().cloned().unwrap_or_default());
            let inputs = case["input"].as_array().cloned().unwrap_or_default();
            for (i, object) in inputs.into_iter().chain(applied).enumerate() {
                documents.push((format!("{name}-{i}"), object));
            }
        }
    }
    let kinds = ambientd::kube::cluster::watched_kinds();
    let mut seen = BTreeSet::new();
    let mut per_kind = std::collections::BTreeMap::<String, usize>::new();
    for (name, doc) in documents {
        let json = serde_json::to_string(&doc).unwrap();
        if json.len() > MAX_SEED || !seen.insert(json.clone()) {
            continue;
        }
        // At most 12 objects of a kind: the corpus stays small, and the fuzzer finds the rest.
        let kind = doc["kind"].as_str().unwrap_or("").to_string();
        let count = per_kind.entry(kind.clone()).or_default();
        *count += 1;
        if *count > 12 {
            continue;
        }
        seeds.add(
            "manifest_yaml",
            name.clone(),
            serde_saphyr::to_string(&doc).unwrap(),
        );
        seeds.add(
            "manifest_json",
            name.clone(),
            serde_json::to_string_pretty(&doc).unwrap(),
        );
        let api_version = doc["apiVersion"].as_str().unwrap_or("");
        if let Some(i) = kinds.iter().position(|k| {
            k.resource.kind == kind && api_version.starts_with(k.resource.group.as_str())
        }) {
            let mut watched = vec![i as u8];
            watched.extend_from_slice(json.as_bytes());
            seeds.add("kube_object", name, watched);
        }
    }
    // A list, as `kubectl get -o json` writes it.
    seeds.add("manifest_json", "list", serde_json::to_string_pretty(&json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo", "labels": {"istio.io/dataplane-mode": "ambient"}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "demo"},
             "spec": {"clusterIP": "10.96.0.7", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}}
        ]})).unwrap());
    // managedFields, which the watcher skips.
    let mut with_managed = vec![8u8];
    with_managed.extend_from_slice(
        json!({"metadata": {"name": "p", "namespace": "demo",
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"nodeName": "n1"}, "status": {"podIP": "10.0.0.1", "phase": "Running"}})
        .to_string()
        .as_bytes(),
    );
    seeds.add("kube_object", "pod-managed-fields", with_managed);
}
