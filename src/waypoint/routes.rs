//! Gateway API routes at a waypoint (spec/waypoint.md §4.1–§4.2): the HTTPRoutes and
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

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;

use crate::discovery::model::{
    BackendRef, GrpcMethodMatch, HeaderFilter, Mirror, PathMatch, PathModifier, Redirect, Rewrite,
    Route, RouteFilter, RouteMatch as MatchSpec, RouteRule, ValueMatch,
};
use crate::discovery::names::service_key;
use crate::discovery::{Resource, Snapshot};
use crate::pb::envoy::config::core::v3::{
    self as core, HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
    header_value_option::HeaderAppendAction,
};
use crate::pb::envoy::config::route::v3::{
    self as route, Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher,
    RedirectAction, RetryPolicy, RouteAction, RouteMatch, WeightedCluster, header_matcher,
    query_parameter_matcher, redirect_action, route_action, route_match,
};
use crate::pb::envoy::r#type::matcher::v3::{RegexMatchAndSubstitute, RegexMatcher};
use crate::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use crate::pb::istio::workload::{Address, AppProtocol, Service, address};
use crate::waypoint::envoy::{self, uint32};

/// The retry conditions istiod sets for a Gateway API `retry` (its codes are added).
const RETRY_ON: &str = "connect-failure,refused-stream,unavailable,cancelled";
/// The cluster name istiod gives a backend it could not resolve.
pub(crate) const UNKNOWN_SERVICE: &str = "UnknownService";

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
        };
        for route in routes.iter().map(|r| &**r) {
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
        self.services.is_empty() && self.entries.is_empty() && self.gateway.is_empty()
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
        if services.is_empty() {
            return None;
        }
        let mut merged: Vec<VirtualService<'_>> = services
            .into_iter()
            .map(|(key, routes)| VirtualService::merge(&key, routes))
            .collect();
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
            });
        }
        m.grpc.as_ref().and_then(grpc_uri)
    }

    /// Exact > Prefix > Regex (`getURIRank`).
    fn rank(this: Option<&Uri>) -> i32 {
        match this {
            Some(Uri::Exact(_)) => 3,
            Some(Uri::Prefix(_)) => 2,
            Some(Uri::Regex(_)) => 1,
            None => -1,
        }
    }

    fn len(this: Option<&Uri>) -> usize {
        match this {
            Some(Uri::Exact(s) | Uri::Prefix(s) | Uri::Regex(s)) => s.len(),
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
            out.action = Some(route::route::Action::Redirect(redirect_action(
                redirect, port,
            )?));
        } else if weighted.is_empty() {
            // "When there are no >0 weight backends", the Gateway API wants 500.
            out.action = Some(route::route::Action::DirectResponse(DirectResponseAction {
                status: 500,
                body: None,
            }));
        } else {
            let action = route_action(split, &weighted, authority, &mut out, destinations);
            out.action = Some(route::route::Action::Route(action));
        }
        out.decorator = Some(Decorator {
            operation: operation(&out, &self.name, port),
            ..Default::default()
        });
        Some(out)
    }
}

/// The last filter of one type (istiod keeps the last one it reads).
fn filter_of<'a, T>(
    filters: &'a [RouteFilter],
    pick: impl Fn(&'a RouteFilter) -> Option<&'a T>,
) -> Option<&'a T> {
    filters.iter().rev().find_map(pick)
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
    let by_name = |values: &[ValueMatch]| -> BTreeMap<String, (String, bool)> {
        values
            .iter()
            .map(|v| (v.name.clone(), (v.value.clone(), v.regex)))
            .collect()
    };
    for (name, (value, regex)) in by_name(&m.headers) {
        out.headers.push(header_match(&name, &value, regex));
    }
    if let Some(uri) = Uri::of(m) {
        out.path_specifier = Some(match uri {
            Uri::Exact(p) => route_match::PathSpecifier::Path(p),
            Uri::Prefix(p) if p != "/" => route_match::PathSpecifier::PathSeparatedPrefix(
                p.strip_suffix('/').unwrap_or(&p).to_string(),
            ),
            Uri::Prefix(p) => route_match::PathSpecifier::Prefix(p),
            Uri::Regex(r) => route_match::PathSpecifier::SafeRegex(RegexMatcher { regex: r }),
        });
    }
    if let Some(method) = &m.method {
        out.headers.push(header_match(":method", method, false));
    }
    for (name, (value, regex)) in by_name(&m.query_params) {
        out.query_parameters.push(QueryParameterMatcher {
            name,
            query_parameter_match_specifier: Some(if regex && value == "*" {
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
            } else {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(string_match(
                    &value, regex,
                ))
            }),
        });
    }
    out
}

