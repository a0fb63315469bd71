//! Wiring only: bind the listeners, start the source, the index task and the servers, and
//! stop them all on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, Source};
use crate::debug::DebugState;
use crate::discovery::{Index, Snapshot};
use crate::kube::ManifestDir;
use crate::kube::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::push::{AdsServer, Registry, Snapshots, indexer};

/// Source events queued before the source waits for the index.
const EVENT_BUFFER: usize = 1024;

/// A running ambientd: its bound addresses, its snapshots, and the means to stop it.
pub struct Running {
    pub xds_address: SocketAddr,
    /// The TLS listener (delta xDS and the CA), when the CA is configured.
    pub xds_tls_address: Option<SocketAddr>,
    pub debug_address: SocketAddr,
    pub snapshots: Snapshots,
    pub metrics: Arc<Metrics>,
    /// Connected proxies.
    pub registry: Arc<Registry>,
    /// Whether this replica writes to the cluster now (never without cluster writes).
    pub leadership: Leadership,
    shutdown: CancellationToken,
    /// How long [`Running::stop`] waits for servers to drain.
    grace: std::time::Duration,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Stops accepting, ends every xDS stream (proxies get GOAWAY and reconnect elsewhere), lets
    /// requests in flight (certificate signing) finish, and waits for every task, for at most
    /// the grace period; what is still running then is aborted.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let drained = tokio::time::timeout(self.grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                grace = ?self.grace,
                tasks = self.tasks.len(),
                "shutdown grace period over; aborting what is left"
            );
            self.tasks.shutdown().await;
        }
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
    let source = OpenedSource::open(&config.source).await?;
    let xds_listener = crate::push::server::listen(config.xds_address)
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
    let metrics = Arc::new(Metrics::new());
    let registry = Arc::new(Registry::default());

    // Cluster writes: who leads, then the CA's Secrets, then (below) the root ConfigMaps.
    let cluster = match (&source, &config.source, &config.writes) {
        (OpenedSource::Cluster(opened), Source::Cluster(cluster), Some(writes)) => {
            Some((opened.client().clone(), cluster.clone(), writes.clone()))
        }
        _ => None,
    };
    let leadership = match &cluster {
        Some((client, _, writes)) => match &writes.leader {
            Some(leader_config) => {
                let (tx, leadership) = Leadership::channel();
                let (client, leader_config) = (client.clone(), leader_config.clone());
                let gauge = metrics.leader.clone();
                let stop = shutdown.clone();
                tasks.spawn(async move {
                    let on_change = move |leading: bool| {
                        gauge.set(i64::from(leading));
                    };
                    leader::run(client, leader_config, tx, on_change, stop).await;
                    Ok(())
                });
                leadership
            }
            None => {
                metrics.leader.set(1);
                Leadership::always()
            }
        },
        None => Leadership::channel().1,
    };

    let debug_state = DebugState {
        snapshots: snapshots.clone(),
        registry: registry.clone(),
        metrics: metrics.clone(),
        settings: config.settings.clone(),
        log_filter: config.log_filter.clone(),
        authenticators: None,
        source_health: match &source {
            OpenedSource::Cluster(cluster) => Some(cluster.health()),
            OpenedSource::Manifests(_) => None,
        },
    };
    // istiod's debug over xDS, on both ADS ports (answered only to root-namespace callers
    // the TLS port authenticated).
    let debug_xds = crate::debug::xds::responder(debug_state.clone());
    let mut debug_authenticators = None;
    let mut root_bundles = None;
    // One waypoint config per waypoint, whichever port its replicas connect to.
    let waypoint_configs = Arc::new(crate::push::waypoint::configs::WaypointConfigs::new(
        crate::waypoint::WaypointSettings::of(&config.settings),
    ));
    let xds_tls_address = match &config.ca {
        Some(ca) => {
            let pods = Arc::new(crate::ca::SnapshotPods::new(snapshots.clone()));
            let ads = AdsServer::new(snapshots.clone(), registry.clone(), metrics.clone())
                .with_max_stream_age(config.max_stream_age)
                .with_idle_timeout(config.stream_idle_timeout)
                .with_reconnect_removal_grace(config.reconnect_removal_grace)
                .with_shutdown(shutdown.clone())
                .with_scope_to_node(config.scope_to_node)
                .with_waypoint_configs(waypoint_configs.clone())
                .with_debug(debug_xds.clone())
                .into_service();
            let mut ca = crate::ca::CaConfig {
                metrics: metrics.clone(),
                ..ca.clone()
            };
            if let Some((client, _, writes)) = &cluster
                && writes.ca_secrets
                && ca.cacerts.is_none()
            {
                let secrets = crate::kube::ca_secret::CaSecrets::new(
                    client.clone(),
                    &config.settings.system_namespace,
                    &config.settings.trust_domain,
                    &ca.ca_dir,
                );
                let Some(material) = secrets.ensure_retrying(&shutdown).await else {
                    anyhow::bail!("stopped while loading the CA from its Secrets");
                };
                ca.cacerts = Some(secrets.dir().to_path_buf());
                let (leadership, stop) = (leadership.clone(), shutdown.clone());
                tasks.spawn(async move {
                    secrets.run(material, leadership, stop).await;
                    Ok(())
                });
            }
            // In a cluster, tokens the local keys cannot validate go to the API server.
            let mut extra: Vec<Arc<dyn crate::ca::Authenticator>> = Vec::new();
            if let OpenedSource::Cluster(cluster) = &source {
                let reviewer =
                    crate::kube::token_review::TokenReviewer::new(cluster.client().clone())
                        .with_audiences(ca.audiences.clone())
                        .with_timeout(ca.token_review_timeout)
                        .with_metrics(metrics.clone());
                extra.push(Arc::new(crate::ca::TokenReviewAuthenticator::new(
                    Arc::new(reviewer),
                    &config.settings.trust_domain,
                )));
            }
            let server =
                crate::ca::start_with(&ca, &config.settings, ads, pods, extra, shutdown.clone())
                    .await?;
            let address = server.address;
            debug_authenticators = Some(server.state.authenticators.clone());
            root_bundles = Some(server.state.root_bundles());
            tasks.spawn(async move { server.serve().await.context("CA and xDS TLS server") });
            Some(address)
        }
        None => None,
    };

    if let (Some((client, cluster, writes)), Some(roots)) = (&cluster, root_bundles)
        && writes.root_configmaps
    {
        let writer = crate::kube::root_configmap::RootConfigMaps {
            client: client.clone(),
            selectors: cluster.discovery_selectors.clone(),
            backoff: writes.backoff,
            max_backoff: writes.max_backoff,
        };
        let (leadership, stop) = (leadership.clone(), shutdown.clone());
        tasks.spawn(async move {
            writer.run(roots, leadership, stop).await;
            Ok(())
        });
    }

    if let Some((client, cluster, writes)) = &cluster
        && let Some(prefixes) = writes.ip_autoallocate
    {
        let allocation = crate::kube::ip_allocate::IpAllocation {
            client: client.clone(),
            selectors: cluster.discovery_selectors.clone(),
            prefixes,
            backoff: writes.backoff,
            max_backoff: writes.max_backoff,
        };
        let (leadership, stop) = (leadership.clone(), shutdown.clone());
        tasks.spawn(async move {
            allocation.run(leadership, stop).await;
            Ok(())
        });
    }

    if let Some((client, _, writes)) = &cluster
        && let Some(proxy) = &writes.waypoints
    {
        let controller = crate::kube::waypoints::WaypointController {
            client: client.clone(),
            proxy: proxy.clone(),
            qps: writes.status_qps,
            backoff: writes.backoff,
            max_backoff: writes.max_backoff,
        };
        let (snapshots, leadership, stop) =
            (snapshots.clone(), leadership.clone(), shutdown.clone());
        tasks.spawn(async move {
            controller.run(snapshots, leadership, stop).await;
            Ok(())
        });
    }

    if let Some((client, _, writes)) = &cluster
        && writes.status
    {
        let status_config = crate::kube::status_writer::StatusConfig {
            qps: f64::from(writes.status_qps),
            burst: writes.status_qps.saturating_mul(2),
            min_backoff: writes.backoff,
            max_backoff: writes.max_backoff,
        };
        let (client, snapshots) = (client.clone(), snapshots.clone());
        let (leader, stop) = (leadership.receiver(), shutdown.clone());
        let metrics = metrics.clone();
        tasks.spawn(async move {
            crate::kube::status_writer::run(
                client,
                snapshots,
                leader,
                status_config,
                metrics,
                stop,
            )
            .await;
            Ok(())
        });
    }

    let index = Index::new(config.settings.clone());
    let index_metrics = metrics.clone();
    let debounce = config.debounce;
    let stop = shutdown.clone();
    tasks.spawn(async move {
        indexer::run(index, events_rx, publish, index_metrics, debounce, stop).await;
        Ok(())
    });

    if let OpenedSource::Cluster(cluster) = &source {
        // Every watched kind starts at 0, so an alert sees the series before any failure.
        for watched in crate::kube::cluster::watched_kinds() {
            metrics
                .source_failing
                .get_or_create(&crate::metrics::KindLabel {
                    kind: watched.kind.to_string(),
                })
                .set(0);
        }
        let (on_error, on_failing) = (metrics.clone(), metrics.clone());
        cluster.health().observe(
            move |kind, reason| {
                on_error.source_restarts.inc();
                on_error
                    .source_errors
                    .get_or_create(&crate::metrics::SourceErrorLabel {
                        kind: kind.to_string(),
                        reason: reason.to_string(),
                    })
                    .inc();
            },
            move |kind, failing| {
                on_failing
                    .source_failing
                    .get_or_create(&crate::metrics::KindLabel {
                        kind: kind.to_string(),
                    })
                    .set(i64::from(failing));
            },
        );
    }
    let source_name = match &config.source {
        Source::Manifests(dir) => format!("manifests {}", dir.display()),
        Source::Cluster(_) => "kubernetes".to_string(),
    };
    let stop = shutdown.clone();
    if let Some(file) = config.mesh_config.clone() {
        let (events, stop, every) = (events_tx.clone(), shutdown.clone(), config.mesh_poll);
        tasks.spawn(async move {
            crate::kube::mesh_config::follow(file, every, events, stop).await;
            Ok(())
        });
    }
    // RequestAuthentications' key sets, fetched for waypoints: one more source of events.
    let (jwks_snapshots, jwks_events) = (snapshots.clone(), events_tx.clone());
    let (jwks_config, jwks_metrics, jwks_stop) = (config.jwks, metrics.clone(), shutdown.clone());
    tasks.spawn(async move {
        crate::kube::jwks::follow(
            jwks_snapshots,
            jwks_events,
            jwks_config,
            jwks_metrics,
            jwks_stop,
        )
        .await;
        Ok(())
    });
    tasks.spawn(source.run(events_tx, stop));

    let ads = AdsServer::new(snapshots.clone(), registry.clone(), metrics.clone())
        .with_max_stream_age(config.max_stream_age)
        .with_idle_timeout(config.stream_idle_timeout)
        .with_reconnect_removal_grace(config.reconnect_removal_grace)
        .with_shutdown(shutdown.clone())
        .with_scope_to_node(config.scope_to_node)
        .with_waypoint_configs(waypoint_configs)
        .with_debug(debug_xds)
        .into_service();
    let stop = shutdown.clone();
    tasks.spawn(async move {
        crate::push::server::grpc_server()
            .add_service(ads)
            .serve_with_incoming_shutdown(
                crate::push::listener::proxy_connections(xds_listener),
                stop.cancelled_owned(),
            )
            .await
            .context("xDS server")
    });

    let router = crate::debug::router(DebugState {
        authenticators: debug_authenticators,
        ..debug_state
    });
    let stop = shutdown.clone();
    tasks.spawn(async move {
        axum::serve(
            debug_listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
        .context("debug server")
    });

    info!(%xds_address, %debug_address, source = %source_name, "ambientd listening");
    Ok(Running {
        xds_address,
        xds_tls_address,
        debug_address,
        snapshots,
        metrics,
        registry,
        leadership,
        shutdown,
        grace: config.shutdown_grace,
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

/// The source, opened: a readable manifests directory, or a Kubernetes client.
enum OpenedSource {
    Manifests(ManifestDir),
    /// Boxed: two clients and the source's config.
    Cluster(Box<crate::kube::cluster::ClusterSource>),
}

impl OpenedSource {
    async fn open(source: &Source) -> anyhow::Result<Self> {
        Ok(match source {
            Source::Manifests(dir) => OpenedSource::Manifests(ManifestDir::open(dir)?),
            Source::Cluster(cluster) => OpenedSource::Cluster(Box::new(
                crate::kube::cluster::ClusterSource::connect(cluster.clone())
                    .await
                    .context("Kubernetes source")?,
            )),
        })
    }

    async fn run(
        self,
        events: mpsc::Sender<crate::discovery::Event>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        match self {
            OpenedSource::Manifests(dir) => crate::kube::manifests::run(dir, events, stop)
                .await
                .context("manifests source"),
            OpenedSource::Cluster(cluster) => {
                cluster.run(events, stop).await;
                Ok(())
            }
        }
    }
}
