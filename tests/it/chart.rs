//! The Helm chart (`charts/ambientd`), rendered and linted by the real Helm engine
//! (helm-python-sdk, which .ci/run installs): every document parses as its Kubernetes type,
//! the values reach the args, the args parse with ambientd's own CLI, and the pod is locked
//! down. The RBAC rules are checked in tests/it/chart_rbac.rs.
//!
//! Without the engine these tests fail under CI (`CI` set) and skip, loudly, elsewhere.

use crate::support::chart as chart_support;

use ambientd::config::{Cli, Command, Config};
use ambientd::kube::cluster::DiscoverySelectors;
use chart_support::*;
use clap::Parser;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

const NS: &str = "istio-system";

fn pod_spec(rendered: &Rendered) -> &PodSpec {
    let spec = rendered.deployment().spec.as_ref().expect("spec");
    spec.template.spec.as_ref().expect("pod spec")
}

fn container(rendered: &Rendered) -> &Container {
    let pod = pod_spec(rendered);
    assert_eq!(pod.containers.len(), 1, "one container");
    &pod.containers[0]
}

/// The container's args as ambientd's own CLI reads them, validated into a `Config`. The
/// mesh config path is swapped for a file holding the rendered ConfigMap's `mesh`.
fn parse_args(rendered: &Rendered) -> Config {
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = rendered
        .config_maps()
        .first()
        .and_then(|c| c.data.as_ref()?.get("mesh").cloned());
    let mesh_file = dir.path().join("mesh");
    if let Some(mesh) = &mesh {
        std::fs::write(&mesh_file, mesh).expect("write mesh");
    }
    let mut argv = vec!["ambientd".to_string()];
    for arg in rendered.args() {
        match arg.strip_prefix("--mesh-config=") {
            Some(_) => argv.push(format!("--mesh-config={}", mesh_file.display())),
            None => argv.push(arg),
        }
    }
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Command::Serve(args) = cli.command else {
        panic!("the container does not run `serve`: {argv:?}")
    };
    Config::try_from(*args).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

#[test]
fn default_values_render_lint_and_parse_as_kubernetes_types() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(json!({}), NS);
    assert_eq!(
        rendered.kinds(),
        vec![
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    );
    // Every namespaced object lands in the release namespace.
    for object in &rendered.objects {
        let namespace = match object {
            Object::ClusterRole(_) | Object::ClusterRoleBinding(_) => continue,
            Object::Deployment(o) => &o.metadata.namespace,
            Object::Service(o) => &o.metadata.namespace,
            Object::ServiceAccount(o) => &o.metadata.namespace,
            Object::ConfigMap(o) => &o.metadata.namespace,
            Object::Role(o) => &o.metadata.namespace,
            Object::RoleBinding(o) => &o.metadata.namespace,
            Object::PodDisruptionBudget(o) => &o.metadata.namespace,
        };
        assert_eq!(namespace.as_deref(), Some(NS), "{}", object.kind());
    }
    // The Deployment runs the chart's ServiceAccount, and the Service selects its pods.
    let pod = pod_spec(&rendered);
    assert_eq!(
        pod.service_account_name,
        rendered.service_account().metadata.name
    );
    let template_labels = rendered
        .deployment()
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selector = rendered
        .service()
        .spec
        .as_ref()
        .unwrap()
        .selector
        .clone()
        .unwrap();
    assert!(
        selector
            .iter()
            .all(|(k, v)| template_labels.get(k) == Some(v)),
        "{selector:?}"
    );
    let config = parse_args(&rendered);
    assert_eq!(config.settings.system_namespace, NS);
    assert_eq!(config.xds_address.port(), 15010);
    assert_eq!(config.debug_address.port(), 15014);
    assert_eq!(config.ca.as_ref().unwrap().xds_tls_address.port(), 15012);
}

#[test]
fn the_service_is_istiod_with_istiods_ports() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(json!({}), NS);
    let service = rendered.service();
    assert_eq!(service.metadata.name.as_deref(), Some("istiod"));
    let ports: Vec<(String, i32, Option<IntOrString>)> = service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.port, p.target_port.clone()))
        .collect();
    assert_eq!(
        ports,
        vec![
            ("grpc-xds".into(), 15010, Some(IntOrString::Int(15010))),
            ("https-dns".into(), 15012, Some(IntOrString::Int(15012))),
            (
                "http-monitoring".into(),
                15014,
                Some(IntOrString::Int(15014))
            ),
        ]
    );
    let container_ports: Vec<i32> = container(&rendered)
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(container_ports, vec![15010, 15012, 15014]);
}

