//! Rendering against istiod's deployment goldens (`tests/fixtures/waypoint/deployment*.yaml`),
//! and table tests of names, copied metadata, ports and settings.

use serde_json::{Value, json};

use super::*;
use crate::kube::objects::parse_yaml;

const GOLDEN: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/waypoint/deployment.yaml"
));
const GOLDEN_RESOURCES_NULL: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/waypoint/deployment-resources-null.yaml"
));

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn listener(name: &str, port: u16, protocol: &str) -> ListenerInfo {
    ListenerInfo {
        name: name.into(),
        port,
        protocol: protocol.into(),
    }
}

/// istiod's test Gateway: default/namespace with one listener of protocol ALL.
fn golden_gateway() -> GatewayInfo {
    GatewayInfo {
        name: "namespace".into(),
        namespace: "default".into(),
        class_name: "istio-waypoint".into(),
        listeners: vec![listener("mesh", 15008, "ALL")],
        ..GatewayInfo::default()
    }
}

/// istiod's test values, with the chart's defaults where the test leaves them unset.
fn golden_settings() -> ProxySettings {
    ProxySettings {
        image: "test/proxyv2:test".into(),
        image_pull_policy: None,
        istiod_address: "istiod.istio-system.svc:15012".into(),
        cluster_id: "Kubernetes".into(),
        trust_domain: "cluster.local".into(),
        domain: "cluster.local".into(),
        mesh_id: "cluster.local".into(),
        network: String::new(),
        revision: String::new(),
        replicas: None,
        resources: Some(json!({})),
    }
}

fn objects(rendered: &Rendered) -> Vec<Value> {
    vec![
        rendered.service_account.clone(),
        rendered.deployment.clone(),
        rendered.service.clone(),
    ]
}

fn assert_golden(golden: &str, gateway: &GatewayInfo, settings: &ProxySettings) {
    let want = parse_yaml(golden).expect("fixture parses");
    let got = objects(&render(gateway, settings));
    assert_eq!(want.len(), got.len(), "object count");
    for (want, got) in want.iter().zip(&got) {
        assert_eq!(
            want,
            got,
            "{} differs:\nwant {}\ngot  {}",
            want["kind"],
            serde_json::to_string_pretty(want).unwrap_or_default(),
            serde_json::to_string_pretty(got).unwrap_or_default()
        );
    }
}

#[test]
fn istiod_golden_waypoint() {
    // The Gateway's own network label wins over the mesh's network.
    let gateway = GatewayInfo {
        labels: pairs(&[("topology.istio.io/network", "network-1")]),
        ..golden_gateway()
    };
    let settings = ProxySettings {
        network: "network-2".into(),
        ..golden_settings()
    };
    assert_golden(GOLDEN, &gateway, &settings);
}

#[test]
fn istiod_golden_waypoint_no_network_label() {
    // The mesh's network is copied as the label and given to the proxy.
    let settings = ProxySettings {
        network: "network-1".into(),
        ..golden_settings()
    };
    assert_golden(GOLDEN, &golden_gateway(), &settings);
}

#[test]
fn istiod_golden_waypoint_resources_null() {
    let settings = ProxySettings {
        resources: Some(json!({
            "limits": {"cpu": null, "memory": "500Mi"},
            "requests": {"cpu": null, "memory": "150Mi"},
        })),
        ..golden_settings()
    };
    assert_golden(GOLDEN_RESOURCES_NULL, &golden_gateway(), &settings);
}

fn container(rendered: &Rendered) -> &Value {
    &rendered.deployment["spec"]["template"]["spec"]["containers"][0]
}

