//! End to end over real gRPC on 127.0.0.1: a manifests directory served to a ztunnel-shaped
//! delta xDS client, followed through edits, deletes, reconnects, NACKs and on-demand lookups.

use crate::support::common as support;
use crate::support::xds as xds_support;

use std::collections::BTreeMap;
use std::time::Duration;

use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::workload::{TunnelProtocol, WorkloadStatus};
use ambientd::pb::xds::DeltaDiscoveryRequest;
use support::*;
use xds_support::*;

#[tokio::test]
async fn initial_sync_delivers_both_types() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (addresses_response, authorizations) = client.initial_sync().await;

    assert_eq!(
        names(&addresses_response),
        vec![DB_1, WEB_1, WEB_2, WEB_SVC]
    );
    assert!(addresses_response.removed_resources.is_empty());
    assert!(!addresses_response.nonce.is_empty());
    // Authorization is answered even though there is nothing in it (ztunnel needs the ACK).
    assert_eq!(authorizations.type_url, AUTHORIZATION_TYPE);
    assert!(authorizations.resources.is_empty());

    let decoded = addresses(&addresses_response);
    let web1 = workload(&decoded[WEB_1]);
    assert_eq!(web1.uid, WEB_1);
    assert_eq!(
        web1.addresses,
        vec![bytes::Bytes::from_static(&[10, 244, 1, 10])]
    );
    assert_eq!(web1.service_account, "web");
    assert_eq!(web1.node, "node-a");
    assert_eq!(web1.tunnel_protocol, TunnelProtocol::Hbone as i32);
    assert_eq!(web1.status, WorkloadStatus::Healthy as i32);
    assert_eq!(web1.locality.as_ref().map(|l| l.zone.as_str()), Some("z1"));
    let ports = &web1.services[WEB_SVC].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (80, 8080));
    let svc = service(&decoded[WEB_SVC]);
    assert_eq!(svc.hostname, "web.demo.svc.cluster.local");
    assert_eq!(svc.addresses[0].address.as_ref(), &[10, 96, 0, 10]);
    // Each resource carries its content version (istiod's: hex xxhash64 of the Any's value).
    // Aliases are not sent (ztunnel never reads them), nor is system_version_info.
    let web1_resource = addresses_response
        .resources
        .iter()
        .find(|r| r.name == WEB_1)
        .unwrap();
    let value = &web1_resource.resource.as_ref().unwrap().value;
    assert_eq!(
        web1_resource.version,
        format!("{:x}", xxhash_rust::xxh64::xxh64(value, 0))
    );
    assert!(web1_resource.aliases.is_empty());
    assert!(addresses_response.system_version_info.is_empty());

    let (code, body) = http_get(running.debug_address, "/ready").await;
    assert_eq!(code, 200);
    assert_eq!(body, "", "istiod's /ready has no body");
    running.stop().await;
}

#[tokio::test]
async fn editing_a_file_delivers_exactly_the_changed_resource() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;

    // web-2 becomes not ready; web-1 in the same file is untouched.
    let not_ready =
        pod("web-2", "10.244.1.11", "web", "v1").replace(r#"status: "True""#, r#"status: "False""#);
    mesh.write(
        "pods/web.yaml",
        &pods(&[pod("web-1", "10.244.1.10", "web", "v1"), not_ready]),
    );

    let update = client.recv().await;
    assert_eq!(update.type_url, ADDRESS_TYPE);
    assert_eq!(names(&update), vec![WEB_2]);
    assert!(update.removed_resources.is_empty());
    let decoded = addresses(&update);
    assert_eq!(
        workload(&decoded[WEB_2]).status,
        WorkloadStatus::Unhealthy as i32
    );
    client.ack(&update).await;

    // Rewriting a file with identical content sends nothing.
    mesh.write("services.yaml", SERVICES);
    client.expect_silence(Duration::from_millis(700)).await;
    running.stop().await;
}

