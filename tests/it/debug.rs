//! The debug HTTP views against a running ambientd serving the example mesh, with one
//! ztunnel-shaped client connected.

use crate::support::common as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::*;

async fn json(addr: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let (code, body) = http_get(addr, path).await;
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (code, value)
}

/// Polls `check` until it returns true; fails loudly after the wait.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A UTC RFC 3339 time as Go's `time.Time` JSON writes it: `YYYY-MM-DDTHH:MM:SS[.fraction]Z`.
fn assert_rfc3339(value: &Value) {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("{value} is not a string"));
    let b = text.as_bytes();
    assert!(
        text.len() >= 20
            && text.ends_with('Z')
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && (text.len() == 20 || b[19] == b'.'),
        "{text} is not RFC 3339"
    );
    assert!(text.starts_with("20"), "{text} is not a current time");
}

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo")
}

#[tokio::test]
async fn syncz_tracks_sent_and_acked_nonces() {
    let running = start(&example()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let first = client.recv().await;
    let address_type = "type.googleapis.com/istio.workload.Address";

    let (code, syncz) = json(running.debug_address, "/debug/syncz").await;
    assert_eq!(code, 200);
    let connection = &syncz.as_array().expect("an array")[0];
    // `proxy` is istiod's proxy id (`<pod>.<ns>`); our connection id is kept beside it.
    assert_eq!(connection["proxy"], "ztunnel-x7k2p.istio-system");
    assert!(
        connection["connectionId"]
            .as_str()
            .unwrap()
            .starts_with("ztunnel-x7k2p.istio-system-")
    );
    assert!(
        connection["proxy_id"]
            .as_str()
            .unwrap()
            .starts_with("ztunnel~")
    );
    assert_eq!(connection["proxy_type"], "ztunnel");
    assert_eq!(connection["cluster_id"], "Kubernetes");
    assert_eq!(
        connection["resources"][address_type]["sent"],
        first.nonce.as_str()
    );
    assert_eq!(connection["resources"][address_type]["acked"], "");
    assert_rfc3339(&connection["resources"][address_type]["sentTime"]);
    assert_eq!(
        connection["resources"][address_type]["ackedTime"],
        Value::Null
    );

    client.ack(&first).await;
    let addr = running.debug_address;
    let nonce = first.nonce.clone();
    eventually("the ACK to show in syncz", async || {
        let (_, syncz) = json(addr, "/debug/syncz").await;
        syncz[0]["resources"][address_type]["acked"] == nonce.as_str()
    })
    .await;
    let (_, syncz) = json(addr, "/debug/syncz").await;
    assert_rfc3339(&syncz[0]["resources"][address_type]["ackedTime"]);

    // A NACK shows as the last error.
    let authorizations = client.recv().await;
    client
        .nack(&authorizations, "bookinfo/allow-in-namespace: test")
        .await;
    eventually("the NACK to show in syncz", async || {
        let (_, syncz) = json(addr, "/debug/syncz").await;
        syncz[0]["resources"]["type.googleapis.com/istio.security.Authorization"]["lastError"]
            == "bookinfo/allow-in-namespace: test"
    })
    .await;
    running.stop().await;
}

/// What a client received, as config_dump shows it: each resource as protojson writes an Any,
/// sorted by name.
fn as_dumped(response: &ambientd::pb::xds::DeltaDiscoveryResponse) -> Vec<Value> {
    use ambientd::debug::render;
    use ambientd::pb::security::Authorization;
    use ambientd::pb::workload::{Address, address};
    use prost::Message;
    let mut resources: Vec<_> = response.resources.iter().collect();
    resources.sort_by(|a, b| a.name.cmp(&b.name));
    resources
        .into_iter()
        .map(|r| {
            let any = r.resource.as_ref().unwrap();
            let mut dumped = serde_json::json!({"@type": any.type_url});
            if any.type_url.ends_with("Authorization") {
                let a = Authorization::decode(&any.value[..]).unwrap();
                let Value::Object(fields) = render::authorization(&a) else {
                    panic!("an object")
                };
                dumped.as_object_mut().unwrap().extend(fields);
            } else {
                match Address::decode(&any.value[..]).unwrap().r#type.unwrap() {
                    address::Type::Workload(w) => dumped["workload"] = render::workload(&w),
                    address::Type::Service(s) => dumped["service"] = render::service(&s),
                }
            }
            dumped
        })
        .collect()
}

