//! The IP auto-allocator in a whole ambientd replica (app::start in cluster mode) against the
//! fake API server: addressless ServiceEntries get istiod's addresses in `status.addresses`,
//! their Services carry them to ztunnel, other status fields survive, a copied address is
//! taken back from the newer entry, and `--ip-autoallocate=false` neither writes nor serves
//! them.

use crate::support::kube as kube_support;

use std::net::IpAddr;
use std::time::Duration;

use ambientd::app::{self, Running};
use ambientd::config::Config;
use ambientd::discovery::Snapshot;
use ambientd::kube::cluster::{ClusterConfig, Retry};
use ambientd::kube::writes::ClusterWrites;
use ambientd::pb::workload::{Address, address};
use kube_support::FakeApiServer;
use kube_support::replica::{snapshot_until, until};
use prost::Message;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
const SE: &str = "networking.istio.io/v1";

async fn replica(fake: &FakeApiServer, dir: &std::path::Path, allocate: bool) -> Running {
    let mut config = Config::cluster(ClusterConfig {
        kubeconfig: Some(fake.kubeconfig(dir)),
        retry: Retry::Exponential {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        ..ClusterConfig::default()
    });
    config.settings.ip_autoallocate = allocate;
    let defaults = ClusterWrites::new("istio-system");
    config.writes = Some(ClusterWrites {
        // A single replica: always the leader.
        leader: None,
        ca_secrets: false,
        root_configmaps: false,
        ip_autoallocate: defaults.ip_autoallocate.filter(|_| allocate),
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        ..defaults
    });
    tokio::time::timeout(WAIT, app::start(config))
        .await
        .expect("ambientd started in time")
        .expect("ambientd starts")
}

fn entry(name: &str, created: &str, spec: Value, status: Option<Value>) -> Value {
    let mut object = json!({
        "apiVersion": SE, "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": spec,
    });
    if let Some(status) = status {
        object["status"] = status;
    }
    object
}

fn dns(hosts: &[&str]) -> Value {
    json!({"hosts": hosts, "resolution": "DNS", "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]})
}

fn seed(fake: &FakeApiServer) {
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}));
    // Already allocated (by istiod, before ambientd): kept, and its addresses are taken.
    fake.apply(entry(
        "pre",
        "2026-01-01T00:00:00Z",
        dns(&["pre.example.com"]),
        Some(json!({"addresses": [
            {"host": "pre.example.com", "value": "240.240.0.1"},
            {"host": "pre.example.com", "value": "2001:2::1"},
        ]})),
    ));
    // New, with a condition of someone else's in its status.
    fake.apply(entry(
        "api",
        "2026-01-02T00:00:00Z",
        dns(&["api.example.com", "*.wild.example.com"]),
        Some(json!({"conditions": [{"type": "Other", "status": "True", "reason": "Kept"}]})),
    ));
    let mut opted_out = entry(
        "opt-out",
        "2026-01-02T00:00:00Z",
        dns(&["out.example.com"]),
        None,
    );
    opted_out["metadata"]["labels"] =
        json!({"networking.istio.io/enable-autoallocate-ip": "false"});
    fake.apply(opted_out);
    let mut own = dns(&["own.example.com"]);
    own["addresses"] = json!(["10.1.1.1"]);
    fake.apply(entry("own", "2026-01-02T00:00:00Z", own, None));
}