fn env_value<'a>(rendered: &'a Rendered, name: &str) -> Option<&'a str> {
    container(rendered)["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

#[test]
fn names_from_annotations() {
    // (name-override, service-account) -> (Deployment and Service, ServiceAccount)
    let cases = [
        (None, None, "namespace", "namespace"),
        (Some("custom"), None, "custom", "namespace"),
        (None, Some("sa"), "namespace", "sa"),
        (Some("custom"), Some("sa"), "custom", "sa"),
        // An empty annotation is no override.
        (Some(""), Some(""), "namespace", "namespace"),
    ];
    for (name_override, account, want_name, want_account) in cases {
        let mut gateway = golden_gateway();
        if let Some(name) = name_override {
            gateway
                .annotations
                .push((NAME_OVERRIDE_ANNOTATION.into(), name.into()));
        }
        if let Some(account) = account {
            gateway
                .annotations
                .push((SERVICE_ACCOUNT_ANNOTATION.into(), account.into()));
        }
        let rendered = render(&gateway, &golden_settings());
        let case = format!("{name_override:?} {account:?}");
        assert_eq!(rendered.deployment["metadata"]["name"], want_name, "{case}");
        assert_eq!(rendered.service["metadata"]["name"], want_name, "{case}");
        assert_eq!(
            rendered.service_account["metadata"]["name"], want_account,
            "{case}"
        );
        let pod = &rendered.deployment["spec"]["template"];
        assert_eq!(pod["spec"]["serviceAccountName"], want_account, "{case}");
        assert_eq!(
            pod["metadata"]["labels"]["service.istio.io/canonical-name"], want_name,
            "{case}"
        );
        assert_eq!(
            container(&rendered)["args"][5],
            format!("{want_account}.$(POD_NAMESPACE)"),
            "{case}"
        );
        assert_eq!(
            env_value(&rendered, "ISTIO_META_WORKLOAD_NAME"),
            Some(want_name)
        );
        assert_eq!(
            env_value(&rendered, "ISTIO_META_OWNER"),
            Some(
                format!("kubernetes://apis/apps/v1/namespaces/default/deployments/{want_name}")
                    .as_str()
            )
        );
        // Selectors and owner references name the Gateway, whatever the objects are called.
        assert_eq!(
            rendered.service["spec"]["selector"][GATEWAY_NAME_LABEL],
            "namespace"
        );
        for object in objects(&rendered) {
            assert_eq!(
                object["metadata"]["ownerReferences"][0]["name"],
                "namespace"
            );
            assert_eq!(
                object["metadata"]["labels"][GATEWAY_NAME_LABEL],
                "namespace"
            );
            // The annotations are not copied to the objects.
            let annotations = object["metadata"]["annotations"].as_object().cloned();
            assert!(
                annotations
                    .unwrap_or_default()
                    .keys()
                    .all(|k| !k.starts_with("gateway.istio.io/")),
                "{case}"
            );
        }
    }
}

/// The metadata of (ServiceAccount, Deployment, pod template, Service) as sorted pairs.
fn metadata_of(rendered: &Rendered, field: &str) -> [Vec<(String, String)>; 4] {
    let pairs = |v: &Value| -> Vec<(String, String)> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect()
    };
    [
        pairs(&rendered.service_account["metadata"][field]),
        pairs(&rendered.deployment["metadata"][field]),
        pairs(&rendered.deployment["spec"]["template"]["metadata"][field]),
        pairs(&rendered.service["metadata"][field]),
    ]
}

