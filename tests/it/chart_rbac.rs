//! The chart's RBAC against every API call ambientd makes: the rules rendered by the real Helm
//! engine (see tests/it/chart.rs) must allow each call, and nothing broader: no wildcards, no
//! deletes, no Secrets outside its own namespace. Also the evaluator itself, on hand-written
//! RBAC.
//!
//! Without the engine these tests fail under CI (`CI` set) and skip, loudly, elsewhere.

use crate::support::chart as chart_support;

use ambientd::kube::cluster::{WatchedKind, watched_kinds};
use chart_support::*;
use serde_json::json;

const NS: &str = "istio-system";

/// Every call ambientd makes to the API server, as docs/deployment.md lists them ("Every API
/// call"). tests/it/chart_rbac_calls.rs checks the chart against the calls whole replicas really
/// make; this list needs no fake API server and covers a second release namespace.
fn api_calls<'a>(own: &'a str, watched: &'a [WatchedKind]) -> Vec<ApiCall<'a>> {
    let mut calls = Vec::new();
    // The watched kinds: a cluster-wide list, then a watch. From the code's own list.
    for kind in watched {
        for verb in ["list", "watch"] {
            calls.push(ApiCall::new(
                verb,
                &kind.resource.group,
                &kind.resource.plural,
            ));
        }
    }
    // The CA reviews ztunnel's tokens.
    calls.push(ApiCall::new(
        "create",
        "authentication.k8s.io",
        "tokenreviews",
    ));
    // Leader election, in its own namespace.
    calls.push(ApiCall::new("create", "coordination.k8s.io", "leases").ns(own));
    for verb in ["get", "patch"] {
        calls.push(
            ApiCall::new(verb, "coordination.k8s.io", "leases")
                .ns(own)
                .named("ambientd-leader"),
        );
    }
    // The CA's Secrets, in its own namespace (list and watch by a metadata.name selector).
    for name in ["istio-ca-secret", "cacerts"] {
        for verb in ["get", "list", "watch"] {
            calls.push(ApiCall::new(verb, "", "secrets").ns(own).named(name));
        }
    }
    calls.push(ApiCall::new("create", "", "secrets").ns(own));
    // The root-cert ConfigMap in every namespace, watched cluster-wide by name.
    for verb in ["list", "watch"] {
        calls.push(ApiCall::new(verb, "", "configmaps").named("istio-ca-root-cert"));
    }
    for namespace in [own, "default", "bookinfo", "kube-system"] {
        calls.push(ApiCall::new("create", "", "configmaps").ns(namespace));
        calls.push(
            ApiCall::new("patch", "", "configmaps")
                .ns(namespace)
                .named("istio-ca-root-cert"),
        );
    }
    // Status of the objects served: read, then patched.
    for (group, resource) in [
        ("security.istio.io", "authorizationpolicies"),
        ("networking.istio.io", "serviceentries"),
        ("networking.istio.io", "workloadentries"),
        ("", "services"),
    ] {
        for verb in ["get", "patch"] {
            calls.push(
                ApiCall::new(verb, group, resource)
                    .sub("status")
                    .ns("bookinfo")
                    .named("x"),
            );
        }
    }
    // Route status, by the waypoint controller's route task.
    for resource in ["httproutes", "grpcroutes"] {
        calls.push(
            ApiCall::new("patch", "gateway.networking.k8s.io", resource)
                .sub("status")
                .ns("bookinfo")
                .named("x"),
        );
    }
    calls
}

#[test]
fn rbac_allows_every_call_ambientd_makes() {
    let Some(helm) = engine() else { return };
    for namespace in [NS, "mesh-system"] {
        let rendered = helm.render(json!({}), namespace);
        let watched = watched_kinds();
        let denied: Vec<_> = api_calls(namespace, &watched)
            .into_iter()
            .filter(|call| !rbac_allows(&rendered.objects, call))
            .collect();
        assert!(denied.is_empty(), "denied in {namespace}: {denied:#?}");
    }
}