fn string_match(value: &str, regex: bool) -> crate::pb::envoy::r#type::matcher::v3::StringMatcher {
    if regex {
        envoy::regex_match(value)
    } else {
        envoy::exact(value)
    }
}

/// A header match; the regex `*` means "present", as in istiod.
fn header_match(name: &str, value: &str, regex: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(if regex && value == "*" {
            header_matcher::HeaderMatchSpecifier::PresentMatch(true)
        } else {
            header_matcher::HeaderMatchSpecifier::StringMatch(string_match(value, regex))
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

/// Header mutations (`TranslateHeadersOperations`): `set` overwrites, `add` appends, each
/// sorted by name; `host` and pseudo-headers are not set but name the authority.
struct HeaderOps {
    add: Vec<HeaderValueOption>,
    remove: Vec<String>,
    authority: String,
}

fn is_internal(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

impl HeaderOps {
    fn of(filter: &HeaderFilter) -> Self {
        let mut authority = String::new();
        let mut set_authority = String::new();
        let mut options = |headers: &[(String, String)], action: HeaderAppendAction| {
            let mut list: Vec<HeaderValueOption> = Vec::new();
            for (name, value) in headers {
                if name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host") {
                    if action == HeaderAppendAction::OverwriteIfExistsOrAdd {
                        set_authority = value.clone();
                    } else {
                        authority = value.clone();
                    }
                }
                if is_internal(name) {
                    continue;
                }
                list.push(HeaderValueOption {
                    header: Some(HeaderValue {
                        key: name.clone(),
                        value: value.clone(),
                    }),
                    append_action: action as i32,
                });
            }
            list.sort_by(|a, b| {
                let key = |o: &HeaderValueOption| o.header.as_ref().map(|h| h.key.clone());
                key(a).cmp(&key(b))
            });
            list
        };
        let mut add = options(&filter.set, HeaderAppendAction::OverwriteIfExistsOrAdd);
        add.extend(options(
            &filter.add,
            HeaderAppendAction::AppendIfExistsOrAdd,
        ));
        HeaderOps {
            add,
            remove: filter
                .remove
                .iter()
                .filter(|n| !is_internal(n))
                .cloned()
                .collect(),
            authority: if set_authority.is_empty() {
                authority
            } else {
                set_authority
            },
        }
    }
}

/// `ApplyRedirect` for a Gateway API redirect; `None` for a status code Envoy cannot send
/// (istiod leaves such a route without an action).
fn redirect_action(r: &Redirect, port: u32) -> Option<RedirectAction> {
    let mut out = RedirectAction {
        host_redirect: r.hostname.clone().unwrap_or_default(),
        ..Default::default()
    };
    out.path_rewrite_specifier = Some(match &r.path {
        Some(PathModifier::Prefix(p)) => {
            redirect_action::PathRewriteSpecifier::PrefixRewrite(p.clone())
        }
        Some(PathModifier::Full(p)) => {
            redirect_action::PathRewriteSpecifier::PathRedirect(p.clone())
        }
        None => redirect_action::PathRewriteSpecifier::PathRedirect(String::new()),
    });
    if let Some(scheme) = &r.scheme {
        out.scheme_rewrite_specifier = Some(
            redirect_action::SchemeRewriteSpecifier::SchemeRedirect(scheme.clone()),
        );
    }
    // No port: the request's (the listener's), unless a scheme is given, whose default port
    // Envoy then uses.
    out.port_redirect = match (r.port, &r.scheme) {
        (Some(p), _) => u32::from(p),
        (None, Some(_)) => 0,
        (None, None) => port,
    };
    let scheme = r.scheme.as_deref().unwrap_or("http");
    if (out.port_redirect == 80 && scheme == "http")
        || (out.port_redirect == 443 && scheme == "https")
    {
        out.port_redirect = 0;
    }
    use redirect_action::RedirectResponseCode as Code;
    out.response_code = match r.status_code {
        None | Some(301) => Code::MovedPermanently,
        Some(302) => Code::Found,
        Some(303) => Code::SeeOther,
        Some(307) => Code::TemporaryRedirect,
        Some(308) => Code::PermanentRedirect,
        Some(_) => return None,
    } as i32;
    Some(out)
}

fn duration(d: Duration) -> Option<crate::pb::google::protobuf::Duration> {
    Some(crate::pb::google::protobuf::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

/// Go's `regexp.QuoteMeta`.
fn quote_meta(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `applyHTTPRouteDestination`: timeouts, rewrites, mirrors, the backends and the retry
/// policy. Header mutations of a lone backend go on the route (`out`).
fn route_action(
    split: &Split<'_>,
    weighted: &[&BackendRef],
    mut authority: String,
    out: &mut route::Route,
    destinations: &mut Destinations<'_>,
) -> RouteAction {
    let rule = split.rule;
    let route_ns = split.route.namespace.as_str();
    let mut action = RouteAction {
        cluster_not_found_response_code:
            route_action::ClusterNotFoundResponseCode::InternalServerError as i32,
        ..Default::default()
    };
    // Timeouts: `request`, unless `backendRequest` applies to the whole request (no retry).
    let mut timeout = rule.request_timeout.filter(|t| !t.is_zero());
    let per_try = rule.backend_request_timeout.filter(|t| !t.is_zero());
    if rule.retry.is_none() && per_try.is_some() {
        timeout = per_try;
    }
    action.timeout = duration(timeout.unwrap_or_default());
    action.max_grpc_timeout = action.timeout;
    if let Some(rewrite) = filter_of(&rule.filters, |f| match f {
        RouteFilter::Rewrite(r) => Some(r),
        _ => None,
    }) {
        apply_rewrite(rewrite, out, &mut action, &mut authority);
    }
    if !authority.is_empty() {
        action.host_rewrite_specifier = Some(
            route_action::HostRewriteSpecifier::HostRewriteLiteral(authority),
        );
    }
    for mirror in rule.filters.iter().filter_map(|f| match f {
        RouteFilter::Mirror(m) => Some(m),
        _ => None,
    }) {
        if let Some(policy) = mirror_policy(mirror, route_ns, destinations) {
            action.request_mirror_policies.push(policy);
        }
    }
    if let [only] = weighted {
        let cluster = destinations.cluster(only, route_ns);
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(cluster));
        if let Some(ops) = backend_ops(only) {
            out.request_headers_to_add.extend(ops.request.add);
            out.request_headers_to_remove.extend(ops.request.remove);
            out.response_headers_to_add.extend(ops.response.add);
            out.response_headers_to_remove.extend(ops.response.remove);
            if !ops.request.authority.is_empty() && action.host_rewrite_specifier.is_none() {
                action.host_rewrite_specifier = Some(
                    route_action::HostRewriteSpecifier::HostRewriteLiteral(ops.request.authority),
                );
            }
        }
    } else {
        let clusters = weighted
            .iter()
            .map(|backend| {
                let mut weight = route::weighted_cluster::ClusterWeight {
                    name: destinations.cluster(backend, route_ns),
                    weight: uint32(backend.weight),
                    ..Default::default()
                };
                if let Some(ops) = backend_ops(backend) {
                    weight.request_headers_to_add = ops.request.add;
                    weight.request_headers_to_remove = ops.request.remove;
                    weight.response_headers_to_add = ops.response.add;
                    weight.response_headers_to_remove = ops.response.remove;
                    if !ops.request.authority.is_empty() {
                        weight.host_rewrite_specifier = Some(
                            route::weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(
                                ops.request.authority,
                            ),
                        );
                    }
                }
                weight
            })
            .collect();
        action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
            WeightedCluster { clusters },
        ));
    }
    action.retry_policy = match &rule.retry {
        None => Some(crate::waypoint::listeners::default_retry_policy()),
        Some(retry) => retry_policy(retry, per_try),
    };
    action
}

/// `URLRewrite`: a full path replaces the whole path (a regex rewrite of `/.*`); a prefix
/// replaces the matched prefix, and `/` removes it.
fn apply_rewrite(
    rewrite: &Rewrite,
    out: &route::Route,
    action: &mut RouteAction,
    authority: &mut String,
) {
    match &rewrite.path {
        Some(PathModifier::Full(path)) => {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(RegexMatcher {
                    regex: "/.*".into(),
                }),
                substitution: path.clone(),
            });
        }
        Some(PathModifier::Prefix(prefix)) => {
            let uri = prefix.strip_suffix('/').unwrap_or(prefix);
            if uri.is_empty() {
                let matched = match out.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
                    Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => p.as_str(),
                    _ => "",
                };
                action.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(RegexMatcher {
                        regex: format!("^{}(/?)(.*)", quote_meta(matched)),
                    }),
                    // Keeps a `/` when the whole path is removed.
                    substitution: "/\\2".into(),
                });
            } else {
                action.prefix_rewrite = uri.to_string();
            }
        }
        None => {}
    }
    if let Some(host) = &rewrite.hostname {
        *authority = host.clone();
    }
}

