//! Bounds on certificate requests in flight, so that one caller's flood of CSRs cannot take
//! the signer (and the memory of its queued requests) from everyone else.
//!
//! istiod has no limit beyond gRPC's own. Here a request, once authenticated and authorized,
//! is *admitted* only while its caller has fewer than [`CsrLimits::per_caller`] requests in
//! flight (waiting to be signed or being signed) and the whole CA fewer than
//! [`CsrLimits::total`]; anything more is refused at once with `RESOURCE_EXHAUSTED` and a
//! message that says which limit and when to retry (ztunnel's CA client retries failed
//! requests with backoff). Admitted requests are signed on the blocking pool, at most
//! [`CsrLimits::signers`] at a time, and each caller's one at a time: callers take turns in
//! arrival order, so a caller behind a flood waits for about one of the flood's signatures,
//! not for the flood, and the runtime's workers, which also serve every xDS stream, are never
//! held by signing.
//!
//! A caller is the authenticated identity together with the pod or node its token is bound to:
//! every ztunnel authenticates as the same service account, and each must have its own share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::ca::authorize::Caller;

/// Requests one caller may have in flight. ztunnel keeps at most 8 CSRs in flight (its secret
/// manager's concurrency), so an honest one stays far below this.
pub const PER_CALLER: usize = 64;

/// Requests the whole CA may have in flight: a mesh-wide restart (every ztunnel asking for
/// its pods' certificates at once) queues here rather than in memory without bound; each
/// admitted request holds its decoded CSR (a few KiB) while it waits.
pub const TOTAL: usize = 4096;

/// The limits and what is in flight against them.
#[derive(Debug)]
pub struct CsrLimits {
    pub per_caller: usize,
    pub total: usize,
    /// Signatures computed at once (the blocking threads signing).
    pub signers: usize,
    state: Mutex<InFlight>,
    signing: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct InFlight {
    total: usize,
    by_caller: HashMap<String, CallerState>,
}

/// One caller's requests in flight, and its turn at signing (one at a time).
#[derive(Debug)]
struct CallerState {
    in_flight: usize,
    turn: Arc<Semaphore>,
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "too many certificate requests in flight from this caller ({limit}, the limit per caller): \
         retry after one of them completes"
    )]
    Caller { limit: usize },
    #[error(
        "the CA has {limit} certificate requests in flight (its limit): retry in a few seconds"
    )]
    Total { limit: usize },
}

impl Refusal {
    /// The metric label (`ambientd_csr_refused{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Caller { .. } => "caller",
            Refusal::Total { .. } => "total",
        }
    }
}

/// One admitted request: its place is given back when this is dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    limits: &'a CsrLimits,
    key: String,
    turn: Arc<Semaphore>,
}

impl Default for CsrLimits {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        CsrLimits::new(PER_CALLER, TOTAL, cores)
    }
}

impl Clone for CsrLimits {
    /// The same limits, with nothing in flight.
    fn clone(&self) -> Self {
        CsrLimits::new(self.per_caller, self.total, self.signers)
    }
}

impl CsrLimits {
    pub fn new(per_caller: usize, total: usize, signers: usize) -> Self {
        let signers = signers.max(1);
        CsrLimits {
            per_caller: per_caller.max(1),
            total: total.max(1),
            signers,
            state: Mutex::default(),
            signing: Arc::new(Semaphore::new(signers)),
        }
    }

    /// The key a caller's requests are counted under: its identity, and the pod (else node)
    /// its token is bound to.
    pub fn caller_key(caller: &Caller) -> String {
        let identity = caller.identity.to_string();
        match (&caller.pod, &caller.node) {
            (Some(pod), _) => format!("{identity} pod={}", pod.name),
            (None, Some(node)) => format!("{identity} node={node}"),
            (None, None) => identity,
        }
    }

