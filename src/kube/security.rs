//! `security.istio.io` objects (v1 and v1beta1) as they appear in YAML/JSON, decoded to the
//! reduced [`AuthorizationPolicy`], [`PeerAuthentication`] and [`RequestAuthentication`] of
//! `crate::discovery`.
//!
//! Decoding is lenient where Kubernetes is (missing fields take their defaults; unknown fields
//! are ignored; an unquoted scalar such as `ports: [8080]` is read as its text) and strict where
//! a wrong value would change what is enforced: an unknown `mtls.mode` or a non-numeric
//! `portLevelMtls` key is an error naming the field, as it is for istiod's decoder. An unknown
//! `action` is kept as [`PolicyAction::Unknown`] so the conversion can report it in the status.
//! A JWT rule that Istio's validation refuses, or that Envoy would refuse inside a waypoint's
//! listener (an empty header name, an inline `jwks` it cannot read, a `timeout` that is not a
//! duration), fails the whole RequestAuthentication with the field's path.
//! A missing `metadata.namespace` is `default`; `metadata.name` is required.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::discovery::model::Labels;
use crate::discovery::model::authorization::{
    AuthorizationPolicy, Condition, DRY_RUN_ANNOTATION, Operation, PolicyAction, PolicyRule,
    PolicyTargetRef, REVISION_LABEL, Source,
};
use crate::discovery::model::peer_authentication::{MtlsMode, PeerAuthentication};
use crate::discovery::model::request_authentication::{
    ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication,
};
use crate::kube::objects::{parse, string_map};

const API_VERSIONS: [&str; 2] = ["security.istio.io/v1", "security.istio.io/v1beta1"];

/// Decodes an `AuthorizationPolicy`. The error names the failing field.
pub fn decode_authorization_policy(value: &Value) -> Result<AuthorizationPolicy, String> {
    check_type(value, "AuthorizationPolicy")?;
    let raw: RawAuthorizationPolicy = parse(value)?;
    let meta = raw.metadata;
    let spec = raw.spec;
    let action = match &spec.action {
        None | Some(Value::Null) => PolicyAction::Allow,
        Some(Value::String(s)) => action_named(s),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) => PolicyAction::Allow,
            Some(1) => PolicyAction::Deny,
            Some(2) => PolicyAction::Audit,
            Some(3) => PolicyAction::Custom,
            _ => PolicyAction::Unknown(n.to_string()),
        },
        Some(other) => return Err(format!("spec.action: expected a string, found {other}")),
    };
    Ok(AuthorizationPolicy {
        name: meta.name()?,
        namespace: meta.namespace(),
        generation: meta.generation.unwrap_or_default(),
        revision: meta.labels.get(REVISION_LABEL).map(str::to_string),
        dry_run: meta
            .annotations
            .get(DRY_RUN_ANNOTATION)
            .is_some_and(|v| parse_go_bool(v) == Some(true)),
        selector: spec.selector.map(|s| s.match_labels),
        has_target_refs: spec.target_ref.as_ref().is_some_and(|t| !t.is_null())
            || !spec.target_refs.is_empty(),
        target_refs: match spec.target_ref.as_ref().filter(|t| !t.is_null()) {
            Some(one) => vec![target_ref(one)],
            None => spec.target_refs.iter().map(target_ref).collect(),
        },
        action,
        rules: spec.rules.into_iter().map(RawRule::reduce).collect(),
        creation: meta.creation_timestamp,
    })
}