/// A backend's own header mutations.
struct BackendOps {
    request: HeaderOps,
    response: HeaderOps,
}

fn backend_ops(backend: &BackendRef) -> Option<BackendOps> {
    let pick = |response: bool| {
        filter_of(&backend.filters, |f| match (f, response) {
            (RouteFilter::RequestHeaders(h), false) | (RouteFilter::ResponseHeaders(h), true) => {
                Some(h)
            }
            _ => None,
        })
    };
    let (request, response) = (pick(false), pick(true));
    if request.is_none() && response.is_none() {
        return None;
    }
    let empty = HeaderFilter::default();
    Some(BackendOps {
        request: HeaderOps::of(request.unwrap_or(&empty)),
        response: HeaderOps::of(response.unwrap_or(&empty)),
    })
}

/// A `RequestMirror` as Envoy's mirror policy: a percentage in millionths, 100 % when unset,
/// none at 0 %. A mirror whose backend cannot be used is left out.
fn mirror_policy(
    mirror: &Mirror,
    route_ns: &str,
    destinations: &mut Destinations<'_>,
) -> Option<route_action::RequestMirrorPolicy> {
    mirror.backend.port?;
    let fraction = match mirror.percent {
        Some(p) if p <= 0.0 => return None,
        Some(p) => FractionalPercent {
            numerator: (p * 10_000.0) as u32,
            denominator: fractional_percent::DenominatorType::Million as i32,
        },
        None => FractionalPercent {
            numerator: 100,
            denominator: fractional_percent::DenominatorType::Hundred as i32,
        },
    };
    Some(route_action::RequestMirrorPolicy {
        cluster: destinations.cluster(&mirror.backend, route_ns),
        runtime_fraction: Some(RuntimeFractionalPercent {
            default_value: Some(fraction),
        }),
        trace_sampled: envoy::boolean(false),
    })
}

