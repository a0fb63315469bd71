//! Gateway API routes (`gateway.networking.k8s.io/v1`, and `v1beta1` for HTTPRoute) as they
//! appear in YAML/JSON, decoded to the reduced [`Route`] of `crate::discovery`, with the
//! defaults the CRDs give: a match without a path is `PathPrefix /`, a path match's type is
//! `PathPrefix` and its value `/`, a header, query or gRPC method match is `Exact`, a
//! backendRef's group is `""`, its kind `Service` and its weight 1, a parentRef's group
//! `gateway.networking.k8s.io` and its kind `Gateway`. A rule without `matches` matches
//! everything.
//!
//! Lenient where the API server is strict already (unknown fields are ignored) and strict
//! where a wrong value would change routing: a port out of range, a duration that is not a
//! Gateway API duration (`1h2m3s4ms`), an unknown match type or an unknown redirect path
//! type is an error naming the field, and the object is skipped. An unknown filter type is
//! kept ([`RouteFilter::Unsupported`]) so the route's status can name it.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::discovery::model::{
    BackendRef, GrpcMethodMatch, HeaderFilter, Mirror, Object, ParentRef, PathMatch, PathModifier,
    Redirect, Retry, Rewrite, Route, RouteFilter, RouteKind, RouteMatch, RouteRule, ValueMatch,
};
use crate::kube::objects::{RawMeta, parse, port_number};

/// Decodes an `HTTPRoute`. The error names the failing field.
pub(crate) fn http_route(value: &Value) -> Result<Object, String> {
    decode(value, RouteKind::Http).map(Object::HttpRoute)
}

/// Decodes a `GRPCRoute`. The error names the failing field.
pub(crate) fn grpc_route(value: &Value) -> Result<Object, String> {
    decode(value, RouteKind::Grpc).map(Object::GrpcRoute)
}

fn decode(value: &Value, kind: RouteKind) -> Result<Route, String> {
    let raw: RawRoute = parse(value)?;
    let namespace = raw.metadata.namespace();
    let parent_refs = raw
        .spec
        .parent_refs
        .iter()
        .enumerate()
        .map(|(i, p)| p.reduce(&format!("spec.parentRefs[{i}]")))
        .collect::<Result<_, _>>()?;
    let rules = raw
        .spec
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.reduce(kind, &format!("spec.rules[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(Route {
        kind,
        name: raw.metadata.name()?,
        namespace,
        generation: raw.metadata.generation.unwrap_or_default(),
        creation: raw
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(Value::as_str)
            .map(str::to_string),
        hostnames: raw.spec.hostnames,
        parent_refs,
        rules,
        gateways: Vec::new(),
        export_to: Vec::new(),
    })
}

