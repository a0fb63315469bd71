//! The fake's request log: each request as received ([`Request`]) and as RBAC sees it
//! ([`ApiCall`]), and injected failures.

use std::fmt;

use super::*;

/// One request the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    pub content_type: Option<String>,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.query.is_empty() {
            write!(f, "{} {}", self.method, self.path)
        } else {
            write!(f, "{} {}?{}", self.method, self.path, self.query)
        }
    }
}

/// A request as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiCall {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// `""` for the core group.
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    /// `None` for cluster-scoped resources and for lists across all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in {ns}"),
            None => write!(f, " (cluster)"),
        }
    }
}

impl Request {
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }

    /// The query parameter `key`, if present.
    pub fn param(&self, key: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == key).then(|| v.to_string())
        })
    }

    /// The query parameter `key`, percent-decoded (`+` is a space).
    pub fn decoded_param(&self, key: &str) -> Option<String> {
        let raw = self.param(key)?.replace('+', " ");
        let bytes = raw.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match (bytes[i], hex) {
                (b'%', Some(byte)) => {
                    out.push(byte);
                    i += 3;
                }
                (byte, _) => {
                    out.push(byte);
                    i += 1;
                }
            }
        }
        Some(String::from_utf8_lossy(&out).into_owned())
    }

    /// What RBAC would authorize for this request; `None` outside `/api` and `/apis`. As the
    /// API server's RequestInfo does, a list or watch whose field selector requires
    /// `metadata.name` to equal a value is authorized as a call naming that object (so a rule
    /// with `resourceNames` can allow it).
    pub fn api_call(&self) -> Option<ApiCall> {
        let parts: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] => (String::new(), rest),
            ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
            _ => return None,
        };
        // `namespaces/NS/PLURAL...` is namespaced unless PLURAL is a Namespace subresource.
        let (namespace, tail) = match rest {
            ["namespaces", ns, plural, tail @ ..]
                if *plural != "status" && *plural != "finalize" =>
            {
                (Some(ns.to_string()), [&[*plural][..], tail].concat())
            }
            other => (None, other.to_vec()),
        };
        let resource = tail.first()?.to_string();
        let name = tail.get(1).map(|s| s.to_string());
        let subresource = tail.get(2).map(|s| s.to_string());
        let watching = matches!(self.param("watch").as_deref(), Some("true" | "1"));
        let verb = match (self.method.as_str(), &name) {
            ("GET", Some(_)) => "get",
            ("GET", None) if watching => "watch",
            ("GET", None) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", Some(_)) => "delete",
            ("DELETE", None) => "deletecollection",
            _ => return None,
        };
        let name = match verb {
            "list" | "watch" => self.decoded_param("fieldSelector").and_then(|selector| {
                selector.split(',').find_map(|term| {
                    let (field, value) = term
                        .split_once("==")
                        .or_else(|| term.split_once('='))
                        .filter(|(field, _)| !field.ends_with('!'))?;
                    (field == "metadata.name").then(|| value.to_string())
                })
            }),
            _ => name,
        };
        Some(ApiCall {
            verb: verb.into(),
            group,
            resource,
            subresource,
            namespace,
            name,
        })
    }
}

/// Requests matching `method` on `plural` fail with `code`, `remaining` more times.
pub(super) struct Failure {
    method: String,
    plural: String,
    remaining: usize,
    code: u16,
}

impl FakeState {
    /// Consumes an injected failure matching `request`, if any.
    pub(super) fn take_failure(&mut self, request: &Request) -> Option<u16> {
        let call = request.api_call()?;
        let failure = self
            .failures
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == request.method && f.plural == call.resource)?;
        failure.remaining -= 1;
        Some(failure.code)
    }
}

impl FakeApiServer {
    /// The next `count` requests with `method` (GET, POST, PUT, PATCH, DELETE) on resource
    /// `plural` answer `code` (a 500, say) without effect.
    pub fn fail_requests(&self, method: &str, plural: &str, count: usize, code: u16) {
        self.shared.lock().failures.push(Failure {
            method: method.to_string(),
            plural: plural.to_string(),
            remaining: count,
            code,
        });
    }
}
