//! [`Pod`]: the reduced Kubernetes Pod, packed.
//!
//! 100k stored pods make every allocation per pod count. A pod with one `Box<str>` per field, boxed
//! owner and port lists would take about 19 small blocks (440 B, each rounded up to a size class,
//! plus 16 B inline per string). A [`Pod`] keeps everything but its labels in one `Box<str>`: its
//! numbers (offsets, ports, IPs, a UUID uid) as bytes of seven bits, then its strings; its labels
//! stay a [`Labels`] (the index's hot path reads them as `&Labels`). Strings most pods share
//! (phases, the default service account, controller kinds, the kept annotation) are one byte of
//! text. Sources and tests fill in a [`PodFields`] (plain owned fields) and pack it with
//! `Pod::from`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::discovery::model::kinds::Protocol;
use crate::discovery::model::labels::{Labels, head_number, put_seven_bits};
pub use crate::discovery::model::uid::Uid;

/// The controller owner of a pod (`ownerReferences[controller=true]`): owned in
/// [`PodFields`], borrowed (`Owner<&str>`) from a [`Pod`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner<S = String> {
    pub kind: S,
    pub name: S,
}

/// A named container port (`spec.containers[*].ports`, plus native sidecar init containers):
/// owned in [`PodFields`], borrowed (`ContainerPort<&str>`) from a [`Pod`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerPort<S = String> {
    pub name: S,
    pub port: u16,
    pub protocol: Protocol,
}

/// The fields of a [`Pod`], unpacked: what a source or a test fills in before packing it with
/// `Pod::from`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFields {
    pub name: String,
    /// `metadata.uid`, compared with EndpointSlice `targetRef.uid`; copied to its workload
    /// resource ([`crate::discovery::Resource::pod_uid`]).
    pub uid: String,
    pub namespace: String,
    pub generate_name: String,
    pub labels: Labels,
    /// Only the annotations the conversion reads (sources drop the rest).
    pub annotations: Labels,
    pub owner: Option<Owner>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `status.phase`; the API server starts every pod as `Pending`.
    pub phase: String,
    /// Condition `Ready` is `True`.
    pub ready: bool,
    /// `status.podIPs`, falling back to `status.podIP`, in order.
    pub ips: Vec<IpAddr>,
    /// `spec.serviceAccountName`, defaulted to `default`.
    pub service_account: String,
    pub node_name: String,
    pub host_network: bool,
    /// Named ports of containers and native sidecar init containers, in declaration order.
    pub ports: Vec<ContainerPort>,
}

/// A reduced Pod, packed: its fields read through methods named as those of [`PodFields`].
///
/// Besides its labels, one string holds everything, so that the buffer needs no unsafe code to
/// read: a width byte `w`; the *small* numbers, `w` bytes of seven bits each (the annotation,
/// port and IP counts, the two prefix lengths, where the big numbers and the text start, each
/// string's end offset from the start of the buffer, and each IP's family, 4 or 6); the *big*
/// numbers, three bytes of seven bits each (21 bits: the flags, one word per port with the
/// protocol above bit 16, the IPs' addresses as 16-bit halves); a UUID uid as 19 bytes of seven
/// bits; then the text:
/// the fixed strings (name, namespace, generate name, phase, service account, node name, owner
/// kind and name), each annotation's key and value, each port's name, and the uid if it is not
/// a UUID. The generate name and the owner's name are nearly always prefixes of the name
/// (`web-7d4b9-` and `web-7d4b9` of `web-7d4b9-x2x`); such a one is empty in the text and read
/// as the name's first bytes. The encoding is canonical, so two pods are equal exactly when
/// their fields are.
#[derive(Clone, PartialEq)]
pub struct Pod {
    labels: Labels,
    data: Box<str>,
}

// The strings at fixed positions in the text.
const NAME: usize = 0;
const NAMESPACE: usize = 1;
const GENERATE_NAME: usize = 2;
const PHASE: usize = 3;
const SERVICE_ACCOUNT: usize = 4;
const NODE_NAME: usize = 5;
const OWNER_KIND: usize = 6;
const OWNER_NAME: usize = 7;
const FIXED: usize = 8;

// The small numbers at the head.
const ANNOTATIONS: usize = 0;
const PORTS: usize = 1;
const IPS: usize = 2;
const GENERATE_PREFIX: usize = 3;
const OWNER_PREFIX: usize = 4;
const BIG_START: usize = 5;
const TEXT_START: usize = 6;
/// The first string end.
const ENDS: usize = 7;
/// The big number holding the flags.
const FLAGS: usize = 0;
/// Bytes per big number: 21 bits.
const BIG: usize = 3;

