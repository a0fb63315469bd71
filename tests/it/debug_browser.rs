//! The debug page in a real headless browser (Debian's chromium, which .ci/run installs): it
//! renders, shows the connected proxy, and leaves a screenshot as a test artifact in
//! `$CARGO_TARGET_DIR/test-artifacts/debug-page.png` (or `target/...`).
//!
//! Without chromium on the machine the test fails under CI (`CI` set) and is skipped, loudly,
//! elsewhere.

use crate::support::common as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::*;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| Path::new("/usr/bin").join(name))
        .find(|path| path.exists())
}

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Runs headless chromium on `url` with the given extra flags, bounded in time.
fn run_chromium(
    binary: &Path,
    profile: &Path,
    extra: &[String],
    url: &str,
) -> std::process::Output {
    let mut command = Command::new(binary);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--timeout=10000",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    command.args(extra).arg(url);
    command.output().expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_page_renders_in_headless_chromium() {
    let Some(binary) = chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!("chromium is not installed: .ci/run must install Debian's chromium");
        }
        eprintln!(
            "SKIPPED: no chromium under /usr/bin (apt-get install chromium to run this test)"
        );
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let running = start(&dir).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;
    // Let the ACKs land so the page shows the proxy as synced.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let url = format!("http://127.0.0.1:{}/debug", running.debug_address.port());
    let profile = tempfile::tempdir().expect("profile dir");
    let screenshot = artifacts().join("debug-page.png");
    let (dom, shot) = {
        let (binary, profile, url, screenshot) = (
            binary.clone(),
            profile.path().to_path_buf(),
            url.clone(),
            screenshot.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let dom = run_chromium(&binary, &profile, &["--dump-dom".into()], &url);
            let shot = run_chromium(
                &binary,
                &profile,
                &[
                    format!("--screenshot={}", screenshot.display()),
                    "--window-size=1280,1000".into(),
                ],
                &url,
            );
            (dom, shot)
        })
        .await
        .expect("chromium task")
    };
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(html.contains("Connected proxies (1)"), "{html}");
    assert!(
        html.contains("ztunnel~10.244.1.2~ztunnel-x7k2p.istio-system"),
        "{html}"
    );
    assert!(
        shot.status.success(),
        "screenshot failed: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let png = std::fs::read(&screenshot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    eprintln!("screenshot: {}", screenshot.display());
    running.stop().await;
}
