//! The bed's nodes and the pods' network: each node's namespace and link to ctl, its real
//! ztunnel and its CNI agent; each pod's namespace, link and (for pods in the mesh)
//! istio-cni's redirection and enrollment with its node's ztunnel.

use std::net::Ipv4Addr;
use std::time::Instant;

use super::apps;
use super::mesh::{CONTROL_PLANE, Mesh, NAMESPACE, Node, Pod, PodSpec, STARTUP};
use super::netns::Netns;
use super::process::{Process, wait_for};
use super::zds::{Agent, WorkloadInfo};

/// istio-cni's in-pod redirection (istio/istio `cni/pkg/iptables`, the ambient in-pod rule
/// set): outbound TCP to ztunnel's 15001, inbound TCP but HBONE to 15006, ztunnel's own
/// sockets (mark 0x539) left alone, and replies to what ztunnel sent in with the client's
/// address (connmark 0x111) routed back to ztunnel by [`INPOD_ROUTES`]. With `dns`, DNS
/// (UDP and TCP to port 53) goes to ztunnel's DNS proxy on 15053, in conntrack zone 1 so its
/// replies do not meet the NAT of the query, as with istio-cni's DNS capture on.
fn inpod_rules(dns: bool) -> String {
    let raw = "\
*raw
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";
    let mangle = "\
*mangle
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
";
    let nat_start = "\
*nat
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
";
    let nat_dns = "\
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
";
    let nat_end = "\
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";
    if dns {
        [raw, mangle, nat_start, nat_dns, nat_end].concat()
    } else {
        [mangle, nat_start, nat_end].concat()
    }
}

/// istio-cni's policy routing beside [`inpod_rules`]: packets marked 0x111 are delivered
/// locally (to ztunnel's transparent socket).
const INPOD_ROUTES: [&[&str]; 2] = [
    &[
        "rule",
        "add",
        "fwmark",
        "0x111/0xfff",
        "pref",
        "32764",
        "lookup",
        "100",
    ],
    &[
        "route",
        "add",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        "100",
    ],
];

