//! Gateway API routes at a waypoint (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)): the HTTPRoutes and
//! GRPCRoutes whose parent is a bound Service (GAMMA), a bound ServiceEntry, or the
//! waypoint's own Gateway, turned into the Envoy routes of that service's HTTP chains, as
//! istiod converts them to VirtualServices (`pilot/pkg/config/kube/gateway/conversion.go`,
//! `route_collections.go`) and translates those for a waypoint (`listener_waypoint.go`
//! `buildWaypointInboundHTTPRouteConfig`, `route/route.go` `TranslateRoute`).
//!
//! * **Which routes.** A parentRef of kind `Service` (group `""`) naming the service, or of
//!   kind `ServiceEntry` (group `networking.istio.io`) naming the entry; the route must live in
//!   the service's namespace or the waypoint's. A parentRef `port` narrows the route to that
//!   service port. A parentRef to the waypoint's own Gateway applies to every bound service
//!   whose hostname the route's `hostnames` allow (all when empty): istiod converts no routes
//!   for a waypoint Gateway; ambientd takes them, as the issue asks.
//! * **Order.** Each rule is split into one route per match. The routes of one namespace for
//!   one host (and parentRef port) form one VirtualService: sorted by creation time, then
//!   stably by Gateway API precedence (exact path, then longest path, method, most headers,
//!   most query parameters). VirtualServices follow each other by creation time; in each,
//!   a catch-all route ends the list.
//! * **Destinations.** A backend Service bound to this waypoint is its
//!   `inbound-vip|<port>|<http or tcp>|<host>` cluster; any other existing service is
//!   `outbound|<port>||<host>` (built by [`Destinations`], §3.3); a backend that resolves to
//!   nothing keeps istiod's name, which names no cluster, and its requests get 500.
//! * **Any route** replaces the default route: a request no route matches gets 404.
//!
//! A route istiod would not convert ([`Route::conversion_error`]) contributes nothing.
//!
//! **VirtualServices** (`RouteKind::Virtual`, decoded by `kube::virtual_services` into the
//! same model) go through the same translation: a mesh VirtualService exported to the
//! waypoint's namespace, in the service's namespace or the waypoint's, with a `hosts` entry
//! matching the service's hostname, applies (`getVirtualServiceForWaypoint`); its rules keep
//! their order, a match's `port` narrows it to that listener port, a redirect without a port
//! keeps the request's. It is ordered with the converted ones by creation time.
//!
//! Here: which routes apply to a chain, their order, and each route's match; `action`: what
//! a matched route does; `destinations`: the clusters its backends go to.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::discovery::model::{
    BackendRef, GrpcMethodMatch, PathMatch, Route, RouteFilter, RouteKind, RouteMatch as MatchSpec,
    RouteRule, ValueMatch,
};
use crate::pb::envoy::config::core::v3 as core;
use crate::pb::envoy::config::route::v3::{
    self as route, Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher,
    RouteMatch, header_matcher, query_parameter_matcher, route_action, route_match,
};
use crate::pb::envoy::r#type::matcher::v3::RegexMatcher;
use crate::pb::istio::workload::Service;
use crate::waypoint::envoy;

use action::{HeaderOps, filter_of, redirect_action};

/// One route's parent at this waypoint: the route, and the port its parentRef narrows to.
type Attached<'a> = (&'a Route, Option<u16>);

/// The routes that may apply at one waypoint, by their parents.
pub(crate) struct RouteIndex<'a> {
    waypoint_namespace: &'a str,
    /// `(namespace, name)` of a Service parent.
    services: HashMap<(&'a str, &'a str), Vec<Attached<'a>>>,
    /// `(namespace, name)` of a ServiceEntry parent.
    entries: HashMap<(&'a str, &'a str), Vec<Attached<'a>>>,
    /// Routes whose parent is the waypoint's Gateway.
    gateway: Vec<&'a Route>,
    /// Mesh VirtualServices exported to the waypoint's namespace.
    virtual_services: Vec<&'a Route>,
}

