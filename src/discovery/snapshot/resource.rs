//! [`Resource`]: one encoded xDS resource, its [`Version`] and its [`Name`].
//!
//! Each resource is encoded once; its version is a hash of those bytes, so replicas agree on
//! versions for the same content and an unchanged resource is never re-sent.

use std::borrow::Cow;

use bytes::{BufMut, Bytes};
use prost::Message;

use crate::discovery::model::uid::Uid;
use crate::discovery::names::TypeKind;
use crate::discovery::snapshot::alias::{Alias, Networks, addresses_of};
use crate::discovery::snapshot::links::waypoint_of;
use crate::discovery::snapshot::name::Name;
use crate::pb::google::protobuf::Any;

/// A resource's version: the xxhash64 of its encoded value. Kept as the number (8 bytes, no
/// allocation) and sent as istiod sends it: lowercase hex, without leading zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Version(pub u64);

impl Version {
    /// The version of an encoded value.
    pub fn of(value: &[u8]) -> Self {
        Version(xxhash_rust::xxh64::xxh64(value, 0))
    }

    /// The hex digits as sent, without allocating.
    pub fn digits(self, buf: &mut [u8; 16]) -> &[u8] {
        let mut n = self.0;
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b"0123456789abcdef"[(n & 15) as usize];
            n >>= 4;
            if n == 0 {
                return &buf[i..];
            }
        }
    }

    /// Whether `text` (a version a client holds) is exactly this version as sent.
    pub fn is(self, text: &str) -> bool {
        self.digits(&mut [0; 16]) == text.as_bytes()
    }

    /// The length of the version as sent.
    pub fn hex_len(self) -> usize {
        // One digit per four significant bits, and "0" for zero.
        (16 - self.0.leading_zeros() as usize / 4).max(1)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// One xDS resource, encoded once and shared by every connection that sends it.
///
/// 80 bytes with its `Arc` (there is one per workload), and one more block, its value: a plain
/// boxed slice (a `Bytes` is 32 bytes and allocates a shared header on its first clone; sends
/// copy from the slice anyway). What the index looks it up by besides its name (its
/// `network/ip` aliases, a workload's node and services, the waypoint it uses) is read back
/// from the value when needed ([`crate::discovery::snapshot::alias`], [`crate::discovery::snapshot::links`]).
///
/// A workload's value repeats its name: the uid field is the resource name, and the `name`
/// field is the uid's last segment. Those bytes are left out of the stored slice and written
/// back from [`Resource::name`] as the value is sent ([`Resource::write_value`]), which takes a
/// 100k-pod mesh's values from the 256-byte size class to the 192-byte one.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// The xDS name: a workload uid, `ns/hostname` for a service, `ns/name` for a policy.
    pub name: Name,
    /// xxhash64 of the encoded `Any` value, sent as hex.
    pub version: Version,
    /// The encoded message (the `Any`'s value) without the bytes that repeat the name
    /// ([`Resource::value`] puts them back); then, for a pod uid that is not a UUID, its text
    /// and its length in a last byte.
    packed: Box<[u8]>,
    /// For a pod's workload, its uid's bytes when it is a UUID ([`Resource::pod_uid`]).
    uuid: [u8; 16],
    /// The pod uid's form in the low bits ([`NO_UID`], [`UUID`] or [`TEXT_UID`]), and
    /// [`HAS_NODE`] and [`IS_SERVICE`].
    bits: u8,
    /// The resource type, which names the `Any`'s type URL (a byte, not a string per resource).
    pub kind: TypeKind,
    /// How many `network/ip` aliases the index holds for it (set when stored): a change that
    /// keeps them all need not read the old value's. Saturates at [`Resource::MANY`].
    pub(crate) alias_count: u8,
    /// How many services the index lists it as a member of (set when stored, as
    /// `alias_count`; [`HAS_NODE`] likewise for the node index).
    service_count: u16,
    /// Where the value holds the name, counted in the packed bytes (0: it does not; no value
    /// starts with it, a field's key comes first).
    name_at: u16,
    /// How many of the name's last bytes the first field of the message holds, left out of
    /// the packed bytes (0: none), and where they go.
    tail_len: u8,
    tail_at: u8,
    /// The encoded value's length (each send asks for it several times).
    value_len: u32,
}

