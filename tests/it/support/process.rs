//! The real ambientd binary as a child process (shutdown.rs, failover.rs): free ports, a
//! handle that kills the process if a test fails first, and a readiness wait that fails loudly.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::common::{WAIT, http_get};

/// A port free right now on 127.0.0.1 (bound, then released for the binary to take).
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A running `ambientd serve`; killed (SIGKILL) when dropped, should the test fail first.
pub struct Replica {
    pub child: Child,
    /// 15010's plaintext delta ADS.
    pub xds: SocketAddr,
    /// 15012's TLS: the CA and delta ADS.
    pub tls: SocketAddr,
    /// 15014's HTTP.
    pub debug: SocketAddr,
}

impl Replica {
    /// Starts the binary on a manifests directory and a CA directory (shared by replicas: the
    /// first to start creates the CA, the others load it) and waits until `/ready` says 200.
    pub async fn start(manifests: &Path, ca_dir: &Path, grace: Duration) -> Replica {
        let (xds, tls, debug) = (free_port(), free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_ambientd"))
            .arg("serve")
            .arg("--manifests")
            .arg(manifests)
            .arg("--ca-dir")
            .arg(ca_dir)
            .args(["--xds-address", &xds.to_string()])
            .args(["--xds-tls-address", &tls.to_string()])
            .args(["--debug-address", &debug.to_string()])
            .args(["--shutdown-grace", &format!("{}ms", grace.as_millis())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the ambientd binary");
        let replica = Replica {
            child,
            xds,
            tls,
            debug,
        };
        replica.wait_ready().await;
        replica
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if tokio::net::TcpStream::connect(self.debug).await.is_ok()
                && http_get(self.debug, "/ready").await.0 == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ambientd (debug on {}) never became ready",
                self.debug
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Waits for the process to exit; fails the test if it has not by `deadline`.
    pub async fn exit_by(&mut self, deadline: Instant, what: &str) -> ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "ambientd did not exit {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
