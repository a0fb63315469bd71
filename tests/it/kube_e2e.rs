//! End to end against a real cluster, ignored by default (no cluster exists in CI).
//!
//! Run against whatever `KUBECONFIG` (or `~/.kube/config`, or the in-cluster account) names:
//!
//! ```sh
//! KUBECONFIG=~/.kube/config cargo test --test it kube_e2e:: -- --ignored --nocapture
//! ```
//!
//! It needs list/watch on the kinds in docs/kubernetes.md (cluster-admin works; missing Istio
//! or Gateway API CRDs are fine: those kinds count as empty). It checks that the source syncs
//! every kind, that ambientd becomes ready and serves a Workload for every running pod with an
//! IP it listed, and prints what it saw.

use std::collections::BTreeMap;
use std::time::Duration;

use ambientd::app;
use ambientd::config::Config;
use ambientd::discovery::model::{Event, Kind, Object};
use ambientd::kube::cluster::{ClusterConfig, ClusterSource};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a reachable Kubernetes cluster (KUBECONFIG)"]
async fn syncs_a_real_cluster_and_serves_its_pods() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let source = ClusterSource::connect(ClusterConfig::default())
        .await
        .expect("a kubeconfig or in-cluster config");
    let health = source.health();
    let (tx, mut rx) = mpsc::channel(1024);
    let stop = CancellationToken::new();
    tokio::spawn(source.run(tx, stop.clone()));
    let mut counts: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut running_pods = Vec::new();
    loop {
        let event = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("the cluster did not sync in time")
            .expect("the source stopped");
        // First lists arrive as Applies; a kind whose CRD is missing as an empty Reset.
        let objects = match event {
            Event::Apply(object) => vec![object],
            Event::Reset(_, objects) => objects,
            Event::Synced => break,
            Event::Delete(_) | Event::Visibility(_) => Vec::new(),
        };
        for object in objects {
            *counts.entry(object.kind()).or_default() += 1;
            if let Object::Pod(pod) = &object
                && pod.phase() == "Running"
                && pod.ips().len() != 0
            {
                running_pods.push(format!(
                    "Kubernetes//Pod/{}/{}",
                    pod.namespace(),
                    pod.name()
                ));
            }
        }
    }
    stop.cancel();
    println!("listed: {counts:?}");
    let kinds = health.kinds();
    println!("health: {kinds:?}");
    for kind in Kind::ALL {
        let h = kinds.get(&kind).cloned().unwrap_or_default();
        assert!(h.synced, "{kind} listed (or found missing)");
        if h.missing {
            println!("{kind}: not served by this cluster (CRD missing)");
        }
    }
    assert!(
        counts.get(&Kind::Namespace).is_some_and(|n| *n > 0),
        "every cluster has namespaces"
    );

    let running = app::start(Config::cluster(ClusterConfig::default()))
        .await
        .expect("start ambientd on the cluster");
    let mut snapshots = running.snapshots.clone();
    let snapshot = tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("ambientd did not become ready")
        .expect("snapshots closed")
        .clone()
        .expect("published");
    println!(
        "ready: {} addresses, {} authorizations",
        snapshot.addresses.len(),
        snapshot.authorizations.len()
    );
    // Pods can come and go between the two lists; most must be there.
    let served = running_pods
        .iter()
        .filter(|uid| snapshot.addresses.contains_key(uid.as_str()))
        .count();
    assert!(
        served * 10 >= running_pods.len() * 9,
        "{served} of {} running pods served",
        running_pods.len()
    );
    running.stop().await;
}
