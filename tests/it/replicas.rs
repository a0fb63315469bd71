//! Replicas agree: given the same inputs, two ambientd instances produce byte-identical
//! resources with identical versions, whatever order and timing the inputs arrived in. So a
//! ztunnel that moves from one replica to another (a rolling update, --max-connection-age, a
//! replica lost) reports what it holds in `initial_resource_versions` and is re-sent nothing.

use crate::support::common as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ambientd::app::Running;
use ambientd::discovery::Snapshot;
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use bytes::Bytes;
use support::*;

const PASSING: &str = "Kubernetes//Pod/bookinfo/passing";

/// What a proxy can observe of one resource: its version and exact bytes (and the aliases that
/// on-demand lookups use).
type Contents = BTreeMap<(&'static str, String), (String, Bytes, Vec<String>)>;

fn contents(snapshot: &Snapshot) -> Contents {
    let mut all = Contents::new();
    for (type_url, map) in [
        (ADDRESS_TYPE, &snapshot.addresses),
        (AUTHORIZATION_TYPE, &snapshot.authorizations),
    ] {
        for (name, resource) in map.iter() {
            assert_eq!(&resource.name, name);
            assert_eq!(resource.type_url(), type_url);
            all.insert(
                (type_url, name.to_string()),
                (
                    resource.version.to_string(),
                    resource.value().to_vec().into(),
                    Vec::new(),
                ),
            );
        }
    }
    // The alias index too, each key with the names it holds.
    for (alias, names) in snapshot.alias_texts() {
        all.insert(
            ("alias", alias),
            (
                String::new(),
                Bytes::new(),
                names.iter().map(|n| n.to_string()).collect(),
            ),
        );
    }
    all
}

fn current(running: &Running) -> Arc<Snapshot> {
    running
        .snapshots
        .borrow()
        .clone()
        .expect("a ready replica has a snapshot")
}

/// Waits until `running` serves exactly `want`; fails loudly, showing the difference, if it
/// does not within the wait.
async fn wait_for_contents(running: &Running, want: &Contents, who: &str) {
    let mut snapshots = running.snapshots.clone();
    let reached = tokio::time::timeout(
        WAIT,
        snapshots.wait_for(|s| s.as_ref().is_some_and(|s| &contents(s) == want)),
    )
    .await;
    if reached.is_err() {
        let have = contents(&current(running));
        let differ: Vec<_> = want
            .keys()
            .chain(have.keys())
            .filter(|k| want.get(*k) != have.get(*k))
            .collect();
        panic!("{who} did not converge within {WAIT:?}; differing resources: {differ:?}");
    }
}

/// Copies the example mesh into a fresh directory.
fn bookinfo() -> Manifests {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let manifests = Manifests::new(&[]);
    for entry in std::fs::read_dir(&source).expect("examples/bookinfo") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        manifests.write(
            &name,
            &std::fs::read_to_string(&path).expect("read example"),
        );
    }
    manifests
}

/// Subscribes like ztunnel to both types, reporting what it holds (from another replica).
async fn subscribe(client: &XdsClient, held: &[BTreeMap<String, String>; 2]) {
    for (type_url, known) in [(ADDRESS_TYPE, &held[0]), (AUTHORIZATION_TYPE, &held[1])] {
        client
            .send(DeltaDiscoveryRequest {
                node: Some(ztunnel_node("node-a")),
                type_url: type_url.to_string(),
                initial_resource_versions: known.clone().into_iter().collect(),
                ..Default::default()
            })
            .await;
    }
}

