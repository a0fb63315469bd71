//! Decoding tables: every field read, the defaults, Go durations, and errors that name the
//! field. Through `objects::decode`, as both sources read a rule.

use std::time::Duration;

use super::*;
use crate::discovery::model::Object;
use crate::kube::objects::{Decoded, decode as decode_object, parse_yaml};

fn rule(text: &str) -> Result<DestinationRule, String> {
    let mut docs = parse_yaml(text).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    match decode_object(docs.remove(0)).pop().expect("one object") {
        Decoded::Object(Object::DestinationRule(rule)) => Ok(rule),
        Decoded::Invalid(error) => Err(error.reason),
        other => panic!("not a DestinationRule: {other:?}"),
    }
}

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

#[test]
fn every_field_read() {
    let got = rule(
        r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: reviews
  namespace: bookinfo
  creationTimestamp: "2026-01-01T00:00:01Z"
  labels: {istio.io/rev: canary}
spec:
  host: reviews
  exportTo: [".", other]
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN, warmup: {duration: 30s}}
    connectionPool:
      tcp:
        maxConnections: 100
        connectTimeout: 30ms
        tcpKeepalive: {probes: 3, time: 7200s, interval: 75s}
        maxConnectionDuration: 1h
        idleTimeout: 5m
      http:
        http1MaxPendingRequests: 10
        http2MaxRequests: 1000
        maxRequestsPerConnection: 5
        maxRetries: 2
        maxConcurrentStreams: 50
        idleTimeout: 1.5s
        h2UpgradePolicy: UPGRADE
        useClientProtocol: true
    outlierDetection:
      consecutive5xxErrors: 7
      consecutiveGatewayErrors: 0
      interval: 5m
      baseEjectionTime: 15m
      maxEjectionPercent: 50
      minHealthPercent: 20
      splitExternalLocalOriginErrors: true
      consecutiveLocalOriginFailures: 4
    tls:
      mode: SIMPLE
      sni: reviews.example.com
      caCertificates: /etc/certs/ca.pem
      subjectAltNames: [reviews.example.com]
      insecureSkipVerify: false
    portLevelSettings:
    - port: {number: 9080}
      loadBalancer: {simple: RANDOM}
      tls: {mode: ISTIO_MUTUAL}
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy:
      loadBalancer:
        consistentHash: {httpHeaderName: x-user, ringHash: {minimumRingSize: 2048}}
"#,
    )
    .unwrap();
    assert_eq!(got.name, "reviews");
    assert_eq!(got.namespace, "bookinfo");
    assert_eq!(got.revision.as_deref(), Some("canary"));
    assert_eq!(got.creation.as_deref(), Some("2026-01-01T00:00:01Z"));
    assert_eq!(got.host, "reviews");
    assert_eq!(got.export_to, [".", "other"]);
    assert_eq!(got.workload_selector, None);
    let policy = got.traffic_policy.unwrap();
    assert_eq!(
        policy.load_balancer,
        Some(LoadBalancer {
            simple: Some(SimpleLb::RoundRobin),
            consistent_hash: None,
            warmup: Some(Warmup {
                duration: Duration::from_secs(30),
                window_only: false,
            }),
        })
    );
    let pool = policy.connection_pool.unwrap();
    assert_eq!(
        pool.tcp,
        Some(TcpSettings {
            max_connections: 100,
            connect_timeout: Some(Duration::from_millis(30)),
            tcp_keepalive: Some(TcpKeepalive {
                probes: 3,
                time: secs(7200),
                interval: secs(75),
            }),
            max_connection_duration: secs(3600),
            idle_timeout: secs(300),
        })
    );
    assert_eq!(
        pool.http,
        Some(HttpSettings {
            http1_max_pending_requests: 10,
            http2_max_requests: 1000,
            max_requests_per_connection: 5,
            max_retries: 2,
            max_concurrent_streams: 50,
            idle_timeout: Some(Duration::from_millis(1500)),
            h2_upgrade_policy: H2UpgradePolicy::Upgrade,
            use_client_protocol: true,
        })
    );
    assert_eq!(
        policy.outlier_detection,
        Some(OutlierDetection {
            consecutive_5xx_errors: Some(7),
            consecutive_gateway_errors: Some(0),
            interval: secs(300),
            base_ejection_time: secs(900),
            max_ejection_percent: 50,
            min_health_percent: 20,
            split_external_local_origin_errors: true,
            consecutive_local_origin_failures: Some(4),
        })
    );
    assert_eq!(
        policy.tls,
        Some(ClientTls {
            mode: TlsMode::Simple,
            sni: "reviews.example.com".into(),
            ca_certificates: "/etc/certs/ca.pem".into(),
            subject_alt_names: vec!["reviews.example.com".into()],
            ..Default::default()
        })
    );
    assert_eq!(policy.port_level.len(), 1);
    let port = &policy.port_level[0];
    assert_eq!(port.port, 9080);
    assert_eq!(
        port.policy.load_balancer.as_ref().unwrap().simple,
        Some(SimpleLb::Random)
    );
    assert_eq!(port.policy.tls.as_ref().unwrap().mode, TlsMode::IstioMutual);
    assert!(port.policy.port_level.is_empty());
    assert_eq!(got.subsets.len(), 1);
    let subset = &got.subsets[0];
    assert_eq!(subset.name, "v1");
    assert_eq!(subset.labels.get("version"), Some("v1"));
    let hash = subset
        .traffic_policy
        .as_ref()
        .unwrap()
        .load_balancer
        .as_ref()
        .unwrap()
        .consistent_hash
        .clone()
        .unwrap();
    assert_eq!(hash.key, HashKey::Header("x-user".into()));
    assert_eq!(
        hash.algorithm,
        HashAlgorithm::RingHash {
            minimum_ring_size: 2048
        }
    );
}

