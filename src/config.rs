//! Command-line flags (each also an environment variable), validated into a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::discovery::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "ambientd",
    version,
    about = "A control plane for Istio's ambient mesh: serves ztunnel over delta xDS"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the mesh described by a manifests directory over delta xDS.
    Serve(ServeArgs),
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Directory of Kubernetes YAML/JSON manifests to serve, followed as it changes.
    #[arg(long, env = "AMBIENTD_MANIFESTS", value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// Plaintext delta xDS listener (unauthenticated: for trusted networks only).
    #[arg(
        long,
        env = "AMBIENTD_XDS_ADDRESS",
        default_value = "0.0.0.0:15010",
        value_name = "ADDR"
    )]
    pub xds_address: SocketAddr,

    /// Debug HTTP listener (/ready).
    #[arg(
        long,
        env = "AMBIENTD_DEBUG_ADDRESS",
        default_value = "0.0.0.0:15014",
        value_name = "ADDR"
    )]
    pub debug_address: SocketAddr,

    /// Cluster id: Workload.cluster_id and the prefix of workload uids.
    #[arg(long, env = "AMBIENTD_CLUSTER_ID", default_value = "Kubernetes", value_parser = non_empty)]
    pub cluster_id: String,

    /// Mesh trust domain (cluster.local is sent as empty, as istiod does).
    #[arg(long, env = "AMBIENTD_TRUST_DOMAIN", default_value = "cluster.local", value_parser = dns_name)]
    pub trust_domain: String,

    /// Cluster domain suffix of Service hostnames.
    #[arg(long, env = "AMBIENTD_DOMAIN", default_value = "cluster.local", value_parser = dns_name)]
    pub domain: String,

    /// Namespace ambientd runs in; its topology.istio.io/network label names the network.
    #[arg(long, env = "AMBIENTD_SYSTEM_NAMESPACE", default_value = "istio-system", value_parser = non_empty)]
    pub system_namespace: String,

    /// istiod revision: Istio config objects whose `istio.io/rev` label names another revision
    /// are ignored; unlabelled ones are served only by the `default` revision.
    #[arg(long, env = "AMBIENTD_REVISION", default_value = "default", value_parser = non_empty)]
    pub revision: String,

    /// Log filter: a level (info, debug, ...) or a tracing directive list (ambientd=debug,info).
    #[arg(long, env = "AMBIENTD_LOG_LEVEL", default_value = "info", value_parser = log_filter)]
    pub log_level: String,
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(value.to_string())
    }
}

fn dns_name(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(format!("{value:?} is not a DNS name"))
    }
}

fn log_filter(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map(|_| value.to_string())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

/// Everything `app::start` needs, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub manifests: PathBuf,
    pub xds_address: SocketAddr,
    pub debug_address: SocketAddr,
    pub settings: Settings,
}

impl Config {
    /// A config for `dir` with every other value at its default and listeners on
    /// `127.0.0.1:0`: what tests and embedders start from.
    pub fn local(dir: impl Into<PathBuf>) -> Self {
        Config {
            manifests: dir.into(),
            xds_address: ([127, 0, 0, 1], 0).into(),
            debug_address: ([127, 0, 0, 1], 0).into(),
            settings: Settings::default(),
        }
    }
}

impl TryFrom<ServeArgs> for Config {
    type Error = String;

    fn try_from(args: ServeArgs) -> Result<Self, String> {
        let manifests = args.manifests.ok_or_else(|| {
            "--manifests DIR is required: the Kubernetes source is not available yet".to_string()
        })?;
        Ok(Config {
            manifests,
            xds_address: args.xds_address,
            debug_address: args.debug_address,
            settings: Settings {
                cluster_id: args.cluster_id,
                trust_domain: args.trust_domain,
                domain: args.domain,
                system_namespace: args.system_namespace,
                revision: args.revision,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<ServeArgs, String> {
        let mut argv = vec!["ambientd", "serve"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map(|cli| match cli.command {
                Command::Serve(args) => args,
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_istiod() {
        let config = Config::try_from(parse(&["--manifests", "x"]).unwrap()).unwrap();
        assert_eq!(config.xds_address.to_string(), "0.0.0.0:15010");
        assert_eq!(config.debug_address.to_string(), "0.0.0.0:15014");
        assert_eq!(config.settings.cluster_id, "Kubernetes");
        assert_eq!(config.settings.trust_domain, "cluster.local");
        assert_eq!(config.settings.domain, "cluster.local");
        assert_eq!(config.settings.system_namespace, "istio-system");
    }

    #[test]
    fn a_bad_value_names_its_flag() {
        for (args, flag) in [
            (&["--xds-address", "nope"][..], "--xds-address"),
            (&["--debug-address", "1.2.3.4"][..], "--debug-address"),
            (&["--trust-domain", "bad domain"][..], "--trust-domain"),
            (&["--cluster-id", ""][..], "--cluster-id"),
            (&["--log-level", "a=b=c"][..], "--log-level"),
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains(flag), "{error}");
        }
    }

    #[test]
    fn missing_manifests_is_a_clear_error() {
        let error = Config::try_from(parse(&[]).unwrap()).unwrap_err();
        assert!(error.contains("--manifests"), "{error}");
    }
}
