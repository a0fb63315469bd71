//! Table tests of a waypoint's config against docs/waypoint.md
//! (names, matcher, endpoints, RBAC), the config with nothing bound (§11), what a change
//! rebuilds, and the plain-Envoy flavour.

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message;

use crate::discovery::names::ResourceType;
use crate::discovery::{Event, Index, Object, Settings, Snapshot};
use crate::pb::envoy::config::cluster::v3::Cluster;
use crate::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use crate::pb::envoy::config::listener::v3::{Listener, listener_filter_chain_match_predicate};
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use crate::pb::google::protobuf::{Struct, Value, value::Kind};
use crate::pb::xds::Node;
use crate::waypoint::{
    ConfigId, Extensions, Rebuild, WaypointConfig, WaypointProxy, WaypointSettings,
};

/// §10's inputs: a waypoint in `default`, the `reviews` Service bound to it with one ambient
/// pod and one not enrolled, and an ALLOW policy on GET for reviews.
pub(crate) const WORKED_EXAMPLE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: default}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: default}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 10.96.0.10}, {type: Hostname, value: waypoint.default.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: default}
spec:
  clusterIP: 10.96.0.10
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: status-port, port: 15021, appProtocol: tcp}, {name: mesh, port: 15008, appProtocol: hbone}]
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-5d8f-x2
  namespace: default
  labels: {gateway.networking.k8s.io/gateway-name: waypoint}
spec: {serviceAccountName: waypoint, nodeName: node-a}
status: {phase: Running, podIP: 10.244.1.5, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: default
  labels: {istio.io/use-waypoint: waypoint}
spec:
  clusterIP: 10.96.0.20
  selector: {app: reviews}
  ports: [{name: http, port: 9080, targetPort: 9080}]
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-1
  namespace: default
  labels: {app: reviews}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: reviews, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.7, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-2
  namespace: default
  labels: {app: reviews}
spec: {serviceAccountName: reviews, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.8, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-get, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  action: ALLOW
  rules: [{to: [{operation: {methods: [GET]}}]}]
"#;

pub(crate) fn objects(yaml: &str) -> Vec<Object> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, yaml).expect("write");
    crate::kube::manifests::read_file(&path).expect("manifests")
}

pub(crate) fn index(yaml: &str) -> Index {
    let mut index = Index::new(Settings::default());
    for object in objects(yaml) {
        index.handle(Event::Apply(object));
    }
    index
}

