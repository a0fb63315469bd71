//! The objects istiod's gateway deployment controller creates for a waypoint Gateway (class
//! `istio-waypoint`): a ServiceAccount, a Deployment running Istio's proxy as a waypoint, and
//! a Service, as rendered from istiod's `waypoint` template
//! (istio/istio `manifests/charts/istio-control/istio-discovery/files/waypoint.yaml`) by
//! `pilot/pkg/config/kube/gatewaycommon/deploymentcontroller.go` (`configureIstioGateway`,
//! `apply`, `extractServicePorts`). Pure: the controller applies what this returns.
//!
//! Left out, because ambientd has no source for them (each renders as istiod does when the
//! feature is unset):
//! * the HorizontalPodAutoscaler and PodDisruptionBudget, which istiod applies only when a
//!   `gateway.istio.io/defaults-for-class` or `spec.infrastructure.parametersRef` ConfigMap
//!   overlays them; those overlays (strategic merge patches of every object) are left out too;
//! * OpenShift (istiod drops `runAsUser`/`runAsGroup` there);
//! * `ProxyConfig.proxyMetadata` env entries and any ProxyConfig field but
//!   `discoveryAddress` in `PROXY_CONFIG`;
//! * `values.global.waypoint.{affinity,topologySpreadConstraints,nodeSelector,tolerations}`,
//!   `imagePullSecrets`, `gateways.seccompProfile`, `logAsJson`, `outlierLogPath`, the
//!   ClusterTrustBundle root and `trustBundleName` (the root is ConfigMap
//!   `istio-ca-root-cert`);
//! * the east-west class's `ISTIO_META_REQUESTED_NETWORK_VIEW`, and QUIC Service ports
//!   (`PILOT_ENABLE_QUIC_LISTENERS`, off by default);
//! * istiod's Kubernetes version check: the ServiceAccount always has its owner reference,
//!   which istiod adds only on Kubernetes 1.28 and later.
//!
//! The log levels are the chart's defaults (`warning`, `misc:error`, `default:info`) unless
//! the Gateway's `sidecar.istio.io/{logLevel,componentLogLevel,agentLogLevel}` annotations say
//! otherwise, as in istiod.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// The proxy settings from ambientd's flags / chart values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxySettings {
    /// The full image reference, e.g. `docker.io/istio/proxyv2:1.28.0`.
    pub image: String,
    /// `imagePullPolicy`; `None` or empty leaves it to Kubernetes.
    pub image_pull_policy: Option<String>,
    /// Where the proxy gets certificates (`CA_ADDR`) and xDS (`PROXY_CONFIG`'s
    /// `discoveryAddress`), e.g. `istiod.istio-system.svc:15012`.
    pub istiod_address: String,
    /// `ISTIO_META_CLUSTER_ID`; empty means `Kubernetes`.
    pub cluster_id: String,
    /// `TRUST_DOMAIN`, the proxy's SPIFFE trust domain; empty leaves it out.
    pub trust_domain: String,
    /// The cluster DNS domain, e.g. `cluster.local`.
    pub domain: String,
    /// `ISTIO_META_MESH_ID`; empty means the trust domain.
    pub mesh_id: String,
    /// The mesh network (`ISTIO_META_NETWORK`, and the `topology.istio.io/network` label when
    /// the Gateway has none); empty for none.
    pub network: String,
    /// The control plane revision; empty is written as `default` in `istio.io/rev`.
    pub revision: String,
    /// `spec.replicas`; `None` leaves it out, as istiod does, so 1 unless scaled.
    pub replicas: Option<i32>,
    /// The container's resources; `None` takes the chart's defaults
    /// ([`default_resources`]); a null or empty value renders none.
    pub resources: Option<Value>,
}