impl<'a> RouteIndex<'a> {
    /// `routes` indexed for the waypoint `gateway` in `waypoint_namespace`. Routes istiod
    /// would not convert are left out here.
    pub(crate) fn new(
        routes: &'a [Arc<Route>],
        waypoint_namespace: &'a str,
        gateway: &'a str,
    ) -> Self {
        let mut index = RouteIndex {
            waypoint_namespace,
            services: HashMap::new(),
            entries: HashMap::new(),
            gateway: Vec::new(),
            virtual_services: Vec::new(),
        };
        for route in routes.iter().map(|r| &**r) {
            if route.kind == RouteKind::Virtual {
                if !route.rules.is_empty() && is_mesh(route) && exported(route, waypoint_namespace)
                {
                    index.virtual_services.push(route);
                }
                continue;
            }
            if route.rules.is_empty() || route.conversion_error().is_some() {
                continue;
            }
            let mut on_gateway = false;
            for parent in &route.parent_refs {
                let key = (parent.namespace_or(&route.namespace), parent.name.as_str());
                if parent.is_service() {
                    index
                        .services
                        .entry(key)
                        .or_default()
                        .push((route, parent.port));
                } else if parent.is_service_entry() {
                    index
                        .entries
                        .entry(key)
                        .or_default()
                        .push((route, parent.port));
                } else if parent.is_gateway() && key == (waypoint_namespace, gateway) {
                    on_gateway = true;
                }
            }
            if on_gateway {
                index.gateway.push(route);
            }
        }
        index
    }

    /// Whether no route may apply here (every chain keeps its default route).
    pub(crate) fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.entries.is_empty()
            && self.gateway.is_empty()
            && self.virtual_services.is_empty()
    }

    /// The Envoy routes of `service`'s HTTP chain on `port`, or `None` when no route
    /// applies (the chain keeps its default route).
    pub(crate) fn chain_routes(
        &self,
        service: &Service,
        kubernetes: bool,
        port: u32,
        destinations: &mut Destinations<'_>,
    ) -> Option<Vec<route::Route>> {
        destinations.listener_port = port;
        let namespace = service.namespace.as_str();
        let parents = if kubernetes {
            &self.services
        } else {
            &self.entries
        };
        let allowed = |route: &Route| {
            route.namespace == namespace || route.namespace == self.waypoint_namespace
        };
        let host = service.hostname.as_str();
        // One VirtualService per namespace, parentRef port and host (`mergeHTTPRoutes`).
        let mut services: BTreeMap<String, Vec<Attached<'_>>> = BTreeMap::new();
        let attached = parents
            .get(&(namespace, service.name.as_str()))
            .into_iter()
            .flatten()
            .copied()
            .chain(
                self.gateway
                    .iter()
                    .filter(|r| hostnames_allow(&r.hostnames, host))
                    .map(|r| (*r, None)),
            );
        for (route, parent_port) in attached.filter(|(r, _)| allowed(r)) {
            let key = match parent_port {
                Some(p) => format!("{}/{p}/{host}", route.namespace),
                None => format!("{}/{host}", route.namespace),
            };
            services.entry(key).or_default().push((route, parent_port));
        }
        let mut merged: Vec<VirtualService<'_>> = services
            .into_iter()
            .map(|(key, routes)| VirtualService::merge(&key, routes))
            .collect();
        // VirtualServices written as such (`getVirtualServiceForWaypoint`).
        merged.extend(
            self.virtual_services
                .iter()
                .filter(|vs| allowed(vs) && vs_hosts_match(vs, host))
                .map(|vs| VirtualService::written(vs)),
        );
        if merged.is_empty() {
            return None;
        }
        merged.sort_by(|a, b| {
            (a.creation, a.namespace, &a.name).cmp(&(b.creation, b.namespace, &b.name))
        });
        let mut out = Vec::new();
        for vs in &merged {
            out.extend(vs.translate(port, destinations));
        }
        (!out.is_empty()).then_some(out)
    }
}

/// A mesh VirtualService: `gateways` empty or naming `mesh`.
fn is_mesh(vs: &Route) -> bool {
    vs.gateways.is_empty() || vs.gateways.iter().any(|g| g == "mesh")
}

/// A VirtualService's `exportTo` lets the waypoint's namespace see it (empty or `*`: all;
/// `.`: its own namespace).
fn exported(vs: &Route, waypoint_namespace: &str) -> bool {
    vs.export_to.is_empty()
        || vs.export_to.iter().any(|e| {
            e == "*" || e == waypoint_namespace || (e == "." && vs.namespace == waypoint_namespace)
        })
}

/// Some VirtualService `hosts` entry matches `host`: wildcard-aware, a short name (no dot)
/// is a Service in the VirtualService's namespace.
fn vs_hosts_match(vs: &Route, host: &str) -> bool {
    vs.hostnames.iter().any(|h| {
        if h == "*" {
            true
        } else if !h.contains('.') && !h.starts_with('*') {
            host.strip_prefix(h.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|rest| rest.strip_prefix(vs.namespace.as_str()))
                .is_some_and(|rest| rest.starts_with(".svc."))
        } else {
            hostnames_allow(std::slice::from_ref(h), host)
        }
    })
}

