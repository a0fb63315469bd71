//! Waypoint benchmarks W1 and W2 (targets and figures in BENCHMARKS.md):
//! - W1: a namespace waypoint with 1,000 bound Services of 10 endpoints each: the cold build
//!   of its LDS+CDS+EDS (target < 100 ms), the bytes of each type, and the incremental update
//!   after one endpoint change.
//! - W2: one endpoint change with 100 waypoint streams connected (the waypoint's replicas, over
//!   delta ADS on 127.0.0.1): the bytes pushed to each (target: one ClusterLoadAssignment,
//!   < 2 KiB) and the p99 from publishing the snapshot to each stream's receipt (< 50 ms).
//!
//! - W3: the same waypoint with 1,000 HTTPRoutes, one per Service: the cold build of its
//!   config (LDS holds every chain's routes, inline as istiod sends them), and a one-route
//!   change: the update's time, and the bytes a stream is sent (the whole `main_internal`,
//!   as istiod re-sends it), beside what the changed chain's RouteConfiguration alone weighs
//!   (what RDS would send).
//!
//! Run: `cargo bench --bench waypoint` (`-- w1`, `-- w2` or `-- w3` for one; `--streams N`,
//! `--rounds N`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambientd::discovery::{
    CLUSTER_TYPE, ENDPOINT_TYPE, Event, Index, LISTENER_TYPE, ResourceType, Settings, Snapshot,
    WORKLOAD_TYPE,
};
use ambientd::metrics::Metrics;
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ambientd::push::{AdsServer, Registry};
use ambientd::waypoint::{ConfigId, WaypointConfig, WaypointProxy, WaypointSettings};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SERVICES: usize = 1000;
const ENDPOINTS: usize = 10;
const NS: &str = "apps";

fn pod_ip(service: usize, endpoint: usize) -> String {
    let n = service * ENDPOINTS + endpoint;
    format!("10.1.{}.{}", n / 250, n % 250 + 1)
}

fn pod_yaml(service: usize, endpoint: usize, suffix: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: svc-{service}-{endpoint}{suffix}\n  namespace: {NS}\n  labels: {{app: svc-{service}}}\n  annotations: {{ambient.istio.io/redirection: enabled}}\nspec: {{serviceAccountName: svc-{service}, nodeName: node-{}}}\nstatus: {{phase: Running, podIP: {}, conditions: [{{type: Ready, status: \"True\"}}]}}\n",
        endpoint % 10,
        pod_ip(service, endpoint),
    )
}

/// The mesh of W1/W2 as manifests: the namespace waypoint (class, Gateway, Service, pod) and
/// 1,000 Services labelled to use it, each with 10 ambient pods.
fn mesh_yaml() -> String {
    let mut docs = vec![format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}, labels: {{istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: istio-waypoint}}
spec: {{controllerName: istio.io/mesh-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: waypoint, namespace: {NS}}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{{name: mesh, port: 15008, protocol: HBONE}}]
status:
  addresses: [{{type: IPAddress, value: 10.96.0.10}}]
---
apiVersion: v1
kind: Service
metadata: {{name: waypoint, namespace: {NS}, labels: {{istio.io/use-waypoint: none}}}}
spec:
  clusterIP: 10.96.0.10
  selector: {{gateway.networking.k8s.io/gateway-name: waypoint}}
  ports: [{{name: mesh, port: 15008, appProtocol: hbone}}]
"#
    )];
    for s in 0..SERVICES {
        docs.push(format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: {NS}}}\nspec:\n  clusterIP: 10.97.{}.{}\n  selector: {{app: svc-{s}}}\n  ports: [{{name: http, port: 8080}}]\n",
            s / 250,
            s % 250 + 1
        ));
        for e in 0..ENDPOINTS {
            docs.push(pod_yaml(s, e, ""));
        }
    }
    docs.join("---\n")
}

/// Service `s`'s HTTPRoute: a canary path (version `v`) with a header match to the next
/// service, and a 90/10 split of everything else between it and the next one.
fn route_yaml(s: usize, v: usize) -> String {
    let next = (s + 1) % SERVICES;
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: route-{s}, namespace: {NS}}}
spec:
  parentRefs: [{{group: "", kind: Service, name: svc-{s}}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /api/v{v}}}, headers: [{{name: x-canary, value: "true"}}]}}]
    backendRefs: [{{name: svc-{next}, port: 8080}}]
  - matches: [{{path: {{type: PathPrefix, value: /}}}}]
    timeouts: {{request: 10s}}
    backendRefs: [{{name: svc-{s}, port: 8080, weight: 90}}, {{name: svc-{next}, port: 8080, weight: 10}}]
"#
    )
}

