use super::*;
use clap::Parser;

fn parse(args: &[&str]) -> Result<ServeArgs, String> {
    let mut argv = vec!["ambientd", "serve"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv)
        .map(|cli| match cli.command {
            Command::Serve(args) => *args,
            Command::Token(_) | Command::Sds(_) => panic!("not serve"),
        })
        .map_err(|e| e.to_string())
}

#[test]
fn defaults_match_istiod() {
    let config = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert_eq!(config.xds_address.to_string(), "0.0.0.0:15010");
    assert_eq!(config.debug_address.to_string(), "0.0.0.0:15014");
    assert_eq!(config.settings.cluster_id, "Kubernetes");
    assert_eq!(config.settings.trust_domain, "cluster.local");
    assert_eq!(config.settings.domain, "cluster.local");
    assert_eq!(config.settings.system_namespace, "istio-system");
    assert_eq!(config.settings.root_namespace, "istio-system");
}

#[test]
fn root_namespace_and_trust_domain_come_from_flags_then_the_mesh_config() {
    // No mesh config: the root namespace follows the system namespace, as istiod's does.
    let config =
        Config::try_from(parse(&["--manifests", "x", "--system-namespace", "ambient"]).unwrap())
            .unwrap();
    assert_eq!(config.settings.root_namespace, "ambient");
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::write(
        &mesh,
        "rootNamespace: istio-config\ntrustDomain: example.org\n\
         discoverySelectors: [{matchLabels: {mesh: on}}]\n",
    )
    .unwrap();
    let mesh = mesh.to_str().unwrap();
    let config = Config::try_from(parse(&["--mesh-config", mesh]).unwrap()).unwrap();
    assert_eq!(config.settings.root_namespace, "istio-config");
    assert_eq!(config.settings.trust_domain, "example.org");
    assert_eq!(config.settings.system_namespace, "istio-system");
    let Source::Cluster(cluster) = &config.source else {
        panic!("not the cluster source")
    };
    assert_eq!(cluster.discovery_selectors.0.len(), 1);
    // The flags win.
    let config = Config::try_from(
        parse(&[
            "--mesh-config",
            mesh,
            "--root-namespace",
            "policies",
            "--trust-domain",
            "corp.example",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(config.settings.root_namespace, "policies");
    assert_eq!(config.settings.trust_domain, "corp.example");
    // A bad trust domain in the mesh config is an error naming the file's field.
    std::fs::write(dir.path().join("bad"), "trustDomain: \"not a domain\"\n").unwrap();
    let bad = dir.path().join("bad");
    let error =
        Config::try_from(parse(&["--mesh-config", bad.to_str().unwrap()]).unwrap()).unwrap_err();
    assert!(error.contains("trustDomain"), "{error}");
}

#[test]
fn istiods_authorization_feature_flags_are_off_unless_asked_for() {
    let off = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert!(!off.settings.auto_allow_waypoint_policy);
    assert!(!off.settings.dry_run_authorization);
    for args in [
        &["--manifests", "x", "--auto-allow-waypoint-policy"][..],
        &["--manifests", "x", "--auto-allow-waypoint-policy=true"][..],
    ] {
        let on = Config::try_from(parse(args).unwrap()).unwrap();
        assert!(on.settings.auto_allow_waypoint_policy, "{args:?}");
    }
    let on =
        Config::try_from(parse(&["--manifests", "x", "--dry-run-authorization-policy"]).unwrap())
            .unwrap();
    assert!(on.settings.dry_run_authorization);
    // The two selection flags are on unless turned off.
    assert!(off.settings.k8s_select_workload_entries && off.settings.service_entry_select_pods);
    let narrow = Config::try_from(
        parse(&[
            "--manifests",
            "x",
            "--k8s-select-workload-entries=false",
            "--service-entry-select-pods=false",
        ])
        .unwrap(),
    )
    .unwrap();
    assert!(!narrow.settings.k8s_select_workload_entries);
    assert!(!narrow.settings.service_entry_select_pods);
}

#[test]
fn ip_autoallocation_is_on_with_istiods_ranges_unless_turned_off() {
    let on = Config::try_from(parse(&[]).unwrap()).unwrap();
    assert!(on.settings.ip_autoallocate);
    let prefixes = on.writes.unwrap().ip_autoallocate.unwrap();
    assert_eq!(prefixes, crate::kube::ip_allocate::Prefixes::default());
    assert_eq!(prefixes.v4.to_string(), "240.240.0.0/16");
    assert_eq!(prefixes.v6.to_string(), "2001:2::/48");
    let off = Config::try_from(parse(&["--ip-autoallocate=false"]).unwrap()).unwrap();
    assert!(!off.settings.ip_autoallocate);
    assert_eq!(off.writes.unwrap().ip_autoallocate, None);
    // Manifests mode allocates nothing, but uses addresses a manifest's status carries.
    let manifests = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert!(manifests.settings.ip_autoallocate && manifests.writes.is_none());
    for (args, error) in [
        (
            &["--ip-autoallocate-ipv4-prefix", "2001:2::/48"][..],
            "not an IPv4 prefix",
        ),
        (
            &["--ip-autoallocate-ipv6-prefix", "10.0.0.0/8"][..],
            "not an IPv6 prefix",
        ),
        (&["--ip-autoallocate-ipv4-prefix", "10.0.0.0"][..], "no /"),
        (
            &["--ip-autoallocate-ipv4-prefix", "10.0.0.0/40"][..],
            "0 to 32",
        ),
    ] {
        let got = Config::try_from(parse(args).unwrap()).unwrap_err();
        assert!(got.contains(error), "{args:?}: {got}");
    }
}

#[test]
fn service_entry_visibility_comes_from_the_mesh_config_in_either_mode() {
    use crate::discovery::model::visibility::Visibility;
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::write(
        &mesh,
        "serviceEntryVisibility:\n  defaultVisibility: NAMESPACE\n  policies:\n  \
         - visibility: PUBLIC\n    matchingRules:\n    - namespaceSelector:\n        \
         matchLabels: {kubernetes.io/metadata.name: istio-system}\n",
    )
    .unwrap();
    let mesh = mesh.to_str().unwrap();
    let config =
        Config::try_from(parse(&["--manifests", "x", "--mesh-config", mesh]).unwrap()).unwrap();
    let visibility = config.settings.service_entry_visibility.unwrap();
    assert_eq!(visibility.default, Visibility::Namespace);
    assert_eq!(visibility.policies.len(), 1);
    let config = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert!(config.settings.service_entry_visibility.is_none());
    // An unknown visibility is an error that names the field.
    std::fs::write(
        dir.path().join("bad"),
        "serviceEntryVisibility: {policies: [{visibility: PRIVATE}]}\n",
    )
    .unwrap();
    let bad = dir.path().join("bad");
    let error =
        Config::try_from(parse(&["--mesh-config", bad.to_str().unwrap()]).unwrap()).unwrap_err();
    assert!(
        error.contains("serviceEntryVisibility.policies[0].visibility"),
        "{error}"
    );
}

#[test]
fn a_bad_value_names_its_flag() {
    for (args, flag) in [
        (&["--xds-address", "nope"][..], "--xds-address"),
        (&["--debug-address", "1.2.3.4"][..], "--debug-address"),
        (&["--trust-domain", "bad domain"][..], "--trust-domain"),
        (&["--cluster-id", ""][..], "--cluster-id"),
        (&["--log-level", "a=b=c"][..], "--log-level"),
        (&["--debounce-after", "5 minutes"][..], "--debounce-after"),
        (&["--shutdown-grace", "soon"][..], "--shutdown-grace"),
    ] {
        let error = parse(args).unwrap_err();
        assert!(error.contains(flag), "{error}");
    }
}

#[test]
fn push_flags() {
    let config = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert!(!config.scope_to_node);
    assert_eq!(config.shutdown_grace, Duration::from_secs(10));
    let config = Config::try_from(
        parse(&[
            "--manifests",
            "x",
            "--scope-to-node",
            "--shutdown-grace",
            "25s",
        ])
        .unwrap(),
    )
    .unwrap();
    assert!(config.scope_to_node);
    assert_eq!(config.shutdown_grace, Duration::from_secs(25));
}

#[test]
fn without_manifests_the_cluster_is_the_source() {
    let config = Config::try_from(
        parse(&[
            "--kubeconfig",
            "/k",
            "--discovery-selectors",
            "istio-discovery=enabled,env in (prod);team",
        ])
        .unwrap(),
    )
    .unwrap();
    let Source::Cluster(cluster) = config.source else {
        panic!("not the cluster source")
    };
    assert_eq!(cluster.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!(cluster.discovery_selectors.0.len(), 2);

    let error = parse(&["--discovery-selectors", "env in (prod"]).unwrap_err();
    assert!(error.contains("--discovery-selectors"), "{error}");
    let error = parse(&["--manifests", "x", "--kubeconfig", "/k"]).unwrap_err();
    assert!(error.contains("--kubeconfig"), "{error}");
}

#[test]
fn status_writes_can_be_turned_off_and_paced() {
    let args = [
        "--kubeconfig",
        "/k",
        "--write-status=false",
        "--status-qps",
        "5",
    ];
    let writes = Config::try_from(parse(&args).unwrap())
        .unwrap()
        .writes
        .unwrap();
    assert!(!writes.status);
    assert_eq!(writes.status_qps, 5);
    assert!(parse(&["--kubeconfig", "/k", "--status-qps", "0"]).is_err());
}

#[test]
fn cluster_mode_elects_and_writes_by_default() {
    let config = Config::try_from(parse(&["--kubeconfig", "/k"]).unwrap()).unwrap();
    let writes = config.writes.expect("cluster writes");
    let leader = writes.leader.expect("leader election");
    assert_eq!(leader.lease_name, "ambientd-leader");
    assert_eq!(leader.namespace, "istio-system");
    assert_eq!(leader.lease_duration, Duration::from_secs(15));
    assert_eq!(leader.renew_grace, Duration::from_secs(5));
    assert!(writes.ca_secrets && writes.root_configmaps);
    assert!(writes.status);
    assert_eq!(writes.status_qps, 20);

    let config = Config::try_from(
        parse(&[
            "--kubeconfig",
            "/k",
            "--leader-election=false",
            "--cacerts",
            "/c",
        ])
        .unwrap(),
    )
    .unwrap();
    let writes = config.writes.unwrap();
    assert!(writes.leader.is_none());
    assert!(
        !writes.ca_secrets,
        "a --cacerts directory wins over the Secrets"
    );

    let manifests = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert!(manifests.writes.is_none());

    let bad = parse(&["--kubeconfig", "/k", "--leader-renew-grace", "15s"]).unwrap();
    let error = Config::try_from(bad).unwrap_err();
    assert!(error.contains("--leader-renew-grace"), "{error}");
}

#[test]
fn the_waypoint_controller_runs_in_cluster_mode_with_its_proxy_settings() {
    let config = Config::try_from(parse(&["--kubeconfig", "/k"]).unwrap()).unwrap();
    let proxy = config.writes.unwrap().waypoints.expect("on by default");
    assert_eq!(proxy.image, "docker.io/istio/proxyv2:1.28.0");
    assert_eq!(proxy.istiod_address, "istiod.istio-system.svc:15012");
    assert_eq!((proxy.replicas, proxy.resources), (None, None));

    let config = Config::try_from(
        parse(&[
            "--kubeconfig",
            "/k",
            "--system-namespace",
            "mesh",
            "--trust-domain",
            "example.org",
            "--waypoint-image",
            "registry.example/proxyv2:1.29.3",
            "--waypoint-replicas",
            "2",
            "--waypoint-resources",
            r#"{"requests": {"cpu": "50m"}}"#,
        ])
        .unwrap(),
    )
    .unwrap();
    let proxy = config.writes.unwrap().waypoints.unwrap();
    assert_eq!(proxy.image, "registry.example/proxyv2:1.29.3");
    assert_eq!(proxy.istiod_address, "istiod.mesh.svc:15012");
    assert_eq!(proxy.trust_domain, "example.org");
    assert_eq!(proxy.replicas, Some(2));
    assert_eq!(
        proxy.resources,
        Some(serde_json::json!({"requests": {"cpu": "50m"}}))
    );

    let off =
        Config::try_from(parse(&["--kubeconfig", "/k", "--waypoint-controller", "false"]).unwrap())
            .unwrap();
    assert!(off.writes.unwrap().waypoints.is_none());
    let error = parse(&["--kubeconfig", "/k", "--waypoint-resources", "[1]"]).unwrap_err();
    assert!(
        error.contains("--waypoint-resources") && error.contains("JSON object"),
        "{error}"
    );
    let negative = parse(&["--kubeconfig", "/k", "--waypoint-replicas=-1"]).unwrap();
    assert!(
        Config::try_from(negative)
            .unwrap_err()
            .contains("--waypoint-replicas")
    );
}

#[test]
fn the_jwks_refresh_interval_is_istiods_unless_set() {
    let config = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
    assert_eq!(config.jwks.refresh, Duration::from_secs(20 * 60));
    let args = ["--manifests", "x", "--jwks-refresh-interval", "90s"];
    let config = Config::try_from(parse(&args).unwrap()).unwrap();
    assert_eq!(config.jwks.refresh, Duration::from_secs(90));
    let error = parse(&["--manifests", "x", "--jwks-refresh-interval", "0"]).unwrap_err();
    assert!(error.contains("--jwks-refresh-interval"), "{error}");
}