/// The Gateway API `retry` (istiod's `ConvertPolicy`): its attempts (2 when unset, none at
/// 0), on connection failures and its codes, each try bounded by `backendRequest`.
fn retry_policy(
    retry: &crate::discovery::model::Retry,
    per_try: Option<Duration>,
) -> Option<RetryPolicy> {
    let attempts = retry.attempts.unwrap_or(2);
    if attempts == 0 {
        return None;
    }
    let mut policy = crate::waypoint::listeners::default_retry_policy();
    policy.num_retries = uint32(attempts);
    policy.retry_on = RETRY_ON.into();
    policy.retriable_status_codes = retry.codes.clone();
    if !retry.codes.is_empty() {
        policy.retry_on.push_str(",retriable-status-codes");
    }
    policy.per_try_timeout = per_try.and_then(duration);
    if let Some(backoff) = retry.backoff.filter(|b| !b.is_zero()) {
        policy.retry_back_off = Some(route::retry_policy::RetryBackOff {
            base_interval: duration(backoff),
            max_interval: None,
        });
    }
    Some(policy)
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

/// A service a route sends to that is not bound to this waypoint: its `outbound|…`
/// cluster is built beside the waypoint's own.
#[derive(Clone, Debug)]
pub(crate) struct Outbound {
    pub(crate) resource: Arc<Resource>,
    pub(crate) service: Service,
    pub(crate) port: u32,
    pub(crate) target_port: u32,
    pub(crate) protocol: AppProtocol,
}

/// Where a route's backends go: the bound services' `inbound-vip` clusters, or `outbound`
/// clusters for the others (collected here for the builder), with the service names it
/// looked up, found or not (a change of any of them rebuilds the config).
pub(crate) struct Destinations<'a> {
    snapshot: &'a Snapshot,
    domain: &'a str,
    /// Bound services by resource name (`ns/hostname`).
    bound: HashMap<&'a str, &'a Service>,
    /// Cluster name -> what it is built from.
    pub(crate) outbound: BTreeMap<String, Outbound>,
    /// Service resource names the routes referred to.
    pub(crate) reads: std::collections::BTreeSet<String>,
}

