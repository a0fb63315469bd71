//! Scenario 7: the same mesh with its objects applied to a real kube-apiserver (etcd and
//! kube-apiserver from `AMBIENTD_ETCD` and `AMBIENTD_KUBE_APISERVER`, the upstream CRDs from
//! `AMBIENTD_CRDS`) that ambientd watches. Tokens come from the TokenRequest API and ambientd
//! checks them with TokenReviews; the CA is the Secret ambientd's leader creates, the
//! ztunnels' root the ConfigMap it writes; the waypoint's Service, ServiceAccount and
//! Deployment are written by ambientd's waypoint controller, and its Gateway's addresses by
//! its status writer.

use std::time::Duration;

use serde_json::Value;

use super::l4::cross_node;
use super::waypoint::through_the_waypoint;
use crate::bed::kube::ObjectRef;
use crate::bed::mesh::{Mesh, NAMESPACE};
use crate::bed::process::wait_for;

#[test]
fn on_kube_cross_node_carries_the_callers_identity() {
    let _serial = crate::serial();
    if let Some(mut mesh) = Mesh::start_on_kube(2) {
        cross_node(&mut mesh);
    }
}

#[test]
fn on_kube_waypoint_routes_enforces_l7_policy_and_is_the_only_way_in() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start_on_kube(2) else {
        return;
    };
    through_the_waypoint(&mut mesh);

    // What ambientd's leader wrote back, as istiod does: the Gateway Programmed with its
    // Service's address, the bound Service's WaypointBound, the L4 policy's ZtunnelAccepted.
    let api = mesh.api().expect("a mesh on kube");
    let condition = |object: &Value, kind: &str| {
        object["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == kind))
            .map(|c| c["status"] == "True")
            .unwrap_or(false)
    };
    let checks = [
        (
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "waypoint",
            "Programmed",
        ),
        ("v1", "Service", "c", "istio.io/WaypointBound"),
        (
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "c-via-waypoint",
            "ZtunnelAccepted",
        ),
    ];
    for (api_version, kind, name, wanted) in checks {
        wait_for(
            &format!("{kind} {name} to have {wanted}=True"),
            Duration::from_secs(30),
            || {
                api.get(&ObjectRef::new(api_version, kind, Some(NAMESPACE), name))
                    .filter(|object| condition(object, wanted))
            },
            || {
                format!(
                    "{:#}",
                    api.get(&ObjectRef::new(api_version, kind, Some(NAMESPACE), name))
                        .unwrap_or_default()["status"]
                )
            },
        );
    }
    let gateway = api
        .get(&ObjectRef::new(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            Some(NAMESPACE),
            "waypoint",
        ))
        .expect("the Gateway");
    let waypoint_ip = api
        .get(&ObjectRef::new(
            "v1",
            "Service",
            Some(NAMESPACE),
            "waypoint",
        ))
        .expect("the waypoint's Service")["spec"]["clusterIP"]
        .clone();
    assert_eq!(
        gateway["status"]["addresses"][0]["value"], waypoint_ip,
        "{gateway:#}"
    );
}
