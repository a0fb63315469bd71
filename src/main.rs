//! The `ambientd` binary: parse the CLI, set up logging, and run.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use ambientd::config::{Cli, Command, Config};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(&args.log_level))
        .init();
    let config = match Config::try_from(args) {
        Ok(config) => config,
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