// The bits of the flags.
const TERMINATING: u32 = 1;
const READY: u32 = 2;
const HOST_NETWORK: u32 = 4;
const HAS_OWNER: u32 = 8;
const GENERATE_NAME_IS_PREFIX: u32 = 16;
const OWNER_NAME_IS_PREFIX: u32 = 32;
/// The uid is a UUID: [`UUID_BYTES`] bytes of seven bits after the big numbers.
const UID_UUID: u32 = 64;
/// A UUID's 128 bits as bytes of seven bits (eight 21-bit big numbers would take 24).
const UUID_BYTES: usize = 19;
/// The uid is text, the string after the port names.
const UID_TEXT: u32 = 128;
/// Bits 8 to 20 of the flags: string `i` (for `i` under [`CODED_SLOTS`]) is one byte of the
/// text, the index of a [`WELL_KNOWN`] string.
const CODED_SHIFT: u32 = 8;
const CODED_SLOTS: usize = 13;

/// Strings most pods share, stored as one byte: phases, the default service account, the
/// common controller kinds, the one annotation kept and its values. For the scale harness's pod
/// they are 54 of the 104 bytes of text.
const WELL_KNOWN: [&str; 16] = [
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
    "default",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "ReplicationController",
    "Node",
    "Deployment",
    "ambient.istio.io/redirection",
    "enabled",
    "disabled",
];

impl Pod {
    pub fn name(&self) -> &str {
        self.string(NAME)
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Uid<'_> {
        if self.flag(UID_UUID) {
            let end = self.small(TEXT_START);
            let sevens = &self.data.as_bytes()[end - UUID_BYTES..end];
            let n = sevens
                .iter()
                .rev()
                .fold(0u128, |n, byte| n << 7 | u128::from(*byte));
            Uid::Uuid(n.to_be_bytes())
        } else if self.flag(UID_TEXT) {
            Uid::Text(self.string(FIXED + 2 * self.count(ANNOTATIONS) + self.count(PORTS)))
        } else {
            Uid::Text("")
        }
    }

    pub fn namespace(&self) -> &str {
        self.string(NAMESPACE)
    }

    pub fn generate_name(&self) -> &str {
        self.name_or_prefix(GENERATE_NAME, GENERATE_NAME_IS_PREFIX, GENERATE_PREFIX)
    }

    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The labels, to share their buffer with an equal map's ([`crate::discovery::model::labels::LabelSets`]).
    pub(crate) fn labels_mut(&mut self) -> &mut Labels {
        &mut self.labels
    }

    /// The value of one of the annotations kept (sources keep only those the conversion reads).
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The annotations kept, in key order.
    pub fn annotations(&self) -> impl Iterator<Item = (&str, &str)> {
        (0..self.count(ANNOTATIONS)).map(|i| {
            let at = FIXED + 2 * i;
            (self.string(at), self.string(at + 1))
        })
    }

    pub fn owner(&self) -> Option<Owner<&str>> {
        self.flag(HAS_OWNER).then(|| Owner {
            kind: self.string(OWNER_KIND),
            name: self.name_or_prefix(OWNER_NAME, OWNER_NAME_IS_PREFIX, OWNER_PREFIX),
        })
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn terminating(&self) -> bool {
        self.flag(TERMINATING)
    }

    /// `status.phase`.
    pub fn phase(&self) -> &str {
        self.string(PHASE)
    }

    /// Condition `Ready` is `True`.
    pub fn ready(&self) -> bool {
        self.flag(READY)
    }

    /// `status.podIPs` (or `status.podIP`), in order.
    pub fn ips(&self) -> Ips<'_> {
        Ips {
            pod: self,
            family: ENDS + self.strings(),
            half: 1 + self.count(PORTS),
            left: self.count(IPS),
        }
    }

    /// `spec.serviceAccountName`.
    pub fn service_account(&self) -> &str {
        self.string(SERVICE_ACCOUNT)
    }

    pub fn node_name(&self) -> &str {
        self.string(NODE_NAME)
    }

    pub fn host_network(&self) -> bool {
        self.flag(HOST_NETWORK)
    }