const NO_UID: u8 = 0;
const UUID: u8 = 1;
const TEXT_UID: u8 = 2;
const UID_BITS: u8 = 3;
const HAS_NODE: u8 = 4;
const IS_SERVICE: u8 = 8;

/// Where the first field of the message in `value`'s first field starts, and its length, when
/// both fields are length-delimited with one-byte keys and the inner one is under 128 bytes (a
/// Workload's `name` in an Address).
fn first_inner_field(value: &[u8]) -> Option<(usize, usize)> {
    let length_delimited = |key: u8| key < 0x80 && key & 7 == 2;
    if !length_delimited(*value.first()?) {
        return None;
    }
    // The outer field's length: a varint.
    let varint = value[1..].iter().position(|b| b & 0x80 == 0)? + 1;
    let at = 1 + varint;
    match value.get(at..at + 2)? {
        [key, len] if length_delimited(*key) && *len < 0x80 => Some((at + 2, usize::from(*len))),
        _ => None,
    }
}

/// How a value repeats its resource's name: where (in the value) it holds the whole name, and
/// whether the first field of its message is a tail of the name, as a Workload's `name` is of
/// its uid: the `(name_at, tail_len, tail_at)` of a [`Resource`], with `name_at` counted in the
/// value.
fn repeats_of_name(value: &[u8], name: &[u8]) -> (usize, usize, usize) {
    if name.is_empty() {
        return (0, 0, 0);
    }
    // Not at 0 (a field's key comes first), which stands for "nowhere".
    let Some(at) = value
        .get(1..)
        .and_then(|rest| memchr::memmem::find(rest, name))
        .map(|at| at + 1)
    else {
        return (0, 0, 0);
    };
    let (tail_at, tail) = match first_inner_field(value) {
        Some((start, len))
            if len > 0
                && start <= usize::from(u8::MAX)
                && start + len <= at
                && name.ends_with(&value[start..start + len]) =>
        {
            (start, len)
        }
        _ => (0, 0),
    };
    // Offsets are kept in 16 bits.
    if at - tail > usize::from(u16::MAX) {
        return (0, 0, 0);
    }
    (at, tail, tail_at)
}

impl Resource {
    /// Encodes `message` as an `Any` of `kind`'s type URL and versions it by content.
    pub fn encode<M: Message>(kind: TypeKind, name: impl Into<Name>, message: &M) -> Self {
        let value = message.encode_to_vec();
        let name: Name = name.into();
        let version = Version::of(&value);
        let (name_at, tail_len, tail_at) = repeats_of_name(&value, name.as_bytes());
        let value_len = u32::try_from(value.len()).expect("values under 4 GiB");
        let packed: Box<[u8]> = if name_at == 0 {
            value.into_boxed_slice()
        } else {
            let mut packed = Vec::with_capacity(value.len() - name.len() - tail_len);
            packed.extend_from_slice(&value[..tail_at]);
            packed.extend_from_slice(&value[tail_at + tail_len..name_at]);
            packed.extend_from_slice(&value[name_at + name.len()..]);
            packed.into_boxed_slice()
        };
        Resource {
            name,
            version,
            packed,
            uuid: [0; 16],
            bits: NO_UID,
            kind,
            alias_count: 0,
            service_count: 0,
            name_at: (name_at - tail_len) as u16,
            tail_len: tail_len as u8,
            tail_at: tail_at as u8,
            value_len,
        }
    }

    /// The packed bytes of the value (without a text pod uid after them).
    fn packed_value(&self) -> &[u8] {
        match (self.uid_form(), self.packed.last()) {
            (TEXT_UID, Some(len)) => &self.packed[..self.packed.len() - 1 - usize::from(*len)],
            _ => &self.packed,
        }
    }