/// A route's `hostnames` allow `host`: empty allows all; `*.example` allows its subdomains.
fn hostnames_allow(hostnames: &[String], host: &str) -> bool {
    hostnames.is_empty()
        || hostnames.iter().any(|h| match h.strip_prefix('*') {
            Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
            None => h == host,
        })
}

/// One route of a VirtualService: a rule, with at most one of its matches.
struct Split<'a> {
    route: &'a Route,
    rule_index: usize,
    rule: &'a RouteRule,
    /// `None`: the rule has no match.
    matched: Option<&'a MatchSpec>,
    /// The parentRef's port, a match on the listener port.
    port: Option<u16>,
}

/// A path match as istiod's `StringMatch` has it.
enum Uri {
    Exact(String),
    Prefix(String),
    Regex(String),
    /// A VirtualService's plain prefix.
    RawPrefix(String),
}

impl Uri {
    fn of(m: &MatchSpec) -> Option<Uri> {
        if let Some(path) = &m.path {
            return Some(match path {
                PathMatch::Exact(p) => Uri::Exact(p.clone()),
                // "When specified, a trailing `/` is ignored."
                PathMatch::Prefix(p) if p != "/" => {
                    Uri::Prefix(p.strip_suffix('/').unwrap_or(p).to_string())
                }
                PathMatch::Prefix(p) => Uri::Prefix(p.clone()),
                PathMatch::Regex(r) => Uri::Regex(r.clone()),
                PathMatch::RawPrefix(p) => Uri::RawPrefix(p.clone()),
            });
        }
        m.grpc.as_ref().and_then(grpc_uri)
    }

    /// Exact > Prefix > Regex (`getURIRank`).
    fn rank(this: Option<&Uri>) -> i32 {
        match this {
            Some(Uri::Exact(_)) => 3,
            Some(Uri::Prefix(_) | Uri::RawPrefix(_)) => 2,
            Some(Uri::Regex(_)) => 1,
            None => -1,
        }
    }

    fn len(this: Option<&Uri>) -> usize {
        match this {
            Some(Uri::Exact(s) | Uri::Prefix(s) | Uri::Regex(s) | Uri::RawPrefix(s)) => s.len(),
            None => 0,
        }
    }
}

/// istiod's `createGRPCURIMatch`: `/<service>/<method>` as a string match.
fn grpc_uri(m: &GrpcMethodMatch) -> Option<Uri> {
    Some(match (m.regex, &m.service, &m.method) {
        (_, None, None) => return None,
        (false, Some(s), None) => Uri::Prefix(format!("/{s}/")),
        (_, None, Some(method)) => Uri::Regex(format!("/[^/]+/{method}")),
        (false, Some(s), Some(method)) => Uri::Exact(format!("/{s}/{method}")),
        (true, Some(s), None) => Uri::Regex(format!("/{s}/.+")),
        (true, Some(s), Some(method)) => Uri::Regex(format!("/{s}/{method}")),
    })
}

impl Split<'_> {
    fn has_match(&self) -> bool {
        self.matched.is_some() || self.port.is_some()
    }

    /// `sortHTTPRoutes`' order, as a key (smaller first): routes with a match before those
    /// without, then by path rank, path length, method, header and query match counts.
    fn precedence(&self) -> Precedence {
        let uri = self.matched.and_then(Uri::of);
        let m = self.matched;
        (
            !self.has_match(),
            Reverse(Uri::rank(uri.as_ref())),
            Reverse(Uri::len(uri.as_ref())),
            Reverse(m.is_some_and(|m| m.method.is_some())),
            Reverse(m.map_or(0, |m| m.headers.len())),
            Reverse(m.map_or(0, |m| m.query_params.len())),
        )
    }
}

type Precedence = (
    bool,
    Reverse<i32>,
    Reverse<usize>,
    Reverse<bool>,
    Reverse<usize>,
    Reverse<usize>,
);

/// The routes istiod merges into one VirtualService.
struct VirtualService<'a> {
    /// `<ns>~[<port>~]<host>`.
    name: String,
    namespace: &'a str,
    /// The oldest route's.
    creation: Option<&'a str>,
    /// Whether written as a VirtualService (its rules keep their order, a redirect without
    /// a port keeps the request's).
    written: bool,
    splits: Vec<Split<'a>>,
}

