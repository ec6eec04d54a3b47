//! `tender rollout resume BUNDLE`: resumes a halted or rolled-back rollout by writing the
//! `tender.dev/rollout-resume` annotation (the time) on the Bundle, or on the HelmOp whose
//! Bundle it is (the hub acts on a value it has not acted on before; docs/rollouts.md).

use anyhow::{Context, Result};
use kube::api::{Api, Patch, PatchParams};
use tender_types::{Bundle, HelmOp, labels};

/// Arguments of `tender rollout`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: RolloutCommand,
}

/// `tender rollout` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Resume a halted (Pause) or rolled-back (Rollback) rollout of a Bundle or HelmOp.
    Resume(ResumeArgs),
}

/// Arguments of `tender rollout resume`.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// Name of the Bundle (or HelmOp, with --helmop).
    pub name: String,
    /// NAME is a HelmOp.
    #[arg(long)]
    pub helmop: bool,
    /// The hub and the workspace.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
}

/// The merge patch that resumes: the annotation set to `value`.
pub fn resume_patch(value: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {labels::ROLLOUT_RESUME: value}}})
}

/// Runs `tender rollout`.
pub async fn run(args: Args) -> Result<()> {
    let RolloutCommand::Resume(args) = args.command;
    let hub = args.hub.client().await?;
    let ws = &args.hub.workspace;
    let patch = Patch::Merge(resume_patch(
        &k8s_openapi::jiff::Timestamp::now().to_string(),
    ));
    let params = PatchParams::default();
    if args.helmop {
        Api::<HelmOp>::namespaced(hub, ws)
            .patch(&args.name, &params, &patch)
            .await
            .with_context(|| format!("annotating HelmOp {ws}/{}", args.name))?;
        println!("HelmOp {ws}/{}: rollout resumed", args.name);
    } else {
        Api::<Bundle>::namespaced(hub, ws)
            .patch(&args.name, &params, &patch)
            .await
            .with_context(|| format!("annotating Bundle {ws}/{}", args.name))?;
        println!("Bundle {ws}/{}: rollout resumed", args.name);
    }
    Ok(())
}