    /// The pieces of the encoded value, in order: packed bytes, the name's tail, packed bytes,
    /// the name, packed bytes (empty pieces where the value does not repeat the name).
    fn value_pieces(&self) -> [&[u8]; 5] {
        let p = self.packed_value();
        if self.name_at == 0 {
            return [p, &[], &[], &[], &[]];
        }
        let (at, tail_at) = (usize::from(self.name_at), usize::from(self.tail_at));
        let name = self.name.as_bytes();
        let tail = &name[name.len() - usize::from(self.tail_len)..];
        [&p[..tail_at], tail, &p[tail_at..at], name, &p[at..]]
    }

    /// The encoded message, the `Any`'s value (borrowed unless it repeats the name).
    pub fn value(&self) -> Cow<'_, [u8]> {
        if self.name_at == 0 {
            Cow::Borrowed(self.packed_value())
        } else {
            let mut value = Vec::with_capacity(self.value_len());
            self.write_value(&mut value);
            Cow::Owned(value)
        }
    }

    /// The encoded value's length.
    pub fn value_len(&self) -> usize {
        self.value_len as usize
    }

    /// Writes the encoded value, as sent.
    pub fn write_value(&self, buf: &mut impl BufMut) {
        if self.name_at == 0 {
            return buf.put_slice(self.packed_value());
        }
        for piece in self.value_pieces() {
            buf.put_slice(piece);
        }
    }

    /// Whether `other`, a resource of the same name, has the same value (the bytes left out
    /// depend only on the value and the name). The pod uid, never sent, is not compared.
    pub fn same_value(&self, other: &Resource) -> bool {
        debug_assert_eq!(self.name, other.name);
        self.packed_value() == other.packed_value()
            && self.name_at == other.name_at
            && self.tail_len == other.tail_len
            && self.tail_at == other.tail_at
    }

    fn uid_form(&self) -> u8 {
        self.bits & UID_BITS
    }

    fn set_uid_form(&mut self, form: u8) {
        self.bits = self.bits & !UID_BITS | form;
    }

    /// [`Resource::alias_count`] for this many aliases or more.
    pub(crate) const MANY: u8 = u8::MAX;

    /// Whether this Address holds a Service (else a Workload).
    pub fn is_service(&self) -> bool {
        self.bits & IS_SERVICE != 0
    }

    /// How many services and whether a node the index lists it under (see
    /// [`Resource::set_member_counts`]).
    pub(crate) fn member_counts(&self) -> (u16, bool) {
        (self.service_count, self.bits & HAS_NODE != 0)
    }

    /// Records how many services and whether a node the index lists it under: a change that
    /// keeps them all need not read the old value's.
    pub(crate) fn set_member_counts(&mut self, services: usize, node: bool) {
        self.service_count = u16::try_from(services).unwrap_or(u16::MAX);
        self.bits = self.bits & !HAS_NODE | if node { HAS_NODE } else { 0 };
    }

    /// For a pod's workload: the pod's Kubernetes `metadata.uid` (the CA checks a token's pod
    /// binding against it). Not sent; a pod re-created under its name changes only this.
    pub fn pod_uid(&self) -> Option<Uid<'_>> {
        match self.uid_form() {
            UUID => Some(Uid::Uuid(self.uuid)),
            TEXT_UID => {
                let end = self.packed.len() - 1;
                let start = end - usize::from(self.packed[end]);
                std::str::from_utf8(&self.packed[start..end])
                    .ok()
                    .map(Uid::Text)
            }
            _ => None,
        }
    }

    /// Sets the pod uid. A text uid (not a UUID) is kept after the value, up to 255 bytes; a
    /// longer one is not kept, and a token bound to that pod is then refused (Kubernetes uids
    /// are UUIDs).
    pub fn set_pod_uid(&mut self, uid: Uid<'_>) {
        if self.uid_form() == TEXT_UID {
            self.packed = self.packed_value().into();
        }
        self.uuid = [0; 16];
        self.set_uid_form(NO_UID);
        match uid {
            Uid::Uuid(bytes) => {
                self.uuid = bytes;
                self.set_uid_form(UUID);
            }
            Uid::Text(text) => {
                let Ok(len) = u8::try_from(text.len()) else {
                    return;
                };
                if len == 0 {
                    return;
                }
                let mut packed = Vec::with_capacity(self.packed.len() + text.len() + 1);
                packed.extend_from_slice(&self.packed);
                packed.extend_from_slice(text.as_bytes());
                packed.push(len);
                self.packed = packed.into_boxed_slice();
                self.set_uid_form(TEXT_UID);
            }
        }
    }

    /// This resource marked as holding a Service.
    pub fn service(mut self) -> Self {
        self.bits |= IS_SERVICE;
        self
    }

    /// Lookup keys of the waypoint this workload or service uses (read from the value).
    pub fn waypoint(&self) -> Option<Name> {
        if self.kind != TypeKind::Address {
            return None;
        }
        waypoint_of(&self.value())
    }

    /// The `Any`'s type URL.
    pub fn type_url(&self) -> &'static str {
        self.kind.type_url()
    }

    /// The payload as sent (a copy; the push path writes with [`Resource::write_value`]).
    pub fn any(&self) -> Any {
        Any {
            type_url: self.type_url().to_string(),
            value: Bytes::from(self.value().into_owned()),
        }
    }
}