    /// Named ports of containers and native sidecar init containers, in declaration order.
    pub fn ports(&self) -> impl Iterator<Item = ContainerPort<&str>> {
        let first_name = FIXED + 2 * self.count(ANNOTATIONS);
        (0..self.count(PORTS)).map(move |i| {
            let word = self.big(1 + i);
            ContainerPort {
                name: self.string(first_name + i),
                port: word as u16,
                protocol: match word >> 16 {
                    0 => Protocol::Tcp,
                    1 => Protocol::Udp,
                    _ => Protocol::Sctp,
                },
            }
        })
    }

    /// The fields, unpacked.
    pub fn to_fields(&self) -> PodFields {
        PodFields {
            name: self.name().to_string(),
            uid: self.uid().to_string(),
            namespace: self.namespace().to_string(),
            generate_name: self.generate_name().to_string(),
            labels: self.labels.clone(),
            annotations: self.annotations().collect(),
            owner: self.owner().map(|o| Owner {
                kind: o.kind.to_string(),
                name: o.name.to_string(),
            }),
            terminating: self.terminating(),
            phase: self.phase().to_string(),
            ready: self.ready(),
            ips: self.ips().collect(),
            service_account: self.service_account().to_string(),
            node_name: self.node_name().to_string(),
            host_network: self.host_network(),
            ports: self
                .ports()
                .map(|p| ContainerPort {
                    name: p.name.to_string(),
                    port: p.port,
                    protocol: p.protocol,
                })
                .collect(),
        }
    }

    #[cfg(test)]
    fn width(&self) -> usize {
        usize::from(self.data.as_bytes()[0])
    }

    /// Small number `i`.
    fn small(&self, i: usize) -> usize {
        head_number(self.data.as_bytes(), i)
    }

    /// Big number `i`.
    fn big(&self, i: usize) -> u32 {
        let at = self.small(BIG_START) + i * BIG;
        let b = &self.data.as_bytes()[at..at + BIG];
        u32::from(b[0]) | u32::from(b[1]) << 7 | u32::from(b[2]) << 14
    }

    /// How many big numbers there are.
    #[cfg(test)]
    fn big_len(&self) -> usize {
        let uuid = if self.flag(UID_UUID) { UUID_BYTES } else { 0 };
        (self.small(TEXT_START) - self.small(BIG_START) - uuid) / BIG
    }

    /// One of the counts.
    fn count(&self, i: usize) -> usize {
        self.small(i)
    }

    fn flag(&self, bit: u32) -> bool {
        self.big(FLAGS) & bit != 0
    }

    /// How many strings there are.
    fn strings(&self) -> usize {
        FIXED + 2 * self.count(ANNOTATIONS) + self.count(PORTS) + usize::from(self.flag(UID_TEXT))
    }

    /// String `i`, or (`flag` set) the name's first bytes, as many as the half of the prefixes
    /// word at `shift`.
    fn name_or_prefix(&self, i: usize, flag: u32, length: usize) -> &str {
        if self.flag(flag) {
            &self.name()[..self.small(length)]
        } else {
            self.string(i)
        }
    }

    fn string(&self, i: usize) -> &str {
        let start = if i == 0 {
            self.small(TEXT_START)
        } else {
            self.small(ENDS + i - 1)
        };
        let raw = &self.data[start..self.small(ENDS + i)];
        if i < CODED_SLOTS && self.big(FLAGS) >> CODED_SHIFT & (1 << i) != 0 {
            WELL_KNOWN[usize::from(raw.as_bytes()[0])]
        } else {
            raw
        }
    }
}

impl Default for Pod {
    fn default() -> Self {
        Pod::from(PodFields::default())
    }
}