#[test]
fn infrastructure_labels_and_annotations() {
    struct Case {
        name: &'static str,
        labels: &'static [(&'static str, &'static str)],
        annotations: &'static [(&'static str, &'static str)],
        infra_labels: Option<&'static [(&'static str, &'static str)]>,
        infra_annotations: Option<&'static [(&'static str, &'static str)]>,
        /// Copied labels and annotations every object has.
        want_labels: &'static [(&'static str, &'static str)],
        want_annotations: &'static [(&'static str, &'static str)],
    }
    let cases = [
        Case {
            name: "the Gateway's own are copied, less istiod's annotations",
            labels: &[("team", "a"), ("istio.io/rev", "canary")],
            annotations: &[
                ("note", "x"),
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
                ("gateway.istio.io/controller-version", "5"),
            ],
            infra_labels: None,
            infra_annotations: None,
            want_labels: &[("team", "a"), ("istio.io/rev", "canary")],
            want_annotations: &[("note", "x")],
        },
        Case {
            name: "spec.infrastructure replaces them, less gateway.networking.k8s.io/ keys",
            labels: &[("team", "a")],
            annotations: &[("note", "x")],
            infra_labels: Some(&[("infra", "b"), ("gateway.networking.k8s.io/x", "y")]),
            infra_annotations: Some(&[("infra-note", "c"), ("gateway.networking.k8s.io/y", "z")]),
            want_labels: &[("infra", "b")],
            want_annotations: &[("infra-note", "c")],
        },
        Case {
            name: "an empty spec.infrastructure map copies nothing",
            labels: &[("team", "a")],
            annotations: &[("note", "x")],
            infra_labels: Some(&[]),
            infra_annotations: Some(&[]),
            want_labels: &[],
            want_annotations: &[],
        },
    ];
    for case in cases {
        let gateway = GatewayInfo {
            labels: pairs(case.labels),
            annotations: pairs(case.annotations),
            infrastructure_labels: case.infra_labels.map(pairs),
            infrastructure_annotations: case.infra_annotations.map(pairs),
            ..golden_gateway()
        };
        let rendered = render(&gateway, &golden_settings());
        let want_labels = pairs(case.want_labels);
        let want_annotations = pairs(case.want_annotations);
        let labels = metadata_of(&rendered, "labels");
        let annotations = metadata_of(&rendered, "annotations");
        for (i, (labels, annotations)) in labels.iter().zip(&annotations).enumerate() {
            for pair in &want_labels {
                assert!(
                    labels.contains(pair),
                    "{}: object {i} lacks label {pair:?}",
                    case.name
                );
            }
            for (k, _) in labels {
                let own = want_labels.iter().any(|(w, _)| w == k);
                let template = k.starts_with("gateway.")
                    || k.starts_with("service.istio.io/")
                    || ["sidecar.istio.io/inject", "istio.io/dataplane-mode"].contains(&k.as_str());
                assert!(own || template, "{}: object {i} has label {k}", case.name);
            }
            for pair in &want_annotations {
                assert!(
                    annotations.contains(pair),
                    "{}: object {i} lacks {pair:?}",
                    case.name
                );
            }
            for (k, _) in annotations {
                let own = want_annotations.iter().any(|(w, _)| w == k);
                let template = k.starts_with("prometheus.io/")
                    || k == "istio.io/rev"
                    || k == "networking.istio.io/traffic-distribution";
                assert!(
                    own || template,
                    "{}: object {i} has annotation {k}",
                    case.name
                );
            }
        }
    }
}

#[test]
fn copied_metadata_yields_to_the_template_where_istiod_does() {
    let gateway = GatewayInfo {
        labels: pairs(&[
            (GATEWAY_NAME_LABEL, "other"),
            ("istio.io/dataplane-mode", "ambient"),
            (MANAGED_LABEL, "someone"),
        ]),
        annotations: pairs(&[
            ("istio.io/rev", "canary"),
            ("networking.istio.io/traffic-distribution", "Any"),
        ]),
        ..golden_gateway()
    };
    let rendered = render(&gateway, &golden_settings());
    let pod = &rendered.deployment["spec"]["template"]["metadata"];
    // The Gateway's name, class and managed labels win over copied ones.
    for object in objects(&rendered) {
        assert_eq!(
            object["metadata"]["labels"][GATEWAY_NAME_LABEL],
            "namespace"
        );
        assert_eq!(
            object["metadata"]["labels"][MANAGED_LABEL],
            MANAGED_LABEL_VALUE
        );
    }
    // Copied labels win over the pod's defaults; the template's annotations win over copied
    // ones on the pod, and copied ones over the Service's default.
    assert_eq!(pod["labels"]["istio.io/dataplane-mode"], "ambient");
    assert_eq!(pod["annotations"]["istio.io/rev"], "default");
    assert_eq!(
        rendered.service["metadata"]["annotations"]["networking.istio.io/traffic-distribution"],
        "Any"
    );
}

