//! VirtualServices (`networking.istio.io` `v1`, `v1beta1`, `v1alpha3`), decoded into the
//! Gateway API [`Route`] model (`RouteKind::Virtual`) so that the waypoint's route
//! translation (`waypoint::routes`) does the work for both (istiod itself converts Gateway
//! API routes to VirtualServices and translates only those).
//!
//! Only the `http` routes are read, and what a waypoint does with them is decided here:
//!
//! * `hosts`, `gateways`, `exportTo` go to [`Route::hostnames`], [`Route::gateways`] and
//!   [`Route::export_to`]; the waypoint picks the mesh VirtualServices for a bound service.
//! * A match clause with `sourceLabels` is dropped (a waypoint cannot know the source, istio
//!   issue 51565); a rule whose matches were all dropped is dropped, since without matches
//!   it would be a catch-all.
//! * `uri` exact / prefix / regex (the prefix is a plain string prefix, [`PathMatch::RawPrefix`]),
//!   `headers` and `queryParams` exact / prefix / regex, `method` (exact; prefix or regex as
//!   a `:method` header match), `port`.
//! * `route[].destination` `{host, subset, port.number}`: a short name (no dot) is a Service
//!   of the VirtualService's namespace, `<name>.<ns>.svc.<domain>` a Service, anything else a
//!   ServiceEntry host (looked up in the VirtualService's namespace). A lone destination
//!   takes all traffic; several are weighted by `weight`. `headers` on the rule and on each
//!   destination.
//! * `redirect` `{uri, authority, redirectCode}`, `rewrite` `{uri, authority}`, `timeout`,
//!   `retries` `{attempts, perTryTimeout, retryOn}`, `mirror` with `mirrorPercentage`.
//! * Left out: `tcp` and `tls` routes, `fault`, `corsPolicy`, `directResponse`, `delegate`,
//!   `mirrors`, `match.authority`, `match.ignoreUriCase`, `match.withoutHeaders`,
//!   `rewrite.uriRegexRewrite`, `redirect.port`/`scheme`; they are ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::discovery::model::{
    BackendRef, HeaderFilter, Mirror, Object, PathMatch, PathModifier, Redirect, Retry, Rewrite,
    Route, RouteFilter, RouteKind, RouteMatch, RouteRule, ValueMatch,
};
use crate::kube::destination_rule::parse_go_duration;
use crate::kube::objects::{RawMeta, parse, port_number};

/// Decodes a `VirtualService`. The error names the failing field.
pub(crate) fn virtual_service(value: &Value) -> Result<Object, String> {
    decode(value).map(Object::VirtualService)
}