impl Mesh {
    pub(super) fn add_node(&mut self, index: u8) {
        let name = format!("node{index}");
        let netns = Netns::create(&format!("n{index}"));
        let link = format!("n{index}");
        self.ctl.veth(&link, &netns);
        self.ctl
            .ip(&["addr", "add", &format!("172.30.{index}.1/24"), "dev", &link]);
        self.ctl.ip(&["link", "set", &link, "up"]);
        self.ctl.ip(&[
            "route",
            "add",
            &format!("10.30.{index}.0/24"),
            "via",
            &format!("172.30.{index}.2"),
        ]);
        netns.ip(&[
            "addr",
            "add",
            &format!("172.30.{index}.2/24"),
            "dev",
            "eth0",
        ]);
        netns.ip(&["link", "set", "eth0", "up"]);
        netns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &format!("172.30.{index}.1"),
        ]);
        netns.sysctl("net.ipv4.ip_forward", "1");
        for netns in [&netns, &self.ctl] {
            netns.sysctl("net.ipv4.conf.all.rp_filter", "0");
            netns.sysctl("net.ipv4.conf.default.rp_filter", "0");
        }
        let agent = Agent::listen(&self.dir.join(format!("{name}.zds.sock")));
        let mut node = Node {
            name,
            index,
            netns,
            agent,
            ztunnel: None,
            next_pod: 10,
        };
        node.ztunnel = Some(self.start_ztunnel(&node));
        self.nodes.push(node);
    }

    /// A real ztunnel for `node`, as its DaemonSet runs it: in-pod mode on the agent's
    /// socket, xDS and certificates from ambientd's 15012 with a node-bound token.
    fn start_ztunnel(&mut self, node: &Node) -> Process {
        // ztunnel's own pod, for its token's binding (on a cluster, ambientd finds the node a
        // ztunnel may ask certificates for from the pod its token is bound to).
        let mut pod = Pod {
            name: format!("ztunnel-{}", node.name),
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            uid: format!("00000000-e2e0-4000-8000-0000000000{:02x}", node.index),
            ip: Ipv4Addr::new(172, 30, node.index, 2),
            node: node.name.clone(),
            labels: [("app".to_string(), "ztunnel".to_string())].into(),
            netns: Netns::create(&format!("z{}", node.index)),
            servers: Vec::new(),
            processes: Vec::new(),
            envoy_admin: None,
            written: Instant::now(),
        };
        self.publish_pod(&mut pod, false);
        let token = self.pod_token(&format!("{}.token", node.name), &pod);
        let root = self.root_cert.clone();
        let endpoint = format!("https://{CONTROL_PLANE}:15012");
        // ztunnel reads ./etc/istio/config/mesh and ./var/run/secrets relative to where it
        // runs: a directory of its own keeps it from finding anything by accident.
        let cwd = self.dir.join(format!("ztunnel-{}", node.name));
        std::fs::create_dir_all(&cwd).expect("ztunnel dir");
        let mut command = node.netns.command(&self.tools.ztunnel);
        command
            .current_dir(&cwd)
            .args(["proxy", "ztunnel"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("XDS_ADDRESS", &endpoint)
            .env("CA_ADDRESS", &endpoint)
            .env("XDS_ROOT_CA", &root)
            .env("CA_ROOT_CA", &root)
            .env("AUTH_TOKEN", &token)
            .env("NODE_NAME", &node.name)
            .env("POD_NAME", format!("ztunnel-{}", node.name))
            .env("POD_NAMESPACE", "istio-system")
            .env("INSTANCE_IP", format!("172.30.{}.2", node.index))
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("INPOD_UDS", node.agent.path())
            .env(
                "XDS_ON_DEMAND",
                if self.options.on_demand {
                    "true"
                } else {
                    "false"
                },
            )
            .env(
                "ISTIO_META_DNS_CAPTURE",
                if self.options.dns_capture {
                    "true"
                } else {
                    "false"
                },
            )
            .env("IPV6_ENABLED", "false")
            .env(
                "RUST_LOG",
                std::env::var("AMBIENTD_E2E_ZTUNNEL_LOG").unwrap_or_else(|_| "info".into()),
            );
        Process::start(&format!("ztunnel-{}", node.name), command, &self.dir)
    }

    pub(super) fn wait_ztunnel_ready(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        wait_for(
            &format!("{}'s ztunnel ready", node.name),
            STARTUP,
            || {
                node.ztunnel.as_mut().expect("ztunnel").assert_running();
                apps::http(
                    &node.netns,
                    ([127, 0, 0, 1], 15021).into(),
                    "GET",
                    "/healthz/ready",
                    "ztunnel",
                )
                .ok()
                .filter(|r| r.status == 200)
            },
            String::new,
        );
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index - 1]
    }

    pub(super) fn make_pod(&mut self, spec: &PodSpec, redirected: bool) -> Pod {
        let node = &mut self.nodes[spec.node - 1];
        let (i, j) = (node.index, node.next_pod);
        node.next_pod += 1;
        let ip = Ipv4Addr::new(10, 30, i, j);
        let netns = Netns::create(&spec.name);
        let link = format!("p{j}");
        node.netns.veth(&link, &netns);
        node.netns
            .ip(&["addr", "add", &format!("10.30.{i}.1/32"), "dev", &link]);
        node.netns.ip(&["link", "set", &link, "up"]);
        node.netns
            .ip(&["route", "add", &format!("{ip}/32"), "dev", &link]);
        netns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
        netns.ip(&["link", "set", "eth0", "up"]);
        netns.ip(&[
            "route",
            "add",
            &format!("10.30.{i}.1"),
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        netns.ip(&["route", "add", "default", "via", &format!("10.30.{i}.1")]);
        if redirected {
            netns.iptables_restore(&inpod_rules(self.options.dns_capture));
            for args in INPOD_ROUTES {
                netns.ip(args);
            }
        }
        Pod {
            name: spec.name.clone(),
            namespace: NAMESPACE.into(),
            service_account: spec.service_account.clone(),
            uid: format!("00000000-e2e0-4000-8000-{:012x}", u32::from(ip)),
            ip,
            node: node.name.clone(),
            labels: spec.labels.clone(),
            netns,
            servers: Vec::new(),
            processes: Vec::new(),
            envoy_admin: None,
            written: Instant::now(),
        }
    }

    pub(super) fn enroll(&self, pod: &Pod) {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == pod.node)
            .expect("node");
        node.agent.add(
            &pod.uid,
            WorkloadInfo {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
            },
            pod.netns.file(),
        );
    }
}
