//! Faults of lists and watches.

use super::*;

/// Watch requests of `plural` so far.
fn watches_of(server: &FakeApiServer, plural: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.split('?')
                .next()
                .is_some_and(|p| p.ends_with(&format!("/{plural}")))
                && r.contains("watch=true")
        })
        .count()
}

/// Retries while a fault lasts come at most every 400 ms (the test backoff's cap), not in a
/// loop: over `window`, at most this many.
fn retry_bound(window: Duration) -> usize {
    (window.as_millis() / 400) as usize + 3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_500s_keep_the_last_snapshot_and_the_resumed_watch_brings_every_change() {
    let mut f = Faulty::start(|_, _| {}).await;
    let before = f.proxy.versions.clone();

    f.server.fail_calls("watch", "pods", usize::MAX, 500);
    let began = Instant::now();
    f.server.drop_watches();
    f.change_pods();
    f.until_degraded("server_error", "watch 500s", began).await;
    let (count, window) = (watches_of(&f.server, "pods"), Duration::from_millis(2000));
    tokio::time::sleep(window).await;
    let retries = watches_of(&f.server, "pods") - count;
    assert!(
        (1..=retry_bound(window)).contains(&retries),
        "{retries} watch attempts in {window:?}: retried, but backed off"
    );
    f.assert_last_snapshot_served(&before).await;
    let (code, _) = support::http_get(f.running.debug_address, "/ready").await;
    assert_eq!(code, 200, "still ready: serving the last snapshot");

    f.server.clear_call_failures();
    let ended = Instant::now();
    f.converge("watch 500s", ended).await;
    f.until_healthy().await;
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_500s_after_a_410_keep_the_last_snapshot_and_the_relist_drops_what_was_deleted() {
    let mut f = Faulty::start(|_, _| {}).await;
    let before = f.proxy.versions.clone();
    let lists = f.server.lists_of("pods");

    // Away long enough that the history is gone: the delete of c is not replayed as an
    // event, only a new list can tell.
    f.server.outage().await;
    f.change_pods();
    f.server.compact();
    f.server.fail_calls("list", "pods", usize::MAX, 500);
    let began = Instant::now();
    f.server.restore().await;
    f.until_degraded("server_error", "list 500s after a 410", began)
        .await;
    let (count, window) = (f.server.lists_of("pods"), Duration::from_millis(2000));
    tokio::time::sleep(window).await;
    let retries = f.server.lists_of("pods") - count;
    assert!(
        (1..=retry_bound(window)).contains(&retries),
        "{retries} list attempts in {window:?}: retried, but backed off"
    );
    f.assert_last_snapshot_served(&before).await;

    f.server.clear_call_failures();
    let ended = Instant::now();
    f.converge("list 500s after a 410", ended).await;
    assert!(
        f.server.lists_of("pods") > lists + retries,
        "the 410 forced a relist"
    );
    f.until_healthy().await;
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_list_is_timed_out_and_retried_and_the_relist_converges() {
    let mut f = Faulty::start(|_, _| {}).await;
    let before = f.proxy.versions.clone();

    f.server.outage().await;
    f.change_pods();
    f.server.compact();
    f.server.hang("list", "pods", true);
    let began = Instant::now();
    f.server.restore().await;
    // The list is accepted and never answered: after the watch timeout (1 s) plus the 2 s
    // grace without a byte, the client gives up, counts a timeout and lists again.
    f.until_degraded("timeout", "a hung list", began).await;
    f.assert_last_snapshot_served(&before).await;

    f.server.hang("list", "pods", false);
    let ended = Instant::now();
    f.converge("a hung list", ended).await;
    f.until_healthy().await;
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_watch_is_timed_out_and_resumed_with_every_change() {
    let mut f = Faulty::start(|_, _| {}).await;
    let before = f.proxy.versions.clone();

    // Watches answer their headers, then nothing: a half-dead connection.
    f.server.hang("watch", "pods", true);
    let began = Instant::now();
    f.server.drop_watches();
    f.change_pods();
    f.until_degraded("timeout", "a hung watch", began).await;
    f.assert_last_snapshot_served(&before).await;

    f.server.hang("watch", "pods", false);
    let ended = Instant::now();
    f.converge("a hung watch", ended).await;
    f.until_healthy().await;
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_cut_in_the_middle_of_an_event_resumes_without_losing_it() {
    let mut f = Faulty::start(|_, _| {}).await;
    let errors = f
        .sample("ambientd_source_errors{kind=\"Pod\",reason=\"connection\"}")
        .await;

    // d's ADDED line goes out half written, then the connection is reset.
    f.server.cut_next_watch_event("pods");
    let ended = Instant::now();
    f.change_pods();
    f.converge("a watch cut mid-event", ended).await;
    // kube's client ended that watch quietly; the layer under it reported the break.
    let series = "ambientd_source_errors{kind=\"Pod\",reason=\"connection\"}";
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = f.metrics().await;
        if sample(&metrics, series) > errors {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut is never counted as a connection error: {}",
            metrics
                .lines()
                .filter(|l| l.starts_with("ambientd_source_errors"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The resumed watch started from the last event read in full, so d was not skipped; and
    // the half line was not taken for an object.
    assert_eq!(f.proxy.ip_of("d"), Some([10, 0, 0, 4]));
    f.until_healthy().await;
    f.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_lists_are_retried_after_retry_after_without_failing_the_watch() {
    let mut f = Faulty::start(|_, _| {}).await;

    f.server.outage().await;
    f.change_pods();
    f.server.compact();
    // API priority and fairness sheds two lists with 429 and `Retry-After: 1`.
    f.server.fail_calls("list", "pods", 2, 429);
    let lists = f.server.lists_of("pods");
    let started = Instant::now();
    f.server.restore().await;
    f.converge("two 429s on list", started).await;
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "each 429 was retried only after its Retry-After (1 s)"
    );
    assert_eq!(
        f.server.lists_of("pods") - lists,
        3,
        "two shed lists, then the one answered"
    );
    // The client's own retries absorbed it: the watch never failed.
    assert_eq!(
        f.sample("ambientd_source_errors{kind=\"Pod\",reason=\"throttled\"}")
            .await,
        0.0
    );
    f.until_healthy().await;
    f.running.stop().await;
}
