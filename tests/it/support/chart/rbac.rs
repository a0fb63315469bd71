//! A small RBAC authorizer over the chart's rendered objects: would the API server let the
//! chart's ServiceAccount make this call? Follows Kubernetes' RBAC rules: a ClusterRole bound
//! by a ClusterRoleBinding applies in every namespace and to cluster-scoped calls; a Role, or
//! a ClusterRole, bound by a RoleBinding applies in that binding's namespace only; `*` matches
//! anything; `resource/subresource` must be named as such; `resourceNames` allow only calls
//! naming one of them (so never a create, nor a list or watch without a name; a list or watch
//! with a `metadata.name=` field selector names its object, as the API server's RequestInfo
//! takes it).
//!
//! The input is deliberately flat (verb, group, resource, subresource, namespace, name), the
//! shape of one line of an API server's request log, so a recorded log can be fed to it.

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};

use super::Object;

/// One API call, as the authorizer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiCall<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: &'a str,
    /// API group; `""` for the core group.
    pub group: &'a str,
    /// The plural resource, such as `pods`.
    pub resource: &'a str,
    /// Such as `status`.
    pub subresource: Option<&'a str>,
    /// `None` for a cluster-scoped call, or a namespaced kind listed across all namespaces.
    pub namespace: Option<&'a str>,
    /// The object's name, when the call names one.
    pub name: Option<&'a str>,
}

impl<'a> ApiCall<'a> {
    pub fn new(verb: &'a str, group: &'a str, resource: &'a str) -> Self {
        ApiCall {
            verb,
            group,
            resource,
            subresource: None,
            namespace: None,
            name: None,
        }
    }

    pub fn sub(self, subresource: &'a str) -> Self {
        ApiCall {
            subresource: Some(subresource),
            ..self
        }
    }

    pub fn ns(self, namespace: &'a str) -> Self {
        ApiCall {
            namespace: Some(namespace),
            ..self
        }
    }

    pub fn named(self, name: &'a str) -> Self {
        ApiCall {
            name: Some(name),
            ..self
        }
    }
}

/// Whether the rendered chart's ServiceAccount (there must be exactly one) may make `call`.
pub fn rbac_allows(objects: &[Object], call: &ApiCall) -> bool {
    let mut accounts = objects.iter().filter_map(|o| match o {
        Object::ServiceAccount(a) => Some(a),
        _ => None,
    });
    let account = accounts.next().expect("a ServiceAccount");
    assert!(accounts.next().is_none(), "one ServiceAccount");
    let name = account
        .metadata
        .name
        .as_deref()
        .expect("ServiceAccount name");
    let namespace = account
        .metadata
        .namespace
        .as_deref()
        .expect("ServiceAccount namespace");
    let is_us = |subjects: &Option<Vec<Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == name
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    for object in objects {
        let (role_ref, binding_namespace) = match object {
            Object::ClusterRoleBinding(b) if is_us(&b.subjects) => (&b.role_ref, None),
            Object::RoleBinding(b) if is_us(&b.subjects) => (
                &b.role_ref,
                Some(
                    b.metadata
                        .namespace
                        .as_deref()
                        .expect("RoleBinding namespace"),
                ),
            ),
            _ => continue,
        };
        // A RoleBinding grants only within its namespace.
        if binding_namespace.is_some() && call.namespace != binding_namespace {
            continue;
        }
        if rules(objects, role_ref, binding_namespace)
            .iter()
            .any(|rule| rule_allows(rule, call))
        {
            return true;
        }
    }
    false
}

/// The rules a binding's roleRef points at (none when the role is not rendered).
fn rules<'o>(
    objects: &'o [Object],
    role_ref: &RoleRef,
    namespace: Option<&str>,
) -> Vec<&'o PolicyRule> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::ClusterRole(r)
                if role_ref.kind == "ClusterRole"
                    && r.metadata.name.as_deref() == Some(&role_ref.name) =>
            {
                r.rules.as_ref()
            }
            Object::Role(r)
                if role_ref.kind == "Role"
                    && r.metadata.name.as_deref() == Some(&role_ref.name)
                    && r.metadata.namespace.as_deref() == namespace =>
            {
                r.rules.as_ref()
            }
            _ => None,
        })
        .flatten()
        .collect()
}

fn rule_allows(rule: &PolicyRule, call: &ApiCall) -> bool {
    let any = |list: &Option<Vec<String>>, wanted: &str| {
        list.iter().flatten().any(|v| v == "*" || v == wanted)
    };
    let resource_matches = rule
        .resources
        .iter()
        .flatten()
        .any(|r| match call.subresource {
            None => r == "*" || r == call.resource,
            Some(sub) => {
                r == "*"
                    || *r == format!("{}/{sub}", call.resource)
                    || *r == format!("*/{sub}")
                    || *r == format!("{}/*", call.resource)
            }
        });
    let names_match = match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => call
            .name
            .is_some_and(|n| names.iter().any(|allowed| allowed == n)),
    };
    any(&Some(rule.verbs.clone()), call.verb)
        && any(&rule.api_groups, call.group)
        && resource_matches
        && names_match
}
