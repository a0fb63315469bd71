//! Gateway status against istiod's golden (`tests/fixtures/waypoint/status.yaml`), and table
//! tests of listeners, the Programmed condition, transition times and addresses; the class.

use serde_json::{Value, json};

use super::*;
use crate::kube::objects::parse_yaml;
use crate::kube::waypoints::render::{ListenerInfo, NAME_OVERRIDE_ANNOTATION};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/waypoint/status.yaml"
));
const NOW: &str = "2026-12-01T10:00:00Z";
const LATER: &str = "2026-12-01T11:00:00Z";

fn string_pairs(value: &Value) -> Vec<(String, String)> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The fields of a Gateway object that status reads.
fn gateway_info(object: &Value) -> GatewayInfo {
    let metadata = &object["metadata"];
    let spec = &object["spec"];
    GatewayInfo {
        name: metadata["name"].as_str().unwrap_or_default().into(),
        namespace: metadata["namespace"].as_str().unwrap_or_default().into(),
        generation: metadata["generation"].as_i64().unwrap_or_default(),
        labels: string_pairs(&metadata["labels"]),
        annotations: string_pairs(&metadata["annotations"]),
        class_name: spec["gatewayClassName"].as_str().unwrap_or_default().into(),
        listeners: spec["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| ListenerInfo {
                name: l["name"].as_str().unwrap_or_default().into(),
                port: l["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or_default(),
                protocol: l["protocol"].as_str().unwrap_or_default().into(),
            })
            .collect(),
        ..GatewayInfo::default()
    }
}

#[test]
fn status_fixture() {
    let cases = parse_yaml(FIXTURE).expect("fixture parses");
    let cases = cases[0].as_array().expect("a list of cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let name = case["name"].as_str().unwrap_or_default();
        let service = &case["service"];
        let service = ServiceState {
            exists: service["exists"].as_bool().unwrap_or_default(),
            cluster_ips: service["clusterIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip.as_str().map(String::from))
                .collect(),
            has_instances: service["hasInstances"].as_bool().unwrap_or_default(),
        };
        let domain = case["domain"].as_str().unwrap_or_default();
        let got = gateway_status(&gateway_info(&case["gateway"]), &service, domain, NOW, None);
        assert_eq!(
            got,
            case["status"],
            "{name}:\nwant {}\ngot  {}",
            serde_json::to_string_pretty(&case["status"]).unwrap_or_default(),
            serde_json::to_string_pretty(&got).unwrap_or_default()
        );
    }
}

fn waypoint(listeners: Vec<ListenerInfo>) -> GatewayInfo {
    GatewayInfo {
        name: "waypoint".into(),
        namespace: "default".into(),
        generation: 1,
        class_name: "istio-waypoint".into(),
        listeners,
        ..GatewayInfo::default()
    }
}

fn listener(name: &str, port: u16, protocol: &str) -> ListenerInfo {
    ListenerInfo {
        name: name.into(),
        port,
        protocol: protocol.into(),
    }
}

fn mesh() -> ListenerInfo {
    listener("mesh", 15008, "HBONE")
}

fn ready() -> ServiceState {
    ServiceState {
        exists: true,
        cluster_ips: vec!["10.96.0.10".into()],
        has_instances: true,
    }
}

/// The condition of `kind` in a conditions array, as (status, reason, message).
fn condition<'a>(conditions: &'a Value, kind: &str) -> (&'a str, &'a str, &'a str) {
    let found = conditions
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .unwrap_or(&Value::Null);
    (
        found["status"].as_str().unwrap_or_default(),
        found["reason"].as_str().unwrap_or_default(),
        found["message"].as_str().unwrap_or_default(),
    )
}