#[test]
fn settings_reach_the_pod() {
    let settings = ProxySettings {
        image: "registry.example/istio/proxyv2:1.28.0".into(),
        image_pull_policy: Some("IfNotPresent".into()),
        istiod_address: "ambientd.istio-system.svc:15012".into(),
        cluster_id: "east".into(),
        trust_domain: "example.org".into(),
        domain: "corp.local".into(),
        mesh_id: String::new(),
        network: String::new(),
        revision: "1-28".into(),
        replicas: Some(2),
        resources: None,
    };
    let gateway = GatewayInfo {
        uid: "0f1e".into(),
        ..golden_gateway()
    };
    let rendered = render(&gateway, &settings);
    let container = container(&rendered);
    assert_eq!(container["image"], "registry.example/istio/proxyv2:1.28.0");
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(container["args"][3], "$(POD_NAMESPACE).svc.corp.local");
    assert_eq!(container["resources"], default_resources());
    assert_eq!(rendered.deployment["spec"]["replicas"], 2);
    assert_eq!(
        rendered.deployment["spec"]["template"]["metadata"]["annotations"]["istio.io/rev"],
        "1-28"
    );
    assert_eq!(
        env_value(&rendered, "CA_ADDR"),
        Some("ambientd.istio-system.svc:15012")
    );
    let proxy_config = env_value(&rendered, "PROXY_CONFIG").unwrap_or_default();
    assert_eq!(
        proxy_config,
        "{\"discoveryAddress\":\"ambientd.istio-system.svc:15012\"}\n"
    );
    assert_eq!(env_value(&rendered, "ISTIO_META_CLUSTER_ID"), Some("east"));
    assert_eq!(env_value(&rendered, "ISTIO_META_NETWORK"), None);
    // The mesh ID defaults to the trust domain.
    assert_eq!(
        env_value(&rendered, "ISTIO_META_MESH_ID"),
        Some("example.org")
    );
    assert_eq!(env_value(&rendered, "TRUST_DOMAIN"), Some("example.org"));
    for object in objects(&rendered) {
        assert_eq!(
            object["metadata"]["ownerReferences"],
            json!([{
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "name": "namespace",
                "uid": "0f1e",
            }])
        );
    }
}

#[test]
fn resources() {
    let limits = json!({"limits": {"memory": "1Gi"}});
    let cases = [
        (None, Some(default_resources())),
        (Some(Value::Null), None),
        (Some(json!({})), None),
        (Some(json!({"limits": {"cpu": null}})), None),
        (Some(limits.clone()), Some(limits)),
    ];
    for (resources, want) in cases {
        let settings = ProxySettings {
            resources: resources.clone(),
            ..golden_settings()
        };
        let rendered = render(&golden_gateway(), &settings);
        assert_eq!(
            container(&rendered).get("resources"),
            want.as_ref(),
            "{resources:?}"
        );
    }
}

#[test]
fn annotations_override_image_and_log_levels() {
    let gateway = GatewayInfo {
        annotations: pairs(&[
            (
                "sidecar.istio.io/proxyImage",
                "mirror.example/proxyv2:debug",
            ),
            ("sidecar.istio.io/logLevel", "debug"),
            ("sidecar.istio.io/componentLogLevel", "rbac:debug"),
            ("sidecar.istio.io/agentLogLevel", "xds:debug"),
        ]),
        ..golden_gateway()
    };
    let rendered = render(&gateway, &golden_settings());
    let proxy = container(&rendered);
    assert_eq!(proxy["image"], "mirror.example/proxyv2:debug");
    let args: Vec<&str> = proxy["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &args[6..],
        [
            "--proxyLogLevel",
            "debug",
            "--proxyComponentLogLevel",
            "rbac:debug",
            "--log_output_level",
            "xds:debug"
        ]
    );
    // An image without a registry path is a name istiod would complete from its hub: ignored.
    let gateway = GatewayInfo {
        annotations: pairs(&[("sidecar.istio.io/proxyImage", "proxyv2")]),
        ..golden_gateway()
    };
    assert_eq!(
        container(&render(&gateway, &golden_settings()))["image"],
        "test/proxyv2:test"
    );
}