#[test]
fn every_api_version_and_the_defaults() {
    for version in ["v1", "v1beta1", "v1alpha3"] {
        let got = rule(&format!(
            "apiVersion: networking.istio.io/{version}\nkind: DestinationRule\n\
             metadata: {{name: r}}\nspec: {{host: a.example.com}}\n"
        ))
        .unwrap();
        assert_eq!(
            got,
            DestinationRule {
                name: "r".into(),
                namespace: "default".into(),
                host: "a.example.com".into(),
                ..Default::default()
            }
        );
    }
    // Nulls are missing fields; a selector is kept; an empty policy is a policy.
    let got = rule(
        r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: r, namespace: ns}
spec:
  host: "*.example.com"
  exportTo: null
  workloadSelector: {matchLabels: {app: x}}
  trafficPolicy: {loadBalancer: {simple: null}, tls: {}}
"#,
    )
    .unwrap();
    assert!(got.export_to.is_empty());
    assert_eq!(got.workload_selector.unwrap().get("app"), Some("x"));
    let policy = got.traffic_policy.unwrap();
    assert_eq!(policy.load_balancer, Some(LoadBalancer::default()));
    assert_eq!(policy.tls.unwrap().mode, TlsMode::Disable);
}

#[test]
fn enums_by_number_and_the_hash_keys() {
    let got = rule(
        r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: r}
spec:
  host: h
  trafficPolicy:
    loadBalancer: {simple: 5}
    tls: {mode: 2, clientCertificate: /c.pem, privateKey: /k.pem}
  subsets:
  - name: a
    trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65537}}}}
  - name: b
    trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: c, path: /, ttl: 10s}}}}
  - name: c
    trafficPolicy: {loadBalancer: {consistentHash: {httpQueryParameterName: q, minimumRingSize: 64}}}
