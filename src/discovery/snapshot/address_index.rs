//! The snapshot's address index: which resources hold each `network/ip` ([`Aliases`]), keyed
//! by [`Alias`]es held as numbers, not text.
//!
//! Every address of every workload and service is an alias (`/10.0.0.5` on the default
//! network), so at 100k pods text keys would be 100k strings: a 32-byte block each, plus a
//! link in each resource to find them again. An `Alias` is the network's index in a small table and
//! the IP, inline in the map's slot; a resource's aliases come from its
//! [`Links`](crate::discovery::snapshot::links::Links) ([`aliases_of`]).
//!
//! A service's CIDR address (a ServiceEntry's `10.1.0.0/16`) is keyed by its IP alone, as
//! istiod's address index keys it (`networkAddressFromService`): `net/10.1.0.0` finds it, and
//! `net/10.1.0.0/16` is no key at all.

use std::net::IpAddr;

use crate::discovery::snapshot::links::Links;
use crate::discovery::snapshot::name::Name;
use crate::discovery::snapshot::name::NameSet;
use crate::discovery::trie::HashTrie;

/// A `network/ip` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Alias {
    /// Index of the network's name in the snapshot's [`Networks`] (0: the default, `""`).
    network: u16,
    ip: IpAddr,
}

/// The names of the networks aliases refer to, in the order first seen; the default network
/// (`""`) is always first. Networks are few and never forgotten (an unused name costs nothing
/// but its string).
#[derive(Clone, Debug)]
pub(crate) struct Networks(std::sync::Arc<[Name]>);

impl Default for Networks {
    fn default() -> Self {
        Networks(std::sync::Arc::from([Name::from("")]))
    }
}

impl Networks {
    fn index(&self, network: &str) -> Option<u16> {
        let i = self.0.iter().position(|n| **n == *network)?;
        u16::try_from(i).ok()
    }

    /// The alias of an address on `network`, adding the network to the table if it is new.
    pub(crate) fn alias(&mut self, network: &str, ip: IpAddr) -> Alias {
        let network = match self.index(network) {
            Some(i) => i,
            None => {
                let mut names = self.0.to_vec();
                names.push(network.into());
                self.0 = names.into();
                u16::try_from(self.0.len() - 1).expect("under 65536 networks")
            }
        };
        Alias { network, ip }
    }

    /// The alias a lookup key names (`network/ip`); `None` when it is not one, or names a
    /// network no address is on.
    pub(crate) fn parse(&self, key: &str) -> Option<Alias> {
        let (network, ip) = key.split_once('/')?;
        Some(Alias {
            network: self.index(network)?,
            ip: ip.parse().ok()?,
        })
    }

    /// The key as text: `network/ip`.
    pub(crate) fn text(&self, alias: &Alias) -> String {
        let network = self.0.get(usize::from(alias.network)).map_or("", |n| n);
        format!("{network}/{}", alias.ip)
    }
}

/// `network/ip` -> the names of the resources with that address. Nearly every address has one
/// name (a pod's IP), kept as the name alone: a trie slot of 40 bytes where a [`NameSet`] made it
/// 48. The few addresses with several (a VIP shared by services, pods on the host network) are
/// in a map of their own.
#[derive(Clone, Debug, Default)]
pub(crate) struct Aliases {
    one: HashTrie<Alias, Name>,
    many: HashTrie<Alias, NameSet>,
}

impl Aliases {
    /// The names at `alias`, sorted.
    pub(crate) fn get(&self, alias: &Alias) -> Option<NameSet> {
        match self.one.get(alias) {
            Some(name) => Some(NameSet::One(name.clone())),
            None => self.many.get(alias).cloned(),
        }
    }

    /// Whether `name` is among the names at `alias`.
    #[cfg(test)]
    pub(crate) fn holds(&self, alias: &Alias, name: &str) -> bool {
        match self.one.get(alias) {
            Some(one) => **one == *name,
            None => self
                .many
                .get(alias)
                .is_some_and(|names| names.binary_search_by(|n| (**n).cmp(name)).is_ok()),
        }
    }

    /// Adds `name` at `alias` (nothing if it is there).
    pub(crate) fn add(&mut self, alias: &Alias, name: &Name) {
        if let Some(names) = self.many.get(alias) {
            if let Err(at) = names.binary_search(name)
                && let Some(names) = self.many.get_mut(alias)
            {
                names.insert(at, name.clone());
            }
            return;
        }
        match self.one.get(alias) {
            None => {
                self.one.insert(*alias, name.clone());
            }
            Some(one) if one == name => {}
            Some(one) => {
                let mut names = NameSet::One(one.clone());
                let at = usize::from(one < name);
                names.insert(at, name.clone());
                self.one.remove(alias);
                self.many.insert(*alias, names);
            }
        }
    }

