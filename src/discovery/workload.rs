//! Pod -> `istio.workload.Workload`, per conversion.md §1.1 and the services map of §1.3.

use std::collections::BTreeMap;

use crate::discovery::index::{Objects, Settings};
use crate::discovery::model::{Labels, Pod, Protocol, Service, TargetPort, selects};
use crate::discovery::names::{ip_bytes, pod_uid, service_hostname, service_key};
use crate::pb::workload::{
    Locality, NetworkMode, Port, PortList, TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};

const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";
const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// Builds the Workload for a pod, or `None` when istiod would emit none: a terminal pod
/// (`Succeeded`/`Failed`) or a pod without an IP. A `Pending` pod with an IP is emitted.
pub fn build(settings: &Settings, objects: &Objects, pod: &Pod) -> Option<Workload> {
    if matches!(pod.phase.as_str(), "Succeeded" | "Failed") || pod.ips.is_empty() {
        return None;
    }
    let workload_name = workload_name(pod);
    let (tunnel_protocol, native_tunnel) = tunnel_protocol(&pod.labels, &pod.annotations);
    let healthy = pod.ready && !pod.terminating;
    Some(Workload {
        uid: pod_uid(&settings.cluster_id, &pod.namespace, &pod.name),
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        addresses: pod.ips.iter().map(ip_bytes).collect(),
        network: objects.network(settings).to_string(),
        tunnel_protocol: tunnel_protocol as i32,
        native_tunnel,
        trust_domain: settings.wire_trust_domain().to_string(),
        service_account: pod.service_account.clone(),
        node: pod.node_name.clone(),
        canonical_name: canonical_name(&pod.labels, &workload_name),
        canonical_revision: canonical_revision(&pod.labels),
        workload_type: WorkloadType::Pod as i32,
        workload_name,
        services: services_map(settings, objects, pod),
        status: if healthy {
            WorkloadStatus::Healthy
        } else {
            WorkloadStatus::Unhealthy
        } as i32,
        cluster_id: settings.cluster_id.clone(),
        locality: locality(objects, &pod.node_name),
        network_mode: if pod.host_network {
            NetworkMode::HostNetwork
        } else {
            NetworkMode::Standard
        } as i32,
        ..Default::default()
    })
}

/// The deployment-ish name istiod derives from a pod's controller (`GetDeployMetaFromPod`),
/// overridden by the `service.istio.io/workload-name` label.
pub fn workload_name(pod: &Pod) -> String {
    if let Some(name) = pod.labels.get(WORKLOAD_NAME_LABEL) {
        return name.clone();
    }
    let owner = match &pod.owner {
        Some(owner) if !pod.generate_name.is_empty() => owner,
        _ => return pod.name.clone(),
    };
    let label = |key: &str| pod.labels.get(key).filter(|v| !v.is_empty());
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = label("pod-template-hash").or_else(|| label("rollouts-pod-template-hash"));
            match hash {
                Some(hash) if owner.name.ends_with(hash.as_str()) => owner
                    .name
                    .strip_suffix(&format!("-{hash}"))
                    .unwrap_or(&owner.name)
                    .to_string(),
                _ => owner.name.clone(),
            }
        }
        "ReplicationController" => label("deploymentconfig")
            .cloned()
            .unwrap_or_else(|| owner.name.clone()),
        "Job" => cron_job_name(&owner.name)
            .unwrap_or(&owner.name)
            .to_string(),
        _ => owner.name.clone(),
    }
}

/// `(.+)-\d{8,10}$`: a Job created by a CronJob carries a minute timestamp suffix.
fn cron_job_name(job: &str) -> Option<&str> {
    let digits = job.bytes().rev().take_while(u8::is_ascii_digit).count();
    if !(8..=10).contains(&digits) {
        return None;
    }
    let prefix = job[..job.len() - digits].strip_suffix('-')?;
    (!prefix.is_empty()).then_some(prefix)
}

fn first_label<'a>(labels: &'a Labels, keys: &[&str]) -> Option<&'a String> {
    keys.iter().find_map(|k| labels.get(*k))
}

/// First of `service.istio.io/canonical-name`, `app.kubernetes.io/name`, `app`; else the
/// workload name.
pub fn canonical_name(labels: &Labels, workload_name: &str) -> String {
    first_label(
        labels,
        &[
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ],
    )
    .cloned()
    .unwrap_or_else(|| workload_name.to_string())
}

/// First of `service.istio.io/canonical-revision`, `app.kubernetes.io/version`, `version`; else
/// `latest`.
pub fn canonical_revision(labels: &Labels) -> String {
    first_label(
        labels,
        &[
            "service.istio.io/canonical-revision",
            "app.kubernetes.io/version",
            "version",
        ],
    )
    .cloned()
    .unwrap_or_else(|| "latest".to_string())
}

/// HBONE when istio-cni marked the pod redirected, or when the tunnel label lists `http` (then
/// also `native_tunnel`). Never LEGACY_ISTIO_MTLS: ztunnel rejects it, and istiod never sends it.
pub fn tunnel_protocol(labels: &Labels, annotations: &Labels) -> (TunnelProtocol, bool) {
    if annotations
        .get(REDIRECTION_ANNOTATION)
        .is_some_and(|v| v == "enabled")
    {
        return (TunnelProtocol::Hbone, false);
    }
    if labels
        .get(TUNNEL_LABEL)
        .is_some_and(|v| v.split(',').any(|p| p == "http"))
    {
        return (TunnelProtocol::Hbone, true);
    }
    (TunnelProtocol::None, false)
}

/// Locality from the pod's Node labels; `None` when the node is unknown or has none of them.
fn locality(objects: &Objects, node_name: &str) -> Option<Locality> {
    let node = objects.nodes.get(node_name)?;
    let get = |key: &str| node.labels.get(key).cloned().unwrap_or_default();
    let locality = Locality {
        region: get(REGION_LABEL),
        zone: get(ZONE_LABEL),
        subzone: get(SUBZONE_LABEL),
    };
    (locality != Locality::default()).then_some(locality)
}

/// The services map: every Service in the pod's namespace whose non-empty selector matches the
/// pod's labels, with target ports resolved for this pod.
fn services_map(settings: &Settings, objects: &Objects, pod: &Pod) -> BTreeMap<String, PortList> {
    objects
        .services_in(&pod.namespace)
        .filter(|svc| !svc.external_name && selects(&svc.selector, &pod.labels))
        .map(|svc| {
            let hostname = service_hostname(&svc.name, &svc.namespace, &settings.domain);
            (
                service_key(&svc.namespace, &hostname),
                PortList {
                    ports: workload_ports(svc, pod),
                },
            )
        })
        .collect()
}

/// A Service's ports as seen by one pod: a named target port resolves to the pod's TCP
/// container port of that name, and is omitted when the pod has none.
pub fn workload_ports(svc: &Service, pod: &Pod) -> Vec<Port> {
    svc.ports
        .iter()
        .filter_map(|port| {
            let target_port = match &port.target_port {
                TargetPort::Number(n) => *n,
                TargetPort::Name(name) => {
                    pod.ports
                        .iter()
                        .find(|c| c.protocol == Protocol::Tcp && &c.name == name)?
                        .port
                }
            };
            Some(Port {
                service_port: u32::from(port.port),
                target_port: u32::from(target_port),
                app_protocol: 0,
            })
        })
        .collect()
}
