//! A `DeltaDiscoveryResponse` encoded straight from the snapshot's shared resources.
//!
//! Each resource's payload is encoded once, when the index builds it ([`Resource::value`]),
//! and written with [`Resource::write_value`]. A response is written from those bytes into one
//! buffer of exactly its size, already framed
//! as a gRPC message: no `DeltaDiscoveryResponse` is built, so a delivery costs no string
//! clones or allocations per resource, only copies into that buffer. The bytes are what prost
//! would encode for the same message (tested below), so every decoder reads them as usual.
//!
//! What is left out, against istiod: `system_version_info` and each resource's `aliases`.
//! ztunnel reads neither (istio/ztunnel `src/xds/client.rs`: it ignores `system_version_info`,
//! and builds its IP index from the message contents, never from aliases), and together they
//! would add about 20 B to every ~420 B single-workload response to every proxy (BENCHMARKS.md,
//! T5). Aliases still serve on-demand `network/ip` lookups inside ambientd (read from the
//! values: [`crate::discovery::snapshot::address_index`]). The nonce is the connection's response counter in hex:
//! ztunnel only echoes it.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::discovery::Resource;

// Field numbers (proto/discovery.proto).
const RESPONSE_RESOURCES: u32 = 2;
const RESPONSE_TYPE_URL: u32 = 4;
const RESPONSE_NONCE: u32 = 5;
const RESPONSE_REMOVED: u32 = 6;
const RESOURCE_VERSION: u32 = 1;
const RESOURCE_ANY: u32 = 2;
const RESOURCE_NAME: u32 = 3;
const ANY_TYPE_URL: u32 = 1;
const ANY_VALUE: u32 = 2;

/// One response: a type's resources to add or update, and names to remove.
#[derive(Debug)]
pub struct Outgoing<'a> {
    pub type_url: &'a str,
    pub nonce: &'a str,
    pub resources: &'a [Arc<Resource>],
    pub removed: &'a [String],
}

/// Length of a length-delimited field holding `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A string or bytes field; empty ones are not written (proto3 defaults).
fn put_field(buf: &mut BytesMut, tag: u32, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

fn opt_len(tag: u32, len: usize) -> usize {
    if len == 0 { 0 } else { field_len(tag, len) }
}

/// The encoded `Any` of a resource.
fn any_len(r: &Resource) -> usize {
    opt_len(ANY_TYPE_URL, r.type_url().len()) + opt_len(ANY_VALUE, r.value_len())
}

/// The encoded `Resource` message (version, the `Any`, name).
fn resource_len(r: &Resource) -> usize {
    opt_len(RESOURCE_VERSION, r.version.hex_len())
        + field_len(RESOURCE_ANY, any_len(r))
        + opt_len(RESOURCE_NAME, r.name.len())
}

impl Outgoing<'_> {
    /// The encoded message's length (without the gRPC frame header).
    pub fn encoded_len(&self) -> usize {
        self.resources
            .iter()
            .map(|r| field_len(RESPONSE_RESOURCES, resource_len(r)))
            .sum::<usize>()
            + opt_len(RESPONSE_TYPE_URL, self.type_url.len())
            + opt_len(RESPONSE_NONCE, self.nonce.len())
            + self
                .removed
                .iter()
                .map(|n| field_len(RESPONSE_REMOVED, n.len()))
                .sum::<usize>()
    }

    /// The message as one gRPC frame (uncompressed flag, length, bytes) in a buffer of exactly
    /// its size. Fields in field-number order, as prost writes them.
    pub fn frame(&self) -> Bytes {
        let mut pieces = self.pieces_of(usize::MAX);
        debug_assert_eq!(pieces.len(), 1);
        pieces.pop().unwrap_or_default()
    }

    /// The same frame in pieces of about [`PIECE`] bytes, each in a buffer of its own (cut
    /// between resources): what the outbound queue sends. HTTP/2 holds only the piece it is
    /// writing and the next one, so when a proxy stops reading, the rest stays in the queue,
    /// which drops it if the proxy is dropped ([`crate::push::outbound::Outbound::abandon`]).
    pub fn pieces(&self) -> Vec<Bytes> {
        self.pieces_of(PIECE)
    }

    fn pieces_of(&self, piece: usize) -> Vec<Bytes> {
        let len = self.encoded_len();
        let total = 5 + len;
        let mut out = Pieces {
            piece,
            total,
            done: Vec::new(),
            written: 0,
            buf: BytesMut::with_capacity(total.min(piece)),
        };
        out.buf.put_u8(0);
        out.buf
            .put_u32(u32::try_from(len).expect("responses are split below 4 GiB"));
        for r in self.resources {
            let resource_len = resource_len(r);
            out.room_for(field_len(RESPONSE_RESOURCES, resource_len));
            let buf = &mut out.buf;
            encode_key(RESPONSE_RESOURCES, WireType::LengthDelimited, buf);
            encode_varint(resource_len as u64, buf);
            put_field(buf, RESOURCE_VERSION, r.version.digits(&mut [0; 16]));
            encode_key(RESOURCE_ANY, WireType::LengthDelimited, buf);
            encode_varint(any_len(r) as u64, buf);
            put_field(buf, ANY_TYPE_URL, r.type_url().as_bytes());
            let value_len = r.value_len();
            if value_len > 0 {
                encode_key(ANY_VALUE, WireType::LengthDelimited, buf);
                encode_varint(value_len as u64, buf);
                r.write_value(buf);
            }
            put_field(buf, RESOURCE_NAME, r.name.as_bytes());
        }
        out.room_for(
            opt_len(RESPONSE_TYPE_URL, self.type_url.len())
                + opt_len(RESPONSE_NONCE, self.nonce.len()),
        );
        put_field(&mut out.buf, RESPONSE_TYPE_URL, self.type_url.as_bytes());
        put_field(&mut out.buf, RESPONSE_NONCE, self.nonce.as_bytes());
        for name in self.removed {
            // A removed name is never empty, but keep the repeated field's count exact anyway.
            out.room_for(field_len(RESPONSE_REMOVED, name.len()));
            let buf = &mut out.buf;
            encode_key(RESPONSE_REMOVED, WireType::LengthDelimited, buf);
            encode_varint(name.len() as u64, buf);
            buf.put_slice(name.as_bytes());
        }
        out.finish()
    }
}

