//! A waypoint in the bed: its objects (on a cluster, ambientd's waypoint controller writes
//! its Service, ServiceAccount and Deployment, and the bed plays the Deployment controller
//! and kubelet by creating the pod from the Deployment's template), `ambientd sds` for its
//! certificate (pilot-agent's job), and a real Envoy that takes its config from ambientd's
//! 15012 with a token, as the agent would.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::kube::ObjectRef;
use super::mesh::{CONTROL_PLANE, Mesh, NAMESPACE, Pod, PodSpec, STARTUP, Source};
use super::objects::{gateway, waypoint_class_and_service};
use super::observe::tail;
use super::process::{Process, wait_for};

impl Mesh {
    /// A waypoint named `name` on node `node`. Returns its Service's VIP once Envoy has its
    /// listeners.
    pub fn add_waypoint(&mut self, name: &str, node: usize) -> Ipv4Addr {
        let mut spec = PodSpec::new(name, node);
        spec.labels.clear();
        let vip = match &self.source {
            Source::Manifests => {
                let vip = Ipv4Addr::new(10, 96, 0, self.next_vip);
                self.next_vip += 1;
                let mut objects = waypoint_class_and_service(name, vip);
                objects.push(gateway(name, Some(vip)));
                self.apply(&format!("waypoint-{name}"), &objects);
                spec.labels
                    .insert("gateway.networking.k8s.io/gateway-name".into(), name.into());
                spec.labels
                    .insert("istio.io/dataplane-mode".into(), "none".into());
                vip
            }
            Source::Kube(api) => {
                self.apply(&format!("waypoint-{name}"), &[gateway(name, None)]);
                let service = wait_for(
                    &format!("ambientd's waypoint controller to create Service {name}"),
                    STARTUP,
                    || {
                        let service =
                            api.get(&ObjectRef::new("v1", "Service", Some(NAMESPACE), name))?;
                        let ip = service["spec"]["clusterIP"]
                            .as_str()?
                            .parse::<Ipv4Addr>()
                            .ok()?;
                        let deployment = api.get(&ObjectRef::new(
                            "apps/v1",
                            "Deployment",
                            Some(NAMESPACE),
                            name,
                        ))?;
                        api.get(&ObjectRef::new(
                            "v1",
                            "ServiceAccount",
                            Some(NAMESPACE),
                            name,
                        ))?;
                        Some((ip, deployment))
                    },
                    || self.ambientd_log_tail(),
                );
                let (vip, deployment) = service;
                let template = &deployment["spec"]["template"];
                if let Some(labels) = template["metadata"]["labels"].as_object() {
                    for (key, value) in labels {
                        spec.labels
                            .insert(key.clone(), value.as_str().unwrap_or_default().into());
                    }
                }
                if let Some(account) = template["spec"]["serviceAccountName"].as_str() {
                    spec.service_account = account.into();
                }
                vip
            }
        };
        let mut pod = self.make_pod(&spec, false);
        self.publish_pod(&mut pod, false);

        let ca_dir = self.waypoint_ca_dir();
        let mut sds = pod.netns.command(&self.tools.ambientd);
        sds.arg("sds")
            .args(["--namespace", &pod.namespace])
            .args(["--service-account", &pod.service_account])
            .args(["--listen", "127.0.0.1:15053"])
            .arg("--ca-dir")
            .arg(&ca_dir);
        pod.processes
            .push(Process::start(&format!("sds-{name}"), sds, &self.dir));

        let token = self.pod_token(&format!("{name}.token"), &pod);
        let token = std::fs::read_to_string(token).expect("token");
        let bootstrap = self.dir.join(format!("envoy-{name}.json"));
        let text = serde_json::to_string_pretty(&waypoint_bootstrap(&pod, &token, &self.root_cert))
            .expect("bootstrap");
        std::fs::write(&bootstrap, text).expect("write bootstrap");
        let mut envoy = pod.netns.command(&self.tools.envoy);
        envoy
            .arg("-c")
            .arg(&bootstrap)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args([
                "--base-id",
                &(std::process::id() % 60_000 + 1000).to_string(),
            ])
            .arg("--reject-unknown-dynamic-fields")
            .args(["-l", "info"])
            .args(["--file-flush-interval-msec", "100"]);
        pod.processes
            .push(Process::start(&format!("envoy-{name}"), envoy, &self.dir));
        pod.envoy_admin = Some(([127, 0, 0, 1], 15000).into());
        let logs: Vec<PathBuf> = pod
            .processes
            .iter()
            .map(|p| p.log_path().to_path_buf())
            .collect();
        wait_for(
            &format!("waypoint {name}'s Envoy to take its listeners"),
            STARTUP,
            || {
                for process in &mut pod.processes {
                    process.assert_running();
                }
                let stats = envoy_admin_get(
                    &pod,
                    "/stats?filter=listener_manager.total_listeners_active",
                );
                let active = stats
                    .split(':')
                    .nth(1)
                    .and_then(|n| n.trim().parse::<u32>().ok())
                    .unwrap_or(0);
                (active >= 3).then_some(())
            },
            || {
                logs.iter()
                    .map(|p| format!("--- {}:\n{}", p.display(), tail(p, 20)))
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        self.pods.push(pod);
        vip
    }

    /// The CA `ambientd sds` signs the waypoint's certificate with: ambientd's own directory,
    /// or on a cluster a copy of the `istio-ca-secret` Secret its leader created.
    fn waypoint_ca_dir(&self) -> PathBuf {
        let Source::Kube(api) = &self.source else {
            return self.ca_dir.clone();
        };
        let dir = self.dir.join("waypoint-ca");
        std::fs::create_dir_all(&dir).expect("waypoint CA dir");
        for key in [
            "ca-cert.pem",
            "ca-key.pem",
            "root-cert.pem",
            "cert-chain.pem",
        ] {
            if let Some(data) = api.data("Secret", "istio-system", "istio-ca-secret", key) {
                std::fs::write(dir.join(key), data).expect("write CA");
            }
        }
        dir
    }

    /// GET `path` on a waypoint's Envoy admin.
    pub fn envoy_get(&self, waypoint: &str, path: &str) -> String {
        envoy_admin_get(self.pod(waypoint), path)
    }
}

pub(super) fn envoy_admin_get(pod: &Pod, path: &str) -> String {
    let admin = pod.envoy_admin.expect("a waypoint pod");
    super::apps::http(&pod.netns, admin, "GET", path, "envoy")
        .map(|r| r.body)
        .unwrap_or_default()
}

/// The bootstrap pilot-agent writes for a waypoint pod, with xDS straight to ambientd's
/// 15012 over TLS (the token in the stream's metadata, as the agent sends it) and SDS from
/// `ambientd sds` on the pod's loopback.
fn waypoint_bootstrap(pod: &Pod, token: &str, root: &Path) -> Value {
    let h2 = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        },
    });
    let endpoint = |ip: String, port: u16| {
        json!({"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": ip, "port_value": port}}}}]}]})
    };
    let ns = &pod.namespace;
    let mut xds_load = endpoint(CONTROL_PLANE.to_string(), 15012);
    xds_load["cluster_name"] = json!("xds-grpc");
    let mut sds_load = endpoint("127.0.0.1".into(), 15053);
    sds_load["cluster_name"] = json!("sds-grpc");
    json!({
        "node": {
            "id": format!("waypoint~{}~{}.{ns}~{ns}.svc.cluster.local", pod.ip, pod.name),
            "cluster": format!("{}.{ns}", pod.service_account),
            "metadata": {
                "NAMESPACE": ns,
                "NAME": pod.name,
                "INSTANCE_IPS": pod.ip.to_string(),
                "SERVICE_ACCOUNT": pod.service_account,
                "NODE_NAME": pod.node,
                "CLUSTER_ID": "Kubernetes",
                "WORKLOAD_NAME": pod.labels.get("gateway.networking.k8s.io/gateway-name"),
                "LABELS": pod.labels,
            },
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
        "bootstrap_extensions": [{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                "buffer_size_kb": 64,
            },
        }],
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{
                    "envoy_grpc": {
                        "cluster_name": "xds-grpc",
                        "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"}},
                    },
                    "initial_metadata": [{"key": "authorization", "value": format!("Bearer {token}")}],
                }],
            },
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": [
            {
                "name": "xds-grpc",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": h2,
                "load_assignment": xds_load,
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "sni": "istiod.istio-system.svc",
                        "common_tls_context": {
                            "alpn_protocols": ["h2"],
                            "validation_context": {"trusted_ca": {"filename": root}},
                        },
                    },
                },
            },
            {
                "name": "sds-grpc",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": h2,
                "load_assignment": sds_load,
            },
        ]},
    })
}
