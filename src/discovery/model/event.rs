//! What a source tells the index: [`Event`]s about [`Object`]s of each [`Kind`].

use std::fmt;

use crate::discovery::model::authorization::AuthorizationPolicy;
use crate::discovery::model::destination_rule::DestinationRule;
use crate::discovery::model::kinds::{
    EndpointSlice, Gateway, GatewayClass, Namespace, Node, Service, ServiceEntry, WorkloadEntry,
};
use crate::discovery::model::peer_authentication::PeerAuthentication;
use crate::discovery::model::pod::Pod;
use crate::discovery::model::request_authentication::{Jwks, RequestAuthentication};
use crate::discovery::model::route::Route;
use crate::discovery::model::visibility::ServiceEntryVisibility;

/// The kinds of object the index understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Node,
    Pod,
    Service,
    EndpointSlice,
    ServiceEntry,
    WorkloadEntry,
    GatewayClass,
    Gateway,
    AuthorizationPolicy,
    PeerAuthentication,
    DestinationRule,
    RequestAuthentication,
    /// A key set ambientd fetched for a RequestAuthentication's `jwksUri` (by its key-set fetcher):
    /// not listed by any source, so not in [`Kind::ALL`].
    Jwks,
    HttpRoute,
    GrpcRoute,
    /// `networking.istio.io` VirtualService, kept as a [`Route`] (`RouteKind::Virtual`).
    VirtualService,
}

impl Kind {
    /// Every kind, in the order a full load applies them (containers before contents).
    pub const ALL: [Kind; 16] = [
        Kind::Namespace,
        Kind::Node,
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::Service,
        Kind::ServiceEntry,
        Kind::EndpointSlice,
        Kind::WorkloadEntry,
        Kind::Pod,
        Kind::AuthorizationPolicy,
        Kind::PeerAuthentication,
        Kind::DestinationRule,
        Kind::RequestAuthentication,
        Kind::HttpRoute,
        Kind::GrpcRoute,
        Kind::VirtualService,
    ];

    /// Whether objects of this kind live in a namespace.
    pub(crate) fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::Namespace | Kind::Node | Kind::GatewayClass | Kind::Jwks
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Identifies one object: its kind, namespace (empty when cluster-scoped) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub(crate) fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// A reduced object of any kind the index reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Namespace(Namespace),
    Node(Node),
    Pod(Pod),
    Service(Service),
    EndpointSlice(EndpointSlice),
    ServiceEntry(ServiceEntry),
    WorkloadEntry(WorkloadEntry),
    GatewayClass(GatewayClass),
    Gateway(Gateway),
    AuthorizationPolicy(AuthorizationPolicy),
    PeerAuthentication(PeerAuthentication),
    DestinationRule(DestinationRule),
    RequestAuthentication(RequestAuthentication),
    Jwks(Jwks),
    /// An HTTPRoute (`kind` [`crate::discovery::model::RouteKind::Http`]).
    HttpRoute(Route),
    /// A GRPCRoute (`kind` [`crate::discovery::model::RouteKind::Grpc`]).
    GrpcRoute(Route),
    /// A VirtualService's `http` routes (`kind` [`crate::discovery::model::RouteKind::Virtual`]).
    VirtualService(Route),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Namespace(_) => Kind::Namespace,
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::ServiceEntry(_) => Kind::ServiceEntry,
            Object::WorkloadEntry(_) => Kind::WorkloadEntry,
            Object::GatewayClass(_) => Kind::GatewayClass,
            Object::Gateway(_) => Kind::Gateway,
            Object::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Object::PeerAuthentication(_) => Kind::PeerAuthentication,
            Object::DestinationRule(_) => Kind::DestinationRule,
            Object::RequestAuthentication(_) => Kind::RequestAuthentication,
            Object::Jwks(_) => Kind::Jwks,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::VirtualService(_) => Kind::VirtualService,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        let (namespace, name): (&str, &str) = match self {
            Object::Namespace(n) => ("", &n.name),
            Object::Node(n) => ("", &n.name),
            Object::GatewayClass(c) => ("", &c.name),
            Object::Jwks(j) => ("", &j.name),
            Object::Pod(o) => (o.namespace(), o.name()),
            Object::Service(o) => (o.namespace.as_str(), &o.name),
            Object::EndpointSlice(o) => (o.namespace.as_str(), &o.name),
            Object::ServiceEntry(o) => (o.namespace.as_str(), &o.name),
            Object::WorkloadEntry(o) => (o.namespace.as_str(), &o.name),
            Object::Gateway(o) => (o.namespace.as_str(), &o.name),
            Object::AuthorizationPolicy(o) => (o.namespace.as_str(), &o.name),
            Object::PeerAuthentication(o) => (o.namespace.as_str(), &o.name),
            Object::DestinationRule(o) => (o.namespace.as_str(), &o.name),
            Object::RequestAuthentication(o) => (o.namespace.as_str(), &o.name),
            Object::HttpRoute(o) | Object::GrpcRoute(o) | Object::VirtualService(o) => {
                (o.namespace.as_str(), &o.name)
            }
        };
        ObjectRef::new(self.kind(), namespace, name)
    }
}

/// What a source tells the index. Both sources (manifests and Kubernetes) speak only this.
// Events are moved once from source to index, never stored in bulk: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Create or replace one object.
    Apply(Object),
    /// Remove one object.
    Delete(ObjectRef),
    /// The complete current set of one kind (a full list or relist): anything else is gone.
    Reset(Kind, Vec<Object>),
    /// The source has delivered its first full list of every kind.
    Synced,
    /// meshConfig.serviceEntryVisibility changed (the mesh config file was re-read); `None`:
    /// no longer configured.
    Visibility(Option<std::sync::Arc<ServiceEntryVisibility>>),
}
