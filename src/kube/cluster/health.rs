//! Watch health per kind: whether each kind's watch fails, since when and why, for logs,
//! metrics (through [`ClusterHealth::observe`]) and `/debug/syncz`.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use crate::discovery::model::Kind;

/// The health of one kind's watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KindHealth {
    /// Its first list (or its absence) has been delivered.
    pub synced: bool,
    /// The API server answers 404: its CRD is not installed (the kind counts as empty).
    pub missing: bool,
    /// Currently failing and backing off; the index serves what it last had.
    pub failing: bool,
    /// Errors seen (each one a retry).
    pub errors: u64,
    /// Completed lists (the first, and every re-list).
    pub lists: u64,
    pub last_error: Option<String>,
    /// What kind of error the last one was.
    pub last_reason: Option<ErrorReason>,
    /// When the current failure began (`None` while healthy).
    pub failing_since: Option<SystemTime>,
    /// When the watch last delivered something (a list, a change).
    pub last_progress: Option<SystemTime>,
}

/// Why a watch failed, as a short label for metrics (`ambientd_source_errors{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorReason {
    /// The API server answered an error status (5xx, 429, 403...): `status_<code>` is in the
    /// message; the label groups them.
    ServerError,
    /// Throttled (429) or unavailable (503) even after the client's own retries.
    Throttled,
    /// Refused by RBAC (401, 403).
    Forbidden,
    /// No byte for longer than the watch timeout: a hung list or watch.
    Timeout,
    /// The connection failed, was reset, or ended in the middle of a response.
    Connection,
    /// The answer did not decode (a truncated or malformed event).
    Decode,
    /// A 410 Gone: not a failure, but a forced re-list.
    Gone,
}

impl ErrorReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::ServerError => "server_error",
            ErrorReason::Throttled => "throttled",
            ErrorReason::Forbidden => "forbidden",
            ErrorReason::Timeout => "timeout",
            ErrorReason::Connection => "connection",
            ErrorReason::Decode => "decode",
            ErrorReason::Gone => "gone",
        }
    }
}

impl std::fmt::Display for ErrorReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Callbacks for metrics: an error (or forced re-list) of a kind, and a kind's failing state.
struct Hooks {
    error: Box<dyn Fn(Kind, ErrorReason) + Send + Sync>,
    failing: Box<dyn Fn(Kind, bool) + Send + Sync>,
}

/// Watch health per kind, for logs, metrics, `/debug/syncz` and tests.
#[derive(Default)]
pub struct ClusterHealth {
    kinds: Mutex<BTreeMap<Kind, KindHealth>>,
    hooks: OnceLock<Hooks>,
}

impl std::fmt::Debug for ClusterHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHealth")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl ClusterHealth {
    /// A copy of every kind's health.
    pub fn kinds(&self) -> BTreeMap<Kind, KindHealth> {
        self.lock().clone()
    }

    pub fn kind(&self, kind: Kind) -> KindHealth {
        self.lock().get(&kind).cloned().unwrap_or_default()
    }

    /// Some watch is failing: what is served may be stale.
    pub fn degraded(&self) -> bool {
        self.lock().values().any(|k| k.failing)
    }

    /// Calls `error` on every watch error or forced re-list (a metrics counter, say), and
    /// `failing` whenever a kind starts or stops failing. Set once.
    pub fn observe(
        &self,
        error: impl Fn(Kind, ErrorReason) + Send + Sync + 'static,
        failing: impl Fn(Kind, bool) + Send + Sync + 'static,
    ) {
        let _ = self.hooks.set(Hooks {
            error: Box::new(error),
            failing: Box::new(failing),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Kind, KindHealth>> {
        self.kinds.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn update(&self, kind: Kind, f: impl FnOnce(&mut KindHealth)) {
        f(self.lock().entry(kind).or_default());
    }

    /// A 410 Gone: not a failure, but a re-list (counted for the metrics hook).
    pub(super) fn relisting(&self, kind: Kind) {
        if let Some(hooks) = self.hooks.get() {
            (hooks.error)(kind, ErrorReason::Gone);
        }
    }

    pub(super) fn error(&self, kind: Kind, reason: ErrorReason, error: String) {
        let mut started = false;
        self.update(kind, |h| {
            h.errors += 1;
            started = !h.failing;
            h.failing = true;
            if started {
                h.failing_since = Some(SystemTime::now());
            }
            h.last_error = Some(error);
            h.last_reason = Some(reason);
        });
        if let Some(hooks) = self.hooks.get() {
            (hooks.error)(kind, reason);
            if started {
                (hooks.failing)(kind, true);
            }
        }
    }

    /// The watch delivered something or settled after a retry: no longer failing. True if it
    /// was.
    pub(super) fn recovered(&self, kind: Kind, progress: bool) -> bool {
        let mut was_failing = false;
        self.update(kind, |h| {
            was_failing = h.failing;
            h.failing = false;
            h.failing_since = None;
            if progress {
                h.last_progress = Some(SystemTime::now());
            }
        });
        if was_failing && let Some(hooks) = self.hooks.get() {
            (hooks.failing)(kind, false);
        }
        was_failing
    }
}

/// What kind of failure `error` is, for [`ErrorReason`].
pub(crate) fn classify(error: &kube::runtime::watcher::Error) -> ErrorReason {
    use kube::runtime::watcher::Error as W;
    let client = match error {
        W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => e,
        W::WatchError(status) => return by_code(status.code),
        W::NoResourceVersion => return ErrorReason::Decode,
    };
    match client {
        kube::Error::Api(status) => by_code(status.code),
        kube::Error::SerdeError(_) => ErrorReason::Decode,
        other => {
            // hyper-timeout's read timeout arrives wrapped (hyper, kube's I/O adapters): walk
            // the sources, and into I/O errors, for a timeout.
            let mut stack: Vec<&(dyn std::error::Error + 'static)> = vec![other];
            while let Some(e) = stack.pop() {
                if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    if io.kind() == std::io::ErrorKind::TimedOut {
                        return ErrorReason::Timeout;
                    }
                    if let Some(inner) = io.get_ref() {
                        stack.push(inner);
                    }
                }
                if e.to_string().contains("timed out") {
                    return ErrorReason::Timeout;
                }
                stack.extend(e.source());
            }
            ErrorReason::Connection
        }
    }
}

fn by_code(code: u16) -> ErrorReason {
    match code {
        401 | 403 => ErrorReason::Forbidden,
        410 => ErrorReason::Gone,
        429 | 503 => ErrorReason::Throttled,
        _ => ErrorReason::ServerError,
    }
}