#[test]
fn the_plaintext_port_can_be_closed() {
    let Some(helm) = engine() else { return };
    let open = helm.render(json!({}), NS);
    assert_eq!(open.flag("--xds-address"), ["0.0.0.0:15010"]);
    let rendered = helm.render(json!({"xds": {"plaintext": false}}), NS);
    assert_eq!(rendered.flag("--xds-address"), ["127.0.0.1:15010"]);
    let service_ports: Vec<i32> = rendered
        .service()
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.port)
        .collect();
    assert_eq!(service_ports, vec![15012, 15014]);
    let container_ports: Vec<i32> = container(&rendered)
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(container_ports, vec![15012, 15014]);
}

#[test]
fn probes_hit_ready_on_15014() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(json!({}), NS);
    let container = container(&rendered);
    let readiness = container.readiness_probe.as_ref().expect("readiness probe");
    let get = readiness.http_get.as_ref().expect("HTTP readiness");
    assert_eq!(get.path.as_deref(), Some("/ready"));
    assert_eq!(get.port, IntOrString::Int(15014));
    let liveness = container.liveness_probe.as_ref().expect("liveness probe");
    let get = liveness.http_get.as_ref().expect("HTTP liveness");
    assert_eq!(get.port, IntOrString::Int(15014));
}

#[test]
fn the_pod_is_locked_down_and_runs_as_non_root() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(json!({}), NS);
    let pod = pod_spec(&rendered);
    let pod_security = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert!(
        pod_security.run_as_user.is_some_and(|u| u > 0),
        "numeric non-root user"
    );
    assert_eq!(
        pod_security
            .seccomp_profile
            .as_ref()
            .map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    let container = container(&rendered);
    let security = container
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_eq!(security.run_as_non_root, Some(true));
    assert!(security.run_as_user.is_some_and(|u| u > 0));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, Some(false));
    let capabilities = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(capabilities.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(capabilities.add.is_none());
    assert_eq!(
        security.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(pod.host_network.is_none() && pod.host_pid.is_none());

    // The one writable place is the CA dir, on an emptyDir.
    let state = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "state")
        .expect("state volume");
    assert!(state.empty_dir.is_some());
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "state")
        .expect("state mount");
    let ca_dir = &rendered.flag("--ca-dir")[0];
    assert!(
        ca_dir.starts_with(&mount.mount_path),
        "{ca_dir} under {}",
        mount.mount_path
    );

    // POD_NAME and POD_NAMESPACE from the downward API; a grace period; a spread.
    for (env, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let var = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == env)
            .expect(env);
        let from = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .expect(env);
        assert_eq!(from.field_path, field);
    }
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    assert!(
        !pod.topology_spread_constraints
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );
    let resources = container.resources.as_ref().expect("resources");
    assert!(resources.requests.is_some() && resources.limits.is_some());
}