fn index_of(yaml: &str) -> Index {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut index = Index::new(Settings::default());
    // The manifests reader takes up to 1,024 documents a file.
    let docs: Vec<&str> = yaml.split("---\n").collect();
    for (i, chunk) in docs.chunks(1000).enumerate() {
        let path = dir.path().join(format!("mesh-{i}.yaml"));
        std::fs::write(&path, chunk.join("---\n")).expect("write");
        for object in ambientd::kube::manifests::read_file(&path).expect("manifests") {
            index.handle(Event::Apply(object));
        }
    }
    index
}

/// Applies one more pod of service 0 (an endpoint change), or removes it again.
fn endpoint_change(index: &mut Index, round: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pod.yaml");
    let yaml = pod_yaml(0, 0, "-x").replace(&pod_ip(0, 0), &format!("10.2.0.{}", round % 250 + 1));
    std::fs::write(&path, yaml).expect("write");
    for object in ambientd::kube::manifests::read_file(&path).expect("pod") {
        index.handle(Event::Apply(object));
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// A replica of the waypoint: its own pod name and IP, the Gateway's label.
fn node(replica: usize) -> Node {
    let labels = Value {
        kind: Some(Kind::StructValue(Struct {
            fields: [(
                "gateway.networking.k8s.io/gateway-name".to_string(),
                string("waypoint"),
            )]
            .into(),
        })),
    };
    let ip = format!("10.244.9.{}", replica % 250 + 1);
    Node {
        id: format!("waypoint~{ip}~waypoint-{replica}.{NS}~{NS}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), string(NS)),
                ("INSTANCE_IPS".to_string(), string(&ip)),
                ("LABELS".to_string(), labels),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn bytes(config: &WaypointConfig, kind: ResourceType) -> (usize, usize) {
    let resources = config.of(kind).expect("an Envoy type");
    (
        resources.len(),
        resources.values().map(|r| r.value_len()).sum(),
    )
}

fn w1(rounds: usize) {
    let started = Instant::now();
    let mut index = index_of(&mesh_yaml());
    let snapshot = index.snapshot();
    eprintln!(
        "W1 mesh: {} services x {} endpoints indexed in {:.1} s",
        SERVICES,
        ENDPOINTS,
        started.elapsed().as_secs_f64()
    );
    let settings = WaypointSettings::default();
    let proxy = WaypointProxy::from_node(&node(0)).expect("waypoint node");
    let id = ConfigId::of(&proxy, &snapshot, &settings.domain);
    let mut builds = Vec::new();
    let mut config = None;
    for _ in 0..rounds {
        let started = Instant::now();
        let built = WaypointConfig::build(&id, &snapshot, &settings);
        builds.push(started.elapsed().as_secs_f64() * 1e3);
        config = Some(built);
    }
    let config = config.expect("built");
    println!(
        "W1 cold build (LDS+CDS+EDS, {} clusters): median {:.1} ms over {rounds} (min {:.1}, max {:.1}); target < 100 ms",
        config.clusters.len(),
        median(builds.clone()),
        builds.iter().cloned().fold(f64::MAX, f64::min),
        builds.iter().cloned().fold(0.0, f64::max),
    );
    for (label, kind) in [
        ("LDS", ResourceType::Listener),
        ("CDS", ResourceType::Cluster),
        ("EDS", ResourceType::ClusterLoadAssignment),
    ] {
        let (count, size) = bytes(&config, kind);
        println!(
            "W1 {label}: {count} resources, {size} B ({:.1} KiB)",
            size as f64 / 1024.0
        );
    }
    // One endpoint change: the incremental update.
    let mut updates = Vec::new();
    let mut current = Arc::new(config);
    for round in 0..rounds {
        endpoint_change(&mut index, round);
        let snapshot = index.snapshot();
        let started = Instant::now();
        let next = current.update(&id, &snapshot, &settings);
        updates.push(started.elapsed().as_secs_f64() * 1e3);
        current = Arc::new(next);
    }
    println!(
        "W1 update after one endpoint change: median {:.2} ms over {rounds}",
        median(updates)
    );
}

/// Applies `yaml` (one or more documents) to the index.
fn apply(index: &mut Index, yaml: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("change.yaml");
    std::fs::write(&path, yaml).expect("write");
    for object in ambientd::kube::manifests::read_file(&path).expect("manifests") {
        index.handle(Event::Apply(object));
    }
}

/// The encoded size of each HTTP chain's inline RouteConfiguration in `main_internal`.
fn route_config_sizes(config: &WaypointConfig) -> BTreeMap<String, usize> {
    use ambientd::pb::envoy::config::listener::v3::{Listener, filter};
    use ambientd::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    let main = Listener::decode(config.listeners["main_internal"].value()).expect("listener");
    let mut sizes = BTreeMap::new();
    for chain in &main.filter_chains {
        for f in &chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if !any.type_url.ends_with("HttpConnectionManager") {
                continue;
            }
            let hcm = HttpConnectionManager::decode(any.value.clone()).expect("hcm");
            if let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier {
                sizes.insert(chain.name.clone(), rc.encoded_len());
            }
        }
    }
    sizes
}

fn w3(rounds: usize) {
    let started = Instant::now();
    let mut yaml = mesh_yaml();
    for s in 0..SERVICES {
        yaml.push_str("---\n");
        yaml.push_str(&route_yaml(s, 1));
    }
    let mut index = index_of(&yaml);
    let snapshot = index.snapshot();
    eprintln!(
        "W3 mesh: {} services x {} endpoints and {} HTTPRoutes indexed in {:.1} s",
        SERVICES,
        ENDPOINTS,
        snapshot.routes.len(),
        started.elapsed().as_secs_f64()
    );
    let settings = WaypointSettings::default();
    let proxy = WaypointProxy::from_node(&node(0)).expect("waypoint node");
    let id = ConfigId::of(&proxy, &snapshot, &settings.domain);
    let mut builds = Vec::new();
    let mut config = None;
    for _ in 0..rounds {
        let started = Instant::now();
        let built = WaypointConfig::build(&id, &snapshot, &settings);
        builds.push(started.elapsed().as_secs_f64() * 1e3);
        config = Some(built);
    }
    let config = config.expect("built");
    println!(
        "W3 cold build with 1,000 routes (LDS+CDS+EDS): median {:.1} ms over {rounds} (min {:.1}, max {:.1})",
        median(builds.clone()),
        builds.iter().cloned().fold(f64::MAX, f64::min),
        builds.iter().cloned().fold(0.0, f64::max),
    );
    for (label, kind) in [
        ("LDS", ResourceType::Listener),
        ("CDS", ResourceType::Cluster),
        ("EDS", ResourceType::ClusterLoadAssignment),
    ] {
        let (count, size) = bytes(&config, kind);
        println!(
            "W3 {label}: {count} resources, {size} B ({:.1} KiB)",
            size as f64 / 1024.0
        );
    }
    let route_configs = route_config_sizes(&config);
    let inline: usize = route_configs.values().sum();
    let main = config.listeners["main_internal"].value_len();
    println!(
        "W3 main_internal {main} B, of which {} inline RouteConfigurations {inline} B (median {} B each)",
        route_configs.len(),
        median(route_configs.values().map(|v| *v as f64).collect()),
    );
    // One route changes (its canary path), round after round.
    let mut current = Arc::new(config);
    let mut updates = Vec::new();
    let mut sent = Vec::new();
    let mut rds = Vec::new();
    let mut changed_names = BTreeMap::<String, usize>::new();
    for round in 0..rounds {
        apply(&mut index, &route_yaml(0, round + 2));
        let snapshot = index.snapshot();
        let started = Instant::now();
        let next = current.update(&id, &snapshot, &settings);
        updates.push(started.elapsed().as_secs_f64() * 1e3);
        // What a stream holding `current` is sent: every resource whose version changed.
        let mut bytes_sent = 0;
        for kind in [
            ResourceType::Listener,
            ResourceType::Cluster,
            ResourceType::ClusterLoadAssignment,
        ] {
            let before = current.of(kind).expect("type");
            for (name, resource) in next.of(kind).expect("type") {
                if before
                    .get(name)
                    .is_none_or(|b| b.version != resource.version)
                {
                    bytes_sent += resource.value_len();
                    *changed_names.entry(name.to_string()).or_default() += 1;
                }
            }
        }
        sent.push(bytes_sent as f64);
        let sizes = route_config_sizes(&next);
        let chain = format!("inbound-vip|8080|http|svc-0.{NS}.svc.cluster.local");
        rds.push(sizes[&chain] as f64);
        current = Arc::new(next);
    }
    println!(
        "W3 one-route change: update median {:.1} ms over {rounds}; bytes sent per stream median {:.0} B ({:?}); with RDS the changed RouteConfiguration alone would be {:.0} B",
        median(updates),
        median(sent),
        changed_names.keys().collect::<Vec<_>>(),
        median(rds),
    );
}

struct Stream {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Stream {
    async fn open(address: std::net::SocketAddr, replica: usize, eds: &[String]) -> Stream {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut grpc = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(512 * 1024 * 1024);
        let (requests, rx) = mpsc::channel(16);
        let responses = grpc
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        let mut stream = Stream {
            requests,
            responses,
        };
        for (type_url, names) in [
            (CLUSTER_TYPE, Vec::new()),
            (ENDPOINT_TYPE, eds.to_vec()),
            (LISTENER_TYPE, Vec::new()),
            (WORKLOAD_TYPE, Vec::new()),
        ] {
            stream
                .send(DeltaDiscoveryRequest {
                    node: Some(node(replica)),
                    type_url: type_url.into(),
                    resource_names_subscribe: names,
                    ..Default::default()
                })
                .await;
            let response = stream.recv().await;
            stream.ack(&response).await;
        }
        stream
    }

    async fn send(&self, request: DeltaDiscoveryRequest) {
        self.requests.send(request).await.expect("send");
    }

    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(60), self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream")
            .expect("open")
    }

    async fn ack(&self, response: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await;
    }
}

fn w2(streams: usize, rounds: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut index = index_of(&mesh_yaml());
        let snapshot = index.snapshot();
        let settings = WaypointSettings::default();
        let proxy = WaypointProxy::from_node(&node(0)).expect("waypoint node");
        let id = ConfigId::of(&proxy, &snapshot, &settings.domain);
        let eds: Vec<String> = WaypointConfig::build(&id, &snapshot, &settings)
            .endpoints
            .keys()
            .map(|n| n.to_string())
            .collect();
        let listener = ambientd::push::server::listen("127.0.0.1:0".parse().unwrap()).expect("bind");
        let address = listener.local_addr().expect("addr");
        let (publish, snapshots) = watch::channel::<Option<Arc<Snapshot>>>(Some(snapshot));
        let ads = AdsServer::new(snapshots, Arc::new(Registry::default()), Arc::new(Metrics::new()))
            .into_service();
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            let _ = ambientd::push::server::grpc_server()
                .add_service(ads)
                .serve_with_incoming_shutdown(
                    ambientd::push::listener::proxy_connections(listener),
                    token.cancelled_owned(),
                )
                .await;
        });
        let started = Instant::now();
        let mut clients = Vec::new();
        for replica in 0..streams {
            clients.push(Stream::open(address, replica, &eds).await);
        }
        eprintln!(
            "W2: {streams} waypoint streams synced in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let mut latencies = Vec::new();
        let mut eds_bytes = Vec::new();
        let mut other_types = BTreeMap::<String, usize>::new();
        for round in 0..rounds {
            endpoint_change(&mut index, round);
            let snapshot = index.snapshot();
            let published = Instant::now();
            publish.send_replace(Some(snapshot));
            let (tx, mut rx) = mpsc::channel(streams);
            for (i, mut client) in clients.drain(..).enumerate() {
                let tx = tx.clone();
                tokio::spawn(async move {
                    // The EDS response (a Workload one comes too: every waypoint gets every
                    // workload change, as from istiod).
                    let mut got = Vec::new();
                    loop {
                        let response = client.recv().await;
                        client.ack(&response).await;
                        let at = published.elapsed();
                        let size: usize = response.resources.iter().map(|r| r.encoded_len()).sum();
                        let done = response.type_url == ENDPOINT_TYPE;
                        got.push((response.type_url.clone(), at, size));
                        if done {
                            break;
                        }
                    }
                    let _ = tx.send((i, client, got)).await;
                });
            }
            drop(tx);
            let mut back = Vec::new();
            while let Some(item) = rx.recv().await {
                back.push(item);
            }
            back.sort_by_key(|(i, _, _)| *i);
            for (_, client, got) in back {
                for (type_url, at, size) in got {
                    if type_url == ENDPOINT_TYPE {
                        latencies.push(at.as_secs_f64() * 1e3);
                        eds_bytes.push(size as f64);
                    } else {
                        *other_types.entry(type_url).or_default() += 1;
                    }
                }
                clients.push(client);
            }
            // The Workload responses that may follow the EDS one.
            tokio::time::sleep(Duration::from_millis(50)).await;
            for client in &mut clients {
                while let Ok(Some(Ok(Some(response)))) =
                    tokio::time::timeout(Duration::from_millis(1), async {
                        Some(client.responses.message().await)
                    })
                    .await
                {
                    client.ack(&response).await;
                    *other_types.entry(response.type_url.clone()).or_default() += 1;
                }
            }
        }
        println!(
            "W2 one endpoint change, {streams} streams x {rounds} rounds: EDS bytes per stream median {:.0} B (max {:.0}); publish->receipt p50 {:.1} ms, p99 {:.1} ms (target < 50 ms)",
            median(eds_bytes.clone()),
            eds_bytes.iter().cloned().fold(0.0, f64::max),
            percentile(latencies.clone(), 0.5),
            percentile(latencies, 0.99),
        );
        println!("W2 other responses per change (all streams): {other_types:?} (no LDS or CDS expected)");
        stop.cancel();
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = flag("--rounds", 7);
    let streams = flag("--streams", 100);
    let pick: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| a.starts_with('w') || a.starts_with('W'))
        .collect();
    let wants = |name: &str| pick.is_empty() || pick.iter().any(|p| p.eq_ignore_ascii_case(name));
    if wants("w1") {
        w1(rounds);
    }
    if wants("w2") {
        w2(streams, rounds.max(5));
    }
    if wants("w3") {
        w3(rounds);
    }
}
