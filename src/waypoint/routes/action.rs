//! A translated route's action (istiod's `applyHTTPRouteDestination`, `ApplyRedirect`,
//! `TranslateHeadersOperations`, `retry.ConvertPolicy`): header mutations, redirects,
//! rewrites, mirrors, timeouts, retries, and the backends as clusters.

use std::time::Duration;

use crate::discovery::model::{
    BackendRef, HeaderFilter, Mirror, PathModifier, Redirect, Retry, Rewrite, RouteFilter,
    RouteRule,
};
use crate::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
    header_value_option::HeaderAppendAction,
};
use crate::pb::envoy::config::route::v3::{
    self as route, RedirectAction, RetryPolicy, RouteAction, WeightedCluster, redirect_action,
    route_action, route_match,
};
use crate::pb::envoy::r#type::matcher::v3::{RegexMatchAndSubstitute, RegexMatcher};
use crate::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use crate::waypoint::chains::default_retry_policy;
use crate::waypoint::envoy::{self, uint32};

use super::destinations::Destinations;

/// The retry conditions istiod sets for a Gateway API `retry` (its codes are added).
const RETRY_ON: &str = "connect-failure,refused-stream,unavailable,cancelled";

/// Header mutations (`TranslateHeadersOperations`): `set` overwrites, `add` appends, each
/// sorted by name; `host` and pseudo-headers are not set but name the authority.
pub(super) struct HeaderOps {
    pub(super) add: Vec<HeaderValueOption>,
    pub(super) remove: Vec<String>,
    pub(super) authority: String,
}

fn is_internal(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

impl HeaderOps {
    pub(super) fn of(filter: &HeaderFilter) -> Self {
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
pub(super) fn redirect_action(r: &Redirect, port: u32) -> Option<RedirectAction> {
    let mut out = RedirectAction {
        host_redirect: r.hostname.clone().unwrap_or_default(),
        ..Default::default()
    };
    out.path_rewrite_specifier = Some(match &r.path {
        Some(PathModifier::Prefix(p) | PathModifier::RawPrefix(p)) => {
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
/// policy. Header mutations of a lone backend go on the route (`out`). `written`: the rule
/// comes from a VirtualService as written.
pub(super) fn route_action(
    rule: &RouteRule,
    written: bool,
    route_ns: &str,
    weighted: &[&BackendRef],
    mut authority: String,
    out: &mut route::Route,
    destinations: &mut Destinations<'_>,
) -> RouteAction {
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
        if let Some(policy) = mirror_policy(mirror, written, route_ns, destinations) {
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
        None => Some(default_retry_policy()),
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
        Some(PathModifier::RawPrefix(prefix)) => action.prefix_rewrite = prefix.clone(),
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
    written: bool,
    route_ns: &str,
    destinations: &mut Destinations<'_>,
) -> Option<route_action::RequestMirrorPolicy> {
    // A Gateway API mirror needs a port; a VirtualService's may leave it to the service.
    if mirror.backend.port.is_none() && !written {
        return None;
    }
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
fn retry_policy(retry: &Retry, per_try: Option<Duration>) -> Option<RetryPolicy> {
    let attempts = retry.attempts.unwrap_or(2);
    if attempts == 0 {
        return None;
    }
    let mut policy = default_retry_policy();
    policy.num_retries = uint32(attempts);
    match retry.retry_on.as_deref() {
        // A VirtualService without `retryOn` keeps the default policy's conditions.
        Some("") if retry.codes.is_empty() => {}
        // A VirtualService's `retryOn`: its conditions, its codes retriable.
        Some(conditions) => {
            policy.retry_on = conditions.into();
            policy.retriable_status_codes = retry.codes.clone();
            if !retry.codes.is_empty() && !policy.retry_on.contains("retriable-status-codes") {
                if !policy.retry_on.is_empty() {
                    policy.retry_on.push(',');
                }
                policy.retry_on.push_str("retriable-status-codes");
            }
        }
        None => {
            policy.retry_on = RETRY_ON.into();
            policy.retriable_status_codes = retry.codes.clone();
            if !retry.codes.is_empty() {
                policy.retry_on.push_str(",retriable-status-codes");
            }
        }
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

/// The last filter of one type (istiod keeps the last one it reads).
pub(super) fn filter_of<'a, T>(
    filters: &'a [RouteFilter],
    pick: impl Fn(&'a RouteFilter) -> Option<&'a T>,
) -> Option<&'a T> {
    filters.iter().rev().find_map(pick)
}