fn held(
    addresses: &DeltaDiscoveryResponse,
    authorizations: &DeltaDiscoveryResponse,
) -> [BTreeMap<String, String>; 2] {
    [versions(addresses), versions(authorizations)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_the_same_inputs_serve_identical_bytes_and_versions() {
    let mesh = bookinfo();
    let a = start(mesh.root()).await;
    let b = start(mesh.root()).await;
    let (in_a, in_b) = (contents(&current(&a)), contents(&current(&b)));
    assert!(
        in_a.len() >= 15,
        "the example mesh serves many resources: {}",
        in_a.len()
    );
    assert!(in_a.keys().any(|(t, _)| *t == AUTHORIZATION_TYPE));
    assert_eq!(in_a, in_b, "two replicas on the same manifests disagree");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_moves_between_replicas_is_re_sent_nothing() {
    let mesh = bookinfo();
    let a = start(mesh.root()).await;
    let b = start(mesh.root()).await;

    // Fully synced with A.
    let mut client = XdsClient::connect(&a).await;
    subscribe(&client, &Default::default()).await;
    let (addresses, authorizations) = client.initial_sync().await;
    assert!(!addresses.resources.is_empty() && !authorizations.resources.is_empty());
    let held = held(&addresses, &authorizations);
    drop(client);

    // Moves to B, reporting what A sent: B re-sends nothing and removes nothing.
    let mut client = XdsClient::connect(&b).await;
    subscribe(&client, &held).await;
    let (addresses, authorizations) = client.initial_sync().await;
    for response in [&addresses, &authorizations] {
        assert!(
            response.resources.is_empty() && response.removed_resources.is_empty(),
            "{} re-sent {:?}, removed {:?}",
            response.type_url,
            names(response),
            response.removed_resources
        );
    }
    client
        .expect_silence(std::time::Duration::from_millis(300))
        .await;

    // A change after the move still arrives, and only it.
    let pods = std::fs::read_to_string(mesh.path("pods.yaml")).unwrap();
    mesh.write("pods.yaml", &pods.replace("version: v3", "version: v4"));
    let update = client.recv().await;
    assert_eq!(update.type_url, ADDRESS_TYPE);
    assert_eq!(
        names(&update),
        ["Kubernetes//Pod/bookinfo/reviews-v3-56d5f6f7d9-p8tzs"]
    );
    assert_eq!(workload(&addresses_of(&update)[0]).canonical_revision, "v4");
    a.stop().await;
    b.stop().await;
}

/// Waits until `running` publishes a snapshot after generation `before`; returns its generation.
async fn snapshot_after(running: &Running, before: u64) -> u64 {
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(
        WAIT,
        snapshots.wait_for(|s| s.as_ref().is_some_and(|s| s.generation > before)),
    )
    .await
    .expect("an edit was not applied in time")
    .expect("snapshot channel closed");
    current(running).generation
}

fn addresses_of(response: &DeltaDiscoveryResponse) -> Vec<ambientd::pb::workload::Address> {
    addresses(response).into_values().collect()
}

/// The same final inputs, reached by different paths: A sees each edit on its own, in one
/// order; B sees them in another order, in one burst, with a pod that comes and goes. Both end
/// up byte-identical to a replica started fresh on the final files, and a client moves from A
/// to B with nothing re-sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_whatever_order_and_timing_the_edits_arrived_in() {
    let (mesh_a, mesh_b) = (bookinfo(), bookinfo());
    let a = start(mesh_a.root()).await;
    let b = start(mesh_b.root()).await;

    let pods = std::fs::read_to_string(mesh_a.path("pods.yaml")).unwrap();
    let edited_pods = pods.replace("version: v3", "version: v4");
    let extra_policy = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: details-from-productpage, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: details}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/bookinfo/sa/bookinfo-productpage"]}}]
"#;
    let passing_pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: passing, namespace: bookinfo, labels: {app: details}}
spec: {nodeName: node-a, containers: [{name: main}]}
status: {phase: Running, podIP: 10.244.1.99}
"#;

    // A: one edit at a time, each served before the next.
    let before = current(&a).generation;
    mesh_a.write("pods.yaml", &edited_pods);
    let before = snapshot_after(&a, before).await;
    mesh_a.write("extra-policy.yaml", extra_policy);
    let before = snapshot_after(&a, before).await;
    mesh_a.remove("external.yaml");
    snapshot_after(&a, before).await;

    // B: the other order, with a pod that comes (and is served) and goes on the way, the
    // rest in one burst.
    mesh_b.remove("external.yaml");
    mesh_b.write("passing.yaml", passing_pod);
    let mut snapshots = b.snapshots.clone();
    tokio::time::timeout(
        WAIT,
        snapshots.wait_for(|s| {
            s.as_ref().is_some_and(|s| {
                s.addresses.contains_key(PASSING)
                    && !s.addresses.contains_key("bookinfo/httpbin.org")
            })
        }),
    )
    .await
    .expect("B did not serve the passing pod in time")
    .unwrap();
    mesh_b.write("extra-policy.yaml", extra_policy);
    mesh_b.remove("passing.yaml");
    mesh_b.write("pods.yaml", &edited_pods);

    // The truth: a replica started on the final files.
    let fresh = start(mesh_a.root()).await;
    let want = contents(&current(&fresh));
    assert!(want.contains_key(&(
        AUTHORIZATION_TYPE,
        "bookinfo/details-from-productpage".to_string()
    )));
    assert!(!want.contains_key(&(ADDRESS_TYPE, PASSING.to_string())));
    wait_for_contents(&a, &want, "replica A").await;
    wait_for_contents(&b, &want, "replica B").await;

    // A client synced with A moves to B: nothing is re-sent.
    let mut client = XdsClient::connect(&a).await;
    subscribe(&client, &Default::default()).await;
    let (addresses, authorizations) = client.initial_sync().await;
    let held = held(&addresses, &authorizations);
    drop(client);
    let mut client = XdsClient::connect(&b).await;
    subscribe(&client, &held).await;
    let (addresses, authorizations) = client.initial_sync().await;
    assert!(addresses.resources.is_empty() && addresses.removed_resources.is_empty());
    assert!(authorizations.resources.is_empty() && authorizations.removed_resources.is_empty());
    for running in [a, b, fresh] {
        running.stop().await;
    }
}