#[tokio::test]
async fn deleting_an_object_delivers_its_name_in_removed_resources() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;

    mesh.remove("pods/db.yaml");
    let update = client.recv().await;
    assert_eq!(update.type_url, ADDRESS_TYPE);
    assert!(update.resources.is_empty());
    assert_eq!(update.removed_resources, vec![DB_1]);
    client.ack(&update).await;

    // Deleting the Service removes it and re-sends its members without the service.
    mesh.remove("services.yaml");
    let update = client.recv().await;
    assert_eq!(update.removed_resources, vec![WEB_SVC]);
    assert_eq!(names(&update), vec![WEB_1, WEB_2]);
    for (_, address) in addresses(&update) {
        assert!(workload(&address).services.is_empty());
    }
    running.stop().await;
}

#[tokio::test]
async fn reconnect_with_initial_versions_delivers_only_changes_and_removals() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut first = XdsClient::connect(&running).await;
    first.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, _) = first.initial_sync().await;
    let held = versions(&initial);
    drop(first);

    // While disconnected: web-1 changes version label, db-1 is deleted.
    mesh.write(
        "pods/web.yaml",
        &pods(&[
            pod("web-1", "10.244.1.10", "web", "v2"),
            pod("web-2", "10.244.1.11", "web", "v1"),
        ]),
    );
    mesh.remove("pods/db.yaml");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(
        WAIT,
        snapshots.wait_for(|s| {
            s.as_ref().is_some_and(|s| {
                !s.addresses.contains_key(DB_1) && !s.addresses[WEB_1].version.is(&held[WEB_1])
            })
        }),
    )
    .await
    .expect("edits were not indexed in time")
    .unwrap();

    let mut second = XdsClient::connect(&running).await;
    second.subscribe_wildcard(held).await;
    let (update, _) = second.initial_sync().await;
    assert_eq!(names(&update), vec![WEB_1]);
    assert_eq!(update.removed_resources, vec![DB_1]);
    assert_eq!(
        workload(&addresses(&update)[WEB_1]).canonical_revision,
        "v2"
    );
    running.stop().await;
}

#[tokio::test]
async fn a_nack_does_not_cause_a_resend_loop() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let first = client.recv().await;
    client
        .nack(&first, "Kubernetes//Pod/demo/web-1: decode: invalid")
        .await;
    let authorizations = client.recv().await;
    assert_eq!(authorizations.type_url, AUTHORIZATION_TYPE);
    client.ack(&authorizations).await;
    client.expect_silence(Duration::from_millis(700)).await;

    // Later changes still flow, and only the changed resource is sent.
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v9"));
    let update = client.recv().await;
    assert_eq!(names(&update), vec![DB_1]);
    running.stop().await;
}

/// A ztunnel with XDS_ON_DEMAND on `node`: Address subscribe [*] + unsubscribe [*], nothing
/// yet. Its first response, empty as istiod's, is checked and ACKed.
async fn on_demand(running: &ambientd::app::Running, node: &str) -> XdsClient {
    let mut client = XdsClient::connect(running).await;
    client
        .send(DeltaDiscoveryRequest {
            node: Some(ztunnel_node(node)),
            type_url: ADDRESS_TYPE.to_string(),
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..Default::default()
        })
        .await;
    let empty = client.recv().await;
    assert_eq!(empty.type_url, ADDRESS_TYPE);
    assert!(empty.resources.is_empty() && empty.removed_resources.is_empty());
    client.ack(&empty).await;
    client
}

#[tokio::test]
async fn an_on_demand_ztunnel_gets_its_node_workloads_with_its_first_lookup() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = on_demand(&running, "node-a").await;
    // The first lookup (of an address nothing has) brings the pods on node-a with it.
    client.look_up("/192.0.2.1").await;
    let answer = client.recv().await;
    assert_eq!(names(&answer), vec![DB_1, WEB_1, WEB_2]);
    assert_eq!(answer.removed_resources, vec!["/192.0.2.1"]);
    running.stop().await;
}