/// The sorted, unique `network/ip` aliases of an encoded Address (with `networks` taking in
/// any network it has not seen).
pub(crate) fn aliases_in(value: &[u8], networks: &mut Networks) -> Vec<Alias> {
    let mut aliases: Vec<Alias> = addresses_of(value)
        .into_iter()
        .map(|(network, ip)| networks.alias(&network, ip))
        .collect();
    aliases.sort_unstable();
    aliases.dedup();
    aliases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::istio::workload::{Address, Workload, address};

    fn workload(uid: &str, name: &str) -> Address {
        Address {
            r#type: Some(address::Type::Workload(Workload {
                uid: uid.into(),
                name: name.into(),
                namespace: "ns".into(),
                service_account: "web".into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_workload_value_keeps_its_name_once_and_reads_back_whole() {
        let uid = "Kubernetes//Pod/ns/web-7d4b9-x2x";
        let message = workload(uid, "web-7d4b9-x2x");
        let encoded = message.encode_to_vec();
        let resource = Resource::encode(TypeKind::Address, uid, &message);
        assert_eq!(
            resource.packed.len(),
            encoded.len() - uid.len() - "web-7d4b9-x2x".len()
        );
        assert_eq!(resource.value(), encoded);
        assert_eq!(resource.value_len(), encoded.len());
        assert_eq!(resource.version, Version::of(&encoded));
        let mut written = Vec::new();
        resource.write_value(&mut written);
        assert_eq!(written, encoded);
        assert_eq!(Address::decode(&resource.value()[..]).unwrap(), message);
        assert_eq!(resource.any().value, encoded);

        // A name that is not the uid's tail: only the uid is left out.
        let entry = workload(uid, "other");
        let resource = Resource::encode(TypeKind::Address, uid, &entry);
        assert_eq!(resource.packed.len(), entry.encoded_len() - uid.len());
        assert_eq!(resource.value(), entry.encode_to_vec());
        // A value that ends with the name, and one without it (a service's, a policy's).
        let last = Workload {
            uid: "w".into(),
            ..Default::default()
        };
        let resource = Resource::encode(TypeKind::Address, "w", &last);
        assert_eq!(resource.value(), last.encode_to_vec());
        assert_eq!(resource.packed.len(), 3);
        let other = Resource::encode(TypeKind::Address, "ns/svc", &message);
        assert!(matches!(other.value(), Cow::Borrowed(_)));
        assert_eq!(other.value(), encoded);

        // Equal values compare equal without being rebuilt; different ones do not.
        let again = Resource::encode(TypeKind::Address, uid, &workload(uid, "web-7d4b9-x2x"));
        let changed = Resource::encode(TypeKind::Address, uid, &entry);
        assert!(again.same_value(&Resource::encode(TypeKind::Address, uid, &message)));
        assert!(!again.same_value(&changed));
    }

    #[test]
    fn a_version_is_sent_as_hex_without_leading_zeros() {
        for n in [
            0,
            1,
            15,
            16,
            0xabc,
            1 << 63,
            u64::MAX,
            0x0fff_ffff_ffff_ffff,
        ] {
            let version = Version(n);
            assert_eq!(version.to_string(), format!("{n:x}"));
            assert_eq!(version.hex_len(), format!("{n:x}").len(), "{n:x}");
            assert!(version.is(&format!("{n:x}")));
        }
    }

    #[test]
    fn any_value_reads_back_exactly_whatever_repeats_the_name() {
        let uid = "Kubernetes//Pod/ns/web";
        let long = format!("Kubernetes//Pod/ns/{}", "w".repeat(200));
        let cases: Vec<(String, Workload)> = vec![
            // The name also earlier in the value (as the namespace), and as the `name`.
            (
                uid.into(),
                Workload {
                    uid: uid.into(),
                    name: "web".into(),
                    namespace: uid.into(),
                    ..Default::default()
                },
            ),
            // The `name` field is the whole name.
            (
                uid.into(),
                Workload {
                    uid: uid.into(),
                    name: uid.into(),
                    ..Default::default()
                },
            ),
            // No `name`: the first field (the namespace) is a tail of the name.
            (
                "Kubernetes//Pod/ns/ns".into(),
                Workload {
                    uid: "Kubernetes//Pod/ns/ns".into(),
                    namespace: "ns".into(),
                    ..Default::default()
                },
            ),
            // Lengths over 127 bytes (two-byte varints), and a `name` too long to leave out.
            (
                long.clone(),
                Workload {
                    uid: long.clone(),
                    name: "w".repeat(200),
                    ..Default::default()
                },
            ),
            // The name nowhere in the value.
            (
                "ns/svc".into(),
                Workload {
                    uid: "other".into(),
                    name: "svc".into(),
                    ..Default::default()
                },
            ),
        ];
        for (name, w) in cases {
            let message = Address {
                r#type: Some(address::Type::Workload(w)),
            };
            let encoded = message.encode_to_vec();
            let resource = Resource::encode(TypeKind::Address, name.as_str(), &message);
            assert_eq!(resource.value(), encoded, "{name}");
            assert_eq!(resource.value_len(), encoded.len());
            let mut written = Vec::new();
            resource.write_value(&mut written);
            assert_eq!(written, encoded);
            assert!(resource.packed.len() <= encoded.len());
        }
    }

    #[test]
    fn a_pod_uid_is_kept_beside_the_value_and_the_resource_stays_small() {
        let uid = "Kubernetes//Pod/ns/web-7d4b9-x2x";
        let message = workload(uid, "web-7d4b9-x2x");
        let encoded = message.encode_to_vec();
        let bare = Resource::encode(TypeKind::Address, uid, &message);
        let mut resource = bare.clone();
        assert_eq!(resource.pod_uid(), None);
        let uuid = Uid::parse("0f6e5d4c-3b2a-1908-7766-554433221100");
        for set in [
            uuid,
            Uid::Text("uid-1"),
            Uid::Text("a-longer-text-uid"),
            uuid,
            Uid::Text(""),
        ] {
            resource.set_pod_uid(set);
            let expected = (set != Uid::Text("")).then_some(set);
            assert_eq!(resource.pod_uid(), expected);
            // Never part of the value.
            assert_eq!(resource.value(), encoded);
            assert!(resource.same_value(&bare) && bare.same_value(&resource));
        }
        // A text uid past 255 bytes is not kept (and a token bound to it is refused).
        resource.set_pod_uid(Uid::Text(&"u".repeat(256)));
        assert_eq!(resource.pod_uid(), None);
        assert_eq!(resource.value(), encoded);

        // One per workload, so it counts in memory per pod (benchmark T2): with its `Arc`, 80 B.
        assert!(std::mem::size_of::<Resource>() <= 64);
    }
}