impl<'a> Destinations<'a> {
    pub(crate) fn new(
        snapshot: &'a Snapshot,
        domain: &'a str,
        bound: impl Iterator<Item = (&'a str, &'a Service)>,
    ) -> Self {
        Destinations {
            snapshot,
            domain,
            bound: bound.collect(),
            outbound: BTreeMap::new(),
            reads: Default::default(),
        }
    }

    /// The cluster a backend on `port` goes to (`getWaypointDestinationCluster`).
    fn cluster(&mut self, backend: &BackendRef, route_ns: &str) -> String {
        let Ok(host) = backend.hostname(route_ns, self.domain) else {
            return UNKNOWN_SERVICE.into();
        };
        // A backend without a port is a route istiod does not convert.
        let port = u32::from(backend.port.unwrap_or_default());
        let namespace = if backend.is_service() {
            backend.namespace_or(route_ns)
        } else {
            route_ns
        };
        let key = service_key(namespace, &host);
        self.reads.insert(key.clone());
        if let Some(service) = self.bound.get(key.as_str()) {
            return format!("inbound-vip|{port}|{}|{host}", subset(Some(service), port));
        }
        let Some((resource, service)) = self.lookup(&key) else {
            return format!("inbound-vip|{port}|http|{host}");
        };
        let name = format!("outbound|{port}||{host}");
        let Some((target_port, protocol)) = service
            .ports
            .iter()
            .find(|p| p.service_port == port)
            .map(|p| (p.target_port, p.app_protocol))
        else {
            // No such port: no endpoints, so no cluster; its requests get 500.
            return name;
        };
        self.outbound
            .entry(name.clone())
            .or_insert_with(|| Outbound {
                port,
                target_port,
                protocol: AppProtocol::try_from(protocol).unwrap_or(AppProtocol::Unknown),
                resource,
                service,
            });
        name
    }

    fn lookup(&self, key: &str) -> Option<(Arc<Resource>, Service)> {
        let resource = self.snapshot.addresses.get(key)?;
        match Address::decode(resource.value()).ok()?.r#type? {
            address::Type::Service(s) => Some((resource.clone(), s)),
            address::Type::Workload(_) => None,
        }
    }
}

/// `portToSubset`: `tcp` for a TCP or TLS port, `http` for any other and for a port the
/// service does not have.
fn subset(service: Option<&Service>, port: u32) -> &'static str {
    let protocol = service
        .and_then(|s| s.ports.iter().find(|p| p.service_port == port))
        .map(|p| AppProtocol::try_from(p.app_protocol).unwrap_or(AppProtocol::Unknown));
    match protocol {
        Some(AppProtocol::Tcp | AppProtocol::Tls) => "tcp",
        _ => "http",
    }
}

#[cfg(test)]
mod tests;