/// What rendering needs of a Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayInfo {
    pub name: String,
    pub namespace: String,
    /// For the objects' owner references, so deleting the Gateway deletes them.
    pub uid: String,
    /// `metadata.generation`, the status conditions' `observedGeneration`.
    pub generation: i64,
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub class_name: String,
    pub listeners: Vec<ListenerInfo>,
    /// `spec.addresses` as (type, value); the controller writes a missing type as
    /// `IPAddress`, the API's default.
    pub spec_addresses: Vec<(String, String)>,
    /// `spec.infrastructure.labels`: `Some` (even empty) replaces the Gateway's own labels.
    pub infrastructure_labels: Option<Vec<(String, String)>>,
    /// `spec.infrastructure.annotations`: `Some` (even empty) replaces the Gateway's own.
    pub infrastructure_annotations: Option<Vec<(String, String)>>,
}

/// One of a Gateway's `spec.listeners`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerInfo {
    pub name: String,
    pub port: u16,
    pub protocol: String,
}

/// The field manager of every apply, istiod's, so that either can take over from the other.
pub const FIELD_MANAGER: &str = "istio.io/gateway-controller";
/// The value of `gateway.istio.io/managed` on every object: the class's controller
/// `istio.io/mesh-controller` with `/` made `-`. An existing object without the label is
/// not the controller's to change.
pub const MANAGED_LABEL_VALUE: &str = "istio.io-mesh-controller";
/// The label marking objects the controller manages.
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// The class's controller name.
pub const CONTROLLER_NAME: &str = "istio.io/mesh-controller";
/// Overrides the Deployment's and Service's name (and so the Gateway's hostname).
pub const NAME_OVERRIDE_ANNOTATION: &str = "gateway.istio.io/name-override";
/// Overrides the ServiceAccount's name.
pub const SERVICE_ACCOUNT_ANNOTATION: &str = "gateway.istio.io/service-account";
/// The label selecting a Gateway's pods.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// The selector label before Istio 1.24; kept where an old Deployment has it, since a
/// Deployment's selector cannot change.
pub const LEGACY_GATEWAY_NAME_LABEL: &str = "istio.io/gateway-name";
const NETWORK_LABEL: &str = "topology.istio.io/network";
/// Annotations of the Gateway that are never copied to what it creates.
const NOT_COPIED: [&str; 4] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    NAME_OVERRIDE_ANNOTATION,
    SERVICE_ACCOUNT_ANNOTATION,
    "gateway.istio.io/controller-version",
];
/// pilot-agent's own default discovery address; istiod leaves it out of `PROXY_CONFIG`.
const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";

/// Whether the controller deploys this Gateway (istiod's `IsManaged`): no `spec.addresses`,
/// or exactly one of type IPAddress. Otherwise the addresses name an existing deployment.
pub fn is_managed(gateway: &GatewayInfo) -> bool {
    match gateway.spec_addresses.as_slice() {
        [] => true,
        [(kind, _)] => kind.is_empty() || kind == "IPAddress",
        _ => false,
    }
}

/// The Deployment's and Service's name: the name-override annotation or the Gateway's name
/// (the waypoint class has no name suffix). The Gateway's hostname is this Service's.
pub fn deployment_name(gateway: &GatewayInfo) -> &str {
    annotation(gateway, NAME_OVERRIDE_ANNOTATION)
        .filter(|v| !v.is_empty())
        .unwrap_or(&gateway.name)
}

/// The ServiceAccount's name: the service-account annotation or the Gateway's name.
pub fn service_account_name(gateway: &GatewayInfo) -> &str {
    annotation(gateway, SERVICE_ACCOUNT_ANNOTATION)
        .filter(|v| !v.is_empty())
        .unwrap_or(&gateway.name)
}

fn annotation<'a>(gateway: &'a GatewayInfo, key: &str) -> Option<&'a str> {
    gateway
        .annotations
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The three apply bodies, each with apiVersion, kind, metadata (name, namespace, labels,
/// annotations, an owner reference to the Gateway) and, but the ServiceAccount, spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub service_account: Value,
    pub deployment: Value,
    pub service: Value,
}

type Strings = BTreeMap<String, String>;

