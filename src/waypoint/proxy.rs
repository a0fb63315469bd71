//! Who a waypoint proxy is, from the node it sends (istio/istio `pilot/pkg/networking/core/waypoint.go`): its namespace, pod
//! IPs and Gateway, and which of Istio's own Envoy extensions it has.

use std::net::IpAddr;

use crate::pb::google::protobuf::Value;
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::xds::Node;

/// The label on a waypoint's pods naming its Gateway (policy attachment by Gateway name, §5.1).
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// The node type pilot-agent puts first in a waypoint's node id.
const WAYPOINT_NODE_TYPE: &str = "waypoint";

/// A connected waypoint proxy, as its node describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaypointProxy {
    /// The node id: `waypoint~<ip>~<pod>.<ns>~<ns>.svc.<domain>`.
    pub id: String,
    /// Metadata `NAMESPACE`, else the first label of the node id's DNS domain.
    pub namespace: String,
    /// The pod name: metadata `NAME`, else the node id's third part before its last `.<ns>`.
    pub pod: String,
    /// Metadata `INSTANCE_IPS` (comma separated), else the node id's second part.
    pub ips: Vec<IpAddr>,
    /// Label `gateway.networking.k8s.io/gateway-name` from metadata `LABELS`.
    pub gateway: Option<String>,
    pub service_account: String,
    /// Metadata `NETWORK` (empty: the default network).
    pub network: String,
    /// Metadata `ISTIO_VERSION`, when sent.
    pub istio_version: Option<String>,
    /// Which of Istio's own extensions this Envoy has ([`Extensions`]).
    pub extensions: Extensions,
}

/// Istio's extensions that istiod's waypoint config uses and that upstream Envoy lacks. An
/// Envoy that announces its extensions (`Node.extensions`, which every Envoy sends) gets each
/// filter only if it has it; a node that announces none is taken for Istio's proxy, as
/// istiod takes every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extensions {
    /// `io.istio.http.peer_metadata.Config`: the `waypoint_*_peer_metadata` HTTP filters.
    pub peer_metadata: bool,
    /// `stats.PluginConfig`: the `istio.stats` HTTP and network filters.
    pub stats: bool,
    /// `envoy.tcp.metadataexchange.config.MetadataExchange`: `istio.metadata_exchange`.
    pub metadata_exchange: bool,
    /// The `istio.hashable_string` object factory, for the filter state the waypoint shares
    /// with its internal listeners; without it, Envoy's `envoy.string`.
    pub hashable_string: bool,
}

impl Default for Extensions {
    fn default() -> Self {
        Extensions::ISTIO
    }
}

impl Extensions {
    /// Istio's proxy: all of them.
    pub const ISTIO: Extensions = Extensions {
        peer_metadata: true,
        stats: true,
        metadata_exchange: true,
        hashable_string: true,
    };
    /// Upstream Envoy: none of them.
    pub const NONE: Extensions = Extensions {
        peer_metadata: false,
        stats: false,
        metadata_exchange: false,
        hashable_string: false,
    };

    /// What a node announces. `announced` yields each extension's name and type URLs.
    fn announced<'a>(announced: impl Iterator<Item = (&'a str, &'a [String])>) -> Self {
        let mut found = Extensions::NONE;
        let mut any = false;
        for (name, type_urls) in announced {
            any = true;
            let has = |url: &str| type_urls.iter().any(|u| u.ends_with(url));
            found.peer_metadata |= has("io.istio.http.peer_metadata.Config");
            found.stats |= has("stats.PluginConfig") || name == "istio.stats";
            found.metadata_exchange |= has("envoy.tcp.metadataexchange.config.MetadataExchange")
                || name == "istio.metadata_exchange";
            found.hashable_string |= name == "istio.hashable_string";
        }
        if any { found } else { Extensions::ISTIO }
    }
}

impl WaypointProxy {
    /// Whether a node is a waypoint: its id's first `~` part is `waypoint`.
    pub fn is_waypoint(node: &Node) -> bool {
        node.id.split('~').next() == Some(WAYPOINT_NODE_TYPE)
    }

    /// The waypoint a node describes, or why it is not one.
    pub fn from_node(node: &Node) -> Result<Self, String> {
        let parts: Vec<&str> = node.id.split('~').collect();
        let [kind, ip, pod_ns, domain] = parts.as_slice() else {
            return Err(format!(
                "node id {:?}: want waypoint~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>",
                node.id
            ));
        };
        if *kind != WAYPOINT_NODE_TYPE {
            return Err(format!("node id {:?} is not a waypoint's", node.id));
        }
        let meta = |key: &str| -> Option<&Value> { node.metadata.as_ref()?.fields.get(key) };
        let text = |key: &str| match meta(key).and_then(|v| v.kind.as_ref()) {
            Some(ValueKind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        };
        let namespace = text("NAMESPACE")
            .or_else(|| domain.split('.').next().map(str::to_string))
            .unwrap_or_default();
        if namespace.is_empty() {
            return Err(format!("node id {:?} names no namespace", node.id));
        }
        let pod = text("NAME").unwrap_or_else(|| {
            pod_ns
                .strip_suffix(&format!(".{namespace}"))
                .unwrap_or(pod_ns)
                .to_string()
        });
        let ips: Vec<IpAddr> = text("INSTANCE_IPS")
            .unwrap_or_else(|| ip.to_string())
            .split(',')
            .filter_map(|ip| ip.trim().parse().ok())
            .collect();
        let gateway =
            match meta("LABELS").and_then(|v| v.kind.as_ref()) {
                Some(ValueKind::StructValue(labels)) => labels
                    .fields
                    .get(GATEWAY_NAME_LABEL)
                    .and_then(|v| match &v.kind {
                        Some(ValueKind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
                        _ => None,
                    }),
                _ => None,
            };
        let extensions = Extensions::announced(
            node.extensions
                .iter()
                .map(|e| (e.name.as_str(), e.type_urls.as_slice())),
        );
        Ok(WaypointProxy {
            id: node.id.clone(),
            namespace,
            pod,
            ips,
            gateway,
            service_account: text("SERVICE_ACCOUNT").unwrap_or_default(),
            network: text("NETWORK").unwrap_or_default(),
            istio_version: text("ISTIO_VERSION"),
            extensions,
        })
    }

    /// The filter-state object factory for the values `connect_terminate` shares: istiod
    /// gives `istio.hashable_string` to Istio proxies from 1.29.2 (or of unknown version), and
    /// `envoy.string` to older ones; a proxy without the Istio factory gets `envoy.string`.
    pub fn string_factory(&self) -> &'static str {
        if !self.extensions.hashable_string {
            return "envoy.string";
        }
        match self.istio_version.as_deref().and_then(parse_version) {
            Some(version) if version < (1, 29, 2) => "envoy.string",
            _ => "istio.hashable_string",
        }
    }
}

/// `1.29.2`, `1.30.0-beta.1` -> `(1, 29, 2)`; `None` when it does not start with three numbers.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?.parse().ok()?;
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::config::core::v3::Extension;
    use crate::pb::google::protobuf::Struct;