#[test]
fn listener_acceptance() {
    const UNEXPECTED: &str = "Expected a single listener on port 15008 with protocol \"HBONE\"";
    // listeners -> (each listener's Accepted reason, the Gateway's Accepted status and reason)
    let cases = [
        (vec![mesh()], vec!["Accepted"], ("True", "Accepted")),
        (
            vec![listener("mesh", 15008, "HTTP")],
            vec!["UnsupportedProtocol"],
            ("True", "Accepted"),
        ),
        (
            vec![listener("mesh", 1234, "HBONE")],
            vec!["UnsupportedProtocol"],
            ("True", "Accepted"),
        ),
        // istiod's deployment test uses protocol ALL: not a protocol it serves at all.
        (
            vec![listener("mesh", 15008, "ALL")],
            vec!["UnsupportedProtocol"],
            ("False", "ListenersNotValid"),
        ),
        (
            vec![mesh(), listener("other", 15009, "UDP")],
            vec!["Accepted", "UnsupportedProtocol"],
            ("True", "ListenersNotValid"),
        ),
        (vec![], vec![], ("True", "Accepted")),
    ];
    for (listeners, want_listeners, (want_status, want_reason)) in cases {
        let gateway = waypoint(listeners.clone());
        let status = gateway_status(&gateway, &ready(), "cluster.local", NOW, None);
        let entries = status["listeners"].as_array().cloned().unwrap_or_default();
        assert_eq!(entries.len(), want_listeners.len(), "{listeners:?}");
        for (entry, want) in entries.iter().zip(&want_listeners) {
            let (status, reason, message) = condition(&entry["conditions"], "Accepted");
            assert_eq!(reason, *want, "{listeners:?}");
            if *want == "UnsupportedProtocol" {
                assert_eq!((status, message), ("False", UNEXPECTED));
            }
            // The rest says nothing is wrong, whatever the protocol.
            assert_eq!(condition(&entry["conditions"], "Programmed").0, "True");
            assert_eq!(condition(&entry["conditions"], "Conflicted").0, "False");
            assert_eq!(entry["attachedRoutes"], 0);
        }
        let (status, reason, _) = condition(&status["conditions"], "Accepted");
        assert_eq!(
            (status, reason),
            (want_status, want_reason),
            "{listeners:?}"
        );
    }
}

#[test]
fn supported_kinds_follow_the_protocol() {
    let gateway = waypoint(vec![
        mesh(),
        listener("http", 80, "HTTP"),
        listener("tcp", 81, "TCP"),
        listener("tls", 82, "TLS"),
    ]);
    let status = gateway_status(&gateway, &ready(), "cluster.local", NOW, None);
    let kinds: Vec<Vec<&str>> = status["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            l["supportedKinds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k["kind"].as_str())
                .collect()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            vec![],
            vec!["HTTPRoute", "GRPCRoute"],
            vec!["TCPRoute"],
            vec!["TLSRoute"]
        ]
    );
}

#[test]
fn programmed() {
    let host = "waypoint.default.svc.cluster.local";
    let cases = [
        (
            "ready",
            ready(),
            vec![mesh()],
            (
                "True",
                "Programmed",
                format!("Resource programmed, assigned to service(s) {host}:15008"),
            ),
        ),
        (
            "missing Service",
            ServiceState::default(),
            vec![mesh()],
            (
                "False",
                "AddressNotUsable",
                format!(
                    "Failed to assign to any requested addresses: hostname \"{host}\" not found"
                ),
            ),
        ),
        (
            "no instances",
            ServiceState {
                has_instances: false,
                ..ready()
            },
            vec![mesh()],
            (
                "False",
                "AddressNotAssigned",
                format!(
                    "Failed to assign to any requested addresses: no instances found for hostname \"{host}\""
                ),
            ),
        ),
        (
            "two ports, sorted as text",
            ready(),
            vec![mesh(), listener("http", 9080, "HTTP")],
            (
                "True",
                "Programmed",
                format!("Resource programmed, assigned to service(s) {host}:15008 and {host}:9080"),
            ),
        ),
        (
            "no listeners",
            ready(),
            vec![],
            ("True", "Programmed", "Resource programmed".to_string()),
        ),
    ];
    for (name, service, listeners, (want_status, want_reason, want_message)) in cases {
        let status = gateway_status(&waypoint(listeners), &service, "cluster.local", NOW, None);
        let got = condition(&status["conditions"], "Programmed");
        assert_eq!(
            got,
            (want_status, want_reason, want_message.as_str()),
            "{name}"
        );
    }
}

