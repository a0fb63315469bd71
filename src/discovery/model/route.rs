//! Gateway API routes (`gateway.networking.k8s.io/v1` HTTPRoute and GRPCRoute), reduced to
//! what a waypoint's route translation and the route status read, with the API server's
//! defaults applied (a missing path match is `PathPrefix /`, a backend's `kind` is `Service`
//! and its `weight` 1, a parentRef's `kind` is `Gateway` in `gateway.networking.k8s.io`).
//!
//! One [`Route`] type serves both kinds: a GRPCRoute's match is a method match
//! ([`GrpcMethodMatch`]) and headers, and its filters are the HTTPRoute filters it shares.
//! The checks istiod's conversion makes on the object alone ([`Route::conversion_error`])
//! live here, so that the translation and the status say the same thing.

use std::time::Duration;

/// The group of Gateway API kinds, a parentRef's default.
pub(crate) const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// Which Gateway API route kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    #[default]
    Http,
    Grpc,
    /// A `networking.istio.io` VirtualService's `http` routes, converted to this model
    /// (by the VirtualService decoder).
    Virtual,
}

impl RouteKind {
    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Virtual => "VirtualService",
        }
    }
}

/// An HTTPRoute or GRPCRoute.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub kind: RouteKind,
    pub name: String,
    pub namespace: String,
    /// `metadata.generation` (0 when unset): the `observedGeneration` of its status.
    pub generation: i64,
    /// `metadata.creationTimestamp` as written (RFC 3339): routes for one host are merged in
    /// creation order.
    pub creation: Option<String>,
    /// `spec.hostnames` (empty: any).
    pub hostnames: Vec<String>,
    pub parent_refs: Vec<ParentRef>,
    pub rules: Vec<RouteRule>,
    /// VirtualService `gateways` (empty, or containing `mesh`: a mesh VirtualService).
    pub gateways: Vec<String>,
    /// VirtualService `exportTo` (empty: everywhere).
    pub export_to: Vec<String>,
}

/// One `spec.parentRefs[i]`, defaults applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParentRef {
    /// Default `gateway.networking.k8s.io`; `""` is the core group (a Service).
    pub group: String,
    /// Default `Gateway`.
    pub kind: String,
    pub name: String,
    /// `None`: the route's namespace.
    pub namespace: Option<String>,
    pub port: Option<u16>,
    pub section_name: Option<String>,
}

impl ParentRef {
    /// The parent's namespace: its own, else the route's.
    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }

    /// A Kubernetes Service (GAMMA): group `""`, kind `Service`.
    pub fn is_service(&self) -> bool {
        self.group.is_empty() && self.kind == "Service"
    }

    /// An Istio ServiceEntry: group `networking.istio.io`, kind `ServiceEntry`.
    pub fn is_service_entry(&self) -> bool {
        self.group == "networking.istio.io" && self.kind == "ServiceEntry"
    }

    /// A Gateway: group `gateway.networking.k8s.io`, kind `Gateway`.
    pub fn is_gateway(&self) -> bool {
        self.group == GATEWAY_GROUP && self.kind == "Gateway"
    }
}

/// One `spec.rules[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteRule {
    /// `name` (the Envoy route's name when set).
    pub name: Option<String>,
    /// Empty: the rule matches every request.
    pub matches: Vec<RouteMatch>,
    pub filters: Vec<RouteFilter>,
    pub backends: Vec<BackendRef>,
    /// `timeouts.request` (HTTPRoute).
    pub request_timeout: Option<Duration>,
    /// `timeouts.backendRequest` (HTTPRoute).
    pub backend_request_timeout: Option<Duration>,
    /// `retry` (HTTPRoute).
    pub retry: Option<Retry>,
}

/// One match: every part must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// HTTPRoute: always set (default `PathPrefix /`). GRPCRoute: `None`.
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    /// HTTPRoute `method`.
    pub method: Option<String>,
    /// GRPCRoute `method`.
    pub grpc: Option<GrpcMethodMatch>,
    /// VirtualService `port`: the match holds on that listener port only.
    pub port: Option<u16>,
}