/// A `PolicyTargetReference`, its string fields read as written (anything else is empty).
fn target_ref(value: &Value) -> PolicyTargetRef {
    let text = |field: &str| {
        value
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    PolicyTargetRef {
        group: text("group"),
        kind: text("kind"),
        name: text("name"),
        namespace: text("namespace"),
    }
}

/// Decodes a `PeerAuthentication`. The error names the failing field.
pub fn decode_peer_authentication(value: &Value) -> Result<PeerAuthentication, String> {
    check_type(value, "PeerAuthentication")?;
    let raw: RawPeerAuthentication = parse(value)?;
    let meta = raw.metadata;
    let spec = raw.spec;
    let mode = parse_mode(spec.mtls.as_ref(), "spec.mtls.mode")?;
    let mut port_level = BTreeMap::new();
    for (key, mtls) in &spec.port_level_mtls {
        let field = format!("spec.portLevelMtls[{key:?}]");
        let port = parse_port_key(key).ok_or_else(|| format!("{field}: not a port number"))?;
        port_level.insert(port, parse_mode(mtls.as_ref(), &format!("{field}.mode"))?);
    }
    Ok(PeerAuthentication {
        name: meta.name()?,
        namespace: meta.namespace(),
        revision: meta.labels.get(REVISION_LABEL).map(str::to_string),
        selector: spec.selector.map(|s| s.match_labels),
        mode,
        port_level,
        creation: meta.creation_timestamp,
    })
}

/// Decodes a `RequestAuthentication`. The error names the failing field.
pub fn decode_request_authentication(value: &Value) -> Result<RequestAuthentication, String> {
    check_type(value, "RequestAuthentication")?;
    let raw: RawRequestAuthentication = parse(value)?;
    let meta = raw.metadata;
    let spec = raw.spec;
    let jwt_rules = spec
        .jwt_rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| rule.reduce(&format!("spec.jwtRules[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(RequestAuthentication {
        name: meta.name()?,
        namespace: meta.namespace(),
        revision: meta.labels.get(REVISION_LABEL).map(str::to_string),
        selector: spec.selector.map(|s| s.match_labels),
        target_refs: match spec.target_ref.as_ref().filter(|t| !t.is_null()) {
            Some(one) => vec![target_ref(one)],
            None => spec.target_refs.iter().map(target_ref).collect(),
        },
        jwt_rules,
        creation: meta.creation_timestamp,
    })
}

fn check_type(value: &Value, kind: &str) -> Result<(), String> {
    let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or("");
    let api_version = field("apiVersion");
    if !API_VERSIONS.contains(&api_version) {
        return Err(format!(
            "apiVersion: {api_version:?} is not security.istio.io/v1 or v1beta1"
        ));
    }
    if field("kind") != kind {
        return Err(format!("kind: {:?} is not {kind}", field("kind")));
    }
    Ok(())
}

fn action_named(name: &str) -> PolicyAction {
    match name {
        "ALLOW" => PolicyAction::Allow,
        "DENY" => PolicyAction::Deny,
        "AUDIT" => PolicyAction::Audit,
        "CUSTOM" => PolicyAction::Custom,
        other => PolicyAction::Unknown(other.to_string()),
    }
}

fn parse_mode(mtls: Option<&RawMtls>, field: &str) -> Result<MtlsMode, String> {
    let Some(mode) = mtls.and_then(|m| m.mode.as_ref()) else {
        return Ok(MtlsMode::Unset);
    };
    match mode {
        Value::Null => Ok(MtlsMode::Unset),
        Value::String(s) => match s.as_str() {
            "UNSET" => Ok(MtlsMode::Unset),
            "DISABLE" => Ok(MtlsMode::Disable),
            "PERMISSIVE" => Ok(MtlsMode::Permissive),
            "STRICT" => Ok(MtlsMode::Strict),
            other => Err(format!(
                "{field}: unknown mode {other:?} (expected UNSET, DISABLE, PERMISSIVE or STRICT)"
            )),
        },
        Value::Number(n) => match n.as_u64() {
            Some(0) => Ok(MtlsMode::Unset),
            Some(1) => Ok(MtlsMode::Disable),
            Some(2) => Ok(MtlsMode::Permissive),
            Some(3) => Ok(MtlsMode::Strict),
            _ => Err(format!("{field}: unknown mode {n}")),
        },
        other => Err(format!("{field}: expected a string, found {other}")),
    }
}

/// A `portLevelMtls` key: a decimal uint32, as Go's JSON map decoding reads it.
fn parse_port_key(key: &str) -> Option<u32> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A list of strings; `null` is empty and unquoted scalars (`8080`) are their text. A nested
/// object or list is an error.
fn string_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let raw: Option<Vec<Scalar>> = Option::deserialize(d)?;
    Ok(raw.unwrap_or_default().into_iter().map(|s| s.0).collect())
}

struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            v @ (Value::Array(_) | Value::Object(_)) => Err(serde::de::Error::custom(format!(
                "expected a string, found {v}"
            ))),
            v => Ok(Scalar(scalar_text(v))),
        }
    }
}

fn scalar_text(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `null` is the default, as a missing field.
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    #[serde(deserialize_with = "string_map")]
    labels: Labels,
    #[serde(deserialize_with = "string_map")]
    annotations: Labels,
    creation_timestamp: Option<String>,
    generation: Option<i64>,
}

impl RawMeta {
    fn name(&self) -> Result<String, String> {
        match self.name.as_deref() {
            Some(name) if !name.is_empty() => Ok(name.to_string()),
            _ => Err("metadata.name is missing".into()),
        }
    }

    fn namespace(&self) -> String {
        match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_string(),
            _ => "default".to_string(),
        }
    }
}