impl From<PodFields> for Pod {
    fn from(pod: PodFields) -> Self {
        let no_owner = Owner::default();
        let owner = pod.owner.as_ref().unwrap_or(&no_owner);
        // The length of a prefix of the name (stored as that length, not as text).
        let prefix = |s: &str| pod.name.starts_with(s).then_some(s.len());
        let generate_prefix = prefix(&pod.generate_name);
        let owner_prefix = pod.owner.as_ref().and_then(|o| prefix(&o.name));
        let fixed: [&str; FIXED] = [
            &pod.name,
            &pod.namespace,
            if generate_prefix.is_some() {
                ""
            } else {
                &pod.generate_name
            },
            &pod.phase,
            &pod.service_account,
            &pod.node_name,
            &owner.kind,
            if owner_prefix.is_some() {
                ""
            } else {
                &owner.name
            },
        ];
        let uid = Uid::parse(&pod.uid);
        let uid_text = match uid {
            Uid::Text(text) if !text.is_empty() => Some(text),
            _ => None,
        };
        let strings = || {
            fixed
                .into_iter()
                .chain(pod.annotations.iter().flat_map(|(k, v)| [k, v]))
                .chain(pod.ports.iter().map(|p| p.name.as_str()))
                .chain(uid_text)
        };
        let (annotations, ports) = (pod.annotations.len(), pod.ports.len());
        let mut flags = [
            (pod.terminating, TERMINATING),
            (pod.ready, READY),
            (pod.host_network, HOST_NETWORK),
            (pod.owner.is_some(), HAS_OWNER),
            (generate_prefix.is_some(), GENERATE_NAME_IS_PREFIX),
            (owner_prefix.is_some(), OWNER_NAME_IS_PREFIX),
            (matches!(uid, Uid::Uuid(_)), UID_UUID),
            (uid_text.is_some(), UID_TEXT),
        ]
        .into_iter()
        .filter(|(set, _)| *set)
        .fold(0, |flags, (_, bit)| flags | bit);
        // The text, and its string ends counted from the text's start for now.
        let mut text = String::new();
        let mut ends = Vec::new();
        for (i, s) in strings().enumerate() {
            match WELL_KNOWN.iter().position(|known| *known == s) {
                Some(code) if i < CODED_SLOTS => {
                    text.push(char::from(code as u8));
                    flags |= 1 << (CODED_SHIFT + i as u32);
                }
                _ => text.push_str(s),
            }
            ends.push(text.len());
        }
        let mut big = vec![flags];
        big.extend(pod.ports.iter().map(|p| {
            let protocol = match p.protocol {
                Protocol::Tcp => 0,
                Protocol::Udp => 1,
                Protocol::Sctp => 2,
            };
            u32::from(p.port) | protocol << 16
        }));
        let mut families = Vec::new();
        let halves = |bytes: &[u8]| -> Vec<u32> {
            bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                .collect()
        };
        for ip in &pod.ips {
            match ip {
                IpAddr::V4(v4) => {
                    families.push(4);
                    big.extend(halves(&v4.octets()));
                }
                IpAddr::V6(v6) => {
                    families.push(6);
                    big.extend(halves(&v6.octets()));
                }
            }
        }
        let uuid = match uid {
            Uid::Uuid(bytes) => Some(u128::from_be_bytes(bytes)),
            Uid::Text(_) => None,
        };
        let uuid_len = if uuid.is_some() { UUID_BYTES } else { 0 };
        let smalls = ENDS + ends.len() + families.len();
        let size = |width: usize| 1 + smalls * width + big.len() * BIG + uuid_len + text.len();
        let width = (1..=4)
            // Every small number is under the size (a prefix is shorter than the name).
            .find(|&w| size(w) < 1 << (7 * w))
            .expect("pod over 256 MiB");
        let big_start = 1 + smalls * width;
        let text_start = big_start + big.len() * BIG + uuid_len;
        let capacity = size(width);
        let mut data = String::with_capacity(capacity);
        data.push(char::from(width as u8));
        let small = [
            annotations,
            ports,
            pod.ips.len(),
            generate_prefix.unwrap_or(0),
            owner_prefix.unwrap_or(0),
            big_start,
            text_start,
        ]
        .into_iter()
        .chain(ends.iter().map(|end| text_start + end))
        .chain(families);
        for n in small {
            put_seven_bits(&mut data, n, width);
        }
        for n in big {
            put_seven_bits(&mut data, n as usize, BIG);
        }
        if let Some(mut n) = uuid {
            for _ in 0..UUID_BYTES {
                data.push(char::from((n & 0x7f) as u8));
                n >>= 7;
            }
        }
        data.push_str(&text);
        debug_assert_eq!(data.len(), capacity);
        Pod {
            labels: pod.labels,
            data: data.into_boxed_str(),
        }
    }
}

/// A pod's IPs, in order.
#[derive(Clone, Debug)]
pub struct Ips<'a> {
    pod: &'a Pod,
    /// The small number holding the next IP's family.
    family: usize,
    /// The big number holding the next IP's first half.
    half: usize,
    left: usize,
}

