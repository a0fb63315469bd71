//! The kinds ambientd watches, and the turn of a watched object into what the manifests source
//! would have produced from the same object: its JSON text through [`objects::decode_json`].

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, Resource};
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::discovery::model::{Kind, Object, ObjectRef};
use crate::kube::objects::{self, ObjectError};

/// How one kind is watched.
#[derive(Clone, Debug)]
pub struct WatchedKind {
    pub kind: Kind,
    pub resource: ApiResource,
    /// Server-side field selector (Pods skip `Failed`, as istiod's informer does).
    pub field_selector: Option<&'static str>,
    /// Defined by a CRD that may be missing: a 404 means "none yet", not an error.
    pub crd: bool,
}

impl WatchedKind {
    /// Whether objects of this kind live in namespaces (and so pass the discovery filter).
    pub fn namespaced(&self) -> bool {
        self.kind.namespaced()
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// Every watched kind, in [`Kind::ALL`] order.
pub fn watched_kinds() -> Vec<WatchedKind> {
    let core = |kind, name, plural| WatchedKind {
        kind,
        resource: resource("", "v1", name, plural),
        field_selector: None,
        crd: false,
    };
    let crd = |kind, group, name, plural| WatchedKind {
        kind,
        resource: resource(group, "v1", name, plural),
        field_selector: None,
        crd: true,
    };
    let all = vec![
        core(Kind::Namespace, "Namespace", "namespaces"),
        core(Kind::Node, "Node", "nodes"),
        crd(
            Kind::GatewayClass,
            "gateway.networking.k8s.io",
            "GatewayClass",
            "gatewayclasses",
        ),
        crd(
            Kind::Gateway,
            "gateway.networking.k8s.io",
            "Gateway",
            "gateways",
        ),
        core(Kind::Service, "Service", "services"),
        crd(
            Kind::ServiceEntry,
            "networking.istio.io",
            "ServiceEntry",
            "serviceentries",
        ),
        WatchedKind {
            kind: Kind::EndpointSlice,
            resource: resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
            field_selector: None,
            crd: false,
        },
        crd(
            Kind::WorkloadEntry,
            "networking.istio.io",
            "WorkloadEntry",
            "workloadentries",
        ),
        WatchedKind {
            field_selector: Some("status.phase!=Failed"),
            ..core(Kind::Pod, "Pod", "pods")
        },
        crd(
            Kind::AuthorizationPolicy,
            "security.istio.io",
            "AuthorizationPolicy",
            "authorizationpolicies",
        ),
        crd(
            Kind::PeerAuthentication,
            "security.istio.io",
            "PeerAuthentication",
            "peerauthentications",
        ),
        crd(
            Kind::DestinationRule,
            "networking.istio.io",
            "DestinationRule",
            "destinationrules",
        ),
        crd(
            Kind::RequestAuthentication,
            "security.istio.io",
            "RequestAuthentication",
            "requestauthentications",
        ),
        crd(
            Kind::HttpRoute,
            "gateway.networking.k8s.io",
            "HTTPRoute",
            "httproutes",
        ),
        crd(
            Kind::GrpcRoute,
            "gateway.networking.k8s.io",
            "GRPCRoute",
            "grpcroutes",
        ),
        crd(
            Kind::VirtualService,
            "networking.istio.io",
            "VirtualService",
            "virtualservices",
        ),
    ];
    debug_assert!(all.iter().map(|w| w.kind).eq(Kind::ALL));
    all
}

/// What the watcher deserialises: the object as the JSON text the API server sent, except
/// `apiVersion`, `kind` (the watched kind says them) and `metadata.managedFields` (never read,
/// and often the largest part of an object), which are skipped while parsing. The few metadata
/// fields the watcher itself needs (resourceVersion, name, namespace, uid) are copied into
/// `metadata`.
///
/// Parsing only finds the boundaries of each top-level value (serde_json's `RawValue`) and
/// copies their bytes: no tree of values is built, so a malformed field cannot fail the parse
/// of a list or a watch stream. [`reduce`] then decodes the text straight into the kind's slim
/// structs, with the failing field's path in the error.
///
/// This relies on being parsed by serde_json directly, as kube parses list items and watch
/// events (`type` before `object`, as API servers send them); through a buffering
/// deserializer (serde's `flatten` or untagged enums) `RawValue` is refused.
#[derive(Clone, Debug, Default)]
pub struct WatchedObject {
    metadata: ObjectMeta,
    json: String,
}

impl WatchedObject {
    /// Reads an object from its JSON value (tests).
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_str(&value.to_string())
    }

    /// The object's JSON text, without `apiVersion`, `kind` and `metadata.managedFields`.
    pub fn json(&self) -> &str {
        &self.json
    }
}

impl Resource for WatchedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for WatchedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor)
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = WatchedObject;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WatchedObject, A::Error> {
        let mut object = WatchedObject {
            metadata: ObjectMeta::default(),
            json: String::with_capacity(2048),
        };
        object.json.push('{');
        while let Some(key) = map.next_key::<String>()? {
            match &*key {
                "apiVersion" | "kind" => {
                    map.next_value::<IgnoredAny>()?;
                }
                "metadata" => {
                    push_key(&mut object.json, &key);
                    map.next_value_seed(MetadataSeed {
                        json: &mut object.json,
                        meta: &mut object.metadata,
                    })?;
                }
                _ => {
                    let raw = map.next_value::<Box<RawValue>>()?;
                    push_key(&mut object.json, &key);
                    object.json.push_str(raw.get());
                }
            }
        }
        object.json.push('}');
        Ok(object)
    }
}

