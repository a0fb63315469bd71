//! [`Pod`]: the reduced Kubernetes Pod.
//!
//! Sources and tests fill in a [`PodFields`] (plain owned fields) and store it as a [`Pod`]
//! with `Pod::from`: the same fields, its name kept inline ([`CompactString`]: no allocation up
//! to 24 bytes), a UUID uid as its 16 bytes, lists as boxed slices, and the strings sibling
//! pods repeat (namespace, generate name, phase, service account, node, owner, port names,
//! annotations) as [`ArcStr`]s that the store shares between pods
//! ([`Pod::share_strings`]), since 100k stored pods make every byte per pod count (benchmark
//! T2). Its fields read through methods named as those of [`PodFields`].

use std::fmt;
use std::net::IpAddr;

use arcstr::ArcStr;
use compact_str::CompactString;

use crate::discovery::model::kinds::Protocol;
use crate::discovery::model::labels::Labels;
pub(crate) use crate::discovery::model::uid::Uid;
use crate::discovery::model::uid::UidBuf;

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

/// The fields of a [`Pod`], as owned strings: what a source or a test fills in before storing it with
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

/// A reduced Pod: its fields read through methods named as those of [`PodFields`].
#[derive(Clone, Default, PartialEq)]
pub struct Pod {
    name: CompactString,
    uid: UidBuf,
    namespace: ArcStr,
    generate_name: ArcStr,
    labels: Labels,
    /// The annotations kept, in key order.
    annotations: Box<[(ArcStr, ArcStr)]>,
    owner: Option<Owner<ArcStr>>,
    phase: ArcStr,
    ips: Box<[IpAddr]>,
    service_account: ArcStr,
    node_name: ArcStr,
    ports: Box<[ContainerPort<ArcStr>]>,
    terminating: bool,
    ready: bool,
    host_network: bool,
}

/// A pod's IPs, in order.
pub(crate) type Ips<'a> = std::iter::Copied<std::slice::Iter<'a, IpAddr>>;

impl Pod {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.uid`.
    pub(crate) fn uid(&self) -> Uid<'_> {
        self.uid.as_uid()
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn generate_name(&self) -> &str {
        &self.generate_name
    }

    pub(crate) fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The labels, to share their buffer with an equal map's ([`crate::discovery::model::labels::LabelSets`]).
    pub(crate) fn labels_mut(&mut self) -> &mut Labels {
        &mut self.labels
    }

    /// The value of one of the annotations kept (sources keep only those the conversion reads).
    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The annotations kept, in key order.
    pub(crate) fn annotations(&self) -> impl Iterator<Item = (&str, &str)> {
        self.annotations
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub(crate) fn owner(&self) -> Option<Owner<&str>> {
        self.owner.as_ref().map(|o| Owner {
            kind: o.kind.as_str(),
            name: o.name.as_str(),
        })
    }

    /// `metadata.deletionTimestamp` is set.
    pub(crate) fn terminating(&self) -> bool {
        self.terminating
    }

    /// `status.phase`.
    pub fn phase(&self) -> &str {
        &self.phase
    }

    /// Condition `Ready` is `True`.
    pub(crate) fn ready(&self) -> bool {
        self.ready
    }

    /// `status.podIPs` (or `status.podIP`), in order.
    pub fn ips(&self) -> Ips<'_> {
        self.ips.iter().copied()
    }

    /// `spec.serviceAccountName`.
    pub(crate) fn service_account(&self) -> &str {
        &self.service_account
    }

    pub(crate) fn node_name(&self) -> &str {
        &self.node_name
    }

    pub(crate) fn host_network(&self) -> bool {
        self.host_network
    }

    /// Named ports of containers and native sidecar init containers, in declaration order.
    pub(crate) fn ports(&self) -> impl Iterator<Item = ContainerPort<&str>> {
        self.ports.iter().map(|p| ContainerPort {
            name: p.name.as_str(),
            port: p.port,
            protocol: p.protocol,
        })
    }

    /// Calls `share` on each string sibling pods are likely to repeat, so that the store can
    /// make equal strings one allocation ([`crate::discovery::store`]'s pods).
    pub(crate) fn share_strings(&mut self, mut share: impl FnMut(&mut ArcStr)) {
        share(&mut self.namespace);
        share(&mut self.generate_name);
        share(&mut self.phase);
        share(&mut self.service_account);
        share(&mut self.node_name);
        if let Some(owner) = &mut self.owner {
            share(&mut owner.kind);
            share(&mut owner.name);
        }
        for (key, value) in &mut self.annotations {
            share(key);
            share(value);
        }
        for port in &mut self.ports {
            share(&mut port.name);
        }
    }

    /// The fields, as owned strings.
    #[cfg(test)]
    pub(crate) fn to_fields(&self) -> PodFields {
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
            terminating: self.terminating,
            phase: self.phase().to_string(),
            ready: self.ready,
            ips: self.ips.to_vec(),
            service_account: self.service_account().to_string(),
            node_name: self.node_name().to_string(),
            host_network: self.host_network,
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
}

impl From<PodFields> for Pod {
    fn from(pod: PodFields) -> Self {
        let text = |s: String| ArcStr::from(s);
        Pod {
            uid: UidBuf::from(Uid::parse(&pod.uid)),
            name: CompactString::from(pod.name),
            namespace: text(pod.namespace),
            generate_name: text(pod.generate_name),
            labels: pod.labels,
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (ArcStr::from(k), ArcStr::from(v)))
                .collect(),
            owner: pod.owner.map(|o| Owner {
                kind: text(o.kind),
                name: text(o.name),
            }),
            phase: text(pod.phase),
            ips: pod.ips.into_boxed_slice(),
            service_account: text(pod.service_account),
            node_name: text(pod.node_name),
            ports: pod
                .ports
                .into_iter()
                .map(|p| ContainerPort {
                    name: text(p.name),
                    port: p.port,
                    protocol: p.protocol,
                })
                .collect(),
            terminating: pod.terminating,
            ready: pod.ready,
            host_network: pod.host_network,
        }
    }
}

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
    fn every_field_reads_back() {
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
    fn a_uuid_uid_reads_back_as_written() {
        let text = "6f1c1d8e-0a1b-4c2d-8e3f-00000000abcd";
        let mut fields = full();
        fields.uid = text.into();
        let pod = Pod::from(fields.clone());
        assert!(matches!(pod.uid(), Uid::Uuid(_)));
        assert_eq!(pod.uid(), Uid::parse(text));
        assert_eq!(pod.to_fields(), fields);
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
