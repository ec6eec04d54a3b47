use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tender: copy Secrets, ConfigMaps and manifests from a hub cluster to downstream clusters.
#[derive(Parser)]
#[command(name = "tender", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CustomResourceDefinitions to deploy/crds (or check they are up to date).
    Crdgen(tender_cli::crdgen::Args),
    /// Register downstream clusters and produce their agents' install manifests.
    Cluster(tender_cli::cluster::Args),
    /// Show the Bundles and Clusters of a workspace.
    Status(tender_cli::status::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen(args) => tender_cli::crdgen::run(&args),
        Command::Cluster(args) => block_on(tender_cli::cluster::run(args)),
        Command::Status(args) => block_on(tender_cli::status::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)?;
    Ok(ExitCode::SUCCESS)
}
