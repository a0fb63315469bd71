//! What the IP auto-allocator writes, decided without I/O: istiod's `ipallocate` controller
//! (`pilot/pkg/controllers/ipallocate`) as a function of the ServiceEntries it sees.
//!
//! * Each prefix hands out addresses in order from the one after the prefix's address,
//!   skipping any in use, and wraps around once before it is exhausted. An address is never
//!   freed while this replica leads: a host that is removed and added again gets a new one,
//!   as in istiod.
//! * Every in-range address already in use counts: each entry's `spec.addresses` (plain IPs)
//!   and `status.addresses`, whether it auto-allocates or not.
//! * An address held by two entries is a conflict. A `spec.addresses` holder keeps it and
//!   every auto-allocated holder is reassigned; between auto-allocated holders the oldest
//!   (`creationTimestamp`, then namespace/name) keeps it. A reassigned entry gets new
//!   addresses for all its hosts.
//! * An entry that auto-allocates (`discovery::service_entry::auto_allocates`) needs a write
//!   when the hosts it should have addresses for (`allocates_host`, duplicates once) differ
//!   from the hosts its status has addresses for. The write keeps each host's existing
//!   addresses and gives each new host one address from each prefix (IPv4, then IPv6).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::str::FromStr;

use crate::discovery::convert::service_entry::{allocates_host, auto_allocates};
use crate::discovery::model::ServiceEntry;

/// istiod's default IPv4 range (`PILOT_IP_AUTOALLOCATE_IPV4_PREFIX`).
pub const DEFAULT_IPV4_PREFIX: &str = "240.240.0.0/16";
/// istiod's default IPv6 range (`PILOT_IP_AUTOALLOCATE_IPV6_PREFIX`).
pub const DEFAULT_IPV6_PREFIX: &str = "2001:2::/48";

/// An address range, as Go's `netip.ParsePrefix` reads it: the address as written (allocation
/// starts after it) and the prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    address: IpAddr,
    bits: u8,
}

impl FromStr for Prefix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, bits) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR prefix (no /)"))?;
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?}: {address:?} is not an IP address"))?;
        let width = width(address);
        let bits = bits
            .parse::<u8>()
            .ok()
            .filter(|b| *b <= width)
            .ok_or_else(|| format!("{text:?}: the length must be 0 to {width}"))?;
        Ok(Prefix { address, bits })
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.bits)
    }
}