#[test]
fn values_reach_the_args() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(
        json!({
            "trustDomain": "example.org",
            "clusterId": "east",
            "clusterDomain": "corp.local",
            "logLevel": "ambientd=debug,info",
            "debounce": {"after": "100ms", "max": "2s"},
            "trustedNodeAccounts": ["mesh-system/ztunnel", "mesh-system/ztunnel-canary"],
            "extraArgs": ["--tls-san=10.0.0.7"],
            "image": {"repository": "registry.example/ambientd", "tag": "v9"},
            "terminationGracePeriodSeconds": 45,
            "shutdownGrace": "20s",
            "xds": {"scopeToNode": true, "reconnectRemovalGrace": "0s"},
            "kubeWatchTimeout": "60s",
            "ca": {"tokenReviewTimeout": "3s"},
            "rootNamespace": "mesh-config",
            "ipAutoallocate": {"ipv4Prefix": "240.241.0.0/24", "ipv6Prefix": "2001:3::/64"},
        }),
        "mesh-system",
    );
    assert_eq!(rendered.flag("--trust-domain"), ["example.org"]);
    assert_eq!(rendered.flag("--root-namespace"), ["mesh-config"]);
    assert_eq!(rendered.flag("--cluster-id"), ["east"]);
    assert_eq!(rendered.flag("--system-namespace"), ["mesh-system"]);
    assert_eq!(rendered.flag("--debounce-after"), ["100ms"]);
    assert_eq!(rendered.flag("--reconnect-removal-grace"), ["0s"]);
    assert_eq!(rendered.flag("--kube-watch-timeout"), ["60s"]);
    assert_eq!(rendered.flag("--token-review-timeout"), ["3s"]);
    assert_eq!(
        rendered.flag("--trusted-node-accounts"),
        ["mesh-system/ztunnel,mesh-system/ztunnel-canary"]
    );
    assert_eq!(
        container(&rendered).image.as_deref(),
        Some("registry.example/ambientd:v9")
    );
    assert_eq!(
        pod_spec(&rendered).termination_grace_period_seconds,
        Some(45)
    );

    let config = parse_args(&rendered);
    assert_eq!(config.settings.trust_domain, "example.org");
    assert_eq!(config.settings.cluster_id, "east");
    assert_eq!(config.settings.domain, "corp.local");
    assert_eq!(config.settings.system_namespace, "mesh-system");
    assert_eq!(config.settings.root_namespace, "mesh-config");
    assert_eq!(config.debounce.after, std::time::Duration::from_millis(100));
    assert_eq!(config.debounce.max, std::time::Duration::from_secs(2));
    assert_eq!(config.shutdown_grace, std::time::Duration::from_secs(20));
    assert!(config.scope_to_node);
    assert!(config.settings.ip_autoallocate);
    let prefixes = config.writes.as_ref().unwrap().ip_autoallocate.unwrap();
    assert_eq!(
        (prefixes.v4.to_string(), prefixes.v6.to_string()),
        ("240.241.0.0/24".to_string(), "2001:3::/64".to_string())
    );
    let off =
        parse_args(&helm.render(json!({"ipAutoallocate": {"enabled": false}}), "mesh-system"));
    assert!(!off.settings.ip_autoallocate);
    assert_eq!(off.writes.unwrap().ip_autoallocate, None);
    // extraArgs are appended as given.
    assert_eq!(
        rendered.args().last().map(String::as_str),
        Some("--tls-san=10.0.0.7")
    );
    assert_eq!(config.ca.unwrap().tls_sans, ["10.0.0.7"]);

    // By default the trusted node account is ztunnel in the release namespace.
    let rendered = helm.render(json!({}), "mesh-system");
    assert_eq!(
        rendered.deployment().spec.as_ref().unwrap().replicas,
        Some(2)
    );
    assert_eq!(
        rendered.flag("--trusted-node-accounts"),
        ["mesh-system/ztunnel"]
    );
    assert!(rendered.flag("--root-namespace").is_empty());
    let config = parse_args(&rendered);
    assert_eq!(config.settings.root_namespace, "mesh-system");
    assert_eq!(config.shutdown_grace, std::time::Duration::from_secs(10));
    assert!(!config.scope_to_node);
}