impl<'a> VirtualService<'a> {
    fn merge(key: &str, mut routes: Vec<Attached<'a>>) -> Self {
        routes.sort_by(|(a, _), (b, _)| {
            (a.creation.as_deref(), &a.namespace, &a.name).cmp(&(
                b.creation.as_deref(),
                &b.namespace,
                &b.name,
            ))
        });
        let mut splits = Vec::new();
        for (route, port) in &routes {
            for (rule_index, rule) in route.rules.iter().enumerate() {
                if rule.matches.is_empty() {
                    splits.push(Split {
                        route,
                        rule_index,
                        rule,
                        matched: None,
                        port: *port,
                    });
                }
                for m in &rule.matches {
                    splits.push(Split {
                        route,
                        rule_index,
                        rule,
                        matched: Some(m),
                        port: *port,
                    });
                }
            }
        }
        splits.sort_by_cached_key(|s| s.precedence());
        VirtualService {
            name: key.replace('/', "~"),
            namespace: routes[0].0.namespace.as_str(),
            creation: routes[0].0.creation.as_deref(),
            written: false,
            splits,
        }
    }

    /// A VirtualService as written: its rules in order, one route per match; a match's
    /// `port` narrows it to that listener port.
    fn written(vs: &'a Route) -> Self {
        let mut splits = Vec::new();
        for (rule_index, rule) in vs.rules.iter().enumerate() {
            if rule.matches.is_empty() {
                splits.push(Split {
                    route: vs,
                    rule_index,
                    rule,
                    matched: None,
                    port: None,
                });
            }
            for m in &rule.matches {
                splits.push(Split {
                    route: vs,
                    rule_index,
                    rule,
                    matched: Some(m),
                    port: m.port,
                });
            }
        }
        VirtualService {
            name: vs.name.clone(),
            namespace: vs.namespace.as_str(),
            creation: vs.creation.as_deref(),
            written: true,
            splits,
        }
    }

    /// Its Envoy routes on `port` (`waypointInboundRoute`): a route on another port is
    /// skipped; a rule without matches, or a catch-all route, ends the list.
    fn translate(&self, port: u32, destinations: &mut Destinations<'_>) -> Vec<route::Route> {
        let mut out = Vec::new();
        for split in &self.splits {
            if split.port.is_some_and(|p| u32::from(p) != port) {
                continue;
            }
            let Some(translated) = self.route(split, port, destinations) else {
                continue;
            };
            let catch_all = !split.has_match() || is_catch_all(&translated);
            out.push(translated);
            if catch_all {
                break;
            }
        }
        out
    }

    /// One Envoy route (`TranslateRoute`).
    fn route(
        &self,
        split: &Split<'_>,
        port: u32,
        destinations: &mut Destinations<'_>,
    ) -> Option<route::Route> {
        let rule = split.rule;
        let route_ns = split.route.namespace.as_str();
        let mut out = route::Route {
            name: rule
                .name
                .clone()
                .unwrap_or_else(|| format!("{route_ns}.{}.{}", split.route.name, split.rule_index)),
            r#match: Some(route_match(split.matched)),
            metadata: Some(config_metadata(self.namespace, &self.name)),
            ..Default::default()
        };
        let mut authority = String::new();
        let request = filter_of(&rule.filters, |f| match f {
            RouteFilter::RequestHeaders(h) => Some(h),
            _ => None,
        });
        let response = filter_of(&rule.filters, |f| match f {
            RouteFilter::ResponseHeaders(h) => Some(h),
            _ => None,
        });
        if let Some(h) = request {
            let ops = HeaderOps::of(h);
            out.request_headers_to_add = ops.add;
            out.request_headers_to_remove = ops.remove;
            authority = ops.authority;
        }
        if let Some(h) = response {
            let ops = HeaderOps::of(h);
            out.response_headers_to_add = ops.add;
            out.response_headers_to_remove = ops.remove;
        }
        let redirect = filter_of(&rule.filters, |f| match f {
            RouteFilter::Redirect(r) => Some(r),
            _ => None,
        });
        let weighted: Vec<&BackendRef> = rule.backends.iter().filter(|b| b.weight > 0).collect();
        if let Some(redirect) = redirect {
            // A VirtualService redirect without a port keeps the request's port.
            let derive = if self.written { 0 } else { port };
            out.action = Some(route::route::Action::Redirect(redirect_action(
                redirect, derive,
            )?));
        } else if weighted.is_empty() {
            // "When there are no >0 weight backends", the Gateway API wants 500.
            out.action = Some(route::route::Action::DirectResponse(DirectResponseAction {
                status: 500,
                body: None,
            }));
        } else {
            let action = action::route_action(
                rule,
                self.written,
                route_ns,
                &weighted,
                authority,
                &mut out,
                destinations,
            );
            out.action = Some(route::route::Action::Route(action));
        }
        out.decorator = Some(Decorator {
            operation: operation(&out, &self.name, port),
            ..Default::default()
        });
        Some(out)
    }
}

