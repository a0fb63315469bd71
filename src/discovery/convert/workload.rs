//! Pod -> `istio.workload.Workload`, its services map included, per docs/conversion.md, "Pod →
//! Workload".

use crate::discovery::convert::membership::{self, Member};
use crate::discovery::convert::network_gateway;
use crate::discovery::convert::policies;
use crate::discovery::convert::waypoint;
use crate::discovery::model::Key;
use crate::discovery::model::{Labels, Pod};
use crate::discovery::names::{ip_bytes, pod_uid};
use crate::discovery::settings::Settings;
use crate::discovery::store::Store;
use crate::pb::workload::{
    Locality, NetworkMode, TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};

pub(crate) const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";
const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// Builds the Workload for a pod, or `None` when istiod would emit none: a terminal pod
/// (`Succeeded`/`Failed`) or a pod without an IP. A `Pending` pod with an IP is emitted.
/// Waypoints consulted are pushed to `reads`.
pub(crate) fn build(
    settings: &Settings,
    store: &Store,
    pod: &Pod,
    reads: &mut Vec<Key>,
) -> Option<Workload> {
    if matches!(pod.phase(), "Succeeded" | "Failed") || pod.ips().len() == 0 {
        return None;
    }
    let workload_name = workload_name(pod);
    let (tunnel_protocol, native_tunnel) =
        tunnel_protocol(pod.labels(), pod.annotation(REDIRECTION_ANNOTATION));
    let healthy = pod.ready() && !pod.terminating();
    // A waypoint's own pods never use a waypoint; they may carry its inbound binding.
    let (binding, application_tunnel) =
        waypoint::workload_binding(store, pod.namespace(), pod.labels(), reads);
    let services = membership::services_map(settings, store, pod.namespace(), Member::Pod(pod));
    let mut authorization_policies =
        policies::workload_policies(settings, store, pod.namespace(), pod.labels());
    authorization_policies.extend(policies::implicit_waypoint_references(
        settings,
        store,
        binding.key(),
        &services,
        reads,
    ));
    let waypoint = binding.into_address();
    Some(Workload {
        uid: pod_uid(&settings.cluster_id, pod.namespace(), pod.name()),
        name: pod.name().to_string(),
        namespace: pod.namespace().to_string(),
        addresses: pod.ips().map(|ip| ip_bytes(&ip)).collect(),
        network: store.network(settings).to_string(),
        network_gateway: network_gateway::for_network(store, store.network(settings)),
        tunnel_protocol: tunnel_protocol as i32,
        native_tunnel,
        trust_domain: settings.wire_trust_domain().to_string(),
        service_account: pod.service_account().to_string(),
        node: pod.node_name().to_string(),
        canonical_name: canonical_name(pod.labels(), &workload_name),
        canonical_revision: canonical_revision(pod.labels()),
        workload_type: WorkloadType::Pod as i32,
        workload_name,
        services,
        authorization_policies,
        waypoint,
        application_tunnel,
        status: if healthy {
            WorkloadStatus::Healthy
        } else {
            WorkloadStatus::Unhealthy
        } as i32,
        cluster_id: settings.cluster_id.clone(),
        locality: node_locality(store, pod.node_name()),
        network_mode: if pod.host_network() {
            NetworkMode::HostNetwork
        } else {
            NetworkMode::Standard
        } as i32,
        ..Default::default()
    })
}

/// The deployment-ish name istiod derives from a pod's controller (`GetDeployMetaFromPod`),
/// overridden by the `service.istio.io/workload-name` label.
pub(crate) fn workload_name(pod: &Pod) -> String {
    if let Some(name) = pod.labels().get(WORKLOAD_NAME_LABEL) {
        return name.to_string();
    }
    let owner = match pod.owner() {
        Some(owner) if !pod.generate_name().is_empty() => owner,
        _ => return pod.name().to_string(),
    };
    let label = |key: &str| pod.labels().get(key).filter(|v| !v.is_empty());
    match owner.kind {
        // A Deployment's hash, else an Argo Rollout's: each only if the name ends with it.
        "ReplicaSet" => ["pod-template-hash", "rollouts-pod-template-hash"]
            .into_iter()
            .filter_map(label)
            .find(|hash| owner.name.ends_with(hash))
            .map_or(owner.name, |hash| {
                owner
                    .name
                    .strip_suffix(&format!("-{hash}"))
                    .unwrap_or(owner.name)
            })
            .to_string(),
        "ReplicationController" => label("deploymentconfig").unwrap_or(owner.name).to_string(),
        "Job" => cron_job_name(owner.name).unwrap_or(owner.name).to_string(),
        _ => owner.name.to_string(),
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

fn first_label<'a>(labels: &'a Labels, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| labels.get(k))
}

/// First of `service.istio.io/canonical-name`, `app.kubernetes.io/name`, `app`; else the
/// workload name.
pub(crate) fn canonical_name(labels: &Labels, workload_name: &str) -> String {
    first_label(
        labels,
        &[
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ],
    )
    .map(str::to_string)
    .unwrap_or_else(|| workload_name.to_string())
}