/// Appends `"key":` (after a comma unless it is the first entry of an object).
fn push_key(json: &mut String, key: &str) {
    if !json.ends_with('{') {
        json.push(',');
    }
    if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        json.push('"');
        json.push_str(key);
        json.push('"');
    } else {
        json.push_str(&Value::from(key).to_string());
    }
    json.push(':');
}

/// `metadata` without `managedFields`, appended to the object's text; the fields the watcher
/// needs are copied into `meta`.
struct MetadataSeed<'a> {
    json: &'a mut String,
    meta: &'a mut ObjectMeta,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.json.push_str("null");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.json.push('{');
        while let Some(key) = map.next_key::<String>()? {
            if key == "managedFields" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let raw = map.next_value::<Box<RawValue>>()?;
            let text = || serde_json::from_str::<String>(raw.get()).ok();
            match &*key {
                "name" => self.meta.name = text(),
                "namespace" => self.meta.namespace = text(),
                "resourceVersion" => self.meta.resource_version = text(),
                "uid" => self.meta.uid = text(),
                _ => {}
            }
            push_key(self.json, &key);
            self.json.push_str(raw.get());
        }
        self.json.push('}');
        Ok(())
    }
}

/// What one watched object reduces to.
#[allow(clippy::large_enum_variant)] // short-lived, consumed right away
#[derive(Debug)]
pub enum Reduced {
    Object(Object),
    /// Logged and treated as absent.
    Invalid(ObjectRef, ObjectError),
}

