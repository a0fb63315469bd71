//! Status writes that conflict: 409s from the API server, and another writer changing the
//! object between the writer's read and its patch.

use super::*;

use ambientd::kube::writes::ClusterWrites;

fn policy() -> Value {
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-80", "namespace": "demo", "generation": 1},
        "spec": {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["80"]}}]}]},
    })
}

fn conditions(object: &Value) -> Vec<Value> {
    object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_status_writes_are_read_again_and_keep_the_other_writers_condition() {
    let mut f = Faulty::start(|config, _| {
        config.writes = Some(ClusterWrites {
            leader: None,
            ca_secrets: false,
            root_configmaps: false,
            ip_autoallocate: None,
            waypoints: None,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(400),
            ..ClusterWrites::new("istio-system")
        });
    })
    .await;
    let before = f.proxy.versions.clone();

    // Five patches refused with 409 (the real body), then another client's condition lands
    // just before the sixth, which was made from an older read: a genuine stale-version 409.
    f.server
        .fail_requests("PATCH", "authorizationpolicies", 5, 409);
    let mut theirs = policy();
    theirs["status"] = json!({"conditions": [{
        "type": "example.com/Audited", "status": "True", "reason": "Audited",
        "message": "seen by another controller", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]});
    f.server
        .interpose_write("PATCH", "authorizationpolicies", theirs);
    let started = Instant::now();
    f.server.apply(policy());

    let deadline = Instant::now() + WAIT;
    let object = loop {
        let object = f
            .server
            .get(
                "security.istio.io/v1",
                "AuthorizationPolicy",
                "demo",
                "deny-80",
            )
            .expect("the policy");
        let types: Vec<String> = conditions(&object)
            .iter()
            .filter_map(|c| c["type"].as_str().map(str::to_string))
            .collect();
        if types.contains(&"ZtunnelAccepted".to_string()) {
            break object;
        }
        assert!(
            Instant::now() < deadline,
            "ZtunnelAccepted never written: {object}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "converged after six status conflicts in {} ms",
        started.elapsed().as_millis()
    );
    let kept = conditions(&object)
        .into_iter()
        .find(|c| c["type"] == "example.com/Audited");
    assert!(
        kept.is_some(),
        "the other writer's condition is kept: {object}"
    );
    let patches = f
        .server
        .request_log()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/deny-80/status"))
        .count();
    assert_eq!(patches, 7, "six conflicts, then the write");
    let metrics = f.metrics().await;
    let count = |result: &str| {
        sample(
            &metrics,
            &format!("ambientd_status_writes{{kind=\"AuthorizationPolicy\",result=\"{result}\"}}"),
        )
    };
    assert!(count("conflict") >= 1.0, "conflicts are counted: {metrics}");
    assert_eq!(count("written"), 1.0);

    // Meanwhile the xDS client was served as before: the policy is an Authorization, the
    // workloads did not move.
    f.proxy.drain().await;
    assert_eq!(f.proxy.versions, before);
    f.until_healthy().await;
    f.running.stop().await;
}