fn width(address: IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

fn number(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address after `address` in its family, `None` past the last.
fn successor(address: IpAddr) -> Option<IpAddr> {
    match address {
        IpAddr::V4(v4) => u32::from(v4)
            .checked_add(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
        IpAddr::V6(v6) => u128::from(v6)
            .checked_add(1)
            .map(|n| IpAddr::from(n.to_be_bytes())),
    }
}

/// A v4-mapped IPv6 address as IPv4 (Go's `Unmap`).
fn unmap(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

impl Prefix {
    pub fn is_ipv4(&self) -> bool {
        self.address.is_ipv4()
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        if address.is_ipv4() != self.address.is_ipv4() {
            return false;
        }
        let shift = u32::from(width(address) - self.bits);
        let high = |n: u128| n.checked_shr(shift).unwrap_or(0);
        high(number(address)) == high(number(self.address))
    }

    /// The first address handed out: the one after the prefix's.
    fn first(&self) -> Option<IpAddr> {
        successor(self.address).filter(|a| self.contains(*a))
    }
}

/// One prefix's addresses in use, each with the entry (`ns/name`) it was first seen on.
#[derive(Debug)]
struct PrefixUse {
    prefix: Prefix,
    used: HashMap<IpAddr, String>,
    next: Option<IpAddr>,
}

impl PrefixUse {
    fn new(prefix: Prefix) -> Self {
        PrefixUse {
            prefix,
            used: HashMap::new(),
            next: prefix.first(),
        }
    }

    /// Records `address` as `owner`'s. `true` when another entry already holds it.
    fn mark(&mut self, address: IpAddr, owner: &str) -> bool {
        if !self.prefix.contains(address) {
            return false;
        }
        match self.used.get(&address) {
            Some(holder) => holder != owner,
            None => {
                self.used.insert(address, owner.to_string());
                false
            }
        }
    }

    /// The next free address, `None` when the prefix is exhausted.
    fn allocate(&mut self, owner: &str) -> Option<IpAddr> {
        let first = self.prefix.first()?;
        let mut looped = false;
        let mut candidate = match self.next.filter(|n| self.prefix.contains(*n)) {
            Some(next) => next,
            None => {
                looped = true;
                first
            }
        };
        while self.used.contains_key(&candidate) {
            candidate = match successor(candidate).filter(|n| self.prefix.contains(*n)) {
                Some(next) => next,
                None if looped => return None,
                None => {
                    looped = true;
                    first
                }
            };
        }
        self.used.insert(candidate, owner.to_string());
        self.next = successor(candidate);
        Some(candidate)
    }
}

/// One ServiceEntry as the allocator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub se: ServiceEntry,
    /// Whether its namespace is one this control plane serves (discovery selectors). Entries
    /// outside still hold their addresses, but get none.
    pub selected: bool,
}

impl Entry {
    fn key(&self) -> String {
        format!("{}/{}", self.se.namespace, self.se.name)
    }

    /// `spec.addresses` that are plain IPs (a CIDR is not one address).
    fn spec_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.se.addresses.iter().filter_map(|a| a.parse().ok())
    }
}

/// A status write: the entry (`ns/name`) and its new `status.addresses`, as `(host, address)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub namespace: String,
    pub name: String,
    pub addresses: Vec<(String, IpAddr)>,
}

/// Why an entry got no addresses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{prefix} is exhausted")]
pub struct Exhausted {
    pub prefix: Prefix,
}

/// The allocator's memory while this replica leads.
#[derive(Debug)]
pub struct Allocator {
    v4: PrefixUse,
    v6: PrefixUse,
}

impl Allocator {
    pub fn new(v4: Prefix, v6: Prefix) -> Self {
        Allocator {
            v4: PrefixUse::new(v4),
            v6: PrefixUse::new(v6),
        }
    }

    fn mark(&mut self, address: IpAddr, owner: &str) -> bool {
        let address = unmap(address);
        if address.is_ipv4() {
            self.v4.mark(address, owner)
        } else {
            self.v6.mark(address, owner)
        }
    }

    fn hand_over(&mut self, address: IpAddr, owner: &str) {
        let address = unmap(address);
        let prefix = if address.is_ipv4() {
            &mut self.v4
        } else {
            &mut self.v6
        };
        if prefix.prefix.contains(address) {
            prefix.used.insert(address, owner.to_string());
        }
    }

    /// One address from each prefix for `owner`; a prefix that is exhausted gives none and
    /// is reported.
    fn next_addresses(&mut self, owner: &str, exhausted: &mut Vec<Exhausted>) -> Vec<IpAddr> {
        let mut addresses = Vec::with_capacity(2);
        for prefix in [&mut self.v4, &mut self.v6] {
            match prefix.allocate(owner) {
                Some(address) => addresses.push(address),
                None => exhausted.push(Exhausted {
                    prefix: prefix.prefix,
                }),
            }
        }
        addresses
    }

    /// The writes that bring `entries` to a consistent allocation. `skip` names entries not
    /// to plan now (a write to them is in flight or backing off): they still hold their
    /// addresses. Addresses planned here are taken at once, so a failed write wastes them, as
    /// in istiod.
    pub fn plan<'a>(
        &mut self,
        entries: impl IntoIterator<Item = &'a Entry>,
        skip: impl Fn(&str) -> bool,
    ) -> (Vec<Write>, Vec<Exhausted>) {
        let entries: BTreeMap<String, &Entry> = entries.into_iter().map(|e| (e.key(), e)).collect();
        // Every address in use, and the ones two entries hold.
        let mut conflicts = BTreeSet::new();
        for (key, entry) in &entries {
            let status = entry.se.allocated.iter().map(|(_, a)| *a);
            for address in entry.spec_addresses().chain(status) {
                if self.mark(address, key) {
                    conflicts.insert(unmap(address));
                }
            }
        }
        let mut reassign = BTreeSet::new();
        for address in conflicts {
            let user = entries
                .iter()
                .find(|(_, e)| e.spec_addresses().any(|a| unmap(a) == address));
            let mut auto: Vec<(&str, &String)> = entries
                .iter()
                .filter(|(_, e)| e.se.allocated.iter().any(|(_, a)| unmap(*a) == address))
                .map(|(key, e)| (e.se.created.as_str(), key))
                .collect();
            auto.sort();
            let keeper = match user {
                Some((key, _)) => key,
                None => match auto.first() {
                    Some((_, key)) => *key,
                    None => continue,
                },
            };
            self.hand_over(address, keeper);
            reassign.extend(
                auto.into_iter()
                    .map(|(_, key)| key.clone())
                    .filter(|key| key != keeper),
            );
        }
        let mut writes = Vec::new();
        let mut exhausted = Vec::new();
        for (key, entry) in &entries {
            if !entry.selected || !auto_allocates(&entry.se) || skip(key) {
                continue;
            }
            let forced = reassign.contains(key);
            let mut hosts: Vec<&String> = Vec::new();
            for host in &entry.se.hosts {
                if allocates_host(&entry.se, host) && !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            let held: BTreeSet<&String> = entry.se.allocated.iter().map(|(h, _)| h).collect();
            if !forced && held == hosts.iter().copied().collect() {
                continue;
            }
            let mut addresses = Vec::new();
            for host in hosts {
                let kept: Vec<IpAddr> = entry
                    .se
                    .allocated
                    .iter()
                    .filter(|(h, _)| h == host)
                    .map(|(_, a)| *a)
                    .collect();
                let assigned = if !forced && !kept.is_empty() {
                    kept
                } else {
                    self.next_addresses(key, &mut exhausted)
                };
                addresses.extend(assigned.into_iter().map(|a| (host.clone(), a)));
            }
            if addresses == entry.se.allocated {
                continue; // nothing could be allocated (the prefixes are exhausted)
            }
            writes.push(Write {
                namespace: entry.se.namespace.clone(),
                name: entry.se.name.clone(),
                addresses,
            });
        }
        (writes, exhausted)
    }
}

#[cfg(test)]
mod tests;
