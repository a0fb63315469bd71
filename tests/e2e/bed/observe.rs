//! What the bed reads from its programs: each ztunnel's admin, stats, certificates and log,
//! ambientd's NACK count, and, when a test fails, every proxy's config dump.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::apps;
use super::mesh::{Mesh, STARTUP};
use super::process::{Process, wait_for};

impl Mesh {
    /// A ztunnel's admin, stats or readiness endpoint (`port` 15000, 15020 or 15021).
    pub fn ztunnel_get(&self, node: usize, port: u16, path: &str) -> String {
        apps::http(
            &self.node(node).netns,
            ([127, 0, 0, 1], port).into(),
            "GET",
            path,
            "ztunnel",
        )
        .map(|r| r.body)
        .unwrap_or_default()
    }

    /// The sum of a ztunnel's Prometheus samples of `metric` whose labels include all of
    /// `labels` (`key="value"` as the exposition writes them).
    pub fn ztunnel_metric(&self, node: usize, metric: &str, labels: &[(&str, &str)]) -> u64 {
        sum_samples(&self.ztunnel_get(node, 15020, "/metrics"), metric, labels)
    }

    /// Waits (5 s at most: ztunnel writes an access log line as the connection ends, just
    /// after the client sees it end) for a line of a ztunnel's log that contains all of
    /// `parts`; fails the test with `what` and the log's tail.
    pub fn expect_ztunnel_line(&self, node: usize, parts: &[&str], what: &str) {
        wait_for(
            what,
            Duration::from_secs(5),
            || {
                self.ztunnel_log(node)
                    .lines()
                    .any(|l| parts.iter().all(|p| l.contains(p)))
                    .then_some(())
            },
            || self.ztunnel_log_tail(node),
        );
    }

    /// Waits (5 s at most) until a ztunnel's [`Mesh::ztunnel_metric`] is at least `min`.
    pub fn expect_ztunnel_metric(
        &self,
        node: usize,
        metric: &str,
        labels: &[(&str, &str)],
        min: u64,
    ) {
        wait_for(
            &format!("node{node}'s ztunnel to count {min} {metric} {labels:?}"),
            Duration::from_secs(5),
            || (self.ztunnel_metric(node, metric, labels) >= min).then_some(()),
            || self.ztunnel_get(node, 15020, "/metrics"),
        );
    }

    /// The certificates a ztunnel holds (its config_dump's `certificates`): identity, state
    /// (`Available` when usable) and the leaf's serial number.
    pub fn ztunnel_certificates(&self, node: usize) -> Vec<(String, String, String)> {
        let dump: Value = serde_json::from_str(&self.ztunnel_get(node, 15000, "/config_dump"))
            .unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        dump["certificates"]
            .as_array()
            .map(|certs| {
                certs
                    .iter()
                    .map(|c| {
                        (
                            text(&c["identity"]),
                            text(&c["state"]),
                            text(&c["certChain"][0]["serialNumber"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A ztunnel's log so far.
    pub fn ztunnel_log(&self, node: usize) -> String {
        self.node(node)
            .ztunnel
            .as_ref()
            .map(Process::log)
            .unwrap_or_default()
    }

    /// Waits until every ztunnel's config_dump lists `what` (an IP or a name), and returns
    /// how long that took.
    pub fn wait_ztunnels_know(&self, what: &str) -> Duration {
        let started = Instant::now();
        for node in 1..=self.nodes.len() {
            wait_for(
                &format!("node{node}'s ztunnel to know {what}"),
                STARTUP,
                || {
                    self.ztunnel_get(node, 15000, "/config_dump")
                        .contains(what)
                        .then_some(())
                },
                || self.ztunnel_log_tail(node),
            );
        }
        started.elapsed()
    }

    /// Waits until no ztunnel's config_dump contains `what`; how long that took.
    pub fn wait_ztunnels_forget(&self, what: &str) -> Duration {
        let started = Instant::now();
        for node in 1..=self.nodes.len() {
            wait_for(
                &format!("node{node}'s ztunnel to forget {what}"),
                STARTUP,
                || (!self.ztunnel_get(node, 15000, "/config_dump").contains(what)).then_some(()),
                || self.ztunnel_log_tail(node),
            );
        }
        started.elapsed()
    }

    pub fn ztunnel_log_tail(&self, node: usize) -> String {
        let log = self.ztunnel_log(node);
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "--- ztunnel-node{node}:\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }
    /// Fails the test if any proxy (ztunnel or waypoint) has NACKed what ambientd sent it
    /// (`pilot_total_xds_rejects`, by type) since ambientd last started.
    pub fn assert_no_nacks(&self) {
        // The family has samples only once some type was NACKed.
        let metrics = self.ambientd_metrics();
        let nacks: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("pilot_total_xds_rejects"))
            .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
            .collect();
        assert!(
            nacks.is_empty(),
            "proxies NACKed ambientd's config: {nacks:?}\n{}",
            self.ambientd_log_tail()
        );
    }
}

/// The sum of the samples of `metric` in Prometheus text whose labels include all of
/// `labels`.
pub fn sum_samples(text: &str, metric: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Mesh {
    /// Writes what each proxy holds into the bed's directory, for reading a failure:
    /// `ztunnel-<node>.config_dump.json`, `envoy-<waypoint>.config_dump.json` and `.stats`.
    pub(super) fn save_state(&self) {
        for node in 1..=self.nodes.len() {
            let dump = self.ztunnel_get(node, 15000, "/config_dump");
            let _ = std::fs::write(
                self.dir
                    .join(format!("ztunnel-node{node}.config_dump.json")),
                dump,
            );
        }
        for pod in self.pods.iter().filter(|p| p.envoy_admin.is_some()) {
            for (path, suffix) in [
                ("/config_dump?include_eds", "config_dump.json"),
                ("/stats", "stats"),
            ] {
                let _ = std::fs::write(
                    self.dir.join(format!("envoy-{}.{suffix}", pod.name)),
                    super::waypoint::envoy_admin_get(pod, path),
                );
            }
        }
    }
}