    /// Removes `name` from `alias`, and the alias with its last name.
    pub(crate) fn remove(&mut self, alias: &Alias, name: &str) {
        if self.one.get(alias).is_some_and(|one| **one == *name) {
            self.one.remove(alias);
            return;
        }
        let Some(names) = self.many.get(alias) else {
            return;
        };
        let Ok(at) = names.binary_search_by(|n| (**n).cmp(name)) else {
            return;
        };
        let Some(names) = self.many.get_mut(alias) else {
            return;
        };
        names.remove(at);
        if let NameSet::One(last) = names {
            let last = last.clone();
            self.many.remove(alias);
            self.one.insert(*alias, last);
        }
    }

    /// Every alias with its names (in no particular order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Alias, NameSet)> {
        let one = self.one.iter().map(|(a, n)| (a, NameSet::One(n.clone())));
        one.chain(self.many.iter().map(|(a, names)| (a, names.clone())))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.one.len() + self.many.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sorted, unique `network/ip` aliases of an Address's links (with `networks` taking in
/// any network it has not seen).
pub(crate) fn aliases_of(links: &Links, networks: &mut Networks) -> Vec<Alias> {
    let mut aliases: Vec<Alias> = links
        .addresses
        .iter()
        .map(|(network, ip)| networks.alias(network, *ip))
        .collect();
    aliases.sort_unstable();
    aliases.dedup();
    aliases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_as_written_and_unknown_networks_name_nothing() {
        let mut networks = Networks::default();
        let v4 = networks.alias("", "10.0.0.5".parse().unwrap());
        let v6 = networks.alias("net1", "fd00::".parse().unwrap());
        for (alias, text) in [(v4, "/10.0.0.5"), (v6, "net1/fd00::")] {
            assert_eq!(networks.text(&alias), text);
            assert_eq!(networks.parse(text), Some(alias));
        }
        for key in [
            "net2/10.0.0.5",
            "10.0.0.5",
            "/not-an-ip",
            "/10.0.0.5/x",
            "net1/fd00::/64",
            "ns/host.name",
        ] {
            assert_eq!(networks.parse(key), None, "{key}");
        }
        // The same network again is the same entry.
        assert_eq!(networks.alias("net1", "fd00::".parse().unwrap()), v6);
    }

    #[test]
    fn one_name_is_kept_alone_and_more_move_to_their_own_map() {
        let mut networks = Networks::default();
        let a = networks.alias("", "10.0.0.5".parse().unwrap());
        let (x, y, z) = (Name::from("x"), Name::from("y"), Name::from("z"));
        let mut aliases = Aliases::default();
        aliases.add(&a, &y);
        aliases.add(&a, &y);
        assert_eq!((aliases.one.len(), aliases.many.len()), (1, 0));
        assert_eq!(aliases.get(&a), Some(NameSet::One(y.clone())));
        aliases.add(&a, &x);
        aliases.add(&a, &z);
        assert_eq!((aliases.one.len(), aliases.many.len()), (0, 1));
        let names: Vec<Name> = aliases.get(&a).unwrap().iter().cloned().collect();
        assert_eq!(names, [x.clone(), y.clone(), z.clone()]);
        assert!(aliases.holds(&a, "z") && !aliases.holds(&a, "w"));
        aliases.remove(&a, "y");
        aliases.remove(&a, "w");
        assert_eq!(aliases.len(), 1);
        aliases.remove(&a, "x");
        assert_eq!((aliases.one.len(), aliases.many.len()), (1, 0));
        assert_eq!(aliases.get(&a), Some(NameSet::One(z)));
        assert!(aliases.holds(&a, "z"));
        aliases.remove(&a, "z");
        assert!(aliases.is_empty() && aliases.get(&a).is_none());
    }

    #[test]
    fn aliases_come_from_the_links_sorted_and_unique() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let links = Links {
            addresses: vec![
                (Name::from("net1"), ip("fd00::5")),
                (Name::from(""), ip("10.0.0.5")),
            ]
            .into(),
            ..Links::default()
        };
        let mut networks = Networks::default();
        let aliases = aliases_of(&links, &mut networks);
        let texts: Vec<String> = aliases.iter().map(|a| networks.text(a)).collect();
        assert_eq!(texts, ["/10.0.0.5", "net1/fd00::5"]);
        assert!(aliases_of(&Links::default(), &mut networks).is_empty());
    }
}