fn node(id: &str, gateway: &str) -> Node {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    Node {
        id: id.into(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), string("default")),
                (
                    "LABELS".to_string(),
                    Value {
                        kind: Some(Kind::StructValue(Struct {
                            fields: [(
                                "gateway.networking.k8s.io/gateway-name".to_string(),
                                string(gateway),
                            )]
                            .into(),
                        })),
                    },
                ),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

pub(crate) fn proxy() -> WaypointProxy {
    WaypointProxy::from_node(&node(
        "waypoint~10.244.1.5~waypoint-5d8f-x2.default~default.svc.cluster.local",
        "waypoint",
    ))
    .unwrap()
}

pub(crate) fn config_of(snapshot: &Snapshot, proxy: &WaypointProxy) -> (ConfigId, WaypointConfig) {
    let settings = WaypointSettings::default();
    let id = ConfigId::of(proxy, snapshot, &settings.domain);
    let config = WaypointConfig::build(&id, snapshot, &settings);
    (id, config)
}

pub(crate) fn listener(config: &WaypointConfig, name: &str) -> Listener {
    Listener::decode(config.listeners[name].value()).unwrap()
}

fn names<T>(map: &std::collections::BTreeMap<crate::discovery::snapshot::Name, T>) -> Vec<&str> {
    map.keys().map(|n| n.as_str()).collect()
}

/// An encoded message's bytes contain `needle` (a type URL, a name).
pub(crate) fn mentions(resource: &crate::discovery::Resource, needle: &str) -> bool {
    resource
        .value()
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

pub(crate) const REVIEWS_HTTP: &str = "inbound-vip|9080|http|reviews.default.svc.cluster.local";

#[test]
fn the_worked_example_gets_istiods_names_and_shapes() {
    let mut index = index(WORKED_EXAMPLE);
    let snapshot = index.snapshot();
    let (id, config) = config_of(&snapshot, &proxy());
    assert_eq!(id.key.gateway, "waypoint");
    assert!(
        id.key
            .lookups
            .contains("default/waypoint.default.svc.cluster.local")
    );

    assert_eq!(
        names(&config.listeners),
        ["connect_originate", "connect_terminate", "main_internal"]
    );
    assert_eq!(
        names(&config.clusters),
        ["connect_originate", "encap", REVIEWS_HTTP, "main_internal"]
    );
    assert_eq!(names(&config.endpoints), [REVIEWS_HTTP]);

    // main_internal: the HTTP chain (9080 is an HTTP port: no TCP chain) and the direct ones.
    let main = listener(&config, "main_internal");
    let chains: Vec<&str> = main.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(chains, [REVIEWS_HTTP, "direct-tcp", "direct-http"]);
    // The HTTP inspector is off for 9080: nothing else is bound, and its protocol is known.
    let inspector = &main.listener_filters[1];
    assert_eq!(inspector.name, "envoy.filters.listener.http_inspector");
    let Some(listener_filter_chain_match_predicate::Rule::DestinationPortRange(range)) = inspector
        .filter_disabled
        .as_ref()
        .and_then(|p| p.rule.clone())
    else {
        panic!(
            "inspector disabled by a port range: {:?}",
            inspector.filter_disabled
        )
    };
    assert_eq!((range.start, range.end), (9080, 9081));
    // The matcher: the VIP, then the port, then the chain.
    let main_resource = &config.listeners["main_internal"];
    assert!(mentions(main_resource, "10.96.0.20"));
    assert!(mentions(main_resource, "xds.type.matcher.v3.IPMatcher"));

    // The HTTP chain: RBAC ALLOW with istiod's policy name, then the default route.
    let hcm_any = &main.filter_chains[0].filters[0];
    assert_eq!(
        hcm_any.name,
        "envoy.filters.network.http_connection_manager"
    );
    let Some(crate::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &hcm_any.config_type
    else {
        panic!("typed config")
    };
    let hcm = HttpConnectionManager::decode(any.value.clone()).unwrap();
    assert_eq!(hcm.stat_prefix, "inbound_0.0.0.0_9080;");
    let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "waypoint_upstream_peer_metadata",
            "istio.stats",
            "envoy.filters.http.router"
        ]
    );
    assert!(mentions(
        main_resource,
        "ns[default]-policy[allow-get]-rule[0]"
    ));

    // EDS: the ambient pod through connect_originate with its original_dst metadata, the
    // other a plain socket.
    let cla = ClusterLoadAssignment::decode(config.endpoints[REVIEWS_HTTP].value()).unwrap();
    let endpoints: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| l.lb_endpoints.iter())
        .map(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(e)) => format!("{:?}", e.address),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(endpoints.len(), 2, "{endpoints:?}");
    assert!(
        endpoints
            .iter()
            .any(|e| e.contains("connect_originate") && e.contains("10.244.2.7:9080")),
        "{endpoints:?}"
    );
    assert!(
        endpoints.iter().any(|e| e.contains("10.244.2.8")
            && e.contains("9080")
            && !e.contains("connect_originate")),
        "{endpoints:?}"
    );
    assert!(mentions(
        &config.endpoints[REVIEWS_HTTP],
        "envoy.filters.listener.original_dst"
    ));

    // CDS: EDS, least request, internal_upstream passing the host metadata.
    let cluster = Cluster::decode(config.clusters[REVIEWS_HTTP].value()).unwrap();
    assert_eq!(cluster.alt_stat_name, format!("{REVIEWS_HTTP};"));
    assert!(mentions(
        &config.clusters[REVIEWS_HTTP],
        "internal_upstream"
    ));
}

#[test]
fn a_waypoint_with_nothing_bound_gets_valid_empty_config() {
    // The waypoint alone: no Service uses it.
    let yaml = WORKED_EXAMPLE.replace("labels: {istio.io/use-waypoint: waypoint}", "labels: {}");
    let mut index = index(&yaml);
    let snapshot = index.snapshot();
    let (_, config) = config_of(&snapshot, &proxy());
    assert_eq!(
        names(&config.clusters),
        ["connect_originate", "encap", "main_internal"]
    );
    assert!(config.endpoints.is_empty());
    let main = listener(&config, "main_internal");
    let chains: Vec<&str> = main.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(chains, ["direct-tcp", "direct-http"]);
    assert!(main.filter_chain_matcher.is_some());
}

