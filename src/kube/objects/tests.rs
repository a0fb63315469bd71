use super::*;

fn one(yaml: &str) -> Decoded {
    let mut documents = parse_yaml(yaml).expect("yaml");
    assert_eq!(documents.len(), 1);
    let mut decoded = decode(documents.remove(0));
    assert_eq!(decoded.len(), 1, "{decoded:?}");
    decoded.remove(0)
}

fn object(yaml: &str) -> Object {
    match one(yaml) {
        Decoded::Object(o) => o,
        other => panic!("expected an object, got {other:?}"),
    }
}

#[test]
fn service_defaults_are_those_of_the_api_server() {
    let Object::Service(svc) = object(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n",
    ) else {
        panic!("not a service")
    };
    assert_eq!(svc.namespace, "default");
    assert_eq!(svc.ports[0].target_port, TargetPort::Number(80));
    assert_eq!(svc.ports[0].protocol, Protocol::Tcp);
    assert_eq!(svc.cluster_ips, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    assert!(svc.ip_families.is_empty(), "ipFamilies is read as written");
    assert!(!svc.external_name && !svc.internal_traffic_local);
}

#[test]
fn a_namespace_carries_its_name_label_as_the_api_server_sets_it() {
    for yaml in [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {tier: x}}\n",
        // The API server overwrites a wrong value.
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {tier: x, \
         kubernetes.io/metadata.name: other}}\n",
    ] {
        let Object::Namespace(ns) = object(yaml) else {
            panic!("not a namespace")
        };
        assert_eq!(ns.labels.get("kubernetes.io/metadata.name"), Some("team-a"));
        assert_eq!(ns.labels.get("tier"), Some("x"));
        assert_eq!(ns.labels.len(), 2);
    }
}

#[test]
fn target_port_zero_or_empty_defaults_to_the_port_like_unset() {
    let Object::Service(svc) = object(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  ports: [{name: a, port: 80, targetPort: 0}, {name: b, port: 81, targetPort: ''}, {name: c, port: 82}, {name: d, port: 83, targetPort: 8083}]\n",
    ) else {
        panic!("not a service")
    };
    let targets: Vec<_> = svc.ports.iter().map(|p| p.target_port.clone()).collect();
    assert_eq!(
        targets,
        [80, 81, 82, 8083].map(TargetPort::Number).to_vec(),
        "targetPort 0 keeps the Service"
    );
}

#[test]
fn workload_entry_revision_comes_from_metadata_labels_only() {
    use crate::discovery::{Index, Settings};
    let entry = |metadata_labels: &str, spec_labels: &str| {
        object(&format!(
            "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: vm, namespace: n, labels: {{{metadata_labels}}}}}\nspec: {{address: 10.5.0.1, labels: {{{spec_labels}}}}}\n"
        ))
    };
    let uid = "Kubernetes/networking.istio.io/WorkloadEntry/n/vm";
    let published = |object: Object| {
        let mut index = Index::new(Settings::default());
        index
            .apply(object)
            .addresses
            .upserted
            .iter()
            .any(|n| &**n == uid)
    };
    // A revision in spec.labels (merged into the workload's labels) is not the object's.
    let Object::WorkloadEntry(we) = entry("", "istio.io/rev: canary") else {
        panic!("not a workload entry")
    };
    assert_eq!(we.revision, None);
    assert_eq!(we.labels.get("istio.io/rev"), Some("canary"));
    assert!(published(Object::WorkloadEntry(we)));
    assert!(!published(entry("istio.io/rev: canary", "")));
    assert!(published(entry(
        "istio.io/rev: default",
        "istio.io/rev: canary"
    )));
}

#[test]
fn service_entry_skips_an_unparsable_allocated_address_and_keeps_the_rest() {
    let Object::ServiceEntry(se) = object(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: se, namespace: n}\nspec: {hosts: [a.example.com], resolution: DNS}\nstatus:\n  addresses: [{host: a.example.com, value: not-an-ip}, {host: a.example.com, value: 240.240.0.1}]\n",
    ) else {
        panic!("not a service entry")
    };
    assert_eq!(
        se.allocated,
        vec![("a.example.com".to_string(), "240.240.0.1".parse().unwrap())]
    );
}

#[test]
fn endpoint_slice_with_one_bad_address_skips_only_that_endpoint() {
    use crate::discovery::{Index, Settings};
    let mut index = Index::new(Settings::default());
    for yaml in [
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: n}\nspec: {clusterIP: 10.96.0.1, ports: [{name: http, port: 80}]}\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-x, namespace: n, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.1]}, {addresses: [not-an-ip]}, {addresses: [10.1.0.3]}]\n",
    ] {
        index.apply(object(yaml));
    }
    let snapshot = index.snapshot();
    let slice_uid = |ip: &str| format!("Kubernetes/discovery.k8s.io/EndpointSlice/n/web-x/{ip}");
    let has = |name: &str| {
        snapshot
            .resources(crate::discovery::names::TypeKind::Address)
            .contains_key(name)
    };
    assert!(has(&slice_uid("10.1.0.1")));
    assert!(has(&slice_uid("10.1.0.3")));
    assert!(!has(&slice_uid("not-an-ip")));
}