/// First of `service.istio.io/canonical-revision`, `app.kubernetes.io/version`, `version`; else
/// `latest`.
pub(crate) fn canonical_revision(labels: &Labels) -> String {
    first_label(
        labels,
        &[
            "service.istio.io/canonical-revision",
            "app.kubernetes.io/version",
            "version",
        ],
    )
    .map(str::to_string)
    .unwrap_or_else(|| "latest".to_string())
}

/// istiod's `setTunnelProtocol`, both steps applied in order: HBONE when istio-cni marked the
/// pod redirected (`redirection`, the value of the [`REDIRECTION_ANNOTATION`]); then HBONE with
/// `native_tunnel` when the tunnel label lists `http`, whether or not the annotation is set.
/// Never LEGACY_ISTIO_MTLS: ztunnel rejects it, and istiod never sends it.
pub(crate) fn tunnel_protocol(
    labels: &Labels,
    redirection: Option<&str>,
) -> (TunnelProtocol, bool) {
    let mut result = (TunnelProtocol::None, false);
    if redirection == Some("enabled") {
        result = (TunnelProtocol::Hbone, false);
    }
    if labels
        .get(TUNNEL_LABEL)
        .is_some_and(|v| v.split(',').any(|p| p == "http"))
    {
        result = (TunnelProtocol::Hbone, true);
    }
    result
}

/// Locality from the pod's Node labels; `None` when the node is unknown or has none of them.
fn node_locality(store: &Store, node_name: &str) -> Option<Locality> {
    let node = store.nodes().get(node_name)?;
    let get = |key: &str| node.labels.get(key).unwrap_or_default().to_string();
    let locality = Locality {
        region: get(REGION_LABEL),
        zone: get(ZONE_LABEL),
        subzone: get(SUBZONE_LABEL),
    };
    (locality != Locality::default()).then_some(locality)
}

/// `region/zone/subzone` as written on a ServiceEntry endpoint or WorkloadEntry, split as
/// istiod's `SplitLocalityLabel` does: the first three `/`-separated items, anything after the
/// third ignored. `None` when all three are empty (`""`, `"//"`), as `getWorkloadEntryLocality`.
pub(crate) fn parse_locality(text: &str) -> Option<Locality> {
    let mut parts = text.split('/').map(str::to_string);
    let locality = Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        subzone: parts.next().unwrap_or_default(),
    };
    (locality != Locality::default()).then_some(locality)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_set_falls_back_to_the_rollout_hash_when_the_deployment_hash_is_no_suffix() {
        use crate::discovery::model::pod::{Owner, PodFields};
        // (pod labels, ReplicaSet name, workload name)
        type Row = (
            &'static [(&'static str, &'static str)],
            &'static str,
            &'static str,
        );
        let table: &[Row] = &[
            (&[("pod-template-hash", "abc12")], "web-abc12", "web"),
            (&[("rollouts-pod-template-hash", "r9")], "roll-r9", "roll"),
            // pod-template-hash is present but not the owner's suffix: try the rollout hash.
            (
                &[
                    ("pod-template-hash", "zzz"),
                    ("rollouts-pod-template-hash", "r9"),
                ],
                "roll-r9",
                "roll",
            ),
            (&[("pod-template-hash", "zzz")], "web-abc12", "web-abc12"),
            // A suffix without the dash is kept, as strings.TrimSuffix(name, "-"+hash) does.
            (&[("pod-template-hash", "abc12")], "webabc12", "webabc12"),
        ];
        for (pod_labels, owner, want) in table {
            let pod = Pod::from(PodFields {
                name: "p-1".into(),
                namespace: "demo".into(),
                generate_name: "p-".into(),
                labels: pod_labels.iter().copied().collect(),
                owner: Some(Owner {
                    kind: "ReplicaSet".into(),
                    name: owner.to_string(),
                }),
                ..Default::default()
            });
            assert_eq!(workload_name(&pod), *want, "{pod_labels:?} {owner}");
        }
    }

    #[test]
    fn locality_takes_the_first_three_items_and_none_when_all_are_empty() {
        let locality = |region: &str, zone: &str, subzone: &str| Locality {
            region: region.into(),
            zone: zone.into(),
            subzone: subzone.into(),
        };
        let table = [
            ("", None),
            ("//", None),
            ("/", None),
            ("a", Some(locality("a", "", ""))),
            ("a/b", Some(locality("a", "b", ""))),
            ("a/b/c", Some(locality("a", "b", "c"))),
            // The third item, not the rest of the text.
            ("a/b/c/d", Some(locality("a", "b", "c"))),
            ("//c", Some(locality("", "", "c"))),
        ];
        for (text, want) in table {
            assert_eq!(parse_locality(text), want, "{text:?}");
        }
    }

    #[test]
    fn tunnel_label_sets_native_tunnel_even_when_the_pod_is_redirected() {
        let tunnel = Labels::from([(TUNNEL_LABEL, "http")]);
        assert_eq!(
            tunnel_protocol(&tunnel, Some("enabled")),
            (TunnelProtocol::Hbone, true)
        );
        assert_eq!(
            tunnel_protocol(&Labels::new(), Some("enabled")),
            (TunnelProtocol::Hbone, false)
        );
        assert_eq!(
            tunnel_protocol(&tunnel, Some("pending")),
            (TunnelProtocol::Hbone, true)
        );
        assert_eq!(
            tunnel_protocol(&Labels::new(), None),
            (TunnelProtocol::None, false)
        );
    }
}
