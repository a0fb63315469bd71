//! [`Resource`]: one encoded xDS resource, its [`Version`] and its [`Name`], with the
//! [`Links`] the index looks it up by.
//!
//! Each resource is encoded once; its version is a hash of those bytes, so replicas agree on
//! versions for the same content and an unchanged resource is never re-sent.

use bytes::BufMut;
use prost::Message;

use crate::discovery::model::uid::{Uid, UidBuf};
use crate::discovery::names::{ResourceType, TypeKind};
use crate::discovery::snapshot::links::Links;
use crate::discovery::snapshot::name::Name;
use crate::pb::istio::workload::Address;

/// A resource's version: the xxhash64 of its encoded value. Kept as the number (8 bytes, no
/// allocation) and sent as istiod sends it: lowercase hex, without leading zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Version(pub(crate) u64);

impl Version {
    /// The version of an encoded value.
    pub(crate) fn of(value: &[u8]) -> Self {
        Version(xxhash_rust::xxh64::xxh64(value, 0))
    }

    /// The hex digits as sent, without allocating.
    pub(crate) fn digits(self, buf: &mut [u8; 16]) -> &[u8] {
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
    pub(crate) fn hex_len(self) -> usize {
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
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// The xDS name: a workload uid, `ns/hostname` for a service, `ns/name` for a policy.
    pub name: Name,
    /// xxhash64 of the encoded `Any` value, sent as hex.
    pub version: Version,
    /// The resource type, which names the `Any`'s type URL.
    pub(crate) kind: ResourceType,
    /// The encoded message: the `Any`'s value.
    value: Box<[u8]>,
    /// What the index looks an Address up by (empty for other types).
    links: Links,
    /// For a pod's workload: the pod's Kubernetes `metadata.uid`. Not sent.
    pod_uid: Option<UidBuf>,
}

impl Resource {
    /// Encodes `message` as an `Any` of `kind`'s type URL and versions it by content.
    pub(crate) fn encode<M: Message>(
        kind: impl Into<ResourceType>,
        name: impl Into<Name>,
        message: &M,
    ) -> Self {
        Resource::from_value(kind, name, message.encode_to_vec().into_boxed_slice())
    }

    /// A resource of an already encoded value, versioned by content.
    pub(crate) fn from_value(
        kind: impl Into<ResourceType>,
        name: impl Into<Name>,
        value: Box<[u8]>,
    ) -> Self {
        Resource {
            name: name.into(),
            version: Version::of(&value),
            kind: kind.into(),
            value,
            links: Links::default(),
            pod_uid: None,
        }
    }

    /// An Address resource, with the [`Links`] its message gives.
    pub(crate) fn address(name: impl Into<Name>, message: &Address) -> Self {
        Resource {
            links: Links::of(message),
            ..Resource::encode(TypeKind::Address, name, message)
        }
    }

    /// The encoded message, the `Any`'s value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The encoded value's length.
    pub fn value_len(&self) -> usize {
        self.value.len()
    }

    /// Writes the encoded value, as sent.
    pub(crate) fn write_value(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.value);
    }

    /// Whether `other` has the same value. The pod uid, never sent, is not compared.
    pub(crate) fn same_value(&self, other: &Resource) -> bool {
        self.value == other.value
    }

    /// What the index looks this Address up by.
    pub(crate) fn links(&self) -> &Links {
        &self.links
    }

    /// The links, to share their names with the index's.
    pub(crate) fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    /// Whether this Address holds a Service (else a Workload).
    pub(crate) fn is_service(&self) -> bool {
        self.links.is_service
    }

    /// Lookup key of the waypoint this workload or service uses.
    pub(crate) fn waypoint(&self) -> Option<Name> {
        self.links.waypoint.clone()
    }

    /// For a pod's workload: the pod's Kubernetes `metadata.uid` (the CA checks a token's pod
    /// binding against it). Not sent; a pod re-created under its name changes only this.
    pub(crate) fn pod_uid(&self) -> Option<Uid<'_>> {
        self.pod_uid.as_ref().map(UidBuf::as_uid)
    }

    /// Sets the pod uid (an empty one is none).
    pub(crate) fn set_pod_uid(&mut self, uid: Uid<'_>) {
        self.pod_uid = (!uid.is_empty()).then(|| UidBuf::from(uid));
    }

    /// The resource's type.
    pub fn kind(&self) -> ResourceType {
        self.kind
    }

    /// For a workload's Address: the same workload as an `istio.workload.Workload` resource
    /// (what waypoints subscribe to), cut from the Address's bytes without decoding: an
    /// Address holding a workload is field 1 around the Workload's encoding. Its version is
    /// the Address's (a function of the same content).
    pub(crate) fn workload(&self) -> Option<Resource> {
        if self.kind != ResourceType::Address || self.is_service() {
            return None;
        }
        let mut rest: &[u8] = &self.value;
        let key = prost::encoding::decode_varint(&mut rest).ok()?;
        if key != (1 << 3) | 2 {
            return None;
        }
        let len = prost::encoding::decode_varint(&mut rest).ok()? as usize;
        let inner = rest.get(..len)?;
        Some(Resource {
            name: self.name.clone(),
            version: self.version,
            kind: ResourceType::Workload,
            value: inner.into(),
            links: Links::default(),
            pod_uid: None,
        })
    }

    /// The `Any`'s type URL.
    pub fn type_url(&self) -> &'static str {
        self.kind.type_url()
    }

    /// The payload as sent (a copy; the push path writes with [`Resource::write_value`]).
    #[cfg(test)]
    pub(crate) fn any(&self) -> crate::pb::google::protobuf::Any {
        crate::pb::google::protobuf::Any {
            type_url: self.type_url().to_string(),
            value: bytes::Bytes::copy_from_slice(&self.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::istio::workload::{Workload, address};

    fn workload(uid: &str, name: &str) -> Address {
        Address {
            r#type: Some(address::Type::Workload(Workload {
                uid: uid.into(),
                name: name.into(),
                namespace: "ns".into(),
                service_account: "web".into(),
                node: "node-1".into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_resource_keeps_its_value_and_links() {
        let uid = "Kubernetes//Pod/ns/web-7d4b9-x2x";
        let message = workload(uid, "web-7d4b9-x2x");
        let encoded = message.encode_to_vec();
        let resource = Resource::address(uid, &message);
        assert_eq!(resource.value(), encoded);
        assert_eq!(resource.value_len(), encoded.len());
        assert_eq!(resource.version, Version::of(&encoded));
        let mut written = Vec::new();
        resource.write_value(&mut written);
        assert_eq!(written, encoded);
        assert_eq!(Address::decode(resource.value()).unwrap(), message);
        assert_eq!(resource.any().value, encoded);
        assert_eq!(resource.links(), &Links::of(&message));
        assert_eq!(resource.links().node.as_deref(), Some("node-1"));
        assert!(!resource.is_service());

        // Equal values compare equal; different ones do not.
        let again = Resource::address(uid, &workload(uid, "web-7d4b9-x2x"));
        let changed = Resource::address(uid, &workload(uid, "other"));
        assert!(again.same_value(&resource));
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
    fn a_pod_uid_is_kept_beside_the_value() {
        let uid = "Kubernetes//Pod/ns/web-7d4b9-x2x";
        let message = workload(uid, "web-7d4b9-x2x");
        let encoded = message.encode_to_vec();
        let bare = Resource::address(uid, &message);
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
    }
}