/// The object's reference, from its metadata alone (for deletes and invalid objects).
pub fn object_ref(watched: &WatchedKind, object: &WatchedObject) -> ObjectRef {
    let namespace = if watched.namespaced() {
        match object.metadata.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_string(),
            _ => "default".to_string(),
        }
    } else {
        String::new()
    };
    ObjectRef::new(
        watched.kind,
        namespace,
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// Reduces a watched object exactly as the manifests source reduces the same object.
pub fn reduce(watched: &WatchedKind, object: WatchedObject) -> Reduced {
    let reference = object_ref(watched, &object);
    let resource = &watched.resource;
    let invalid = |reason: String| ObjectError {
        kind: resource.kind.clone(),
        name: reference.to_string(),
        reason,
    };
    match objects::decode_json(&resource.api_version, &resource.kind, &object.json) {
        Some(Ok(object)) if object.kind() == watched.kind => Reduced::Object(object),
        Some(Ok(other)) => {
            let error = invalid(format!("decoded as a {}", other.kind()));
            Reduced::Invalid(reference, error)
        }
        Some(Err(reason)) => {
            let error = invalid(reason);
            Reduced::Invalid(reference, error)
        }
        None => {
            let error = invalid("not a kind ambientd reads".into());
            Reduced::Invalid(reference, error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::objects::Decoded;
    use serde_json::json;

    fn dynamic(value: Value) -> WatchedObject {
        serde_json::from_str(&value.to_string()).unwrap()
    }

    #[test]
    fn a_list_item_without_type_fields_reduces_like_the_manifest() {
        let pods = &watched_kinds()[8];
        assert_eq!(pods.kind, Kind::Pod);
        let raw = json!({
            "metadata": {
                "name": "web-1", "namespace": "demo", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "r", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"serviceAccountName": "web", "nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
        });
        let Reduced::Object(from_watch) = reduce(pods, dynamic(raw.clone())) else {
            panic!("invalid")
        };
        let mut manifest = raw;
        manifest["apiVersion"] = json!("v1");
        manifest["kind"] = json!("Pod");
        let from_manifest = match objects::decode(manifest).remove(0) {
            Decoded::Object(o) => o,
            other => panic!("{other:?}"),
        };
        assert_eq!(from_watch, from_manifest);
    }

    #[test]
    fn an_invalid_object_keeps_its_reference() {
        let services = &watched_kinds()[4];
        let raw = json!({"metadata": {"name": "s", "namespace": "n"}, "spec": {"ports": [{"port": 70000}]}});
        let Reduced::Invalid(reference, error) = reduce(services, dynamic(raw)) else {
            panic!("valid?")
        };
        assert_eq!(reference, ObjectRef::new(Kind::Service, "n", "s"));
        assert!(error.to_string().contains("spec.ports[0].port"), "{error}");
    }

    #[test]
    fn managed_fields_and_type_fields_are_dropped_and_metadata_is_kept() {
        let object = dynamic(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "9",
                "managedFields": [{"manager": "x"}], "labels": {"a\"b": "c"}},
            "spec": {"nodeName": "n1"}
        }));
        let meta = object.meta();
        assert_eq!(meta.name.as_deref(), Some("p"));
        assert_eq!(meta.namespace.as_deref(), Some("n"));
        assert_eq!(meta.uid.as_deref(), Some("u"));
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        let value: Value = serde_json::from_str(object.json()).expect("valid JSON");
        assert_eq!(
            value,
            json!({"metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "9",
                "labels": {"a\"b": "c"}}, "spec": {"nodeName": "n1"}})
        );
    }

    #[test]
    fn a_wrongly_typed_field_fails_the_object_not_the_list() {
        let pods = &watched_kinds()[8];
        // As kube reads a list page: every item parses; the bad one fails in `reduce`, with
        // the field's path.
        let page = json!([
            {"metadata": {"name": "bad", "namespace": "n"},
             "spec": {"containers": [{"ports": [{"name": "http", "containerPort": "eighty"}]}]}},
            {"metadata": {"name": "good", "namespace": "n"}, "status": {"podIP": "10.0.0.2"}}
        ]);
        let items: Vec<WatchedObject> = serde_json::from_str(&page.to_string()).expect("parse");
        let mut items = items.into_iter();
        let Reduced::Invalid(reference, error) = reduce(pods, items.next().unwrap()) else {
            panic!("valid?")
        };
        assert_eq!(reference, ObjectRef::new(Kind::Pod, "n", "bad"));
        let text = error.to_string();
        assert!(
            text.contains("spec.containers[0].ports[0].containerPort"),
            "{text}"
        );
        assert!(matches!(
            reduce(pods, items.next().unwrap()),
            Reduced::Object(Object::Pod(_))
        ));
    }
}