#[test]
fn gateway_allowed_routes_read_as_istiod_does() {
    use crate::discovery::model::{AllowedNamespaces, LabelOperator, NamespaceSelector};
    let allowed = |namespaces: &str| {
        let Object::Gateway(gw) = object(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: wp, namespace: n}}\nspec:\n  listeners: [{{name: mesh, port: 15008, protocol: HBONE, allowedRoutes: {{namespaces: {namespaces}}}}}]\n"
        )) else {
            panic!("not a gateway")
        };
        gw.listeners[0].allowed.clone().expect("namespaces set")
    };
    // An unknown `from` is Same; it does not invalidate the Gateway.
    assert_eq!(allowed("{from: Bogus}"), AllowedNamespaces::Same);
    assert_eq!(allowed("{}"), AllowedNamespaces::Same);
    // No selector selects nothing; `{}` everything.
    assert_eq!(
        allowed("{from: Selector}"),
        AllowedNamespaces::Selector(NamespaceSelector::Nothing)
    );
    assert_eq!(
        allowed("{from: Selector, selector: {}}"),
        AllowedNamespaces::Selector(NamespaceSelector::labels(Labels::new()))
    );
    let AllowedNamespaces::Selector(NamespaceSelector::Match {
        labels,
        expressions,
    }) = allowed(
        "{from: Selector, selector: {matchLabels: {a: b}, matchExpressions: [{key: team, operator: NotIn, values: [x]}]}}",
    )
    else {
        panic!("a selector")
    };
    assert_eq!(labels.get("a"), Some("b"));
    assert_eq!(expressions[0].operator, LabelOperator::NotIn);
    assert_eq!(expressions[0].values, vec!["x".to_string()]);
    // Selectors Go rejects select nothing.
    for rejected in [
        "{matchExpressions: [{key: team, operator: Matches, values: [x]}]}",
        "{matchExpressions: [{key: team, operator: In}]}",
        "{matchExpressions: [{key: team, operator: Exists, values: [x]}]}",
    ] {
        assert_eq!(
            allowed(&format!("{{from: Selector, selector: {rejected}}}")),
            AllowedNamespaces::Selector(NamespaceSelector::Nothing),
            "{rejected}"
        );
    }
}

#[test]
fn headless_service_has_no_cluster_ips_and_named_target_ports_stay_named() {
    let Object::Service(svc) = object(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: n}\nspec:\n  clusterIP: None\n  ports: [{port: 80, targetPort: http, protocol: UDP}]\n",
    ) else {
        panic!("not a service")
    };
    assert!(svc.cluster_ips.is_empty());
    assert_eq!(svc.ports[0].target_port, TargetPort::Name("http".into()));
    assert_eq!(svc.ports[0].protocol, Protocol::Udp);
}

#[test]
fn pod_defaults_are_those_of_the_api_server() {
    let Object::Pod(pod) = object(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {version: 2, flag: true}}\nspec:\n  containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]\nstatus: {podIP: 10.1.1.1, conditions: [{type: Ready, status: True}]}\n",
    ) else {
        panic!("not a pod")
    };
    let pod = pod.to_fields();
    assert_eq!(&*pod.namespace, "default");
    assert_eq!(&*pod.service_account, "default");
    assert_eq!(&*pod.phase, "Pending");
    assert_eq!(&*pod.ips, ["10.1.1.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(pod.ports[0].protocol, Protocol::Tcp);
    assert!(pod.ready, "an unquoted True condition still counts");
    assert_eq!(pod.labels.get("version"), Some("2"));
    assert_eq!(pod.labels.get("flag"), Some("true"));
}

#[test]
fn native_sidecar_ports_count_and_plain_init_container_ports_do_not() {
    let Object::Pod(pod) = object(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  initContainers:\n  - {name: side, restartPolicy: Always, ports: [{name: metrics, containerPort: 9090}]}\n  - {name: init, ports: [{name: setup, containerPort: 7000}]}\n",
    ) else {
        panic!("not a pod")
    };
    let pod = pod.to_fields();
    let names: Vec<_> = pod.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["metrics"]);
}

#[test]
fn invalid_objects_name_the_object_and_field() {
    let Decoded::Invalid(error) = one(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n}\nstatus: {podIP: 10.0.0.300}\n",
    ) else {
        panic!("expected invalid")
    };
    let text = error.to_string();
    assert!(text.contains("v1/Pod n/p"), "{text}");
    assert!(text.contains("status.podIPs[0].ip"), "{text}");

    let Decoded::Invalid(error) =
        one("apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 70000}]}\n")
    else {
        panic!("expected invalid")
    };
    assert!(error.to_string().contains("spec.ports[0].port"), "{error}");

    let Decoded::Invalid(error) = one("apiVersion: v1\nkind: Node\nmetadata: {}\n") else {
        panic!("expected invalid")
    };
    assert!(error.to_string().contains("metadata.name"), "{error}");
}

#[test]
fn lists_expand_and_unknown_kinds_are_ignored() {
    let value: Value = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}},
        ]
    });
    let decoded = decode(value);
    assert!(matches!(decoded[0], Decoded::Object(Object::Node(_))));
    assert!(matches!(&decoded[1], Decoded::Ignored(kind) if kind == "apps/v1/Deployment"));
    // Only the core group's Service is a Service.
    assert!(matches!(
        one("apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: k}\n"),
        Decoded::Ignored(_)
    ));
}