#[test]
fn cluster_write_values_reach_the_args() {
    let Some(helm) = engine() else { return };
    // Defaults: leader election, the CA in Secrets, root ConfigMaps and status writes on.
    let rendered = helm.render(json!({}), NS);
    for (flag, value) in [
        ("--leader-election", "true"),
        ("--leader-lease", "ambientd-leader"),
        ("--leader-lease-duration", "15s"),
        ("--leader-renew-grace", "5s"),
        ("--ca-secrets", "true"),
        ("--root-configmaps", "true"),
        ("--write-status", "true"),
        ("--status-qps", "20"),
    ] {
        assert_eq!(rendered.flag(flag), [value], "{flag}");
    }
    let writes = parse_args(&rendered).writes.expect("cluster writes");
    let leader = writes.leader.expect("leader election");
    assert_eq!(leader.lease_name, "ambientd-leader");
    assert_eq!(leader.namespace, NS);
    assert!(writes.ca_secrets && writes.root_configmaps && writes.status);

    let rendered = helm.render(
        json!({
            "leaderElection": {"leaseName": "mesh-leader", "leaseDuration": "30s", "renewGrace": "10s"},
            "rootConfigMaps": false,
            "writeStatus": false,
            "statusQps": 5,
        }),
        NS,
    );
    let writes = parse_args(&rendered).writes.expect("cluster writes");
    let leader = writes.leader.expect("leader election");
    assert_eq!(leader.lease_name, "mesh-leader");
    assert_eq!(leader.lease_duration, std::time::Duration::from_secs(30));
    assert_eq!(leader.renew_grace, std::time::Duration::from_secs(10));
    assert!(!writes.root_configmaps && !writes.status);
    assert_eq!(writes.status_qps, 5);

    // A plugged-in CA is mounted: no Secret is read through the API.
    let rendered = helm.render(json!({"ca": {"mode": "cacerts"}}), NS);
    assert!(rendered.flag("--ca-secrets").is_empty());
    assert!(!parse_args(&rendered).writes.unwrap().ca_secrets);
}

#[test]
fn cacerts_mode_mounts_the_plugged_in_ca_read_only() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(
        json!({"ca": {"mode": "cacerts", "cacerts": {"secretName": "my-ca"}}}),
        NS,
    );
    let cacerts = &rendered.flag("--cacerts");
    assert_eq!(cacerts.len(), 1, "{:?}", rendered.args());
    let pod = pod_spec(&rendered);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("my-ca"))
        })
        .expect("the Secret is a volume");
    let mount = container(&rendered)
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("and mounted");
    assert_eq!(&mount.mount_path, &cacerts[0]);
    assert_eq!(mount.read_only, Some(true));
    let config = parse_args(&rendered);
    assert_eq!(
        config.ca.unwrap().cacerts.as_deref(),
        Some(std::path::Path::new(&cacerts[0]))
    );

    // Self-signed (the default): no --cacerts, no Secret volume.
    let rendered = helm.render(json!({}), NS);
    assert!(rendered.flag("--cacerts").is_empty());
    assert!(
        pod_spec(&rendered)
            .volumes
            .iter()
            .flatten()
            .all(|v| v.secret.is_none())
    );
}

#[test]
fn a_custom_service_name_is_in_the_certificate_and_the_notes() {
    let Some(helm) = engine() else { return };
    let values =
        json!({"service": {"name": "mesh-control"}, "ca": {"tlsSans": ["xds.example.org"]}});
    let rendered = helm.render(values.clone(), NS);
    assert_eq!(
        rendered.service().metadata.name.as_deref(),
        Some("mesh-control")
    );
    assert_eq!(
        rendered.flag("--tls-san"),
        ["mesh-control.istio-system.svc", "xds.example.org"]
    );
    parse_args(&rendered);
    let notes = helm.notes(values, NS);
    assert!(
        notes.contains("--set xdsAddress=mesh-control.istio-system.svc:15012"),
        "{notes}"
    );
    assert!(
        notes.contains("--set caAddress=mesh-control.istio-system.svc:15012"),
        "{notes}"
    );

    // istiod and ambientd are already in the certificate.
    for name in ["istiod", "ambientd"] {
        let rendered = helm.render(json!({"service": {"name": name}}), NS);
        assert!(rendered.flag("--tls-san").is_empty(), "{name}");
    }
}

#[test]
fn the_notes_give_the_ztunnel_chart_values() {
    let Some(helm) = engine() else { return };
    let notes = helm.notes(json!({"clusterId": "east"}), NS);
    for line in [
        "--set xdsAddress=istiod.istio-system.svc:15012",
        "--set caAddress=istiod.istio-system.svc:15012",
        "--set multiCluster.clusterName=east",
        "istio-system/ztunnel",
    ] {
        assert!(
            notes.contains(line),
            "{line:?} missing from NOTES:\n{notes}"
        );
    }
}

