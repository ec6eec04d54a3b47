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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen(args) => tender_cli::crdgen::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