/// What the template is given, worked out once.
struct Input<'a> {
    gateway: &'a GatewayInfo,
    settings: &'a ProxySettings,
    name: &'a str,
    service_account: &'a str,
    labels: Strings,
    annotations: Strings,
}

/// Renders the objects in the order istiod applies them: ServiceAccount, Deployment, Service.
/// Every object carries `gateway.istio.io/managed` (istiod's `apply` adds it where the
/// template does not).
pub fn render(gateway: &GatewayInfo, settings: &ProxySettings) -> Rendered {
    let input = Input {
        gateway,
        settings,
        name: deployment_name(gateway),
        service_account: service_account_name(gateway),
        labels: infrastructure_labels(gateway, settings),
        annotations: infrastructure_annotations(gateway),
    };
    Rendered {
        service_account: service_account(&input),
        deployment: deployment(&input),
        service: service(&input),
    }
}

/// Labels copied to every object: `spec.infrastructure.labels` if set (keys under
/// `gateway.networking.k8s.io/` dropped), else the Gateway's own labels (all of them, as
/// istiod copies them); plus the mesh network when the Gateway's own labels lack one.
fn infrastructure_labels(gateway: &GatewayInfo, settings: &ProxySettings) -> Strings {
    let mut labels = infrastructure(&gateway.labels, gateway.infrastructure_labels.as_deref());
    let own_network = gateway.labels.iter().any(|(k, _)| k == NETWORK_LABEL);
    if !own_network && !settings.network.is_empty() && gateway.class_name.contains("waypoint") {
        labels.insert(NETWORK_LABEL.into(), settings.network.clone());
    }
    labels
}

/// Annotations copied to every object, chosen like the labels, less [`NOT_COPIED`].
fn infrastructure_annotations(gateway: &GatewayInfo) -> Strings {
    let mut annotations = infrastructure(
        &gateway.annotations,
        gateway.infrastructure_annotations.as_deref(),
    );
    annotations.retain(|k, _| !NOT_COPIED.contains(&k.as_str()));
    annotations
}

fn infrastructure(
    own: &[(String, String)],
    infrastructure: Option<&[(String, String)]>,
) -> Strings {
    match infrastructure {
        Some(pairs) => pairs
            .iter()
            .filter(|(k, _)| !k.starts_with("gateway.networking.k8s.io/"))
            .cloned()
            .collect(),
        None => own.iter().cloned().collect(),
    }
}

/// Merges string maps, later keys winning (the template's `toJsonMap`).
fn merged<'a>(maps: impl IntoIterator<Item = &'a Strings>) -> Value {
    let mut out = Map::new();
    for map in maps {
        for (k, v) in map {
            out.insert(k.clone(), Value::String(v.clone()));
        }
    }
    Value::Object(out)
}

fn strings<const N: usize>(pairs: [(&str, &str); N]) -> Strings {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels naming the Gateway and its class, and the managed label: every object has
/// them, over the copied labels (the template adds the first two, istiod's `apply` the last).
fn gateway_labels(input: &Input) -> Strings {
    strings([
        (GATEWAY_NAME_LABEL, &input.gateway.name),
        (GATEWAY_CLASS_LABEL, &input.gateway.class_name),
        (MANAGED_LABEL, MANAGED_LABEL_VALUE),
    ])
}

fn metadata(input: &Input, name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "name": name,
        "namespace": input.gateway.namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [{
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "name": input.gateway.name,
            "uid": input.gateway.uid,
        }],
    })
}

fn service_account(input: &Input) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            input,
            input.service_account,
            merged([&input.labels, &gateway_labels(input)]),
            merged([&input.annotations]),
        ),
    })
}