#[test]
fn several_replicas_spread_and_keep_a_disruption_budget() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(
        json!({"replicaCount": 3, "ca": {"mode": "cacerts"}, "podDisruptionBudget": {"minAvailable": 2}}),
        NS,
    );
    let spec = rendered.deployment().spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .expect("rolling update");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    let selector = spec.selector.match_labels.clone().unwrap();
    let spread = pod_spec(&rendered)
        .topology_spread_constraints
        .clone()
        .unwrap();
    let keys: Vec<&str> = spread.iter().map(|c| c.topology_key.as_str()).collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    for constraint in &spread {
        let labels = constraint
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone());
        assert_eq!(labels.as_ref(), Some(&selector));
    }
    let pdb = rendered
        .pdb()
        .expect("a PodDisruptionBudget")
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(pdb.min_available, Some(IntOrString::Int(2)));
    assert_eq!(pdb.max_unavailable, None);
    assert_eq!(
        pdb.selector.as_ref().and_then(|s| s.match_labels.clone()),
        Some(selector)
    );

    // The self-signed CA lives in istio-ca-secret, shared by the replicas: several are fine.
    let rendered = helm.render(json!({"replicaCount": 3}), NS);
    assert_eq!(
        rendered.deployment().spec.as_ref().unwrap().replicas,
        Some(3)
    );
    assert_eq!(rendered.flag("--ca-secrets"), ["true"]);
    // Only a per-pod root (ca.secrets false), or every replica writing (no leader election),
    // needs a single replica: the chart refuses more.
    for (values, message) in [
        (
            json!({"replicaCount": 2, "ca": {"secrets": false}}),
            "ca.secrets false gives each replica its own root",
        ),
        (
            json!({"replicaCount": 2, "leaderElection": {"enabled": false}}),
            "leaderElection.enabled false makes every replica write",
        ),
    ] {
        let error = helm
            .render_text(&values, NS, false)
            .expect_err("must be refused");
        assert!(error.contains(message), "{values}: {error}");
    }
    let rendered = helm.render(
        json!({"replicaCount": 1, "ca": {"secrets": false}, "leaderElection": {"enabled": false}}),
        NS,
    );
    assert_eq!(rendered.flag("--ca-secrets"), ["false"]);
    assert_eq!(rendered.flag("--leader-election"), ["false"]);
    assert!(rendered.flag("--leader-lease").is_empty());

    // No budget when disabled.
    let rendered = helm.render(json!({"podDisruptionBudget": {"enabled": false}}), NS);
    assert!(rendered.pdb().is_none());
}

#[test]
fn misspelt_or_unsafe_values_are_refused_with_the_engines_message() {
    let Some(helm) = engine() else { return };
    for (values, message) in [
        (
            json!({"ca": {"mode": "vault"}}),
            "ca.mode must be selfSigned or cacerts",
        ),
        // values.schema.json: no unknown keys, a non-root user, selectors shaped as Istio's.
        (
            json!({"replicas": 3}),
            "additional properties 'replicas' not allowed",
        ),
        (
            json!({"ca": {"cacert": {}}}),
            "additional properties 'cacert' not allowed",
        ),
        (json!({"runAsUser": 0}), "/runAsUser"),
        (
            json!({"discoverySelectors": [{"matchLabel": {"a": "b"}}]}),
            "matchLabel",
        ),
        (
            json!({"trustedNodeAccounts": ["ztunnel"]}),
            "/trustedNodeAccounts/0",
        ),
    ] {
        let Err(error) = helm.render_text(&values, NS, false) else {
            panic!("{values} must be refused")
        };
        assert!(error.contains(message), "{values}: {error}");
    }
}