#[test]
fn the_hostname_is_the_services() {
    let mut gateway = waypoint(vec![mesh()]);
    gateway
        .annotations
        .push((NAME_OVERRIDE_ANNOTATION.into(), "custom".into()));
    let status = gateway_status(&gateway, &ready(), "cluster.local", NOW, None);
    assert_eq!(
        status["addresses"],
        json!([
            {"type": "IPAddress", "value": "10.96.0.10"},
            {"type": "Hostname", "value": "custom.default.svc.cluster.local"},
        ])
    );
}

#[test]
fn addresses() {
    let dual = ServiceState {
        cluster_ips: vec!["fd00::10".into(), "10.96.0.10".into(), "10.96.0.10".into()],
        ..ready()
    };
    let host = json!({"type": "Hostname", "value": "waypoint.default.svc.cluster.local"});
    let v4 = json!({"type": "IPAddress", "value": "10.96.0.10"});
    let v6 = json!({"type": "IPAddress", "value": "fd00::10"});
    // address-type annotation -> addresses
    let cases = [
        (None, json!([v4, v6, host])),
        (Some("IPAddress"), json!([v4, v6])),
        (Some("Hostname"), json!([host])),
    ];
    for (address_type, want) in cases {
        let mut gateway = waypoint(vec![mesh()]);
        if let Some(kind) = address_type {
            gateway
                .annotations
                .push((ADDRESS_TYPE_ANNOTATION.into(), kind.into()));
        }
        let status = gateway_status(&gateway, &dual, "cluster.local", NOW, None);
        assert_eq!(status["addresses"], want, "{address_type:?}");
    }
}

#[test]
fn addresses_are_never_cleared() {
    let gateway = waypoint(vec![mesh()]);
    let first = gateway_status(&gateway, &ready(), "cluster.local", NOW, None);
    let addresses = first["addresses"].clone();
    assert_eq!(addresses.as_array().map(Vec::len), Some(2));
    for service in [
        ServiceState {
            has_instances: false,
            ..ready()
        },
        ServiceState::default(),
    ] {
        let later = gateway_status(&gateway, &service, "cluster.local", LATER, Some(&first));
        assert_eq!(later["addresses"], addresses, "{service:?}");
        assert_eq!(condition(&later["conditions"], "Programmed").0, "False");
    }
    // Without a previous status there is nothing to keep.
    let none = gateway_status(
        &gateway,
        &ServiceState::default(),
        "cluster.local",
        NOW,
        None,
    );
    assert_eq!(none.get("addresses"), None);
}

