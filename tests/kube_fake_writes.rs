//! The fake API server's writes, through kube-rs over real HTTP: what the leader election, the
//! CA Secret and the root ConfigMaps (and status writers) rely on.

mod kube_support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube_support::{ApiCall, FakeApiServer};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn namespace(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "x"}},
        "data": {"key": value},
    }))
    .unwrap()
}

fn code(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn create_get_replace_delete() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace("ns"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");

    let created = api
        .create(&PostParams::default(), &config_map("cm", "a"))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    assert!(created.metadata.uid.is_some());
    let again = api
        .create(&PostParams::default(), &config_map("cm", "b"))
        .await;
    assert_eq!(code(again.unwrap_err()), (409, "AlreadyExists".into()));

    let got = api.get("cm").await.unwrap();
    assert_eq!(got.data.unwrap()["key"], "a");
    assert_eq!(
        code(api.get("nope").await.unwrap_err()),
        (404, "NotFound".into())
    );
    assert!(api.get_opt("nope").await.unwrap().is_none());

    // Replace at the current version, then again at the now stale one.
    let mut replaced = config_map("cm", "c");
    replaced.metadata.resource_version = Some(rv.clone());
    let replaced = api
        .replace("cm", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    assert_eq!(
        replaced.metadata.uid, created.metadata.uid,
        "replace keeps the uid"
    );
    let mut stale = config_map("cm", "d");
    stale.metadata.resource_version = Some(rv);
    let stale = api.replace("cm", &PostParams::default(), &stale).await;
    assert_eq!(code(stale.unwrap_err()), (409, "Conflict".into()));

    api.delete("cm", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        code(
            api.delete("cm", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        (404, "NotFound".into())
    );

    // Creating in a missing or terminating namespace fails as the API server's would.
    let elsewhere: Api<ConfigMap> = Api::namespaced(fake.client(), "missing");
    let missing = elsewhere
        .create(&PostParams::default(), &config_map("cm", "a"))
        .await;
    assert_eq!(code(missing.unwrap_err()).0, 404);
    fake.terminate_namespace("ns");
    let terminating = api
        .create(&PostParams::default(), &config_map("cm", "a"))
        .await;
    assert_eq!(code(terminating.unwrap_err()), (403, "Forbidden".into()));
}

#[tokio::test]
async fn patches_merge_json_and_status() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace("ns"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &config_map("cm", "a"))
        .await
        .unwrap();

    let merged = api
        .patch(
            "cm",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"app": null, "new": "y"}}, "data": {"other": "b"}}),
            ),
        )
        .await
        .unwrap();
    let labels = merged.metadata.labels.unwrap();
    assert_eq!(labels.get("new").map(String::as_str), Some("y"));
    assert!(!labels.contains_key("app"));
    assert_eq!(merged.data.unwrap().len(), 2);

    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/key", "value": "a"},
        {"op": "replace", "path": "/data/key", "value": "z"},
    ]))
    .unwrap();
    let patched = api
        .patch("cm", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["key"], "z");

    // A merge patch naming a stale resourceVersion is a conflict.
    let stale = api
        .patch(
            "cm",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "data": {"key": "q"}})),
        )
        .await;
    assert_eq!(code(stale.unwrap_err()), (409, "Conflict".into()));
    assert!(
        api.patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .is_err()
    );

    // The status subresource changes only the status.
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": "other"}, "status": {"phase": "Active"}}));
    let namespaces: Api<Namespace> = Api::all(fake.client());
    let ns = namespaces
        .patch_status(
            "other",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"ignored": "yes"}}, "status": {"phase": "Terminating"}})),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert!(
        ns.metadata.labels.is_none(),
        "a status write leaves the labels alone"
    );
    // ... and a main-resource write leaves the status alone.
    let ns = namespaces
        .patch(
            "other",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Active"}, "metadata": {"labels": {"a": "b"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert!(ns.metadata.labels.is_some());
}

