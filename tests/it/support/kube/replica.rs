//! Whole ambientd replicas (`app::start` in cluster mode, every cluster write on, a 2 s Lease)
//! against the fake API server, and a poller that fails loudly, for the tests of what replicas
//! write (kube_writes.rs, chart_rbac_calls.rs, status_app.rs).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ambientd::app::{self, Running};
use ambientd::ca::CaConfig;
use ambientd::config::Config;
use ambientd::kube::cluster::{ClusterConfig, DiscoverySelectors, Retry};
use ambientd::kube::leader::LeaderConfig;
use ambientd::kube::writes::ClusterWrites;

use super::FakeApiServer;

/// How long a replica may take to start, and any [`until`] to hold.
pub const WAIT: Duration = Duration::from_secs(30);
/// The replicas' system namespace (the Lease and the CA Secrets live there).
pub const SYSTEM: &str = "istio-system";

pub struct Replica {
    pub running: Running,
    pub ca_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Replica {
    /// The root bundle this replica hands its clients.
    pub fn root(&self) -> String {
        std::fs::read_to_string(self.ca_dir.join("root-cert.pem")).expect("root-cert.pem")
    }
}

/// Starts a replica named `identity` (its Lease holder identity) with fast retries, as the
/// chart's defaults run it: leader election, the CA in Secrets, root ConfigMaps and status
/// writes.
pub async fn replica(fake: &FakeApiServer, identity: &str, selectors: &[&str]) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let mut config = Config::cluster(ClusterConfig {
        kubeconfig: Some(fake.kubeconfig(dir.path())),
        retry: Retry::Exponential {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        discovery_selectors: DiscoverySelectors::parse_all(selectors).unwrap(),
        ..ClusterConfig::default()
    });
    config.settings.system_namespace = SYSTEM.into();
    config.ca = Some(CaConfig::local(&ca_dir));
    config.writes = Some(ClusterWrites {
        leader: Some(LeaderConfig {
            identity: identity.into(),
            lease_duration: Duration::from_secs(2),
            renew_grace: Duration::from_secs(1),
            ..LeaderConfig::new(SYSTEM)
        }),
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        ..ClusterWrites::new(SYSTEM)
    });
    let running = tokio::time::timeout(WAIT, app::start(config))
        .await
        .expect("ambientd started in time")
        .expect("ambientd starts");
    Replica {
        running,
        ca_dir,
        _dir: dir,
    }
}

/// Polls `check` until it holds; panics naming `what` after [`WAIT`].
pub async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `running`'s published snapshot satisfies `check`; panics naming `what` after
/// [`WAIT`].
pub async fn snapshot_until(
    running: &Running,
    what: &str,
    check: impl Fn(&ambientd::discovery::Snapshot) -> bool,
) -> std::sync::Arc<ambientd::discovery::Snapshot> {
    let mut snapshots = running.snapshots.clone();
    let found = tokio::time::timeout(
        WAIT,
        snapshots.wait_for(|s| s.as_ref().is_some_and(|s| check(s))),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
    .expect("snapshot channel closed");
    found.clone().expect("published")
}
