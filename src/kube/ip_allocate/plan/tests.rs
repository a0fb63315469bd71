use super::*;
use crate::discovery::model::{Labels, Resolution};

fn prefixes() -> Allocator {
    Allocator::new(
        DEFAULT_IPV4_PREFIX.parse().unwrap(),
        DEFAULT_IPV6_PREFIX.parse().unwrap(),
    )
}

fn se(namespace: &str, name: &str, created: &str, hosts: &[&str]) -> ServiceEntry {
    ServiceEntry {
        name: name.into(),
        namespace: namespace.into(),
        created: created.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        resolution: Resolution::Dns,
        ..ServiceEntry::default()
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn v4(n: u8) -> IpAddr {
    ip(&format!("240.240.0.{n}"))
}

fn v6(n: u8) -> IpAddr {
    ip(&format!("2001:2::{n:x}"))
}

/// The cluster the allocator sees: entries by `ns/name`, with the plan's writes applied back
/// as the API server and the watch would.
#[derive(Default)]
struct Cluster {
    entries: BTreeMap<String, Entry>,
}

impl Cluster {
    fn put(&mut self, se: ServiceEntry) {
        let key = format!("{}/{}", se.namespace, se.name);
        let selected = self.entries.get(&key).is_none_or(|e| e.selected);
        self.entries.insert(key, Entry { se, selected });
    }

    fn get(&self, key: &str) -> &ServiceEntry {
        &self.entries[key].se
    }

    /// Plans and applies; returns the keys written.
    fn converge(&mut self, allocator: &mut Allocator) -> Vec<String> {
        let (writes, exhausted) = allocator.plan(self.entries.values(), |_| false);
        assert!(exhausted.is_empty(), "{exhausted:?}");
        let mut keys = Vec::new();
        for write in writes {
            let key = format!("{}/{}", write.namespace, write.name);
            self.entries.get_mut(&key).unwrap().se.allocated = write.addresses;
            keys.push(key);
        }
        keys
    }

    fn addresses(&self, key: &str) -> Vec<(String, IpAddr)> {
        self.get(key).allocated.clone()
    }
}

fn pairs(entries: &[(&str, IpAddr)]) -> Vec<(String, IpAddr)> {
    entries.iter().map(|(h, a)| (h.to_string(), *a)).collect()
}

#[test]
fn prefixes_parse_as_go_reads_them() {
    let p: Prefix = "240.240.0.0/16".parse().unwrap();
    assert!(p.is_ipv4());
    assert!(p.contains(ip("240.240.255.255")));
    assert!(!p.contains(ip("240.241.0.0")));
    assert!(!p.contains(ip("2001:2::1")));
    assert_eq!(p.first(), Some(ip("240.240.0.1")));
    let p6: Prefix = "2001:2::/48".parse().unwrap();
    assert!(p6.contains(ip("2001:2:0:ffff::1")));
    assert!(!p6.contains(ip("2001:3::1")));
    let all: Prefix = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains(ip("255.255.255.255")));
    for bad in [
        "240.240.0.0",
        "240.240.0.0/33",
        "nope/8",
        "2001:2::/129",
        "1.2.3.4/x",
    ] {
        assert!(bad.parse::<Prefix>().is_err(), "{bad}");
    }
}

/// istiod's `TestIPAllocate`, step by step: warm-up from existing status, the entries that
/// get nothing, conflicts with a user address and with another entry's status, and host
/// changes (addresses are never reused while leading).
#[test]
fn follows_istiods_allocation_sequence() {
    let mut cluster = Cluster::default();
    let mut pre = se(
        "default",
        "pre-existing",
        "2026-01-01T00:00:00Z",
        &["test.testing.io"],
    );
    pre.allocated = pairs(&[("test.testing.io", v4(1)), ("test.testing.io", v6(1))]);
    cluster.put(pre);
    let mut allocator = prefixes();
    assert!(cluster.converge(&mut allocator).is_empty());

    let mut with_v4 = se(
        "boop",
        "with-v4-address",
        "2026-01-02T00:00:00Z",
        &["wa-v4"],
    );
    with_v4.addresses = vec!["1.2.3.4".into()];
    cluster.put(with_v4);
    let mut with_v6 = se(
        "boop",
        "with-v6-address",
        "2026-01-02T00:00:00Z",
        &["wa-v6"],
    );
    with_v6.addresses = vec!["1:2::3::4".into()]; // invalid, but an address was given
    cluster.put(with_v6);
    let mut opt_out = se("boop", "opt-out", "2026-01-02T00:00:00Z", &["nope"]);
    opt_out.labels = Labels::from([(
        "networking.istio.io/enable-autoallocate-ip".to_string(),
        "FALSE".to_string(),
    )]);
    cluster.put(opt_out);
    let mut none = se("boop", "resolution-none", "2026-01-02T00:00:00Z", &["none"]);
    none.resolution = Resolution::None;
    cluster.put(none);
    cluster.put(se(
        "boop",
        "with-existing-status",
        "2026-01-03T00:00:00Z",
        &["wes"],
    ));
    assert_eq!(
        cluster.converge(&mut allocator),
        ["boop/with-existing-status"]
    );
    assert_eq!(
        cluster.addresses("boop/with-existing-status"),
        pairs(&[("wes", v4(2)), ("wes", v6(2))])
    );
    for key in [
        "boop/with-v4-address",
        "boop/with-v6-address",
        "boop/opt-out",
        "boop/resolution-none",
    ] {
        assert!(cluster.addresses(key).is_empty(), "{key}");
    }
    // Nothing more to do: a second plan writes nothing.
    assert!(cluster.converge(&mut allocator).is_empty());

    // A user's spec address takes .2: the auto-allocated holder moves to .3.
    let mut user = se(
        "boop",
        "user-assigned-conflict",
        "2026-01-04T00:00:00Z",
        &["in-conflict"],
    );
    user.addresses = vec!["240.240.0.2".into()];
    cluster.put(user);
    assert_eq!(
        cluster.converge(&mut allocator),
        ["boop/with-existing-status"]
    );
    assert_eq!(
        cluster.addresses("boop/with-existing-status"),
        pairs(&[("wes", v4(3)), ("wes", v6(3))])
    );
    assert_eq!(
        cluster.get("boop/user-assigned-conflict").addresses,
        ["240.240.0.2"]
    );

    // A newer entry whose status copies .3: the newer one is reassigned, the elder keeps it.
    let mut copy = se("boop", "status-conflict", "2026-01-05T00:00:00Z", &["sc"]);
    copy.allocated = pairs(&[("sc", v4(3)), ("sc", v6(3))]);
    cluster.put(copy);
    assert_eq!(cluster.converge(&mut allocator), ["boop/status-conflict"]);
    assert_eq!(
        cluster.addresses("boop/status-conflict"),
        pairs(&[("sc", v4(4)), ("sc", v6(4))])
    );
    assert_eq!(
        cluster.addresses("boop/with-existing-status"),
        pairs(&[("wes", v4(3)), ("wes", v6(3))])
    );
    assert!(cluster.converge(&mut allocator).is_empty());

    // A host added keeps the old host's addresses and gets the next ones.
    let key = "default/pre-existing";
    let mut pre = cluster.get(key).clone();
    pre.hosts.push("added.testing.io".into());
    cluster.put(pre);
    assert_eq!(cluster.converge(&mut allocator), [key]);
    let both = pairs(&[
        ("test.testing.io", v4(1)),
        ("test.testing.io", v6(1)),
        ("added.testing.io", v4(5)),
        ("added.testing.io", v6(5)),
    ]);
    assert_eq!(cluster.addresses(key), both);
    // A wildcard host (resolution DNS) gets nothing, and nothing is written.
    let mut pre = cluster.get(key).clone();
    pre.hosts.push("*.bad-wildcard.testing.io".into());
    cluster.put(pre);
    assert!(cluster.converge(&mut allocator).is_empty());
    // Back to one host, then the host again, four times over: one new pair (.6), not reused .5.
    let mut pre = cluster.get(key).clone();
    pre.hosts = vec!["test.testing.io".into()];
    cluster.put(pre);
    assert_eq!(cluster.converge(&mut allocator), [key]);
    assert_eq!(cluster.addresses(key).len(), 2);
    let mut pre = cluster.get(key).clone();
    pre.hosts
        .extend(std::iter::repeat_n("added.testing.io".to_string(), 4));
    cluster.put(pre);
    cluster.converge(&mut allocator);
    assert_eq!(
        cluster.addresses(key),
        pairs(&[
            ("test.testing.io", v4(1)),
            ("test.testing.io", v6(1)),
            ("added.testing.io", v4(6)),
            ("added.testing.io", v6(6)),
        ])
    );
    // A host removed drops its addresses; no hosts leave an empty list.
    let mut pre = cluster.get(key).clone();
    pre.hosts = vec!["added.testing.io".into()];
    cluster.put(pre);
    cluster.converge(&mut allocator);
    assert_eq!(
        cluster.addresses(key),
        pairs(&[("added.testing.io", v4(6)), ("added.testing.io", v6(6))])
    );
    let mut pre = cluster.get(key).clone();
    pre.hosts = vec!["seven".into(), "eight".into()];
    cluster.put(pre);
    cluster.converge(&mut allocator);
    assert_eq!(
        cluster.addresses(key),
        pairs(&[
            ("seven", v4(7)),
            ("seven", v6(7)),
            ("eight", v4(8)),
            ("eight", v6(8))
        ])
    );
    let mut pre = cluster.get(key).clone();
    pre.hosts = Vec::new();
    cluster.put(pre);
    assert_eq!(cluster.converge(&mut allocator), [key]);
    assert!(cluster.addresses(key).is_empty());
}

#[test]
fn wildcards_get_addresses_only_with_dynamic_dns() {
    let mut cluster = Cluster::default();
    let mut dynamic = se("ns", "dynamic", "t", &["*.dyn.example.com"]);
    dynamic.resolution = Resolution::DynamicDns;
    cluster.put(dynamic);
    cluster.put(se("ns", "dns", "t", &["*.dns.example.com"]));
    let mut allocator = prefixes();
    assert_eq!(cluster.converge(&mut allocator), ["ns/dynamic"]);
    assert_eq!(cluster.addresses("ns/dynamic").len(), 2);
}

#[test]
fn a_new_leader_warms_up_before_allocating_and_skips_every_address_in_use() {
    let mut cluster = Cluster::default();
    // .1 is a user's, .2 is held in status; both are skipped by the new allocation.
    let mut user = se("a", "user", "t", &["u"]);
    user.addresses = vec!["240.240.0.1".into(), "10.0.0.0/8".into()];
    cluster.put(user);
    let mut held = se("a", "held", "t", &["h"]);
    held.allocated = pairs(&[("h", v4(2)), ("h", ip("::ffff:240.240.0.3"))]);
    cluster.put(held);
    cluster.put(se("b", "new", "t", &["n"]));
    let mut allocator = prefixes();
    assert_eq!(cluster.converge(&mut allocator), ["b/new"]);
    assert_eq!(
        cluster.addresses("b/new"),
        pairs(&[("n", v4(4)), ("n", v6(1))])
    );
}

#[test]
fn unselected_entries_hold_addresses_but_get_none() {
    let mut cluster = Cluster::default();
    let mut other = se("other", "held", "t", &["o"]);
    other.allocated = pairs(&[("o", v4(1))]);
    cluster.entries.insert(
        "other/held".into(),
        Entry {
            se: other,
            selected: false,
        },
    );
    cluster.entries.insert(
        "other/new".into(),
        Entry {
            se: se("other", "new", "t", &["n"]),
            selected: false,
        },
    );
    cluster.put(se("mine", "new", "t", &["m"]));
    let mut allocator = prefixes();
    assert_eq!(cluster.converge(&mut allocator), ["mine/new"]);
    assert_eq!(
        cluster.addresses("mine/new"),
        pairs(&[("m", v4(2)), ("m", v6(1))])
    );
}

#[test]
fn skipped_entries_are_not_planned_and_exhaustion_is_reported() {
    let mut allocator = Allocator::new(
        "10.0.0.0/30".parse().unwrap(),
        "fd00::/126".parse().unwrap(),
    );
    let entries: Vec<Entry> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| Entry {
            se: se("ns", n, "t", &[n]),
            selected: true,
        })
        .collect();
    let (writes, exhausted) = allocator.plan(&entries, |key| key == "ns/a");
    let planned: Vec<&str> = writes.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(planned, ["b", "c", "d"]);
    // /30 holds .1, .2 and .3 after the prefix address: b, c and d take them, and the
    // wrap-around finds nothing more.
    assert_eq!(
        writes[2].addresses,
        pairs(&[("d", ip("10.0.0.3")), ("d", ip("fd00::3"))])
    );
    assert!(exhausted.is_empty());
    // Planned again (their writes were not applied), nobody gets an address, and an empty
    // list where the status is empty already is no write.
    let (writes, exhausted) = allocator.plan(&entries, |_| false);
    assert!(writes.is_empty(), "{writes:?}");
    assert_eq!(exhausted.len(), 8);
    assert_eq!(exhausted[0].to_string(), "10.0.0.0/30 is exhausted");
}