#[tokio::test]
async fn on_demand_ip_lookup_is_answered() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    // Its node has no pods, so every answer holds only what was looked up (see
    // `an_on_demand_ztunnel_gets_its_node_workloads_with_its_first_lookup`).
    let mut client = on_demand(&running, "node-z").await;

    client.look_up("/10.244.1.20").await;
    let answer = client.recv().await;
    assert_eq!(names(&answer), vec![DB_1]);
    // The demanded key itself is listed so that ztunnel's waiter (keyed by it) wakes.
    assert_eq!(answer.removed_resources, vec!["/10.244.1.20"]);
    client.ack(&answer).await;

    // A VIP lookup returns the service and its member workloads.
    client.look_up("/10.96.0.10").await;
    let answer = client.recv().await;
    assert_eq!(names(&answer), vec![WEB_1, WEB_2, WEB_SVC]);
    client.ack(&answer).await;

    // An unknown key is answered as removed.
    client.look_up("/192.0.2.1").await;
    let answer = client.recv().await;
    assert!(answer.resources.is_empty());
    assert_eq!(answer.removed_resources, vec!["/192.0.2.1"]);
    running.stop().await;
}

#[tokio::test]
async fn unknown_type_url_is_an_error_and_others_keep_being_served() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut bad = XdsClient::connect(&running).await;
    bad.send(DeltaDiscoveryRequest {
        node: Some(ztunnel_node("node-a")),
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..Default::default()
    })
    .await;
    let status = bad
        .next()
        .await
        .expect_err("an unknown type URL must fail the stream");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("envoy.config.cluster.v3.Cluster"),
        "{}",
        status.message()
    );

    let mut good = XdsClient::connect(&running).await;
    good.subscribe_wildcard(BTreeMap::new()).await;
    let (addresses_response, _) = good.initial_sync().await;
    assert_eq!(addresses_response.resources.len(), 4);
    running.stop().await;
}

/// ztunnel's types are served only on delta ADS: a state-of-the-world request for one ends
/// its stream with `Unimplemented` (the debug types are tested in tests/it/ca_tls.rs).
#[tokio::test]
async fn state_of_the_world_serves_only_debug_types() {
    use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client =
        AggregatedDiscoveryServiceClient::connect(format!("http://{}", running.xds_address))
            .await
            .unwrap();
    let request = ambientd::pb::xds::DiscoveryRequest {
        type_url: ADDRESS_TYPE.into(),
        ..Default::default()
    };
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::iter(vec![request]))
        .await
        .expect("the stream opens")
        .into_inner();
    let status = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("answered in time")
        .expect_err("an Address request on SotW must be refused");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert!(status.message().contains("DeltaAggregatedResources"));
    running.stop().await;
}

#[tokio::test]
async fn bad_input_is_skipped_and_everything_else_is_served() {
    let mesh = mesh();
    // An object with an invalid IP, an unknown kind, and a file that is not YAML at all.
    mesh.write("bad-ip.yaml", &pod("broken", "10.244.1.300", "web", "v1"));
    mesh.write(
        "unknown.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n",
    );
    mesh.write(
        "garbage.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n",
    );
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, _) = client.initial_sync().await;
    assert_eq!(names(&initial), vec![DB_1, WEB_1, WEB_2, WEB_SVC]);

    // A file that breaks keeps its last good content: db-1 stays.
    mesh.write("pods/db.yaml", "kind: Pod\n  bad: indentation\n - x");
    client.expect_silence(Duration::from_millis(700)).await;
    // And when it is fixed, the fix applies.
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.21", "db", "v1"));
    let update = client.recv().await;
    assert_eq!(names(&update), vec![DB_1]);
    running.stop().await;
}

