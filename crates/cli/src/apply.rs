//! `tender apply DIR...`: Fleet's fleet.yaml directories converted into Bundles (the
//! `tender-fleet` library) and applied to the hub by server-side apply, or printed.
//!
//! Exit codes: 0 applied (or printed); 2 some field or file cannot be mapped — every refusal
//! of every directory is printed and nothing is written; 1 any other error.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kube::api::{Api, Patch, PatchParams};
use tender_fleet::{Converted, Error, Options};
use tender_types::Bundle;

/// Field manager of the Bundles `tender apply` writes.
pub const FIELD_MANAGER: &str = "tender-apply";

/// Output format of `-o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// YAML documents.
    Yaml,
    /// One JSON list.
    Json,
}

/// Arguments of `tender apply`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 applied (or printed); 2 a field or file cannot be mapped \
(every refusal of every directory is listed, nothing is written); 1 any other error.\n\
See docs/migrating-from-fleet.md for what each fleet.yaml field becomes."
)]
pub struct Args {
    /// Directories to read; each one and every directory below it holding a fleet.yaml becomes
    /// a Bundle, as `fleet apply` does.
    #[arg(default_value = ".")]
    pub dirs: Vec<PathBuf>,
    /// Prefix of the Bundle names (Fleet's NAME argument: a GitRepo's name); a fleet.yaml's
    /// `name` wins.
    #[arg(long)]
    pub name: Option<String>,
    /// The hub and the workspace.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
    /// Print the Bundles instead of applying them (nothing is written).
    #[arg(long, short = 'o', value_enum)]
    pub output: Option<Output>,
    /// Apply with the apiserver's server-side dry run (validated and admitted, not stored).
    #[arg(long)]
    pub dry_run: bool,
    /// Fleet's targets file: YAML with `targets` (and `targetRestrictions`) appended to every
    /// Bundle's targets.
    #[arg(long)]
    pub targets_file: Option<PathBuf>,
    /// Label set on every Bundle, `key=value`; repeatable.
    #[arg(long = "label", short = 'l', value_parser = crate::cluster::parse_label)]
    pub labels: Vec<(String, String)>,
    /// The kustomize binary rendering kustomize directories.
    #[arg(long, default_value = "kustomize", env = "TENDER_KUSTOMIZE")]
    pub kustomize: PathBuf,
    /// Take over fields another field manager set on an existing Bundle.
    #[arg(long)]
    pub force_conflicts: bool,
}

/// The Bundles of `args.dirs`, in the workspace namespace, or the refusals.
pub fn bundles(args: &Args) -> Result<Vec<Bundle>, Error> {
    let opts = Options {
        name: args.name.clone(),
        labels: args.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        targets_file: args.targets_file.clone(),
        kustomize: args.kustomize.clone(),
    };
    let converted = tender_fleet::convert(&args.dirs, &opts)?;
    let mut out = Vec::new();
    for Converted { dir, bundles } in converted {
        if bundles.is_empty() {
            eprintln!("{}: nothing to deploy, skipped", dir.display());
        }
        for mut b in bundles {
            b.metadata.namespace = Some(args.hub.workspace.clone());
            out.push(b);
        }
    }
    if out.is_empty() {
        eprintln!("no Bundle to apply: no fleet.yaml and no YAML found");
    }
    Ok(out)
}

/// Runs `tender apply`.
pub async fn run(args: Args) -> Result<ExitCode> {
    let bundles = match bundles(&args) {
        Ok(b) => b,
        Err(e @ Error::Refused(_)) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    match args.output {
        Some(Output::Yaml) => {
            for b in &bundles {
                print!("---\n{}", serde_saphyr::to_string(b)?);
            }
            return Ok(ExitCode::SUCCESS);
        }
        Some(Output::Json) => {
            println!("{}", serde_json::to_string_pretty(&bundles)?);
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let hub = args.hub.client().await?;
    let api = Api::<Bundle>::namespaced(hub, &args.hub.workspace);
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.force = args.force_conflicts;
    params.dry_run = args.dry_run;
    let suffix = if args.dry_run {
        " (server dry run)"
    } else {
        ""
    };
    for b in &bundles {
        let name = b.metadata.name.clone().unwrap_or_default();
        let mut body = serde_json::to_value(b)?;
        if let Some(meta) = body.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("namespace");
        }
        api.patch(&name, &params, &Patch::Apply(&body))
            .await
            .with_context(|| format!("applying Bundle {}/{name}", args.hub.workspace))?;
        println!("Bundle {}/{name} applied{suffix}", args.hub.workspace);
    }
    Ok(ExitCode::SUCCESS)
}