/// `selector`: present (even as `{}`) is `Some`; `matchLabels` may be missing or null.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSelector {
    #[serde(deserialize_with = "string_map")]
    match_labels: Labels,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawAuthorizationPolicy {
    #[serde(deserialize_with = "or_default")]
    metadata: RawMeta,
    #[serde(deserialize_with = "or_default")]
    spec: RawAuthorizationSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawAuthorizationSpec {
    selector: Option<RawSelector>,
    target_ref: Option<Value>,
    #[serde(deserialize_with = "or_default")]
    target_refs: Vec<Value>,
    action: Option<Value>,
    #[serde(deserialize_with = "or_default")]
    rules: Vec<RawRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRule {
    #[serde(deserialize_with = "or_default")]
    from: Vec<RawFrom>,
    #[serde(deserialize_with = "or_default")]
    to: Vec<RawTo>,
    #[serde(deserialize_with = "or_default")]
    when: Vec<RawCondition>,
}

impl RawRule {
    fn reduce(self) -> PolicyRule {
        PolicyRule {
            from: self.from.into_iter().map(|f| f.source.reduce()).collect(),
            to: self.to.into_iter().map(|t| t.operation.reduce()).collect(),
            when: self
                .when
                .into_iter()
                .map(|c| Condition {
                    key: c.key,
                    values: c.values,
                    not_values: c.not_values,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawFrom {
    #[serde(deserialize_with = "or_default")]
    source: RawSource,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawTo {
    #[serde(deserialize_with = "or_default")]
    operation: RawOperation,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSource {
    #[serde(deserialize_with = "string_list")]
    principals: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_principals: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    request_principals: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_request_principals: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    namespaces: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_namespaces: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    service_accounts: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_service_accounts: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    ip_blocks: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_ip_blocks: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    remote_ip_blocks: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_remote_ip_blocks: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    trust_domains: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_trust_domains: Vec<String>,
}

impl RawSource {
    fn reduce(self) -> Source {
        Source {
            principals: self.principals,
            not_principals: self.not_principals,
            request_principals: self.request_principals,
            not_request_principals: self.not_request_principals,
            namespaces: self.namespaces,
            not_namespaces: self.not_namespaces,
            service_accounts: self.service_accounts,
            not_service_accounts: self.not_service_accounts,
            ip_blocks: self.ip_blocks,
            not_ip_blocks: self.not_ip_blocks,
            remote_ip_blocks: self.remote_ip_blocks,
            not_remote_ip_blocks: self.not_remote_ip_blocks,
            trust_domains: self.trust_domains,
            not_trust_domains: self.not_trust_domains,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawOperation {
    #[serde(deserialize_with = "string_list")]
    hosts: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_hosts: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    ports: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_ports: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    methods: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_methods: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    paths: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_paths: Vec<String>,
}

impl RawOperation {
    fn reduce(self) -> Operation {
        Operation {
            hosts: self.hosts,
            not_hosts: self.not_hosts,
            ports: self.ports,
            not_ports: self.not_ports,
            methods: self.methods,
            not_methods: self.not_methods,
            paths: self.paths,
            not_paths: self.not_paths,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawCondition {
    #[serde(deserialize_with = "or_default")]
    key: String,
    #[serde(deserialize_with = "string_list")]
    values: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    not_values: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRequestAuthentication {
    #[serde(deserialize_with = "or_default")]
    metadata: RawMeta,
    #[serde(deserialize_with = "or_default")]
    spec: RawRequestAuthenticationSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRequestAuthenticationSpec {
    selector: Option<RawSelector>,
    target_ref: Option<Value>,
    #[serde(deserialize_with = "or_default")]
    target_refs: Vec<Value>,
    #[serde(deserialize_with = "or_default")]
    jwt_rules: Vec<RawJwtRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawJwtRule {
    #[serde(deserialize_with = "or_default")]
    issuer: String,
    #[serde(deserialize_with = "string_list")]
    audiences: Vec<String>,
    #[serde(deserialize_with = "or_default")]
    jwks_uri: String,
    #[serde(deserialize_with = "or_default")]
    jwks: String,
    #[serde(deserialize_with = "or_default")]
    from_headers: Vec<RawJwtHeader>,
    #[serde(deserialize_with = "string_list")]
    from_params: Vec<String>,
    #[serde(deserialize_with = "string_list")]
    from_cookies: Vec<String>,
    #[serde(deserialize_with = "or_default")]
    output_payload_to_header: String,
    #[serde(deserialize_with = "or_default")]
    forward_original_token: bool,
    #[serde(deserialize_with = "or_default")]
    output_claim_to_headers: Vec<RawClaimToHeader>,
    timeout: Option<String>,
    #[serde(deserialize_with = "string_list")]
    space_delimited_claims: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawJwtHeader {
    #[serde(deserialize_with = "or_default")]
    name: String,
    #[serde(deserialize_with = "or_default")]
    prefix: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawClaimToHeader {
    #[serde(deserialize_with = "or_default")]
    header: String,
    #[serde(deserialize_with = "or_default")]
    claim: String,
}

impl RawJwtRule {
    /// The rule, or why Istio's validation (`validateJwtRule`) or Envoy would refuse it.
    fn reduce(self, field: &str) -> Result<JwtRule, String> {
        if self.issuer.is_empty() && self.jwks_uri.is_empty() {
            return Err(format!("{field}: issuer or jwksUri must be set"));
        }
        if let Some(at) = self.audiences.iter().position(String::is_empty) {
            return Err(format!("{field}.audiences[{at}]: empty"));
        }
        if !self.jwks_uri.is_empty() && !is_http_uri(&self.jwks_uri) {
            return Err(format!(
                "{field}.jwksUri: {:?} is not an http or https URI",
                self.jwks_uri
            ));
        }
        for (i, header) in self.from_headers.iter().enumerate() {
            if !is_header_name(&header.name) {
                return Err(format!(
                    "{field}.fromHeaders[{i}].name: {:?} is not a header name",
                    header.name
                ));
            }
            if !is_header_value(&header.prefix) {
                return Err(format!(
                    "{field}.fromHeaders[{i}].prefix: not a header value"
                ));
            }
        }
        if let Some(at) = self.from_params.iter().position(String::is_empty) {
            return Err(format!("{field}.fromParams[{at}]: empty"));
        }
        if let Some(at) = self.from_cookies.iter().position(String::is_empty) {
            return Err(format!("{field}.fromCookies[{at}]: empty"));
        }
        if !self.output_payload_to_header.is_empty()
            && !is_header_name(&self.output_payload_to_header)
        {
            return Err(format!(
                "{field}.outputPayloadToHeader: {:?} is not a header name",
                self.output_payload_to_header
            ));
        }
        for (i, pair) in self.output_claim_to_headers.iter().enumerate() {
            if pair.claim.is_empty() || !is_header_name(&pair.header) {
                return Err(format!(
                    "{field}.outputClaimToHeaders[{i}]: needs a claim and a header name"
                ));
            }
        }
        if !self.jwks.is_empty() {
            crate::waypoint::check_key_set(&self.jwks)
                .map_err(|reason| format!("{field}.jwks: {reason}"))?;
        }
        let timeout_ms = match self.timeout.as_deref() {
            None => None,
            Some(text) => Some(proto_duration_ms(text).ok_or_else(|| {
                format!("{field}.timeout: {text:?} is not a duration such as 5s or 1.5s")
            })?),
        };
        Ok(JwtRule {
            issuer: self.issuer,
            audiences: self.audiences,
            jwks_uri: self.jwks_uri,
            jwks: self.jwks,
            from_headers: self
                .from_headers
                .into_iter()
                .map(|h| JwtHeader {
                    name: h.name,
                    prefix: h.prefix,
                })
                .collect(),
            from_params: self.from_params,
            from_cookies: self.from_cookies,
            output_payload_to_header: self.output_payload_to_header,
            forward_original_token: self.forward_original_token,
            output_claim_to_headers: self
                .output_claim_to_headers
                .into_iter()
                .map(|c| ClaimToHeader {
                    header: c.header,
                    claim: c.claim,
                })
                .collect(),
            timeout_ms,
            space_delimited_claims: self.space_delimited_claims,
        })
    }
}

/// `http://host...` or `https://host...` (istiod's `ParseJwksURI` takes only these).
fn is_http_uri(uri: &str) -> bool {
    let rest = uri
        .strip_prefix("https://")
        .or_else(|| uri.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/') && !r.contains(char::is_whitespace))
}

/// A header name Envoy accepts (its `HTTP_HEADER_NAME` rule, not strict): not empty, and no
/// NUL, CR, LF or ':' after the first character.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(['\0', '\r', '\n'])
        && !name.get(1..).is_some_and(|rest| rest.contains(':'))
}

/// A header value Envoy accepts (`HTTP_HEADER_VALUE`, not strict): no NUL, CR or LF.
fn is_header_value(value: &str) -> bool {
    !value.contains(['\0', '\r', '\n'])
}

/// A protobuf JSON duration (`5s`, `1.5s`, `0.100s`) in milliseconds.
fn proto_duration_ms(text: &str) -> Option<u64> {
    let seconds: f64 = text.strip_suffix('s')?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).round() as u64)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPeerAuthentication {
    #[serde(deserialize_with = "or_default")]
    metadata: RawMeta,
    #[serde(deserialize_with = "or_default")]
    spec: RawPeerAuthenticationSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawPeerAuthenticationSpec {
    selector: Option<RawSelector>,
    mtls: Option<RawMtls>,
    #[serde(deserialize_with = "or_default")]
    port_level_mtls: BTreeMap<String, Option<RawMtls>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawMtls {
    mode: Option<Value>,
}

#[cfg(test)]
mod tests;