fn deployment(input: &Input) -> Value {
    let gateway = input.gateway;
    let pod_annotations = strings([
        (
            "istio.io/rev",
            match input.settings.revision.as_str() {
                "" => "default",
                revision => revision,
            },
        ),
        ("prometheus.io/path", "/stats/prometheus"),
        ("prometheus.io/port", "15020"),
        ("prometheus.io/scrape", "true"),
    ]);
    let pod_labels = strings([
        ("sidecar.istio.io/inject", "false"),
        ("istio.io/dataplane-mode", "none"),
        ("service.istio.io/canonical-name", input.name),
        ("service.istio.io/canonical-revision", "latest"),
    ]);
    let mut spec = json!({
        "selector": {"matchLabels": {GATEWAY_NAME_LABEL: gateway.name}},
        "template": {
            "metadata": {
                "annotations": merged([&input.annotations, &pod_annotations]),
                "labels": merged([&pod_labels, &input.labels, &gateway_labels(input)]),
            },
            "spec": {
                "serviceAccountName": input.service_account,
                "containers": [container(input)],
                "volumes": volumes(),
            },
        },
    });
    if let Some(replicas) = input.settings.replicas {
        spec["replicas"] = json!(replicas);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(
            input,
            input.name,
            merged([&input.labels, &gateway_labels(input)]),
            merged([&input.annotations]),
        ),
        "spec": spec,
    })
}

/// The `istio-proxy` container.
fn container(input: &Input) -> Value {
    let gateway = input.gateway;
    let settings = input.settings;
    let image = annotation(gateway, "sidecar.istio.io/proxyImage")
        .filter(|image| image.contains('/'))
        .unwrap_or(&settings.image);
    let log_level = |key: &str, default: &'static str| -> Value {
        annotation(gateway, key).unwrap_or(default).into()
    };
    let mut container = json!({
        "name": "istio-proxy",
        "image": image,
        "args": [
            "proxy",
            "waypoint",
            "--domain",
            format!("$(POD_NAMESPACE).svc.{}", settings.domain),
            "--serviceCluster",
            format!("{}.$(POD_NAMESPACE)", input.service_account),
            "--proxyLogLevel",
            log_level("sidecar.istio.io/logLevel", "warning"),
            "--proxyComponentLogLevel",
            log_level("sidecar.istio.io/componentLogLevel", "misc:error"),
            "--log_output_level",
            log_level("sidecar.istio.io/agentLogLevel", "default:info"),
        ],
        "env": env(input),
        "ports": [
            {"containerPort": 15020, "name": "metrics", "protocol": "TCP"},
            {"containerPort": 15021, "name": "status-port", "protocol": "TCP"},
            {"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"},
        ],
        "startupProbe": probe(1, 1, 30),
        "readinessProbe": probe(0, 15, 4),
        "securityContext": {
            "privileged": false,
            "runAsGroup": 1337,
            "runAsUser": 1337,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"mountPath": "/var/run/secrets/workload-spiffe-uds", "name": "workload-socket"},
            {"mountPath": "/var/run/secrets/istio", "name": "istiod-ca-cert"},
            {"mountPath": "/var/lib/istio/data", "name": "istio-data"},
            {"mountPath": "/etc/istio/proxy", "name": "istio-envoy"},
            {"mountPath": "/var/run/secrets/tokens", "name": "istio-token"},
            {"mountPath": "/etc/istio/pod", "name": "istio-podinfo"},
        ],
    });
    if let Some(policy) = settings
        .image_pull_policy
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        container["imagePullPolicy"] = policy.into();
    }
    let resources = match &settings.resources {
        Some(resources) => without_nulls(resources),
        None => default_resources(),
    };
    if resources.as_object().is_some_and(|r| !r.is_empty()) {
        container["resources"] = resources;
    }
    container
}

/// The chart's `values.global.waypoint.resources`.
pub fn default_resources() -> Value {
    json!({
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    })
}

/// The value with null map entries removed, and maps left empty by that removed too (the
/// template's `omitNil`), so `cpu: null` means "no CPU figure".
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let out: Map<String, Value> = map
                .iter()
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .filter(|(_, v)| !v.is_null())
                .collect();
            if out.is_empty() && !map.is_empty() {
                Value::Null
            } else {
                Value::Object(out)
            }
        }
        other => other.clone(),
    }
}

