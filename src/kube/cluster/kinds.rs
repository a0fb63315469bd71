//! The kinds ambientd watches, and the turn of a watched object into what the manifests source
//! would have produced from the same object: a JSON value through [`objects::decode`].

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, Resource};
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::discovery::model::{Kind, Object, ObjectRef};
use crate::kube::objects::{self, Decoded, ObjectError};

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
    ];
    debug_assert!(all.iter().map(|w| w.kind).eq(Kind::ALL));
    all
}

/// What the watcher deserialises: the object's JSON as the API server sent it, except
/// `metadata.managedFields` (never read, and often the largest part of an object), which is
/// skipped while parsing. The few metadata fields the watcher itself needs (resourceVersion,
/// name, namespace) are copied into `metadata`.
///
/// A leaner [`kube::api::DynamicObject`]: that one buffers every object (serde `flatten`) and
/// parses its metadata into typed structs, `managedFields` included, before we could drop it.
#[derive(Clone, Debug, Default)]
pub struct WatchedObject {
    metadata: ObjectMeta,
    value: Map<String, Value>,
}

impl WatchedObject {
    /// Reads an object from its JSON value (tests).
    pub fn from_value(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value)
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
        let value = deserializer.deserialize_map(ObjectVisitor)?;
        let meta = value.get("metadata");
        let text = |key: &str| {
            meta.and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let metadata = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            resource_version: text("resourceVersion"),
            uid: text("uid"),
            ..ObjectMeta::default()
        };
        Ok(WatchedObject { metadata, value })
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = if key == "metadata" {
                map.next_value_seed(MetadataSeed)?
            } else {
                map.next_value::<Value>()?
            };
            object.insert(key, value);
        }
        Ok(object)
    }
}

/// `metadata` without `managedFields`.
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(MetadataVisitor)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut meta = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "managedFields" {
                map.next_value::<IgnoredAny>()?;
            } else {
                meta.insert(key, map.next_value::<Value>()?);
            }
        }
        Ok(Value::Object(meta))
    }
}

/// What one watched object reduces to.
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
    let value = to_value(&watched.resource, object);
    let invalid = |reason: String| ObjectError {
        kind: watched.resource.kind.clone(),
        name: reference.to_string(),
        reason,
    };
    match objects::decode(value).into_iter().next() {
        Some(Decoded::Object(object)) if object.kind() == watched.kind => Reduced::Object(object),
        Some(Decoded::Object(other)) => Reduced::Invalid(
            reference.clone(),
            invalid(format!("decoded as a {}", other.kind())),
        ),
        Some(Decoded::Invalid(error)) => Reduced::Invalid(reference, error),
        Some(Decoded::Ignored(_)) | None => Reduced::Invalid(
            reference.clone(),
            invalid("not a kind ambientd reads".into()),
        ),
    }
}

/// The object as the JSON the API server sent, with `apiVersion`/`kind` filled in (list items
/// omit them).
pub fn to_value(resource: &ApiResource, object: WatchedObject) -> Value {
    let mut map = object.value;
    map.insert(
        "apiVersion".into(),
        Value::String(resource.api_version.clone()),
    );
    map.insert("kind".into(), Value::String(resource.kind.clone()));
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