/// An HTTPRoute path match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
    /// A VirtualService `prefix`: a plain string prefix (Envoy `prefix`), not whole path
    /// segments.
    RawPrefix(String),
}

/// A header or query parameter match: `Exact` or `RegularExpression` (or, from a
/// VirtualService, a header `prefix`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValueMatch {
    pub name: String,
    pub value: String,
    pub regex: bool,
    /// A VirtualService header `prefix` match.
    pub prefix: bool,
}

/// A GRPCRoute method match: `/<service>/<method>`; at least one of the two is set for a
/// valid route.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcMethodMatch {
    pub regex: bool,
    pub service: Option<String>,
    pub method: Option<String>,
}

/// A rule's (or a backend's) filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteFilter {
    RequestHeaders(HeaderFilter),
    ResponseHeaders(HeaderFilter),
    Redirect(Redirect),
    Rewrite(Rewrite),
    Mirror(Mirror),
    /// A filter type this kind does not support here (`ExtensionRef`, `CORS`, ...): istiod
    /// converts no route for an object with one.
    Unsupported(String),
}

/// `RequestHeaderModifier` / `ResponseHeaderModifier`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderFilter {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

/// `ReplaceFullPath` or `ReplacePrefixMatch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModifier {
    Full(String),
    Prefix(String),
    /// A VirtualService `rewrite.uri`: Envoy's `prefix_rewrite`, as written.
    RawPrefix(String),
}

/// `RequestRedirect`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status_code: Option<u16>,
}

/// `URLRewrite`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

/// `RequestMirror`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirror {
    pub backend: BackendRef,
    /// `percent`, or `fraction` as a percentage; `None`: every request.
    pub percent: Option<f64>,
}

// `percent` is a finite number read from JSON: equality is what a no-op update needs.
impl Eq for Mirror {}

/// One `backendRefs[i]` (or a mirror's `backendRef`), defaults applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendRef {
    /// Default `""` (core).
    pub group: String,
    /// Default `Service`.
    pub kind: String,
    pub name: String,
    /// `None`: the route's namespace.
    pub namespace: Option<String>,
    pub port: Option<u16>,
    /// Default 1.
    pub weight: u32,
    /// A VirtualService destination's `subset`.
    pub subset: Option<String>,
    /// Header modifiers applied when this backend is picked.
    pub filters: Vec<RouteFilter>,
}

/// The v1 HTTPRoute `retry`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// `None`: istiod's default, 2.
    pub attempts: Option<u32>,
    pub backoff: Option<Duration>,
    pub codes: Vec<u32>,
    /// A VirtualService's `retryOn` (conditions; codes are in `codes`): replaces the
    /// conditions a Gateway API retry gets.
    pub retry_on: Option<String>,
}

/// Why istiod would not convert a route, or a backend it cannot resolve: the reason and
/// message of the route's `ResolvedRefs` condition (istiod's `ConfigError`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteError {
    pub reason: &'static str,
    pub message: String,
}

impl RouteError {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        RouteError {
            reason,
            message: message.into(),
        }
    }
}

/// istiod's `isValidHeaderValue`: tab and visible characters, no DEL.
fn valid_header_value(value: &str) -> bool {
    value.bytes().all(|c| c == 0x09 || (c >= 0x20 && c != 0x7f))
}

impl HeaderFilter {
    fn error(&self) -> Option<RouteError> {
        self.set
            .iter()
            .chain(self.add.iter())
            .find(|(_, v)| !valid_header_value(v))
            .map(|(name, _)| {
                RouteError::new(
                    "InvalidFilter",
                    format!("header {name:?} value contains invalid characters"),
                )
            })
    }
}