#[tokio::test]
async fn serves_the_example_mesh() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let running = start(&dir).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, authorizations) = client.initial_sync().await;
    // Static strict, the converted port-level policy, and three AuthorizationPolicies; the
    // waypoint (targetRefs) policy is not sent.
    assert_eq!(
        names(&authorizations),
        vec![
            "bookinfo/allow-in-namespace",
            "bookinfo/converted_peer_authentication_details-metrics",
            "bookinfo/ratings-deny-admin",
            "bookinfo/reviews-from-productpage",
            "istio-system/istio_converted_static_strict",
        ]
    );
    let decoded = addresses(&initial);
    let is_workload = |a: &ambientd::pb::workload::Address| {
        matches!(
            a.r#type,
            Some(ambientd::pb::workload::address::Type::Workload(_))
        )
    };
    let workloads = decoded.values().filter(|a| is_workload(a)).count();
    // 6 bookinfo pods + the waypoint pod + a VM WorkloadEntry + the ServiceEntry's DNS workload;
    // 4 bookinfo services + the waypoint's service + the ServiceEntry host.
    assert_eq!((workloads, decoded.len() - workloads), (9, 6));

    let reviews = service(&decoded["bookinfo/reviews.bookinfo.svc.cluster.local"]);
    let waypoint = reviews
        .waypoint
        .as_ref()
        .expect("reviews uses the waypoint");
    assert_eq!(waypoint.hbone_mtls_port, 15008);
    let waypoint_service = service(&decoded["bookinfo/waypoint.bookinfo.svc.cluster.local"]);
    assert!(
        waypoint_service.waypoint.is_none(),
        "a waypoint's own service never uses one"
    );
    let external = service(&decoded["bookinfo/httpbin.org"]);
    assert_eq!(external.addresses[0].address.as_ref(), &[240, 240, 0, 1]);
    let reviews_v1 = decoded
        .iter()
        .find(|(name, _)| name.starts_with("Kubernetes//Pod/bookinfo/reviews-v1"))
        .map(|(_, a)| workload(a))
        .unwrap();
    assert_eq!(
        reviews_v1.authorization_policies,
        vec![
            "bookinfo/reviews-from-productpage",
            "istio-system/istio_converted_static_strict"
        ]
    );
    let vm = workload(&decoded["Kubernetes/networking.istio.io/WorkloadEntry/bookinfo/ratings-vm"]);
    let ratings = &vm.services["bookinfo/ratings.bookinfo.svc.cluster.local"];
    assert_eq!(
        (ratings.ports[0].service_port, ratings.ports[0].target_port),
        (9080, 9080)
    );
    running.stop().await;
}

#[tokio::test]
async fn streams_end_at_their_maximum_age_and_reconnects_resend_nothing() {
    let mesh = mesh();
    let mut config = ambientd::config::Config::local(mesh.root());
    config.max_stream_age = Some(Duration::from_millis(300));
    let running = ambientd::app::start(config).await.expect("start");
    let mut first = XdsClient::connect(&running).await;
    first.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, _) = first.initial_sync().await;
    let held = versions(&initial);

    // The stream ends with Unavailable "transport is closing" (ztunnel reconnects after 10 ms,
    // without a warning), between 270 and 330 ms.
    let started = std::time::Instant::now();
    match first.next().await {
        Err(status)
            if status.code() == tonic::Code::Unavailable
                && status.message() == "transport is closing" => {}
        other => panic!("expected the stream to end with Unavailable, got {other:?}"),
    }
    let lived = started.elapsed();
    assert!(lived < Duration::from_secs(2), "ended after {lived:?}");

    // Reconnecting with what it holds: both types answered, nothing re-sent.
    let mut second = XdsClient::connect(&running).await;
    second.subscribe_wildcard(held).await;
    let (addresses_again, authorizations) = second.initial_sync().await;
    assert!(
        addresses_again.resources.is_empty(),
        "{:?}",
        names(&addresses_again)
    );
    assert!(addresses_again.removed_resources.is_empty());
    assert!(authorizations.resources.is_empty());
    running.stop().await;
}