    /// Admits a request from `key`, or says which limit it would exceed.
    pub fn admit(&self, key: &str) -> Result<Admitted<'_>, Refusal> {
        let mut state = self.state.lock().expect("not poisoned");
        if state.total >= self.total {
            return Err(Refusal::Total { limit: self.total });
        }
        if state
            .by_caller
            .get(key)
            .is_some_and(|caller| caller.in_flight >= self.per_caller)
        {
            return Err(Refusal::Caller {
                limit: self.per_caller,
            });
        }
        state.total += 1;
        let caller = state
            .by_caller
            .entry(key.to_string())
            .or_insert_with(|| CallerState {
                in_flight: 0,
                turn: Arc::new(Semaphore::new(1)),
            });
        caller.in_flight += 1;
        Ok(Admitted {
            limits: self,
            key: key.to_string(),
            turn: caller.turn.clone(),
        })
    }

    /// Requests in flight now (all callers).
    pub fn in_flight(&self) -> usize {
        self.state.lock().expect("not poisoned").total
    }

    /// Callers with a request in flight now.
    pub fn callers(&self) -> usize {
        self.state.lock().expect("not poisoned").by_caller.len()
    }
}

impl Admitted<'_> {
    /// Runs `sign` on the blocking pool once it is this caller's turn and a signer is free
    /// (both in arrival order).
    pub async fn sign<T: Send + 'static>(
        &self,
        sign: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let _turn = self.turn.acquire().await.map_err(|e| e.to_string())?;
        let _permit = self
            .limits
            .signing
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(sign)
            .await
            .map_err(|e| format!("the signing task failed: {e}"))
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut state = self.limits.state.lock().expect("not poisoned");
        state.total -= 1;
        if let Some(caller) = state.by_caller.get_mut(&self.key) {
            caller.in_flight -= 1;
            if caller.in_flight == 0 {
                state.by_caller.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_each_limit_and_gives_places_back() {
        let limits = CsrLimits::new(2, 3, 1);
        let a1 = limits.admit("a").unwrap();
        let a2 = limits.admit("a").unwrap();
        assert_eq!(
            limits.admit("a").unwrap_err(),
            Refusal::Caller { limit: 2 },
            "a third from the same caller"
        );
        // Another caller still gets in, up to the total.
        let b1 = limits.admit("b").unwrap();
        assert_eq!(limits.admit("c").unwrap_err(), Refusal::Total { limit: 3 });
        assert_eq!((limits.in_flight(), limits.callers()), (3, 2));
        drop(a1);
        let c1 = limits.admit("c").unwrap();
        drop((a2, b1, c1));
        assert_eq!((limits.in_flight(), limits.callers()), (0, 0));
        let message = Refusal::Caller { limit: 64 }.to_string();
        assert!(
            message.contains("64") && message.contains("retry"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn signs_one_at_a_time_per_signer() {
        let limits = CsrLimits::new(8, 8, 1);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let admitted: Vec<_> = (0..4).map(|_| limits.admit("a").unwrap()).collect();
        let jobs = admitted.iter().map(|a| {
            let (running, most) = (running.clone(), most.clone());
            a.sign(move || {
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(20));
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            })
        });
        for result in futures::future::join_all(jobs).await {
            result.unwrap();
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Two signers, one caller with many requests: its requests are signed one at a time, so
    /// another caller's request, arriving after all of them, is signed next, not last.
    #[tokio::test]
    async fn callers_take_turns() {
        let limits = CsrLimits::new(16, 32, 2);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let flood: Vec<_> = (0..8).map(|_| limits.admit("flood").unwrap()).collect();
        let other = limits.admit("other").unwrap();
        type Order = Arc<std::sync::Mutex<Vec<&'static str>>>;
        async fn job(admitted: &Admitted<'_>, name: &'static str, order: Order) {
            admitted
                .sign(move || {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    order.lock().unwrap().push(name);
                })
                .await
                .unwrap();
        }
        let mut jobs: Vec<_> = flood
            .iter()
            .map(|a| Box::pin(job(a, "flood", order.clone())))
            .collect();
        jobs.push(Box::pin(job(&other, "other", order.clone())));
        futures::future::join_all(jobs).await;
        let order = order.lock().unwrap();
        let at = order.iter().position(|n| *n == "other").unwrap();
        assert!(at <= 1, "the other caller was signed at {at}: {order:?}");
    }
}