    fn string(s: &str) -> Value {
        Value {
            kind: Some(ValueKind::StringValue(s.into())),
        }
    }

    fn node(id: &str, meta: &[(&str, Value)]) -> Node {
        Node {
            id: id.into(),
            metadata: Some(Struct {
                fields: meta
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_waypoint_is_known_by_its_node_id_and_metadata() {
        let labels = Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: [(GATEWAY_NAME_LABEL.to_string(), string("waypoint"))].into(),
            })),
        };
        let n = node(
            "waypoint~10.244.1.5~waypoint-7d9f-x2.default~default.svc.cluster.local",
            &[
                ("NAMESPACE", string("default")),
                ("NAME", string("waypoint-7d9f-x2")),
                ("INSTANCE_IPS", string("10.244.1.5,fd00::5")),
                ("SERVICE_ACCOUNT", string("waypoint")),
                ("ISTIO_VERSION", string("1.28.0")),
                ("LABELS", labels),
            ],
        );
        assert!(WaypointProxy::is_waypoint(&n));
        let proxy = WaypointProxy::from_node(&n).unwrap();
        assert_eq!(proxy.namespace, "default");
        assert_eq!(proxy.pod, "waypoint-7d9f-x2");
        assert_eq!(
            proxy.ips,
            [
                "10.244.1.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(proxy.gateway.as_deref(), Some("waypoint"));
        assert_eq!(proxy.service_account, "waypoint");
        // No extensions announced: Istio's proxy; 1.28 predates istio.hashable_string.
        assert_eq!(proxy.extensions, Extensions::ISTIO);
        assert_eq!(proxy.string_factory(), "envoy.string");
    }

    #[test]
    fn the_node_id_alone_is_enough() {
        let n = node(
            "waypoint~3.0.0.1~waypoint-pod.default~default.svc.cluster.local",
            &[],
        );
        let proxy = WaypointProxy::from_node(&n).unwrap();
        assert_eq!(proxy.namespace, "default");
        assert_eq!(proxy.pod, "waypoint-pod");
        assert_eq!(proxy.ips, ["3.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(proxy.string_factory(), "istio.hashable_string");
        for bad in [
            "ztunnel~1.1.1.1~p.ns~ns.svc.cluster.local",
            "waypoint~1.1.1.1",
            "waypoint",
        ] {
            assert!(WaypointProxy::from_node(&node(bad, &[])).is_err(), "{bad}");
        }
        assert!(!WaypointProxy::is_waypoint(&node("sidecar~1~2~3", &[])));
    }

    #[test]
    fn a_plain_envoy_announces_none_of_istios_extensions() {
        let mut n = node("waypoint~1.1.1.1~p.ns~ns.svc.cluster.local", &[]);
        n.extensions = vec![Extension {
            name: "envoy.filters.http.router".into(),
            category: "envoy.filters.http".into(),
            type_urls: vec!["envoy.extensions.filters.http.router.v3.Router".into()],
            ..Default::default()
        }];
        let plain = WaypointProxy::from_node(&n).unwrap();
        assert_eq!(plain.extensions, Extensions::NONE);
        assert_eq!(plain.string_factory(), "envoy.string");
        n.extensions.push(Extension {
            name: "istio.hashable_string".into(),
            category: "envoy.filters.object".into(),
            ..Default::default()
        });
        n.extensions.push(Extension {
            name: "envoy.filters.http.peer_metadata".into(),
            category: "envoy.filters.http".into(),
            type_urls: vec!["io.istio.http.peer_metadata.Config".into()],
            ..Default::default()
        });
        let istio = WaypointProxy::from_node(&n).unwrap();
        assert!(istio.extensions.peer_metadata && istio.extensions.hashable_string);
        assert!(!istio.extensions.stats);
        assert_eq!(istio.string_factory(), "istio.hashable_string");
    }

    #[test]
    fn versions_compare_by_their_numbers() {
        assert_eq!(parse_version("1.29.2"), Some((1, 29, 2)));
        assert_eq!(parse_version("1.30.0-beta.1"), Some((1, 30, 0)));
        assert_eq!(parse_version("master"), None);
        assert!(parse_version("1.29.10").unwrap() > (1, 29, 2));
    }
}