/// `TranslateRouteMatch`, with Gateway semantics: a prefix other than `/` matches whole
/// path segments.
fn route_match(m: Option<&MatchSpec>) -> RouteMatch {
    let mut out = RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
        case_sensitive: envoy::boolean(true),
        ..Default::default()
    };
    let Some(m) = m else {
        return out;
    };
    // Header and query matches are maps in istiod: one per name, the last wins, sorted.
    let by_name = |values: &[ValueMatch]| -> BTreeMap<String, ValueMatch> {
        values.iter().map(|v| (v.name.clone(), v.clone())).collect()
    };
    for v in by_name(&m.headers).values() {
        out.headers.push(header_match(v));
    }
    if let Some(uri) = Uri::of(m) {
        out.path_specifier = Some(match uri {
            Uri::Exact(p) => route_match::PathSpecifier::Path(p),
            Uri::Prefix(p) if p != "/" => route_match::PathSpecifier::PathSeparatedPrefix(
                p.strip_suffix('/').unwrap_or(&p).to_string(),
            ),
            Uri::Prefix(p) => route_match::PathSpecifier::Prefix(p),
            Uri::Regex(r) => route_match::PathSpecifier::SafeRegex(RegexMatcher { regex: r }),
            Uri::RawPrefix(p) => route_match::PathSpecifier::Prefix(p),
        });
    }
    if let Some(method) = &m.method {
        out.headers.push(header_match(&ValueMatch {
            name: ":method".into(),
            value: method.clone(),
            ..Default::default()
        }));
    }
    for (name, v) in by_name(&m.query_params) {
        out.query_parameters.push(QueryParameterMatcher {
            name,
            query_parameter_match_specifier: Some(if v.regex && v.value == "*" {
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
            } else {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(string_match(&v))
            }),
        });
    }
    out
}

fn string_match(v: &ValueMatch) -> crate::pb::envoy::r#type::matcher::v3::StringMatcher {
    if v.regex {
        envoy::regex_match(&v.value)
    } else if v.prefix {
        envoy::prefix_match(&v.value)
    } else {
        envoy::exact(&v.value)
    }
}

/// A header match; the regex `*` means "present", as in istiod.
fn header_match(v: &ValueMatch) -> HeaderMatcher {
    HeaderMatcher {
        name: v.name.clone(),
        header_match_specifier: Some(if v.regex && v.value == "*" {
            header_matcher::HeaderMatchSpecifier::PresentMatch(true)
        } else {
            header_matcher::HeaderMatchSpecifier::StringMatch(string_match(v))
        }),
        ..Default::default()
    }
}

/// `IsCatchAllRoute`: every path, no header or query match.
fn is_catch_all(r: &route::Route) -> bool {
    let Some(m) = &r.r#match else {
        return false;
    };
    let every_path = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => p == "/",
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    every_path && m.headers.is_empty() && m.query_parameters.is_empty()
}

/// `istio.config` route metadata naming the VirtualService the route came from.
fn config_metadata(namespace: &str, name: &str) -> core::Metadata {
    core::Metadata {
        filter_metadata: [(
            "istio".to_string(),
            envoy::object(vec![(
                "config",
                envoy::string_value(format!(
                    "/apis/networking.istio.io/v1/namespaces/{namespace}/virtual-service/{name}"
                )),
            )]),
        )]
        .into(),
        ..Default::default()
    }
}

/// `GetRouteOperation`: `<host>:<port><path>` for a lone known cluster, else
/// `<VirtualService>:<listener port><path>`.
fn operation(r: &route::Route, vs_name: &str, port: u32) -> String {
    let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(route_match::PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(route_match::PathSpecifier::Path(p)) => p.clone(),
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".into(),
    };
    if let Some(route::route::Action::Route(action)) = &r.action
        && let Some(route_action::ClusterSpecifier::Cluster(cluster)) = &action.cluster_specifier
    {
        let parts: Vec<&str> = cluster.split('|').collect();
        if let [_, cluster_port, _, host] = parts.as_slice()
            && cluster_port.parse::<u32>().is_ok()
        {
            return format!("{host}:{cluster_port}{path}");
        }
    }
    format!("{vs_name}:{port}{path}")
}

mod action;
mod destinations;

pub(crate) use destinations::Destinations;

#[cfg(test)]
mod tests;