#[tokio::test]
async fn config_dump_is_a_config_dump_of_what_the_client_received() {
    let running = start(&example()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (addresses, authorizations) = client.initial_sync().await;
    assert!(!authorizations.resources.is_empty());

    let addr = running.debug_address;
    let configs = async |query: &str| {
        let (code, dump) = json(addr, &format!("/debug/config_dump?proxyID={query}")).await;
        assert_eq!(code, 200, "{dump}");
        // Envoy admin's ConfigDump: nothing but `configs`.
        assert_eq!(dump.as_object().unwrap().len(), 1, "{dump}");
        dump["configs"].as_array().unwrap().clone()
    };

    // By default only the Address resources, as istiod dumps a ztunnel.
    let dumped = configs("ztunnel-x7k2p").await;
    assert_eq!(dumped, as_dumped(&addresses));
    // Each Address is its oneof inside an Any; IPs are text, not protojson's base64.
    let productpage = dumped
        .iter()
        .find(|c| {
            c["workload"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("productpage-v1"))
        })
        .unwrap();
    assert_eq!(
        productpage["@type"],
        "type.googleapis.com/istio.workload.Address"
    );
    assert_eq!(productpage["workload"]["addresses"][0], "10.244.1.10");
    assert!(dumped.iter().any(|c| {
        c["service"]["hostname"]
            .as_str()
            .is_some_and(|h| h.starts_with("productpage."))
    }));

    // `types` selects: WADS alone, or both in push order.
    let policies = configs("ztunnel-x7k2p&types=WADS").await;
    assert_eq!(policies, as_dumped(&authorizations));
    assert_eq!(
        policies[0]["@type"],
        "type.googleapis.com/istio.security.Authorization"
    );
    assert!(policies[0]["name"].is_string());
    let mut both = as_dumped(&addresses);
    both.extend(as_dumped(&authorizations));
    assert_eq!(configs("ztunnel-x7k2p&types=WDS,WADS").await, both);

    let (code, _) = http_get(addr, "/debug/config_dump").await;
    assert_eq!(code, 400);
    let (code, _) = http_get(addr, "/debug/config_dump?proxyID=ztunnel-x7k2p&types=CDS").await;
    assert_eq!(code, 400);
    let (code, _) = http_get(addr, "/debug/config_dump?proxyID=nobody").await;
    assert_eq!(code, 404);
    running.stop().await;
}

#[tokio::test]
async fn connections_adsz_and_ambientz_have_their_shapes() {
    let running = start(&example()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;
    let addr = running.debug_address;

    let (code, connections) = json(addr, "/debug/connections").await;
    assert_eq!(code, 200);
    assert_eq!(connections["totalClients"], 1);
    assert!(
        connections["clients"][0]["connectionId"]
            .as_str()
            .unwrap()
            .starts_with("ztunnel-x7k2p.istio-system-")
    );
    assert_rfc3339(&connections["clients"][0]["connectedAt"]);
    // A synced proxy that ACKed everything: nothing held back.
    assert_eq!(
        connections["clients"][0]["pending"],
        serde_json::json!({"queuedResponses": 0, "queuedBytes": 0, "changedNames": 0})
    );

    let (_, adsz) = json(addr, "/debug/adsz").await;
    let client0 = &adsz["clients"][0];
    assert_eq!(client0["metadata"]["NODE_NAME"], "node-a");
    assert_eq!(client0["wildcard"].as_array().unwrap().len(), 2);

    let (code, mesh) = json(addr, "/debug/ambientz?namespace=bookinfo").await;
    assert_eq!(code, 200);
    assert_eq!(mesh["workloads"].as_array().unwrap().len(), 9);
    assert_eq!(mesh["services"].as_array().unwrap().len(), 6);
    let policies = mesh["policies"].as_array().unwrap();
    let deny = policies
        .iter()
        .find(|p| p["name"] == "ratings-deny-admin")
        .unwrap();
    assert_eq!(deny["status"]["reason"], "UnsupportedValue");
    assert!(
        deny["status"]["message"]
            .as_str()
            .unwrap()
            .contains("requestPrincipals")
    );
    // The reviews Service uses the waypoint: its WaypointBound condition is listed.
    let bound = mesh["waypointBound"].as_array().unwrap();
    let reviews = bound.iter().find(|c| c["name"] == "reviews").unwrap();
    assert_eq!(reviews["kind"], "Service");
    assert_eq!(reviews["status"]["type"], "istio.io/WaypointBound");
    assert_eq!(reviews["status"]["reason"], "WaypointAccepted");
    // No meshConfig.serviceEntryVisibility here: no VisibilityApplied condition.
    assert_eq!(mesh["visibilityApplied"], serde_json::json!([]));
    // The waypoint policy is not sent, yet listed with its status.
    let waypoint = policies.iter().find(|p| p["name"] == "reviews-get-only");
    assert!(waypoint.is_none_or(|p| p["sent"] == false));
    let (_, all) = json(addr, "/debug/ambientz").await;
    assert!(
        all["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "istio_converted_static_strict")
    );
    running.stop().await;
}

/// `/debug/authorize` agrees with the evaluator scenarios on the example mesh's policies.
#[tokio::test]
async fn explain_answers_who_may_connect_and_why() {
    let running = start(&example()).await;
    let addr = running.debug_address;
    let ask = async |source: &str, destination: &str, port: u16| {
        let path =
            format!("/debug/authorize?source={source}&destination={destination}&port={port}");
        let (code, answer) = json(addr, &path).await;
        assert_eq!(code, 200, "{answer}");
        answer
    };
    let reviews = "bookinfo/reviews-v1-598b896c9d-j6mw2";

    let answer = ask(
        "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage",
        reviews,
        9080,
    )
    .await;
    assert_eq!(answer["decision"], "ALLOW");
    assert!(
        answer["considered"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "bookinfo/reviews-from-productpage")
    );

    // Mesh-wide STRICT: plaintext is denied by the static policy.
    let answer = ask("plaintext", reviews, 9080).await;
    assert_eq!(answer["decision"], "DENY");
    assert_eq!(
        answer["policy"],
        "istio-system/istio_converted_static_strict"
    );

    // Another namespace matches no ALLOW.
    let answer = ask("spiffe://cluster.local/ns/other/sa/x", reviews, 9080).await;
    assert_eq!(answer["decision"], "DENY");
    assert_eq!(answer["reason"], "allow policies exist, but none allowed");

    // The DENY with an HTTP path is enforced without it: any caller from outside bookinfo.
    let answer = ask(
        "spiffe://cluster.local/ns/istio-ingress/sa/gw",
        "bookinfo/ratings-v1-6c4f8b7d58-r5lcg",
        9080,
    )
    .await;
    assert_eq!(answer["decision"], "DENY");
    assert_eq!(answer["policy"], "bookinfo/ratings-deny-admin");

    // A mesh workload's IP stands for its identity.
    let answer = ask("10.244.1.10", reviews, 9080).await;
    assert_eq!(answer["decision"], "ALLOW");
    assert_eq!(
        answer["source"]["identity"],
        "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage"
    );

    // A Service as the destination: explained for each workload behind it.
    let productpage = "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage";
    let ratings_pod = "bookinfo/ratings-v1-6c4f8b7d58-r5lcg";
    let by_name = ask(productpage, "bookinfo/ratings", 9080).await;
    assert_eq!(
        by_name["destination"]["service"],
        "bookinfo/ratings.bookinfo.svc.cluster.local"
    );
    assert!(by_name["waypoint"].is_null(), "ratings has no waypoint");
    let behind = by_name["workloads"].as_array().unwrap();
    assert_eq!(
        behind.len(),
        2,
        "the ratings pod and the ratings VM: {by_name}"
    );
    let direct = ask(productpage, ratings_pod, 9080).await;
    let pod = behind
        .iter()
        .find(|a| a["destination"]["uid"] == direct["destination"]["uid"])
        .expect("the ratings pod is behind the Service");
    assert_eq!(pod["decision"], direct["decision"]);
    assert_eq!(pod["policy"], direct["policy"]);
    assert_eq!(by_name["decision"], direct["decision"]);
    // The same Service by hostname, by ns/hostname and by VIP.
    for key in [
        "ratings.bookinfo.svc.cluster.local",
        "bookinfo/ratings.bookinfo.svc.cluster.local",
        "10.96.10.4",
    ] {
        let answer = ask(productpage, key, 9080).await;
        assert_eq!(answer["destination"], by_name["destination"], "{key}");
        assert_eq!(answer["workloads"], by_name["workloads"], "{key}");
    }
    // The DENY applies through the Service too.
    let denied = ask(
        "spiffe://cluster.local/ns/istio-ingress/sa/gw",
        "bookinfo/ratings",
        9080,
    )
    .await;
    assert_eq!(denied["decision"], "DENY");
    assert_eq!(denied["allowed"], false);
    assert_eq!(
        denied["workloads"][0]["policy"],
        "bookinfo/ratings-deny-admin"
    );

    // reviews is bound to the namespace waypoint: its workloads' ztunnels see the waypoint.
    let reviews_service = ask(productpage, "bookinfo/reviews", 9080).await;
    let waypoint = &reviews_service["waypoint"];
    assert_eq!(
        waypoint["identity"], "spiffe://cluster.local/ns/bookinfo/sa/waypoint",
        "{reviews_service}"
    );
    let address = waypoint["address"].as_str().unwrap_or_default();
    assert!(
        address == "bookinfo/waypoint.bookinfo.svc.cluster.local"
            || address.ends_with("/10.96.10.20"),
        "{waypoint}"
    );
    assert_eq!(
        waypoint["workloads"],
        serde_json::json!(["Kubernetes//Pod/bookinfo/waypoint-6f7d8c9b5c-q2w3e"])
    );
    let behind = reviews_service["workloads"].as_array().unwrap();
    assert_eq!(behind.len(), 3, "reviews v1, v2 and v3");
    for answer in behind {
        let uid = answer["destination"]["uid"].as_str().unwrap();
        let from_waypoint = ask(
            "spiffe://cluster.local/ns/bookinfo/sa/waypoint",
            uid,
            answer["destination"]["port"].as_u64().unwrap() as u16,
        )
        .await;
        assert_eq!(answer["decision"], from_waypoint["decision"], "{uid}");
        assert_eq!(answer["policy"], from_waypoint["policy"], "{uid}");
    }

    // A port the Service does not have is a clear error.
    let (code, body) = http_get(
        addr,
        "/debug/authorize?source=plaintext&destination=bookinfo/ratings&port=81",
    )
    .await;
    assert_eq!(code, 400);
    assert!(body.contains("has no port 81"), "{body}");

    let (code, _) = http_get(
        addr,
        "/debug/authorize?source=plaintext&destination=nowhere&port=1",
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = http_get(addr, "/debug/authorize?source=plaintext&destination=x").await;
    assert_eq!(code, 400);
    running.stop().await;
}

/// The Prometheus text format: `# HELP`/`# TYPE` comments, and sample lines
/// `name{labels} value`, each belonging to a `# TYPE` family.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(!families.is_empty(), "no # TYPE lines");
    let mut samples = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a number in {line:?}"));
        let name = series.split('{').next().unwrap();
        let known = families.iter().any(|family| {
            name == *family
                || name
                    .strip_prefix(*family)
                    .is_some_and(|suffix| ["_bucket", "_sum", "_count"].contains(&suffix))
        });
        assert!(known, "sample {line:?} belongs to no # TYPE family");
        samples.insert(series.to_string(), value);
    }
    samples
}

#[tokio::test]
async fn metrics_move_on_push_and_nack() {
    let running = start(&example()).await;
    let addr = running.debug_address;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let addresses = client.recv().await;
    client.nack(&addresses, "x: rejected").await;
    let authorizations = client.recv().await;
    client.ack(&authorizations).await;

    let (code, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let samples = parse_metrics(&text);
    assert_eq!(samples.get("pilot_xds_pushes{type=\"wds\"}"), Some(&1.0));
    assert_eq!(samples.get("pilot_xds_pushes{type=\"wads\"}"), Some(&1.0));
    assert_eq!(samples.get("pilot_xds{version=\"0.1.0\"}"), Some(&1.0));
    eventually("the NACK to be counted", async || {
        let (_, text) = http_get(addr, "/metrics").await;
        parse_metrics(&text).get("pilot_total_xds_rejects{type=\"wds\"}") == Some(&1.0)
    })
    .await;
    assert_eq!(samples.get("pilot_services"), Some(&6.0));
    assert_eq!(samples.get("ambientd_objects{kind=\"Pod\"}"), Some(&7.0));
    assert!(samples.contains_key("citadel_server_csr_count"));
    running.stop().await;
}

#[tokio::test]
async fn the_html_page_shows_connected_proxies() {
    let running = start(&example()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;
    let addr = running.debug_address;
    eventually("both types to show as synced", async || {
        let (_, html) = http_get(addr, "/debug").await;
        html.matches(">synced<").count() == 2
    })
    .await;
    let (code, html) = http_get(addr, "/debug").await;
    assert_eq!(code, 200);
    assert!(
        html.contains("ztunnel~10.244.1.2~ztunnel-x7k2p.istio-system"),
        "{html}"
    );
    assert!(html.contains("/debug/ambientz"));
    running.stop().await;
}

#[tokio::test]
async fn logging_changes_the_filter_at_runtime() {
    use std::sync::{Arc, Mutex};
    let set = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = set.clone();
    let mut config = ambientd::config::Config::local(example());
    config.log_filter = Some(ambientd::debug::LogControl::new(move |level| {
        if level.contains('!') {
            return Err("not a log level".into());
        }
        seen.lock().unwrap().push(level.to_string());
        Ok(())
    }));
    let running = ambientd::app::start(config).await.unwrap();
    let (code, _) = http_get(running.debug_address, "/logging?level=ambientd=debug").await;
    assert_eq!(code, 200);
    let (code, _) = http_get(running.debug_address, "/logging?level=bad!").await;
    assert_eq!(code, 400);
    let (code, _) = http_get(running.debug_address, "/logging").await;
    assert_eq!(code, 400);
    assert_eq!(*set.lock().unwrap(), vec!["ambientd=debug"]);
    running.stop().await;
}
