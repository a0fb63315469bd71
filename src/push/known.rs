//! `initial_resource_versions` without a copy: what a reconnecting proxy says it holds.
//!
//! A reconnecting ztunnel lists every resource it holds, with its version: 100k entries (about
//! 6.5 MB) at 100k pods. Decoded as a map, that is 200k strings and as many ordered inserts per
//! request, and a control-plane restart brings 1,000 such requests at once (T6). Here the
//! request is decoded with the map's entries left as slices of the received buffer
//! ([`RawRequest`]); they are checked once (well-formed, UTF-8) and read as `&str` pairs when
//! the connection compares them with its snapshot.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes};
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};

use crate::pb::xds::{DeltaDiscoveryRequest, Node, Status};

/// A request as a connection receives it: the message, without its known versions, and those.
pub type Received = (DeltaDiscoveryRequest, KnownVersions);

/// `DeltaDiscoveryRequest` as the server decodes it (proto/discovery.proto; the same field
/// numbers): `initial_resource_versions` (a `map<string, string>`, on the wire a repeated message
/// of key = 1 and value = 2) stays as its encoded entries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawRequest {
    #[prost(message, optional, tag = "1")]
    pub node: Option<Node>,
    #[prost(string, tag = "2")]
    pub type_url: String,
    #[prost(string, repeated, tag = "3")]
    pub resource_names_subscribe: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub resource_names_unsubscribe: Vec<String>,
    #[prost(bytes = "bytes", repeated, tag = "5")]
    pub initial_resource_versions: Vec<Bytes>,
    #[prost(string, tag = "6")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "7")]
    pub error_detail: Option<Status>,
}

impl RawRequest {
    /// The request without its known versions, and those versions (checked).
    pub fn split(self) -> Result<(DeltaDiscoveryRequest, KnownVersions), String> {
        let known = KnownVersions::entries(self.initial_resource_versions)?;
        let request = DeltaDiscoveryRequest {
            node: self.node,
            type_url: self.type_url,
            resource_names_subscribe: self.resource_names_subscribe,
            resource_names_unsubscribe: self.resource_names_unsubscribe,
            initial_resource_versions: BTreeMap::new(),
            response_nonce: self.response_nonce,
            error_detail: self.error_detail,
        };
        Ok((request, known))
    }
}

/// What a proxy reports holding on its first request of a type: `{name: version}`.
#[derive(Clone, Debug, Default)]
pub struct KnownVersions {
    inner: Inner,
}

#[derive(Clone, Debug, Default)]
enum Inner {
    #[default]
    Empty,
    /// Encoded map entries, each checked by [`parse_entry`].
    Entries(Vec<Bytes>),
    Map(BTreeMap<String, String>),
}

impl KnownVersions {
    /// From encoded map entries; an entry that is not a well-formed pair of UTF-8 strings is
    /// an error (as decoding the map would have been).
    pub fn entries(entries: Vec<Bytes>) -> Result<Self, String> {
        for entry in &entries {
            parse_entry(entry)?;
        }
        Ok(KnownVersions {
            inner: if entries.is_empty() {
                Inner::Empty
            } else {
                Inner::Entries(entries)
            },
        })
    }

    /// From a decoded map (a request decoded elsewhere, and tests).
    pub fn from_map(map: BTreeMap<String, String>) -> Self {
        KnownVersions {
            inner: Inner::Map(map),
        }
    }

    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Empty => 0,
            Inner::Entries(e) => e.len(),
            Inner::Map(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each `(name, version)`. A name listed twice (only possible in a malformed map) comes
    /// twice; the last one wins where that matters.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let (entries, map): (&[Bytes], Option<&BTreeMap<String, String>>) = match &self.inner {
            Inner::Empty => (&[], None),
            Inner::Entries(e) => (e, None),
            Inner::Map(m) => (&[], Some(m)),
        };
        entries.iter().filter_map(|e| parse_entry(e).ok()).chain(
            map.into_iter()
                .flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        )
    }
}

/// One encoded map entry: key (field 1) and value (field 2), each optional (proto3 default
/// empty), in any order; other fields are skipped.
fn parse_entry(entry: &[u8]) -> Result<(&str, &str), String> {
    let mut buf = entry;
    let mut key: &[u8] = &[];
    let mut value: &[u8] = &[];
    let bad = |what: &str| format!("a malformed initial_resource_versions entry: {what}");
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| bad(&e.to_string()))?;
        if wire_type == WireType::LengthDelimited && (tag == 1 || tag == 2) {
            let len = decode_varint(&mut buf).map_err(|e| bad(&e.to_string()))? as usize;
            if len > buf.len() {
                return Err(bad("a field is longer than the entry"));
            }
            let (field, rest) = buf.split_at(len);
            if tag == 1 {
                key = field;
            } else {
                value = field;
            }
            buf = rest;
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|e| bad(&e.to_string()))?;
        }
    }
    let key = std::str::from_utf8(key).map_err(|_| bad("the name is not UTF-8"))?;
    let value = std::str::from_utf8(value).map_err(|_| bad("the version is not UTF-8"))?;
    Ok((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn reads_the_same_pairs_as_the_decoded_map_and_rejects_malformed_entries() {
        let request = DeltaDiscoveryRequest {
            type_url: "t".into(),
            response_nonce: "n".into(),
            resource_names_subscribe: vec!["a".into()],
            initial_resource_versions: [
                ("Kubernetes//Pod/ns/a".to_string(), "0123abcd".to_string()),
                ("ns/svc.ns.svc.cluster.local".to_string(), String::new()),
                (String::new(), "v".to_string()),
                ("ü/ñ".to_string(), "x".repeat(300)),
            ]
            .into(),
            ..Default::default()
        };
        let wire = Bytes::from(request.encode_to_vec());
        let (split, known) = RawRequest::decode(wire).unwrap().split().unwrap();
        let mut pairs: Vec<(String, String)> = known
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pairs.sort();
        let expected: Vec<(String, String)> = request
            .initial_resource_versions
            .clone()
            .into_iter()
            .collect();
        assert_eq!(pairs, expected);
        assert_eq!(known.len(), 4);
        // Everything else is as prost decodes it.
        let mut without = request.clone();
        without.initial_resource_versions.clear();
        assert_eq!(split, without);

        // Not UTF-8, a length past the end, a truncated varint.
        for entry in [
            vec![0x0a, 0x02, 0xff, 0xfe],
            vec![0x0a, 0x09, b'a'],
            vec![0x12, 0x80],
        ] {
            let raw = RawRequest {
                initial_resource_versions: vec![Bytes::from(entry.clone())],
                ..Default::default()
            };
            let error = raw.split().unwrap_err();
            assert!(
                error.contains("initial_resource_versions"),
                "{entry:?}: {error}"
            );
        }
    }
}