/// A Gateway API `Duration` (GEP-2257): one to four `<number><h|m|s|ms>` parts.
pub(crate) fn parse_duration(text: &str, field: &str) -> Result<Duration, String> {
    let bad = || format!("{field}: {text:?} is not a duration such as 1h2m3s4ms");
    let mut rest = text;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * u32::try_from(number).map_err(|_| bad())?;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

fn port(value: Option<i64>, field: &str) -> Result<Option<u16>, String> {
    value.map(|p| port_number(p, field)).transpose()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRoute {
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSpec {
    parent_refs: Vec<RawParentRef>,
    hostnames: Vec<String>,
    rules: Vec<RawRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawParentRef {
    group: Option<String>,
    kind: Option<String>,
    name: String,
    namespace: Option<String>,
    port: Option<i64>,
    section_name: Option<String>,
}

impl RawParentRef {
    fn reduce(&self, field: &str) -> Result<ParentRef, String> {
        Ok(ParentRef {
            group: self
                .group
                .clone()
                .unwrap_or_else(|| crate::discovery::model::route::GATEWAY_GROUP.to_string()),
            kind: self.kind.clone().unwrap_or_else(|| "Gateway".to_string()),
            name: self.name.clone(),
            namespace: self.namespace.clone().filter(|n| !n.is_empty()),
            port: port(self.port, &format!("{field}.port"))?,
            section_name: self.section_name.clone().filter(|s| !s.is_empty()),
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRule {
    name: Option<String>,
    matches: Vec<RawMatch>,
    filters: Vec<RawFilter>,
    backend_refs: Vec<RawBackendRef>,
    timeouts: Option<RawTimeouts>,
    retry: Option<RawRetry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawTimeouts {
    request: Option<String>,
    backend_request: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRetry {
    attempts: Option<u32>,
    backoff: Option<String>,
    codes: Vec<u32>,
}

impl RawRule {
    fn reduce(self, kind: RouteKind, field: &str) -> Result<RouteRule, String> {
        let matches = self
            .matches
            .iter()
            .enumerate()
            .map(|(i, m)| m.reduce(kind, &format!("{field}.matches[{i}]")))
            .collect::<Result<_, _>>()?;
        let filters = self
            .filters
            .iter()
            .enumerate()
            .map(|(i, f)| f.reduce(&format!("{field}.filters[{i}]")))
            .collect::<Result<_, _>>()?;
        let backends = self
            .backend_refs
            .iter()
            .enumerate()
            .map(|(i, b)| b.reduce(&format!("{field}.backendRefs[{i}]")))
            .collect::<Result<_, _>>()?;
        let timeout = |value: &Option<String>, name: &str| {
            value
                .as_deref()
                .map(|t| parse_duration(t, &format!("{field}.timeouts.{name}")))
                .transpose()
        };
        let timeouts = self.timeouts.unwrap_or_default();
        let retry = self
            .retry
            .map(|r| -> Result<Retry, String> {
                Ok(Retry {
                    attempts: r.attempts,
                    backoff: r
                        .backoff
                        .as_deref()
                        .map(|b| parse_duration(b, &format!("{field}.retry.backoff")))
                        .transpose()?,
                    codes: r.codes,
                    retry_on: None,
                })
            })
            .transpose()?;
        Ok(RouteRule {
            name: self.name.filter(|n| !n.is_empty()),
            matches,
            filters,
            backends,
            request_timeout: timeout(&timeouts.request, "request")?,
            backend_request_timeout: timeout(&timeouts.backend_request, "backendRequest")?,
            retry,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawMatch {
    path: Option<RawTypedValue>,
    headers: Vec<RawNamedValue>,
    query_params: Vec<RawNamedValue>,
    /// HTTPRoute: a method name; GRPCRoute: `{type, service, method}`.
    method: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawTypedValue {
    #[serde(rename = "type")]
    kind: Option<String>,
    value: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawNamedValue {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    value: String,
}

impl RawNamedValue {
    fn reduce(&self, field: &str) -> Result<ValueMatch, String> {
        Ok(ValueMatch {
            name: self.name.clone(),
            value: self.value.clone(),
            regex: regex_type(self.kind.as_deref(), &format!("{field}.type"))?,
            prefix: false,
        })
    }
}

/// `Exact` (the default) or `RegularExpression`.
fn regex_type(kind: Option<&str>, field: &str) -> Result<bool, String> {
    match kind {
        None | Some("Exact") => Ok(false),
        Some("RegularExpression") => Ok(true),
        Some(other) => Err(format!(
            "{field}: unknown type {other:?} (expected Exact or RegularExpression)"
        )),
    }
}

impl RawMatch {
    fn reduce(&self, kind: RouteKind, field: &str) -> Result<RouteMatch, String> {
        let headers = self
            .headers
            .iter()
            .enumerate()
            .map(|(i, h)| h.reduce(&format!("{field}.headers[{i}]")))
            .collect::<Result<_, _>>()?;
        let query_params = self
            .query_params
            .iter()
            .enumerate()
            .map(|(i, q)| q.reduce(&format!("{field}.queryParams[{i}]")))
            .collect::<Result<_, _>>()?;
        let mut out = RouteMatch {
            headers,
            query_params,
            ..RouteMatch::default()
        };
        match kind {
            RouteKind::Http => {
                let path = self.path.as_ref();
                let value = path
                    .and_then(|p| p.value.clone())
                    .unwrap_or_else(|| "/".into());
                out.path = Some(match path.and_then(|p| p.kind.as_deref()) {
                    None | Some("PathPrefix") => PathMatch::Prefix(value),
                    Some("Exact") => PathMatch::Exact(value),
                    Some("RegularExpression") => PathMatch::Regex(value),
                    Some(other) => {
                        return Err(format!(
                            "{field}.path.type: unknown type {other:?} (expected Exact, PathPrefix or RegularExpression)"
                        ));
                    }
                });
                out.method = match &self.method {
                    None | Some(Value::Null) => None,
                    Some(Value::String(m)) => Some(m.clone()),
                    Some(other) => {
                        return Err(format!("{field}.method: expected a string, found {other}"));
                    }
                };
            }
            RouteKind::Virtual => {}
            RouteKind::Grpc => {
                out.grpc = match &self.method {
                    None | Some(Value::Null) => None,
                    Some(method) => {
                        let raw: RawGrpcMethod = serde_json::from_value(method.clone())
                            .map_err(|e| format!("{field}.method: {e}"))?;
                        Some(GrpcMethodMatch {
                            regex: regex_type(
                                raw.kind.as_deref(),
                                &format!("{field}.method.type"),
                            )?,
                            service: raw.service.filter(|s| !s.is_empty()),
                            method: raw.method.filter(|m| !m.is_empty()),
                        })
                    }
                };
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawGrpcMethod {
    #[serde(rename = "type")]
    kind: Option<String>,
    service: Option<String>,
    method: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawFilter {
    #[serde(rename = "type")]
    kind: String,
    request_header_modifier: Option<RawHeaderFilter>,
    response_header_modifier: Option<RawHeaderFilter>,
    request_redirect: Option<RawRedirect>,
    #[serde(rename = "urlRewrite")]
    url_rewrite: Option<RawRewrite>,
    request_mirror: Option<RawMirror>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawHeaderFilter {
    set: Vec<RawHeader>,
    add: Vec<RawHeader>,
    remove: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawHeader {
    name: String,
    value: String,
}

impl RawHeaderFilter {
    /// istiod's `headerListToMap`: names lower-cased; a later entry for a name already seen
    /// is ignored, as the Gateway API says.
    fn reduce(&self) -> HeaderFilter {
        let list = |headers: &[RawHeader]| {
            let mut out: Vec<(String, String)> = Vec::new();
            for h in headers {
                let name = h.name.to_ascii_lowercase();
                if !out.iter().any(|(n, _)| *n == name) {
                    out.push((name, h.value.clone()));
                }
            }
            out
        };
        HeaderFilter {
            set: list(&self.set),
            add: list(&self.add),
            remove: self.remove.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRedirect {
    scheme: Option<String>,
    hostname: Option<String>,
    path: Option<RawPathModifier>,
    port: Option<i64>,
    status_code: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRewrite {
    hostname: Option<String>,
    path: Option<RawPathModifier>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawPathModifier {
    #[serde(rename = "type")]
    kind: String,
    replace_full_path: Option<String>,
    replace_prefix_match: Option<String>,
}

impl RawPathModifier {
    fn reduce(&self, field: &str) -> Result<PathModifier, String> {
        match self.kind.as_str() {
            "ReplaceFullPath" => Ok(PathModifier::Full(
                self.replace_full_path.clone().unwrap_or_default(),
            )),
            "ReplacePrefixMatch" => Ok(PathModifier::Prefix(
                self.replace_prefix_match.clone().unwrap_or_default(),
            )),
            other => Err(format!(
                "{field}.type: unknown type {other:?} (expected ReplaceFullPath or ReplacePrefixMatch)"
            )),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawMirror {
    backend_ref: RawBackendRef,
    percent: Option<f64>,
    fraction: Option<RawFraction>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawFraction {
    numerator: f64,
    denominator: Option<f64>,
}

impl RawFilter {
    fn reduce(&self, field: &str) -> Result<RouteFilter, String> {
        let missing = |name: &str| format!("{field}.{name}: missing for type {:?}", self.kind);
        Ok(match self.kind.as_str() {
            "RequestHeaderModifier" => RouteFilter::RequestHeaders(
                self.request_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing("requestHeaderModifier"))?
                    .reduce(),
            ),
            "ResponseHeaderModifier" => RouteFilter::ResponseHeaders(
                self.response_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing("responseHeaderModifier"))?
                    .reduce(),
            ),
            "RequestRedirect" => {
                let r = self
                    .request_redirect
                    .as_ref()
                    .ok_or_else(|| missing("requestRedirect"))?;
                let field = format!("{field}.requestRedirect");
                RouteFilter::Redirect(Redirect {
                    scheme: r.scheme.clone(),
                    hostname: r.hostname.clone(),
                    path: r
                        .path
                        .as_ref()
                        .map(|p| p.reduce(&format!("{field}.path")))
                        .transpose()?,
                    port: port(r.port, &format!("{field}.port"))?,
                    status_code: r
                        .status_code
                        .map(|c| u16::try_from(c).map_err(|_| format!("{field}.statusCode: {c}")))
                        .transpose()?,
                })
            }
            "URLRewrite" => {
                let r = self
                    .url_rewrite
                    .as_ref()
                    .ok_or_else(|| missing("urlRewrite"))?;
                RouteFilter::Rewrite(Rewrite {
                    hostname: r.hostname.clone(),
                    path: r
                        .path
                        .as_ref()
                        .map(|p| p.reduce(&format!("{field}.urlRewrite.path")))
                        .transpose()?,
                })
            }
            "RequestMirror" => {
                let m = self
                    .request_mirror
                    .as_ref()
                    .ok_or_else(|| missing("requestMirror"))?;
                let percent = match (&m.fraction, m.percent) {
                    (Some(f), _) => Some(100.0 * f.numerator / f.denominator.unwrap_or(100.0)),
                    (None, p) => p,
                };
                RouteFilter::Mirror(Mirror {
                    backend: m
                        .backend_ref
                        .reduce(&format!("{field}.requestMirror.backendRef"))?,
                    percent: percent.filter(|p| p.is_finite()),
                })
            }
            other => RouteFilter::Unsupported(other.to_string()),
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawBackendRef {
    group: Option<String>,
    kind: Option<String>,
    name: String,
    namespace: Option<String>,
    port: Option<i64>,
    weight: Option<i64>,
    filters: Vec<RawFilter>,
}

impl RawBackendRef {
    fn reduce(&self, field: &str) -> Result<BackendRef, String> {
        let weight = match self.weight {
            None => 1,
            Some(w) => u32::try_from(w)
                .ok()
                .filter(|w| *w <= 1_000_000)
                .ok_or_else(|| format!("{field}.weight: {w} is not within 0..=1000000"))?,
        };
        Ok(BackendRef {
            group: self.group.clone().unwrap_or_default(),
            kind: self.kind.clone().unwrap_or_else(|| "Service".to_string()),
            name: self.name.clone(),
            namespace: self.namespace.clone().filter(|n| !n.is_empty()),
            port: port(self.port, &format!("{field}.port"))?,
            weight,
            subset: None,
            filters: self
                .filters
                .iter()
                .enumerate()
                .map(|(i, f)| f.reduce(&format!("{field}.filters[{i}]")))
                .collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(test)]
mod tests;