fn decode(value: &Value) -> Result<Route, String> {
    let raw: RawVirtualService = parse(value)?;
    let namespace = raw.metadata.namespace();
    let mut rules = Vec::new();
    for (i, http) in raw.spec.http.into_iter().enumerate() {
        if let Some(rule) = http.reduce(&format!("spec.http[{i}]"))? {
            rules.push(rule);
        }
    }
    Ok(Route {
        kind: RouteKind::Virtual,
        name: raw.metadata.name()?,
        generation: raw.metadata.generation.unwrap_or_default(),
        creation: raw
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(Value::as_str)
            .map(str::to_string),
        hostnames: raw.spec.hosts,
        parent_refs: Vec::new(),
        rules,
        gateways: raw.spec.gateways,
        export_to: raw.spec.export_to,
        namespace,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawVirtualService {
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawSpec {
    hosts: Vec<String>,
    gateways: Vec<String>,
    export_to: Vec<String>,
    http: Vec<RawHttp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawHttp {
    name: Option<String>,
    #[serde(rename = "match")]
    matches: Vec<RawMatch>,
    route: Vec<RawDestination>,
    redirect: Option<RawRedirect>,
    rewrite: Option<RawRewrite>,
    timeout: Option<String>,
    retries: Option<RawRetries>,
    headers: Option<RawHeaders>,
    mirror: Option<RawTarget>,
    mirror_percentage: Option<RawPercent>,
}

/// A `StringMatch`: one of `exact`, `prefix`, `regex`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawString {
    exact: Option<String>,
    prefix: Option<String>,
    regex: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawMatch {
    uri: Option<RawString>,
    headers: BTreeMap<String, RawString>,
    query_params: BTreeMap<String, RawString>,
    method: Option<RawString>,
    port: Option<i64>,
    source_labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawTarget {
    host: String,
    subset: Option<String>,
    port: Option<RawPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPort {
    number: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawDestination {
    destination: RawTarget,
    weight: Option<i64>,
    headers: Option<RawHeaders>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawHeaders {
    request: Option<RawHeaderOps>,
    response: Option<RawHeaderOps>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawHeaderOps {
    set: BTreeMap<String, String>,
    add: BTreeMap<String, String>,
    remove: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawRedirect {
    uri: Option<String>,
    authority: Option<String>,
    redirect_code: Option<u16>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRewrite {
    uri: Option<String>,
    authority: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawRetries {
    attempts: Option<i64>,
    per_try_timeout: Option<String>,
    retry_on: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPercent {
    value: Option<f64>,
}

fn duration(text: &str, field: &str) -> Result<Duration, String> {
    parse_go_duration(text).ok_or_else(|| format!("{field}: {text:?} is not a duration"))
}

fn port(value: Option<i64>, field: &str) -> Result<Option<u16>, String> {
    value.map(|p| port_number(p, field)).transpose()
}

impl RawString {
    /// `(value, regex, prefix)`, or `None` when empty.
    fn reduce(&self, field: &str) -> Result<Option<(String, bool, bool)>, String> {
        match (&self.exact, &self.prefix, &self.regex) {
            (Some(v), None, None) => Ok(Some((v.clone(), false, false))),
            (None, Some(v), None) => Ok(Some((v.clone(), false, true))),
            (None, None, Some(v)) => Ok(Some((v.clone(), true, false))),
            (None, None, None) => Ok(None),
            _ => Err(format!("{field}: exactly one of exact, prefix, regex")),
        }
    }

    fn value_match(&self, name: &str, field: &str) -> Result<Option<ValueMatch>, String> {
        Ok(self
            .reduce(field)?
            .map(|(value, regex, prefix)| ValueMatch {
                name: name.to_string(),
                value,
                regex,
                prefix,
            }))
    }
}

impl RawMatch {
    fn reduce(&self, field: &str) -> Result<RouteMatch, String> {
        let mut out = RouteMatch {
            port: port(self.port, &format!("{field}.port"))?,
            ..RouteMatch::default()
        };
        if let Some(uri) = &self.uri {
            out.path = uri
                .reduce(&format!("{field}.uri"))?
                .map(|(v, regex, prefix)| match (regex, prefix) {
                    (true, _) => PathMatch::Regex(v),
                    (_, true) => PathMatch::RawPrefix(v),
                    _ => PathMatch::Exact(v),
                });
        }
        for (name, m) in &self.headers {
            if let Some(v) = m.value_match(name, &format!("{field}.headers.{name}"))? {
                out.headers.push(v);
            }
        }
        for (name, m) in &self.query_params {
            if let Some(v) = m.value_match(name, &format!("{field}.queryParams.{name}"))? {
                out.query_params.push(v);
            }
        }
        if let Some(method) = &self.method {
            match method.value_match(":method", &format!("{field}.method"))? {
                Some(ValueMatch {
                    value,
                    regex: false,
                    prefix: false,
                    ..
                }) => out.method = Some(value),
                Some(other) => out.headers.push(other),
                None => {}
            }
        }
        Ok(out)
    }
}

impl RawTarget {
    /// A destination as a backend: a Service by short name or `<name>.<ns>.svc.*`, else a
    /// ServiceEntry host.
    fn backend(&self, weight: u32, field: &str) -> Result<BackendRef, String> {
        if self.host.is_empty() {
            return Err(format!("{field}.host is missing"));
        }
        let parts: Vec<&str> = self.host.split('.').collect();
        let (group, kind, name, namespace) = match parts.as_slice() {
            [name] => ("", "Service", name.to_string(), None),
            [name, ns, "svc", ..] => ("", "Service", name.to_string(), Some(ns.to_string())),
            _ => ("networking.istio.io", "Hostname", self.host.clone(), None),
        };
        Ok(BackendRef {
            group: group.into(),
            kind: kind.into(),
            name,
            namespace,
            port: port(
                self.port.as_ref().and_then(|p| p.number),
                &format!("{field}.port.number"),
            )?,
            weight,
            subset: self.subset.clone().filter(|s| !s.is_empty()),
            filters: Vec::new(),
        })
    }
}

impl RawHeaders {
    fn filters(&self) -> Vec<RouteFilter> {
        let ops = |o: &RawHeaderOps| HeaderFilter {
            set: o.set.clone().into_iter().collect(),
            add: o.add.clone().into_iter().collect(),
            remove: o.remove.clone(),
        };
        let mut out = Vec::new();
        if let Some(r) = &self.request {
            out.push(RouteFilter::RequestHeaders(ops(r)));
        }
        if let Some(r) = &self.response {
            out.push(RouteFilter::ResponseHeaders(ops(r)));
        }
        out
    }
}

impl RawHttp {
    /// The rule, or `None` when every match clause had `sourceLabels`.
    fn reduce(self, field: &str) -> Result<Option<RouteRule>, String> {
        let mut matches = Vec::new();
        for (i, m) in self.matches.iter().enumerate() {
            if !m.source_labels.is_empty() {
                continue;
            }
            matches.push(m.reduce(&format!("{field}.match[{i}]"))?);
        }
        if !self.matches.is_empty() && matches.is_empty() {
            return Ok(None);
        }
        let lone = self.route.len() == 1;
        let mut backends = Vec::new();
        for (i, d) in self.route.iter().enumerate() {
            let f = format!("{field}.route[{i}]");
            let weight = if lone {
                1
            } else {
                let w = d.weight.unwrap_or_default();
                u32::try_from(w).map_err(|_| format!("{f}.weight: {w} is not a weight"))?
            };
            let mut backend = d.destination.backend(weight, &format!("{f}.destination"))?;
            backend.filters = d
                .headers
                .as_ref()
                .map(RawHeaders::filters)
                .unwrap_or_default();
            backends.push(backend);
        }
        let mut filters = self
            .headers
            .as_ref()
            .map(RawHeaders::filters)
            .unwrap_or_default();
        if let Some(r) = &self.redirect {
            filters.push(RouteFilter::Redirect(Redirect {
                hostname: r.authority.clone().filter(|a| !a.is_empty()),
                path: r
                    .uri
                    .clone()
                    .filter(|u| !u.is_empty())
                    .map(PathModifier::Full),
                status_code: r.redirect_code.filter(|c| *c != 0),
                ..Default::default()
            }));
        }
        if let Some(r) = &self.rewrite {
            filters.push(RouteFilter::Rewrite(Rewrite {
                hostname: r.authority.clone().filter(|a| !a.is_empty()),
                path: r
                    .uri
                    .clone()
                    .filter(|u| !u.is_empty())
                    .map(PathModifier::RawPrefix),
            }));
        }
        if let Some(m) = &self.mirror {
            filters.push(RouteFilter::Mirror(Mirror {
                backend: m.backend(1, &format!("{field}.mirror"))?,
                percent: self.mirror_percentage.as_ref().and_then(|p| p.value),
            }));
        }
        let mut retry = None;
        let mut per_try = None;
        if let Some(r) = &self.retries {
            let attempts = r.attempts.unwrap_or_default();
            let (conditions, codes) = retry_on(r.retry_on.as_deref().unwrap_or_default());
            retry = Some(Retry {
                attempts: Some(u32::try_from(attempts).unwrap_or_default()),
                backoff: None,
                codes,
                retry_on: Some(conditions),
            });
            per_try = r
                .per_try_timeout
                .as_deref()
                .map(|t| duration(t, &format!("{field}.retries.perTryTimeout")))
                .transpose()?;
        }
        Ok(Some(RouteRule {
            // istiod names a VirtualService route by the rule's name, empty when unset.
            name: Some(self.name.unwrap_or_default()),
            matches,
            filters,
            backends,
            request_timeout: self
                .timeout
                .as_deref()
                .map(|t| duration(t, &format!("{field}.timeout")))
                .transpose()?,
            backend_request_timeout: per_try,
            retry,
        }))
    }
}

/// `retryOn` split into Envoy conditions and status codes (istiod's `parseRetryOn`).
fn retry_on(text: &str) -> (String, Vec<u32>) {
    let mut conditions = Vec::new();
    let mut codes = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) => codes.push(code),
            Err(_) => conditions.push(part),
        }
    }
    (conditions.join(","), codes)
}

#[cfg(test)]
mod tests;