/// The size the outbound pieces of a response are cut at (between resources).
pub const PIECE: usize = 64 * 1024;

/// A frame being written in pieces.
struct Pieces {
    piece: usize,
    total: usize,
    done: Vec<Bytes>,
    /// Bytes in `done`.
    written: usize,
    buf: BytesMut,
}

impl Pieces {
    /// Starts a new piece if `next` more bytes would take this one past the piece size.
    fn room_for(&mut self, next: usize) {
        if !self.buf.is_empty() && self.buf.len() + next > self.piece {
            self.written += self.buf.len();
            let rest = self.total - self.written;
            let full = std::mem::replace(
                &mut self.buf,
                BytesMut::with_capacity(rest.min(self.piece.max(next))),
            );
            self.done.push(full.freeze());
        }
    }

    fn finish(mut self) -> Vec<Bytes> {
        debug_assert_eq!(self.written + self.buf.len(), self.total);
        if !self.buf.is_empty() {
            self.done.push(self.buf.freeze());
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::xds::DeltaDiscoveryResponse;
    use prost::Message;

    fn resource(name: &str, payload: usize) -> Arc<Resource> {
        let message = crate::pb::google::protobuf::Any {
            type_url: String::new(),
            value: vec![7u8; payload].into(),
        };
        Arc::new(Resource::encode(
            crate::discovery::names::TypeKind::Address,
            name,
            &message,
        ))
    }

    /// What prost encodes for the same response (without the fields ambientd leaves out).
    fn prost_bytes(o: &Outgoing) -> Vec<u8> {
        DeltaDiscoveryResponse {
            system_version_info: String::new(),
            type_url: o.type_url.to_string(),
            nonce: o.nonce.to_string(),
            removed_resources: o.removed.to_vec(),
            resources: o
                .resources
                .iter()
                .map(|r| crate::pb::xds::Resource {
                    name: r.name.to_string(),
                    version: r.version.to_string(),
                    aliases: Vec::new(),
                    resource: Some(r.any()),
                    ttl: None,
                    cache_control: None,
                })
                .collect(),
        }
        .encode_to_vec()
    }

    const WORKLOAD_UID: &str = "Kubernetes//Pod/ns/web-7d4b9-x2x";

    fn workload() -> crate::pb::istio::workload::Address {
        use crate::pb::istio::workload::{Workload, address};
        crate::pb::istio::workload::Address {
            r#type: Some(address::Type::Workload(Workload {
                uid: WORKLOAD_UID.into(),
                name: "web-7d4b9-x2x".into(),
                namespace: "ns".into(),
                addresses: vec![vec![10, 0, 0, 7].into()],
                ..Default::default()
            })),
        }
    }

    #[test]
    fn frames_exactly_what_prost_encodes() {
        let resources = [
            resource("Kubernetes//Pod/ns/a", 3),
            resource("ns/svc.ns.svc.cluster.local", 200),
            // Long enough that lengths take two varint bytes.
            resource(&"x".repeat(300), 20_000),
            // A workload, whose stored value leaves out its uid and name.
            Arc::new(Resource::encode(
                crate::discovery::names::TypeKind::Address,
                WORKLOAD_UID,
                &workload(),
            )),
        ];
        let removed = ["gone".to_string(), "/10.0.0.9".to_string()];
        let cases = [
            Outgoing {
                type_url: "type.googleapis.com/istio.workload.Address",
                nonce: "1f",
                resources: &resources,
                removed: &removed,
            },
            // An initial response with nothing in it.
            Outgoing {
                type_url: "type.googleapis.com/istio.security.Authorization",
                nonce: "1",
                resources: &[],
                removed: &[],
            },
            Outgoing {
                type_url: "t",
                nonce: "2",
                resources: &resources[..1],
                removed: &[],
            },
        ];
        for case in &cases {
            let framed = case.frame();
            let expected = prost_bytes(case);
            assert_eq!(framed[0], 0, "uncompressed");
            let len = u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, expected.len());
            assert_eq!(case.encoded_len(), expected.len());
            assert_eq!(&framed[5..], &expected[..], "{case:?}");
            // And it decodes back to the same resources.
            let decoded = DeltaDiscoveryResponse::decode(&framed[5..]).unwrap();
            assert_eq!(decoded.nonce, case.nonce);
            assert_eq!(decoded.resources.len(), case.resources.len());
            for (d, r) in decoded.resources.iter().zip(case.resources) {
                assert_eq!(d.name.as_str(), &*r.name);
                assert!(r.version.is(&d.version), "{}", d.version);
                assert!(d.aliases.is_empty());
                assert_eq!(d.resource.as_ref().unwrap().value[..], r.value()[..]);
                if *r.name == *WORKLOAD_UID {
                    let value = &d.resource.as_ref().unwrap().value;
                    assert_eq!(value[..], workload().encode_to_vec()[..]);
                }
            }
        }
    }

    /// In pieces, the frame is the same bytes, cut between resources into buffers of their own
    /// of about `PIECE` bytes (one resource larger than that is a piece of its own).
    #[test]
    fn pieces_are_the_frame_cut_between_resources() {
        let mut resources: Vec<Arc<Resource>> = (0..400)
            .map(|i| resource(&format!("Kubernetes//Pod/ns/pod-{i}"), 400 + i % 7))
            .collect();
        resources.insert(200, resource("big", 3 * PIECE));
        let removed: Vec<String> = (0..5_000)
            .map(|i| format!("/10.1.{}.{}", i / 250, i % 250))
            .collect();
        let case = Outgoing {
            type_url: "type.googleapis.com/istio.workload.Address",
            nonce: "2a",
            resources: &resources,
            removed: &removed,
        };
        let whole = case.frame();
        let pieces = case.pieces();
        assert!(pieces.len() >= 6, "{} pieces", pieces.len());
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(joined, whole.to_vec());
        let mut big = 0;
        for piece in &pieces {
            if piece.len() > PIECE {
                big += 1;
                assert!(piece.len() < 3 * PIECE + 1024, "{}", piece.len());
            }
        }
        assert_eq!(big, 1, "only the big resource's piece is over the size");
        // A small response is one piece.
        let small = Outgoing {
            type_url: "t",
            nonce: "1",
            resources: &resources[..2],
            removed: &[],
        };
        assert_eq!(small.pieces(), vec![small.frame()]);
    }
}