#[test]
fn rbac_is_least_privilege() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(json!({}), NS);
    let objects = &rendered.objects;
    // No wildcard anywhere, and nothing that deletes, escalates or impersonates.
    for object in objects {
        let rules = match object {
            Object::ClusterRole(r) => r.rules.clone(),
            Object::Role(r) => r.rules.clone(),
            _ => continue,
        };
        for rule in rules.iter().flatten() {
            let all = rule
                .verbs
                .iter()
                .chain(rule.api_groups.iter().flatten())
                .chain(rule.resources.iter().flatten());
            for word in all {
                assert!(!word.contains('*'), "wildcard {word:?} in {rule:?}");
            }
            for verb in &rule.verbs {
                // No update either: ambientd only patches.
                assert!(
                    ["get", "list", "watch", "create", "patch"].contains(&verb.as_str()),
                    "{verb} in {rule:?}"
                );
            }
            assert!(rule.non_resource_urls.is_none(), "{rule:?}");
        }
    }
    let all_verbs = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    // Secrets: nothing outside its own namespace, and only the CA's by name inside it.
    for verb in all_verbs {
        for name in [None, Some("istio-ca-secret"), Some("cacerts")] {
            for namespace in [None, Some("default"), Some("kube-system")] {
                let call = ApiCall {
                    name,
                    namespace,
                    ..ApiCall::new(verb, "", "secrets")
                };
                assert!(!rbac_allows(objects, &call), "{call:?}");
            }
        }
        if verb != "create" {
            let call = ApiCall::new(verb, "", "secrets")
                .ns(NS)
                .named("someone-elses");
            assert!(!rbac_allows(objects, &call), "{call:?}");
            let call = ApiCall::new(verb, "", "secrets").ns(NS);
            assert!(!rbac_allows(objects, &call), "an unnamed {verb} of secrets");
        }
        if !["get", "list", "watch", "create"].contains(&verb) {
            let call = ApiCall::new(verb, "", "secrets")
                .ns(NS)
                .named("istio-ca-secret");
            assert!(!rbac_allows(objects, &call), "{call:?}");
        }
        // Leases only in its own namespace.
        let call = ApiCall::new(verb, "coordination.k8s.io", "leases")
            .ns("default")
            .named("ambientd");
        assert!(!rbac_allows(objects, &call), "{call:?}");
    }
    // The watched kinds are only read, and never written; their objects' status only patched.
    // Except what the waypoint controller writes: it applies each waypoint's Service (a
    // patch; RBAC cannot name objects that do not exist yet, as with istiod's own rules) and
    // creates GatewayClass istio-waypoint (a create carries no name).
    let waypoint_writes = [
        ("patch", "", "services"),
        ("create", "gateway.networking.k8s.io", "gatewayclasses"),
    ];
    for kind in watched_kinds() {
        let (group, plural) = (kind.resource.group.as_str(), kind.resource.plural.as_str());
        for verb in [
            "get",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ] {
            if waypoint_writes.contains(&(verb, group, plural)) {
                continue;
            }
            let call = ApiCall::new(verb, group, plural).ns("bookinfo").named("x");
            assert!(!rbac_allows(objects, &call), "{call:?}");
        }
        let call = ApiCall::new("update", group, plural)
            .sub("status")
            .ns("bookinfo")
            .named("x");
        assert!(!rbac_allows(objects, &call), "{call:?}");
    }
    for call in [
        ApiCall::new("patch", "", "pods")
            .sub("status")
            .ns("bookinfo")
            .named("x"),
        ApiCall::new("delete", "", "configmaps")
            .ns("bookinfo")
            .named("istio-ca-root-cert"),
        // Only the root ConfigMap, by name: no other ConfigMap is read or patched.
        ApiCall::new("list", "", "configmaps"),
        ApiCall::new("get", "", "configmaps")
            .ns("bookinfo")
            .named("istio-ca-root-cert"),
        ApiCall::new("patch", "", "configmaps")
            .ns("bookinfo")
            .named("someone-elses"),
        ApiCall::new("patch", "coordination.k8s.io", "leases")
            .ns(NS)
            .named("istio-leader"),
        ApiCall::new("update", "gateway.networking.k8s.io", "gateways")
            .sub("status")
            .ns("bookinfo")
            .named("x"),
        ApiCall::new("delete", "apps", "deployments")
            .ns("bookinfo")
            .named("x"),
        ApiCall::new("create", "", "pods")
            .sub("eviction")
            .ns("bookinfo"),
        ApiCall::new("create", "authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(!rbac_allows(objects, &call), "{call:?}");
    }
}