#[tokio::test]
async fn server_side_apply_owns_fields_and_conflicts() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace("ns"));
    let api: Api<Secret> = Api::namespaced(fake.client(), "ns");
    let apply = |value: &str| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                            "stringData": {"k": value}}),
        )
    };
    // Apply creates.
    let first = api
        .patch("s", &PatchParams::apply("one"), &apply("1"))
        .await
        .unwrap();
    assert!(first.metadata.uid.is_some());
    // The same manager may change its own field; another may set it to the same value...
    api.patch("s", &PatchParams::apply("one"), &apply("2"))
        .await
        .unwrap();
    api.patch("s", &PatchParams::apply("two"), &apply("2"))
        .await
        .unwrap();
    // ... but not to another value, unless it forces.
    let conflict = api
        .patch("s", &PatchParams::apply("three"), &apply("3"))
        .await;
    assert_eq!(code(conflict.unwrap_err()), (409, "Conflict".into()));
    api.patch("s", &PatchParams::apply("three").force(), &apply("3"))
        .await
        .unwrap();
    // An update (merge patch) takes the fields it changes over.
    api.patch(
        "s",
        &PatchParams::default(),
        &Patch::Merge(json!({"stringData": {"k": "4"}})),
    )
    .await
    .unwrap();
    let after_update = api
        .patch("s", &PatchParams::apply("three"), &apply("5"))
        .await;
    assert_eq!(code(after_update.unwrap_err()).0, 409);
}

#[tokio::test]
async fn writes_reach_watches_and_the_request_log() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace("ns"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let config = watcher::Config::default().fields("metadata.name=cm");
    let mut events = watcher(api.clone(), config).boxed();
    let mut next = async || {
        tokio::time::timeout(WAIT, events.next())
            .await
            .expect("a watch event in time")
            .expect("the watch goes on")
            .expect("no watch error")
    };
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(matches!(next().await, watcher::Event::InitDone));

    api.create(&PostParams::default(), &config_map("cm", "a"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("unwatched", "a"))
        .await
        .unwrap();
    assert!(
        matches!(next().await, watcher::Event::Apply(cm) if cm.data.as_ref().unwrap()["key"] == "a")
    );
    api.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"key": "b"}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next().await, watcher::Event::Apply(cm) if cm.data.as_ref().unwrap()["key"] == "b")
    );
    api.delete("cm", &DeleteParams::default()).await.unwrap();
    assert!(matches!(next().await, watcher::Event::Delete(_)));

    let writes = fake.writes();
    assert_eq!(writes.len(), 4, "{writes:?}");
    assert_eq!(writes[2].method, "PATCH");
    assert_eq!(
        writes[2].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let calls = fake.api_calls();
    let call = |verb: &str, name: Option<&str>| ApiCall {
        verb: verb.into(),
        group: String::new(),
        resource: "configmaps".into(),
        subresource: None,
        namespace: Some("ns".into()),
        name: name.map(str::to_string),
    };
    // The list and watch select metadata.name=cm: RBAC sees them as naming it (RequestInfo).
    assert!(calls.contains(&call("list", Some("cm"))), "{calls:?}");
    assert!(calls.contains(&call("watch", Some("cm"))), "{calls:?}");
    assert!(calls.contains(&call("create", None)));
    assert!(calls.contains(&call("patch", Some("cm"))));
    assert!(calls.contains(&call("delete", Some("cm"))));
    assert_eq!(
        call("patch", Some("cm")).to_string(),
        "patch core/configmaps in ns"
    );
}

#[tokio::test]
async fn injected_failures_fail_then_stop() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace("ns"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    fake.fail_requests("POST", "configmaps", 1, 500);
    let failed = api
        .create(&PostParams::default(), &config_map("cm", "a"))
        .await;
    assert_eq!(code(failed.unwrap_err()).0, 500);
    api.create(&PostParams::default(), &config_map("cm", "a"))
        .await
        .unwrap();
}
