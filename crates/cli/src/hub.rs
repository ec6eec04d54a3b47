//! The options every command that talks to the hub shares: which workspace, and how to reach
//! the hub.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// `-n/--workspace` and `--hub-kubeconfig`.
#[derive(Debug, Clone, clap::Args)]
pub struct HubArgs {
    /// Workspace namespace on the hub.
    #[arg(
        long,
        short = 'n',
        visible_alias = "namespace",
        default_value = "tender-default",
        env = "TENDER_WORKSPACE"
    )]
    pub workspace: String,
    /// Kubeconfig of the hub (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "TENDER_HUB_KUBECONFIG")]
    pub hub_kubeconfig: Option<PathBuf>,
}

impl HubArgs {
    /// A client of the hub.
    pub async fn client(&self) -> Result<kube::Client> {
        tender_runtime::client(self.hub_kubeconfig.as_deref(), None, "tender-cli")
            .await
            .context("connecting to the hub")
    }
}