#[test]
fn discovery_selectors_become_a_mesh_config_ambientd_reads() {
    let Some(helm) = engine() else { return };
    let rendered = helm.render(
        json!({"discoverySelectors": [
            {"matchLabels": {"istio-discovery": "enabled"}},
            {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
        ]}),
        NS,
    );
    let maps = rendered.config_maps();
    assert_eq!(maps.len(), 1);
    let mesh = maps[0].data.as_ref().unwrap()["mesh"].clone();
    let selectors =
        DiscoverySelectors::from_mesh_config(&mesh).expect("ambientd reads the mesh config");
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .copied()
            .collect::<ambientd::discovery::model::Labels>()
    };
    assert_eq!(selectors.0.len(), 2);
    assert!(selectors.selects(&labels(&[("istio-discovery", "enabled")])));
    assert!(selectors.selects(&labels(&[("env", "prod")])));
    assert!(!selectors.selects(&labels(&[("env", "dev")])));

    // Mounted where --mesh-config points, from that ConfigMap, and the pods roll on change.
    let path = rendered.flag("--mesh-config");
    assert_eq!(path.len(), 1);
    let pod = pod_spec(&rendered);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.config_map.as_ref().map(|c| &c.name) == Some(maps[0].metadata.name.as_ref().unwrap())
        })
        .expect("the ConfigMap is a volume");
    let mount = container(&rendered)
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("mounted");
    assert_eq!(path[0], format!("{}/mesh", mount.mount_path));
    let annotations = rendered
        .deployment()
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    assert!(annotations.contains_key("checksum/mesh"));
    let config = parse_args(&rendered);
    let ambientd::config::Source::Cluster(cluster) = config.source else {
        panic!("the chart serves a cluster")
    };
    assert_eq!(cluster.discovery_selectors.0.len(), 2);

    // None by default: every namespace, no ConfigMap, no --mesh-config.
    let rendered = helm.render(json!({}), NS);
    assert!(rendered.config_maps().is_empty());
    assert!(rendered.flag("--mesh-config").is_empty());
}

#[test]
fn service_entry_visibility_joins_the_mesh_config() {
    use ambientd::discovery::model::Visibility;
    let Some(helm) = engine() else { return };
    let visibility = json!({
        "defaultVisibility": "NAMESPACE",
        "policies": [{
            "visibility": "PUBLIC",
            "matchingRules": [{"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "istio-system"}
            }}],
        }],
    });
    for values in [
        json!({"serviceEntryVisibility": visibility}),
        json!({
            "serviceEntryVisibility": visibility,
            "discoverySelectors": [{"matchLabels": {"istio-discovery": "enabled"}}],
        }),
    ] {
        let rendered = helm.render(values.clone(), NS);
        assert_eq!(rendered.config_maps().len(), 1, "{values}");
        assert_eq!(rendered.flag("--mesh-config").len(), 1, "{values}");
        let config = parse_args(&rendered);
        let read = config
            .settings
            .service_entry_visibility
            .unwrap_or_else(|| panic!("{values}: not read"));
        assert_eq!(read.default, Visibility::Namespace);
        assert_eq!(read.policies.len(), 1);
        assert_eq!(read.policies[0].visibility, Visibility::Public);
        let ambientd::config::Source::Cluster(cluster) = config.source else {
            panic!("the chart serves a cluster")
        };
        let selectors = values.get("discoverySelectors").map_or(0, |_| 1);
        assert_eq!(cluster.discovery_selectors.0.len(), selectors, "{values}");
    }
    // The schema refuses a visibility istiod does not know.
    let bad = json!({"serviceEntryVisibility": {"defaultVisibility": "PRIVATE"}});
    assert!(helm.render_text(&bad, NS, false).is_err());
}

#[test]
fn every_flag_the_chart_passes_is_in_the_readme() {
    let Some(helm) = engine() else { return };
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let values = json!({
        "ca": {"mode": "cacerts", "tlsSans": ["x.example"]},
        "service": {"name": "other"},
        "discoverySelectors": [{"matchLabels": {"a": "b"}}],
        "autoAllowWaypointPolicy": true,
        "dryRunAuthorizationPolicy": true,
    });
    let rendered = helm.render(values, NS);
    let settings = parse_args(&rendered).settings;
    assert!(settings.auto_allow_waypoint_policy && settings.dry_run_authorization);
    for arg in rendered.args().iter().skip(1) {
        let flag = arg.split('=').next().unwrap();
        assert!(
            readme.contains(&format!("`{flag}")),
            "{flag} is not in the README's flags table"
        );
    }
    assert_eq!(rendered.args()[0], "serve");
}