/// Each rule is rendered only while the feature that needs it is on.
#[test]
fn rules_follow_the_features_turned_on() {
    let Some(helm) = engine() else { return };
    let status = ApiCall::new("patch", "", "services")
        .sub("status")
        .ns("bookinfo")
        .named("x");
    let root = ApiCall::new("create", "", "configmaps").ns("bookinfo");
    let secret = ApiCall::new("create", "", "secrets").ns(NS);
    let lease = ApiCall::new("create", "coordination.k8s.io", "leases").ns(NS);
    let waypoint = ApiCall::new("patch", "apps", "deployments")
        .ns("bookinfo")
        .named("waypoint");
    let rendered = helm.render(json!({}), NS);
    for call in [&status, &root, &secret, &lease, &waypoint] {
        assert!(rbac_allows(&rendered.objects, call), "{call:?}");
    }
    for (values, gone) in [
        (json!({"writeStatus": false}), &status),
        (json!({"rootConfigMaps": false}), &root),
        (json!({"waypoints": {"controller": false}}), &waypoint),
        (json!({"ca": {"mode": "cacerts"}}), &secret),
        (
            json!({"replicaCount": 1, "ca": {"secrets": false}}),
            &secret,
        ),
        (
            json!({"replicaCount": 1, "leaderElection": {"enabled": false}}),
            &lease,
        ),
    ] {
        let rendered = helm.render(values.clone(), NS);
        assert!(!rbac_allows(&rendered.objects, gone), "{values}: {gone:?}");
    }
    // The IP auto-allocator's status patch stays without the status writer, and goes with
    // the allocator.
    let allocate = ApiCall::new("patch", "networking.istio.io", "serviceentries")
        .sub("status")
        .ns("bookinfo")
        .named("x");
    let read = ApiCall::new("get", "networking.istio.io", "serviceentries")
        .sub("status")
        .ns("bookinfo")
        .named("x");
    let rendered = helm.render(json!({"writeStatus": false}), NS);
    assert!(rbac_allows(&rendered.objects, &allocate));
    assert!(!rbac_allows(&rendered.objects, &read));
    let rendered = helm.render(
        json!({"writeStatus": false, "ipAutoallocate": {"enabled": false}}),
        NS,
    );
    assert!(!rbac_allows(&rendered.objects, &allocate));
    // A renamed Lease is the one granted.
    let rendered = helm.render(json!({"leaderElection": {"leaseName": "mesh-leader"}}), NS);
    let renew = |name| {
        ApiCall::new("patch", "coordination.k8s.io", "leases")
            .ns(NS)
            .named(name)
    };
    assert!(rbac_allows(&rendered.objects, &renew("mesh-leader")));
    assert!(!rbac_allows(&rendered.objects, &renew("ambientd-leader")));
    // Neither Secrets nor a Lease: no Role at all.
    let rendered = helm.render(
        json!({"replicaCount": 1, "ca": {"mode": "cacerts"}, "leaderElection": {"enabled": false}}),
        NS,
    );
    assert!(
        !rendered.kinds().contains(&"Role"),
        "{:?}",
        rendered.kinds()
    );
    assert!(!rendered.kinds().contains(&"RoleBinding"));
}

/// The evaluator itself, on hand-written RBAC: bindings, namespaces, names, subresources.
#[test]
fn the_rbac_evaluator_follows_kubernetes_rules() {
    let yaml = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: me, namespace: home}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [list]}
- {apiGroups: [apps], resources: [deployments/scale], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: ServiceAccount, name: me, namespace: home}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: unbound}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cm-writer}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: cm-writer, namespace: elsewhere}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cm-writer}
subjects: [{kind: ServiceAccount, name: me, namespace: home}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: own, namespace: home}
rules:
- {apiGroups: [""], resources: [secrets], resourceNames: [mine], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: own, namespace: home}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: own}
subjects: [{kind: ServiceAccount, name: me, namespace: home}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: someone-else, namespace: home}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: unbound}
subjects: [{kind: ServiceAccount, name: me, namespace: other}]
"#;
    let objects = parse(yaml);
    let allows = |call: ApiCall| rbac_allows(&objects, &call);
    // A ClusterRoleBinding: cluster-wide and in every namespace; verbs are exact.
    assert!(allows(ApiCall::new("list", "", "pods")));
    assert!(allows(ApiCall::new("list", "", "pods").ns("any")));
    assert!(!allows(ApiCall::new("watch", "", "pods")));
    assert!(!allows(ApiCall::new("list", "apps", "pods")));
    // A subresource must be named as such.
    assert!(allows(
        ApiCall::new("patch", "apps", "deployments")
            .sub("scale")
            .ns("x")
    ));
    assert!(!allows(
        ApiCall::new("patch", "apps", "deployments").ns("x")
    ));
    assert!(!allows(ApiCall::new("list", "", "pods").sub("log").ns("x")));
    // A ClusterRole through a RoleBinding: only in that namespace.
    assert!(allows(
        ApiCall::new("update", "", "configmaps").ns("elsewhere")
    ));
    assert!(!allows(ApiCall::new("update", "", "configmaps").ns("home")));
    assert!(!allows(ApiCall::new("update", "", "configmaps")));
    // resourceNames: only calls naming one of them.
    assert!(allows(
        ApiCall::new("get", "", "secrets").ns("home").named("mine")
    ));
    assert!(!allows(
        ApiCall::new("get", "", "secrets")
            .ns("home")
            .named("theirs")
    ));
    assert!(!allows(ApiCall::new("list", "", "secrets").ns("home")));
    assert!(!allows(
        ApiCall::new("get", "", "secrets")
            .ns("elsewhere")
            .named("mine")
    ));
    // A role bound to someone else, or bound to no one, grants nothing.
    assert!(!allows(ApiCall::new("get", "", "nodes").named("n")));
    assert!(!allows(
        ApiCall::new("get", "", "nodes").ns("home").named("n")
    ));
}