"#,
    )
    .unwrap();
    let policy = got.traffic_policy.unwrap();
    assert_eq!(
        policy.load_balancer.unwrap().simple,
        Some(SimpleLb::LeastRequest)
    );
    let tls = policy.tls.unwrap();
    assert_eq!(tls.mode, TlsMode::Mutual);
    assert_eq!(
        (tls.client_certificate.as_str(), tls.private_key.as_str()),
        ("/c.pem", "/k.pem")
    );
    let hash = |i: usize| {
        got.subsets[i]
            .traffic_policy
            .clone()
            .unwrap()
            .load_balancer
            .unwrap()
            .consistent_hash
            .unwrap()
    };
    assert_eq!(
        hash(0),
        ConsistentHash {
            key: HashKey::SourceIp,
            algorithm: HashAlgorithm::Maglev { table_size: 65537 },
        }
    );
    assert_eq!(
        hash(1).key,
        HashKey::Cookie {
            name: "c".into(),
            path: "/".into(),
            ttl: secs(10),
        }
    );
    assert_eq!(
        hash(2),
        ConsistentHash {
            key: HashKey::QueryParameter("q".into()),
            algorithm: HashAlgorithm::Default {
                minimum_ring_size: 64
            },
        }
    );
}

#[test]
fn errors_name_the_field() {
    let bad = |spec: &str| {
        rule(&format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n\
             metadata: {{name: r}}\nspec: {spec}\n"
        ))
        .unwrap_err()
    };
    for (spec, field) in [
        ("{}", "spec.host is empty"),
        (
            "{host: h, trafficPolicy: {loadBalancer: {simple: FASTEST}}}",
            "spec.trafficPolicy.loadBalancer.simple: unknown value \"FASTEST\"",
        ),
        (
            "{host: h, trafficPolicy: {tls: {mode: STRICT}}}",
            "spec.trafficPolicy.tls.mode: unknown value",
        ),
        (
            "{host: h, trafficPolicy: {connectionPool: {tcp: {connectTimeout: 10}}}}",
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
        ),
        (
            "{host: h, trafficPolicy: {connectionPool: {tcp: {connectTimeout: 10 seconds}}}}",
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout: \"10 seconds\" is not a duration",
        ),
        (
            "{host: h, trafficPolicy: {connectionPool: {http: {maxRetries: lots}}}}",
            "spec.trafficPolicy.connectionPool.http.maxRetries",
        ),
        (
            "{host: h, trafficPolicy: {portLevelSettings: [{tls: {mode: SIMPLE}}]}}",
            "spec.trafficPolicy.portLevelSettings[0].port.number is missing",
        ),
        (
            "{host: h, trafficPolicy: {portLevelSettings: [{port: {number: 70000}}]}}",
            "spec.trafficPolicy.portLevelSettings[0].port.number: 70000 is not a port",
        ),
        (
            "{host: h, trafficPolicy: {outlierDetection: {maxEjectionPercent: 150}}}",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent: 150 is not a percentage",
        ),
        (
            "{host: h, subsets: [{labels: {a: b}}]}",
            "spec.subsets[0].name is empty",
        ),
        (
            "{host: h, subsets: [{name: s, trafficPolicy: {connectionPool: {http: {idleTimeout: 1d}}}}]}",
            "spec.subsets[0].trafficPolicy.connectionPool.http.idleTimeout",
        ),
    ] {
        let error = bad(spec);
        assert!(error.contains(field), "{spec}: {error}");
    }
}

#[test]
fn go_durations() {
    let ms = |n: u64| Some(Duration::from_millis(n));
    for (text, want) in [
        ("0", Some(Duration::ZERO)),
        ("0s", Some(Duration::ZERO)),
        ("10s", ms(10_000)),
        ("1.5s", ms(1_500)),
        (".5s", ms(500)),
        ("100ms", ms(100)),
        ("1h30m", ms(5_400_000)),
        ("2m0.25s", ms(120_250)),
        ("250us", Some(Duration::from_micros(250))),
        ("250µs", Some(Duration::from_micros(250))),
        ("7ns", Some(Duration::from_nanos(7))),
        ("+3s", ms(3_000)),
        ("", None),
        ("10", None),
        ("s", None),
        ("1d", None),
        ("-1s", None),
        ("1.2.3s", None),
        ("1 s", None),
    ] {
        assert_eq!(parse_go_duration(text), want, "{text:?}");
    }
}
