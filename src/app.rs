//! Wiring only: bind the listeners, start the source, the index task and the servers, and
//! stop them all on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::Config;
use crate::discovery::{Index, Snapshot};
use crate::kube::ManifestDir;
use crate::push::{AdsServer, Snapshots, indexer};

/// Source events queued before the source waits for the index.
const EVENT_BUFFER: usize = 1024;

/// A running ambientd: its bound addresses, its snapshots, and the means to stop it.
pub struct Running {
    pub xds_address: SocketAddr,
    pub debug_address: SocketAddr,
    pub snapshots: Snapshots,
    shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Stops every task and waits for them.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Waits until a task fails (or all end), then stops the rest.
    pub async fn wait(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            Some(joined) = self.tasks.join_next() => match joined {
                Ok(result) => result,
                Err(e) => Err(e.into()),
            },
        };
        self.stop().await;
        result
    }
}

/// Binds the listeners and starts everything. Returns once listening; readiness follows when
/// the first snapshot is built.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let dir = ManifestDir::open(&config.manifests)?;
    let xds_listener = TcpListener::bind(config.xds_address)
        .await
        .with_context(|| format!("binding --xds-address {}", config.xds_address))?;
    let debug_listener = TcpListener::bind(config.debug_address)
        .await
        .with_context(|| format!("binding --debug-address {}", config.debug_address))?;
    let xds_address = xds_listener.local_addr()?;
    let debug_address = debug_listener.local_addr()?;

    let shutdown = CancellationToken::new();
    let (events_tx, events_rx) = mpsc::channel(EVENT_BUFFER);
    let (publish, snapshots) = watch::channel::<Option<Arc<Snapshot>>>(None);
    let mut tasks = JoinSet::new();

    let index = Index::new(config.settings.clone());
    let stop = shutdown.clone();
    tasks.spawn(async move {
        indexer::run(index, events_rx, publish, stop).await;
        Ok(())
    });

    let stop = shutdown.clone();
    tasks.spawn(async move {
        crate::kube::manifests::run(dir, events_tx, stop)
            .await
            .context("manifests source")
    });

    let ads = AdsServer::new(snapshots.clone()).into_service();
    let stop = shutdown.clone();
    tasks.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(ads)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(xds_listener),
                stop.cancelled_owned(),
            )
            .await
            .context("xDS server")
    });

    let router = crate::debug::router(snapshots.clone());
    let stop = shutdown.clone();
    tasks.spawn(async move {
        axum::serve(debug_listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .context("debug server")
    });

    info!(%xds_address, %debug_address, manifests = %config.manifests.display(), "ambientd listening");
    Ok(Running {
        xds_address,
        debug_address,
        snapshots,
        shutdown,
        tasks,
    })
}

/// Runs until Ctrl-C or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let running = start(config).await?;
    let result = running.wait(shutdown_signal()).await;
    if let Err(e) = &result {
        error!(error = format!("{e:#}"), "ambientd stopped");
    }
    result
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    info!("shutting down");
}