fn probe(initial_delay: u32, period: u32, failure_threshold: u32) -> Value {
    json!({
        "failureThreshold": failure_threshold,
        "httpGet": {"path": "/healthz/ready", "port": 15021, "scheme": "HTTP"},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "successThreshold": 1,
        "timeoutSeconds": 1,
    })
}

fn field_ref(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

fn resource_ref(name: &str, resource: &str) -> Value {
    json!({"name": name, "valueFrom": {"resourceFieldRef": {"divisor": "1", "resource": resource}}})
}

fn value(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

/// The container's environment, in the template's order.
fn env(input: &Input) -> Vec<Value> {
    let settings = input.settings;
    let namespace = &input.gateway.namespace;
    // istiod writes ProxyConfig fields that differ from pilot-agent's defaults.
    let proxy_config = if settings.istiod_address == DEFAULT_DISCOVERY_ADDRESS {
        "{}\n".to_string()
    } else {
        format!("{}\n", json!({"discoveryAddress": settings.istiod_address}))
    };
    let cluster_id = match settings.cluster_id.as_str() {
        "" => "Kubernetes",
        id => id,
    };
    let network = input
        .labels
        .get(NETWORK_LABEL)
        .filter(|n| !n.is_empty())
        .unwrap_or(&settings.network);
    let mesh_id = match settings.mesh_id.as_str() {
        "" => &settings.trust_domain,
        id => id,
    };
    let mut env = vec![
        field_ref("ISTIO_META_SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_ref("ISTIO_META_NODE_NAME", "spec.nodeName"),
        value("PILOT_CERT_PROVIDER", "istiod"),
        value("CA_ADDR", &settings.istiod_address),
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_NAMESPACE", "metadata.namespace"),
        field_ref("INSTANCE_IP", "status.podIP"),
        field_ref("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_ref("HOST_IP", "status.hostIP"),
        resource_ref("ISTIO_CPU_LIMIT", "limits.cpu"),
        value("PROXY_CONFIG", &proxy_config),
        resource_ref("GOMEMLIMIT", "limits.memory"),
        value("ISTIO_META_CLUSTER_ID", cluster_id),
    ];
    if !network.is_empty() {
        env.push(value("ISTIO_META_NETWORK", network));
    }
    env.push(value("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"));
    env.push(value("ISTIO_META_WORKLOAD_NAME", input.name));
    env.push(value(
        "ISTIO_META_OWNER",
        &format!(
            "kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/{}",
            input.name
        ),
    ));
    if !mesh_id.is_empty() {
        env.push(value("ISTIO_META_MESH_ID", mesh_id));
    }
    if !settings.trust_domain.is_empty() {
        env.push(value("TRUST_DOMAIN", &settings.trust_domain));
    }
    env
}

/// The pod's volumes, in the template's order. `workload-socket` is an `emptyDir: {}`: the
/// template writes a null `emptyDir`, which the API server defaults to the same.
fn volumes() -> Value {
    json!([
        {"emptyDir": {}, "name": "workload-socket"},
        {"emptyDir": {"medium": "Memory"}, "name": "istio-envoy"},
        {"emptyDir": {"medium": "Memory"}, "name": "go-proxy-envoy"},
        {"emptyDir": {}, "name": "istio-data"},
        {"emptyDir": {}, "name": "go-proxy-data"},
        {
            "downwardAPI": {"items": [
                {"fieldRef": {"fieldPath": "metadata.labels"}, "path": "labels"},
                {"fieldRef": {"fieldPath": "metadata.annotations"}, "path": "annotations"},
            ]},
            "name": "istio-podinfo",
        },
        {
            "name": "istio-token",
            "projected": {"sources": [{"serviceAccountToken": {
                "audience": "istio-ca",
                "expirationSeconds": 43200,
                "path": "istio-token",
            }}]},
        },
        {"configMap": {"name": "istio-ca-root-cert"}, "name": "istiod-ca-cert"},
    ])
}

fn service(input: &Input) -> Value {
    let gateway = input.gateway;
    // The deprecated annotation still sets the type, as in istiod.
    let service_type =
        annotation(gateway, "networking.istio.io/service-type").unwrap_or("ClusterIP");
    let mut spec = json!({
        "ipFamilyPolicy": "PreferDualStack",
        "ports": service_ports(&gateway.listeners),
        "selector": {GATEWAY_NAME_LABEL: gateway.name},
        "type": service_type,
    });
    if let (Some((_, ip)), "LoadBalancer") = (gateway.spec_addresses.first(), service_type) {
        spec["loadBalancerIP"] = ip.as_str().into();
    }
    let traffic = strings([("networking.istio.io/traffic-distribution", "PreferClose")]);
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            input,
            input.name,
            merged([&input.labels, &gateway_labels(input)]),
            merged([&traffic, &input.annotations]),
        ),
        "spec": spec,
    })
}

/// The Service's ports: `status-port` 15021, then one per distinct listener port, named
/// after its listener (`.` made `-`, at most 63 bytes, made unique with `-<port>`), with the
/// lower-cased listener protocol as its appProtocol (`hbone` for the standard listener).
fn service_ports(listeners: &[ListenerInfo]) -> Vec<Value> {
    let mut ports = vec![json!({
        "name": "status-port",
        "port": 15021,
        "protocol": "TCP",
        "appProtocol": "tcp",
    })];
    let mut seen = BTreeSet::new();
    let mut used = BTreeSet::from(["status-port".to_string()]);
    for (i, listener) in listeners.iter().enumerate() {
        if !seen.insert(listener.port) {
            continue;
        }
        let protocol = listener.protocol.to_lowercase();
        let mut name = truncated(&listener.name.replace('.', "-"), 63).to_string();
        if name.is_empty() {
            name = format!("{protocol}-{i}");
        }
        ports.push(json!({
            "name": unique_port_name(&name, listener.port, &mut used),
            "port": listener.port,
            "protocol": "TCP",
            "appProtocol": protocol,
        }));
    }
    ports
}

/// `name` cut to at most `max` bytes (on a character boundary; istiod cuts bytes).
fn truncated(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// istiod's `uniquePortName`: the name, or if taken the name with `-<port>` (then `-<port>x`,
/// `-<port>xx`, …), cut to fit 63 bytes.
fn unique_port_name(name: &str, port: u16, used: &mut BTreeSet<String>) -> String {
    let name = truncated(name, 63);
    let mut candidate = name.to_string();
    let mut suffix = format!("-{port}");
    while used.contains(&candidate) {
        let room = 63usize.saturating_sub(suffix.len());
        candidate = format!("{}{suffix}", truncated(name, room));
        suffix.push('x');
    }
    used.insert(candidate.clone());
    candidate
}

/// Keeps an existing Deployment's pre-1.24 selector (`istio.io/gateway-name`), which
/// Kubernetes does not let change: when `existing` selects on it, the rendered Deployment
/// takes `existing`'s selector and its pod template label of that name, as istiod's `apply`
/// does.
pub fn reuse_legacy_selector(deployment: &mut Value, existing: Option<&Value>) {
    let Some(existing) = existing else {
        return;
    };
    let selector = &existing["spec"]["selector"];
    let legacy = selector["matchLabels"][LEGACY_GATEWAY_NAME_LABEL]
        .as_str()
        .unwrap_or_default();
    if legacy.is_empty() {
        return;
    }
    let label = existing["spec"]["template"]["metadata"]["labels"][LEGACY_GATEWAY_NAME_LABEL]
        .as_str()
        .unwrap_or_default();
    deployment["spec"]["selector"] = selector.clone();
    deployment["spec"]["template"]["metadata"]["labels"][LEGACY_GATEWAY_NAME_LABEL] = label.into();
}

#[cfg(test)]
mod tests;