/// Every (type, lastTransitionTime) of the Gateway's and its listeners' conditions.
fn times(status: &Value) -> Vec<(String, String)> {
    let of = |conditions: &Value| -> Vec<(String, String)> {
        conditions
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or_default().to_string(),
                    c["lastTransitionTime"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    };
    let mut all = of(&status["conditions"]);
    for listener in status["listeners"].as_array().into_iter().flatten() {
        all.extend(of(&listener["conditions"]));
    }
    all
}

#[test]
fn transition_times() {
    let mut gateway = waypoint(vec![mesh()]);
    let missing = ServiceState::default();
    let first = gateway_status(&gateway, &missing, "cluster.local", NOW, None);
    assert!(times(&first).iter().all(|(_, t)| t == NOW));

    // Nothing changed status: every time is kept, even with a new generation and message.
    gateway.generation = 2;
    let no_instances = ServiceState {
        has_instances: false,
        ..ready()
    };
    let same = gateway_status(
        &gateway,
        &no_instances,
        "cluster.local",
        LATER,
        Some(&first),
    );
    assert!(times(&same).iter().all(|(_, t)| t == NOW), "{same:#}");
    assert_eq!(same["conditions"][0]["observedGeneration"], 2);
    assert_eq!(
        condition(&same["conditions"], "Programmed").1,
        "AddressNotAssigned"
    );

    // Programmed flips: only its time moves.
    let ready_now = gateway_status(&gateway, &ready(), "cluster.local", LATER, Some(&same));
    for (kind, time) in times(&ready_now).iter().take(3) {
        let want = if kind == "Programmed" { LATER } else { NOW };
        assert_eq!(time, want, "{kind}");
    }
    // Listener conditions did not change.
    assert!(times(&ready_now)[3..].iter().all(|(_, t)| t == NOW));

    // A listener's protocol changes: its Accepted flips, the rest hold.
    gateway.listeners = vec![listener("mesh", 15008, "HTTP")];
    let changed = gateway_status(&gateway, &ready(), "cluster.local", LATER, Some(&first));
    let accepted = &changed["listeners"][0]["conditions"][0];
    assert_eq!(
        (
            accepted["type"].as_str(),
            accepted["lastTransitionTime"].as_str()
        ),
        (Some("Accepted"), Some(LATER))
    );
    assert_eq!(
        changed["listeners"][0]["conditions"][1]["lastTransitionTime"],
        NOW
    );
}

#[test]
fn other_conditions_and_fields_are_kept_in_place() {
    let gateway = waypoint(vec![mesh()]);
    let previous = json!({
        "attachedListenerSets": 0,
        "conditions": [
            {"type": "Programmed", "status": "False", "reason": "Pending", "message": "", "lastTransitionTime": "2020-01-01T00:00:00Z"},
            {"type": "Example", "status": "True", "reason": "Other", "message": "kept", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        ],
    });
    let status = gateway_status(&gateway, &ready(), "cluster.local", NOW, Some(&previous));
    assert_eq!(status["attachedListenerSets"], 0);
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, ["Programmed", "Example", "Accepted", "ResolvedRefs"]);
    assert_eq!(status["conditions"][1], previous["conditions"][1]);
    assert_eq!(status["conditions"][0]["lastTransitionTime"], NOW);
}

#[test]
fn removed_listeners_are_dropped() {
    let two = waypoint(vec![mesh(), listener("extra", 80, "HTTP")]);
    let first = gateway_status(&two, &ready(), "cluster.local", NOW, None);
    assert_eq!(first["listeners"].as_array().map(Vec::len), Some(2));
    let one = waypoint(vec![mesh()]);
    let later = gateway_status(&one, &ready(), "cluster.local", LATER, Some(&first));
    let names: Vec<&str> = later["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["mesh"]);
}

#[test]
fn class() {
    assert_eq!(
        waypoint_class(),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "istio-waypoint"},
            "spec": {
                "controllerName": "istio.io/mesh-controller",
                "description": "The default Istio waypoint GatewayClass",
            },
        })
    );
    let accepted = |generation: i64, time: &str| {
        json!({
            "type": "Accepted",
            "status": "True",
            "reason": "Accepted",
            "message": "Handled by Istio controller",
            "observedGeneration": generation,
            "lastTransitionTime": time,
        })
    };
    let first = class_status(1, NOW, None);
    assert_eq!(first, json!({"conditions": [accepted(1, NOW)]}));
    // Still accepted at a new generation: the time holds.
    let second = class_status(2, LATER, Some(&first));
    assert_eq!(second, json!({"conditions": [accepted(2, NOW)]}));
    // Someone else said otherwise: the flip is dated now.
    let rejected = json!({"conditions": [{"type": "Accepted", "status": "False", "reason": "X", "message": "", "lastTransitionTime": NOW}]});
    assert_eq!(
        class_status(2, LATER, Some(&rejected)),
        json!({"conditions": [accepted(2, LATER)]})
    );
}