/// A proxy that reconnects holding names this replica does not have yet (it left a replica a
/// few events ahead) keeps them for `--reconnect-removal-grace`: one that appears meanwhile is
/// sent, and one that still does not exist when the grace ends is removed then.
#[tokio::test]
async fn a_reconnect_keeps_names_this_replica_lacks_until_the_grace_ends() {
    let mesh = mesh();
    let mut config = ambientd::config::Config::local(mesh.root());
    config.reconnect_removal_grace = Duration::from_millis(1500);
    let running = ambientd::app::start(config).await.expect("start");
    let mut first = XdsClient::connect(&running).await;
    first.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, _) = first.initial_sync().await;
    let (late, ghost) = ("Kubernetes//Pod/demo/web-3", "Kubernetes//Pod/demo/ghost");
    let mut held = versions(&initial);
    held.insert(late.into(), "0".into());
    held.insert(ghost.into(), "0".into());

    let mut second = XdsClient::connect(&running).await;
    let connected = std::time::Instant::now();
    second.subscribe_wildcard(held).await;
    let (addresses, _) = second.initial_sync().await;
    assert!(
        addresses.resources.is_empty() && addresses.removed_resources.is_empty(),
        "the first response sends and removes nothing: {:?} / {:?}",
        names(&addresses),
        addresses.removed_resources
    );

    // The late pod arrives within the grace: it is sent, never removed.
    mesh.write("pods/web-3.yaml", &pod("web-3", "10.244.1.12", "web", "v1"));
    let mut sent = Vec::new();
    let mut removed = Vec::new();
    while removed.is_empty() {
        let response = second
            .try_recv(Duration::from_secs(10))
            .await
            .expect("the ghost's removal once the grace ends");
        second.ack(&response).await;
        sent.extend(names(&response));
        removed.extend(response.removed_resources);
    }
    assert!(
        connected.elapsed() >= Duration::from_millis(1500),
        "removed after {:?}, before the grace ended",
        connected.elapsed()
    );
    assert_eq!(removed, vec![ghost.to_string()]);
    assert!(sent.iter().any(|name| name == late), "sent {sent:?}");
    running.stop().await;
}

/// A proxy that stops reading: the others keep receiving every change promptly, and the stuck
/// stream is dropped after the idle timeout instead of buffering without bound.
/// ztunnel pings every 30 s; a client pinging far more often (every 50 ms) is answered and
/// never sent away (no GOAWAY with ENHANCE_YOUR_CALM), and its stream keeps working.
#[tokio::test]
async fn frequent_keepalive_pings_are_answered_and_the_stream_lives() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect_to(running.xds_address, |e| {
        e.http2_keep_alive_interval(Duration::from_millis(50))
            .keep_alive_timeout(Duration::from_millis(500))
            .keep_alive_while_idle(true)
    })
    .await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;
    // About 40 pings, then a change must still arrive on the same stream.
    client.expect_silence(Duration::from_secs(2)).await;
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v7"));
    let update = client.recv().await;
    assert_eq!(names(&update), vec![DB_1]);
    running.stop().await;
}

