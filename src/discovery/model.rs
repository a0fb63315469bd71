//! The reduced input objects the index reads: only the fields a conversion needs.
//!
//! Sources (manifests or Kubernetes watches) reduce every object to these types right away and
//! apply the API server's defaults, so the index never sees an unset `targetPort` or
//! `serviceAccountName`. A full Pod costs tens of kilobytes; a [`Pod`] here costs a few hundred
//! bytes.

pub(crate) mod authorization;
pub(crate) mod destination_rule;
pub(crate) mod event;
pub(crate) mod kinds;
pub(crate) mod labels;
pub(crate) mod network_gateway;
pub(crate) mod peer_authentication;
pub(crate) mod pod;
pub(crate) mod request_authentication;
pub(crate) mod route;
pub(crate) mod status;
pub(crate) mod uid;
pub(crate) mod visibility;
pub(crate) mod waypoint;

pub use authorization::{
    AuthorizationPolicy, Condition, Operation, PolicyAction, PolicyRule, PolicyTargetRef, Source,
};
pub use destination_rule::{
    ClientTls, ConnectionPool, ConsistentHash, DestinationRule, H2UpgradePolicy, HashAlgorithm,
    HashKey, HttpSettings, LoadBalancer, OutlierDetection, PortTrafficPolicy, SimpleLb, Subset,
    TcpKeepalive, TcpSettings, TlsMode, TrafficPolicy, Warmup,
};
pub use event::{Event, Kind, Object, ObjectRef};
pub use kinds::*;
pub use labels::Labels;
pub use peer_authentication::{MtlsMode, PeerAuthentication};
pub use pod::{ContainerPort, Owner, Pod, PodFields};
pub use request_authentication::{
    ClaimToHeader, Jwks, JwksSource, JwtHeader, JwtRule, RequestAuthentication,
};
pub use route::{
    BackendRef, GrpcMethodMatch, HeaderFilter, Mirror, ParentRef, PathMatch, PathModifier,
    Redirect, Retry, Rewrite, Route, RouteError, RouteFilter, RouteKind, RouteMatch, RouteRule,
    ValueMatch,
};
pub use status::{DesiredStatus, StatusCondition};
pub use visibility::{ServiceEntryVisibility, Visibility, VisibilityPolicy};
