//! The command line itself: parsing, the program name, and dispatch to one module per
//! subcommand. `main.rs` only calls [`main`].

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Name of the binary.
pub const BIN_NAME: &str = "tender";
/// File name kubectl looks for on PATH to run `kubectl tender …`.
pub const KUBECTL_PLUGIN_NAME: &str = "kubectl-tender";

/// tender: copy Secrets, ConfigMaps and manifests from a hub cluster to downstream clusters.
#[derive(Debug, Parser)]
#[command(name = BIN_NAME, version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Register downstream clusters and produce their agents' install manifests.
    Cluster(crate::cluster::Args),
    /// Show the Bundles and Clusters of a workspace, or one Bundle cluster by cluster.
    Status(crate::status::Args),
    /// Resume a halted or rolled-back rollout in waves (docs/rollouts.md).
    Rollout(crate::rollout::Args),
    /// Convert Fleet fleet.yaml directories into Bundles and apply them (or print them).
    Apply(crate::apply::Args),
    /// Print a shell completion script (e.g. `source <(tender completions bash)`).
    Completions(crate::completions::Args),
}

/// How usage and help name the program: `kubectl tender` when run as the kubectl plugin
/// (a copy or symlink named `kubectl-tender` on PATH), `tender` otherwise.
pub fn display_name(argv0: Option<&OsString>) -> &'static str {
    let file = argv0
        .and_then(|a| Path::new(a).file_name())
        .and_then(|f| f.to_str())
        .unwrap_or(BIN_NAME);
    if file == KUBECTL_PLUGIN_NAME || file.starts_with("kubectl-tender.") {
        "kubectl tender"
    } else {
        BIN_NAME
    }
}

/// The clap command with its program name set for how it was invoked.
pub fn command_for(argv0: Option<&OsString>) -> clap::Command {
    Cli::command().bin_name(display_name(argv0))
}

/// Parses `args` (the first being the program path) as the command line.
pub fn parse_from(args: Vec<OsString>) -> Result<Cli, clap::Error> {
    let matches = command_for(args.first()).try_get_matches_from(args)?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

/// Parses the process's arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = match parse_from(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let result = match cli.command {
        Command::Cluster(args) => block_on(crate::cluster::run(args)),
        Command::Status(args) => block_on(crate::status::run(args)),
        Command::Rollout(args) => block_on(crate::rollout::run(args)),
        Command::Apply(args) => block_on_code(crate::apply::run(args)),
        Command::Completions(args) => {
            crate::completions::run(&args, command_for(None), BIN_NAME, &mut std::io::stdout())
                .map(|()| ExitCode::SUCCESS)
        }
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

fn block_on_code(
    f: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_program_name_follows_how_it_was_invoked() {
        assert_eq!(display_name(Some(&"tender".into())), "tender");
        assert_eq!(
            display_name(Some(&"/usr/local/bin/tender".into())),
            "tender"
        );
        assert_eq!(
            display_name(Some(&"/home/me/bin/kubectl-tender".into())),
            "kubectl tender"
        );
        assert_eq!(
            display_name(Some(&"kubectl-tender.exe".into())),
            "kubectl tender"
        );
        assert_eq!(display_name(None), "tender");
    }

    #[test]
    fn as_a_kubectl_plugin_it_parses_the_same_and_its_usage_says_kubectl_tender() {
        let cli = parse_from(args(&[
            "/path/kubectl-tender",
            "status",
            "-n",
            "ws",
            "-o",
            "json",
        ]))
        .unwrap();
        let Command::Status(status) = cli.command else {
            panic!("not status: {cli:?}");
        };
        assert_eq!(status.hub.workspace, "ws");
        assert_eq!(status.output, crate::status::Output::Json);

        let err = parse_from(args(&["/path/kubectl-tender", "status", "--bogus"])).unwrap_err();
        let text = err.render().to_string();
        assert!(text.contains("Usage: kubectl tender status"), "{text}");

        let help = command_for(Some(&"kubectl-tender".into()))
            .render_help()
            .to_string();
        assert!(help.contains("Usage: kubectl tender"), "{help}");

        let err = parse_from(args(&["tender", "status", "--bogus"])).unwrap_err();
        assert!(err.render().to_string().contains("Usage: tender status"));
    }

    #[test]
    fn status_takes_an_optional_bundle_and_an_output_format() {
        let cli = parse_from(args(&["tender", "status", "registry-creds", "-o", "yaml"])).unwrap();
        let Command::Status(status) = cli.command else {
            panic!("not status");
        };
        assert_eq!(status.bundle.as_deref(), Some("registry-creds"));
        assert_eq!(status.output, crate::status::Output::Yaml);
        assert!(parse_from(args(&["tender", "status", "-o", "xml"])).is_err());
    }
}
