//! ServiceEntry -> Services, one per host (docs/conversion.md, "ServiceEntry → Services and
//! Workloads").

use std::net::IpAddr;

use crate::discovery::convert::membership::{se_target, wins};
use crate::discovery::convert::service::{self, distribution_from_annotation};
use crate::discovery::model::Key;
use crate::discovery::model::visibility::Visibility;
use crate::discovery::model::{Resolution, ServiceEntry};
use crate::discovery::names::ip_bytes;
use crate::discovery::settings::Settings;
use crate::discovery::store::Store;
use crate::pb::workload::{
    self, AppProtocol, LoadBalancing, NetworkAddress, Port,
    load_balancing::{HealthPolicy, Mode},
};

const AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";

/// The Services a ServiceEntry publishes (hosts it lost to an older entry are skipped). An
/// address that is neither an IP nor a CIDR drops them all, as istiod does. Its visibility
/// (meshConfig.serviceEntryVisibility) marks them, and NAMESPACE keeps their waypoints in the
/// namespace; NONE publishes nothing (the entry wins no host).
pub(crate) fn build(
    settings: &Settings,
    store: &Store,
    se: &ServiceEntry,
    reads: &mut Vec<Key>,
) -> Vec<workload::Service> {
    let network = store.network(settings);
    let Some(explicit) = parse_addresses(&se.addresses, network) else {
        return Vec::new();
    };
    let namespace_annotations = store
        .namespaces()
        .get(&se.namespace)
        .map(|n| &n.annotations);
    let load_balancing = if se.resolution == Resolution::None {
        Some(LoadBalancing {
            routing_preference: Vec::new(),
            mode: Mode::Passthrough as i32,
            health_policy: HealthPolicy::AllowAll as i32,
        })
    } else {
        distribution_from_annotation(&se.annotations)
            .or_else(|| namespace_annotations.and_then(distribution_from_annotation))
            .map(service::failover)
    };
    let ports: Vec<Port> = se
        .ports
        .iter()
        .map(|p| Port {
            service_port: u32::from(p.number),
            target_port: u32::from(se_target(p)),
            app_protocol: app_protocol(&p.protocol) as i32,
        })
        .collect();
    let visibility = store.entry_visibility(&se.namespace).unwrap_or_default();
    let local_only = visibility == Visibility::Namespace;
    let auto_allocate = settings.ip_autoallocate && auto_allocates(se);
    se.hosts
        .iter()
        .filter(|host| wins(store, se, host))
        .map(|host| {
            let addresses = if auto_allocate && allocates_host(se, host) {
                se.allocated
                    .iter()
                    .filter(|(h, _)| h == host)
                    .map(|(_, ip)| NetworkAddress {
                        network: network.to_string(),
                        address: ip_bytes(ip),
                        length: None,
                    })
                    .collect()
            } else {
                explicit.clone()
            };
            let (waypoint, weighted_waypoints, ingress_use_waypoint) = service::waypoints(
                store,
                &se.namespace,
                &se.labels,
                &se.annotations,
                local_only,
                reads,
            );
            workload::Service {
                name: se.name.clone(),
                namespace: se.namespace.clone(),
                hostname: host.clone(),
                addresses,
                ports: ports.clone(),
                subject_alt_names: se.subject_alt_names.clone(),
                load_balancing: load_balancing.clone(),
                waypoint,
                weighted_waypoints,
                ingress_use_waypoint,
                canonical: store.is_canonical(&se.namespace, host),
                visibility: visibility.wire(),
                ..Default::default()
            }
        })
        .collect()
}

/// Whether the entry's Services take auto-allocated addresses (`status.addresses`), as istiod's
/// `ShouldV2AutoAllocateIP` decides (with `PILOT_ENABLE_IP_AUTOALLOCATE` on): no
/// `spec.addresses`, a resolution other than NONE, and no opt-out label
/// `networking.istio.io/enable-autoallocate-ip: "false"`. The allocator
/// (src/kube/ip_allocate.rs) assigns them by the same rule.
pub(crate) fn auto_allocates(se: &ServiceEntry) -> bool {
    se.addresses.is_empty()
        && se.resolution != Resolution::None
        && !se.labels.get(AUTOALLOCATE_LABEL).is_some_and(is_false)
}

/// Whether `host` of an auto-allocating entry gets addresses: a wildcard host only with
/// DYNAMIC_DNS resolution (istiod's `keepHost`).
pub(crate) fn allocates_host(se: &ServiceEntry, host: &str) -> bool {
    !host.starts_with('*') || se.resolution == Resolution::DynamicDns
}