/// A response over the size limit is split: every resource arrives exactly once across the
/// parts, the parts carry distinct nonces, and the next type follows.
#[tokio::test]
async fn a_large_response_is_split_under_the_limit() {
    let mesh = bulk_mesh();
    let running = start(mesh.root()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let ads = ambientd::push::AdsServer::new(
        running.snapshots.clone(),
        running.registry.clone(),
        running.metrics.clone(),
    )
    .with_max_response_bytes(64 * 1024)
    .with_shutdown(stop.clone())
    .into_service();
    let server = tokio::spawn(
        ambientd::push::server::grpc_server()
            .add_service(ads)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    let expected: usize = running
        .snapshots
        .borrow()
        .as_ref()
        .map(|s| s.addresses.len())
        .unwrap();
    let mut client = XdsClient::connect_to(address, |e| e).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let mut seen = std::collections::BTreeSet::new();
    let mut nonces = std::collections::BTreeSet::new();
    let mut parts = 0;
    let authorizations = loop {
        let response = client.recv().await;
        client.ack(&response).await;
        if response.type_url == AUTHORIZATION_TYPE {
            break response;
        }
        parts += 1;
        assert!(nonces.insert(response.nonce.clone()), "nonce reused");
        let size = prost::Message::encoded_len(&response);
        assert!(size < 80 * 1024, "part of {size} B");
        for name in names(&response) {
            assert!(seen.insert(name.clone()), "{name} sent twice");
        }
    };
    assert!(parts >= 3, "{parts} parts");
    assert_eq!(seen.len(), expected);
    assert!(authorizations.resources.is_empty());
    stop.cancel();
    tokio::time::timeout(WAIT, server)
        .await
        .expect("server did not stop")
        .unwrap()
        .unwrap();
    running.stop().await;
}

/// `--mesh-config` with `serviceEntryVisibility`, read as the CLI reads it, reaches what ztunnel
/// is sent: a NAMESPACE entry is marked and not canonical, a NONE entry (and its endpoint) is
/// not sent at all, and relabelling its namespace publishes it.
#[tokio::test]
async fn service_entry_visibility_from_the_mesh_config_shapes_what_is_sent() {
    use ambientd::config::{Cli, Command, Config};
    use clap::Parser;
    let entry = |namespace: &str, endpoint: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\n\
             metadata: {{name: api, namespace: {namespace}}}\n\
             spec:\n  hosts: [api.example.com]\n  addresses: [240.0.0.1]\n  \
             ports: [{{number: 80, name: http, protocol: HTTP}}]\n  resolution: STATIC\n  \
             endpoints: [{{address: {endpoint}}}]\n"
        )
    };
    let namespaces = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n\
                      apiVersion: v1\nkind: Namespace\nmetadata: {name: sandbox, labels: {tier: untrusted}}\n";
    let manifests = Manifests::new(&[
        ("namespaces.yaml", namespaces),
        ("team-a.yaml", &entry("team-a", "10.1.0.1")),
        ("sandbox.yaml", &entry("sandbox", "10.3.0.1")),
    ]);
    let mesh_dir = tempfile::tempdir().unwrap();
    let mesh_file = mesh_dir.path().join("mesh");
    std::fs::write(
        &mesh_file,
        "serviceEntryVisibility:\n  defaultVisibility: NAMESPACE\n  policies:\n  \
         - visibility: NONE\n    matchingRules:\n    - namespaceSelector: {matchLabels: {tier: untrusted}}\n",
    )
    .unwrap();
    let cli = Cli::try_parse_from([
        "ambientd",
        "serve",
        "--manifests",
        manifests.root().to_str().unwrap(),
        "--mesh-config",
        mesh_file.to_str().unwrap(),
    ])
    .unwrap();
    let Command::Serve(args) = cli.command else {
        panic!("not serve")
    };
    let parsed = Config::try_from(*args).unwrap();
    let config = Config {
        settings: parsed.settings,
        mesh_config: parsed.mesh_config,
        mesh_poll: Duration::from_millis(50),
        ..Config::local(manifests.root())
    };
    let running = ambientd::app::start(config).await.expect("start ambientd");
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (first, _) = client.initial_sync().await;
    let sent = addresses(&first);
    let team_a = service(&sent["team-a/api.example.com"]);
    assert_eq!((team_a.visibility, team_a.canonical), (1, false));
    assert!(sent.contains_key("Kubernetes/networking.istio.io/ServiceEntry/team-a/api/10.1.0.1"));
    assert!(!sent.contains_key("sandbox/api.example.com"));
    assert!(!sent.contains_key("Kubernetes/networking.istio.io/ServiceEntry/sandbox/api/10.3.0.1"));
    client.ack(&first).await;

    // The sandbox is trusted again: its entry and endpoint arrive, NAMESPACE like the other.
    manifests.write(
        "namespaces.yaml",
        &namespaces.replace(", labels: {tier: untrusted}", ""),
    );
    let pushed = client.recv().await;
    let sent = addresses(&pushed);
    assert_eq!(service(&sent["sandbox/api.example.com"]).visibility, 1);
    assert!(sent.contains_key("Kubernetes/networking.istio.io/ServiceEntry/sandbox/api/10.3.0.1"));
    client.ack(&pushed).await;

    // The mesh config is followed: a file that does not parse changes nothing...
    std::fs::write(&mesh_file, "serviceEntryVisibility: [not, a, map]\n").unwrap();
    client.expect_silence(Duration::from_millis(500)).await;
    // ... and dropping serviceEntryVisibility makes both entries public, the older canonical.
    std::fs::write(&mesh_file, "rootNamespace: istio-system\n").unwrap();
    let pushed = client.recv().await;
    let sent = addresses(&pushed);
    let (team_a, sandbox) = (
        service(&sent["team-a/api.example.com"]),
        service(&sent["sandbox/api.example.com"]),
    );
    assert_eq!((team_a.visibility, sandbox.visibility), (0, 0));
    assert!(
        team_a.canonical ^ sandbox.canonical,
        "exactly one is canonical"
    );
    running.stop().await;
}