/// `status.addresses` of entry `name`, as `host=value`.
fn allocated(fake: &FakeApiServer, name: &str) -> Vec<String> {
    let object = fake
        .get(SE, "ServiceEntry", "ns", name)
        .expect("entry exists");
    object["status"]["addresses"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|a| {
                    format!(
                        "{}={}",
                        a["host"].as_str().unwrap(),
                        a["value"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses of Service `ns/<host>` in `snapshot`, `None` when it is not there.
fn service_addresses(snapshot: &Snapshot, host: &str) -> Option<Vec<IpAddr>> {
    let resource = snapshot.addresses.get(format!("ns/{host}").as_str())?;
    let address = Address::decode(resource.value()).expect("Address");
    let Some(address::Type::Service(service)) = address.r#type else {
        panic!("ns/{host} is not a service");
    };
    Some(
        service
            .addresses
            .iter()
            .map(|a| match a.address.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(&a.address[..]).unwrap()),
                _ => IpAddr::from(<[u8; 16]>::try_from(&a.address[..]).unwrap()),
            })
            .collect(),
    )
}

#[tokio::test]
async fn addressless_service_entries_get_istiods_addresses_and_serve_them() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    let dir = tempfile::tempdir().unwrap();
    let running = replica(&fake, dir.path(), true).await;

    // The next free pair after the pre-existing one, for the one non-wildcard host.
    until("api's addresses", || !allocated(&fake, "api").is_empty()).await;
    assert_eq!(
        allocated(&fake, "api"),
        ["api.example.com=240.240.0.2", "api.example.com=2001:2::2"]
    );
    let api = fake.get(SE, "ServiceEntry", "ns", "api").unwrap();
    assert_eq!(
        api["status"]["conditions"][0]["reason"], "Kept",
        "other status is kept"
    );
    assert_eq!(
        allocated(&fake, "pre"),
        ["pre.example.com=240.240.0.1", "pre.example.com=2001:2::1"]
    );
    for name in ["opt-out", "own"] {
        assert!(allocated(&fake, name).is_empty(), "{name} gets nothing");
    }
    // ztunnel gets the addresses as the Service's VIPs.
    let want: Vec<IpAddr> = vec!["240.240.0.2".parse().unwrap(), "2001:2::2".parse().unwrap()];
    snapshot_until(&running, "api's Service with its addresses", |s| {
        service_addresses(s, "api.example.com").as_ref() == Some(&want)
    })
    .await;

    // A newer entry that copies api's addresses into its status loses them to api.
    fake.apply(entry(
        "copy",
        "2026-02-01T00:00:00Z",
        dns(&["copy.example.com"]),
        Some(json!({"addresses": [
            {"host": "copy.example.com", "value": "240.240.0.2"},
            {"host": "copy.example.com", "value": "2001:2::2"},
        ]})),
    ));
    until("copy reassigned", || {
        allocated(&fake, "copy") == ["copy.example.com=240.240.0.3", "copy.example.com=2001:2::3"]
    })
    .await;
    assert_eq!(
        allocated(&fake, "api"),
        ["api.example.com=240.240.0.2", "api.example.com=2001:2::2"]
    );

    // A host added to api gets the next pair; the old host keeps its own.
    let mut api = fake.get(SE, "ServiceEntry", "ns", "api").unwrap();
    api["spec"]["hosts"] = json!(["api.example.com", "api2.example.com"]);
    fake.apply(api);
    until("api2's addresses", || allocated(&fake, "api").len() == 4).await;
    assert_eq!(
        allocated(&fake, "api"),
        [
            "api.example.com=240.240.0.2",
            "api.example.com=2001:2::2",
            "api2.example.com=240.240.0.4",
            "api2.example.com=2001:2::4"
        ]
    );
    running.stop().await;
}

#[tokio::test]
async fn with_ip_autoallocate_off_nothing_is_written_or_served() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    let dir = tempfile::tempdir().unwrap();
    let running = replica(&fake, dir.path(), false).await;
    // pre's Service is published, without the status addresses.
    let snapshot = snapshot_until(&running, "pre's Service", |s| {
        service_addresses(s, "pre.example.com").is_some()
    })
    .await;
    assert_eq!(
        service_addresses(&snapshot, "pre.example.com"),
        Some(vec![])
    );
    assert_eq!(
        service_addresses(&snapshot, "api.example.com"),
        Some(vec![])
    );
    // Give a leader's allocator time to have acted, then check that nothing did.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(allocated(&fake, "api").is_empty());
    let patches: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH") && r.contains("serviceentries"))
        .collect();
    assert!(patches.is_empty(), "{patches:?}");
    running.stop().await;
}

/// Two replicas electing a leader: only the leader allocates, and after a failover the new
/// leader reads what is allocated before it allocates, so it never hands out an address twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_allocates_and_a_new_leader_continues_where_it_left_off() {
    use kube_support::replica::{SYSTEM, replica};
    let fake = FakeApiServer::start().await;
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}}));
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}));
    fake.apply(entry(
        "first",
        "2026-01-01T00:00:00Z",
        dns(&["first.example.com"]),
        None,
    ));
    let a = replica(&fake, "a", &[]).await;
    let b = replica(&fake, "b", &[]).await;
    until("first's addresses", || {
        !allocated(&fake, "first").is_empty()
    })
    .await;
    assert_eq!(
        allocated(&fake, "first"),
        [
            "first.example.com=240.240.0.1",
            "first.example.com=2001:2::1"
        ]
    );
    let status_patches = || {
        fake.requests()
            .into_iter()
            .filter(|r| {
                r.starts_with("PATCH") && r.contains("/serviceentries/") && r.contains("/status")
            })
            .count()
    };
    // Give the other replica time to have (wrongly) written too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_patches(), 1, "{:?}", fake.requests());

    let (leader, follower) = if a.running.leadership.is_leader() {
        (a, b)
    } else {
        (b, a)
    };
    leader.running.stop().await;
    until("the follower leads", || {
        follower.running.leadership.is_leader()
    })
    .await;
    fake.apply(entry(
        "second",
        "2026-01-02T00:00:00Z",
        dns(&["second.example.com"]),
        None,
    ));
    until("second's addresses", || {
        !allocated(&fake, "second").is_empty()
    })
    .await;
    assert_eq!(
        allocated(&fake, "second"),
        [
            "second.example.com=240.240.0.2",
            "second.example.com=2001:2::2"
        ]
    );
    assert_eq!(
        allocated(&fake, "first"),
        [
            "first.example.com=240.240.0.1",
            "first.example.com=2001:2::1"
        ]
    );
    assert_eq!(status_patches(), 2, "{:?}", fake.requests());
    follower.running.stop().await;
}