impl Iterator for Ips<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let halves = if self.pod.small(self.family) == 4 {
            2
        } else {
            8
        };
        let mut octets = [0u8; 16];
        for i in 0..halves {
            let half = self.pod.big(self.half + i) as u16;
            octets[2 * i..2 * i + 2].copy_from_slice(&half.to_be_bytes());
        }
        self.family += 1;
        self.half += halves;
        Some(if halves == 2 {
            IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(octets))
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Ips<'_> {}

impl fmt::Debug for Pod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pod")
            .field("name", &self.name())
            .field("uid", &self.uid().to_string())
            .field("namespace", &self.namespace())
            .field("generate_name", &self.generate_name())
            .field("labels", &self.labels)
            .field("annotations", &self.annotations().collect::<Labels>())
            .field("owner", &self.owner())
            .field("terminating", &self.terminating())
            .field("phase", &self.phase())
            .field("ready", &self.ready())
            .field("ips", &self.ips().collect::<Vec<_>>())
            .field("service_account", &self.service_account())
            .field("node_name", &self.node_name())
            .field("host_network", &self.host_network())
            .field("ports", &self.ports().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> PodFields {
        PodFields {
            name: "web-7d4b9-x2x".into(),
            uid: "0000-1111".into(),
            namespace: "demo".into(),
            generate_name: "web-7d4b9-".into(),
            labels: Labels::from([("app", "web"), ("version", "v1")]),
            annotations: Labels::from([("a/b", "on"), ("c", "")]),
            owner: Some(Owner {
                kind: "ReplicaSet".into(),
                name: "web-7d4b9".into(),
            }),
            terminating: true,
            phase: "Running".into(),
            ready: true,
            ips: vec!["fd00::1:2".parse().unwrap(), "10.0.0.9".parse().unwrap()],
            service_account: "web".into(),
            node_name: "node-a".into(),
            host_network: true,
            ports: vec![
                ContainerPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: Protocol::Tcp,
                },
                ContainerPort {
                    name: "dns".into(),
                    port: 65535,
                    protocol: Protocol::Udp,
                },
                ContainerPort {
                    name: "s".into(),
                    port: 1,
                    protocol: Protocol::Sctp,
                },
            ],
        }
    }

    #[test]
    fn every_field_reads_back_as_packed() {
        let fields = full();
        let pod = Pod::from(fields.clone());
        assert_eq!(pod.name(), "web-7d4b9-x2x");
        assert_eq!(pod.uid(), Uid::Text("0000-1111"));
        assert_eq!(pod.namespace(), "demo");
        assert_eq!(pod.generate_name(), "web-7d4b9-");
        assert_eq!(pod.labels().get("app"), Some("web"));
        assert_eq!(pod.annotation("a/b"), Some("on"));
        assert_eq!(pod.annotation("c"), Some(""));
        assert_eq!(pod.annotation("d"), None);
        assert_eq!(
            pod.owner(),
            Some(Owner {
                kind: "ReplicaSet",
                name: "web-7d4b9"
            })
        );
        assert!(pod.terminating() && pod.ready() && pod.host_network());
        assert_eq!(pod.phase(), "Running");
        assert_eq!(pod.ips().len(), 2);
        assert_eq!(pod.ips().collect::<Vec<_>>(), fields.ips);
        assert_eq!(pod.service_account(), "web");
        assert_eq!(pod.node_name(), "node-a");
        let ports: Vec<_> = pod.ports().map(|p| (p.name, p.port, p.protocol)).collect();
        assert_eq!(
            ports,
            [
                ("http", 8080, Protocol::Tcp),
                ("dns", 65535, Protocol::Udp),
                ("s", 1, Protocol::Sctp)
            ]
        );
        assert_eq!(pod.to_fields(), fields);
    }

    #[test]
    fn pods_are_equal_exactly_when_their_fields_are() {
        let pod = Pod::from(full());
        assert_eq!(pod, Pod::from(full()));
        let changes: [fn(&mut PodFields); 11] = [
            |p| p.owner = None,
            |p| p.owner.as_mut().unwrap().kind = String::new(),
            |p| p.ready = false,
            |p| p.ips.reverse(),
            |p| p.ports[1].protocol = Protocol::Tcp,
            // The same text, split differently.
            |p| {
                p.name = "web-7d4b9-x2xdemo".into();
                p.namespace = String::new();
            },
            // Generate and owner names that are not prefixes of the name, and names that are
            // (or no longer are) prefixed by them.
            |p| p.generate_name = "other-".into(),
            |p| p.generate_name = String::new(),
            |p| p.owner.as_mut().unwrap().name = "web-7d4b9-x2x-longer".into(),
            |p| p.name = "web-7d4b9-y".into(),
            |p| p.name = "x".into(),
        ];
        for change in changes {
            let mut fields = full();
            change(&mut fields);
            assert_ne!(Pod::from(fields.clone()), pod, "{fields:?}");
            assert_eq!(Pod::from(fields.clone()).to_fields(), fields);
        }
    }

    #[test]
    fn a_pod_is_24_bytes_and_one_block_besides_its_labels() {
        assert_eq!(std::mem::size_of::<Pod>(), 24);
        let pod = Pod::from(full());
        // The generate name and the owner's name are the name's prefixes: not in the text; a
        // uid that is not a UUID is the last string.
        let text = &pod.data[pod.small(TEXT_START)..];
        assert_eq!(
            text, "web-7d4b9-x2xdemo\u{1}webnode-a\u{6}a/bonchttpdnss0000-1111",
            "Running and ReplicaSet are well known: one byte each"
        );
        assert_eq!(
            (pod.phase(), pod.owner().unwrap().kind),
            ("Running", "ReplicaSet")
        );
        // A string that only looks like a code is text, and strings past the coded slots are
        // never coded.
        let mut odd = full();
        odd.phase = "\u{1}".into();
        odd.annotations = (0..20).map(|i| (format!("k{i:02}"), "Running")).collect();
        let packed = Pod::from(odd.clone());
        assert_eq!(packed.phase(), "\u{1}");
        assert_eq!(packed.to_fields(), odd);
        // Flags, three ports, an IPv6 and an IPv4 address in 16-bit halves.
        assert_eq!(pod.big_len(), 1 + 3 + 8 + 2);
        // Under 128 bytes: one byte per small number (counts, starts, 16 ends, 2 families).
        assert_eq!(pod.width(), 1);
        assert_eq!(pod.data.len(), 1 + (ENDS + 16 + 2) + 14 * BIG + text.len());
        // A long pod takes wider small numbers.
        let mut long = full();
        long.name = "n".repeat(200);
        long.node_name = "x".repeat(20_000);
        let packed = Pod::from(long.clone());
        assert_eq!(packed.width(), 3);
        assert_eq!(packed.to_fields(), long);
    }

    #[test]
    fn a_uuid_uid_is_kept_as_numbers() {
        let text = "6f1c1d8e-0a1b-4c2d-8e3f-00000000abcd";
        let mut fields = full();
        fields.uid = text.into();
        let pod = Pod::from(fields.clone());
        assert!(matches!(pod.uid(), Uid::Uuid(_)));
        assert_eq!(pod.uid(), Uid::parse(text));
        assert!(!pod.data.contains("abcd"), "a UUID is kept as numbers");
        assert_eq!(
            pod.ips().collect::<Vec<_>>(),
            fields.ips,
            "the uid's bytes follow the IPs'"
        );
        assert_eq!(pod.to_fields(), fields);
        // Nineteen bytes of seven bits between the big numbers and the text (as 16-bit halves
        // in big numbers it would take 24).
        let bigs = pod.big_len() * BIG;
        assert_eq!(pod.small(TEXT_START) - pod.small(BIG_START) - bigs, 19);
        assert_eq!(pod.big_len(), 1 + 3 + 8 + 2);
        // Every bit pattern reads back, the high and low bits included.
        for uuid in [
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "00000000-0000-0000-0000-000000000000",
            "80000000-0000-0000-0000-000000000001",
        ] {
            fields.uid = uuid.into();
            let pod = Pod::from(fields.clone());
            assert_eq!(pod.uid(), Uid::parse(uuid), "{uuid}");
            assert_eq!(pod.uid().to_string(), uuid);
        }
    }

    #[test]
    fn an_empty_pod_reads_as_empty() {
        for pod in [Pod::default(), Pod::from(PodFields::default())] {
            assert_eq!(pod.name(), "");
            assert_eq!(pod.owner(), None);
            assert_eq!(pod.ips().next(), None);
            assert_eq!(pod.ports().count(), 0);
            assert_eq!(pod.annotations().count(), 0);
            assert_eq!(pod.to_fields(), PodFields::default());
        }
        assert_eq!(
            format!("{:?}", Pod::from(full())),
            format!("{:?}", full()).replacen("PodFields", "Pod", 1)
        );
    }
}