/// Go's `strings.EqualFold(value, "false")`, which istiod uses for the auto-allocation opt-out:
/// ASCII case-insensitive, and `ſ` (U+017F), whose simple case folding is `s`, counts as `s`.
fn is_false(value: &str) -> bool {
    value
        .chars()
        .map(|c| {
            if c == '\u{17f}' {
                's'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .eq("false".chars())
}

/// `spec.addresses`: a plain IP has no length; a CIDR is masked to its network address with
/// its prefix length (a full-length prefix is a plain IP). `None` if any entry is invalid.
fn parse_addresses(addresses: &[String], network: &str) -> Option<Vec<NetworkAddress>> {
    addresses
        .iter()
        .map(|text| {
            let (ip, length) = match text.split_once('/') {
                None => (text.parse::<IpAddr>().ok()?, None),
                Some((ip, bits)) => {
                    let ip: IpAddr = ip.parse().ok()?;
                    let bits: u8 = bits.parse().ok()?;
                    let max = if ip.is_ipv4() { 32 } else { 128 };
                    if bits > max {
                        return None;
                    }
                    if bits == max {
                        (ip, None)
                    } else {
                        (mask(ip, bits), Some(u32::from(bits)))
                    }
                }
            };
            Some(NetworkAddress {
                network: network.to_string(),
                address: ip_bytes(&ip),
                length,
            })
        })
        .collect()
}

fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            IpAddr::from((u32::from(v4) & m).to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let m = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            IpAddr::from((u128::from(v6) & m).to_be_bytes())
        }
    }
}

/// A ServiceEntry port's protocol (already upper-cased) in the workload API.
fn app_protocol(protocol: &str) -> AppProtocol {
    match protocol {
        "HTTP" => AppProtocol::Http11,
        "HTTP2" => AppProtocol::Http2,
        "GRPC" => AppProtocol::Grpc,
        "TLS" | "HTTPS" => AppProtocol::Tls,
        "TCP" => AppProtocol::Tcp,
        _ => AppProtocol::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_masked_with_their_length_and_full_prefixes_are_plain_ips() {
        let parsed = parse_addresses(
            &[
                "10.0.0.5/24".into(),
                "10.0.0.7/32".into(),
                "2001:db8::1/64".into(),
                "1.2.3.4".into(),
            ],
            "n",
        )
        .unwrap();
        let shown: Vec<(Vec<u8>, Option<u32>)> = parsed
            .iter()
            .map(|a| (a.address.to_vec(), a.length))
            .collect();
        assert_eq!(shown[0], (vec![10, 0, 0, 0], Some(24)));
        assert_eq!(shown[1], (vec![10, 0, 0, 7], None));
        assert_eq!(shown[2].1, Some(64));
        assert_eq!(&shown[2].0[..8], &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0]);
        assert_eq!(shown[3], (vec![1, 2, 3, 4], None));
    }

    #[test]
    fn auto_allocation_opt_out_is_case_insensitive() {
        use crate::discovery::model::{Labels, Object};
        let settings = Settings::default();
        let addresses = |opt_out: Option<&str>| {
            let se = ServiceEntry {
                name: "se".into(),
                namespace: "demo".into(),
                hosts: vec!["a.example.com".into()],
                resolution: Resolution::Dns,
                labels: opt_out
                    .map(|v| Labels::from([(AUTOALLOCATE_LABEL, v)]))
                    .unwrap_or_default(),
                allocated: vec![("a.example.com".into(), "240.240.0.1".parse().unwrap())],
                ..Default::default()
            };
            let mut store = Store::default();
            store.insert(Object::ServiceEntry(se.clone()), &settings);
            let services = build(&settings, &store, &se, &mut Vec::new());
            assert_eq!(services.len(), 1);
            services[0].addresses.len()
        };
        assert_eq!(addresses(None), 1);
        assert_eq!(addresses(Some("true")), 1);
        assert_eq!(addresses(Some("false")), 0);
        assert_eq!(addresses(Some("False")), 0, "strings.EqualFold");
        assert_eq!(addresses(Some("FALSE")), 0, "strings.EqualFold");
        for value in ["false", "False", "FALSE", "fAlSe", "fal\u{17f}e"] {
            assert!(is_false(value), "{value:?}");
        }
        for value in ["", "true", "no", "0", "false ", "falsee", "fals"] {
            assert!(!is_false(value), "{value:?}");
        }
    }

    #[test]
    fn one_invalid_address_drops_them_all() {
        assert!(parse_addresses(&["1.2.3.4".into(), "not-an-ip".into()], "").is_none());
        assert!(parse_addresses(&["10.0.0.0/33".into()], "").is_none());
    }
}
