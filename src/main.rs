//! The `ambientd` binary: parse the CLI, set up logging, and run.

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, reload};

use ambientd::config::{Cli, Command, Config};
use ambientd::debug::LogControl;

/// The index allocates many small objects; mimalloc is several times faster at that than the
/// system allocator (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Every TLS user here is on ring; installing it keeps rustls from guessing.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = match cli.command {
        Command::Serve(args) => *args,
        Command::Sds(args) => {
            let result = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting the runtime: {e}"))
                .and_then(|runtime| runtime.block_on(ambientd::ca::sds::run(args)));
            return match result {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("error: {message}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Token(args) => {
            return match ambientd::ca::token::run(args) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("error: {message}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
    };
    // The filter sits behind a reload handle so `/logging?level=` can change it at runtime.
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&args.log_level));
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer())
        .init();
    let log_filter = LogControl::new(move |directives: &str| {
        let filter = EnvFilter::builder()
            .parse(directives)
            .map_err(|e| format!("not a log level or filter: {e}"))?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    let config = match Config::try_from(args) {
        Ok(config) => Config {
            log_filter: Some(log_filter),
            ..config
        },
        Err(message) => {
            eprintln!("error: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ambientd::app::run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