#[test]
fn service_ports() {
    let long = "l".repeat(70);
    let long_2 = format!("{}-2", &long[..61]);
    /// (name, port, appProtocol) of a Service port.
    type Port<'a> = (&'a str, u16, &'a str);
    let cases: Vec<(Vec<ListenerInfo>, Vec<Port>)> = vec![
        (
            vec![listener("mesh", 15008, "HBONE")],
            vec![("status-port", 15021, "tcp"), ("mesh", 15008, "hbone")],
        ),
        // One port per distinct listener port; dots become dashes; taken names get -<port>.
        (
            vec![
                listener("a.b", 80, "HTTP"),
                listener("other", 80, "TCP"),
                listener("a-b", 81, "TCP"),
                listener("status-port", 82, "TCP"),
            ],
            vec![
                ("status-port", 15021, "tcp"),
                ("a-b", 80, "http"),
                ("a-b-81", 81, "tcp"),
                ("status-port-82", 82, "tcp"),
            ],
        ),
        // Names are cut to 63 bytes; the suffix fits in them.
        (
            vec![
                listener(&long, 1, "TCP"),
                listener(&long, 2, "TCP"),
                listener("", 3, "TCP"),
            ],
            vec![
                ("status-port", 15021, "tcp"),
                (&long[..63], 1, "tcp"),
                (&long_2, 2, "tcp"),
                ("tcp-2", 3, "tcp"),
            ],
        ),
    ];
    for (listeners, want) in cases {
        let gateway = GatewayInfo {
            listeners,
            ..golden_gateway()
        };
        let rendered = render(&gateway, &golden_settings());
        let want: Vec<Value> = want
            .iter()
            .map(|(name, port, app)| {
                json!({"name": name, "port": port, "protocol": "TCP", "appProtocol": app})
            })
            .collect();
        assert_eq!(rendered.service["spec"]["ports"], json!(want));
    }
}

#[test]
fn service_type_annotation() {
    let gateway = GatewayInfo {
        annotations: pairs(&[("networking.istio.io/service-type", "LoadBalancer")]),
        spec_addresses: pairs(&[("IPAddress", "203.0.113.7")]),
        ..golden_gateway()
    };
    let rendered = render(&gateway, &golden_settings());
    assert_eq!(rendered.service["spec"]["type"], "LoadBalancer");
    assert_eq!(rendered.service["spec"]["loadBalancerIP"], "203.0.113.7");
    // A ClusterIP Service never gets the address.
    let gateway = GatewayInfo {
        spec_addresses: pairs(&[("IPAddress", "203.0.113.7")]),
        ..golden_gateway()
    };
    let rendered = render(&gateway, &golden_settings());
    assert_eq!(rendered.service["spec"].get("loadBalancerIP"), None);
}

#[test]
fn managed() {
    let cases: [(&[(&str, &str)], bool); 6] = [
        (&[], true),
        (&[("IPAddress", "10.0.0.1")], true),
        (&[("", "10.0.0.1")], true),
        (&[("Hostname", "waypoint.example")], false),
        (&[("NamedAddress", "x")], false),
        (
            &[("IPAddress", "10.0.0.1"), ("IPAddress", "10.0.0.2")],
            false,
        ),
    ];
    for (addresses, want) in cases {
        let gateway = GatewayInfo {
            spec_addresses: pairs(addresses),
            ..golden_gateway()
        };
        assert_eq!(is_managed(&gateway), want, "{addresses:?}");
    }
}

#[test]
fn legacy_selector_is_kept() {
    let mut deployment = render(&golden_gateway(), &golden_settings()).deployment;
    let fresh = deployment.clone();
    // No existing Deployment, or one with today's selector: unchanged.
    reuse_legacy_selector(&mut deployment, None);
    assert_eq!(deployment, fresh);
    reuse_legacy_selector(&mut deployment, Some(&fresh));
    assert_eq!(deployment, fresh);

    let existing = json!({"spec": {
        "selector": {"matchLabels": {LEGACY_GATEWAY_NAME_LABEL: "namespace"}},
        "template": {"metadata": {"labels": {LEGACY_GATEWAY_NAME_LABEL: "namespace"}}},
    }});
    reuse_legacy_selector(&mut deployment, Some(&existing));
    assert_eq!(
        deployment["spec"]["selector"],
        json!({"matchLabels": {LEGACY_GATEWAY_NAME_LABEL: "namespace"}})
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels[LEGACY_GATEWAY_NAME_LABEL], "namespace");
    // Today's label stays on the pods, so the Service still selects them.
    assert_eq!(labels[GATEWAY_NAME_LABEL], "namespace");
}
