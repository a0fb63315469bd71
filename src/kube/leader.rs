//! Leader election over a `coordination.k8s.io/v1` Lease (kube-lease-manager), so that exactly
//! one replica writes to the cluster (root ConfigMaps, a deleted CA Secret, status). Every
//! replica serves xDS and the CA whether it leads or not.
//!
//! [`run`] keeps one `LeaseManager` going and publishes its verdict into a [`Leadership`]
//! (a `watch::Receiver<bool>`). The flag is `false` until the lease is ours, and turns `false`
//! at once on any error talking to the API server (the manager is then rebuilt; if the lease is
//! still ours it reports `true` again right away), on losing the lease, and on shutdown, when
//! the lease is also released so another replica takes over without waiting for it to expire.
//!
//! kube-lease-manager acquires a free lease with a server-side apply (two replicas racing
//! for it: one gets 409 Conflict), renews it `grace` before it expires, and takes over an
//! expired one. Durations are whole seconds and its clock is the wall clock.

use std::time::Duration;

use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The Lease's default name (in the system namespace).
pub const DEFAULT_LEASE_NAME: &str = "ambientd-leader";

/// Longest wait between attempts to reach the API server after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a shutdown waits to release the lease.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the leader-election settings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "--leader-lease-duration {duration:?} and --leader-renew-grace {grace:?} must be whole seconds, \
         with 0 < grace < duration"
    )]
    Durations { duration: Duration, grace: Duration },
}

/// Which Lease, who we are, and how long a lease lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    /// The Lease's `holderIdentity`: the pod name, or hostname plus a random suffix.
    pub identity: String,
    /// `leaseDurationSeconds`: how long a holder that stopped renewing keeps the lease.
    pub lease_duration: Duration,
    /// The holder renews this long before its lease would expire.
    pub renew_grace: Duration,
}

impl LeaderConfig {
    /// Defaults (15 s lease renewed 5 s before it expires) for `namespace`, with the identity
    /// from [`default_identity`].
    pub fn new(namespace: impl Into<String>) -> Self {
        LeaderConfig {
            lease_name: DEFAULT_LEASE_NAME.into(),
            namespace: namespace.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_grace: Duration::from_secs(5),
        }
    }

    pub fn validate(&self) -> Result<(), LeaderError> {
        let whole = |d: Duration| d.subsec_nanos() == 0 && d.as_secs() > 0;
        if whole(self.lease_duration)
            && whole(self.renew_grace)
            && self.renew_grace < self.lease_duration
        {
            Ok(())
        } else {
            Err(LeaderError::Durations {
                duration: self.lease_duration,
                grace: self.renew_grace,
            })
        }
    }
}

/// `POD_NAME` (the downward API), else the hostname with a random suffix so two processes on
/// one host differ.
pub fn default_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.trim().is_empty()
    {
        return pod.trim().to_string();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "ambientd".into());
    let suffix: u32 = rand_suffix();
    format!("{host}-{suffix:08x}")
}

fn rand_suffix() -> u32 {
    let mut bytes = [0u8; 4];
    // ring's system random is already a dependency (the CA).
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    u32::from_le_bytes(bytes)
}

/// Whether this replica may write to the cluster now. Cheap to clone; writers check
/// [`is_leader`](Leadership::is_leader) before each write and wait on
/// [`changed`](Leadership::changed).
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// Keeps a fixed flag's sender alive, so `changed` waits instead of failing.
    _sender: Option<std::sync::Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// A new flag (initially not leading) and its sender, for [`run`].
    pub fn channel() -> (watch::Sender<bool>, Leadership) {
        let (tx, rx) = watch::channel(false);
        (tx, Leadership { rx, _sender: None })
    }

    /// Always leading: a single replica running without leader election.
    pub fn always() -> Leadership {
        let (tx, rx) = watch::channel(true);
        Leadership {
            rx,
            _sender: Some(std::sync::Arc::new(tx)),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits for the flag to change; returns the new value. Never returns if the elector is
    /// gone (its last value stands).
    pub async fn changed(&mut self) -> bool {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.rx.borrow_and_update()
    }

    /// The underlying receiver.
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// Runs the election until `stop`, publishing into `leader`. On stop the flag goes `false`
/// first, then the lease is released (bounded by a short timeout).
pub async fn run(
    client: kube::Client,
    config: LeaderConfig,
    leader: watch::Sender<bool>,
    on_change: impl Fn(bool) + Send + 'static,
    stop: CancellationToken,
) {
    let set = |value: bool| {
        let changed = leader.send_replace(value) != value;
        if changed {
            on_change(value);
            if value {
                info!(identity = %config.identity, lease = %config.lease_name, "became the leader");
            } else {
                info!(identity = %config.identity, lease = %config.lease_name, "not the leader");
            }
        }
    };
    let mut backoff = Duration::from_millis(200);
    loop {
        set(false);
        let built = tokio::select! {
            _ = stop.cancelled() => return,
            built = build(&client, &config) => built,
        };
        match built {
            Ok(manager) => {
                let error = loop {
                    tokio::select! {
                        _ = stop.cancelled() => {
                            set(false);
                            match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
                                Ok(Ok(())) => {}
                                Ok(Err(error)) => warn!(%error, "could not release the lease"),
                                Err(_) => warn!("timed out releasing the lease"),
                            }
                            return;
                        }
                        changed = manager.changed() => match changed {
                            Ok(leading) => {
                                set(leading);
                                backoff = Duration::from_millis(200);
                            }
                            Err(error) => break error,
                        },
                    }
                };
                set(false);
                warn!(%error, lease = %config.lease_name, "leader election failed; retrying");
            }
            Err(error) => {
                warn!(%error, lease = %config.lease_name, "cannot start leader election; retrying")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn build(
    client: &kube::Client,
    config: &LeaderConfig,
) -> kube_lease_manager::Result<LeaseManager> {
    LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.lease_duration.as_secs())
        .with_grace(config.renew_grace.as_secs())
        .with_field_manager(format!("ambientd-{}", config.identity))
        .build()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_whole_seconds_with_grace_below_duration() {
        let mut config = LeaderConfig::new("istio-system");
        assert!(config.validate().is_ok());
        config.renew_grace = config.lease_duration;
        assert!(config.validate().is_err());
        config.renew_grace = Duration::from_millis(1500);
        assert!(config.validate().is_err());
        config.renew_grace = Duration::ZERO;
        assert!(config.validate().is_err());
    }

    #[test]
    fn always_leads() {
        assert!(Leadership::always().is_leader());
        let (_tx, leadership) = Leadership::channel();
        assert!(!leadership.is_leader());
    }
}
