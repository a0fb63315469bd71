//! TokenReview faults: slow (past `--token-review-timeout`) and failing (500). The caller of
//! the CA gets `Unavailable` naming the TokenReview, the outcome is counted and not cached,
//! and callers the CA can authenticate otherwise are served meanwhile.

use super::*;
use crate::support::ca as ca_support;

use ambientd::ca::CaConfig;
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;

const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";

/// What the API server says of the web service account's token.
fn web_review() -> Value {
    json!({
        "authenticated": true,
        "audiences": ["istio-ca"],
        "user": {"username": "system:serviceaccount:demo:web", "uid": "sa-uid",
                 "groups": ["system:serviceaccounts", "system:serviceaccounts:demo"]}
    })
}

async fn start() -> (Faulty, std::path::PathBuf) {
    let mut ca_dir = None;
    let f = Faulty::start(|config, dir| {
        let mut ca = CaConfig::local(dir.join("ca"));
        ca.token_review_timeout = Duration::from_millis(500);
        config.ca = Some(ca);
        ca_dir = Some(dir.join("ca"));
    })
    .await;
    f.server.add_token("web-token", web_review());
    (f, ca_dir.unwrap())
}

async fn channel(f: &Faulty, ca_dir: &std::path::Path) -> tonic::transport::Channel {
    let tls = ca_support::ztunnel_tls(&ca_dir.join("root-cert.pem"));
    ca_support::channel(f.running.xds_tls_address.unwrap(), tls, ca_support::ISTIOD)
        .await
        .expect("TLS connect")
}

/// A CSR for the web identity with `token`.
async fn csr(channel: tonic::transport::Channel, token: &str) -> Result<(), tonic::Status> {
    let (_key, csr) = ca_support::ztunnel_csr(WEB);
    tokio::time::timeout(
        WAIT,
        IstioCertificateServiceClient::new(channel).create_certificate(ca_support::csr_request(
            &csr,
            Some(token),
            None,
        )),
    )
    .await
    .expect("the CSR was answered in time")
    .map(|answer| {
        assert!(!answer.into_inner().cert_chain.is_empty());
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_token_review_is_unavailable_not_a_rejection_and_holds_up_nobody_else() {
    let (f, ca_dir) = start().await;
    let channel = channel(&f, &ca_dir).await;
    f.server.delay_token_reviews(Duration::from_secs(3));

    let slow = tokio::spawn(csr(channel.clone(), "web-token"));
    // A token the CA validates itself is signed while the review hangs.
    let local = ca_support::local_token(&ca_dir, "demo", "web", None, None);
    csr(channel.clone(), &local)
        .await
        .expect("a locally validated token is signed during the slow review");
    assert!(
        !slow.is_finished(),
        "the local token did not wait for the review"
    );

    let status = slow.await.unwrap().expect_err("the review timed out");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("TokenReview") && status.message().contains("did not answer"),
        "the message names the TokenReview: {}",
        status.message()
    );
    assert_eq!(
        f.sample("ambientd_token_reviews{result=\"timeout\"}").await,
        1.0
    );

    // Not cached as a rejection: once the API server answers, the same token is signed.
    f.server.delay_token_reviews(Duration::ZERO);
    let ended = Instant::now();
    csr(channel, "web-token")
        .await
        .expect("signed once the review answers");
    println!(
        "converged after a slow TokenReview in {} ms",
        ended.elapsed().as_millis()
    );
    assert_eq!(
        f.sample("ambientd_token_reviews{result=\"authenticated\"}")
            .await,
        1.0
    );
    // The xDS client was served throughout.
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_token_review_is_unavailable_counted_and_not_cached_for_csrs_and_streams() {
    let (f, ca_dir) = start().await;
    let channel = channel(&f, &ca_dir).await;
    let channel_for_ads = channel.clone();
    f.server.fail_requests("POST", "tokenreviews", 1, 500);

    let status = csr(channel.clone(), "web-token")
        .await
        .expect_err("the review failed");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("TokenReview failed"),
        "{}",
        status.message()
    );
    assert_eq!(
        f.sample("ambientd_token_reviews{result=\"unavailable\"}")
            .await,
        1.0
    );

    let ended = Instant::now();
    csr(channel.clone(), "web-token")
        .await
        .expect("signed on the retry");
    println!(
        "converged after a failing TokenReview in {} ms",
        ended.elapsed().as_millis()
    );
    // A rejection stays Unauthenticated, with nothing said about why.
    let status = csr(channel, "not-a-known-token")
        .await
        .expect_err("rejected");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert_eq!(
        f.sample("ambientd_token_reviews{result=\"rejected\"}")
            .await,
        1.0
    );
    assert_eq!(
        f.server.token_reviews(),
        2,
        "the 500 never reached the handler"
    );

    // The delta ADS guard on 15012 answers the same way (a token not reviewed yet: the
    // accepted one is cached).
    f.server.add_token("web-token-2", web_review());
    f.server.fail_requests("POST", "tokenreviews", 1, 500);
    let refused =
        crate::support::ca_cluster::open_ads(channel_for_ads, Some("web-token-2"), "demo")
            .await
            .expect_err("the stream is refused while the review fails");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("TokenReview"), "{refused:?}");
    f.running.stop().await;
}