impl BackendRef {
    /// The backend's namespace: its own, else the route's.
    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }

    /// A Kubernetes Service backend (group `""`, kind `Service`).
    pub fn is_service(&self) -> bool {
        self.group.is_empty() && self.kind == "Service"
    }

    /// An Istio hostname backend (group `networking.istio.io`, kind `Hostname`): a
    /// ServiceEntry host.
    pub fn is_hostname(&self) -> bool {
        self.group == "networking.istio.io" && self.kind == "Hostname"
    }

    /// The hostname it routes to (`<name>.<ns>.svc.<domain>` for a Service, the name for a
    /// Hostname), or why there is none (istiod's `buildDestination`): an unsupported kind is
    /// `InvalidKind`, which leaves the route in place but sends that backend's share nowhere.
    pub fn hostname(&self, route_namespace: &str, domain: &str) -> Result<String, RouteError> {
        if self.is_service() {
            Ok(format!(
                "{}.{}.svc.{domain}",
                self.name,
                self.namespace_or(route_namespace)
            ))
        } else if self.is_hostname() {
            Ok(self.name.clone())
        } else {
            Err(RouteError::new(
                "InvalidKind",
                format!(
                    "referencing unsupported backendRef: group {:?} kind {:?}",
                    self.group, self.kind
                ),
            ))
        }
    }

    /// A mistake that makes istiod convert no route at all for the object.
    fn hard_error(&self) -> Option<RouteError> {
        let invalid = |message: &str| Some(RouteError::new("InvalidDestination", message));
        if self.is_service() && self.name.contains('.') {
            return invalid(
                "service name invalid; the name of the Service must be used, not the hostname.",
            );
        }
        if self.is_hostname() && self.namespace.is_some() {
            return invalid("namespace may not be set with Hostname type");
        }
        if (self.is_service() || self.is_hostname()) && self.port.is_none() {
            return invalid("port is required in backendRef");
        }
        self.filters.iter().find_map(|filter| match filter {
            RouteFilter::RequestHeaders(h) | RouteFilter::ResponseHeaders(h) => h.error(),
            other => Some(unsupported(other)),
        })
    }
}

fn unsupported(filter: &RouteFilter) -> RouteError {
    let name = match filter {
        RouteFilter::RequestHeaders(_) => "RequestHeaderModifier",
        RouteFilter::ResponseHeaders(_) => "ResponseHeaderModifier",
        RouteFilter::Redirect(_) => "RequestRedirect",
        RouteFilter::Rewrite(_) => "URLRewrite",
        RouteFilter::Mirror(_) => "RequestMirror",
        RouteFilter::Unsupported(name) => name,
    };
    RouteError::new("InvalidFilter", format!("unsupported filter type {name:?}"))
}

impl Route {
    /// The first mistake for which istiod converts none of the object's rules (its
    /// `convertHTTPRoute` / `convertGRPCRoute` returning no route): an unsupported filter, a
    /// header value with control characters, a backend without a port or named by hostname,
    /// a gRPC match naming neither service nor method.
    pub fn conversion_error(&self) -> Option<RouteError> {
        for rule in &self.rules {
            for m in &rule.matches {
                if let Some(grpc) = &m.grpc
                    && grpc.service.is_none()
                    && grpc.method.is_none()
                {
                    return Some(RouteError::new(
                        "InvalidConfiguration",
                        "gRPC match must have method or service defined",
                    ));
                }
            }
            for filter in &rule.filters {
                let error = match filter {
                    RouteFilter::RequestHeaders(h) | RouteFilter::ResponseHeaders(h) => h.error(),
                    RouteFilter::Redirect(_) | RouteFilter::Rewrite(_)
                        if self.kind == RouteKind::Grpc =>
                    {
                        Some(unsupported(filter))
                    }
                    RouteFilter::Redirect(_) | RouteFilter::Rewrite(_) => None,
                    // A GRPCRoute's mirror backend is checked as strictly as its backends.
                    RouteFilter::Mirror(m) if self.kind == RouteKind::Grpc => {
                        m.backend.hard_error()
                    }
                    RouteFilter::Mirror(_) => None,
                    RouteFilter::Unsupported(_) => Some(unsupported(filter)),
                };
                if error.is_some() {
                    return error;
                }
            }
            let weighted = rule.backends.iter().map(|b| b.weight).sum::<u32>() > 0;
            let redirect = rule
                .filters
                .iter()
                .any(|f| matches!(f, RouteFilter::Redirect(_)));
            if (weighted || redirect)
                && let Some(error) = rule
                    .backends
                    .iter()
                    .filter(|b| b.weight > 0)
                    .find_map(BackendRef::hard_error)
            {
                return Some(error);
            }
        }
        None
    }
}