#[test]
fn an_endpoint_change_rebuilds_that_assignment_alone() {
    let mut index = index(WORKED_EXAMPLE);
    let before = index.snapshot();
    let proxy = proxy();
    let (id, config) = config_of(&before, &proxy);
    // A third reviews pod.
    let pod = WORKED_EXAMPLE
        .split("---")
        .find(|doc| doc.contains("name: reviews-2"))
        .unwrap()
        .replace("reviews-2", "reviews-3")
        .replace("10.244.2.8", "10.244.2.9");
    for object in objects(&pod) {
        index.handle(Event::Apply(object));
    }
    let after = index.snapshot();
    assert_eq!(ConfigId::of(&proxy, &after, "cluster.local"), id);
    assert_eq!(
        config.rebuild_needed(&id, &after),
        Rebuild::Endpoints([crate::discovery::snapshot::Name::from(REVIEWS_HTTP)].into())
    );
    let next = config.update(&id, &after, &WaypointSettings::default());
    for (name, resource) in &next.listeners {
        assert!(
            Arc::ptr_eq(resource, &config.listeners[name]),
            "{name} rebuilt"
        );
    }
    for (name, resource) in &next.clusters {
        assert!(
            Arc::ptr_eq(resource, &config.clusters[name]),
            "{name} rebuilt"
        );
    }
    assert_ne!(
        next.endpoints[REVIEWS_HTTP].version,
        config.endpoints[REVIEWS_HTTP].version
    );
    assert!(mentions(&next.endpoints[REVIEWS_HTTP], "10.244.2.9"));
    // The same as a build from nothing.
    let cold = WaypointConfig::build(&id, &after, &WaypointSettings::default());
    let versions = |c: &WaypointConfig| -> Vec<_> {
        [
            ResourceType::Listener,
            ResourceType::Cluster,
            ResourceType::ClusterLoadAssignment,
        ]
        .iter()
        .flat_map(|t| {
            c.of(*t)
                .unwrap()
                .values()
                .map(|r| (r.name.clone(), r.version))
        })
        .collect()
    };
    assert_eq!(versions(&next), versions(&cold));

    // A pod of an unrelated service changes nothing.
    let other = pod
        .replace("reviews-3", "ratings-1")
        .replace("app: reviews", "app: ratings")
        .replace("10.244.2.9", "10.244.3.1");
    for object in objects(&other) {
        index.handle(Event::Apply(object));
    }
    let unrelated = index.snapshot();
    assert_eq!(next.rebuild_needed(&id, &unrelated), Rebuild::Nothing);
}

#[test]
fn binding_and_policies_rebuild_everything() {
    let yaml = WORKED_EXAMPLE.replace("labels: {istio.io/use-waypoint: waypoint}", "labels: {}");
    let mut index = index(&yaml);
    let before = index.snapshot();
    let proxy = proxy();
    let (id, config) = config_of(&before, &proxy);
    // reviews binds.
    let bound: Vec<Object> = objects(WORKED_EXAMPLE)
        .into_iter()
        .filter(|o| o.object_ref().name == "reviews")
        .collect();
    for object in bound {
        index.handle(Event::Apply(object));
    }
    let after = index.snapshot();
    assert_eq!(config.rebuild_needed(&id, &after), Rebuild::Everything);
    let next = config.update(&id, &after, &WaypointSettings::default());
    assert!(next.clusters.contains_key(REVIEWS_HTTP));
    // A policy change: everything, since any chain may carry it.
    let deny = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: default}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: DENY
  rules: [{}]
"#;
    for object in objects(deny) {
        index.handle(Event::Apply(object));
    }
    let with_deny = index.snapshot();
    assert_eq!(next.rebuild_needed(&id, &with_deny), Rebuild::Everything);
    let denied = next.update(&id, &with_deny, &WaypointSettings::default());
    assert!(mentions(
        &denied.listeners["main_internal"],
        "ns[default]-policy[deny-all]-rule[0]"
    ));
}

#[test]
fn a_plain_envoy_gets_none_of_istios_extensions() {
    let mut index = index(WORKED_EXAMPLE);
    let snapshot = index.snapshot();
    let mut plain = proxy();
    plain.extensions = Extensions::NONE;
    let (id, config) = config_of(&snapshot, &plain);
    assert_eq!(id.string_factory, "envoy.string");
    let istio_only = [
        "io.istio.http.peer_metadata.Config",
        "stats.PluginConfig",
        "envoy.tcp.metadataexchange.config.MetadataExchange",
        "istio.hashable_string",
    ];
    for resource in config.listeners.values().chain(config.clusters.values()) {
        for needle in istio_only {
            assert!(
                !mentions(resource, needle),
                "{} has {needle}",
                resource.name
            );
        }
    }
    // Istio's proxy gets them.
    let (_, istio) = config_of(&snapshot, &proxy());
    let terminate = &istio.listeners["connect_terminate"];
    assert!(mentions(terminate, "io.istio.http.peer_metadata.Config"));
    assert!(mentions(terminate, "istio.hashable_string"));
    let names: BTreeSet<&str> = istio.listeners.keys().map(|n| n.as_str()).collect();
    assert_eq!(names.len(), 3);
}

mod destination_rules;
