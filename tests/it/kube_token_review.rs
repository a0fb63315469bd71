//! TokenReview against the fake API server: accepted tokens with their pod, rejections,
//! the short cache, and API errors that are not cached.

use crate::support::kube as kube_support;

use std::time::Duration;

use ambientd::ca::review::{ReviewError, ReviewTokens};
use ambientd::kube::token_review::{TokenReviewer, fetch_oidc};
use kube_support::FakeApiServer;
use serde_json::json;

fn bound(namespace: &str, sa: &str, pod: &str) -> serde_json::Value {
    json!({
        "authenticated": true,
        "audiences": ["istio-ca"],
        "user": {
            "username": format!("system:serviceaccount:{namespace}:{sa}"),
            "uid": "u-1",
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            "extra": {
                "authentication.kubernetes.io/pod-name": [pod],
                "authentication.kubernetes.io/pod-uid": ["pod-uid-1"],
                "authentication.kubernetes.io/node-name": ["node-a"]
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_names_the_service_account_pod_and_node_and_is_cached() {
    let server = FakeApiServer::start().await;
    server.add_token("good", bound("demo", "web", "web-1"));
    let reviewer = TokenReviewer::new(server.client());

    let reviewed = reviewer.review("good").await.expect("accepted");
    assert_eq!(
        (
            reviewed.namespace.as_str(),
            reviewed.service_account.as_str()
        ),
        ("demo", "web")
    );
    assert_eq!(reviewed.pod_name.as_deref(), Some("web-1"));
    assert_eq!(reviewed.pod_uid.as_deref(), Some("pod-uid-1"));
    assert_eq!(reviewed.node_name.as_deref(), Some("node-a"));
    assert_eq!(reviewed.audiences, vec!["istio-ca".to_string()]);

    // Through the trait, as the CA holds it; answered from the cache.
    let as_trait: &dyn ReviewTokens = &reviewer;
    assert_eq!(as_trait.review("good").await.unwrap(), reviewed);
    assert_eq!(
        server.token_reviews(),
        1,
        "the second review came from the cache"
    );
    let request = server
        .requests()
        .into_iter()
        .find(|r| r.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"));
    assert!(request.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_cached_briefly_and_outages_not_at_all() {
    let server = FakeApiServer::start().await;
    server.add_token(
        "other-audience",
        json!({"authenticated": true, "audiences": ["api"],
               "user": {"username": "system:serviceaccount:demo:web", "groups": ["system:serviceaccounts"]}}),
    );
    server.add_token(
        "a-person",
        json!({"authenticated": true, "audiences": ["istio-ca"],
               "user": {"username": "alice", "groups": ["system:authenticated"]}}),
    );
    let reviewer = TokenReviewer::new(server.client())
        .with_cache(Duration::from_secs(30), Duration::from_millis(200));

    for token in ["other-audience", "a-person", "unknown"] {
        let error = reviewer.review(token).await.unwrap_err();
        assert!(
            matches!(error, ReviewError::Rejected(_)),
            "{token}: {error}"
        );
    }
    let asked = server.token_reviews();
    reviewer.review("unknown").await.unwrap_err();
    assert_eq!(
        server.token_reviews(),
        asked,
        "a rejection is cached for a moment"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    reviewer.review("unknown").await.unwrap_err();
    assert_eq!(server.token_reviews(), asked + 1, "then asked again");

    server.add_token("good", bound("demo", "web", "web-1"));
    server.outage().await;
    let error = reviewer.review("good").await.unwrap_err();
    assert!(matches!(error, ReviewError::Unavailable(_)), "{error}");
    server.restore().await;
    assert!(
        reviewer.review("good").await.is_ok(),
        "an outage is not cached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_issuer_and_keys_come_from_oidc_discovery() {
    let server = FakeApiServer::start().await;
    server.set_jwks(json!({"keys": [{
        "kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "alg": "ES256",
        "x": "MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4",
        "y": "4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"
    }]}));
    let (issuer, keys) = fetch_oidc(&server.client()).await.expect("discovery");
    assert_eq!(issuer, "https://kubernetes.default.svc.cluster.local");
    assert_eq!(keys.keys.len(), 1);
    assert_eq!(keys.keys[0].common.key_id.as_deref(), Some("k1"));
}
